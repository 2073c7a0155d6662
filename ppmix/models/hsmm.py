"""``HSMM``: explicit-duration (hidden semi-Markov) model with emissions of any density family, batched over
variable-length sequences, fitted by EM over segments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ppmix._validation import check_positive_int
from ppmix.algorithms.segments import segment_forward, segment_posterior
from ppmix.components.family import DensityFamily
from ppmix.components.family_tools import data_rows
from ppmix.components.registry import family_config
from ppmix.models._arviz import LaplaceUnavailable
from ppmix.models._durations import DurationFamily, completed_counts, duration_family
from ppmix.models._family_components import FamilyModel
from ppmix.models._missing import fit_statistics
from ppmix.models._params import store_params
from ppmix.models._segment_inference import decode_segments, sample_segment_paths, smoothed_states
from ppmix.models._segment_runs import chain_paths, run_counts
from ppmix.models._transitions import MarkovChain
from ppmix.models._weights import Weighted, split_weights
from ppmix.models.base import MixtureModel
from ppmix.models.hmm import HMM, _EMData, _emitted, _segment_responsibilities, _sequence_weights, _with_inputs

__all__ = ["HSMM"]


@dataclass
class _SegmentCounts:
    """Expected statistics of one E-step, summed over the (weighted) sequences."""

    initial: torch.Tensor  # (K,)
    transitions: torch.Tensor  # (K, K)
    durations: torch.Tensor  # (K, D) complete segments
    censored: torch.Tensor  # (K, D) last segments, seen d steps
    posterior: torch.Tensor  # (B, T, K) state marginals times the sequence weights


class HSMM(FamilyModel):
    """Explicit-duration hidden semi-Markov model: a sequence is a run of segments; the first segment's state is drawn
    from ``initial``, each next one from ``transition[previous]`` (zero diagonal: a segment ends when its state
    does), each segment lasts ``d ~ p_k(d)`` steps (``1 <= d <= max_duration``) and every one of its steps emits
    ``x_t ~ emission(theta_k)``.

    The last segment of a sequence is right-censored (it lasts at least to the sequence's end: a sequence cut from a
    longer run), which is the likelihood of the equivalent expanded-state HMM and of ``sample``'s draws. EM runs the
    segment forward–backward of :mod:`ppmix.algorithms.segments` (``O(T K D)`` per sequence, all sequences at once):
    expected first states, switches and durations (a censored segment's remaining duration is a latent of EM,
    :func:`~ppmix.models._durations.completed_counts`) update ``initial_``, ``transition_`` and the durations, and
    the per-step state marginals weigh the emission family's statistics, so every family of
    :mod:`ppmix.components` serves. The data layouts are :class:`~ppmix.models.hmm.HMM`'s.

    Parameters
    ----------
    n_components : int, default 2
        Number of hidden states.
    emission : str or DensityFamily, default "gaussian"
        The emissions' family, as for :class:`~ppmix.models.hmm.HMM`.
    duration : {"poisson", "negative_binomial", "nonparametric"}, default "poisson"
        The durations' distribution over ``1..max_duration`` (:mod:`ppmix.models._durations`): ``d = 1 + X`` with
        ``X`` Poisson or negative binomial truncated at ``max_duration - 1``, or any probability table.
    max_duration : int, default 20
        The longest segment ``D`` (the cost is linear in it).
    covariance_type, reg_covar, n_init, max_iter, tol, init_params, warm_start, sequence_column :
        As for :class:`~ppmix.models.hmm.HMM` (``init_params``: the runs of the start's labels are its first segments).
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    initial_ : Tensor (K,)
    transition_ : Tensor (K, K)
        ``P(next segment's state | this one's)``, zero on the diagonal (for ``K >= 2``).
    duration_params_ : dict of Tensor
        ``{"duration_rate": (K,)}`` (Poisson), ``{"duration_shape", "duration_prob"}`` (negative binomial) or
        ``{"duration": (K, D)}`` (nonparametric).
    durations_ : Tensor (K, D)
        ``p_k(d)`` at ``[k, d - 1]``.
    components_ : ComponentFamily
        The fitted emissions.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)  # two states taking turns, six steps each
    >>> seqs = [np.repeat(np.arange(8) % 2 * 5.0, 6)[:, None] + rng.normal(size=(48, 1)) for _ in range(10)]
    >>> hsmm = HSMM(2, max_duration=12, seed=0, progress=False).fit(seqs)
    >>> np.round(hsmm.mean_durations_.numpy()) + 0.0
    array([6., 6.])
    >>> [p.shape for p in hsmm.predict(seqs[:2])]
    [(48,), (48,)]
    """

    data_plate_name = "sequences"
    posterior_remedy = (
        "refit on bootstrap resamples of the sequences (HSMM is fitted by EM only, with no posterior draws; compare "
        "fits by held-out score or bic)"
    )
    init_methods = HMM.init_methods
    missing = "error"
    _accepts_missing = False

    def __init__(
        self,
        n_components: int = 2,
        *,
        emission: str | DensityFamily | dict = "gaussian",
        duration: str = "poisson",
        max_duration: int = 20,
        covariance_type: str = "diag",
        n_init: int = 1,
        max_iter: int = 100,
        tol: float = 1e-6,
        reg_covar: float = 1e-6,
        init_params: str = "kmeans",
        warm_start: bool = False,
        sequence_column: str | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__()
        store_params(self, locals())

    # the emissions and the sequence data, as the HMM's (the same family resolution, layouts and checks)
    _component_family = HMM._component_family
    _prepare_sequences = HMM._prepare_sequences
    _record_sequence_scale = HMM._record_sequence_scale
    _step_rows = HMM._step_rows
    _em_data = HMM._em_data
    _prediction_data = HMM._prediction_data
    _log_emissions = HMM._log_emissions
    _output_like = HMM._output_like
    _n_observations = HMM._n_observations
    _observed_data = HMM._observed_data
    _sample_weight_units = HMM._sample_weight_units
    # a chain of segments with no inputs: an inputs= argument is refused by the HMM's check, naming it
    transitions = "homogeneous"
    _input_driven = HMM._input_driven
    _padded_inputs = HMM._padded_inputs
    score = HMM.score

    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False, inputs: Any = None) -> Any:
        """Sequences as the HMM takes them (:meth:`HMM.prepare_data <ppmix.models.hmm.HMM.prepare_data>`), or one
        ``(T, D)`` array (numpy or torch) as a single sequence; ``y`` is ignored (``inputs`` are refused)."""
        if isinstance(X, (np.ndarray, torch.Tensor)) and X.ndim == 2:
            X = [X]
        return self._prepare_sequences(_with_inputs(X, inputs), None, fitting=fitting)

    def predict(self, X: Any) -> list[Any]:
        """The state of every step on the best segmentation (Viterbi over segments), one array per sequence."""
        return self.decode(X)[1]

    def _saved_params(self) -> dict[str, Any]:
        params = super()._saved_params()
        params["emission"] = family_config(params["emission"])
        return params

    def _validate_hyperparameters(self) -> None:
        super()._validate_hyperparameters()
        self._validate_family_params()
        check_positive_int(self.max_duration, "max_duration")
        duration_family(self.duration)

    def fit(self, X: Any, y: Any = None, *, sample_weight: Any = None, engine: str = "em", **options: Any) -> "HSMM":
        """Fit by EM over segments (:class:`~ppmix.models.base.MixtureModel.fit`); ``engine`` must be ``"em"``."""
        if engine != "em":
            raise ValueError(
                f"HSMM is fitted by EM only (its durations have no Pyro program): engine='em'; got {engine!r}"
            )
        return super().fit(X, y, sample_weight=sample_weight, engine=engine, **options)

    def _weigh(self, data: Any, sample_weight: Any, *, fitting: bool = True) -> Weighted:
        """As :meth:`HMM._weigh <ppmix.models.hmm.HMM._weigh>`: one weight per sequence; the data scale of the
        frames counted as often as their sequences' weights."""
        weighted = MixtureModel._weigh(self, data, sample_weight, fitting=fitting)
        if fitting:
            weight = _sequence_weights(data, weighted.weight)[data.mask]
            self._record_weighted_data_scale(data.frames, weight)
            self._record_sequence_scale(data, weight)
        return weighted

    # ------------------------------------------------------------ the chain
    def _duration_family(self) -> DurationFamily:
        return duration_family(self.duration)

    def _markov_chain(self) -> MarkovChain:
        """The segments' chain: every switch to another state allowed (self-switches are longer durations)."""
        k = int(self.n_components)
        mask = ~torch.eye(k, dtype=torch.bool, device=self._device) if k > 1 else torch.ones(1, 1, dtype=torch.bool)
        return MarkovChain(mask, 1.0)

    def _log_chain(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``log initial_``, ``log transition_`` and the log duration table."""
        return self.initial_.log(), self.transition_.log(), self._log_durations()

    def _log_durations(self) -> torch.Tensor:
        return self._duration_family().log_table(self.duration_params_, int(self.max_duration))

    @property
    def durations_(self) -> torch.Tensor:
        """``p_k(d)`` at ``[k, d - 1]``, ``(K, max_duration)``."""
        self._check_fitted()
        return self._log_durations().exp()

    @property
    def mean_durations_(self) -> torch.Tensor:
        """The mean duration of every state's segments ``(K,)``."""
        steps = torch.arange(1, int(self.max_duration) + 1, dtype=self.dtype, device=self._device)
        return self.durations_ @ steps

    @property
    def startprob_(self) -> torch.Tensor:
        """``initial_`` under hmmlearn's name."""
        return self.initial_

    @property
    def transmat_(self) -> torch.Tensor:
        """``transition_`` under hmmlearn's name."""
        return self.transition_

    # ------------------------------------------------------------------- EM
    def _em_initialize(self, data: _EMData | Weighted, generator: torch.Generator) -> None:
        """Emissions from the start's labels (k-means on all frames, ...); the runs of equal labels counted as the
        first segments (lightly smoothed) give the chain and the durations."""
        inner, weight = split_weights(data)
        batch, k = inner.batch, int(self.n_components)
        self.components_ = self._new_components(data_rows(inner.frames))
        frame_weight = None if weight is None else _sequence_weights(batch, weight)[batch.mask]
        if self.init_params == "segments":  # every sequence cut into K equal stretches, in state order
            resp = _segment_responsibilities(batch, k)
        else:
            resp = self._initial_responsibilities(inner.frames, generator, frame_weight)
        labels = torch.zeros(batch.n_sequences, batch.max_length, dtype=torch.long, device=resp.device)
        labels[batch.mask] = resp.argmax(-1)
        sequence_weight = torch.ones(batch.n_sequences, dtype=self.dtype) if weight is None else weight
        runs = run_counts(labels, batch.mask, k, int(self.max_duration), sequence_weight.to(labels.device))
        smoothing = float(sequence_weight[sequence_weight > 0].mean()) / k
        opts = {"dtype": self.dtype, "device": self._device}
        self.initial_, self.transition_ = self._markov_chain().update(
            runs.initial.to(**opts) + smoothing, runs.transitions.to(**opts) + smoothing
        )
        self.duration_params_ = self._duration_family().start(runs.durations.to(**opts))
        frames_resp = resp if frame_weight is None else resp * frame_weight[:, None]
        fit_statistics(self.components_, self.components_.statistics(inner.frames, frames_resp))

    def _e_step(self, data: _EMData | Weighted) -> tuple[_SegmentCounts, torch.Tensor]:
        """The segment forward–backward's expected counts and the total log-likelihood (every sequence counted as
        often as its sample weight)."""
        inner, weight = split_weights(data)
        post = segment_posterior(*self._log_chain(), self._log_emissions(inner), inner.batch.lengths)
        w = post.log_likelihood.new_ones(len(post.log_likelihood)) if weight is None else weight.to(post.posterior)
        counts = _SegmentCounts(
            initial=w @ post.initial,
            transitions=torch.einsum("b,bij->ij", w, post.transitions),
            durations=torch.einsum("b,bkd->kd", w, post.durations),
            censored=torch.einsum("b,bkd->kd", w, post.censored),
            posterior=post.posterior * w[:, None, None],
        )
        return counts, post.log_likelihood @ w

    def _m_step(self, data: _EMData | Weighted, stats: _SegmentCounts) -> None:
        """Initial and transition probabilities from the expected counts, durations from the completed duration
        counts, emissions by the family's weighted fit of the state marginals."""
        inner = split_weights(data)[0]
        whole = completed_counts(stats.durations, stats.censored, self._log_durations())
        self.initial_, self.transition_ = self._markov_chain().update(stats.initial, stats.transitions)
        self.duration_params_ = self._duration_family().update(whole, self.duration_params_)
        frames = stats.posterior[inner.batch.mask]
        fit_statistics(self.components_, self.components_.statistics(inner.frames, frames))

    # -------------------------------------------------------------- globals
    def _get_globals(self) -> dict[str, torch.Tensor]:
        chain = {"initial": self.initial_.clone(), "transition": self.transition_.clone()}
        return {**chain, **{n: v.clone() for n, v in self.duration_params_.items()}, **self._component_globals()}

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self.initial_ = torch.as_tensor(values["initial"]).to(**opts)
        self.transition_ = torch.as_tensor(values["transition"]).to(**opts)
        self.duration_params_ = {n: torch.as_tensor(values[n]).to(**opts) for n in self._duration_family().names}
        self._set_component_globals(values)

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        chain = {"initial": self.initial_.clone(), "transition": self.transition_.clone()}
        return {**chain, **{n: v.clone() for n, v in self.duration_params_.items()}, **self.components_.state_dict()}

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self.initial_, self.transition_ = tensors["initial"].to(**opts), tensors["transition"].to(**opts)
        self.duration_params_ = {n: tensors[n].to(**opts) for n in self._duration_family().names}
        self._load_component_state(tensors)

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        k, depth = int(self.n_components), int(self.max_duration)
        durations = {n: (k, depth) if n == "duration" else (k,) for n in self._duration_family().names}
        return {"initial": (k,), "transition": (k, k), **durations, **self._component_state_shapes()}

    def _arviz_dims(self) -> dict[str, list[str]]:
        chain = {"initial": ["component"], "transition": ["component", "component_to"]}
        durations = {
            n: ["component", "duration"] if n == "duration" else ["component"] for n in self._duration_family().names
        }
        return {**chain, **durations, **self._component_dims()}

    def _laplace_target(self, data: Any) -> Any:
        """None: the durations have no Pyro program to take a Laplace approximation of, so ``to_arviz`` holds the
        point estimate (with its log-likelihood per sequence)."""
        raise LaplaceUnavailable(
            "HSMM has no Pyro program (its durations are outside Pyro) to take a Laplace approximation of",
            "to_arviz() holds the EM point estimate",
        )

    def _draws_replicated(self, data: Any, draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One replicated data set per draw of the globals (``{site: (S, ...)}``), for ``to_arviz``'s
        ``posterior_predictive``: ``{"x": (S, sum(lengths), D)}``, sequences as long as ``data``'s, drawn from torch's
        global random state."""
        replicated = []
        with self._parameters_restored():
            for s in range(len(next(iter(draws.values())))):
                self._set_globals({name: value[s] for name, value in draws.items()})
                gen = torch.Generator().manual_seed(int(torch.randint(2**62, ())))
                z = chain_paths(
                    self.initial_, self.transition_, self.durations_, data.n_sequences, data.max_length, gen
                )
                replicated.append(_emitted(self.components_, z.to(self._device), data.mask.to(self._device)))
        return {"x": torch.stack(replicated)}

    # ---------------------------------------------------------- predictions
    def _pointwise_log_likelihood(self, data: Any) -> torch.Tensor:
        """``log p(x_{1:T_b})`` of every sequence, ``(B,)``."""
        batch = data.batch if isinstance(data, _EMData) else data
        prepared = self._prediction_data(batch)
        return segment_forward(*self._log_chain(), self._log_emissions(prepared), batch.lengths).log_likelihood

    def _posterior_marginals(self, data: Any) -> dict[str, torch.Tensor]:
        """Smoothed state marginals of all valid steps, ``{"z": (sum(lengths), K)}``."""
        prepared = self._prediction_data(data)
        post = segment_posterior(*self._log_chain(), self._log_emissions(prepared), data.lengths)
        return {"z": post.posterior[data.mask]}

    def predict_proba(self, X: Any) -> list[Any]:
        """Smoothed state marginals ``p(z_t = k | x)``, one ``(length, K)`` array per sequence.

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> seqs = [np.repeat([0.0, 4.0, 0.0], 10)[:, None] + rng.normal(size=(30, 1)) for _ in range(4)]
        >>> proba = HSMM(2, max_duration=12, seed=0, progress=False).fit(seqs).predict_proba(seqs)
        >>> proba[0].shape, bool(np.allclose(proba[0].sum(1), 1.0))
        ((30, 2), True)
        """
        return smoothed_states(self, X)

    def decode(self, X: Any, algorithm: str = "viterbi") -> tuple[Any, list[Any]]:
        """The decoded states of each sequence and their score: ``"viterbi"``, the most probable segmentation
        (Viterbi over segments) and ``log p(x, segmentation)``; ``"map"``, each step's most probable state under
        :meth:`predict_proba` and ``sum_t log max_k p(z_t = k | x)``. Returns ``(log_probs (B,), paths)``."""
        return decode_segments(self, X, algorithm)

    def sample_paths(self, X: Any, n: int = 1) -> list[Any]:
        """``n`` state paths of each sequence drawn from the posterior ``p(z | x)`` (backward sampling of
        segments), one ``(n, length)`` integer array per sequence; reproducible from the model's ``seed``.

        Examples
        --------
        >>> import numpy as np
        >>> x = np.r_[np.zeros(20), np.full(20, 5.0)][:, None] + np.random.default_rng(0).normal(size=(40, 1))
        >>> hsmm = HSMM(2, max_duration=25, seed=0, progress=False).fit([x])
        >>> (paths,) = hsmm.sample_paths([x], n=500)
        >>> paths.shape, bool(np.allclose(paths.mean(0), hsmm.predict_proba([x])[0][:, 1], atol=0.1))
        ((500, 40), True)
        """
        return sample_segment_paths(self, X, n, self._generator(offset=104729))

    def sample(self, n_samples: int = 1, length: int = 50) -> dict[str, Any]:
        """Draw ``n_samples`` sequences of ``length`` steps: ``{"x": (n, T, D), "z": (n, T)}`` (the chain cut at
        ``length``, as the likelihood's censored last segment has it)."""
        self._check_fitted()
        n, steps = check_positive_int(n_samples, "n_samples"), check_positive_int(length, "length")
        gen = self._generator(offset=7919)
        z = chain_paths(self.initial_, self.transition_, self.durations_, n, steps, gen)
        x = _emitted(self.components_, z.to(self._device), generator=gen if self._device.type == "cpu" else None)
        return {"x": x.reshape(n, steps, -1).cpu().numpy(), "z": z.numpy()}

    @property
    def n_parameters(self) -> int:
        """Free parameters: ``K - 1`` initial, ``K (K - 2)`` switch probabilities (zero diagonal), the durations'
        (``K`` Poisson rates, ``2 K`` negative-binomial ones, ``K (D - 1)`` table entries) and the emissions'."""
        k = int(self.n_components)
        durations = self._duration_family().n_parameters(k, int(self.max_duration))
        return (k - 1) + k * max(k - 2, 0) + durations + self._component_parameters
