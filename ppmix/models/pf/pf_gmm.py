"""``PFGMM``: the prediction-focused Gaussian mixture (Sharma et al., 2023, §4.1, §5, B), and ``SupervisedGMM``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.transforms import biject_to

from ppmix._validation import check_n_components, check_positive_int, to_output
from ppmix.components import BernoulliLabel, DiagGaussian
from ppmix.components.family import DensityFamily, PriorKey
from ppmix.models._arviz import LaplaceTarget
from ppmix.models._family_components import FamilyModel
from ppmix.models._flat import flat_prior
from ppmix.models._labels import encode_labels
from ppmix.models._missing import check_missing_option
from ppmix.models._params import store_params
from ppmix.models._target import BINARY
from ppmix.models._weights import split_weights
from ppmix.models.base import MixtureModel
from ppmix.models.batch import Batch, as_batch
from ppmix.models.pf import _pf_state as pf
from ppmix.models.pf import _relevance as relevance
from ppmix.models.pf._observed import frames_of, start_frames
from ppmix.models.pf.restarts import fit_restarts, in_sample_log_p_y, start_responsibilities
from ppmix.models.pf.switch_selection import relevant_feature_mask, select_switch_prior
from ppmix.models.pf.switches import FrameLabels, switch_frame_sites, switch_guide, switched_log_joint
from ppmix.ops.logspace import normalize_log_joint_

__all__ = ["PFGMM", "SupervisedGMM"]

logger = logging.getLogger(__name__)


@dataclass
class PFData:
    """Features and (possibly missing) labels as the pf-GMM program receives them."""

    x: torch.Tensor
    labels: FrameLabels


#: constraint of every site the guide holds (and of the variational switch probabilities)
_SITE_CONSTRAINTS = {
    "weights": constraints.simplex,
    "locs": constraints.real,
    "scales": constraints.positive,
    "label_probs": constraints.unit_interval,
    "background_loc": constraints.real,
    "background_scale": constraints.positive,
    "switch_probs": constraints.unit_interval,
}


class _PointGuide(torch.nn.Module):
    """The SVI guide: unconstrained parameters for every global value, run through a guide program."""

    def __init__(self, program: Any, values: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.program = program
        self.unconstrained = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(biject_to(_SITE_CONSTRAINTS[k]).inv(v.detach()).clone()) for k, v in values.items()}
        )

    def values(self) -> dict[str, torch.Tensor]:
        return {k: biject_to(_SITE_CONSTRAINTS[k])(u) for k, u in self.unconstrained.items()}

    def forward(self, data: PFData) -> None:
        self.program(data, self.values())

    def median(self, data: Any = None) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.values().items()}


class PFGMM(FamilyModel):
    """Prediction-focused Gaussian mixture: a mixture over the label-relevant features only.

    Generative program (eqs. 13–14, with the per-point switches of §5)::

        S_nd ~ Bern(p)                     per point and feature
        Z_n ~ Cat(weights)                 weights ~ Dirichlet(alpha)
        Y_n | Z_n = k ~ Bern(label_probs_k)
        X_nd | Z_n = k, S_nd = 1 ~ N(loc_kd, scale_kd^2)
        X_nd | S_nd = 0 ~ N(background_loc_d, background_scale_d^2)

    Variational family (eq. 18): ``q(Z_n)`` and ``q(S_nd) = Bern(phi_d)`` with ``phi``
    tied across points; ``phi_d`` is the relevance of feature ``d`` (:attr:`relevance_`).
    ``fit(X, y)`` runs the closed-form variational EM of Supplement B.2 (default) or SVI
    on the same model/guide (``engine="svi"``; Pyro's ``TraceEnum_ELBO`` with both
    discrete sites enumerated in the guide equals the EM ELBO, which the tests check).
    Labels may be partly missing (NaN): those rows contribute only their features.

    Parameters
    ----------
    n_components : int, default 2
        ``K``, the component budget.
    switch_prior : "auto" or float in (0, 1], default "auto"
        ``p``, the prior probability that a feature is relevant. ``"auto"`` chooses it by
        stratified 3-fold cross-validation of the held-out mean ``log P(y | x)`` over a
        log-spaced grid from 1e-3 to 0.5 (extended downwards while its lower edge wins,
        refined around the best; the smallest ``p`` within one standard error of the best
        score is kept, or the next best smaller one while the fit on all the data falls
        below its held-out score by more than a standard error; seeded by ``seed``; see
        :func:`~ppmix.models.pf.switch_selection.select_switch_prior`; the validation fits
        use EM whatever the engine and score each ``p`` by the mean over the ``n_restarts``
        starts, so that a ``p`` whose fit depends on the start scores low), then fits on all
        the data; this costs about 25 ``n_restarts`` extra fits. Without two labelled rows
        per class it falls back to 0.5. A number is used as given. ``p = 1`` is the
        supervised GMM (:class:`SupervisedGMM`). See :func:`ppmix.models.switch_prior_window`
        for the range that selects the label-aligned components.
    alpha : float >= 1, default 1.0
        Dirichlet prior on the weights (B.2.4); 1 is flat.
    init_params : {"relevance", "kmeans", "k-means++", "random"}, default "relevance"
        ``"relevance"``: k-means on the features whose distribution changes with the
        label (see :func:`ppmix.models.pf.switches.label_relevant_features`); without it EM
        usually starts, and stays, at the solution that follows the irrelevant features.
    n_restarts : int >= 1, default 3
        Relevance-guided starts of every fit (:mod:`~ppmix.models.pf.restarts`): the
        ``init_params`` start, a class-stratified k-means start and k-means on the
        label-associated features scaled by their label statistic; the fit with the best
        in-sample mean ``log P(y | x)`` is kept (the ELBO without labels), a later start only
        when better by more than two standard errors. 1 is one start; ``fit_em`` makes one.
    n_init, max_iter, tol, reg_covar, warm_start : as for :class:`~ppmix.models.gmm.GMM`
        (``n_init`` EM runs per start, kept by the ELBO; ``warm_start`` continues from the fit, one start).
    missing : {"error", "marginalize"}, default "error"
        What a NaN in ``X`` is: an error naming ``X``, or an entry missing at random (``"marginalize"``), which
        drops its term from the components' and the background's log-densities: exact variational EM of the
        observed entries (each feature's Gaussians fitted on the rows that observe it, the switch update weighing
        each feature's gain over those rows by all rows; :mod:`~ppmix.models.pf._observed`). The data scale and
        the label tests of :attr:`relevant_features_` use each feature's observed entries, the starts fill the
        missing ones with their columns' means; predictions, ``score_samples`` and ``score`` take rows with
        missing entries (a row with none observed is an error naming it). EM only (``engine="em"``; ``fit_em`` too).
    priors : dict, optional
        The priors' hyperparameters, by key (``prior_keys()`` lists them with their defaults; None: every default):
        ``"weights"`` the Dirichlet concentration of the weights (default ``alpha``, which it replaces) and the
        diagonal Gaussian family's, ``"locs_loc"``, ``"locs_scale"``, ``"variance_concentration"`` and
        ``"variance_rate"``, as for :class:`~ppmix.models.gmm.GMM` (a number or one per feature); they are the
        priors of the components and of the background (the label probabilities' stays flat). Given, EM is MAP-EM: the
        ELBO plus the log prior (in ``history_``) climbs, each component's feature ``d`` fitted to the ``phi_d``
        share of its data the switches give it (an irrelevant feature's parameters stay at the prior's mode) and the
        background to every row; ``to_arviz``'s Laplace approximation is then of the log posterior and its ``prior``
        group draws from them.
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    weights_ : Tensor (K,)
    components_ : DiagGaussian
        The components on the relevant features.
    background_ : DiagGaussian
        One Gaussian (``(1, D)``) for the switched-off features.
    label_probs_ : Tensor (K,)
        ``P(Y = 1 | component)``.
    relevance_ : ndarray or pandas Series (D,)
        ``phi_d = q(S_d = 1) = sigmoid(logit p + gain_d)``: it moves with ``p`` (every
        ``phi_d >= p``), so its value says little by itself; see ``relevance_gain_``.
    relevance_gain_ : ndarray or pandas Series (D,)
        ``gain_d = logit phi_d - logit p`` (B.2.1): the per-point log-likelihood gain of
        feature ``d`` under the components over the background, free of ``p``.
    relevant_features_ : ndarray or pandas Series of bool (D,)
        The features the fitted mixture uses and that go with the label: both the gain
        (``2 N gain_d`` against ``chi^2_{2(K-1)}``) and the label association (class-conditional
        against pooled Gaussian, ``chi^2_2``) significant at level ``0.05 / D`` (see
        :func:`~ppmix.models.pf.switch_selection.relevant_feature_mask`). The chance that any
        feature independent of the label is selected is at most 0.05 (asymptotically, for
        features Gaussian or lighter-tailed within each class). All True when ``p = 1``.
    p_ : float
        The switch prior used: ``switch_prior``, or the value ``"auto"`` chose.
    switch_prior_scores_ : dict or None
        For ``"auto"``: the cross-validated mean held-out ``log P(y | x)`` of every ``p``
        scored (empty when too few labels to validate, then ``p_ = 0.5``); None otherwise.
    restart_scores_ : list of float
        The in-sample mean ``log P(y | x)`` (ELBO per point without labels) of every start of
        the final fit, in start order; a later start replaces the one kept only when better by
        more than two standard errors of the paired per-row difference (and than 1e-4).

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> data = make_pf_synthetic(400, n_relevant=4, n_features=12, seed=0)
    >>> model = PFGMM(n_components=4, seed=0, progress=False).fit(data.X, data.y)
    >>> model.relevant_features_.tolist() == data.relevant.tolist()
    True
    >>> model.p_ in model.switch_prior_scores_, len(model.restart_scores_)
    (True, 3)
    >>> model.predict_proba(data.X[:2]).shape
    (2, 2)
    """

    max_plate_nesting = 2
    covariance_type = "diag"
    posterior_remedy = pf.POSTERIOR_REMEDY + (
        "; PFGMMGibbs samples the full-covariance pf-GMM (switches, assignments and parameters)"
    )
    online_em_unavailable = pf.ONLINE_EM_UNAVAILABLE
    #: the start :meth:`_em_initialize` makes (set by :func:`~ppmix.models.pf.restarts.fit_restarts`)
    _restart = 0

    supports_auto_switch_prior = True

    def __init__(
        self,
        n_components: int = 2,
        *,
        switch_prior: float | str = "auto",
        alpha: float = 1.0,
        init_params: str = "relevance",
        n_init: int = 1,
        n_restarts: int = 3,
        max_iter: int = 200,
        tol: float = 1e-7,
        reg_covar: float = 1e-6,
        warm_start: bool = False,
        missing: str = "error",
        priors: dict[str, Any] | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__()
        store_params(self, locals())

    def _validate_hyperparameters(self) -> None:
        super()._validate_hyperparameters()
        pf.validate_pf_params(self)
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha >= 1:
            raise ValueError(f"alpha must be a number >= 1 (the MAP weights need it); got {self.alpha!r}")
        if (self.priors or {}).get("weights") is not None and self.alpha != 1:
            raise ValueError("priors['weights'] and alpha both set the weights' concentration: set one")
        check_positive_int(self.n_restarts, "n_restarts")
        check_missing_option(self.missing, self._component_family())

    @property
    def _accepts_missing(self) -> bool:  # type: ignore[override]
        return self.missing == "marginalize"

    def fit(self, X: Any, y: Any = None, *, sample_weight: Any = None, engine: str = "em", **options: Any) -> "PFGMM":
        """Fit by variational EM (``engine="em"``) or SVI (``"svi"``) on features ``X`` and labels ``y``.

        ``y`` holds two classes (0/1, ±1, booleans or strings; ``classes_`` records them)
        with NaN or None for missing labels; ``y=None`` fits without labels.

        ``sample_weight`` (EM only): one non-negative weight per row, scikit-learn's semantics (an integer
        weight is the row repeated, zero drops it). It weighs the data scale (the variance floor), the
        start (the background, the relevance test, k-means), the ELBO and every M-step, the restarts'
        in-sample scores and their standard errors, ``switch_prior="auto"`` (see
        :func:`~ppmix.models.pf.switch_selection.select_switch_prior`) and :attr:`relevant_features_`.

        Examples
        --------
        >>> from ppmix.datasets import make_pf_synthetic
        >>> data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
        >>> w = np.r_[np.full(100, 2), np.ones(100)]  # the first 100 rows count twice
        >>> model = PFGMM(2, switch_prior=0.2, seed=0, progress=False).fit(data.X, data.y, sample_weight=w)
        >>> model.relevant_features_.tolist()
        [True, True, False, False]
        """
        if engine == "mcmc":
            raise ValueError(f"{type(self).__name__} is fitted by engine='em' or 'svi'; 'mcmc' is not available")
        if sample_weight is not None and engine != "em":
            raise ValueError(f"sample_weight is taken by engine='em' only; got engine={engine!r}")
        if self.missing == "marginalize" and engine != "em":
            raise ValueError(f"missing='marginalize' is for engine='em' only; got engine={engine!r}")
        self._validate_hyperparameters()
        self.switch_prior_scores_: dict[float, float] | None = None
        if sample_weight is not None:
            options["sample_weight"] = sample_weight
        if not pf.auto_switch_prior(self):
            self.p_ = float(self.switch_prior)
            train = self._fit_restarts(X, y, engine, options)
        else:
            with self._overriding("_fit_sample_weight", sample_weight):
                data = self.prepare_data(X, y, fitting=True)
            weight = None if sample_weight is None else self._weigh(data, sample_weight).weight
            selection = select_switch_prior(
                self,
                data.x,
                data.labels.y,
                data.labels.observed,
                fit_options=options if engine == "em" else None,
                sample_weight=weight,
            )
            self.switch_prior_scores_ = selection.scores
            for p in selection.candidates():  # the first whose fit on all the data agrees with its validation
                self.p_ = p
                train = self._fit_restarts(X, y, engine, options)
                if selection.agrees(p, in_sample_log_p_y(self, train)):
                    break
                logger.info("the fit at p = %.3g fell below its validation score; trying a smaller p", p)
        if pf.all_relevant(self):
            self._relevant_mask = np.ones(self.n_features_in_, dtype=bool)
        else:
            gain = np.asarray(self.relevance_gain_, dtype=np.float64)
            rows, weight = split_weights(train)
            self._relevant_mask = relevant_feature_mask(gain, self.n_components, rows.x, rows.labels, weight=weight)
        return self

    def _fit_restarts(self, X: Any, y: Any, engine: str, options: dict[str, Any]) -> PFData | Batch:
        """``n_restarts`` fits at ``p_``, the best kept (:func:`~ppmix.models.pf.restarts.fit_restarts`); the
        prepared training data (:meth:`_fit_start`'s)."""
        n_restarts = 1 if self.warm_start and self.is_fitted else self.n_restarts
        fitted: dict[str, PFData | Batch] = {}

        def start(restart: int) -> PFData | Batch:
            fitted["data"] = self._fit_start(X, y, restart, engine=engine, **options)
            return fitted["data"]

        self.restart_scores_ = fit_restarts(self, start, n_restarts)
        return fitted["data"]

    def _fit_start(
        self, X: Any, y: Any, restart: int, *, sample_weight: Any = None, engine: str = "em", **options: Any
    ) -> PFData | Batch:
        """One fit at ``p_`` (``switch_prior`` when it is a number) from start ``restart`` (0: the model's own
        start; the others: :func:`~ppmix.models.pf.restarts.start_responsibilities`); the prepared training data
        (:class:`~ppmix.models.batch.Batch` by their ``sample_weight`` where given).

        What :meth:`fit` runs ``n_restarts`` times (keeping the best) and switch-prior selection runs per fold.
        """
        if not pf.auto_switch_prior(self):
            self.p_ = float(self.switch_prior)
        with self._overriding("_restart", restart), self._overriding("_fit_sample_weight", sample_weight):
            super().fit(X, y, sample_weight=sample_weight, engine=engine, **options)
        return self._train_data if sample_weight is None else self._weigh(self._train_data, sample_weight)

    # ------------------------------------------------- the pf parts' hooks
    #: within the restarts of one fit: the data scale of their training frames (:func:`pf.record_data_scale`)
    _restart_data_scale: dict[str, Any] | None = None
    #: the ``sample_weight`` of the fit under way (None otherwise): the data scale ``prepare_data`` records is weighted
    _fit_sample_weight: Any = None

    def __sklearn_tags__(self) -> Any:
        return BINARY.tags(super().__sklearn_tags__())

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:  # type: ignore[override]
        """The accuracy of :meth:`predict` on ``(X, y)``, as scikit-learn's classifiers score."""
        return BINARY.score(self, X, y, sample_weight)

    def _component_family(self) -> DensityFamily:
        return pf.pf_component_family(self.reg_covar)

    def _record_data_scale(self, x: torch.Tensor, name: str = "X") -> None:
        pf.record_data_scale(self, x, name, super()._record_data_scale)

    def _record_weighted_data_scale(self, frames: torch.Tensor, weight: torch.Tensor) -> None:
        pf.record_weighted_data_scale(self, frames, weight)

    def _em_data_statistics(self, data: Any) -> dict[str, Any]:
        return relevance.data_statistics(self, data)

    def _em_set_data_statistics(self, stats: dict[str, Any]) -> None:
        relevance.set_data_statistics(self, stats)

    def _extra_state(self) -> dict[str, Any]:
        return relevance.relevance_state(self)

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        relevance.load_relevance_state(self, state)

    def _laplace_target(self, data: Any) -> LaplaceTarget:
        return pf.pf_laplace_target(self, data, self._differentiable_elbo)

    @property
    def relevance_(self) -> Any:
        """``phi_d = q(S_d = 1)`` per feature (a Series indexed by feature names for DataFrame input)."""
        return pf.switch_relevance(self)

    @property
    def label_probs_(self) -> torch.Tensor:
        """``P(y = 1 | component k)``, ``(K,)``."""
        self._check_fitted()
        return self.labels_.probs

    @property
    def relevance_gain_(self) -> Any:
        """``gain_d = logit phi_d - logit p``, the p-free evidence of B.2.1 (NaN when ``p = 1``)."""
        return relevance.relevance_gain(self)

    @property
    def relevant_features_(self) -> Any:
        """Features the mixture uses and that go with the label (see the class docstring); all when ``p = 1``
        (:func:`~ppmix.models.pf._relevance.relevant_features`)."""
        return relevance.relevant_features(self)

    # ------------------------------------------------------------------- data
    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> PFData:
        """Validate ``X`` (N, D) and the binary labels ``y`` (NaN or None for missing; optional)."""
        x = MixtureModel.prepare_data(self, X, None, fitting=fitting)
        if fitting:
            check_n_components(self.n_components, x.shape[0])
            pf.check_pf_features(self, x)
            self._record_data_scale(x)
        if y is None:
            encode_labels(self, None, fitting=fitting)
            labels = FrameLabels.missing(x.shape[0], x.dtype, x.device)
        else:
            labels = FrameLabels.from_values(encode_labels(self, y, fitting=fitting), x.shape[0], x.dtype, x.device)
        data = PFData(x, labels)
        if fitting and self._fit_sample_weight is not None:
            self._record_weighted_data_scale(x, self._weigh(data, self._fit_sample_weight).weight)
        return data

    def _sample_weight_units(self, data: Any) -> tuple[str, int]:
        """One ``sample_weight`` per row."""
        return "row", int(split_weights(data)[0].x.shape[0])

    def _em_data(self, data: PFData | Batch) -> Batch:
        """The batch of the rows centred once (rows with missing entries as
        :func:`~ppmix.models.pf._observed.frames_of` holds them), their labels and weights."""
        batch = as_batch(data)
        return batch.prepared(rows=frames_of(batch.data.x), labels=batch.data.labels)

    def _n_observations(self, data: Any) -> float:
        rows, weight = split_weights(data)
        return int(rows.x.shape[0]) if weight is None else float(weight.sum())

    def _observed_data(self, data: PFData) -> dict[str, torch.Tensor]:
        return {"x": data.x}

    # ------------------------------------------------------------ the program
    def _weights_concentration(self) -> torch.Tensor:
        """``priors["weights"]``, else ``alpha``, as a ``(K,)`` tensor."""
        return self._concentration("weights", (self.n_components,), default=float(self.alpha))

    def _structure_prior_keys(self) -> dict[str, PriorKey]:
        return {"weights": PriorKey("the Dirichlet concentration of the weights (default alpha)", "concentration")}

    def _weights_prior(self, k: int, opts: dict) -> dist.Distribution:
        alpha = self._weights_concentration()
        if bool((alpha == 1).all()) and not self.is_bayesian:
            return flat_prior(self, "weights", constraints.simplex, (), (k,), opts)
        return dist.Dirichlet(alpha.to(**opts))

    def model(self, data: PFData) -> None:
        """Weights, components, labels and background; per point ``z``, ``y``; per feature ``s``, ``x``."""
        x = data.x
        k, d = self.n_components, x.shape[1]
        opts = {"dtype": x.dtype, "device": x.device}
        weights = pyro.sample("weights", self._weights_prior(k, opts))
        sites = pf.pf_global_sites(self, k, d, opts)
        with self._data_plate(x.shape[0], dim=-2) as idx:
            z = pyro.sample("z", dist.Categorical(weights))
            labels = FrameLabels(data.labels.y[idx], data.labels.observed[idx])
            switch_frame_sites(sites, z, x[idx], labels, None if pf.all_relevant(self) else pf.switch_p(self))

    def guide(self, data: PFData) -> None:
        """Point masses on the globals; ``q(z_n)`` in closed form and ``q(s_nd) = Bern(phi_d)``, enumerated."""
        self._guide_program(data, self._get_globals())

    def _guide_program(self, data: PFData, values: dict[str, torch.Tensor]) -> None:
        pyro.sample("weights", dist.Delta(values["weights"], event_dim=1))
        pf.pf_guide_global_sites(values, pyro.plate("components", self.n_components))
        phi = values.get("switch_probs")
        with self._data_plate(data.x.shape[0], dim=-2) as idx:
            labels = FrameLabels(data.labels.y[idx], data.labels.observed[idx])
            q_z = torch.softmax(_variational_log_joint(data.x[idx], labels, values), dim=-1)
            pyro.sample("z", dist.Categorical(q_z.unsqueeze(-2)), infer={"enumerate": "parallel"})
            if phi is not None and not pf.all_relevant(self):
                switch_guide(phi)

    def _make_svi_guide(self, kind: str, init: dict[str, torch.Tensor]) -> tuple[Any, None]:
        """The paper's variational family with point-mass globals (``guide="delta"`` only)."""
        if kind != "delta":
            raise ValueError("PFGMM's SVI guide is the paper's variational family; only guide='delta' is supported")
        return _PointGuide(self._guide_program, init), None

    # -------------------------------------------------------------- globals
    def _get_globals(self) -> dict[str, torch.Tensor]:
        return {"weights": self.weights_.clone(), **self._component_globals(), **pf.pf_globals(self)}

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        return {"weights": (self.n_components,), **self._component_state_shapes(sites=True), **pf.pf_state_shapes(self)}

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        weights = torch.as_tensor(values["weights"]).to(dtype=self.dtype, device=self._device)
        self.weights_ = weights / weights.sum()
        self._set_component_globals(values)
        pf.set_pf_globals(self, values)
        self._invalidate_guide()

    def _arviz_dims(self) -> dict[str, list[str]]:
        return {"weights": ["component"], **self._component_dims(), **pf.PF_DIMS}

    # ------------------------------------------------------------------- EM
    def _em_initialize(self, data: Batch, generator: torch.Generator) -> None:
        """Background fitted once; responsibilities from (relevance-)k-means, or restart ``_restart``'s; one M-step
        (all on the weighted rows, with ``sample_weight``)."""
        resp = pf.pf_start(self, data.rows, data.labels, generator, weight=data.weight)
        if self._restart:
            frames = start_frames(data.rows, data.weight)
            resp = start_responsibilities(self, frames, data.labels, generator, self._restart, data.weight)
        self._m_step(data, resp)

    def _log_prior(self) -> torch.Tensor:
        """The weights' Dirichlet log density (zero where flat) and, with ``priors``, the components' and the
        background's log prior: MAP-EM's objective is the ELBO plus this."""
        log_prior = self.weights_.new_zeros(())
        if self.priors is not None:
            log_prior = self._map_log_prior_components() + pf.background_log_prior(self)
        alpha = self._weights_concentration()
        if bool((alpha == 1).all()):
            return log_prior
        return log_prior + dist.Dirichlet(alpha.to(self.weights_)).log_prob(self.weights_)

    def _e_step(self, data: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Optimal ``q(z)`` given ``phi`` and the parameters, and the ELBO of eq. 19 (every row counted as often as
        its sample weight)."""
        resp, log_norm = normalize_log_joint_(pf.frame_log_joint(self, data.rows, data.labels, self.weights_.log()))
        return resp, self._elbo(data, log_norm)

    def _elbo(self, data: Batch, log_norm: torch.Tensor) -> torch.Tensor:
        """The ELBO from the rows' ``log sum_k exp(log joint)`` ``(N, 1)``."""
        weight = data.weight
        data_term = log_norm.sum() if weight is None else log_norm.reshape(-1) @ weight.to(log_norm)
        return data_term + pf.frame_objective_terms(self, data.rows, weight) + self._log_prior()

    def _differentiable_elbo(self, data: Batch) -> torch.Tensor:
        """:meth:`_e_step`'s ELBO by an out-of-place log-sum-exp (its fused one overwrites what autograd needs)."""
        log_joint = pf.frame_log_joint(self, data.rows, data.labels, self.weights_.log())
        return self._elbo(data, torch.logsumexp(log_joint, dim=1, keepdim=True))

    def _m_step(self, data: Batch, resp: torch.Tensor) -> None:
        """Weights (Dirichlet MAP), components, labels, then ``phi`` (B.2.1–B.2.4)."""
        self._em_update(self._em_statistics(data, resp))

    def _em_statistics(self, data: Batch, resp: torch.Tensor) -> dict[str, Any]:
        """What the M-step needs of ``data``: component and label statistics under ``resp`` times the rows' sample
        weights (merge across shards)."""
        resp = resp if data.weight is None else resp * data.weight[:, None].to(resp)
        return pf.frame_statistics_of(self, data.rows, data.labels, resp)

    def _em_update(self, stats: dict[str, Any]) -> None:
        """The M-step from (merged) statistics: weights (Dirichlet MAP), components, labels, then ``phi``."""
        counts = stats["components"].counts.to(self.dtype)
        alpha = self._weights_concentration().to(counts)
        self.weights_ = (counts + alpha - 1 + 10 * torch.finfo(self.dtype).eps) / (counts.sum() + (alpha - 1).sum())
        pf.update_from_frame_statistics(self, stats)
        self._invalidate_guide()

    def _em_global_objective(self, n_observations: int) -> torch.Tensor:
        """The ELBO's terms that are not sums over the data: the switches' and the weights' priors (with ``priors``,
        the components' and the background's too)."""
        return pf.switches(self).objective(n_observations) + self._log_prior()

    # ---------------------------------------------------------- predictions
    def _component_posterior(self, data: PFData, use_labels: bool) -> torch.Tensor:
        labels = data.labels if use_labels else FrameLabels.missing(data.x.shape[0], data.x.dtype, data.x.device)
        frames = frames_of(data.x, self.components_.reference)  # not the batch mean
        return torch.softmax(pf.frame_log_joint(self, frames, labels, self.weights_.log()), dim=1)

    def _posterior_marginals(self, data: PFData) -> dict[str, torch.Tensor]:
        """``q(z_n = k | x_n, y_n)`` (labels used where observed)."""
        return {"z": self._component_posterior(data, use_labels=True)}

    def _responsibilities(self, data: PFData) -> torch.Tensor:
        return self._component_posterior(data, use_labels=False)

    def predict_components(self, X: Any) -> Any:
        """Most probable component of each row given its features only."""
        self._check_fitted()
        return to_output(self._responsibilities(self.prepare_data(X)).argmax(-1), X)

    def predict_proba(self, X: Any) -> Any:
        """``[P(y=c_0 | x), P(y=c_1 | x)]`` for ``classes_ = [c_0, c_1]``, with ``P(y=c_1 | x) = sum_k q(z=k | x)
        label_probs_k`` (§5), ``(N, 2)``."""
        self._check_fitted()
        p1 = self._responsibilities(self.prepare_data(X)) @ self.labels_.probs
        return to_output(torch.stack([1 - p1, p1], dim=1), X)

    def predict(self, X: Any) -> Any:
        """The more probable label of each row (a class of ``classes_``)."""
        self._check_fitted()
        p1 = self._responsibilities(self.prepare_data(X)) @ self.labels_.probs
        return BINARY.decode(self, (p1 > 0.5).long(), X)

    def _pointwise_log_likelihood(self, data: PFData, switches: str = "map") -> torch.Tensor:
        """``log p(x_n)`` (labels not used), shape ``(N,)``; ``switches`` as in :meth:`score_samples`."""
        features = torch.ones(data.x.shape[1], dtype=torch.bool, device=data.x.device)
        return torch.logsumexp(
            pf.switches(self).mixture_log_prob(self.components_, data.x, features, switches) + self.weights_.log(),
            dim=1,
        )

    def score_samples(self, X: Any, switches: str = "map") -> Any:
        """``log p(x_n)`` for every row.

        ``switches="map"`` (default, as the paper reports ``log P(X)``): features with
        ``phi_d > 0.5`` come from the components, the others from the background;
        ``"mean"``: each feature from the two-part mixture ``phi_d N(. | k) + (1 - phi_d) N(. | background)``.
        """
        self._check_fitted()
        return to_output(self._pointwise_log_likelihood(self.prepare_data(X), switches), X)

    def log_likelihood_relevant(self, X: Any, relevant_mask: Any, switches: str = "map") -> Any:
        """``log p(x_R)`` per row: the exact marginal of :meth:`score_samples`'s density on the masked features."""
        self._check_fitted()
        data = self.prepare_data(X)
        mask = torch.as_tensor(relevant_mask, dtype=torch.bool, device=data.x.device)
        if mask.shape != (data.x.shape[1],) or not mask.any():
            raise ValueError(f"relevant_mask must be a boolean (D,) = ({data.x.shape[1]},) mask selecting a feature")
        log_joint = pf.switches(self).mixture_log_prob(self.components_, data.x, mask, switches) + self.weights_.log()
        return to_output(torch.logsumexp(log_joint, dim=1), X)

    def sample(self, n_samples: int = 1) -> dict[str, Any]:
        """Draw ``{"x", "y", "z", "s"}``: components, labels, switches ``~ Bern(phi)`` and features."""
        self._check_fitted()
        n = check_positive_int(n_samples, "n_samples")
        gen = self._generator(offset=7919)
        cpu = {"dtype": self.dtype}
        z = torch.multinomial(self.weights_.cpu(), n, replacement=True, generator=gen)
        y = (torch.rand(n, generator=gen, **cpu) < self.labels_.probs.cpu()[z]).long()
        s = torch.rand(n, self.n_features_in_, generator=gen, **cpu) < self.switch_probs_.cpu()
        on = self.components_.sample(z.to(self._device), generator=gen if self._device.type == "cpu" else None)
        bg = self.background_.sample(
            torch.zeros_like(z).to(self._device), generator=gen if self._device.type == "cpu" else None
        )
        x = torch.where(s.to(self._device), on, bg).cpu()
        return {"x": x.numpy(), "y": y.numpy(), "z": z.numpy(), "s": s.numpy()}

    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the fit; ``relevant`` and ``n_relevant`` follow :attr:`relevant_features_`."""
        self._check_fitted()
        summary = pf.pf_summary(
            self, engine=self.engine_, elbo_per_point=self.lower_bound_, weights=self.weights_.cpu().tolist()
        )
        scores = getattr(self, "switch_prior_scores_", None)
        summary["switch_prior_scores"] = None if scores is None else [[p, s] for p, s in scores.items()]
        summary["restart_scores"] = getattr(self, "restart_scores_", None)
        gain = np.asarray(self.relevance_gain_, dtype=float)
        summary["relevance_gain"] = None if pf.all_relevant(self) else [float(g) for g in gain]
        mask = relevance.relevant_mask_or_none(self)
        if mask is not None:
            summary["relevant"] = [bool(m) for m in mask]
            summary["n_relevant"] = int(mask.sum())
        return summary


def _variational_log_joint(x: torch.Tensor, labels: FrameLabels, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """:func:`switched_log_joint` from a dict of (differentiable) values, with the weights' log prior."""
    components = DiagGaussian(values["locs"], values["scales"], reg_covar=0.0)
    label_family = BernoulliLabel(values["label_probs"])
    return switched_log_joint(components, label_family, values.get("switch_probs"), values["weights"].log(), x, labels)


class SupervisedGMM(PFGMM):
    """Supervised GMM (sup-GMM): the joint mixture of features and label, i.e. :class:`PFGMM` with ``p = 1``.

    Every feature is relevant (``phi = 1``); the code path is PFGMM's. The other keyword
    arguments are :class:`PFGMM`'s (``alpha``, ``n_init``, ``max_iter``, ``tol``, ``reg_covar``,
    ``warm_start``, ``seed``, ``device``, ``dtype``, ``progress``); the default start is k-means, and
    ``n_restarts`` defaults to 1: the paper's baseline maximises the joint likelihood, which label-guided
    restarts kept by ``log P(y | x)`` would not.

    Parameters
    ----------
    n_components : int, default 2
        ``K``, the number of components.
    init_params : {"kmeans", "relevance", "k-means++", "random"}, default "kmeans"
        The start of EM, as for :class:`PFGMM`.
    n_restarts : int >= 1, default 1
        Starts of every fit, as for :class:`PFGMM`.
    alpha, n_init, max_iter, tol, reg_covar, warm_start, missing, priors : as for :class:`PFGMM`.
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> data = make_pf_synthetic(300, n_relevant=4, n_features=6, seed=0)
    >>> SupervisedGMM(4, seed=0, progress=False).fit(data.X, data.y).relevance_.tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """

    fixed_params = ("switch_prior",)

    def __init__(
        self, n_components: int = 2, *, init_params: str = "kmeans", n_restarts: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(n_components, switch_prior=1.0, init_params=init_params, n_restarts=n_restarts, **kwargs)
