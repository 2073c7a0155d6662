"""Gaussian components on rows with missing entries (NaN), missing at random.

A row's observed entries ``o`` are Gaussian under component ``k`` with the sub-vector ``mu_k[o]`` and the
sub-matrix ``Sigma_k[o, o]``, so its log-density is that marginal's. EM's expected statistics of such a
row (Ghahramani & Jordan, 1994) fill its missing block ``m`` with the conditional mean and add the
conditional covariance to the scatter, so the M-step from them is the exact maximiser of EM's objective.

Every row is handled at once, whatever its pattern of missing entries, through the precision matrix
``P = Sigma^{-1}``: the conditional covariance of the missing block is ``P[m, m]^{-1}``, its conditional
mean ``mu[m] - P[m, m]^{-1} P[m, o] (x[o] - mu[o])``; the observed entries' quadratic form is that of the
completed row under ``P``, and ``log det Sigma[o, o] = log det Sigma + log det P[m, m]``. Each row's
``P[m, m]`` is embedded in a ``D x D`` matrix with the identity on the observed entries, so one batched
Cholesky factorisation serves every row and component. Diagonal covariances need none of it: the
missing entries drop out of the sums, and every quantity is a few matrix products with the mask.

Examples
--------
>>> import torch
>>> loc = torch.zeros(1, 2, dtype=torch.float64)
>>> cov = torch.tensor([[[1.0, 0.5], [0.5, 1.0]]], dtype=torch.float64)
>>> x = torch.tensor([[2.0, float("nan")]], dtype=torch.float64)
>>> round(float(marginal_log_prob(x, loc, cov)), 6)  # log N(2; 0, 1)
-2.918939
>>> conditional_mean(x, torch.ones(1, 1, dtype=torch.float64), loc, cov).round(decimals=12).tolist()  # 0.5 * 2
[[2.0, 1.0]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Iterator

import torch

from ppmix.components.gaussian_statistics import GaussianStatistics

__all__ = [
    "MissingRows",
    "accumulate_moments",
    "conditional_mean",
    "design_coefficients",
    "expected_statistics",
    "marginal_log_prob",
    "missing_e_step",
    "row_blocks",
]

#: rows per batch of the full-covariance path (its ``(K, rows, D, D)`` tensors hold at most about
#: ``ROW_BLOCK_ENTRIES`` numbers)
ROW_BLOCK_ENTRIES = 2**22
LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True, eq=False)
class MissingRows:
    """Rows with missing entries, with what every E-step reads of them computed once.

    Attributes
    ----------
    x : Tensor (n, D)
        The rows, NaN where an entry is missing.
    observed : BoolTensor (n, D)
    reference : Tensor (D,)
        The columns' means over their observed entries (a point near the data).
    x0 : Tensor (n, D)
        ``x - reference``, zero where missing.
    patterns : BoolTensor (P, D)
        The distinct patterns of observed entries; ``pattern`` ``(n,)`` is each row's.
    """

    x: torch.Tensor
    observed: torch.Tensor
    reference: torch.Tensor
    x0: torch.Tensor
    patterns: torch.Tensor
    pattern: torch.Tensor

    @cached_property
    def design(self) -> torch.Tensor:
        """``[x0 ** 2, x0, mask]`` ``(n, 3 D)``, the mask 1 where observed: the diagonal components' log-densities
        and moments are each one matrix product with it."""
        return torch.cat([self.x0.square(), self.x0, self.observed.to(self.x.dtype)], dim=1)

    @classmethod
    def of(cls, x: "torch.Tensor | MissingRows", reference: torch.Tensor | None = None) -> "MissingRows":
        """``x`` prepared (as it is if it already is), centred at ``reference`` ``(D,)`` (default: the observed
        entries' column means; predictions pass a point of the fitted model, so that a row's scores do not
        depend on the other rows of its batch)."""
        if isinstance(x, MissingRows):
            return x
        observed = ~torch.isnan(x)
        if reference is None:
            counts = observed.sum(0).clamp_min(1).to(x.dtype)
            reference = torch.where(observed, x, 0.0).sum(0) / counts
        patterns, pattern = _patterns(observed)
        return cls(x, observed, reference, torch.where(observed, x - reference, 0.0), patterns, pattern)

    def __len__(self) -> int:
        return self.x.shape[0]

    def take(self, rows: slice) -> "MissingRows":
        """The rows ``rows`` (every pattern kept)."""
        return MissingRows(
            self.x[rows], self.observed[rows], self.reference, self.x0[rows], self.patterns, self.pattern[rows]
        )


@dataclass(frozen=True)
class Completed:
    """Rows under full components: the observed entries' Mahalanobis distances ``quadratic`` ``(n, K)`` and log
    determinants ``log det Sigma_k[o, o]`` ``log_det`` ``(n, K)`` and their number ``n_observed`` ``(n,)``, the
    rows completed by their conditional means, less each component's mean, ``centred`` ``(K, n, D)``, the rows'
    patterns of missing entries (``pattern`` ``(n,)``, an index into ``conditional``) and each pattern's conditional
    covariance of the missing block ``conditional`` ``(K, P, D, D)`` (zero elsewhere)."""

    quadratic: torch.Tensor
    log_det: torch.Tensor
    n_observed: torch.Tensor
    centred: torch.Tensor
    pattern: torch.Tensor
    conditional: torch.Tensor
    loc: torch.Tensor

    @property
    def log_prob(self) -> torch.Tensor:
        """``log N(x[o]; mu_k[o], Sigma_k[o, o])`` ``(n, K)``."""
        return -0.5 * (self.quadratic + self.log_det + LOG_2PI * self.n_observed[:, None])

    def moments(self, resp: torch.Tensor, spread: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum_n r_nk E[x_n - mu_k]`` ``(K, D)`` and ``sum_n r_nk E[(x_n - mu_k)(x_n - mu_k)^T]`` ``(K, D, D)``;
        with ``spread`` ``(n, K)``, the conditional covariances weigh ``spread`` rather than ``r`` (a scale
        mixture's: ``E[u x x^T | x[o]] = E[u] E[x] E[x]^T + Sigma_{m|o}``)."""
        weights = resp.T
        sums = torch.einsum("kn,knd->kd", weights, self.centred)
        seconds = torch.einsum("kn,kni,knj->kij", weights, self.centred, self.centred)
        spread = weights if spread is None else spread.T
        per_pattern = spread.new_zeros(spread.shape[0], self.conditional.shape[1]).index_add_(1, self.pattern, spread)
        return sums, seconds + torch.einsum("kp,kpij->kij", per_pattern, self.conditional)

    def filled(self, resp: torch.Tensor) -> torch.Tensor:
        """The rows completed by their conditional means under the mixture ``(n, D)``."""
        return torch.einsum("nk,knd->nd", resp, self.centred + self.loc[:, None, :])


def design_coefficients(loc: torch.Tensor, var: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Coefficients ``(K, 3 D)`` of the design ``[x0^2, x0, mask]`` (:attr:`MissingRows.design`, ``x0`` about
    ``reference``) whose product with it is ``-2 log N`` of every row's observed entries under diagonal components
    (means ``loc``, variances ``var``): per feature ``1 / var``, ``-2 (loc - reference) / var`` and
    ``(loc - reference)^2 / var + log var + log 2 pi``.

    Examples
    --------
    >>> f64 = torch.float64
    >>> rows = MissingRows.of(torch.tensor([[1.0, float("nan")]], dtype=f64), torch.zeros(2, dtype=f64))
    >>> coef = design_coefficients(torch.zeros(1, 2, dtype=f64), torch.ones(1, 2, dtype=f64), rows.reference)
    >>> round(float(-0.5 * rows.design @ coef.T), 6), round(-0.5 * (1 + LOG_2PI), 6)  # N(1 | 0, 1); the hole left out
    (-1.418939, -1.418939)
    """
    centred = loc - reference
    precision = 1.0 / var
    return torch.cat([precision, -2 * centred * precision, centred.square() * precision + var.log() + LOG_2PI], dim=1)


@dataclass(frozen=True)
class _Masked:
    """Rows under diagonal components, kept as matrices (no ``(K, n, D)`` tensor): ``rows`` with their mask,
    ``loc`` the means less the rows' reference point, ``var`` the variances and ``log_prob`` ``(n, K)`` of the
    observed entries, from matrix products of the rows and the mask with the components' parameters."""

    rows: MissingRows
    loc: torch.Tensor
    var: torch.Tensor
    log_prob: torch.Tensor

    @classmethod
    def of(cls, rows: MissingRows, loc: torch.Tensor, var: torch.Tensor) -> "_Masked":
        log_prob = -0.5 * (rows.design @ design_coefficients(loc, var, rows.reference).T)
        return cls(rows, loc - rows.reference, var, log_prob)

    def moments(self, resp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum_n r_nk E[x_n - mu_k]`` and ``sum_n r_nk E[(x_n - mu_k)^2]`` ``(K, D)``: a missing entry's
        conditional mean is ``mu_k`` and its conditional variance ``var_k``."""
        squares, first, seen = (resp.T @ self.rows.design).chunk(3, dim=1)
        sums = first - self.loc * seen
        seconds = squares - 2 * self.loc * first + self.loc.square() * seen
        return sums, seconds + self.var * (resp.sum(0)[:, None] - seen)

    def filled(self, resp: torch.Tensor) -> torch.Tensor:
        """The rows' missing entries' conditional means under the mixture ``(n, D)`` (observed entries: any)."""
        return resp @ (self.loc + self.rows.reference)


def _patterns(observed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of the mask ``observed`` ``(P, D)`` and each row's index among them ``(n,)``: through
    one integer code per row where ``D`` fits in its bits (a 1-D sort), else row by row."""
    d = observed.shape[1]
    if d > 62:
        return torch.unique(observed, dim=0, return_inverse=True)
    bits = torch.arange(d, device=observed.device)
    codes, pattern = torch.unique((observed.long() << bits).sum(1), return_inverse=True)
    return ((codes[:, None] >> bits) & 1).bool(), pattern


def _full(rows: MissingRows, loc: torch.Tensor, cov: torch.Tensor) -> Completed:
    """Rows under full components. Each pattern of missing entries ``m`` (not each row) factorises its block
    ``P[m, m]`` of the precision (embedded with the identity on the observed entries), batched over patterns
    and components; every row then takes its pattern's inverse."""
    x, observed, patterns, pattern = rows.x, rows.observed, rows.patterns, rows.pattern
    d = x.shape[1]
    both_missing = (~patterns[:, :, None] & ~patterns[:, None, :])[None]  # (1, P, D, D)
    chol_cov = torch.linalg.cholesky(cov)
    precision = torch.cholesky_inverse(chol_cov)  # (K, D, D)
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    chol = torch.linalg.cholesky(torch.where(both_missing, precision[:, None], eye))  # (K, P, D, D)
    conditional = torch.where(both_missing, torch.cholesky_inverse(chol), 0.0)  # P[m, m]^{-1}, zero elsewhere
    log_det = 2 * torch.log(torch.diagonal(chol_cov, dim1=1, dim2=2)).sum(1)[:, None] + 2 * torch.log(
        torch.diagonal(chol, dim1=2, dim2=3)
    ).sum(2)  # log det Sigma[o, o] of every pattern (K, P)
    centred = torch.where(observed, x[None] - loc[:, None, :], 0.0)  # (K, n, D), zero on the missing entries
    pulled = centred @ precision  # P c, c the row less the mean with zeros on the missing entries
    rhs = torch.where(~observed, pulled, 0.0)  # (P c)[m]
    shift = -torch.einsum("knij,knj->kni", conditional[:, pattern], rhs)  # the conditional mean's offset, on m
    centred = centred + shift
    # (c + s)^T P (c + s) = c^T P c + s^T (P c)[m], since s[m] = -P[m, m]^{-1} (P c)[m]
    quadratic = (centred * pulled).sum(2)
    n_observed = observed.sum(1).to(x.dtype)
    return Completed(quadratic.T, log_det[:, pattern].T, n_observed, centred, pattern, conditional, loc)


def row_blocks(
    x: "torch.Tensor | MissingRows", loc: torch.Tensor, cov: torch.Tensor
) -> Iterator[tuple[slice, _Masked | Completed]]:
    """``(rows, part)`` over blocks of the rows ``x`` (one block for diagonal covariances ``(K, D)``): each
    block's log-densities of the observed entries and its rows' conditional moments (:class:`Completed` under full
    covariances ``(K, D, D)``)."""
    rows = MissingRows.of(x)
    if cov.dim() == 2:
        yield slice(None), _Masked.of(rows, loc, cov)
        return
    k, d = cov.shape[0], cov.shape[1]
    step = max(1, ROW_BLOCK_ENTRIES // (k * d * d))
    for start in range(0, len(rows), step):
        block = slice(start, start + step)
        yield block, _full(rows.take(block), loc, cov)


def marginal_log_prob(x: "torch.Tensor | MissingRows", loc: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """``log N(x[o]; mu_k[o], Sigma_k[o, o])`` of every row and component ``(N, K)``, ``o`` each row's observed
    entries (not NaN; every row has one). ``cov``: ``(K, D)`` variances or ``(K, D, D)`` covariances."""
    return torch.cat([part.log_prob for _, part in row_blocks(x, loc, cov)])


def conditional_mean(
    x: "torch.Tensor | MissingRows", resp: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor
) -> torch.Tensor:
    """``E[x | x[o]]`` of every row ``(N, D)``: the observed entries as they are, the missing ones their
    conditional means under each component averaged with the rows' posterior probabilities ``resp`` ``(N, K)``
    (the mixture's conditional mean)."""
    rows = MissingRows.of(x)
    filled = torch.cat([part.filled(resp[block]) for block, part in row_blocks(rows, loc, cov)])
    return torch.where(rows.observed, rows.x, filled)


def expected_statistics(
    x: "torch.Tensor | MissingRows", resp: torch.Tensor, loc: torch.Tensor, cov: torch.Tensor
) -> GaussianStatistics:
    """EM's expected statistics of rows with missing entries under responsibilities ``resp`` ``(N, K)`` (times
    any row weights): total weight, weighted mean of the completed rows and their weighted scatter plus the
    conditional covariances, ``(K, D)`` for diagonal ``cov`` ``(K, D)`` or ``(K, D, D)``; they merge with
    complete rows' by :meth:`~ppmix.components.gaussian_statistics.GaussianStatistics.merge`."""
    return accumulate_moments(loc, cov, ((resp[rows], part, None) for rows, part in row_blocks(x, loc, cov)))


def missing_e_step(
    x: "torch.Tensor | MissingRows",
    log_weights: torch.Tensor,
    loc: torch.Tensor,
    cov: torch.Tensor,
    weight: torch.Tensor | None,
) -> tuple[GaussianStatistics, torch.Tensor]:
    """The E-step on rows with missing entries in one pass: :func:`expected_statistics` under the posterior
    probabilities given the observed entries (times the rows' ``weight``), and the (weighted) log-likelihood
    of the observed entries ``sum_n w_n log sum_k pi_k N(x_n[o]; ...)``."""
    totals: list[torch.Tensor] = []

    def weighted() -> Iterator[tuple[torch.Tensor, _Masked | Completed, None]]:
        for rows, part in row_blocks(x, loc, cov):
            joint = part.log_prob + log_weights
            norm = torch.logsumexp(joint, dim=1)
            resp = torch.exp(joint - norm[:, None])
            if weight is not None:
                resp, norm = resp * weight[rows, None], norm * weight[rows]
            totals.append(norm.sum())
            yield resp, part, None

    stats = accumulate_moments(loc, cov, weighted())
    return stats, torch.stack(totals).sum()


def accumulate_moments(
    loc: torch.Tensor,
    cov: torch.Tensor,
    parts: Iterable[tuple[torch.Tensor, _Masked | Completed, torch.Tensor | None]],
) -> GaussianStatistics:
    """Counts, means and scatters from ``(resp (n, K), part, spread)`` blocks of :func:`row_blocks` (``spread``:
    the weights of the conditional covariances, None for ``resp``'s; full covariances only, see
    :meth:`Completed.moments`), accumulated
    about each component's mean (near the weighted mean: no cancellation in the scatter)."""
    k, d = loc.shape
    diagonal = cov.dim() == 2
    counts = loc.new_zeros(k)
    sums = loc.new_zeros(k, d)
    seconds = loc.new_zeros(k, d) if diagonal else loc.new_zeros(k, d, d)
    for resp, part, spread in parts:
        counts += resp.sum(0)
        first, second = part.moments(resp) if spread is None else part.moments(resp, spread)  # type: ignore[call-arg]
        sums += first
        seconds += second
    shift = sums / torch.where(counts > 0, counts, torch.ones_like(counts))[:, None]
    if diagonal:
        scatter = seconds - counts[:, None] * shift.square()
    else:
        scatter = seconds - counts[:, None, None] * shift[:, :, None] * shift[:, None, :]
    return GaussianStatistics(counts, loc + shift, scatter)
