"""What pf-GMM and pf-HMM share beyond the switch machinery: their label, background and switch globals,
the start of an EM restart, and the fitted attributes built on them."""

from __future__ import annotations

from typing import Any

import torch

from ppmix.components import BernoulliLabel, DiagGaussian
from ppmix.components.family import components_from_state
from ppmix.components.gaussian_family import weighted_data_scale
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.models._arviz import LaplaceTarget, global_supports
from ppmix.models._labels import BinaryClassifierMixin
from ppmix.models._missing import fill_column_means
from ppmix.models._weights import split_weights
from ppmix.models.pf._observed import Frames, frame_log_prob, start_frames
from ppmix.models.pf.switches import FrameLabels, PredictionFocusedMixin

__all__ = ["PFStateMixin"]

#: ArviZ dimensions of the label, background and switch sites
PF_DIMS: dict[str, list[str]] = {
    "label_probs": ["component"],
    "background_loc": ["feature"],
    "background_scale": ["feature"],
    "switch_probs": ["feature"],
}


class PFStateMixin(BinaryClassifierMixin, PredictionFocusedMixin):
    """The label, background and switch part of a prediction-focused model's state (``labels_``, ``background_``,
    ``switch_probs_``), for a host that is also a :class:`~ppmix.models.base.MixtureModel` with Gaussian components.

    The host is a binary classifier in scikit-learn's sense: ``classes_`` holds the two labels
    seen in ``fit`` and ``score`` is the accuracy of ``predict``.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models.pf.pf_gmm import PFGMM
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    >>> model = PFGMM(2, switch_prior=0.3, seed=0, progress=False).fit(data.X, data.y)
    >>> sorted(model._pf_globals())
    ['background_loc', 'background_scale', 'label_probs', 'switch_probs']
    """

    def _pf_globals(self) -> dict[str, torch.Tensor]:
        """Label probabilities, background and (when ``p < 1``) switch probabilities, keyed by site name."""
        values = {
            "label_probs": self.labels_.probs.clone(),
            "background_loc": self.background_.loc[0].clone(),
            "background_scale": self.background_.scale[0].clone(),
        }
        if not self._all_relevant:
            values["switch_probs"] = self.switch_probs_.clone()
        return values

    def _pf_state_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of :meth:`_pf_globals` for these settings."""
        d = self.n_features_in_
        shapes = {"label_probs": (self.n_components,), "background_loc": (d,), "background_scale": (d,)}
        return shapes if self._all_relevant else {**shapes, "switch_probs": (d,)}

    def _set_pf_globals(self, values: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`_pf_globals` (``phi = 1`` where ``switch_probs`` is absent)."""
        opts = {"dtype": self.dtype, "device": self._device}
        self.labels_ = BernoulliLabel(torch.as_tensor(values["label_probs"]).to(**opts))
        bg_loc = torch.as_tensor(values["background_loc"]).to(**opts)
        bg_scale = torch.as_tensor(values["background_scale"]).to(**opts)
        self.background_ = DiagGaussian(bg_loc[None], bg_scale[None], reg_covar=self.reg_covar)
        phi = values.get("switch_probs")
        self.switch_probs_ = torch.ones_like(bg_loc) if phi is None else torch.as_tensor(phi).to(**opts)

    #: within the restarts of one fit (:func:`~ppmix.models.pf.restarts.fit_restarts`, which all fit the same data):
    #: the data scale of their training frames, measured by the first and taken by the others
    _restart_data_scale: dict[str, Any] | None = None

    def _record_data_scale(self, x: torch.Tensor, name: str = "X") -> None:
        """The family's checks and data scale of the training frames ``x``; where entries are missing
        (``missing="marginalize"``), the checks see them filled with their columns' means and each column's scale
        (the variance floor) is that of its observed entries (:func:`weighted_data_scale`). A restart after the
        first takes the scale the first measured on the same frames."""
        memo = self._restart_data_scale
        if memo is not None and "scale" in memo:
            self._take_data_scale(lambda family: memo["scale"])  # type: ignore[attr-defined]
            return
        if not bool(torch.isnan(x).any()):
            super()._record_data_scale(x, name)  # type: ignore[misc]
        else:
            super()._record_data_scale(fill_column_means(x), name)  # type: ignore[misc]
            self._record_weighted_data_scale(x, x.new_ones(x.shape[0]))
        if memo is not None:
            memo["scale"] = self._data_scale

    #: the ``sample_weight`` of the fit under way (None otherwise): the data scale ``prepare_data`` records is weighted
    _fit_sample_weight: Any = None

    def _record_weighted_data_scale(self, frames: torch.Tensor, weight: torch.Tensor) -> None:
        """Replace the data scale just recorded (``_record_data_scale``) by that of the ``frames`` ``(N, D)``
        counted ``weight`` ``(N,)`` times each (:func:`weighted_data_scale`); fitted components (a warm start)
        take it. The frames of positive weight must not hold a constant feature (as the repeated frames must not)."""
        self._check_pf_features(frames[weight > 0])
        self._data_scale = weighted_data_scale(frames, weight, float(self.reg_covar))
        if getattr(self, "components_", None) is not None:
            self.components_ = components_from_state(
                self._component_family(), self.components_.state_dict(), self._data_scale
            )

    def _pf_start(
        self,
        frames: Frames,
        labels: FrameLabels,
        generator: torch.Generator,
        centred: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Start an EM restart: background fitted once, fresh components, ``label_probs = 1/2``, ``phi = p``.

        Returns the first frame responsibilities, from (relevance-)k-means; ``centred`` are the
        frames the relevance test sees (default: ``frames``). Frame ``weight`` ``(N,)`` (``sample_weight``)
        weighs the background, the relevance test and k-means.
        """
        self._fit_background(frames, weight)
        frames = start_frames(frames, weight)  # the start sees missing entries filled with their columns' means
        self.components_ = self._new_components(frames.x)
        self.labels_ = BernoulliLabel(frames.x.new_full((self.n_components,), 0.5))
        self.switch_probs_ = frames.x.new_full((frames.x.shape[1],), self._switch_p)
        if self.init_params == "relevance":
            return self._initial_frame_responsibilities(frames, labels, generator, centred, weight)
        return self._initial_responsibilities(frames, generator, weight)

    #: online EM (``partial_fit``) is not available; see :class:`~ppmix.models._online.OnlineEMMixin`
    online_em_unavailable = (
        "the switch update weighs the components' gain against a background fitted on all the data, which a "
        "stream does not have; fit on shards with ppmix.distributed.fit_em instead"
    )

    def _em_data_statistics(self, data: Any) -> GaussianStatistics:
        """Before a sharded or warm-started fit: the background's statistics of ``data.frames`` (it is fitted once,
        on all of this fit's data; every frame counted as often as its sample weight, where there are some)."""
        inner, weight = split_weights(data)
        return self._background_statistics(inner.frames, self._frame_weights(inner, weight))

    def _frame_weights(self, data: Any, weight: torch.Tensor | None) -> torch.Tensor | None:
        """Every frame's sample weight (``(N,)``, None without weights): a row's own (an HMM: its sequence's)."""
        return weight

    def _em_set_data_statistics(self, stats: GaussianStatistics) -> None:
        """The background from the (merged) statistics of :meth:`_em_data_statistics`."""
        self._set_background(stats)

    #: what gives a pf model posterior draws (the PointEstimateWarning's remedy; see ``draw_remedies``)
    posterior_remedy = (
        "use to_arviz's Laplace approximation of the ELBO (approximation='laplace' beyond 500 parameters), which "
        "needs the ELBO strictly concave at the fit: refit with fewer components where one is empty or duplicated "
        "(engine='mcmc' and SVI's guide='normal' are not offered for the pf models: their switches' posterior is "
        "the variational one)"
    )

    def _laplace_target(self, data: Any) -> LaplaceTarget:
        """What ``to_arviz`` takes its Laplace approximation of (:func:`~ppmix.models._arviz.laplace_draws`): the
        objective variational EM maximises, the ELBO with ``q(z)`` optimal (labels used where observed; with
        ``priors``, MAP-EM's ELBO plus the log prior: a log posterior), as a function of the continuous globals, the
        switches held at their fitted variational posterior ``q(S_d = 1) = phi_d`` (``switch_probs`` is the same in
        every draw).

        The background is fitted once, on every frame (B.2.3), where the ELBO counts feature ``d``'s background
        density on the switched-off share ``1 - phi_d`` of the frames only; the target counts it on all of
        them (adding ``phi_d`` times its log-density), so that its precision is that of its fit, finite for a
        relevant feature too, and its mode the fitted background (with ``priors``, MAP on every frame).

        Examples
        --------
        >>> from ppmix.datasets import make_pf_synthetic
        >>> from ppmix.models.pf.pf_gmm import PFGMM
        >>> data = make_pf_synthetic(100, n_relevant=1, n_features=2, seed=0)
        >>> model = PFGMM(2, switch_prior=0.3, seed=0, progress=False).fit(data.X, data.y)
        >>> target = model._laplace_target(model.prepare_data(data.X, data.y))
        >>> sorted(target.supports)
        ['background_loc', 'background_scale', 'label_probs', 'locs', 'scales', 'weights']
        """
        values = self._get_globals()
        varying = [name for name in values if name != "switch_probs"]
        rows = split_weights(self._em_data(data))[0]

        def log_density(point: dict[str, torch.Tensor]) -> torch.Tensor:
            self._set_globals(point)
            background = frame_log_prob(self.background_, rows.frames, self.switch_probs_)[:, 0].sum()
            return self._differentiable_elbo(rows) + background

        return LaplaceTarget(values, global_supports(self, data, varying), log_density)

    def _differentiable_elbo(self, data: Any) -> torch.Tensor:
        """The ELBO of ``_e_step(data)``, differentiable in the globals (for :meth:`_laplace_target`)."""
        return self._e_step(data)[1]

    @property
    def relevance_(self) -> Any:
        """``phi_d = q(S_d = 1)`` per feature (a Series indexed by feature names for DataFrame input)."""
        self._check_fitted()
        return self._switch_relevance()

    @property
    def label_probs_(self) -> torch.Tensor:
        """``P(y = 1 | component k)``, ``(K,)``."""
        self._check_fitted()
        return self.labels_.probs

    def _pf_summary(self, **fit: Any) -> dict[str, Any]:
        """A JSON-able description of the fit: the model's own entries ``fit``, then labels and relevance."""
        self._check_fitted()
        relevance = self.switch_probs_.cpu().tolist()
        return {
            "model": type(self).__name__,
            "n_components": self.n_components,
            "switch_prior": self._switch_p,
            "n_iter": self.n_iter_,
            "converged": self.converged_,
            **fit,
            "label_probs": self.labels_.probs.cpu().tolist(),
            "relevance": relevance,
            "n_relevant": int(sum(r > 0.5 for r in relevance)),
            "feature_names": self.feature_names_in_,
        }
