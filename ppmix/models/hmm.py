"""``HMM``: hidden Markov model with emissions of any density family (Gaussian by default), batched over
variable-length sequences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions import constraints
from sklearn.utils import metadata_routing

from ppmix._validation import check_n_components, check_positive_int, to_output
from ppmix.algorithms.forward_backward import (
    ForwardBackwardResult,
    forward_backward,
    log_likelihood,
)
from ppmix.components.family import DensityFamily, PriorKey, SiteSpec
from ppmix.components.family_tools import data_rows, start_points
from ppmix.components.registry import family_config, family_from
from ppmix.models import _variational as vb
from ppmix.models._arviz import POINTWISE_COMPANIONS, own_hook
from ppmix.models._family_components import INIT_METHODS, FamilyModel, drop_leading_ones
from ppmix.models._gibbs import HMMGibbs
from ppmix.models._hmm_draws import (
    DRAW_BLOCK_CELLS,
    chain_per_draw,
    forward_backward_per_draw,
    state_paths_per_draw,
)
from ppmix.models._input_chain import TRANSITION_KINDS, InputDrivenChain, SequencesWithInputs, pad_inputs
from ppmix.models._missing import (
    check_missing_option,
    fill_missing,
    fit_statistics,
    log_prob_observed,
    partly_observed_rows,
    partly_observed_statistics,
)
from ppmix.models._online import partial_fit
from ppmix.models._params import store_params
from ppmix.models._regression_emissions import (
    INPUT_ENGINES,
    emission_penalty,
    inputs_needed_by,
    reads_inputs,
    sample_along_inputs,
)
from ppmix.models._sequence_inference import decode_states, filter_states, sample_state_paths
from ppmix.models._sequences import SequenceBatch, as_sequence_batch
from ppmix.models._transitions import MarkovChain, check_transition_prior, transition_mask
from ppmix.models.batch import Batch, as_batch
from ppmix.models.known_latents import Clamp

__all__ = ["HMM"]


@dataclass
class _Counts:
    """Expected sufficient statistics of one E-step (summed over sequences where possible)."""

    initial: torch.Tensor  # (K,) expected initial-state counts
    transitions: torch.Tensor  # (K, K) expected transition counts
    posterior: torch.Tensor  # (B, T, K) smoothed marginals, zero at padded steps


@dataclass
class _Chain:
    """The state chain's probabilities inside a model: initial, transition, and identity for padded steps."""

    initial: torch.Tensor
    transition: torch.Tensor
    eye: torch.Tensor

    def step(self, z: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
        """``P(z_t | z_{t-1})`` (``initial`` at ``t = 0``); padded steps keep their state, so they sum out to one."""
        if z is None:
            return self.initial
        return torch.where(valid.reshape(*valid.shape, 1), self.transition[z], self.eye[z])


class HMM(FamilyModel):
    """Hidden Markov model: ``z_1 ~ Cat(initial)``, ``z_t | z_{t-1} ~ Cat(transition[z_{t-1}])``,
    ``x_t | z_t = k ~ emission(theta_k)`` (by default Gaussian, ``N(mu_k, Sigma_k)``).

    Sequences may have different lengths; they are processed together, padded, with
    a mask (see :func:`ppmix.models._sequences.as_sequence_batch` for the accepted
    layouts: a list of ``(length, D)`` arrays, a ``(padded, lengths)`` pair, or a
    DataFrame with a ``sequence_column``). The EM engine (Baum–Welch) uses the batched
    log-space forward–backward of :mod:`ppmix.algorithms.forward_backward`; the Pyro
    program (a ``pyro.markov`` chain with the states enumerated) gives SVI and MCMC,
    and its ``TraceEnum_ELBO`` equals the EM log-likelihood; an emission family with a conjugate
    prior (Poisson, Bernoulli, ...) is also sampled by ``engine="gibbs"`` (state paths by forward
    filtering, backward sampling: :mod:`ppmix.models._gibbs`). Padded steps keep the
    state (identity transition) and emit nothing, so they contribute exactly zero.

    Parameters
    ----------
    n_components : int, default 2
        Number of hidden states.
    emission : str or DensityFamily, default "gaussian"
        The emissions' family: a registered name (:data:`ppmix.components.registry.FAMILIES`, e.g.
        ``"gaussian"``, ``"poisson"``; ``"autoregressive"``: each frame regressed on the frames before it,
        :class:`~ppmix.components.AutoRegressiveFamily`; ``"linear_regression"``, ``"logistic_regression"``,
        ``"poisson_regression"``: the response ``x_t`` regressed on the step's inputs ``u_t``, given as ``inputs=``,
        by the experts of :class:`~ppmix.models.MixtureOfExperts`,
        :mod:`ppmix.components.regression_emission`) or a family object. Write a new emission as a family
        (see ``docs/guide/writing-a-family.md``), not as a subclass of ``HMM``.
    covariance_type, reg_covar :
        The Gaussian emission's settings (for ``emission="gaussian"``), as for :class:`~ppmix.models.gmm.GMM`.
    transition_pattern : {None, "ergodic", "left-right", "upper"} or array (K, K), default None
        The transitions the chain allows (:func:`~ppmix.models._transitions.transition_mask`): every one
        (None, ``"ergodic"``), stay or move to the next state (``"left-right"``), stay or jump forward
        (``"upper"``), or the non-zero entries of a ``(K, K)`` array (e.g. a starting transition matrix).
        Disallowed transitions are zero from the start and stay zero through EM, SVI and MCMC.
    transition_prior : float, default 1.0
        Concentration ``alpha >= 1`` of a symmetric Dirichlet prior on every row's allowed transitions:
        EM is MAP-EM (``alpha - 1`` added to the expected counts, the log prior added to ``history_``)
        and MCMC samples under it; 1 is maximum likelihood.
    transitions : {"homogeneous", "stationary", "input-driven"}, default "homogeneous"
        One transition matrix for every step (``"stationary"`` the same, dynamax's name), or (``"input-driven"``)
        a softmax gate on each step's inputs ``u_t`` for every state the chain leaves, ``p(z_t = j | z_{t-1} = i,
        u_t) = softmax_j(u_t^T transition_coef_[i, j] + transition_intercept_[i, j])``
        (:mod:`ppmix.models._input_chain`): the inputs are passed as ``inputs=`` (one ``(T_i, P)`` array per sequence)
        to ``fit``, ``score``, ``score_samples``, ``predict``, ``predict_proba``, ``decode``, ``filter``,
        ``sample_paths`` and ``sample``. Baum-Welch's M-step of the
        chain is then one softmax regression per source state (damped Newton). EM only (``fit``), with every
        transition allowed and no transition prior.
    init_params : {"kmeans", "k-means++", "random", "segments"}, default "kmeans"
        As for :class:`~ppmix.models.gmm.GMM` (k-means on all frames initialises the emissions; initial and
        transition probabilities come from the initial labels), or ``"segments"``: every sequence cut into
        K consecutive stretches of equal length, stretch ``k`` in state ``k`` (the usual start of a
        left-right chain, whose states follow each other in time).
    n_init, max_iter, tol, warm_start :
        As for :class:`~ppmix.models.gmm.GMM`.
    sequence_column : str, optional
        Column of a DataFrame ``X`` holding the sequence id.
    missing : {"error", "marginalize"}, default "error"
        NaN in a frame: an error naming ``X``, or (Gaussian emissions, and the emission families of independent
        features) an entry missing at random: a frame emits by the marginal density of its observed entries and
        Baum-Welch's M-step is exact EM, as :class:`~ppmix.models.mixture.Mixture`'s. EM only.
    priors : dict, optional
        The priors' hyperparameters, by key (each optional; None: every default): ``"initial"`` the Dirichlet
        concentration of the initial distribution (default 1), ``"transition"`` that of every transition row's
        allowed entries (a number or ``(K, K)``; default ``transition_prior``, which it replaces), and the
        emission family's, as for :class:`~ppmix.models.mixture.Mixture`. MCMC, Gibbs and ``to_arviz``'s
        ``prior`` group use them; given, ``engine="em"`` is MAP-EM (Dirichlet modes of the initial and transition
        counts, the family's MAP update of the emissions, the log prior in ``history_``).
    weight_concentration_prior : float, optional
        ``engine="vb"`` only (variational-Bayes EM, :mod:`ppmix.models._variational`): the Dirichlet
        concentration of the initial distribution and of every transition row (default ``1 / n_components``, as
        hmmlearn's variational HMMs; unused states lose their weight). After it, ``n_effective_components_`` counts
        the states that explain more than 1 % of the training steps (``state_occupancy_``).
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Notes
    -----
    **Partly labelled fits.** ``fit(X, known_states=s)`` takes one integer array per sequence (in the order of
    ``X``'s sequences, as long as it), the state of a step or -1 where unknown: Baum-Welch's E-step and the
    enumeration of SVI and MCMC clamp them (the forward-backward runs over the paths consistent with them), and
    the fit maximises ``log p(X, known states)`` (in ``history_``); every state known gives the counted initial
    states and transitions and the emissions' per-state fit, none the unsupervised fit
    (:mod:`ppmix.models.known_latents`). ``y`` stays ignored.

    Attributes
    ----------
    initial_ : Tensor (K,)
    transition_ : Tensor (K, K)
        Row ``i`` is ``P(z_t = . | z_{t-1} = i)`` (input-driven: at inputs zero).
    transition_coef_, transition_intercept_ : Tensor (K, K, P), Tensor (K, K)
        Input-driven only: the gates' slopes and intercepts, ``[i, j]`` those of the move ``i -> j`` (the last
        state's zero).
    components_ : ComponentFamily
        The fitted emissions (``DiagGaussian`` or ``FullGaussian`` for the Gaussian).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> seqs = [np.repeat(rng.integers(0, 2, size=(8, 1)) * 6.0, 5, axis=0) + rng.normal(size=(40, 1))
    ...         for _ in range(20)]
    >>> hmm = HMM(2, seed=0, progress=False).fit(seqs)
    >>> float(hmm.transition_.diagonal().min()) > 0.7
    True
    >>> [p.shape for p in hmm.predict(seqs[:2])]
    [(40,), (40,)]

    Partly labelled: the states of the first five steps of every sequence known, the high state named 0:

    >>> paths = [np.repeat(rng.integers(0, 2, size=8), 5) for _ in range(10)]
    >>> seqs = [6.0 * p[:, None] + rng.normal(size=(40, 1)) for p in paths]
    >>> known = [np.where(np.arange(40) < 5, 1 - p, -1) for p in paths]
    >>> hmm = HMM(2, seed=0, progress=False).fit(seqs, known_states=known)
    >>> np.round(hmm.components_.mean.numpy().ravel()) + 0.0
    array([6., 0.])
    >>> all((path == 1 - truth).all() for path, truth in zip(hmm.predict(seqs), paths))
    True
    """

    known_latents_argument = "known_states"

    data_plate_name = "sequences"
    init_methods = (*INIT_METHODS, "segments")
    #: defaults for subclasses whose constructors do not take them (the pf-HMMs: every transition, ML)
    transition_pattern: Any = None
    transition_prior: float = 1.0
    transitions: str = "homogeneous"
    missing: str = "error"
    #: the inputs= of prediction methods are data, not metadata to route (no set_predict_request)
    __metadata_request__predict = {"inputs": metadata_routing.UNUSED}
    __metadata_request__predict_proba = {"inputs": metadata_routing.UNUSED}

    def __init__(
        self,
        n_components: int = 2,
        *,
        emission: str | DensityFamily | dict = "gaussian",
        covariance_type: str = "diag",
        transition_pattern: Any = None,
        transition_prior: float = 1.0,
        transitions: str = "homogeneous",
        n_init: int = 1,
        max_iter: int = 100,
        tol: float = 1e-6,
        reg_covar: float = 1e-6,
        init_params: str = "kmeans",
        warm_start: bool = False,
        sequence_column: str | None = None,
        missing: str = "error",
        priors: dict[str, Any] | None = None,
        weight_concentration_prior: float | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__()
        store_params(self, locals())

    def _component_family(self) -> DensityFamily:
        family = family_from(self.emission, "emission", covariance_type=self.covariance_type, reg_covar=self.reg_covar)
        return family.measured(self._scale)

    def _saved_params(self) -> dict[str, Any]:
        params = super()._saved_params()
        if "emission" in params:
            params["emission"] = family_config(params["emission"])
        pattern = params.get("transition_pattern")
        if pattern is not None and not isinstance(pattern, str):  # an array: saved as nested lists of 0/1
            params["transition_pattern"] = self._transition_mask.int().tolist()
        return params

    def _validate_hyperparameters(self) -> None:
        super()._validate_hyperparameters()
        self._validate_family_params()
        transition_mask(self.transition_pattern, int(self.n_components))
        check_transition_prior(self.transition_prior)
        if (self.priors or {}).get("transition") is not None and self.transition_prior != 1:
            raise ValueError(
                "priors['transition'] and transition_prior both set the transitions' concentration: set one"
            )
        check_missing_option(self.missing, self._component_family())
        self._validate_transitions()

    def _validate_transitions(self) -> None:
        """``transitions`` one of :data:`TRANSITION_KINDS`; an input-driven chain allows every move, under no prior."""
        if self.transitions not in TRANSITION_KINDS:
            raise ValueError(f"transitions must be one of {TRANSITION_KINDS}; got {self.transitions!r}")
        if self._input_driven and (
            self.transition_pattern is not None
            or self.transition_prior != 1
            or (self.priors or {}).get("transition") is not None
        ):
            raise ValueError(
                "transitions='input-driven' takes no transition_pattern, transition_prior or priors['transition']: "
                "its gates allow every move, fitted by maximum likelihood"
            )

    @property
    def _input_driven(self) -> bool:
        return self.transitions == "input-driven"

    @property
    def online_em_unavailable(self) -> str | None:
        """Why this HMM has no ``partial_fit`` (None where it has one)."""
        if self._input_driven:
            return "an input-driven chain's M-step is a softmax regression on every step's inputs"
        if self._inputs_needed is not None:
            return "regression emissions take every step's inputs, which partial_fit does not"
        return None

    @property
    def _inputs_needed(self) -> str | None:
        """What of this HMM needs ``inputs=`` (its input-driven chain, its regression emissions), in words; None:
        nothing (:func:`~ppmix.models._regression_emissions.inputs_needed_by`)."""
        return inputs_needed_by(self._input_driven, self._component_family())

    def _input_chain(self) -> InputDrivenChain:
        """The fitted input-driven transitions as a part (from ``transition_coef_`` and ``transition_intercept_``)."""
        return InputDrivenChain(self.transition_coef_, self.transition_intercept_)

    def _log_transitions(self, batch: SequenceBatch) -> torch.Tensor:
        """The log transition matrix ``(K, K)``, or an input-driven chain's of every step ``(B, T, K, K)``."""
        if self._input_driven:
            return self._input_chain().log_transitions(batch.inputs)
        return self.transition_.log()

    @property
    def _accepts_missing(self) -> bool:  # type: ignore[override]
        return self.missing == "marginalize"

    partial_fit = partial_fit

    def _gibbs_sampler(self) -> HMMGibbs:
        """The blocked Gibbs sampler of ``engine="gibbs"`` (:mod:`ppmix.models._gibbs`)."""
        return HMMGibbs(self)

    # ------------------------------------------- variational Bayes (engine="vb": ppmix.models._variational)
    #: the defaults of a subclass whose constructor does not take them (an HMM's prior is a Dirichlet)
    weight_concentration_prior_type: str = "dirichlet_distribution"
    weight_concentration_prior: float | None = None

    @property
    def n_effective_components_(self) -> int:
        """After ``engine="vb"``: the states that explain more than 1 % of the training steps
        (``state_occupancy_``)."""
        self._check_fitted()
        if getattr(self, "state_occupancy_", None) is None:
            raise AttributeError("n_effective_components_ is set by fit(X, engine='vb')")
        return vb.effective_components(self.state_occupancy_)

    def _vb_rows(self, data: SequenceBatch) -> torch.Tensor:
        return self._step_rows(data)[data.mask]

    def _vb_components(self, data: SequenceBatch, component_prior: Any) -> Any:
        return vb.components_factor(self, self._vb_rows(data), component_prior)

    def _vb_latent(self, data: SequenceBatch) -> Any:
        return vb.chain_factor(self, data)

    def _vb_initial_responsibilities(self, data: SequenceBatch, generator: torch.Generator) -> torch.Tensor:
        return vb.start_responsibilities_of(self, self._vb_rows(data), generator)

    def _vb_record(self, latent: Any, components: Any) -> None:
        vb.record_chain(self, latent, components)

    # ------------------------------------------------------------ the chain
    @property
    def _transition_mask(self) -> torch.Tensor:
        """The allowed transitions ``(K, K)`` of ``transition_pattern``."""
        return transition_mask(self.transition_pattern, int(self.n_components), self._device)

    def _transition_concentration(self) -> float | torch.Tensor:
        """``priors["transition"]`` as a ``(K, K)`` tensor, else ``transition_prior``."""
        if (self.priors or {}).get("transition") is None:
            return float(self.transition_prior)
        k = self.n_components
        return self._concentration("transition", (k, k))

    def _markov_chain(self) -> MarkovChain:
        """The hidden chain as a part: the pattern's allowed transitions and the chain's priors (``priors``'
        ``"initial"`` and ``"transition"`` keys, or ``transition_prior``)."""
        initial = None if self.priors is None else self._concentration("initial", (self.n_components,))
        return MarkovChain(self._transition_mask, self._transition_concentration(), initial)

    def _fixed_structure_sites(self) -> dict[str, tuple[str, SiteSpec]]:
        k = int(self.n_components)
        return {
            "initial": ("initial_", SiteSpec(constraints.simplex, (k,), shared=True)),
            "transition": ("transition_", SiteSpec(constraints.simplex, (k,))),
        }

    def _structure_prior_keys(self) -> dict[str, PriorKey]:
        return MarkovChain.prior_keys()

    def _em_global_objective(self, n_observations: int) -> torch.Tensor:
        """The objective's term that is no sum over the sequences (counted once on shards,
        :func:`ppmix.distributed.fit_em`): MAP-EM's log prior."""
        return self._log_prior()

    def _log_prior(self) -> torch.Tensor:
        """MAP-EM's log prior: the chain's (the transitions' Dirichlet log density at ``transition_``, 0 under ML;
        with ``priors``, the initial distribution's) and, with ``priors``, the emissions' (the family's); less the
        ridge penalty of regression emissions (:func:`~ppmix.models._regression_emissions.emission_penalty`)."""
        log_prior = self._markov_chain().log_prior(self.initial_, self.transition_) - emission_penalty(self.components_)
        return log_prior if self.priors is None else log_prior + self._map_log_prior_components()

    def _update_chain(
        self,
        initial: torch.Tensor,
        transitions: torch.Tensor,
        inputs: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> None:
        """``initial_`` and ``transition_`` from expected counts (the chain's M-step, :meth:`MarkovChain.update`).

        An input-driven chain takes either the counts ``(K, K)`` (its start: gates that move by their normalised
        matrix whatever the inputs) or every step's pair marginals ``(B, T, K, K)`` with the ``inputs`` and ``mask``
        of their batch (its M-step: :meth:`InputDrivenChain.update`)."""
        chain = self._markov_chain()
        if transitions.dim() == 4:
            k = transitions.shape[-1]  # the counts only carry the initial distribution through the chain's update
            self.initial_ = chain.update(initial.to(self.dtype), transitions.new_ones(k, k))[0]
            gates = self._input_chain().update(inputs, transitions.to(self.dtype), mask)
        else:
            self.initial_, self.transition_ = chain.update(initial.to(self.dtype), transitions.to(self.dtype))
            if not self._input_driven:
                return
            gates = InputDrivenChain.from_transition(self.transition_, self.n_inputs_)
        self.transition_coef_, self.transition_intercept_ = gates.coef, gates.intercept
        self.transition_ = gates.at_zero_inputs()

    def _init_values(self, data: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The EM start (as for every model with EM), its disallowed transitions lifted off zero: SVI and NUTS
        move the ``transition`` site in unconstrained space, where a zero has no image; the program masks them
        out again, so the chain it runs is the start's."""
        values = super()._init_values(data, generator)
        if "transition" in values and self.transition_pattern is not None:
            transition = values["transition"]
            lifted = torch.where(self._transition_mask, transition, torch.full_like(transition, 1e-6))
            values["transition"] = lifted / lifted.sum(-1, keepdim=True)
        return values

    # ------------------------------------------------------------------- data
    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False, inputs: Any = None) -> SequenceBatch:
        """Sequences as a padded :class:`SequenceBatch` (``X`` may be ``(padded, lengths)``; ``inputs``, an
        input-driven chain's, one ``(T_i, P)`` array per sequence); ``y`` is ignored."""
        return self._prepare_sequences(_with_inputs(X, inputs), None, fitting=fitting)

    def _prepare_sequences(self, X: Any, y: Any, *, fitting: bool) -> SequenceBatch:
        """Validate and pad ``X`` (and per-step labels ``y``, kept in the batch; the inputs of an input-driven
        chain, given with ``X`` as :class:`SequencesWithInputs`); record the features when fitting."""
        X, inputs = (X.sequences, X.inputs) if isinstance(X, SequencesWithInputs) else (X, None)
        lengths = None
        if isinstance(X, tuple) and len(X) == 2:
            X, lengths = X
        batch = as_sequence_batch(
            X,
            y,
            lengths=lengths,
            sequence_column=self.sequence_column,
            dtype=self.dtype,
            device=self._device,
            n_features=None if fitting else self.n_features_in_,
            feature_names=None if fitting else self.feature_names_in_,
            allow_missing=self._accepts_missing,
            code_frame=self._frame_coder(learn=fitting),
        )
        batch.inputs = self._padded_inputs(inputs, batch, fitting=fitting)
        frames = fill_missing(batch.frames, self._component_family()) if self._accepts_missing else batch.frames
        if fitting:
            check_n_components(self.n_components, frames.shape[0])
            self.n_features_in_ = batch.n_features
            self.feature_names_in_ = batch.feature_names
            self._record_data_scale(frames)
            self._record_sequence_scale(batch)
        else:
            self._component_family().check_data(frames, "X")
        return batch

    def _padded_inputs(self, inputs: Any, batch: SequenceBatch, *, fitting: bool) -> torch.Tensor | None:
        """The batch's inputs: required by an input-driven chain and by regression emissions (their width recorded as
        ``n_inputs_`` when fitting), refused by an HMM that reads none (the HSMM borrows this method, not
        ``_inputs_needed``)."""
        needed = inputs_needed_by(self._input_driven, self._component_family())
        if needed is None:
            if inputs is not None:
                raise ValueError(
                    "inputs= is for an input-driven chain or regression emissions: HMM(..., "
                    "transitions='input-driven') or HMM(..., emission='linear_regression')"
                )
            return None
        if inputs is None:
            raise ValueError(f"{needed} needs inputs=: one (length, n_inputs) array per sequence")
        padded = pad_inputs(
            inputs,
            batch.lengths.tolist(),
            dtype=self.dtype,
            device=batch.x.device,
            n_inputs=None if fitting else self.n_inputs_,
        )
        if fitting:
            self.n_inputs_ = int(padded.shape[-1])
        return padded

    def fit(self, X: Any, y: Any = None, *, inputs: Any = None, **options: Any) -> "HMM":
        """Fit the HMM (see :meth:`MixtureModel.fit <ppmix.models.base.MixtureModel.fit>`); ``inputs``: an
        input-driven chain's (EM only) or regression emissions' (EM, SVI, MCMC), one ``(T_i, P)`` array per
        sequence.

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import HMM
        >>> rng = np.random.default_rng(0)
        >>> seqs = [rng.normal(size=(30, 1)) for _ in range(5)]
        >>> hmm = HMM(2, seed=0, progress=False).fit(seqs)
        >>> hmm.transition_.shape
        torch.Size([2, 2])
        """
        engine = options.get("engine", "em")
        if self._input_driven and engine != "em":
            raise ValueError(f"{self._inputs_needed} is fitted by EM only; got engine={engine!r}")
        if self._inputs_needed is not None and engine not in INPUT_ENGINES:
            raise ValueError(
                f"{self._inputs_needed} is fitted by engine='em', 'svi' or 'mcmc' (its experts have no conjugate "
                f"prior); got engine={engine!r}"
            )
        return super().fit(_with_inputs(X, inputs), y, **options)

    def _sample_weight_units(self, data: Any) -> tuple[str, int]:
        return "sequence", as_batch(data).data.n_sequences

    def _weigh(self, data: Any, sample_weight: Any, *, fitting: bool = True) -> Batch:
        """As :meth:`MixtureModel._weigh`; for ``fitting``, the data scale of the frames just prepared (the variance
        floor) becomes that of the frames counted as often as their sequences' weights: for integer weights, the
        sequences repeated."""
        weighted = super()._weigh(data, sample_weight, fitting=fitting)
        if fitting:
            weight = _sequence_weights(data, weighted.weight)[data.mask]
            self._record_weighted_data_scale(data.frames, weight)
            self._record_sequence_scale(data, weight)
        return weighted

    def _record_sequence_scale(self, batch: SequenceBatch, weight: torch.Tensor | None = None) -> None:
        """Complete the data scale just recorded with what a family whose frames depend on those before them
        measures on the step rows (its ``sequence_scale``, e.g. the autoregressive family's variance floor of the
        steps ``x_t - x_{t-1}``), the rows counted ``weight`` times (once when None)."""
        if callable(getattr(self._component_family(), "sequence_scale", None)):
            frames_scale = dict(self._data_scale)
            rows = self._step_rows(batch)[batch.mask]
            self._take_data_scale(lambda family: {**frames_scale, **family.sequence_scale(rows, weight)})

    def _em_data(self, data: Any) -> Batch:
        """The batch of the sequences (and their weights, any known states) with their valid frames prepared once
        for the emission family; with missing entries, as :class:`~ppmix.models._missing.PartlyObserved` frames."""
        batch = as_batch(data)
        batch = batch.prepared(sequences=batch.data, known=self._known_latents, inputs=batch.data.inputs)
        family = self._component_family()
        observed = partly_observed_rows(batch.data.frames, family) if self._accepts_missing else None
        if observed is not None:
            return batch.prepared(observed=observed)
        return batch.prepared(rows=family.prepare(self._step_rows(batch.data)[batch.mask]))

    def _step_rows(self, batch: SequenceBatch) -> torch.Tensor:
        """Every step's row as the emission family scores it, ``(B, T, D')``: the frame, or for a family whose
        frames depend on those before them in their sequence (its ``sequence_rows``, e.g. autoregressive emissions)
        the row it makes of the padded sequences."""
        family = self._component_family()
        if reads_inputs(family):  # regression emissions: [u_t, x_t]
            return family.input_rows(batch.x, batch.inputs)
        sequence_rows = getattr(family, "sequence_rows", None)
        return batch.x if sequence_rows is None else sequence_rows(batch.x)

    def _prediction_data(self, batch: SequenceBatch) -> Batch:
        """:meth:`_em_data` for predictions: frames prepared for the fitted components (the Gaussian's centred at
        their reference, not at the batch mean; frames with missing entries at the components' mean), so each
        sequence's output depends on that sequence and the model only."""
        if self._accepts_missing and bool(torch.isnan(batch.frames).any()):  # scored by the observed entries
            observed = partly_observed_rows(batch.frames, reference=self.components_.moments().mean.mean(0))
            return Batch(batch, observed=observed, sequences=batch)
        rows = self._step_rows(batch)[batch.mask]
        return Batch(batch, rows=self._component_family().prepare(rows, self.components_), sequences=batch)

    def _output_like(self, X: Any) -> Any:
        return _first(X.sequences if isinstance(X, SequencesWithInputs) else X)

    def _n_observations(self, data: Any) -> float:
        batch = as_batch(data)
        return batch.prepared(sequences=batch.data).n_observations

    def _observed_data(self, data: SequenceBatch) -> dict[str, torch.Tensor]:
        return {"x": data.frames}

    # ------------------------------------------------------------ the program
    def model(self, batch: SequenceBatch) -> None:
        """The Markov chain over each sequence with every ``z_t`` enumerated in parallel."""
        if self._accepts_missing and bool(torch.isnan(batch.x).any()):
            raise ValueError("X has missing entries (NaN): missing='marginalize' is for EM (fit, partial_fit) only")
        k, d = self.n_components, batch.n_features
        opts = {"dtype": batch.x.dtype, "device": batch.x.device}
        chain, components = self._sample_chain(k, opts)
        family = self._sample_components(k, d, opts, plate=components)
        with self._data_plate(batch.n_sequences) as idx:
            x, lengths = self._step_rows(batch)[idx], batch.lengths[idx]
            z = None
            for t in pyro.markov(range(batch.max_length)):
                valid = t < lengths
                z = pyro.sample(f"z_{t}", dist.Categorical(chain.step(z, valid)), infer={"enumerate": "parallel"})
                if self._known_latents is not None:
                    self._known_latents.factor(f"z_{t}", z, idx, t)
                with poutine.mask(mask=valid):
                    pyro.sample(f"x_{t}", family.pyro_dist(z), obs=x[:, t])

    def _sample_chain(self, k: int, opts: dict) -> tuple["_Chain", pyro.plate]:
        """Sample ``initial`` and ``transition`` (in the ``components`` plate, also returned)."""
        # values given from outside (Predictive) may carry leading singleton dimensions
        initial = drop_leading_ones(pyro.sample("initial", self._simplex_prior("initial", (), k, opts)), 1)
        components = pyro.plate("components", k)
        with components:
            prior = self._simplex_prior("transition", (k,), k, opts, concentration=float(self.transition_prior))
            transition = pyro.sample("transition", prior)
        transition = drop_leading_ones(transition, 2)
        if self.transition_pattern is not None:  # the disallowed transitions masked out, the rows renormalised
            allowed = transition * self._transition_mask.to(transition.device)
            transition = allowed / allowed.sum(-1, keepdim=True)
        return _Chain(initial, transition, torch.eye(k, **opts)), components

    # -------------------------------------------------------------- globals
    def _get_globals(self) -> dict[str, torch.Tensor]:
        return {"initial": self.initial_.clone(), "transition": self.transition_.clone(), **self._component_globals()}

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        initial = torch.as_tensor(values["initial"]).to(**opts)
        transition = torch.as_tensor(values["transition"]).to(**opts)
        self.initial_ = initial / initial.sum()
        transition = transition * self._transition_mask  # values of an unconstrained site (SVI, MCMC): masked
        self.transition_ = transition / transition.sum(-1, keepdim=True)
        self._set_component_globals(values)
        self._invalidate_guide()

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        gates = (
            {
                "transition_coef": self.transition_coef_.clone(),
                "transition_intercept": self.transition_intercept_.clone(),
            }
            if self._input_driven
            else {}
        )
        return {
            "initial": self.initial_.clone(),
            "transition": self.transition_.clone(),
            **gates,
            **self.components_.state_dict(),
        }

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore a saved state, refusing a chain that is no distribution or that ``transition_pattern`` forbids."""
        opts = {"dtype": self.dtype, "device": self._device}
        self._check_chain_state(tensors["initial"].to(**opts), tensors["transition"].to(**opts))
        self.initial_ = tensors["initial"].to(**opts)
        self.transition_ = tensors["transition"].to(**opts)
        if self._input_driven:
            self.transition_coef_ = tensors["transition_coef"].to(**opts)
            self.transition_intercept_ = tensors["transition_intercept"].to(**opts)
            self.n_inputs_ = int(self.transition_coef_.shape[-1])
        self._load_component_state(tensors)
        if reads_inputs(self._component_family()):
            self.n_inputs_ = int(self.components_.coef.shape[-1])
        self._invalidate_guide()

    def _check_chain_state(self, initial: torch.Tensor, transition: torch.Tensor) -> None:
        """A ``ValueError`` naming the entry where ``initial`` or a row of ``transition`` is no probability vector
        (to rounding), or ``transition`` gives a forbidden move (of ``transition_pattern``) a positive probability."""
        for name, rows in (("initial", initial[None]), ("transition", transition)):
            sums = rows.sum(-1)
            if bool((rows < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), rtol=0.0, atol=1e-6):
                raise ValueError(f"entry {name!r} holds no probabilities (negative, or a row not summing to 1)")
        forbidden = torch.nonzero((transition != 0) & ~self._transition_mask.to(transition.device))
        if forbidden.numel():
            i, j = forbidden[0].tolist()
            raise ValueError(
                f"entry 'transition' gives the move {i} -> {j} the probability {float(transition[i, j]):.3g}, which "
                f"transition_pattern={self.transition_pattern!r} forbids"
            )

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        k = self.n_components
        gates = {"transition_coef": (k, k, None), "transition_intercept": (k, k)} if self._input_driven else {}
        return {"initial": (k,), "transition": (k, k), **gates, **self._component_state_shapes()}

    def _arviz_dims(self) -> dict[str, list[str]]:
        return {"initial": ["component"], "transition": ["component", "component_to"], **self._component_dims()}

    # ------------------------------------------------------------------- EM
    def _log_emissions(self, data: Batch) -> torch.Tensor:
        """Emission log-densities ``(B, T, K)``; zero at padded steps."""
        batch = data.sequences
        log_emit = batch.x.new_zeros(batch.n_sequences, batch.max_length, self.n_components)
        log_emit[batch.mask] = (
            log_prob_observed(self.components_, data.observed)
            if data.observed is not None
            else self.components_.log_prob(data.rows)
        )
        return log_emit

    def _forward_backward(self, data: Batch, clamp: Clamp | None = None) -> ForwardBackwardResult:
        """The forward-backward over ``data`` (with ``clamp``, over the paths consistent with the known states)."""
        log_emit = self._log_emissions(data)
        log_emit = log_emit if clamp is None else clamp.emissions(log_emit)
        return forward_backward(self.initial_.log(), self._log_transitions(data.sequences), log_emit, data.lengths)

    def _em_initialize(self, data: Batch, generator: torch.Generator) -> None:
        """Emissions from k-means on all frames (each weighted by its sequence's weight); initial and transition
        counts from its labels."""
        family = self._component_family()
        if data.observed is not None:  # the start: the columns' means in the holes
            filled = family.prepare(fill_missing(data.observed.x, family, data.frame_weight))
            data = data.prepared(rows=filled, observed=None)
        self.components_ = self._new_components(data_rows(data.rows))
        if self.init_params == "segments":
            resp = _segment_responsibilities(data.sequences, self.n_components)
        else:
            resp = self._initial_responsibilities(data.rows, generator, data.frame_weight)
        if self._fixed is not None:
            resp = self._fixed.start(self, data.rows, resp)
        if data.known is not None:
            resp = data.known.start(resp, start_points(data.rows), data.mask, data.frame_weight)
        self._initialize_from_frames(data, resp)

    def _initialize_from_frames(self, data: Batch, resp_frames: torch.Tensor) -> None:
        """One M-step from per-frame responsibilities ``(sum(lengths), K)`` (lightly smoothed chain counts,
        every sequence's weighted by its sample weight)."""
        batch, weight = data.sequences, data.weight
        resp = batch.x.new_zeros(batch.n_sequences, batch.max_length, self.n_components)
        resp[batch.mask] = resp_frames
        both = (batch.mask[:, 1:] & batch.mask[:, :-1]).to(resp.dtype)
        if weight is not None:  # every pair and frame of a sequence counts its weight times
            both *= weight.to(resp)[:, None]
        pairs = torch.einsum("bti,btj,bt->ij", resp[:, :-1], resp[:, 1:], both)
        if weight is not None:
            resp *= weight.to(resp)[:, None, None]
        # a light smoothing of the first, hard counts: 1/K of a sequence of the mean weight (weights scaled by any
        # constant start alike)
        smoothing = (1.0 if weight is None else float(weight[weight > 0].mean())) / self.n_components
        self._m_step(
            data, _Counts(initial=resp[:, 0].sum(0) + smoothing, transitions=pairs + smoothing, posterior=resp)
        )

    def _e_step(self, data: Batch) -> tuple[_Counts, torch.Tensor]:
        """Forward–backward statistics and the total log-likelihood of all sequences (each counted as often
        as its sample weight; in a partly labelled fit, over the paths consistent with the known states)."""
        result = self._forward_backward(data, data.known)
        if data.weight is None:
            transitions = result.step_pairs if self._input_driven else result.pair_counts.sum(0)
            counts = _Counts(initial=result.initial.sum(0), transitions=transitions, posterior=result.posterior)
            return counts, result.log_likelihood.sum() + self._log_prior()
        weight = data.weight.to(result.posterior)
        counts = _Counts(
            initial=weight @ result.initial,
            transitions=result.step_pairs * weight[:, None, None, None]
            if self._input_driven
            else torch.einsum("b,bij->ij", weight, result.pair_counts),
            posterior=result.posterior * weight[:, None, None],
        )
        return counts, result.log_likelihood @ weight + self._log_prior()

    def _m_step(self, data: Batch, stats: _Counts) -> None:
        """Baum–Welch updates: initial and transition from expected counts, emissions by weighted MLE."""
        self._em_update(self._em_statistics(data, stats))

    def _em_statistics(self, data: Batch, stats: _Counts) -> dict[str, Any]:
        """What the M-step needs of ``data``: expected initial and transition counts and the emission
        statistics of the frames, all of which merge across shards (:func:`ppmix.distributed.fit_em`); the counts
        carry the sequence weights already."""
        frames = stats.posterior[data.mask]
        emissions = (
            partly_observed_statistics(self.components_, data.observed, frames)
            if data.observed is not None
            else self.components_.statistics(data.rows, frames)
        )
        chain = {"initial": stats.initial, "transitions": stats.transitions}
        if stats.transitions.dim() == 4:  # an input-driven chain's step pairs: its gates regress them on the inputs
            chain |= {"inputs": data.inputs, "mask": data.mask}
        return {**chain, "emissions": emissions}

    def _em_update(self, stats: dict[str, Any]) -> None:
        """The M-step from (merged) statistics."""
        self._update_chain(stats["initial"], stats["transitions"], stats.get("inputs"), stats.get("mask"))
        emissions = stats["emissions"] if self._fixed is None else self._fixed.given(stats["emissions"])
        if self.priors is None:
            fit_statistics(self.components_, emissions)
        else:
            self._map_update_components(emissions)
        if self._fixed is not None:  # the frozen parameters kept (ppmix.models.frozen)
            self._fixed.impose(self)
        self._invalidate_guide()

    # ---------------------------------------------------------- predictions
    def _pointwise_log_likelihood(self, data: SequenceBatch) -> torch.Tensor:
        """``log p(x_{1:T_b})`` of every sequence, shape ``(B,)``."""
        return self._forward_backward(self._prediction_data(data)).log_likelihood

    def _summed_log_likelihood(self, data: SequenceBatch) -> torch.Tensor:
        """``sum_b log p(x_b)``, differentiable in the globals with the forward-backward's expected counts as the
        gradient of the recursions (NUTS's potential: :mod:`ppmix.engines.potential`); the transitions that
        ``transition_pattern`` forbids are ``-inf`` with a zero gradient."""
        allowed = self._transition_mask.to(self.transition_.device)
        safe = torch.where(allowed, self.transition_, torch.ones_like(self.transition_))
        log_trans = safe.log().masked_fill(~allowed, float("-inf"))
        log_emit = self._log_emissions(self._prediction_data(data))
        return log_likelihood(self.initial_.log(), log_trans, log_emit, data.lengths).sum()

    def _draws_log_likelihood(
        self,
        data: SequenceBatch,
        draws: dict[str, torch.Tensor],
        per_step: bool = False,
        marginals: bool = True,
        dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`_pointwise_log_likelihood` ``(S, B)`` (``per_step``: every valid step's one-step-ahead
        ``log p(x_t | x_{<t})``, ``(S, sum(lengths))``, the forward-backward result's ``step_log_likelihood``)
        and :meth:`_posterior_marginals` ``{"z": (S, sum(lengths), K)}`` at every one of
        ``S`` draws of the globals (``{site: (S, ...)}``), for ``to_arviz``.

        Each draw's globals are set as :meth:`_set_globals` sets them and its emissions scored on the batch; the
        forward-backward then runs once over every draw's sequences (draw ``s``'s chain for its sequences), not
        once per draw, in blocks of at most :data:`~ppmix.models._hmm_draws.DRAW_BLOCK_CELLS` cells ``(draw,
        sequence, step, state)``, each block's emissions computed when it is scored (memory bounded by the block,
        not the draws). The log-likelihood is returned in ``dtype`` (default the model's), the marginals only where
        ``marginals``.

        Examples
        --------
        >>> import numpy as np, torch
        >>> seqs = [np.random.default_rng(i).normal(size=(n, 1)) for i, n in enumerate([5, 3])]
        >>> hmm = HMM(2, seed=0, progress=False).fit(seqs)
        >>> draws = {k: torch.stack([v, v]) for k, v in hmm._get_globals().items()}  # the fit, twice
        >>> loglik, marginals = hmm._draws_log_likelihood(hmm.prepare_data(seqs), draws)
        >>> tuple(loglik.shape), tuple(marginals["z"].shape)
        ((2, 2), (2, 8, 2))
        >>> bool(torch.allclose(loglik[1], hmm._pointwise_log_likelihood(hmm.prepare_data(seqs))))
        True
        """
        n_draws, cells = len(next(iter(draws.values()))), data.n_sequences * data.max_length * int(self.n_components)
        block = max(1, DRAW_BLOCK_CELLS // cells)
        log_lik, probs = [], []
        for start in range(0, n_draws, block):
            part = {name: value[start : start + block] for name, value in draws.items()}
            initial, transition, log_emit = chain_per_draw(
                self, part, lambda: self._log_emissions(self._prediction_data(data))
            )
            values, found = forward_backward_per_draw(initial, transition, log_emit, data, per_step, marginals)
            log_lik.append(values.to(dtype or values.dtype))
            if marginals:
                probs.append(found["z"])
        return torch.cat(log_lik), ({"z": torch.cat(probs)} if marginals else {})

    def to_arviz(
        self,
        X: Any = None,
        y: Any = None,
        num_samples: int = 100,
        approximation: str | None = "auto",
        pointwise: str = "sequence",
        **options: Any,
    ) -> Any:
        """ArviZ ``InferenceData`` of the fit, as :meth:`MixtureModel.to_arviz
        <ppmix.models.base.MixtureModel.to_arviz>`, with the unit of its ``log_likelihood`` group chosen by
        ``pointwise``: ``"sequence"`` (default), ``log p(x_b)`` of every sequence (dimension ``sequence``: ``az.loo``
        leaves one sequence out); ``"step"``, the one-step-ahead ``log p(x_t | x_{<t})`` of every valid step, on
        the observed frames' ``obs_id`` (the sequence's log-likelihood is their sum: per-step diagnostics,
        ``az.loo`` over steps, which treats steps as exchangeable, and the pieces of leave-future-out
        validation). The keyword ``options`` (``groups``, ``thin``, ``log_likelihood_dtype``,
        ``predictive_draws``) are :meth:`MixtureModel.to_arviz <ppmix.models.base.MixtureModel.to_arviz>`'s.

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> seqs = [np.repeat([[-3.0], [3.0]], n, axis=0) + rng.normal(size=(2 * n, 1)) for n in (20, 15)]
        >>> sweeps = {"num_chains": 2, "num_samples": 20, "warmup_steps": 20}
        >>> hmm = HMM(2, seed=0, progress=False).fit(seqs, engine="gibbs", **sweeps)
        >>> idata = hmm.to_arviz(num_samples=5, pointwise="step")
        >>> idata.log_likelihood["x"].shape  # (chain, draw, step): the 70 steps of the two sequences
        (2, 20, 70)
        """
        if pointwise not in ("sequence", "step"):
            raise ValueError(f"pointwise must be 'sequence' or 'step'; got {pointwise!r}")
        if self._input_driven:
            raise ValueError("to_arviz() is for the Pyro program, which an input-driven HMM does not have (EM only)")
        if pointwise == "step" and own_hook(self, "_draws_log_likelihood", *POINTWISE_COMPANIONS) is None:
            raise ValueError(
                f"pointwise='step' needs the HMM's own likelihood; {type(self).__name__} scores whole sequences "
                "(pointwise='sequence')"
            )
        return self._inference_data(X, y, num_samples, approximation, per_step=pointwise == "step", **options)

    def _draws_replicated(self, data: SequenceBatch, draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One replicated data set per draw of the globals (``{site: (S, ...)}``), for ``to_arviz``'s
        ``posterior_predictive``: ``{"x": (S, sum(lengths), D)}``, the valid frames of sequences as long as
        ``data``'s.

        The state paths of every draw and sequence are drawn together, step by step, from each draw's chain; the
        emissions from each draw's components. Random numbers come from torch's global generator.

        Examples
        --------
        >>> import numpy as np, torch
        >>> seqs = [np.random.default_rng(i).normal(size=(n, 1)) for i, n in enumerate([5, 3])]
        >>> hmm = HMM(2, seed=0, progress=False).fit(seqs)
        >>> draws = {k: v.expand(4, *v.shape) for k, v in hmm._get_globals().items()}
        >>> tuple(hmm._draws_replicated(hmm.prepare_data(seqs), draws)["x"].shape)
        (4, 8, 1)
        """
        initial, transition, components = chain_per_draw(self, draws, lambda: self.components_)
        paths = state_paths_per_draw(initial, transition, data.n_sequences, data.max_length)
        valid = data.mask.to(initial.device)
        return {"x": torch.stack([_emitted(emissions, path, valid) for emissions, path in zip(components, paths)])}

    def _posterior_marginals(self, data: SequenceBatch) -> dict[str, torch.Tensor]:
        """Smoothed state marginals of all valid steps, stacked as ``{"z": (sum(lengths), K)}``."""
        prepared = self._prediction_data(data)
        return {"z": self._forward_backward(prepared).posterior[prepared.mask]}

    def predict_proba(self, X: Any, inputs: Any = None) -> list[Any]:
        """Smoothed state marginals ``q(z_t = k)``, one ``(length, K)`` array per sequence (``inputs``: the steps'
        inputs, as for :meth:`fit`)."""
        self._check_fitted()
        batch = self.prepare_data(X, inputs=inputs)
        posterior = self._forward_backward(self._prediction_data(batch)).posterior
        return [to_output(p, self._output_like(X)) for p in batch.unpad(posterior)]

    def decode(self, X: Any, algorithm: str = "viterbi", inputs: Any = None) -> tuple[Any, list[Any]]:
        """The decoded state path of each sequence and its score.

        Parameters
        ----------
        X : sequences
            As :meth:`fit` takes them.
        algorithm : {"viterbi", "map"}
            ``"viterbi"``: the jointly most probable path, scored ``log p(z*, x)``. ``"map"``: each step's most
            probable state under the smoothed marginals (:meth:`predict_proba`), scored ``sum_t log max_k
            p(z_t = k | x)``; hmmlearn's ``decode(algorithm="map")`` gives the same paths.
        inputs : list of arrays, optional
            The steps' inputs (an input-driven chain's, regression emissions'), as for :meth:`fit`.

        Returns
        -------
        log_probs : array (n_sequences,)
        paths : list of int arrays (length,)

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import HMM
        >>> x = np.r_[np.zeros(20), np.full(20, 5.0)][:, None] + np.random.default_rng(0).normal(size=(40, 1))
        >>> hmm = HMM(2, seed=0, progress=False).fit([x])
        >>> _, (viterbi_path,) = hmm.decode([x])
        >>> _, (map_path,) = hmm.decode([x], algorithm="map")
        >>> bool((viterbi_path == map_path).all())
        True
        """
        return decode_states(self, _with_inputs(X, inputs), algorithm)

    def filter(self, X: Any, inputs: Any = None) -> list[Any]:
        """Filtered state probabilities ``p(z_t = k | x_{0:t})``: what each step and the ones before it say of
        its state, one ``(length, K)`` array per sequence (:meth:`predict_proba` uses the whole sequence).

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import HMM
        >>> x = np.r_[np.zeros(20), np.full(20, 5.0)][:, None] + np.random.default_rng(0).normal(size=(40, 1))
        >>> hmm = HMM(2, seed=0, progress=False).fit([x])
        >>> (filtered,) = hmm.filter([x])
        >>> filtered.shape, bool(np.allclose(filtered[-1], hmm.predict_proba([x])[0][-1]))  # equal at the end
        ((40, 2), True)
        """
        return filter_states(self, _with_inputs(X, inputs))

    def sample_paths(self, X: Any, n: int = 1, inputs: Any = None) -> list[Any]:
        """``n`` state paths of each sequence drawn from the posterior ``p(z | x)`` (forward filtering, backward
        sampling), one ``(n, length)`` integer array per sequence; reproducible from the model's ``seed``.

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import HMM
        >>> x = np.r_[np.zeros(20), np.full(20, 5.0)][:, None] + np.random.default_rng(0).normal(size=(40, 1))
        >>> hmm = HMM(2, seed=0, progress=False).fit([x])
        >>> (paths,) = hmm.sample_paths([x], n=500)
        >>> paths.shape, bool(np.allclose(paths.mean(0), hmm.predict_proba([x])[0][:, 1], atol=0.1))
        ((500, 40), True)
        """
        return sample_state_paths(self, _with_inputs(X, inputs), n, self._generator(offset=104729))

    def predict(self, X: Any, inputs: Any = None) -> list[Any]:
        """Most probable state path of each sequence (Viterbi; ``inputs``: the steps' inputs, as for :meth:`fit`)."""
        return self.decode(X, inputs=inputs)[1]

    def score_samples(self, X: Any, inputs: Any = None) -> Any:
        """``log p(x_b)`` of every sequence, shape ``(B,)`` (``inputs``: the steps' inputs, as for :meth:`fit`)."""
        return super().score_samples(_with_inputs(X, inputs))

    def score(self, X: Any, y: Any = None, sample_weight: Any = None, inputs: Any = None) -> float:
        """Mean log-likelihood per time step (the quantity in ``history_``); with ``sample_weight`` (one per
        sequence) every sequence's steps count that many times (``inputs``: the steps' inputs, as for :meth:`fit`)."""
        self._check_fitted()
        batch = self.prepare_data(X, y, inputs=inputs)
        log_lik = self._pointwise_log_likelihood(batch)
        if sample_weight is None:
            return float(log_lik.sum()) / int(batch.lengths.sum())
        weight = self._weigh(batch, sample_weight, fitting=False).weight.to(log_lik)
        return float(log_lik @ weight) / float(weight @ batch.lengths.to(weight))

    def bic(self, X: Any, y: Any = None, inputs: Any = None) -> float:
        """Bayesian information criterion ``-2 log L + p log N`` (``N`` the time steps; ``inputs``: the steps'
        inputs, as for :meth:`fit`, needed by input-driven transitions and regression emissions)."""
        return super().bic(_with_inputs(X, inputs), y)

    def aic(self, X: Any, y: Any = None, inputs: Any = None) -> float:
        """Akaike information criterion ``-2 log L + 2 p`` (``inputs`` as for :meth:`bic`)."""
        return super().aic(_with_inputs(X, inputs), y)

    def sample(self, n_samples: int = 1, length: int = 50, inputs: Any = None) -> dict[str, Any]:
        """Draw ``n_samples`` sequences of ``length`` steps: ``{"x": (n, T, D), "z": (n, T)}``; with ``inputs`` (one
        ``(T_b, P)`` array per sequence, required by an input-driven chain and by regression emissions), one sequence
        along each, ``{"x": [(T_b, D)], "z": [(T_b,)]}`` (``n_samples`` and ``length`` are the inputs').

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> inputs = [rng.normal(size=(30, 1)) for _ in range(4)]
        >>> seqs = [2.0 * u + 0.1 * rng.normal(size=(30, 1)) for u in inputs]
        >>> hmm = HMM(2, emission="linear_regression", seed=0, progress=False).fit(seqs, inputs=inputs)
        >>> [x.shape for x in hmm.sample(inputs=[np.zeros((5, 1)), np.ones((3, 1))])["x"]]
        [(5, 1), (3, 1)]
        """
        self._check_fitted()
        needed = self._inputs_needed
        if inputs is not None and needed is not None:
            return sample_along_inputs(self, inputs, self._generator(offset=7919))
        if needed is not None:
            raise ValueError(
                f"sample() of {needed} draws sequences along given inputs: sample(inputs=[U_1, ...]) (and "
                "sample_paths(X, n, inputs=...) draws the posterior state paths of given sequences)"
            )
        if inputs is not None:
            raise ValueError("inputs= is for an input-driven chain or regression emissions")
        n, steps = check_positive_int(n_samples, "n_samples"), check_positive_int(length, "length")
        gen = self._generator(offset=7919)
        z = state_paths_per_draw(self.initial_.cpu()[None], self.transition_.cpu()[None], n, steps, gen)[0]
        x = _emitted(self.components_, z.to(self._device), generator=gen if self._device.type == "cpu" else None)
        return {"x": x.reshape(n, steps, -1).cpu().numpy(), "z": z.numpy()}

    @property
    def n_parameters(self) -> int:
        """Number of free parameters: ``K - 1`` initial, ``K (K - 1)`` transition probabilities (fewer under a
        ``transition_pattern``: each row's allowed ones less one; input-driven, ``K (K - 1) (P + 1)`` slopes and
        intercepts of the gates) and the emissions'."""
        k = int(self.n_components)
        free_transitions = int(self._transition_mask.sum()) - k
        if self._input_driven:
            free_transitions *= self.n_inputs_ + 1
        return (k - 1) + free_transitions + self._component_parameters


def _segment_responsibilities(batch: SequenceBatch, k: int) -> torch.Tensor:
    """One-hot states ``(sum(lengths), K)`` of the valid frames: step ``t`` of a sequence of length ``T`` in state
    ``floor(t K / T)``, so every sequence runs through the states in order."""
    steps = torch.arange(batch.max_length, device=batch.lengths.device)
    state = (steps[None, :] * k) // batch.lengths[:, None].clamp_min(1)
    return torch.nn.functional.one_hot(state[batch.mask.to(state.device)].clamp_max(k - 1), k).to(batch.x)


def _emitted(
    components: Any, paths: torch.Tensor, valid: torch.Tensor | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Frames emitted along state paths ``(n, T)``, at the ``valid`` steps ``(n, T)`` (all when None), stacked
    ``(n_valid, D)``: the states as one flat index, as every family's ``sample`` takes them (a multinomial's draws
    are rows), or, for components whose frames depend on those before them (``sample_paths``), sequence by
    sequence."""
    sample_paths = getattr(components, "sample_paths", None)
    if sample_paths is not None:
        frames = sample_paths(paths, generator=generator)
        return frames.reshape(-1, frames.shape[-1]) if valid is None else frames[valid.to(frames.device)]
    return components.sample(paths.reshape(-1) if valid is None else paths[valid], generator=generator)


def _sequence_weights(batch: SequenceBatch, weight: torch.Tensor) -> torch.Tensor:
    """Every step's sequence weight, ``(B, T)``."""
    return weight.to(batch.x)[:, None].expand(batch.n_sequences, batch.max_length)


def _with_inputs(X: Any, inputs: Any) -> Any:
    """``X`` with the ``inputs`` of its steps travelling beside it (``X`` itself when there are none)."""
    return X if inputs is None else SequencesWithInputs(X, inputs)


def _first(X: Any) -> Any:
    """The object whose type decides the output type (tensor in, tensor out)."""
    if isinstance(X, tuple) and len(X) == 2:
        return X[0]
    if isinstance(X, (list, tuple)) and X:
        return X[0]
    return X
