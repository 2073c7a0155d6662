"""Rows with missing entries (NaN, missing at random) under diagonal Student-t components.

The multivariate t with a diagonal scale is a Gaussian scale mixture whose features share the latent precision
``u``: given ``u``, ``x_d ~ N(loc_d, scale_d^2 / u)`` independently. The observed entries ``o`` of a row are then
a t on ``D_o = |o|`` features with the same ``df`` and the sub-vectors of ``loc`` and ``scale``, so a row is scored
by that marginal, and its precision's posterior is ``Gamma((df + D_o) / 2, (df + delta_o) / 2)`` (``delta_o`` the
Mahalanobis distance of the observed entries). EM's expected statistics of a missing entry (Ghahramani & Jordan's
scheme, with ``x_d`` latent beside ``u`` and ``z``) are ``E[u x_d] = E[u] loc_d`` and ``E[u (x_d - m)^2] = E[u]
(loc_d - m)^2 + scale_d^2``: the row completed by ``loc`` and the scatter plus ``scale^2`` per missing entry. They
have the complete rows' form (:class:`~ppmix.components.student_t.StudentTStatistics`), so they merge with them
and the components' own M-step is exact ECM.

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
from typing import Any

import torch

from ppmix.components.centred import padded_counts
from ppmix.components.independent import ComponentsView
from ppmix.components.statistics import GaussianStatistics
from ppmix.components.student_t_statistics import StudentTStatistics

__all__ = ["ObservedStudentT"]


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

    def imputed(self, resp: torch.Tensor) -> torch.Tensor:
        """The missing entries' conditional means ``sum_k resp_nk loc_kd`` ``(N, D)`` (given ``u``, a missing
        feature is independent of the observed ones, with mean ``loc``)."""
        return resp @ self.components.loc
