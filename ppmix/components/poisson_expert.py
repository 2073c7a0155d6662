"""Poisson-regression experts: ``y | x, k ~ Poisson(exp(x^T coef[k] + intercept[k]))`` (log link), for counts."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pyro.distributions as dist
import torch

from ppmix.components._linear import GLMExperts, LinearPrior
from ppmix.components.base import ComponentFamily
from ppmix.components.expert_family import ExpertFamily, TargetScale

__all__ = ["PoissonExpert", "PoissonExpertFamily"]

#: half-width, in standard deviations (plus as many counts), of the window of counts that
#: :meth:`PoissonExpert.response_quadrature` enumerates: the Poisson mass outside it is below 1e-14
_WINDOW_SDS = 8.0


class PoissonExpert(GLMExperts):
    """``K`` Poisson-regression experts for a count response, log link.

    Expert ``k`` has rate ``exp(x^T coef[k] + intercept[k])``. ``fit((x, y), weights)`` maximises,
    for every expert at once, ``sum_n weights[n, k] log Poisson(y_n | rate_k(x_n)) - ridge / 2 *
    ||coef[k]||^2`` (the intercept is not shrunk) by damped Newton: the objective is concave, so
    Newton converges to the unique maximiser (to ``tol`` on the Newton decrement). ``y`` may be any
    non-negative reals there (soft targets: the OT reduction fits the mean rate of local experts);
    a :class:`~ppmix.models.MixtureOfExperts` accepts counts only.

    Parameters
    ----------
    coef : Tensor, shape (K, P)
    intercept : Tensor, shape (K,), optional (zeros)
    ridge : float, default 1e-6
        Penalty ``ridge / 2 * ||coef[k]||^2``.
    max_iter, tol : Newton iteration limit and tolerance on the Newton decrement.
    prior : LinearPrior, optional
        Normal priors on the slopes and intercepts (a MAP fit): ``ridge`` becomes ``1 / slope_scale^2`` and
        :meth:`penalty` adds the intercepts' term.

    Examples
    --------
    >>> import torch
    >>> x = torch.linspace(-1, 1, 200, dtype=torch.float64)[:, None]
    >>> y = torch.poisson((1 + 2 * x[:, 0]).exp(), generator=torch.Generator().manual_seed(0))
    >>> experts = PoissonExpert(torch.zeros(1, 1, dtype=torch.float64)).fit((x, y), torch.ones(200, 1).double())
    >>> experts.converged_, experts.coef.round(decimals=1).tolist()
    (True, [[2.0]])
    """

    newton_tol = 1e-12
    response_values = "non-negative values (counts)"

    def _valid_response(self, y: torch.Tensor) -> bool:
        return not bool((y < 0).any())

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """The rates ``E[y | x, k] = exp(x^T coef[k] + intercept[k])``, shape ``(N, K)``."""
        return self.linear_predictor(x).exp()

    def log_prob(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``y eta_k - exp(eta_k) - log(y!)``, shape ``(N, K)``."""
        x, y = self._pair(data)
        eta = self.linear_predictor(x)
        return y[:, None] * eta - eta.exp() - torch.lgamma(y + 1)[:, None]

    def _negative_log_likelihood(self, eta: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return eta.exp() - y[:, None] * eta

    def _residual_and_curvature(self, eta: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rate = eta.exp()
        return rate - y[:, None], rate

    def response_quadrature(
        self, eta: torch.Tensor, index: torch.Tensor, n_nodes: int = 8
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The counts around the rate ``exp(eta[n])`` and their Poisson probabilities: ``(values, weights)``,
        each of shape ``(N, W)``.

        Row ``n`` enumerates ``W`` consecutive counts from ``max(0, floor(rate - 8 sqrt(rate) - 8))``
        (``W`` is set by the largest rate, so that every window reaches ``rate + 8 sqrt(rate) + 8``);
        the Poisson mass outside is below 1e-14 and the weights of a row are renormalised to sum to one,
        so ``sum_j weights[n, j] h(values[n, j])`` is ``E[h(y)]`` up to that mass. ``index`` and
        ``n_nodes`` are unused (the interface of :meth:`GaussianExpert.response_quadrature`).

        Examples
        --------
        >>> import torch
        >>> experts = PoissonExpert(torch.zeros(1, 1, dtype=torch.float64))
        >>> y, w = experts.response_quadrature(torch.tensor([math.log(3.0)], dtype=torch.float64), torch.tensor([0]))
        >>> round(float((w * y).sum()), 12), round(float((w * (y - 3) ** 2).sum()), 12)
        (3.0, 3.0)
        """
        rate = eta.exp()
        spread = _WINDOW_SDS * rate.sqrt() + _WINDOW_SDS
        low = (rate - spread).floor().clamp_min(0.0)
        width = int(math.ceil(float((rate + spread - low).max()))) + 1 if rate.numel() else 1
        values = low[:, None] + torch.arange(width, dtype=eta.dtype, device=eta.device)
        log_pmf = values * eta[:, None] - rate[:, None] - torch.lgamma(values + 1)
        return values, torch.softmax(log_pmf, dim=-1)

    def pyro_dist(self, index: torch.Tensor | None = None, x: torch.Tensor | None = None) -> dist.Distribution:
        """``Poisson(rate = exp(x^T coef[index] + intercept[index]))``."""
        if x is None:
            raise ValueError("x (the covariates) is required for an expert's distribution")
        return dist.Poisson(self._indexed_predictor(index, x).exp())

    def sample(self, index: torch.Tensor, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Counts drawn from expert ``index[n]`` at covariates ``x[n]``."""
        rate = self._indexed_predictor(index, self._covariates(x)).exp()
        return torch.poisson(rate, generator=generator)

    def kl_at_predictors(
        self, eta_p: torch.Tensor, index_p: torch.Tensor, other: "PoissonExpert", eta_q: torch.Tensor
    ) -> torch.Tensor:
        """``KL(Poisson(exp(eta_p)) || Poisson(exp(eta_q))) = lambda_p (eta_p - eta_q) - lambda_p + lambda_q``,
        broadcast over the trailing axis ``K'`` (``index_p`` unused: the log-rate is all of a component).

        Examples
        --------
        >>> import torch
        >>> p = PoissonExpert(torch.zeros(2, 1, dtype=torch.float64))
        >>> eta_q = torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64)
        >>> [round(v, 12) for v in p.kl_at_predictors(torch.zeros(1, 1).double(), None, p, eta_q)[0].tolist()]
        [0.0, 0.30685281944]
        """
        rate_p = eta_p.exp()
        return rate_p * (eta_p - eta_q) - rate_p + eta_q.exp()


class PoissonExpertFamily(ExpertFamily):
    """Poisson-regression experts for :class:`~ppmix.models.MixtureOfExperts` (``expert="poisson"``): a count
    target (non-negative integers), sites ``coef`` and ``intercept`` of the log-rate; the model is a regressor
    (``predict`` is ``E[y | x]``, ``score`` its R²). Every M-step runs Newton to convergence (the objective is
    concave and Newton cheap), so EM is exact rather than generalised.

    Examples
    --------
    >>> PoissonExpertFamily().check_target(np.array([0.0, 2.5, -1.0]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: y must hold counts (non-negative integers) for poisson experts; got values such as [-1.0, 2.5]
    """

    name = "poisson"
    target_kind = "count"
    default_ridge = 1e-6

    def check_target(self, y: np.ndarray, name: str = "y") -> None:
        bad = (y < 0) | (y != np.round(y))
        if bad.any():
            values = np.unique(y[bad])[:5].tolist()
            raise ValueError(
                f"{name} must hold counts (non-negative integers) for poisson experts; got values such as {values}"
            )

    def prior(self, site: str, k: int, event: tuple[int, ...], scale: TargetScale, opts: dict) -> dist.Distribution:
        """``N(log mean(y), 10^2)`` on the intercepts (the log-rate at the covariates' mean), ``N(0, 10^2)`` on the
        slopes: :meth:`configured_prior` at its defaults."""
        return self.configured_prior(site, k, event, {}, scale, opts)

    def linear_prior(self, priors: Mapping[str, float], scale: TargetScale) -> LinearPrior:
        """Normal priors on the slopes (at 0) and on the intercepts, the log-rate at the covariates' mean (at
        ``log mean(y)``)."""
        prior = super().linear_prior(priors, scale)
        log_mean = scale.get("mean", torch.tensor(1.0)).clamp_min(1e-3).log()
        return LinearPrior(prior.slope_scale, prior.intercept_scale, float(log_mean))

    def experts(
        self,
        params: dict[str, torch.Tensor],
        ridge: float,
        newton_steps: int,
        noise_floor: float,
        priors: Mapping[str, float] | None = None,
        scale: TargetScale | None = None,
    ) -> Any:
        prior = None if priors is None else self.linear_prior(priors, scale or {})
        return PoissonExpert(params["coef"], params["intercept"], ridge=ridge, prior=prior)

    def expected_target(self, experts: ComponentFamily, x: torch.Tensor) -> torch.Tensor:
        return experts.mean(x)
