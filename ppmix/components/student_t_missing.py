"""Rows with missing entries (NaN, missing at random) under Student-t components, diagonal or full.

The multivariate t with a diagonal scale is a Gaussian scale mixture whose features share the latent precision
``u``: given ``u``, ``x_d ~ N(loc_d, scale_d^2 / u)`` independently. The observed entries ``o`` of a row are then
a t on ``D_o = |o|`` features with the same ``df`` and the sub-vectors of ``loc`` and ``scale``, so a row is scored
by that marginal, and its precision's posterior is ``Gamma((df + D_o) / 2, (df + delta_o) / 2)`` (``delta_o`` the
Mahalanobis distance of the observed entries). EM's expected statistics of a missing entry (Ghahramani & Jordan's
scheme, with ``x_d`` latent beside ``u`` and ``z``) are ``E[u x_d] = E[u] loc_d`` and ``E[u (x_d - m)^2] = E[u]
(loc_d - m)^2 + scale_d^2``: the row completed by ``loc`` and the scatter plus ``scale^2`` per missing entry. They
have the complete rows' form (:class:`~ppmix.components.student_t.StudentTStatistics`), so they merge with them
and the components' own M-step is exact ECM.

A full scale matrix ``Sigma`` (Liu & Rubin 1995) is the same scheme through the conditional Gaussian of
:mod:`ppmix.components.gaussian_missing`: the observed entries are a t on ``D_o`` features with ``Sigma[o, o]``,
``u``'s posterior as above with ``delta_o`` under ``Sigma[o, o]``, and given ``u`` the missing block is Gaussian
with the mean ``x_hat_m = loc_m + Sigma[m, o] Sigma[o, o]^{-1} (x_o - loc_o)`` (whatever ``u``) and the
covariance ``Sigma_{m|o} / u``; so ``E[u x] = E[u] x_hat`` and ``E[u x x^T] = E[u] x_hat x_hat^T + Sigma_{m|o}``
(the conditional covariance on the missing block).

Examples
--------
>>> from ppmix.components.student_t import StudentTComponents
>>> f64 = torch.float64
>>> comp = StudentTComponents(*(torch.tensor(v, dtype=f64) for v in ([3.0], [[0.0, 5.0]], [[1.0, 2.0]])))
>>> x = torch.tensor([[float("nan"), 7.0]], dtype=f64)
>>> round(float(ObservedStudentT(comp).log_prob(x)), 6)  # the univariate t_3(7; 5, 2)
-2.2694
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, cast

import torch

from ppmix.components.centred import padded_counts
from ppmix.components.gaussian_missing import Completed, accumulate_moments, conditional_mean, row_blocks
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.components.independent import ComponentsView
from ppmix.components.student_t_statistics import StudentTStatistics

__all__ = ["ObservedFullStudentT", "ObservedStudentT"]


class ObservedStudentT(ComponentsView):
    """Diagonal Student-t components seen through the observed entries of rows (NaN where missing): ``log_prob``
    the marginal t of the observed entries ``(N, K)``, ``statistics`` EM's expected statistics (the components'
    own kind), ``fit_statistics`` the components' M-step (in place), ``imputed`` the posterior mixture of the
    locations.

    Parameters
    ----------
    components : StudentTComponents
        The fitted components (a view: they are fitted in place).
    """

    def _scored(self, data: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The marginal log-densities and what the statistics reuse: the mask, the observed counts ``D_o`` ``(N,)``
        and the distances ``delta_o`` ``(N, K)`` (from the deviations, one component at a time)."""
        comp = self.components
        x = torch.as_tensor(data).to(dtype=self.dtype, device=self.device)
        observed = ~torch.isnan(x)
        n_observed = observed.sum(1).to(self.dtype)[:, None]
        # deviations of the rows completed by each loc: zero where missing, and no NaN in any gradient
        deviations = [(torch.where(observed, x, loc) - loc) / scale for loc, scale in zip(comp.loc, comp.scale)]
        delta = torch.stack([dev.square().sum(1) for dev in deviations], 1)
        df = comp.df
        half = (df + n_observed) / 2
        log_det = observed.to(self.dtype) @ comp.scale.log().T
        const = torch.lgamma(half) - torch.lgamma(df / 2) - n_observed / 2 * (df * math.pi).log()
        log_prob = const - log_det - half * torch.log1p(delta / df)
        return log_prob, (x, observed, half, delta)

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        return self._scored(data)[0]

    def _statistics_given(self, data: torch.Tensor, weights: torch.Tensor, shared: Any) -> StudentTStatistics:
        comp = self.components
        x, observed, half, delta = shared
        weights = self._check_weights(weights, x.shape[0])
        precision = half / ((comp.df + delta) / 2)
        expected_log = torch.digamma(half) - ((comp.df + delta) / 2).log()
        weighted = weights * precision
        totals = weighted.sum(0)
        missing = (~observed).to(self.dtype)
        rows = torch.where(observed, x, 0.0)
        mean = (weighted.T @ rows + (weighted.T @ missing) * comp.loc) / padded_counts(totals)[:, None]
        scatter = torch.stack(
            [
                weighted[:, k] @ (torch.where(observed, x, comp.loc[k]) - mean[k]).square()
                + (weights[:, k] @ missing) * comp.scale[k].square()
                for k in range(self.n_components)
            ]
        )
        log_precision = (weights * (expected_log - precision)).sum(0)
        return StudentTStatistics(weights.sum(0), GaussianStatistics(totals, mean, scatter), log_precision)

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> StudentTStatistics:
        return self._statistics_given(data, weights, self._scored(data)[1])

    def fit_statistics(self, stats: Any) -> Any:
        return self.components.fit_statistics(stats)

    def imputed(self, resp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The missing entries' conditional means ``sum_k resp_nk loc_kd`` ``(N, D)`` (given ``u``, a missing
        feature is independent of the observed ones, with mean ``loc``)."""
        return resp @ self.components.loc


def _t_log_prob(df: torch.Tensor, part: Completed) -> torch.Tensor:
    """The t's log-density of every row's observed entries ``(n, K)`` from the Gaussian ``part``'s distances and log
    determinants under the scale matrices: ``log Gamma((df + D_o) / 2) - log Gamma(df / 2) - D_o / 2 log(df pi)
    - log |Sigma[o, o]|^{1/2} - (df + D_o) / 2 log(1 + delta_o / df)``."""
    n_observed = part.n_observed[:, None]
    half = (df + n_observed) / 2
    const = torch.lgamma(half) - torch.lgamma(df / 2) - n_observed / 2 * (df * math.pi).log()
    return const - 0.5 * part.log_det - half * torch.log1p(part.quadratic / df)


class ObservedFullStudentT(ComponentsView):
    """Full-scale Student-t components seen through the observed entries of rows (NaN where missing), as
    :class:`ObservedStudentT` for the diagonal ones: ``log_prob`` the marginal t of the observed entries ``(N, K)``,
    ``statistics`` EM's expected statistics (the missing block completed by its conditional mean, the scatter plus
    its conditional covariance), ``fit_statistics`` the components' M-step (in place), ``imputed`` the conditional
    means. The rows go in blocks through the conditional Gaussian of the scale matrices
    (:func:`~ppmix.components.gaussian_missing.row_blocks`), one factorisation per pattern of missing entries.

    Parameters
    ----------
    components : FullStudentTComponents
        The fitted components (a view: they are fitted in place).

    Examples
    --------
    >>> from ppmix.components.student_t import FullStudentTComponents
    >>> f64 = torch.float64
    >>> tril = torch.tensor([[[2.0, 0.0], [1.0, 1.0]]], dtype=f64)  # Sigma[1, 1] = 2
    >>> comp = FullStudentTComponents(torch.tensor([3.0], dtype=f64), torch.tensor([[0.0, 5.0]], dtype=f64), tril)
    >>> x = torch.tensor([[float("nan"), 7.0]], dtype=f64)
    >>> round(float(ObservedFullStudentT(comp).log_prob(x)), 6)  # the univariate t_3(7; 5, sqrt 2)
    -2.369114
    """

    def _scale_matrix(self) -> torch.Tensor:
        tril = self.components.scale_tril
        return tril @ tril.mT

    def _parts(self, data: torch.Tensor) -> Iterator[tuple[slice, Completed, torch.Tensor]]:
        """``(rows, part, log_prob)`` over blocks of the rows: the conditional Gaussian ``part`` of the scale matrices
        and the rows' t log-densities ``(n, K)``."""
        x = torch.as_tensor(data).to(dtype=self.dtype, device=self.device)
        for rows, part in row_blocks(x, self.components.loc, self._scale_matrix()):
            part = cast(Completed, part)  # full scale matrices
            yield rows, part, _t_log_prob(self.components.df, part)

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        return torch.cat([log_prob for _, _, log_prob in self._parts(data)])

    def _statistics_of(self, parts: Iterable[tuple[torch.Tensor, Completed]]) -> StudentTStatistics:
        """The statistics of ``(resp (n, K), part)`` blocks: the posterior ``Gamma((df + D_o) / 2, (df + delta_o) /
        2)`` of ``u`` gives ``E[u]`` and ``E[log u]``; the completed rows weigh ``r E[u]``, their conditional
        covariances ``r``."""
        df = self.components.df
        counts: list[torch.Tensor] = []
        log_precision: list[torch.Tensor] = []

        def weighted() -> Iterator[tuple[torch.Tensor, Completed, torch.Tensor]]:
            for resp, part in parts:
                half = (df + part.n_observed[:, None]) / 2
                rate = (df + part.quadratic) / 2
                precision = half / rate
                counts.append(resp.sum(0))
                log_precision.append((resp * (torch.digamma(half) - rate.log() - precision)).sum(0))
                yield resp * precision, part, resp

        moments = accumulate_moments(self.components.loc, self._scale_matrix(), weighted())
        return StudentTStatistics(torch.stack(counts).sum(0), moments, torch.stack(log_precision).sum(0))

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> StudentTStatistics:
        weights = self._check_weights(weights, data.shape[0])
        return self._statistics_of((weights[rows], part) for rows, part, _ in self._parts(data))

    def _expected_statistics(
        self, data: Any, log_weights: torch.Tensor, row_weights: torch.Tensor | None = None
    ) -> tuple[StudentTStatistics, torch.Tensor]:
        """The E-step in one pass over the blocks of rows (each row's posterior needs its own densities only)."""
        totals: list[torch.Tensor] = []

        def posterior() -> Iterator[tuple[torch.Tensor, Completed]]:
            for rows, part, log_prob in self._parts(data):
                joint = log_prob + log_weights
                norm = torch.logsumexp(joint, dim=1)
                resp = torch.exp(joint - norm[:, None])
                if row_weights is not None:
                    resp, norm = resp * row_weights[rows, None], norm * row_weights[rows]
                totals.append(norm.sum())
                yield resp, part

        stats = self._statistics_of(posterior())
        return stats, torch.stack(totals).sum()

    def fit_statistics(self, stats: Any) -> Any:
        return self.components.fit_statistics(stats)

    def imputed(self, resp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The missing entries' conditional means ``sum_k resp_nk x_hat_nk`` ``(N, D)`` (the conditional Gaussian's
        under the scale matrices, whatever ``u``)."""
        return conditional_mean(x, resp, self.components.loc, self._scale_matrix())
