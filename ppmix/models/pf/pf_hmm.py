"""``PFHMM``: the prediction-focused hidden Markov model (Sharma et al., 2023, §4.2, §5, B),
and ``SupervisedHMM``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.ops.indexing import Vindex

from ppmix._validation import to_output
from ppmix.algorithms.forward_backward import forward_backward
from ppmix.components.family import DensityFamily, Statistics
from ppmix.models._arviz import LaplaceTarget
from ppmix.models._labels import encode_labels
from ppmix.models._missing import check_missing_option
from ppmix.models._params import store_params
from ppmix.models._sequences import SequenceBatch
from ppmix.models._target import BINARY
from ppmix.models.base import MixtureModel
from ppmix.models.batch import Batch, as_batch
from ppmix.models.hmm import HMM, _Counts, _sequence_weights
from ppmix.models.pf import _pf_state as pf
from ppmix.models.pf._observed import frames_of
from ppmix.models.pf.switches import FrameLabels, switch_frame_sites, switch_guide

__all__ = ["PFHMM", "SupervisedHMM"]

#: the most dimensions a torch tensor may have: under enumeration each step's state (and switches) takes one
_TORCH_MAX_DIMS = 64


class PFHMM(HMM):
    """Prediction-focused HMM: a hidden Markov chain over the label-relevant features only.

    Generative program (eqs. 15–16, with per-step switches as in the factorisation of §5)::

        Z_1 ~ Cat(initial),  Z_t | Z_{t-1} = i ~ Cat(transition_i)
        S_td ~ Bern(p)                         per step and feature
        Y_t | Z_t = k ~ Bern(label_probs_k)
        X_td | Z_t = k, S_td = 1 ~ N(loc_kd, scale_kd^2)
        X_td | S_td = 0 ~ N(background_loc_d, background_scale_d^2)

    Variational family: ``q(S_td) = Bern(phi_d)`` tied across steps and sequences, and
    for every sequence the exact chain posterior ``q(Z_{1:T})`` under the emissions
    ``sum_d phi_d log N(x_td | k) + log p(y_t | k)``. The variational EM of Supplement
    B.2 alternates a batched forward–backward (E-step) with closed-form updates of the
    initial and transition probabilities, the components, ``label_probs``, the
    background and ``phi``; the ELBO it reports equals Pyro's ``TraceEnum_ELBO`` on
    :meth:`model` and :meth:`guide` (the guide enumerates ``q(z_1) q(z_t | z_{t-1})``
    and the switches, so that check is exponential in ``T``: a test oracle, not an
    engine). The switches are a part shared with :class:`~ppmix.models.pf.pf_gmm.PFGMM`
    (:class:`~ppmix.models.pf.switches.Switches`), the background and labels are fitted by the functions both
    call (:mod:`~ppmix.models.pf._pf_state`): the frames are all valid time steps.

    Predictions drop the label term: ``predict_proba`` gives per step
    ``P(y_t = 1 | x_{1:T}) = sum_k q(z_t = k | x_{1:T}) label_probs_k`` with the smoothed
    marginals of the ``phi``-weighted chain.

    Parameters
    ----------
    n_components : int, default 2
        ``K``, the number of hidden states (the component budget).
    switch_prior : float in (0, 1], default 0.5
        ``p``, the prior probability that a feature is relevant; ``p = 1`` is the
        supervised HMM (:class:`SupervisedHMM`).
    init_params : {"relevance", "kmeans", "k-means++", "random"}, default "relevance"
        Start of the frame responsibilities, as for :class:`~ppmix.models.pf.pf_gmm.PFGMM`
        (``"relevance"``: k-means on the features whose distribution changes with the label).
    n_init, max_iter, tol, reg_covar, warm_start : as for :class:`~ppmix.models.hmm.HMM`.
    sequence_column : str, optional
        Sequence-id column of a DataFrame ``X``; the labels are then ``y="<column name>"``.
    missing : {"error", "marginalize"}, default "error"
        What a NaN in ``X`` is: an error naming ``X``, or an entry missing at random (``"marginalize"``): a step
        emits by its observed entries, as :class:`~ppmix.models.pf.pf_gmm.PFGMM`'s rows do (exact variational EM;
        the data scale from each feature's observed entries, the start with the missing ones filled by their
        columns' means); predictions and ``score`` take such steps too (a step with none observed is an error). EM
        only (``fit``, ``fit_em``).
    priors : dict, optional
        The priors' hyperparameters, by key (``prior_keys()`` lists them with their defaults; None: every default):
        ``"initial"`` and ``"transition"`` as for :class:`~ppmix.models.hmm.HMM`, and the diagonal Gaussian
        family's as for :class:`~ppmix.models.pf.pf_gmm.PFGMM` (the priors of the components and of the
        background). Given, EM is MAP-EM as :class:`~ppmix.models.pf.pf_gmm.PFGMM`'s (the chain's Dirichlet
        modes), ``to_arviz``'s Laplace approximation is of the log posterior and its ``prior`` group draws from
        them.
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    initial_ : Tensor (K,)
    transition_ : Tensor (K, K)
    components_ : DiagGaussian
        The state emissions on the relevant features.
    background_ : DiagGaussian
        One Gaussian (``(1, D)``) for the switched-off features.
    label_probs_ : Tensor (K,)
        ``P(Y_t = 1 | Z_t = k)``.
    relevance_ : ndarray or pandas Series (D,)
        ``phi_d = q(S_d = 1)``.

    Examples
    --------
    >>> from ppmix.datasets.pf_hmm import make_pf_hmm_synthetic
    >>> data = make_pf_hmm_synthetic(30, length=20, n_relevant=2, n_features=6, seed=1)
    >>> model = PFHMM(4, switch_prior=0.3, seed=0, progress=False).fit(data.X, data.y)
    >>> (model.relevance_ > 0.5).tolist() == data.relevant.tolist()
    True
    >>> [p.shape for p in model.predict_proba(data.X[:2])]
    [(20, 2), (20, 2)]
    """

    max_plate_nesting = 2
    covariance_type = "diag"
    #: no partly labelled states (HMM's ``known_states``): the labels are ``y``, and the start is the pf start
    known_latents_argument = None

    def __init__(
        self,
        n_components: int = 2,
        *,
        switch_prior: float = 0.5,
        init_params: str = "relevance",
        n_init: int = 1,
        max_iter: int = 200,
        tol: float = 1e-7,
        reg_covar: float = 1e-6,
        warm_start: bool = False,
        sequence_column: str | None = None,
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
        MixtureModel._validate_hyperparameters(self)
        pf.validate_pf_params(self)
        check_missing_option(self.missing, self._component_family())

    def fit(self, X: Any, y: Any = None, *, sample_weight: Any = None, engine: str = "em", **options: Any) -> "PFHMM":
        """Fit by variational EM on sequences ``X`` and per-step labels ``y``.

        ``y`` is a list of per-step 0/1 arrays (NaN for a missing label), a padded
        ``(B, T)`` array when ``X`` is ``(padded, lengths)``, or the name of the label
        column of a DataFrame ``X``; ``y=None`` fits without labels. ``sample_weight``: one
        non-negative weight per sequence (an integer weight is the sequence repeated, zero drops it),
        which weighs every step of the sequence in the data scale, the start (the background, the
        relevance test, k-means), the ELBO and every M-step.
        """
        if engine != "em":
            raise ValueError(f"{type(self).__name__} is fitted by engine='em' only; got engine={engine!r}")
        self.label_column_ = y if isinstance(y, str) else None
        with self._overriding("_fit_sample_weight", sample_weight):
            return super().fit(X, y, sample_weight=sample_weight, engine=engine, **options)

    # ------------------------------------------------------------------- data
    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> SequenceBatch:
        """Sequences as a padded :class:`SequenceBatch` with per-step labels ``y`` (NaN for missing)."""
        label_column = getattr(self, "label_column_", None)
        drop_labels = False
        if not fitting and y is None and label_column is not None and hasattr(X, "columns"):
            drop_labels = label_column in X.columns  # the label column is not a feature; predictions ignore it
            y = label_column if drop_labels else None
        batch = self._prepare_sequences(X, y, fitting=fitting)
        if drop_labels:
            batch.y = None
        elif batch.y is not None and not (~torch.isnan(batch.y[batch.mask])).any():
            raise ValueError("y has no observed label; pass y=None to fit without labels")
        if fitting:
            pf.check_pf_features(self, batch.frames)
            encode_labels(self, None, fitting=True)  # classes_ = [0, 1]: per-step labels are numeric
            if self._fit_sample_weight is not None:
                weight = self._weigh(batch, self._fit_sample_weight).weight
                self._record_weighted_data_scale(batch.frames, _sequence_weights(batch, weight)[batch.mask])
            else:  # with missing entries: the scale of each feature's observed entries (HMM measured them filled)
                self._record_data_scale(batch.frames)
        return batch

    def _frames_data(self, batch: SequenceBatch, use_labels: bool, shift: torch.Tensor | None = None) -> Batch:
        """The batch of the sequences with their valid frames (:func:`~ppmix.models.pf._observed.frames_of`) and
        their labels (``use_labels``; else every label missing)."""
        frames = frames_of(batch.frames, shift)
        if use_labels and batch.y is not None:
            y = batch.y[batch.mask]
            observed = ~torch.isnan(y)
            labels = FrameLabels(torch.where(observed, y, torch.zeros_like(y)), observed)
        else:
            labels = FrameLabels.missing(frames.x.shape[0], frames.x.dtype, frames.x.device)
        return Batch(batch, rows=frames, sequences=batch, labels=labels)

    def _em_data(self, data: Any) -> Batch:
        """The batch of the valid frames and their labels (and the sequences' weights)."""
        batch = as_batch(data)
        return self._frames_data(batch.data, use_labels=True).prepared(weight=batch.weight)

    # ------------------------------------------------- the pf parts' hooks
    posterior_remedy = pf.POSTERIOR_REMEDY
    online_em_unavailable = pf.ONLINE_EM_UNAVAILABLE
    #: within the restarts of one fit: the data scale of their training frames (:func:`pf.record_data_scale`)
    _restart_data_scale: dict[str, Any] | None = None
    #: the ``sample_weight`` of the fit under way (None otherwise): the data scale ``prepare_data`` records is weighted
    _fit_sample_weight: Any = None

    def __sklearn_tags__(self) -> Any:
        return BINARY.tags(super().__sklearn_tags__())

    def _component_family(self) -> DensityFamily:
        return pf.pf_component_family(self.reg_covar)

    def _record_data_scale(self, x: torch.Tensor, name: str = "X") -> None:
        pf.record_data_scale(self, x, name, super()._record_data_scale)

    def _record_weighted_data_scale(self, frames: torch.Tensor, weight: torch.Tensor) -> None:
        pf.record_weighted_data_scale(self, frames, weight)

    def _em_data_statistics(self, data: Any) -> Statistics:
        """Before a sharded or warm-started fit: the background's statistics of ``data.rows`` (every step counted
        as often as its sequence's sample weight, where there are some)."""
        return pf.background_data_statistics(self, data.rows, data.frame_weight)

    def _em_set_data_statistics(self, stats: Statistics) -> None:
        pf.set_background(self, stats)

    def _laplace_target(self, data: Any) -> LaplaceTarget:
        return pf.pf_laplace_target(self, data, lambda rows: self._e_step(rows)[1])

    @property
    def relevance_(self) -> Any:
        """``phi_d = q(S_d = 1)`` per feature (a Series indexed by feature names for DataFrame input)."""
        return pf.switch_relevance(self)

    @property
    def label_probs_(self) -> torch.Tensor:
        """``P(y = 1 | state k)``, ``(K,)``."""
        self._check_fitted()
        return self.labels_.probs

    def _prediction_data(self, batch: SequenceBatch) -> Batch:
        return self._frames_data(batch, use_labels=True, shift=self.components_.reference)

    # ------------------------------------------------------------ the program
    def model(self, batch: SequenceBatch) -> None:
        """The chain ``z_t`` per sequence; per step the label ``y_t`` and, per feature, ``s_t`` and ``x_t``."""
        if self._accepts_missing and bool(torch.isnan(batch.x).any()):
            raise ValueError("X has missing entries (NaN): missing='marginalize' is for EM (fit) only")
        k, d = self.n_components, batch.n_features
        opts = {"dtype": batch.x.dtype, "device": batch.x.device}
        chain, components = self._sample_chain(k, opts)
        sites = pf.pf_global_sites(self, k, d, opts, components)
        prior = None if pf.all_relevant(self) else pf.switch_p(self)
        features = pyro.plate("features", d, dim=-1)
        with self._data_plate(batch.n_sequences, dim=-2) as idx:
            valid = batch.mask[idx][..., None]  # (B, T, 1)
            states, z = [], None
            # the chain and the labels first (no pyro.markov: the features below use every z_t, so under
            # enumeration in the model each z_t keeps its own dimension, as in the guide) ...
            for t in range(batch.max_length):
                z = pyro.sample(f"z_{t}", dist.Categorical(chain.step(z, valid[:, t])))
                if t == 0:
                    self._check_enumeration_dims(z, batch.max_length)
                labels = _step_labels(batch, idx, t)
                if labels is not None and labels.any:
                    with poutine.mask(mask=valid[:, t] & labels.observed[:, None]):
                        pyro.sample(f"y_{t}", dist.Bernoulli(sites["label_probs"][z]), obs=labels.y[:, None])
                states.append(z)
            for t, z in enumerate(states):  # ... then the switches and features: no site outside the features
                with poutine.mask(mask=valid[:, t]):  # plate follows an enumerated switch (Pyro's dependency check)
                    switch_frame_sites(sites, z, batch.x[idx, t], None, prior, f"_{t}", features)

    def _check_enumeration_dims(self, first_state: torch.Tensor, steps: int) -> None:
        """Refuse, naming the limit, an enumerated chain that would need more than torch's 64 dimensions."""
        per_step = 1 if pf.all_relevant(self) else 2  # a state, and the switches unless all features are relevant
        needed = first_state.dim() + per_step * steps - 1
        if first_state.dim() > self.max_plate_nesting and needed > _TORCH_MAX_DIMS:
            raise NotImplementedError(
                f"enumerating {type(self).__name__}'s program gives every step's state"
                + ("" if pf.all_relevant(self) else " and every step's switches")
                + f" a tensor dimension of its own, {needed} in all here; torch allows {_TORCH_MAX_DIMS}, so "
                f"sequences of at most {(_TORCH_MAX_DIMS - self.max_plate_nesting) // per_step} steps. For longer "
                "ones use m.decode(X) (Viterbi paths) and m.predict_state_proba(X) (smoothed state marginals)"
            )

    def guide(self, batch: SequenceBatch) -> None:
        """Point masses on the globals; ``q(z_1) q(z_t | z_{t-1})`` and ``q(s_td) = Bern(phi_d)``, enumerated.

        The chain conditionals come from a backward pass under the ``phi``-weighted
        emissions with the observed labels, so ``q(z_{1:T})`` is the E-step's posterior.
        Every ``z_t`` gets its own enumeration dimension (Pyro's ``TraceEnum_ELBO`` cannot
        recycle guide-side dimensions), so this guide is for short sequences only.
        """
        values = self._get_globals()
        pyro.sample("initial", dist.Delta(values["initial"], event_dim=1))
        components = pyro.plate("components", self.n_components)
        with components:
            pyro.sample("transition", dist.Delta(values["transition"], event_dim=1))
        pf.pf_guide_global_sites(values, components)
        log_emit = self._log_emissions(self._em_data(batch))
        log_first, log_cond = _chain_conditionals(self.initial_.log(), self.transition_.log(), log_emit, batch.mask)
        phi = values.get("switch_probs")
        features = pyro.plate("features", batch.n_features, dim=-1)
        with self._data_plate(batch.n_sequences, dim=-2) as idx:
            rows = torch.arange(idx.shape[0], device=idx.device)[:, None]
            z = None
            for t in range(batch.max_length):  # the chain first, then the switches (as in the model)
                if z is None:
                    probs = log_first[idx, None].exp()
                else:
                    probs = Vindex(log_cond[idx, t - 1].exp())[rows, z]
                z = pyro.sample(f"z_{t}", dist.Categorical(probs), infer={"enumerate": "parallel"})
                if t == 0:
                    self._check_enumeration_dims(z, batch.max_length)
            if phi is not None and not pf.all_relevant(self):
                for t in range(batch.max_length):
                    with poutine.mask(mask=(t < batch.lengths[idx])[:, None]):
                        switch_guide(phi, f"_{t}", features)

    # -------------------------------------------------------------- globals
    def _get_globals(self) -> dict[str, torch.Tensor]:
        return {**super()._get_globals(), **pf.pf_globals(self)}

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        super()._set_globals(values)
        pf.set_pf_globals(self, values)

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        return self._get_globals()

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self._set_globals(tensors)

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        k = self.n_components
        return {
            "initial": (k,),
            "transition": (k, k),
            **self._component_state_shapes(sites=True),
            **pf.pf_state_shapes(self),
        }

    def _extra_state(self) -> dict[str, Any]:
        return {"label_column": self.label_column_}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.label_column_ = state.get("label_column")

    def _arviz_dims(self) -> dict[str, list[str]]:
        return {**super()._arviz_dims(), **pf.PF_DIMS}

    # ------------------------------------------------------------------- EM
    def _log_emissions(self, data: Batch) -> torch.Tensor:
        """``sum_d phi_d log N(x_td | k) + log p(y_t | k)`` (label where observed), ``(B, T, K)``; zero at padding."""
        batch = data.sequences
        log_emit = batch.x.new_zeros(batch.n_sequences, batch.max_length, self.n_components)
        log_emit[batch.mask] = pf.frame_log_joint(self, data.rows, data.labels, log_emit.new_zeros(self.n_components))
        return log_emit

    def _em_initialize(self, data: Batch, generator: torch.Generator) -> None:
        """Background fitted once; frame responsibilities from (relevance-)k-means; then one M-step (every frame
        weighted by its sequence's sample weight, where given)."""
        centred = _centred_per_step(data.sequences, data.weight)
        self._initialize_from_frames(
            data, pf.pf_start(self, data.rows, data.labels, generator, centred, weight=data.frame_weight)
        )

    def _e_step(self, data: Batch) -> tuple[_Counts, torch.Tensor]:
        """Forward–backward under the ``phi``-weighted emissions; the ELBO of Supplement B.1 (every sequence
        counted as often as its sample weight)."""
        counts, log_norm = super()._e_step(data)
        return counts, log_norm + pf.frame_objective_terms(self, data.rows, data.frame_weight)

    def _em_statistics(self, data: Batch, stats: _Counts) -> dict[str, Any]:
        """Expected initial and transition counts, and the frames' component and label statistics (the counts
        carry the sequence weights already)."""
        frames = pf.frame_statistics_of(self, data.rows, data.labels, stats.posterior[data.mask])
        return {"initial": stats.initial, "transitions": stats.transitions, "frames": frames}

    def _em_update(self, stats: dict[str, Any]) -> None:
        """The chain from expected counts; components, labels, then ``phi`` (B.2.1–B.2.2)."""
        self._update_chain(stats["initial"], stats["transitions"])
        pf.update_from_frame_statistics(self, stats["frames"])
        self._invalidate_guide()

    def _em_global_objective(self, n_observations: int) -> torch.Tensor:
        """The ELBO's terms that are not sums over the data: the switches' prior and entropy, and MAP-EM's log
        prior (:meth:`_log_prior`)."""
        return pf.switches(self).objective(n_observations) + self._log_prior()

    def _log_prior(self) -> torch.Tensor:
        """:class:`~ppmix.models.hmm.HMM`'s (the transitions' and, with ``priors``, the initial distribution's and
        the components'), and with ``priors`` the background's."""
        log_prior = super()._log_prior()
        return log_prior if self.priors is None else log_prior + pf.background_log_prior(self)

    # ---------------------------------------------------------- predictions
    def _label_free_posterior(self, X: Any) -> tuple[SequenceBatch, torch.Tensor]:
        batch = self.prepare_data(X)
        prepared = self._frames_data(batch, use_labels=False, shift=self.components_.reference)
        return batch, self._forward_backward(prepared).posterior

    def predict_state_proba(self, X: Any) -> list[Any]:
        """Smoothed state marginals ``q(z_t = k | x_{1:T})`` (labels not used), one ``(length, K)`` array each."""
        self._check_fitted()
        batch, posterior = self._label_free_posterior(X)
        return [to_output(p, self._output_like(X)) for p in batch.unpad(posterior)]

    def _label_probability(self, X: Any) -> tuple[SequenceBatch, torch.Tensor]:
        self._check_fitted()
        batch, posterior = self._label_free_posterior(X)
        return batch, posterior @ self.labels_.probs

    def predict_proba(self, X: Any) -> list[Any]:
        """``[P(y_t = 0 | x), P(y_t = 1 | x)]`` per step, one ``(length, 2)`` array per sequence."""
        batch, p1 = self._label_probability(X)
        proba = torch.stack([1 - p1, p1], dim=-1)
        return [to_output(p, self._output_like(X)) for p in batch.unpad(proba)]

    def predict(self, X: Any) -> list[Any]:
        """The more probable label of every step, one ``(length,)`` array per sequence."""
        batch, p1 = self._label_probability(X)
        return [to_output(p, self._output_like(X)) for p in batch.unpad((p1 > 0.5).long())]

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy of :meth:`predict` over every labelled step (scikit-learn's classifier ``score``).

        ``y`` is given as in :meth:`fit`; steps whose label is missing are left out, and
        ``sample_weight`` (one weight per sequence) weighs every step of a sequence.
        """
        from sklearn.metrics import accuracy_score

        predicted = torch.cat([torch.as_tensor(p).reshape(-1) for p in self.predict(X)]).cpu().numpy()
        batch = self.prepare_data(X, y)
        if batch.y is None:
            raise ValueError("y is required: score is the accuracy of the predicted labels")
        labels = batch.y[batch.mask].cpu().numpy()
        weights = None
        if sample_weight is not None:
            weight = self._weigh(batch, sample_weight, fitting=False).weight
            weights = _sequence_weights(batch, weight)[batch.mask].cpu().numpy()
        observed = ~np.isnan(labels)
        return float(
            accuracy_score(
                labels[observed], predicted[observed], sample_weight=None if weights is None else weights[observed]
            )
        )

    def _pointwise_log_likelihood(self, data: SequenceBatch, switches: str = "map") -> torch.Tensor:
        """``log p(x_{1:T_b})`` of every sequence (labels not used), ``(B,)``.

        Each step's emission is ``prod_d [s_d N(x_td | k) + (1 - s_d) N(x_td | background)]``
        with ``s = 1[phi > 0.5]`` (``switches="map"``) or ``s = phi`` (``"mean"``).
        """
        emit = data.x.new_zeros(data.n_sequences, data.max_length, self.n_components)
        features = torch.ones(data.n_features, dtype=torch.bool, device=data.x.device)
        emit[data.mask] = pf.switches(self).mixture_log_prob(self.components_, data.frames, features, switches)
        return forward_backward(self.initial_.log(), self.transition_.log(), emit, data.lengths).log_likelihood

    @property
    def n_parameters(self) -> int:
        """Free parameters: the HMM's, the label probabilities, the background and ``phi`` (when ``p < 1``)."""
        d = self.n_features_in_
        return super().n_parameters + self.n_components + 2 * d + (0 if pf.all_relevant(self) else d)

    def sample(self, n_samples: int = 1, length: int = 50) -> dict[str, Any]:
        """Draw sequences ``{"x": (n, T, D), "y": (n, T), "z": (n, T), "s": (n, T, D)}`` (switches ``~ Bern(phi)``)."""
        draws = super().sample(n_samples, length)
        z = torch.as_tensor(draws["z"])
        gen = self._generator(offset=104729)
        cpu = {"dtype": self.dtype}
        y = (torch.rand(z.shape, generator=gen, **cpu) < self.labels_.probs.cpu()[z]).long()
        s = torch.rand(*z.shape, self.n_features_in_, generator=gen, **cpu) < self.switch_probs_.cpu()
        background = self.background_.sample(torch.zeros_like(z), generator=gen).cpu()
        x = torch.where(s, torch.as_tensor(draws["x"]), background)
        return {"x": x.numpy(), "y": y.numpy(), "z": draws["z"], "s": s.numpy()}

    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the fit."""
        self._check_fitted()
        return pf.pf_summary(
            self,
            elbo_per_step=self.lower_bound_,
            initial=self.initial_.cpu().tolist(),
            transition=self.transition_.cpu().tolist(),
        )


class SupervisedHMM(PFHMM):
    """Supervised HMM (sup-HMM): the chain emits features and the per-step label, i.e. :class:`PFHMM` with ``p = 1``.

    Every feature is relevant (``phi = 1``); the code path is PFHMM's. The other keyword
    arguments are :class:`PFHMM`'s; the default start is k-means.

    Parameters
    ----------
    n_components : int, default 2
        ``K``, the number of hidden states.
    init_params : {"kmeans", "relevance", "k-means++", "random"}, default "kmeans"
        The start of EM, as for :class:`PFHMM`.
    n_init, max_iter, tol, reg_covar, warm_start, sequence_column, missing, priors : as for :class:`PFHMM`.
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Examples
    --------
    >>> from ppmix.datasets.pf_hmm import make_pf_hmm_synthetic
    >>> data = make_pf_hmm_synthetic(20, length=15, n_relevant=2, n_features=4, seed=0)
    >>> SupervisedHMM(4, seed=0, progress=False).fit(data.X, data.y).relevance_.tolist()
    [1.0, 1.0, 1.0, 1.0]
    """

    fixed_params = ("switch_prior",)

    def __init__(self, n_components: int = 2, *, init_params: str = "kmeans", **kwargs: Any) -> None:
        super().__init__(n_components, switch_prior=1.0, init_params=init_params, **kwargs)


def _step_labels(batch: SequenceBatch, idx: torch.Tensor, t: int) -> FrameLabels | None:
    """The labels of step ``t`` of the sequences ``idx`` (None when the batch has none)."""
    if batch.y is None:
        return None
    y = batch.y[idx, t]
    observed = ~torch.isnan(y)
    return FrameLabels(torch.where(observed, y, torch.zeros_like(y)), observed)


def _chain_conditionals(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain posterior as ``log q(z_1)`` ``(B, K)`` and ``log q(z_t = j | z_{t-1} = i)`` ``(B, T-1, K, K)``.

    A backward pass ``log beta_{t-1}(i) = logsumexp_j [log A_ij + e_t(j) + log beta_t(j)]``;
    padded steps (``mask`` False) keep the state with probability one.
    """
    batch, steps, k = log_emit.shape
    log_eye = torch.eye(k, dtype=log_emit.dtype, device=log_emit.device).log()
    log_beta = log_emit.new_zeros(batch, k)
    conditionals = []
    for t in range(steps - 1, 0, -1):
        joint = torch.where(
            mask[:, t, None, None],
            log_trans + log_emit[:, t, None, :] + log_beta[:, None, :],
            log_eye + log_beta[:, None, :],
        )
        log_beta = torch.logsumexp(joint, dim=-1)
        conditionals.append(joint - log_beta[..., None])
    first = log_init + log_emit[:, 0] + log_beta
    log_cond = torch.stack(conditionals[::-1], dim=1) if conditionals else log_emit.new_zeros(batch, 0, k, k)
    return first - torch.logsumexp(first, dim=-1, keepdim=True), log_cond


def _centred_per_step(batch: SequenceBatch, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The valid frames minus the mean of their time step across sequences (each counted as often as its sample
    ``weight``, where given; of the observed entries, NaN staying NaN), ``(sum(lengths), D)``.

    The label test of the relevance start sees these: chains that start away from their
    stationary distribution make every feature drift with ``t``, and so does the label,
    so on raw frames an irrelevant chain would look associated with the label through time.
    """
    step_weight = batch.mask.to(batch.x.dtype)  # (B, T)
    if weight is not None:
        step_weight = step_weight * _sequence_weights(batch, weight)
    observed = ~torch.isnan(batch.x)
    entry_weight = step_weight[..., None] * observed  # (B, T, D)
    totals = entry_weight.sum(0)  # (T, D): zero where only sequences of weight zero reach step t
    step_sums = (torch.where(observed, batch.x, 0.0) * entry_weight).sum(0)
    step_mean = step_sums / totals.clamp_min(torch.finfo(totals.dtype).tiny)
    return (batch.x - step_mean)[batch.mask]
