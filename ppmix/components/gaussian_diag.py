"""Diagonal-covariance Gaussian components."""

from __future__ import annotations

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
    expansion_rounding,
    fused_expected_sums,
    inexact_spreads,
    padded_counts,
)
from ppmix.components.divergence import register_kl
from ppmix.components.gaussian_statistics import GaussianStatistics

__all__ = ["DiagGaussian", "SphericalGaussian"]


class DiagGaussian(ComponentFamily):
    """``K`` Gaussians with diagonal covariance: ``x | k ~ N(loc[k], diag(scale[k]^2))``.

    Parameters
    ----------
    loc : Tensor, shape (K, D)
        Component means.
    scale : Tensor, shape (K, D)
        Component standard deviations (positive).
    reg_covar : float or Tensor of shape (D,), default 1e-6
        The variance floor of :meth:`fit`: every fitted variance is
        ``max(weighted variance, reg_covar)`` (per feature when a tensor), which is the
        weighted maximum-likelihood estimate under the constraint ``variance >= reg_covar``,
        so EM on the reported likelihood never decreases it.

    Examples
    --------
    >>> import torch
    >>> comp = DiagGaussian(torch.zeros(2, 3), torch.ones(2, 3))
    >>> x = torch.randn(5, 3)
    >>> comp.log_prob(x).shape
    torch.Size([5, 2])
    >>> comp.fit(x, torch.full((5, 2), 0.5)).loc.shape
    torch.Size([2, 3])
    """

    param_names = ("loc", "scale")

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, reg_covar: float | torch.Tensor = 1e-6) -> None:
        loc, scale = torch.as_tensor(loc), torch.as_tensor(scale)
        if loc.dim() != 2 or scale.shape != loc.shape:
            raise ValueError(f"loc and scale must both have shape (K, D); got {tuple(loc.shape)}, {tuple(scale.shape)}")
        if (scale <= 0).any():
            raise ValueError("scale must be positive")
        self.loc, self.scale, self.reg_covar = loc, scale, as_floor(reg_covar)

    @property
    def n_features(self) -> int:
        return int(self.loc.shape[1])

    @property
    def variance(self) -> torch.Tensor:
        return self.scale.square()

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def covariance(self) -> torch.Tensor:
        """The variances ``(K, D)`` (the covariance matrices' diagonals)."""
        return self.variance

    def moments(self) -> Moments:
        return Moments(self.loc, self.variance)

    @property
    def reference(self) -> torch.Tensor:
        """The centre :meth:`log_prob` uses for a plain tensor: the mean of the component means,
        so that a row's log-density depends on that row and the parameters only."""
        return self.loc.mean(dim=0)

    def prepare(self, x: torch.Tensor) -> CentredData:
        """Prepare ``x`` once for many :meth:`log_prob`/:meth:`fit` calls (centred at its column mean)."""
        return as_centred(x, self.dtype, self.device)

    def log_prob(self, data: torch.Tensor | CentredData, feature_weights: torch.Tensor | None = None) -> torch.Tensor:
        """Log-density of every point under every component, shape ``(N, K)``.

        Computed as one matrix product of ``[x, x^2]`` with the natural parameters.
        With ``feature_weights`` ``w`` (shape ``(D,)``) it returns the weighted sum of the
        per-feature log-densities ``sum_d w_d log N(x_d | loc[k, d], scale[k, d]^2)`` at the
        same cost (the expected log-density under independent feature switches). A plain
        tensor is centred at :attr:`reference`.
        """
        data = as_centred(data, self.dtype, self.device, shift=self.reference)
        natural, bias, cancelled = self._natural(data, feature_weights)
        log_prob = blocked_log_density(data, natural, bias)
        if cancelled:  # recompute those components directly from the deviations
            precision, log_const = self._weighted_terms(feature_weights)
            loc_c = self.loc - data.shift
            for k in cancelled:
                maha = (data.centred - loc_c[k]).square_().mul_(precision[k]).sum(dim=1)
                log_prob[:, k] = -0.5 * maha - log_const[k].sum()
        return log_prob

    def _weighted_terms(self, feature_weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Precisions and per-feature log-normalisers ``log sqrt(2 pi) + log scale``, ``(K, D)`` each, times
        ``feature_weights`` when given."""
        precision = self.variance.reciprocal()
        log_const = 0.5 * math.log(2 * math.pi) + self.scale.log()
        if feature_weights is not None:
            feature_weights = feature_weights.to(dtype=self.dtype, device=self.device)
            precision, log_const = precision * feature_weights, log_const * feature_weights
        return precision, log_const

    def _natural(
        self, data: CentredData, feature_weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Natural parameters ``(K, 2D)`` and constants ``(K, 1)`` of the log-density of ``[x, x^2]``
        about ``data.shift``, and the components whose products would cancel more than
        :func:`~ppmix.components.centred.cancellation_tol` nats (a collapsed component at the floor)."""
        precision, log_const = self._weighted_terms(feature_weights)
        loc_c = self.loc - data.shift
        log_norm = log_const + 0.5 * loc_c.square() * precision
        natural = torch.cat([loc_c * precision, -0.5 * precision], dim=1)  # (K, 2D)
        cancelled = expansion_rounding(loc_c, precision, self.scale)
        flagged = torch.nonzero(cancelled > cancellation_tol(self.dtype)).flatten().tolist()
        return natural, -log_norm.sum(dim=1, keepdim=True), flagged

    def _expected_statistics(
        self,
        data: torch.Tensor | CentredData,
        log_weights: torch.Tensor,
        row_weights: torch.Tensor | None = None,
    ) -> tuple[GaussianStatistics, torch.Tensor]:
        """One fused E-step pass: the statistics of :meth:`statistics` under the responsibilities
        ``r_nk ∝ weights_k N(x_n | k)`` and the log-likelihood ``sum_n log sum_k weights_k N(x_n | k)``
        (each row counted ``row_weights[n]`` times where given).

        Per block of rows: the log-densities as one matrix product ``(K, rows)`` of the natural
        parameters with ``[x, x^2]``, their normalisation over ``K``, and the weighted sums of the
        same block for the M-step, while the block is in cache; no ``(N, K)`` or ``(N, 2D)``
        array is formed. Equal to ``statistics(data, softmax(log_prob(data) + log_weights))``
        (the base class's two passes, which it falls back to where a component's rounding calls for
        the direct formulas).

        Examples
        --------
        >>> f64 = torch.float64
        >>> comp = DiagGaussian(torch.tensor([[0.0], [4.0]], dtype=f64), torch.ones(2, 1, dtype=f64))
        >>> x = torch.tensor([[0.1], [3.9], [4.2]], dtype=torch.float64)
        >>> log_w = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
        >>> stats, log_lik = comp._expected_statistics(x, log_w)
        >>> resp = torch.softmax(comp.log_prob(x) + log_w, dim=1)
        >>> bool(torch.allclose(stats.mean, comp.statistics(x, resp).mean))
        True
        >>> bool(torch.isclose(log_lik, torch.logsumexp(comp.log_prob(x) + log_w, dim=1).sum()))
        True
        """
        data = as_centred(data, self.dtype, self.device)
        log_weights = log_weights.to(dtype=self.dtype, device=self.device)
        if row_weights is not None:
            row_weights = row_weights.to(dtype=self.dtype, device=self.device)
        natural, bias, flagged = self._natural(data)
        if not flagged:
            totals, sums, log_likelihood = fused_expected_sums(
                data, natural, bias + log_weights[:, None], row_weights=row_weights
            )
            counts, mean_c, spread, inexact = self._moments_from_sums(totals, sums)
            if not inexact:
                return GaussianStatistics(totals, mean_c + data.shift, spread * counts[:, None]), log_likelihood
        return super()._expected_statistics(data, log_weights, row_weights)

    def fitted_feature_log_likelihood(self, counts: torch.Tensor) -> torch.Tensor:
        """``sum_n w_nk log N(x_nd | k)`` per component and feature, ``(K, D)``, right after :meth:`fit`.

        :meth:`fit` stores the weighted squared deviations per point (``counts_k`` times the
        weighted variance, which the floor may exceed), so the weighted log-likelihood of
        the data last fitted needs only the component totals ``counts = weights.sum(0)``
        (no pass over the data).
        """
        variance = self.variance
        fit_term = self._fitted_spread / variance
        return -0.5 * counts[:, None] * (math.log(2 * math.pi) + variance.log() + fit_term)

    def fit(self, data: torch.Tensor | CentredData, weights: torch.Tensor) -> "DiagGaussian":
        """Weighted maximum-likelihood update (closed form), in place.

        ``loc[k] = sum_n w_nk x_n / sum_n w_nk`` and ``variance = max(weighted variance, reg_covar)``,
        the maximiser of the weighted log-likelihood subject to the variance floor. The same
        as ``fit_statistics(statistics(data, weights))``.
        """
        return self.fit_statistics(self.statistics(data, weights))

    def statistics(self, data: torch.Tensor | CentredData, weights: torch.Tensor) -> GaussianStatistics:
        """Total weight, weighted mean and weighted scatter ``(K, D)`` of every component.

        What :meth:`fit_statistics` needs; statistics of several shards merge exactly
        (:meth:`~ppmix.components.gaussian_statistics.GaussianStatistics.merge`), so a fit on merged
        statistics is the fit on all rows.

        Examples
        --------
        >>> comp = DiagGaussian(torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
        >>> x = torch.tensor([[0.0], [2.0], [4.0], [10.0]], dtype=torch.float64)
        >>> ones = torch.ones(4, 1, dtype=torch.float64)
        >>> merged = comp.statistics(x[:1], ones[:1]).merge(comp.statistics(x[1:], ones[1:]))
        >>> round(comp.fit_statistics(merged).variance.item(), 12), round(comp.fit(x, ones).variance.item(), 12)
        (14.0, 14.0)
        """
        data = as_centred(data, self.dtype, self.device)
        weights = self._check_weights(weights, data.n_samples)
        sums = weights.new_zeros(weights.shape[1], 2 * self.n_features)
        for rows, moments in data.moment_blocks():
            sums.addmm_(weights[rows].T, moments)
        counts, mean_c, spread, inexact = self._moments_from_sums(weights.sum(0), sums)
        # a component far from the centre (or collapsed) cancels its digits away: sum its deviations directly
        for k in inexact:
            spread[k] = weights[:, k] @ (data.centred - mean_c[k]).square() / counts[k]
        return GaussianStatistics(weights.sum(0), mean_c + data.shift, spread * counts[:, None])

    def _moments_from_sums(
        self, totals: torch.Tensor, sums: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """From the total weights ``(K,)`` and the weighted sums of ``[x, x^2]`` about the centre ``(K, 2D)``:
        the counts (kept away from zero), the means about the centre and the variances ``(K, D)``, and the
        components whose variance lost more than ``cancellation_tol`` of its digits to the subtraction."""
        counts = padded_counts(totals)
        d = self.n_features
        moments = sums / counts[:, None]
        mean_c, second = moments[:, :d], moments[:, d:]
        spread = (second - mean_c.square()).clamp_min(0.0)
        floor = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device)
        return counts, mean_c, spread, inexact_spreads(second.sum(1), torch.maximum(spread, floor).sum(1))

    def fit_statistics(self, stats: GaussianStatistics) -> "DiagGaussian":
        """The weighted maximum-likelihood update from :meth:`statistics` (of one or many shards), in place."""
        stats = stats.to(dtype=self.dtype, device=self.device)
        spread = stats.scatter / padded_counts(stats.counts)[:, None]
        var = torch.maximum(spread, torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device))
        self.loc = stats.mean
        self.scale = var.sqrt()
        self._fitted_spread = spread
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``Normal(loc[index], scale[index]).to_event(1)`` (all components if ``index`` is None)."""
        loc, scale = (self.loc, self.scale) if index is None else (self.loc[index], self.scale[index])
        return dist.Normal(loc, scale).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One draw from component ``index[i]`` for every ``i``; shape ``index.shape + (D,)``."""
        noise = torch.randn((*index.shape, self.n_features), generator=generator, dtype=self.dtype, device=self.device)
        return self.loc[index] + self.scale[index] * noise


@register_kl(DiagGaussian, DiagGaussian)
def _kl_diag_gaussian(p: DiagGaussian, q: DiagGaussian) -> torch.Tensor:
    """``KL(p[k] || q[l])`` for every pair, shape ``(K, K')``."""
    var_p, var_q = p.variance[:, None, :], q.variance[None, :, :]
    diff2 = (p.loc[:, None, :] - q.loc[None, :, :]).square()
    return 0.5 * (var_q.log() - var_p.log() + (var_p + diff2) / var_q - 1.0).sum(dim=-1)


class SphericalGaussian(DiagGaussian):
    """``K`` Gaussians with one variance each: ``x | k ~ N(loc[k], scale[k]^2 I)``.

    A :class:`DiagGaussian` whose M-step ties every component's variances across the features: the
    weighted maximum-likelihood variance is the mean over the features of the per-feature ones
    (scikit-learn's ``covariance_type="spherical"``), floored at the mean of the feature floors. The
    state is the diagonal one (``scale`` ``(K, D)``, equal along each row), so every diagonal pass
    (fused E-step, statistics, KL) serves it unchanged.

    Examples
    --------
    >>> x = torch.tensor([[0.0, 0.0], [2.0, 6.0]], dtype=torch.float64)
    >>> comp = SphericalGaussian(torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64))
    >>> comp.fit(x, torch.ones(2, 1, dtype=torch.float64)).variance.round(decimals=12).tolist()  # (1 + 9) / 2
    [[5.0, 5.0]]
    """

    def fit_statistics(self, stats: GaussianStatistics) -> "SphericalGaussian":
        """The weighted maximum-likelihood update under one variance per component, in place."""
        stats = stats.to(dtype=self.dtype, device=self.device)
        spread = stats.scatter / padded_counts(stats.counts)[:, None]
        floor = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device).mean()
        var = torch.maximum(spread.mean(dim=1, keepdim=True), floor).expand_as(spread)
        self.loc = stats.mean
        self.scale = var.sqrt().contiguous()
        self._fitted_spread = spread
        return self
