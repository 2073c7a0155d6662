"""Gaussian components on rows with missing entries (NaN), missing at random.

A row's observed coordinates ``o`` are Gaussian under component ``k`` with the sub-vector ``mu_k[o]``
and the sub-matrix ``Sigma_k[o, o]``, so its log-density is that marginal's. EM's expected statistics
of such a row (Ghahramani & Jordan, 1994) fill its missing block ``m`` with the conditional mean
``mu_k[m] + Sigma_k[m, o] Sigma_k[o, o]^{-1} (x[o] - mu_k[o])`` and add the conditional covariance
``Sigma_k[m, m] - Sigma_k[m, o] Sigma_k[o, o]^{-1} Sigma_k[o, m]`` to the scatter, so the M-step from
them is the exact maximiser of EM's objective. Rows are grouped by their pattern of missing entries,
and each pattern is one batch of matrix products; a diagonal covariance is the full one with zeros
off its diagonal (its conditional mean of a missing entry is then the component's mean).

Examples
--------
>>> import torch
>>> loc = torch.zeros(1, 2, dtype=torch.float64)
>>> cov = torch.tensor([[[1.0, 0.5], [0.5, 1.0]]], dtype=torch.float64)
>>> x = torch.tensor([[2.0, float("nan")]], dtype=torch.float64)
>>> round(float(marginal_log_prob(x, loc, cov)), 6)  # log N(2; 0, 1)
-2.918939
>>> conditional_mean(x, torch.ones(1, 1, dtype=torch.float64), loc, cov).tolist()  # the missing entry: 0.5 * 2
[[2.0, 1.0]]
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from ppmix.components.statistics import GaussianStatistics

__all__ = ["conditional_mean", "expected_statistics", "marginal_log_prob", "missing_patterns"]


def missing_patterns(x: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(observed (D,) bool, rows (n,) long)`` for every pattern of missing entries among the rows of ``x``.

    Examples
    --------
    >>> nan = float("nan")
    >>> x = torch.tensor([[1.0, nan], [nan, 2.0], [3.0, nan]])
    >>> [(o.tolist(), r.tolist()) for o, r in missing_patterns(x)]
    [([False, True], [1]), ([True, False], [0, 2])]
    """
    observed = ~torch.isnan(x)
    patterns, which = torch.unique(observed, dim=0, return_inverse=True)
    for index in range(patterns.shape[0]):
        yield patterns[index], torch.nonzero(which == index).squeeze(1)


def _full(cov: torch.Tensor) -> torch.Tensor:
    """``(K, D, D)`` covariances from ``(K, D)`` variances (diagonal) or as they are."""
    return torch.diag_embed(cov) if cov.dim() == 2 else cov


def _pattern_parts(x: torch.Tensor, obs: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor):
    """The observed part of rows ``x`` (one pattern), their residuals under every component ``(K, n, |o|)`` and
    the Cholesky factors of ``Sigma_k[o, o]`` ``(K, |o|, |o|)``."""
    x_obs = x[:, obs]
    residual = x_obs[None, :, :] - loc[:, None, obs]
    chol = torch.linalg.cholesky(cov[:, obs][:, :, obs])
    return x_obs, residual, chol


def marginal_log_prob(x: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """``log N(x[o]; mu_k[o], Sigma_k[o, o])`` of every row and component ``(N, K)``, ``o`` each row's observed
    entries (not NaN; every row has one). ``cov``: ``(K, D)`` variances or ``(K, D, D)`` covariances."""
    cov = _full(cov)
    out = x.new_empty(x.shape[0], loc.shape[0])
    for obs, rows in missing_patterns(x):
        _, residual, chol = _pattern_parts(x[rows], obs, loc, cov)
        white = torch.linalg.solve_triangular(chol, residual.transpose(1, 2), upper=False)  # (K, |o|, n)
        half_log_det = torch.log(torch.diagonal(chol, dim1=1, dim2=2)).sum(1)  # (K,)
        d_obs = int(obs.sum())
        out[rows] = (-0.5 * white.square().sum(1) - half_log_det[:, None] - 0.5 * d_obs * math.log(2 * math.pi)).T
    return out


def _completed(x: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor):
    """Per pattern of missing entries: ``(rows, filled (K, n, D), missing index (m,), conditional covariance
    (K, m, m))``, ``filled`` the rows with their missing block replaced by its conditional mean under every
    component."""
    cov = _full(cov)
    for obs, rows in missing_patterns(x):
        miss = ~obs
        x_obs, residual, chol = _pattern_parts(x[rows], obs, loc, cov)
        filled = x[rows].expand(loc.shape[0], -1, -1).clone()
        index = torch.nonzero(miss).squeeze(1)
        cross = cov[:, miss][:, :, obs]  # (K, m, |o|)
        gain = torch.cholesky_solve(cross.transpose(1, 2), chol).transpose(1, 2)  # Sigma_mo Sigma_oo^-1
        filled[:, :, miss] = loc[:, None, miss] + residual @ gain.transpose(1, 2)
        yield rows, filled, index, cov[:, miss][:, :, miss] - gain @ cross.transpose(1, 2)


def conditional_mean(x: torch.Tensor, resp: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """``E[x | x[o]]`` of every row ``(N, D)``: the observed entries as they are, the missing ones their
    conditional means under each component averaged with the rows' posterior probabilities ``resp`` ``(N, K)``
    (the mixture's conditional mean)."""
    out = x.clone()
    missing = torch.isnan(x)
    for rows, filled, _, _ in _completed(x, loc, cov):
        out[rows] = torch.where(missing[rows], torch.einsum("nk,knd->nd", resp[rows], filled), x[rows])
    return out


def expected_statistics(
    x: torch.Tensor, resp: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor, *, diagonal: bool
) -> GaussianStatistics:
    """EM's expected statistics of rows with missing entries under responsibilities ``resp`` ``(N, K)`` (times
    any row weights): total weight, weighted mean of the completed rows and their weighted scatter plus the
    conditional covariances, ``(K, D)`` (``diagonal``) or ``(K, D, D)``; they merge with complete rows' by
    :meth:`~ppmix.components.statistics.GaussianStatistics.merge`."""
    k, d = loc.shape
    counts = resp.sum(0)
    # moments about each component's current mean (near the weighted mean: no cancellation in the scatter)
    sums = x.new_zeros(k, d)
    seconds = x.new_zeros(k, d, d)  # sum_n r_nk E[(x - mu_k)(x - mu_k)^T]
    for rows, filled, index, conditional in _completed(x, loc, cov):
        weights = resp[rows].T  # (K, n)
        centred = filled - loc[:, None, :]
        sums += torch.einsum("kn,knd->kd", weights, centred)
        seconds += torch.einsum("kn,kni,knj->kij", weights, centred, centred)
        seconds[:, index[:, None], index[None, :]] += weights.sum(1)[:, None, None] * conditional
    safe = torch.where(counts > 0, counts, torch.ones_like(counts))
    shift = sums / safe[:, None]
    mean = loc + shift
    scatter = seconds - counts[:, None, None] * shift[:, :, None] * shift[:, None, :]
    if diagonal:
        scatter = torch.diagonal(scatter, dim1=1, dim2=2)
    return GaussianStatistics(counts, mean, scatter)
