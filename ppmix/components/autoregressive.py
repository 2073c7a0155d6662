"""Autoregressive emissions for the HMM: ``x_t | z_t = k ~ N(W_k [x_{t-1}; ...; x_{t-p}] + b_k, Sigma_k)``.

A frame's density depends on the ``p`` frames before it in its sequence, the frames before a
sequence's start taken as zeros (the convention of dynamax's ``LinearAutoregressiveHMM``): each sequence's first
``p`` frames regress on zero lags, which biases the weights of sequences far from zero mean (true ``W = 0.8``:
fitted 0.58 at an offset of 10, 0.04 at an offset of 100), so centre your sequences (subtract their mean) before
fitting. The
family asks the HMM for them through :meth:`AutoRegressiveFamily.sequence_rows`: given the padded
sequences, it makes every step's row ``[x_t, x_{t-1}, ..., x_{t-p}]`` ``(D (p + 1),)``, which the HMM
then treats as it treats any family's frames (EM, the Pyro program of SVI and MCMC, predictions).
The M-step is a weighted least-squares regression of ``x_t`` on ``[x_{t-1}; ...; x_{t-p}; 1]`` per
state, on frames and lags centred at a fixed centre (the training frames' mean) so that float32 keeps its
digits; the covariance is the weighted residual covariance under the Gaussian family's variance floor
(:func:`~ppmix.components.gaussian_family.variance_floor`) of the robust spread of the first differences
``x_t - x_{t-1}`` (a residual scale: the frames' own spread would swamp the noise of a trending series).

A mixture has no sequences, so ``Mixture(family="autoregressive")`` is refused.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import ClassVar

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import check_positive_int
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.centred import as_floor, padded_counts
from ppmix.components.family import AdditiveStatistics, DataScale, DensityFamily, FamilyPriors, PreparedRows, SiteSpec
from ppmix.components.gaussian_family import GaussianFamily, robust_spread, scale_sample, variance_floor
from ppmix.components.gaussian_full import checked_cholesky, floored_covariance

__all__ = [
    "AutoRegressiveComponents",
    "AutoRegressiveFamily",
    "AutoRegressivePriors",
    "LaggedNormal",
    "LaggedRows",
    "RegressionStatistics",
]

COVARIANCE_TYPES = ("full", "diag")


@dataclasses.dataclass(frozen=True)
class LaggedRows(PreparedRows):
    """Frames with the frames before them: ``frames`` ``(N, D)`` and ``lags`` ``(N, D p)``, row ``n`` of ``lags``
    being ``[x_{t-1}; ...; x_{t-p}]`` of frame ``x_t = frames[n]`` (zeros before its sequence's start).

    Examples
    --------
    >>> rows = split_rows(lagged_sequences(torch.tensor([[[1.0], [2.0], [3.0]]]), 1)[0], 1, 1)
    >>> rows.frames.tolist(), rows.lags.tolist()
    ([[1.0], [2.0], [3.0]], [[0.0], [1.0], [2.0]])
    >>> rows.design().tolist()
    [[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]
    """

    frames: torch.Tensor
    lags: torch.Tensor

    @property
    def rows(self) -> torch.Tensor:
        """The frames ``x_t`` ``(N, D)`` (k-means starts on them)."""
        return self.frames

    def design(self) -> torch.Tensor:
        """The regressors ``[x_{t-1}; ...; x_{t-p}; 1]`` of every frame, ``(N, D p + 1)``."""
        return torch.cat([self.lags, torch.ones_like(self.lags[:, :1])], dim=1)


@dataclasses.dataclass(frozen=True)
class RegressionStatistics(AdditiveStatistics):
    """Per state, the total weight ``counts`` ``(K,)`` and the weighted cross-products ``moments`` ``(K, D + P,
    D + P)`` of ``u = [x_t - m; x_{t-1} - m; ...; x_{t-p} - m; 1]`` (``P = D p + 1``, ``m`` the components' fixed
    ``centre``): all the weighted least squares needs, additive across shards.

    Examples
    --------
    >>> comp = AutoRegressiveComponents(torch.zeros(1, 1, 1), torch.zeros(1, 1), torch.ones(1, 1, 1))
    >>> rows = LaggedRows(torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [1.0]]))
    >>> stats = comp.statistics(rows, torch.ones(2, 1))
    >>> stats.counts.tolist(), stats.moments[0].tolist()  # u = [x_t; x_{t-1}; 1]
    ([2.0], [[5.0, 2.0, 3.0], [2.0, 1.0, 1.0], [3.0, 1.0, 2.0]])
    """

    counts: torch.Tensor
    moments: torch.Tensor


def split_rows(x: torch.Tensor, d: int, lags: int) -> LaggedRows:
    """Rows ``[x_t, x_{t-1}, ..., x_{t-p}]`` ``(N, D (p + 1))`` of ``d`` features and ``lags`` lags as
    :class:`LaggedRows`; rows of another width (a mixture's frames, which have no lags) are refused.

    Examples
    --------
    >>> split_rows(torch.tensor([[2.0, 1.0]]), 1, 1).lags.tolist()
    [[1.0]]
    """
    if x.dim() != 2 or x.shape[1] != d * (lags + 1):
        raise ValueError(_no_sequences(x.shape[-1], d, lags))
    return LaggedRows(x[:, :d], x[:, d:])


def innovation_floor(steps: torch.Tensor, reg_covar: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The variance floor ``(D,)`` of autoregressive noise from the steps ``x_t - x_{t-1}`` ``(N, D)`` of the
    sequences (a sequence's first frame minus zero, as its lag):
    :func:`~ppmix.components.gaussian_family.variance_floor` of their robust spread, a residual scale (the frames'
    own spread, that of the level, would swamp the noise of a trending or integrated series). Steps counted
    ``weight`` ``(N,)`` times (once when None); beyond :data:`~ppmix.components.gaussian_family.SCALE_SAMPLE_ROWS`
    steps, unweighted, on a fixed subsample.

    Examples
    --------
    >>> steps = torch.full((100, 1), 5.0, dtype=torch.float64)  # a straight line: constant steps
    >>> innovation_floor(steps, 1e-6).tolist()
    [1e-06]
    """
    if steps.shape[0] < 2:
        return torch.full_like(steps[0], reg_covar)
    spread = robust_spread(scale_sample(steps) if weight is None else steps, weight)
    return variance_floor(spread, reg_covar)


#: a direction of the lags' covariance whose variance is within this many units of rounding (machine epsilons, per
#: lag) of their second moments about the centre is rounding, not variation: a lag always before its sequence's
#: start (constant after centring) gets no weight
RANK_ULPS = 64


def _rank_tolerance(second_moments: torch.Tensor) -> torch.Tensor:
    """The absolute cut-off ``(K,)`` under which the pseudo-inverse of the lags' covariances drops a direction, from
    their second moments ``(K, D p, D p)`` about the centre (the scale of the covariances' rounding)."""
    scale = torch.diagonal(second_moments, dim1=-2, dim2=-1).amax(-1)
    return RANK_ULPS * second_moments.shape[-1] * torch.finfo(second_moments.dtype).eps * scale


def lagged_sequences(x: torch.Tensor, lags: int) -> torch.Tensor:
    """``[x_t, x_{t-1}, ..., x_{t-p}]`` at every step of padded sequences ``x`` ``(B, T, D)``, ``(B, T, D (p + 1))``,
    the frames before a sequence's start zero (a sequence's padding follows its end, so it never enters a lag).

    Examples
    --------
    >>> x = torch.tensor([[[1.0], [2.0], [3.0]]])
    >>> lagged_sequences(x, 2)[0].tolist()
    [[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [3.0, 2.0, 1.0]]
    """
    shifted = [torch.nn.functional.pad(x, (0, 0, lag, 0))[:, : x.shape[1]] for lag in range(lags + 1)]
    return torch.cat(shifted, dim=-1)


class LaggedNormal(dist.TorchDistribution):
    """The density of a frame given the frames before it, on the rows ``[x_t, x_{t-1}, ..., x_{t-p}]``:
    ``N(x_t | weights [x_{t-1}; ...; x_{t-p}] + bias, scale_tril scale_tril^T)`` (the lags are conditioned on, not
    modelled). What the HMM's Pyro program scores each step with.

    Examples
    --------
    >>> d = LaggedNormal(torch.ones(1, 1, 1), torch.zeros(1, 1), torch.ones(1, 1, 1))
    >>> round(float(d.log_prob(torch.tensor([2.0, 2.0]))[0]), 6)  # x_t at its mean, x_{t-1} = 2
    -0.918939
    """

    arg_constraints: ClassVar[dict] = {}
    support = constraints.real_vector

    def __init__(self, weights: torch.Tensor, bias: torch.Tensor, scale_tril: torch.Tensor) -> None:
        self.weights, self.bias, self.scale_tril = weights, bias, scale_tril
        width = bias.shape[-1] + weights.shape[-1]
        super().__init__(bias.shape[:-1], torch.Size([width]), validate_args=False)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        d = self.bias.shape[-1]
        if value.shape[-1] != self.event_shape[0]:
            raise ValueError(_no_sequences(value.shape[-1], d, self.weights.shape[-1] // d))
        x, lags = value[..., :d], value[..., d:]
        loc = (self.weights @ lags.unsqueeze(-1)).squeeze(-1) + self.bias
        return dist.MultivariateNormal(loc, scale_tril=self.scale_tril).log_prob(x)


def _no_sequences(width: int, d: int, lags: int) -> str:
    """The refusal of rows without their previous frames (a mixture's rows, not an HMM's)."""
    return (
        f"the autoregressive family scores each frame with its {lags} previous frame(s) in its sequence, rows of "
        f"{d * (lags + 1)} values for {d} features; got rows of {width}: only a sequence model gives them, use "
        "HMM(emission='autoregressive') (a Mixture has no sequences)"
    )


class AutoRegressiveComponents(ComponentFamily):
    """``K`` linear-Gaussian autoregressions: frame ``x_t`` in state ``k`` is ``N(weights[k] [x_{t-1}; ...;
    x_{t-p}] + bias[k], scale_tril[k] scale_tril[k]^T)``.

    Parameters
    ----------
    weights : Tensor (K, D, D p)
        The lag coefficients; ``weights[k][:, (j - 1) D : j D]`` multiplies ``x_{t-j}``.
    bias : Tensor (K, D)
    scale_tril : Tensor (K, D, D)
        Lower Cholesky factors of the noise covariances (positive diagonal).
    reg_covar : float or Tensor (D,), default 1e-6
        The variance floor of :meth:`fit_statistics` (as :class:`~ppmix.components.FullGaussian`'s).
    diagonal : bool, default False
        Fit diagonal noise covariances.
    centre : Tensor (D,), optional
        The fixed centre ``m`` that :meth:`statistics` subtracts from frames and lags (the training frames' mean;
        zeros when None), so that the normal equations keep their digits in float32 far from the origin.

    Examples
    --------
    >>> comp = AutoRegressiveComponents(torch.zeros(2, 1, 1), torch.zeros(2, 1), torch.ones(2, 1, 1))
    >>> rows = LaggedRows(torch.zeros(3, 1), torch.zeros(3, 1))
    >>> comp.log_prob(rows).shape
    torch.Size([3, 2])
    """

    param_names = ("weights", "bias", "scale_tril")

    def __init__(
        self,
        weights: torch.Tensor,
        bias: torch.Tensor,
        scale_tril: torch.Tensor,
        reg_covar: float | torch.Tensor = 1e-6,
        diagonal: bool = False,
        centre: torch.Tensor | None = None,
    ) -> None:
        weights, bias, scale_tril = torch.as_tensor(weights), torch.as_tensor(bias), torch.as_tensor(scale_tril)
        k, d = bias.shape if bias.dim() == 2 else (0, 0)
        if bias.dim() != 2 or weights.dim() != 3 or weights.shape[:2] != (k, d) or weights.shape[2] % max(d, 1):
            raise ValueError(
                f"weights must be (K, D, D p) and bias (K, D); got {tuple(weights.shape)}, {tuple(bias.shape)}"
            )
        if scale_tril.shape != (k, d, d) or bool((torch.diagonal(scale_tril, dim1=-2, dim2=-1) <= 0).any()):
            raise ValueError(f"scale_tril must be (K, D, D) = ({k}, {d}, {d}) with a positive diagonal")
        self.weights, self.bias, self.scale_tril = weights, bias, scale_tril.tril()
        self.reg_covar, self.diagonal = as_floor(reg_covar), diagonal
        self.centre = torch.zeros(d, dtype=bias.dtype) if centre is None else torch.as_tensor(centre).detach()

    @property
    def n_features(self) -> int:
        return int(self.bias.shape[1])

    @property
    def lags(self) -> int:
        return int(self.weights.shape[2]) // self.n_features

    @property
    def mean(self) -> torch.Tensor:
        """Each state's long-run mean ``(K, D)``: the fixed point ``mu_k = (I - sum_j W_kj)^{-1} b_k`` of its
        recurrence, where a sequence staying in state ``k`` settles (NaN for a state with a unit root).

        Examples
        --------
        >>> comp = AutoRegressiveComponents(torch.full((1, 1, 1), 0.5), torch.ones(1, 1), torch.ones(1, 1, 1))
        >>> comp.mean.tolist()  # x = 0.5 x + 1
        [[2.0]]
        """
        d = self.n_features
        total = self.weights.reshape(-1, d, self.lags, d).sum(2)
        identity = torch.eye(d, dtype=self.dtype, device=self.device)
        mean, info = torch.linalg.solve_ex(identity - total, self.bias)
        return torch.where((info == 0)[:, None], mean, torch.nan)

    @property
    def covariance(self) -> torch.Tensor:
        """The noise covariances ``(K, D, D)``."""
        return self.scale_tril @ self.scale_tril.mT

    def moments(self) -> Moments:
        """Each state's long-run :attr:`mean` and its noise :attr:`covariance`."""
        return Moments(self.mean, self.covariance)

    def as_rows(self, data: LaggedRows | torch.Tensor) -> LaggedRows:
        """``data`` as :class:`LaggedRows` (a tensor: rows ``[x_t, x_{t-1}, ..., x_{t-p}]``)."""
        return data if isinstance(data, LaggedRows) else split_rows(data, self.n_features, self.lags)

    def log_prob(self, data: LaggedRows | torch.Tensor) -> torch.Tensor:
        """``log N(x_t | W_k lags + b_k, Sigma_k)`` of every frame and state, ``(N, K)``."""
        rows = self.as_rows(data)
        frames, lags = rows.frames.to(self.dtype), rows.lags.to(self.dtype)
        loc = torch.einsum("np,kdp->nkd", lags, self.weights) + self.bias
        residual = (frames[:, None, :] - loc).permute(1, 2, 0)  # (K, D, N)
        whitened = torch.linalg.solve_triangular(self.scale_tril, residual, upper=False)
        log_det = torch.diagonal(self.scale_tril, dim1=-2, dim2=-1).log().sum(-1)
        constant = 0.5 * self.n_features * math.log(2 * math.pi) + log_det
        return -0.5 * whitened.square().sum(1).T - constant

    def statistics(self, data: LaggedRows | torch.Tensor, weights: torch.Tensor) -> RegressionStatistics:
        """The weighted cross-products of ``[x_t - m; lags - m; 1]`` per state, ``m`` the fixed :attr:`centre`
        (mergeable across shards)."""
        rows = self.as_rows(data)
        weights = self._check_weights(weights, rows.frames.shape[0])
        centre = self.centre.to(dtype=self.dtype, device=self.device)
        frames, lags = rows.frames.to(self.dtype) - centre, rows.lags.to(self.dtype) - centre.repeat(self.lags)
        u = torch.cat([frames, LaggedRows(frames, lags).design()], dim=1)
        moments = torch.einsum("nk,ni,nj->kij", weights, u, u)
        return RegressionStatistics(weights.sum(0), moments)

    def fit_statistics(self, stats: RegressionStatistics) -> "AutoRegressiveComponents":
        """Weighted least squares per state, in place, on every device: ``W_k = C_xz C_zz^+`` from the state's
        weighted covariances of frames and lags (the minimum-norm weights where the lags are collinear, e.g. a lag
        that is always before its sequence's start; zero for a state without weight), ``b_k`` the state's mean
        frame less ``W_k`` times its mean lags, ``Sigma_k`` the weighted residual covariance above the floor.

        Raises
        ------
        ValueError
            If a covariance is not positive definite even under the floor ``reg_covar``.
        """
        stats = stats.to(dtype=self.dtype, device=self.device)
        d, counts = self.n_features, padded_counts(stats.counts)[:, None, None]
        mean = stats.moments[:, :-1, -1:] / counts  # (K, D + D p, 1): the state's means about the centre
        cov = stats.moments[:, :-1, :-1] / counts - mean @ mean.mT
        c_xx, c_zx, c_zz = cov[:, :d, :d], cov[:, d:, :d], cov[:, d:, d:]
        coef = torch.linalg.pinv(c_zz, atol=_rank_tolerance(stats.moments[:, d:-1, d:-1] / counts), hermitian=True)
        coef = coef @ c_zx  # (K, D p, D)
        cross = coef.mT @ c_zx
        residual = c_xx - cross - cross.mT + coef.mT @ c_zz @ coef
        centre = self.centre.to(dtype=self.dtype, device=self.device)
        shift = centre - centre.repeat(self.lags) @ coef  # undo the centring: b = b' + m - sum_j W_j m
        self.weights = coef.mT.contiguous()
        self.bias = (mean[:, :d, 0] - (coef.mT @ mean[:, d:]).squeeze(-1) + shift).contiguous()
        self.scale_tril = self._factors(0.5 * (residual + residual.mT))
        return self

    def _factors(self, covs: torch.Tensor) -> torch.Tensor:
        """Cholesky factors of the covariances ``covs`` ``(K, D, D)`` raised to the floor (diagonal: their
        variances)."""
        if not self.diagonal:
            return checked_cholesky(floored_covariance(covs, self.reg_covar))
        floor = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device)
        variances = torch.maximum(torch.diagonal(covs, dim1=-2, dim2=-1), floor)
        return torch.diag_embed(variances.sqrt())

    def pyro_dist(self, index: torch.Tensor | None = None) -> LaggedNormal:
        """:class:`LaggedNormal` of the states ``index`` (all when None), scoring rows ``[x_t, lags]``."""
        if index is None:
            return LaggedNormal(self.weights, self.bias, self.scale_tril)
        return LaggedNormal(self.weights[index], self.bias[index], self.scale_tril[index])

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A sequence's first frame (every lag zero) from state ``index[i]`` for every ``i``, ``index.shape + (D,)``;
        :meth:`sample_paths` draws whole sequences."""
        return self.sample_paths(index.reshape(-1, 1), generator).reshape(*index.shape, self.n_features)

    def sample_paths(self, paths: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sequences along state paths ``(n, T)``, frame by frame from the frames drawn before, ``(n, T, D)``.

        Examples
        --------
        >>> comp = AutoRegressiveComponents(torch.ones(1, 1, 1), torch.ones(1, 1), torch.full((1, 1, 1), 1e-9))
        >>> comp.sample_paths(torch.zeros(1, 3, dtype=torch.long)).round().tolist()  # x_t = x_{t-1} + 1
        [[[1.0], [2.0], [3.0]]]
        """
        n, steps = paths.shape
        d = self.n_features
        paths = paths.to(self.device)
        noise = torch.randn((n, steps, d, 1), generator=generator, dtype=self.dtype, device=self.device)
        lags = torch.zeros(n, d * self.lags, dtype=self.dtype, device=self.device)
        frames = []
        for t in range(steps):
            z = paths[:, t]
            x = (self.weights[z] @ lags[:, :, None] + self.scale_tril[z] @ noise[:, t]).squeeze(-1) + self.bias[z]
            frames.append(x)
            lags = torch.cat([x, lags[:, : d * (self.lags - 1)]], dim=1)
        return torch.stack(frames, dim=1)


class AutoRegressiveFamily(DensityFamily):
    """Linear-Gaussian autoregressive emissions of ``lags`` frames, for :class:`~ppmix.models.hmm.HMM`.

    Frame ``x_t`` in state ``k`` is ``N(W_k [x_{t-1}; ...; x_{t-p}] + b_k, Sigma_k)``, the frames before a
    sequence's start zero (dynamax's convention): each sequence's first ``p`` frames regress on zero lags, which
    biases ``W`` for sequences far from zero mean (true ``W = 0.8``: fitted 0.58 at an offset of 10, 0.04 at an
    offset of 100), so centre your sequences (subtract their mean, e.g. the training frames') before fitting.

    Sites: ``weights`` ``(D, D p)``, ``bias`` ``(D,)``, ``scales`` ``(D,)`` and, for full covariances,
    ``corr_cholesky`` ``(D, D)``. MCMC's weak priors: ``weights ~ N(0, sd_i / sd_j)`` (output ``i``,
    lagged feature ``j``), ``bias ~ N(0, 3 (|mean| + sd))``, and the noise's as the Gaussian family's.

    Parameters
    ----------
    lags : int, default 1
        The number of previous frames ``p`` each frame regresses on.
    covariance_type : {"full", "diag"}, default "full"
    reg_covar : float, default 1e-6
        The variance floor relative to the squared robust spread of the first differences ``x_t - x_{t-1}``
        (:func:`innovation_floor`; ``reg_covar`` itself for a feature whose steps are constant up to rounding),
        as an HMM measures it on its training sequences (:meth:`sequence_scale`).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import HMM
    >>> rng = np.random.default_rng(0)
    >>> seqs = [np.cumsum(rng.normal(size=(60, 1)), axis=0) for _ in range(4)]  # random walks
    >>> hmm = HMM(1, emission=AutoRegressiveFamily(lags=1), seed=0, progress=False).fit(seqs)
    >>> hmm.components_.weights.shape, round(float(hmm.components_.weights[0, 0, 0]), 1)
    (torch.Size([1, 1, 1]), 1.0)
    """

    name = "autoregressive"
    components_class = AutoRegressiveComponents

    def __init__(self, lags: int = 1, covariance_type: str = "full", reg_covar: float = 1e-6) -> None:
        self.lags, self.covariance_type, self.reg_covar = lags, covariance_type, reg_covar
        self._n_features: int | None = None
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        check_positive_int(self.lags, "lags")
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(
                f"covariance_type must be one of {COVARIANCE_TYPES} for autoregressive emissions; got "
                f"{self.covariance_type!r}"
            )
        self._noise()  # whose constructor checks reg_covar

    def _noise(self) -> GaussianFamily:
        """The Gaussian family of the noise: its data scale (variance floor) and its priors."""
        return GaussianFamily(self.covariance_type, self.reg_covar)

    def measured(self, scale: DataScale) -> "AutoRegressiveFamily":
        """The family knowing the frames' number of features (the length of the scale's ``floor``), so that
        :meth:`prepare` refuses rows without their lags."""
        family = copy.copy(self)
        family._n_features = int(scale["floor"].shape[0]) if "floor" in scale else None
        return family

    # ---------------------------------------------------------------------- data
    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        self._noise().check_data(x, name)

    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """The frames' Gaussian data scale (frames counted ``weight`` ``(N,)`` times each where given): means,
        standard deviations and the variance floor (which :meth:`sequence_scale` replaces by that of the steps where
        the frames come in sequences)."""
        return self._noise().data_scale(x, name, weight)

    def sequence_scale(self, rows: torch.Tensor, weight: torch.Tensor | None = None) -> DataScale:
        """What the HMM measures on the step rows ``[x_t, x_{t-1}, ..., x_{t-p}]`` ``(N, D (p + 1))`` (rows counted
        ``weight`` ``(N,)`` times, once when None) besides the frames' :meth:`data_scale`: the variance ``floor`` of
        the steps ``x_t - x_{t-1}`` (:func:`innovation_floor`), the noise's scale rather than the frames' level."""
        d = rows.shape[1] // (int(self.lags) + 1)
        return {"floor": innovation_floor(rows[:, :d] - rows[:, d : 2 * d], self.reg_covar, weight)}

    def sequence_rows(self, x: torch.Tensor) -> torch.Tensor:
        """What the HMM asks of a family whose frames depend on the frames before: every step's row ``[x_t,
        x_{t-1}, ..., x_{t-p}]`` of padded sequences ``x`` ``(B, T, D)`` (:func:`lagged_sequences`)."""
        return lagged_sequences(x, int(self.lags))

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> LaggedRows:
        """Rows ``[x_t, x_{t-1}, ..., x_{t-p}]`` (:meth:`sequence_rows`) split into frames and lags; rows of another
        width (a mixture's frames, which have no lags) are refused."""
        d = self._n_features if components is None else components.n_features
        d = x.shape[1] // (self.lags + 1) if d is None else d
        return split_rows(x, d, int(self.lags))

    # ----------------------------------------------------------- the components
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        sites = {
            # the columns are the lagged features, D p of them
            "weights": SiteSpec(constraints.real, (d, d * self.lags), dims=("feature", "lagged_feature")),
            "bias": SiteSpec(constraints.real, (d,)),
            "scales": SiteSpec(constraints.positive, (d,)),
        }
        if self.covariance_type == "full":
            sites["corr_cholesky"] = SiteSpec(constraints.corr_cholesky, (d, d))
        return sites

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> ComponentFamily:
        """The components of the site values, with the training data's variance floor (else ``reg_covar``) and
        mean (the centre of the lagged frames)."""
        scales = values["scales"]
        diagonal = self.covariance_type == "diag"
        if diagonal:
            tril = torch.diag_embed(scales)
        else:
            corr = values["corr_cholesky"]
            tril = scales[..., None] * corr / corr.norm(dim=-1, keepdim=True)
        floor = as_floor(scale.get("floor", self.reg_covar))
        return AutoRegressiveComponents(
            values["weights"], values["bias"], tril, reg_covar=floor, diagonal=diagonal, centre=scale.get("mean")
        )

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        tril = components.scale_tril
        scales = tril.square().sum(-1).sqrt()
        values = {"weights": components.weights.clone(), "bias": components.bias.clone(), "scales": scales}
        if self.covariance_type == "full":
            values["corr_cholesky"] = tril / scales[..., None]
        return values

    def priors(self) -> "AutoRegressivePriors":
        return AutoRegressivePriors(self)


class AutoRegressivePriors(FamilyPriors):
    """The priors of :class:`AutoRegressiveFamily` (its :meth:`~AutoRegressiveFamily.priors`)."""

    family: AutoRegressiveFamily

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        mean = scale.get("mean", torch.zeros(d)).to(**opts)
        std = scale.get("std", torch.ones(d)).to(**opts)
        if site == "weights":
            ratio = std[:, None] / std.repeat(self.family.lags)[None, :]
            return dist.Normal(torch.zeros_like(ratio), ratio).to_event(2)
        if site == "bias":
            return dist.Normal(torch.zeros_like(mean), 3.0 * (mean.abs() + std)).to_event(1)
        return self.family._noise().priors().prior(site, k, d, scale, opts)
