"""Full-covariance Gaussian components (Cholesky parametrisation)."""

from __future__ import annotations

import functools
import math

import pyro.distributions as dist
import torch

from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.centred import (
    CentredData,
    as_centred,
    as_floor,
    blocked_log_density,
    cancellation_tol,
    component_counts,
    expansion_rounding,
    fused_block_sums,
    fused_expected_sums,
    inexact_spreads,
    padded_counts,
    upper_triangle,
)
from ppmix.components.divergence import register_kl
from ppmix.components.gaussian_statistics import GaussianStatistics

__all__ = ["FullGaussian", "TiedGaussian"]

_BLOCK_ROWS = 8192
#: bytes of 64 rows of the ``[x, x x^T]`` design beyond which (D above about 360 in float64) the
#: exponential-family path gives way to whitening, whose rows are ``K D`` wide instead
MOMENTS_BUDGET_BYTES = 64 * 2**20


class FullGaussian(ComponentFamily):
    """``K`` Gaussians with full covariance ``scale_tril[k] @ scale_tril[k].T``.

    Parameters
    ----------
    loc : Tensor, shape (K, D)
    scale_tril : Tensor, shape (K, D, D)
        Lower Cholesky factors of the covariances (positive diagonal).
    reg_covar : float or Tensor of shape (D,), default 1e-6
        The covariance floor of :meth:`fit`: every fitted covariance satisfies
        ``Sigma >= F`` with ``F = diag(reg_covar)`` (a scalar is ``reg_covar * I``); :meth:`fit`
        returns the weighted maximum-likelihood estimate under that constraint (the weighted
        covariance with its eigenvalues, in coordinates scaled by ``F^{-1/2}``, clamped at 1).

    Examples
    --------
    >>> import torch
    >>> comp = FullGaussian(torch.zeros(2, 3), torch.eye(3).expand(2, 3, 3))
    >>> comp.log_prob(torch.randn(4, 3)).shape
    torch.Size([4, 2])
    """

    param_names = ("loc", "scale_tril")

    def __init__(self, loc: torch.Tensor, scale_tril: torch.Tensor, reg_covar: float | torch.Tensor = 1e-6) -> None:
        loc, scale_tril = torch.as_tensor(loc), torch.as_tensor(scale_tril)
        if loc.dim() != 2 or scale_tril.shape != (*loc.shape, loc.shape[1]):
            raise ValueError(
                f"loc must be (K, D) and scale_tril (K, D, D); got {tuple(loc.shape)}, {tuple(scale_tril.shape)}"
            )
        if (torch.diagonal(scale_tril, dim1=-2, dim2=-1) <= 0).any():
            raise ValueError("scale_tril must have a positive diagonal")
        self.loc, self.scale_tril, self.reg_covar = loc, scale_tril.tril(), as_floor(reg_covar)

    @property
    def n_features(self) -> int:
        return int(self.loc.shape[1])

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def covariance(self) -> torch.Tensor:
        return self.scale_tril @ self.scale_tril.mT

    def moments(self) -> Moments:
        return Moments(self.loc, self.covariance)

    @property
    def reference(self) -> torch.Tensor:
        """The centre :meth:`log_prob` uses for a plain tensor: the mean of the component means,
        so that a row's log-density depends on that row and the parameters only."""
        return self.loc.mean(dim=0)

    def prepare(self, x: torch.Tensor) -> CentredData:
        """Prepare ``x`` once for many :meth:`log_prob`/:meth:`fit` calls (centred at its column mean)."""
        return as_centred(x, self.dtype, self.device)

    def _use_moments(self, data: CentredData) -> bool:
        d = self.n_features
        return 64 * (d + d * (d + 1) // 2) * data.centred.element_size() <= MOMENTS_BUDGET_BYTES

    def log_prob(self, data: torch.Tensor | CentredData) -> torch.Tensor:
        """Log-density of every point under every component, shape ``(N, K)``.

        When the cached design ``[x, x x^T]`` fits in :data:`MOMENTS_BUDGET_BYTES` (and its
        rounding stays below :func:`~ppmix.components.centred.cancellation_tol`) this is
        one matrix product with the natural parameters ``(P mu, -P/2)``;
        otherwise all components are whitened with one product
        ``x @ [L_1^{-T}, ..., L_K^{-T}]`` per block of rows. A plain tensor is centred at
        :attr:`reference`.
        """
        data = as_centred(data, self.dtype, self.device, shift=self.reference)
        if self._use_moments(data):
            return self._log_prob_natural(data)
        return self._log_prob_whitened(data)

    def _natural(self, data: CentredData) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Natural parameters ``(K, D + T)`` (``P mu`` and the upper triangle of ``-P/2``) and constants
        ``(K, 1)`` of the log-density of ``[x, x x^T]`` about ``data.shift``; ``None`` where the product
        would cancel terms whose rounding exceeds ``cancellation_tol`` nats (a component collapsed at the
        floor: whiten instead)."""
        d = self.n_features
        precision = self._precisions()
        loc_c = self.loc - data.shift
        sd = torch.linalg.vector_norm(self.scale_tril, dim=-1)  # each feature's standard deviation
        linear = (precision @ loc_c.unsqueeze(-1)).squeeze(-1)  # (K, D)
        if bool((expansion_rounding(loc_c, precision, sd, linear) > cancellation_tol(self.dtype)).any()):
            return None
        rows, cols = upper_triangle(d, self.device)
        quadratic = precision[:, rows, cols] * _pair_weights(d, self.device, self.dtype)  # (K, T)
        log_det = torch.diagonal(self.scale_tril, dim1=-2, dim2=-1).log().sum(dim=-1)
        const = -0.5 * (d * math.log(2 * math.pi) + (loc_c * linear).sum(-1)) - log_det
        return torch.cat([linear, quadratic], dim=1), const[:, None]

    def _precisions(self) -> torch.Tensor:
        """The components' precisions ``(L L^T)^{-1} = L^{-T} L^{-1}`` ``(K, D, D)``, from their Cholesky factors."""
        return _precisions_of(self.scale_tril)

    def _log_prob_natural(self, data: CentredData) -> torch.Tensor:
        natural = self._natural(data)
        if natural is None:
            return self._log_prob_whitened(data)
        return blocked_log_density(data, *natural, outer=True)

    def _expected_statistics(
        self,
        data: torch.Tensor | CentredData,
        log_weights: torch.Tensor,
        row_weights: torch.Tensor | None = None,
    ) -> tuple[GaussianStatistics, torch.Tensor]:
        """One fused E-step pass: the statistics of :meth:`statistics` under the responsibilities
        ``r_nk ∝ weights_k N(x_n | k)`` and the log-likelihood ``sum_n log sum_k weights_k N(x_n | k)``
        (each row counted ``row_weights[n]`` times where given).

        Per block of rows: the log-densities as one product of the natural parameters with
        ``[x, x x^T]``, their normalisation and the block's weighted sums for the M-step, while
        the block is in cache. Equal to ``statistics(data, softmax(log_prob(data) + log_weights))``
        (the base class's two passes, which it falls back to where rounding calls for the whitened or
        direct formulas).

        Examples
        --------
        >>> eye = torch.eye(2, dtype=torch.float64)
        >>> comp = FullGaussian(torch.zeros(2, 2, dtype=torch.float64), eye.expand(2, 2, 2))
        >>> comp.loc[1] = 3.0
        >>> x = torch.tensor([[0.1, 0.2], [2.9, 3.3], [3.2, 2.7]], dtype=torch.float64)
        >>> log_w = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
        >>> stats, log_lik = comp._expected_statistics(x, log_w)
        >>> resp = torch.softmax(comp.log_prob(x) + log_w, dim=1)
        >>> bool(torch.allclose(stats.scatter, comp.statistics(x, resp).scatter))
        True
        """
        data = as_centred(data, self.dtype, self.device)
        log_weights = log_weights.to(dtype=self.dtype, device=self.device)
        if row_weights is not None:
            row_weights = row_weights.to(dtype=self.dtype, device=self.device)
        natural = self._natural(data) if self._use_moments(data) else None
        if natural is not None:
            weights, const = natural
            totals, sums, log_likelihood = fused_expected_sums(
                data, weights, const + log_weights[:, None], outer=True, row_weights=row_weights
            )
            counts = padded_counts(totals)
            mean_c, covs, inexact = self._covariances_from_sums(counts, sums)
            if not inexact:
                return GaussianStatistics(totals, mean_c + data.shift, covs * counts[:, None, None]), log_likelihood
        return super()._expected_statistics(data, log_weights, row_weights)

    def _covariances_from_sums(
        self, counts: torch.Tensor, sums: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Means about the centre and covariances from the weighted sums of ``[x, x x^T]`` ``(K, D + T)``
        and the (padded) counts, with :meth:`_covariances_from_second`'s inexact components."""
        k, d = self.loc.shape
        sums = sums / counts[:, None]
        mean_c = sums[:, :d]
        rows, cols = upper_triangle(d, self.device)
        second = torch.zeros(k, d, d, dtype=self.dtype, device=self.device)
        second[:, rows, cols] = sums[:, d:]
        second[:, cols, rows] = sums[:, d:]
        return (mean_c, *self._covariances_from_second(mean_c, second))

    def _covariances_from_second(self, mean_c: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Covariances from the weighted means and second moments about the centre, and the components
        whose covariance lost more than ``cancellation_tol`` of its digits to the subtraction."""
        d = self.n_features
        covs = second - mean_c[:, :, None] * mean_c[:, None, :]
        floor_trace = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device).expand(d).sum()
        traces = torch.diagonal(second, dim1=-2, dim2=-1).sum(-1)
        spreads = torch.diagonal(covs, dim1=-2, dim2=-1).sum(-1).clamp_min(0.0)
        return covs, inexact_spreads(traces, torch.maximum(spreads, floor_trace))

    def _log_prob_whitened(self, data: CentredData) -> torch.Tensor:
        k, d = self.loc.shape
        eye = torch.eye(d, dtype=self.dtype, device=self.device).expand(k, d, d)
        inv_tril = torch.linalg.solve_triangular(self.scale_tril, eye, upper=False)  # L^{-1}
        whiten = inv_tril.mT  # (K, D, D): y = (x - mu) @ L^{-T}
        weights = whiten.permute(1, 0, 2).reshape(d, k * d)
        offset = torch.einsum("kd,kde->ke", self.loc - data.shift, whiten).reshape(k * d)
        # row blocks keep the (rows, K*D) temporary in cache instead of an N x K*D array; out of place, so autograd
        # differentiates it (NUTS's potential, :mod:`ppmix.engines.potential`)
        blocks = [
            torch.addmm(offset, data.centred[start : start + _BLOCK_ROWS], weights, beta=-1)
            .square()
            .view(-1, k, d)
            .sum(-1)
            for start in range(0, data.n_samples, _BLOCK_ROWS)
        ]
        maha = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
        log_det = torch.diagonal(self.scale_tril, dim1=-2, dim2=-1).log().sum(dim=-1)
        return maha * -0.5 - (0.5 * d * math.log(2 * math.pi) + log_det)

    def fit(self, data: torch.Tensor | CentredData, weights: torch.Tensor) -> "FullGaussian":
        """Weighted maximum-likelihood update (closed form), in place: ``fit_statistics(statistics(data, weights))``.

        Raises
        ------
        ValueError
            If a covariance is not positive definite even under the floor ``reg_covar``.
        """
        return self.fit_statistics(self.statistics(data, weights))

    def statistics(self, data: torch.Tensor | CentredData, weights: torch.Tensor) -> GaussianStatistics:
        """Total weight, weighted mean and weighted scatter matrix ``(K, D, D)`` of every component
        (what :meth:`fit_statistics` needs; mergeable across shards).

        Examples
        --------
        >>> comp = FullGaussian(torch.zeros(1, 2, dtype=torch.float64), torch.eye(2, dtype=torch.float64)[None])
        >>> x = torch.tensor([[0.0, 1.0], [2.0, 0.0], [4.0, 4.0]], dtype=torch.float64)
        >>> ones = torch.ones(3, 1, dtype=torch.float64)
        >>> merged = comp.statistics(x[:1], ones[:1]).merge(comp.statistics(x[1:], ones[1:]))
        >>> bool(torch.allclose(comp.fit_statistics(merged).covariance, comp.fit(x, ones).covariance))
        True
        """
        data = as_centred(data, self.dtype, self.device)
        weights = self._check_weights(weights, data.n_samples)
        counts = component_counts(weights)
        k, d = self.loc.shape
        if self._use_moments(data):
            sums = weights.new_zeros(k, d + d * (d + 1) // 2)
            for rows, design in data.moment_blocks(outer=True):
                sums.addmm_(weights[rows].T, design)
            mean_c, covs, inexact = self._covariances_from_sums(counts, sums)
        else:
            mean_c = (weights.T @ data.centred) / counts[:, None]
            second = (
                torch.stack([(weights[:, j, None] * data.centred).T @ data.centred for j in range(k)])
                / counts[:, None, None]
            )
            covs, inexact = self._covariances_from_second(mean_c, second)
        # a component far from the centre (or collapsed) cancels its digits away: sum its deviations directly
        for j in inexact:
            deviation = data.centred - mean_c[j]
            covs[j] = (weights[:, j, None] * deviation).T @ deviation / counts[j]
        return GaussianStatistics(weights.sum(0), mean_c + data.shift, covs * counts[:, None, None])

    def fit_statistics(self, stats: GaussianStatistics) -> "FullGaussian":
        """The weighted maximum-likelihood update from :meth:`statistics` (of one or many shards), in place.

        Raises
        ------
        ValueError
            If a covariance is not positive definite even under the floor ``reg_covar``.
        """
        stats = stats.to(dtype=self.dtype, device=self.device)
        self.loc, self.scale_tril = stats.mean, self._fitted_factors(stats)
        return self

    def _fitted_factors(self, stats: GaussianStatistics) -> torch.Tensor:
        """The Cholesky factors ``(K, D, D)`` of the floored weighted covariances: each component's scatter over
        its weight."""
        covs = stats.scatter / padded_counts(stats.counts)[:, None, None]
        return checked_cholesky(floored_covariance(covs, self.reg_covar))

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``MultivariateNormal(loc[index], scale_tril=scale_tril[index])``."""
        if index is None:
            return dist.MultivariateNormal(self.loc, scale_tril=self.scale_tril)
        return dist.MultivariateNormal(self.loc[index], scale_tril=self.scale_tril[index])

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One draw from component ``index[i]`` for every ``i``; shape ``index.shape + (D,)``."""
        noise = torch.randn((*index.shape, self.n_features), generator=generator, dtype=self.dtype, device=self.device)
        return self.loc[index] + (self.scale_tril[index] @ noise.unsqueeze(-1)).squeeze(-1)


@register_kl(FullGaussian, FullGaussian)
def _kl_full_gaussian(p: FullGaussian, q: FullGaussian) -> torch.Tensor:
    """``KL(p[k] || q[l])`` for every pair, shape ``(K, K')``."""
    d = p.n_features
    lp = p.scale_tril[:, None]  # (K, 1, D, D)
    lq = q.scale_tril[None, :]  # (1, K', D, D)
    m = torch.linalg.solve_triangular(lq, lp.expand(-1, lq.shape[1], -1, -1), upper=False)
    trace = m.square().sum(dim=(-2, -1))
    diff = (q.loc[None, :, :] - p.loc[:, None, :]).unsqueeze(-1)
    maha = torch.linalg.solve_triangular(lq, diff, upper=False).square().sum(dim=(-2, -1))
    logdet_p = torch.diagonal(p.scale_tril, dim1=-2, dim2=-1).log().sum(-1)[:, None]
    logdet_q = torch.diagonal(q.scale_tril, dim1=-2, dim2=-1).log().sum(-1)[None, :]
    return 0.5 * (trace + maha - d) + logdet_q - logdet_p


def _precisions_of(scale_tril: torch.Tensor) -> torch.Tensor:
    """``L^{-T} L^{-1}`` for Cholesky factors ``L`` ``(K, D, D)``: the precisions, by triangular solves."""
    d = scale_tril.shape[-1]
    eye = torch.eye(d, dtype=scale_tril.dtype, device=scale_tril.device).expand_as(scale_tril)
    inv_tril = torch.linalg.solve_triangular(scale_tril, eye, upper=False)
    return inv_tril.mT @ inv_tril


@functools.lru_cache(maxsize=64)
def _pair_weights(d: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The weights of the upper triangle's entries of ``-P/2`` in ``x^T (-P/2) x``: ``-1/2`` on the diagonal, ``-1``
    off it (the pair counted twice), in :func:`~ppmix.components.centred.upper_triangle`'s order (made once per size,
    as an ordinary tensor even under ``torch.inference_mode``; not to be written to)."""
    rows, cols = upper_triangle(d, device)
    with torch.inference_mode(False):
        return (-0.5 * torch.where(rows == cols, 1.0, 2.0)).to(dtype)


def floored_covariance(covs: torch.Tensor, floor: float | torch.Tensor) -> torch.Tensor:
    """The maximiser of the Gaussian likelihood with sample covariance ``covs`` over ``{Sigma >= F}``.

    With ``F = diag(floor)`` the problem is, in coordinates ``y = F^{-1/2} x``, that of the
    floor ``I``, whose solution keeps the eigenvectors of ``F^{-1/2} covs F^{-1/2}`` and
    raises its eigenvalues below 1 to 1. A zero floor returns ``covs`` unchanged, and so does a covariance
    above the floor, which a Cholesky factorisation of ``F^{-1/2} covs F^{-1/2} - I`` tells at a fraction of
    an eigendecomposition's cost.

    Parameters
    ----------
    covs : Tensor, shape (K, D, D)
        Weighted (symmetric, positive semi-definite) sample covariances.
    floor : float or Tensor of shape (D,)
        The variance floor ``reg_covar`` (non-negative).

    Returns
    -------
    Tensor, shape (K, D, D)

    Examples
    --------
    >>> floored_covariance(torch.zeros(1, 2, 2, dtype=torch.float64), 0.5).squeeze(0).round(decimals=12).tolist()
    [[0.5, 0.0], [0.0, 0.5]]
    """
    root = torch.as_tensor(floor, dtype=covs.dtype, device=covs.device).sqrt().expand(covs.shape[-1])
    if not bool((root > 0).all()):
        return covs
    scaled = covs / (root[:, None] * root[None, :])
    scaled = 0.5 * (scaled + scaled.mT)
    identity = torch.eye(scaled.shape[-1], dtype=scaled.dtype, device=scaled.device)
    if not bool(torch.linalg.cholesky_ex(scaled - identity).info.any()):  # every eigenvalue above 1: no clamping
        return covs
    eigenvalues, vectors = torch.linalg.eigh(scaled)
    if bool((eigenvalues >= 1.0).all()):
        return covs
    clamped = (vectors * eigenvalues.clamp_min(1.0)[..., None, :]) @ vectors.mT
    return clamped * (root[:, None] * root[None, :])


def checked_cholesky(covs: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factors ``(K, D, D)`` of the fitted covariances ``covs``, refusing any that is not
    (numerically) positive definite: a failed factorisation or a pivot at rounding level.

    Raises
    ------
    ValueError
        Naming the components whose covariance is singular, and ``reg_covar``.

    Examples
    --------
    >>> checked_cholesky(torch.tensor([[[4.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)).tolist()
    [[[2.0, 0.0], [0.0, 1.0]]]
    >>> checked_cholesky(torch.ones(1, 2, 2, dtype=torch.float64))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: covariance of component(s) [0] is not positive definite; increase reg_covar ...
    """
    tril, info = torch.linalg.cholesky_ex(covs)
    # a pivot at rounding level means a (numerically) singular covariance, too
    scale = torch.diagonal(covs, dim1=-2, dim2=-1).amax(-1)
    tiny = 1e-2 * torch.finfo(covs.dtype).eps * scale
    singular = (info > 0) | (torch.diagonal(tril, dim1=-2, dim2=-1).square() <= tiny[:, None]).any(-1)
    if singular.any():
        bad = torch.nonzero(singular).flatten().tolist()
        raise ValueError(
            f"covariance of component(s) {bad} is not positive definite; increase reg_covar or reduce n_components"
        )
    return tril


class TiedGaussian(FullGaussian):
    """``K`` Gaussians sharing one full covariance: ``x | k ~ N(loc[k], Sigma)``.

    A :class:`FullGaussian` whose M-step pools the components' scatters: ``Sigma = sum_k scatter_k / sum_k
    n_k``, the weighted maximum-likelihood estimate of a shared covariance (scikit-learn's and hmmlearn's
    ``covariance_type="tied"``), under the same floor. The state is the full one (``scale_tril`` ``(K, D, D)``,
    the same matrix for every component), so every full-covariance pass serves it unchanged.

    Examples
    --------
    >>> f64 = torch.float64
    >>> comp = TiedGaussian(torch.zeros(2, 1, dtype=f64), torch.ones(2, 1, 1, dtype=f64), reg_covar=0.0)
    >>> x = torch.tensor([[-1.0], [1.0], [9.0], [11.0]], dtype=f64)
    >>> hard = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=f64)
    >>> [round(v, 12) for v in comp.fit(x, hard).covariance[:, 0, 0].tolist()]  # the scatter, 2 + 2, over 4 points
    [1.0, 1.0]
    """

    def _expected_statistics(
        self,
        data: torch.Tensor | CentredData,
        log_weights: torch.Tensor,
        row_weights: torch.Tensor | None = None,
    ) -> tuple[GaussianStatistics, torch.Tensor]:
        """One fused E-step pass, as :meth:`FullGaussian._expected_statistics`, in ``D`` columns, not ``D + D(D+1)/2``.

        With one precision ``P`` for all components, ``x^T P x / 2`` is the same in every component's log-density:
        the responsibilities need only ``log w_k + const_k + (P mu_k) . x`` (one ``(K, D)`` by ``(D, N)`` product),
        the log-likelihood takes the shared term as ``tr(P S) / 2`` with ``S = sum_n x_n x_n^T`` (about the centre,
        rows weighted), and the M-step needs only the weighted means and ``S``: the pooled scatter is
        ``S - sum_k n_k mu_k mu_k^T`` (:meth:`_pooled_statistics`). Falls back to the full path where the rounding
        calls for it.

        Examples
        --------
        >>> f64 = torch.float64
        >>> eye = torch.eye(2, dtype=f64).expand(2, 2, 2)
        >>> comp = TiedGaussian(torch.tensor([[0.0, 0.0], [3.0, 3.0]], dtype=f64), eye)
        >>> x = torch.tensor([[0.1, 0.2], [2.9, 3.3], [3.2, 2.7], [0.4, -0.3]], dtype=f64)
        >>> log_w = torch.tensor([0.5, 0.5], dtype=f64).log()
        >>> stats, log_lik = comp._expected_statistics(x, log_w)
        >>> full_stats, full_log_lik = FullGaussian._expected_statistics(comp, x, log_w)
        >>> bool(torch.allclose(log_lik, full_log_lik)), bool(torch.allclose(stats.mean, full_stats.mean))
        (True, True)
        >>> bool(torch.allclose(stats.scatter.sum(0), full_stats.scatter.sum(0)))
        True
        """
        data = as_centred(data, self.dtype, self.device)
        log_weights = log_weights.to(dtype=self.dtype, device=self.device)
        if row_weights is not None:
            row_weights = row_weights.to(dtype=self.dtype, device=self.device)
        natural = self._linear_natural(data)
        if natural is not None:
            linear, const, precision = natural
            totals, sums, log_likelihood = fused_block_sums(
                data.row_blocks(), linear, const + log_weights[:, None], row_weights
            )
            second = self._second_moment(data, row_weights)
            stats = self._pooled_statistics(data, totals, sums, second)
            if stats is not None:
                return stats, log_likelihood - 0.5 * (precision * second).sum()
        return super()._expected_statistics(data, log_weights, row_weights)

    def _linear_natural(self, data: CentredData) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``P mu_k`` ``(K, D)``, the constants ``(K, 1)`` of the log-densities less their shared ``-x^T P x / 2``
        (about ``data.shift``), and ``P`` ``(D, D)``; ``None`` where the expansion's rounding exceeds
        ``cancellation_tol`` nats (as for :meth:`FullGaussian._natural`)."""
        d = self.n_features
        precision = self._precisions()
        loc_c = self.loc - data.shift
        linear = loc_c @ precision[0]  # P symmetric: (P mu_k)^T = mu_k^T P
        sd = torch.linalg.vector_norm(self.scale_tril[:1], dim=-1).expand_as(loc_c)
        if bool((expansion_rounding(loc_c, precision, sd, linear) > cancellation_tol(self.dtype)).any()):
            return None
        log_det = torch.diagonal(self.scale_tril[0]).log().sum()
        const = -0.5 * (d * math.log(2 * math.pi) + (loc_c * linear).sum(-1)) - log_det
        return linear, const[:, None], precision[0]

    @staticmethod
    def _second_moment(data: CentredData, row_weights: torch.Tensor | None) -> torch.Tensor:
        """``sum_n w_n x_n x_n^T`` about the centre ``(D, D)`` (``w_n`` the row weights, or 1)."""
        centred = data.centred
        weighted = centred if row_weights is None else centred * row_weights[:, None]
        return weighted.T @ centred

    def _pooled_statistics(
        self, data: CentredData, totals: torch.Tensor, sums: torch.Tensor, second: torch.Tensor
    ) -> GaussianStatistics | None:
        """The statistics of the weighted sums ``(K, D)`` of the centred rows, their totals ``(K,)`` and the rows'
        second moment ``(D, D)``: each component's scatter is its share ``n_k / n`` of the pooled one (the pooled
        scatter, their sum, is all the tied M-step reads); ``None`` where the subtraction lost more than
        ``cancellation_tol`` of its digits (the caller takes the full path)."""
        counts = padded_counts(totals)
        mean_c = sums / counts[:, None]
        pooled = second - (counts[:, None] * mean_c).T @ mean_c
        floor_trace = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device).expand(self.n_features)
        spread = torch.maximum(torch.trace(pooled).clamp_min(0.0), floor_trace.sum() * counts.sum())
        if inexact_spreads(torch.trace(second)[None], spread[None]):
            return None
        shares = counts / counts.sum()
        return GaussianStatistics(totals, mean_c + data.shift, shares[:, None, None] * pooled)

    def statistics(self, data: torch.Tensor | CentredData, weights: torch.Tensor) -> GaussianStatistics:
        """Total weight, weighted mean and each component's share of the pooled scatter (their sum is the pooled
        scatter: the tied M-step's statistic; :meth:`_pooled_statistics`), from the rows' weighted sums and second
        moment, no ``(N, D(D+1)/2)`` design; the full path where rounding calls for it.

        Examples
        --------
        >>> f64 = torch.float64
        >>> comp = TiedGaussian(torch.zeros(2, 2, dtype=f64), torch.eye(2, dtype=f64).expand(2, 2, 2))
        >>> x = torch.tensor([[0.0, 1.0], [2.0, 0.0], [4.0, 4.0], [5.0, 3.0]], dtype=f64)
        >>> hard = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=f64)
        >>> pooled = FullGaussian.statistics(comp, x, hard).scatter.sum(0)
        >>> bool(torch.allclose(comp.statistics(x, hard).scatter.sum(0), pooled))
        True
        """
        data = as_centred(data, self.dtype, self.device)
        weights = self._check_weights(weights, data.n_samples)
        stats = self._pooled_statistics(
            data, weights.sum(0), weights.T @ data.centred, self._second_moment(data, weights.sum(1))
        )
        return super().statistics(data, weights) if stats is None else stats

    def _fitted_factors(self, stats: GaussianStatistics) -> torch.Tensor:
        """The Cholesky factor of the floored pooled covariance ``sum_k scatter_k / sum_k n_k``, factored once and
        repeated for every component, ``(K, D, D)``."""
        pooled = stats.scatter.sum(0) / padded_counts(stats.counts.sum(0, keepdim=True))
        return checked_cholesky(floored_covariance(pooled[None], self.reg_covar)).expand_as(stats.scatter).contiguous()

    def _precisions(self) -> torch.Tensor:
        """The shared precision ``(K, D, D)``: the first component's factor inverted once (every component holds
        the same one)."""
        return _precisions_of(self.scale_tril[:1]).expand_as(self.scale_tril)
