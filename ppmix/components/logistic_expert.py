"""Logistic-regression experts: ``y | x, k ~ Bernoulli(sigmoid(x^T coef[k] + intercept[k]))``."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyro.distributions as dist
import torch
import torch.nn.functional as F

from ppmix.components._linear import GLMExperts
from ppmix.components.base import ComponentFamily
from ppmix.components.expert_family import ExpertFamily, TargetScale

__all__ = ["LogisticExpert", "LogisticExpertFamily"]


class LogisticExpert(GLMExperts):
    """``K`` logistic-regression experts for a binary (or soft) response.

    Parameters
    ----------
    coef : Tensor, shape (K, P)
    intercept : Tensor, shape (K,), optional (zeros)
    ridge : float, default 1e-6
        Penalty ``ridge / 2 * ||coef[k]||^2`` (intercept not shrunk); keeps the
        Newton/IRLS fit finite on separable data.
    max_iter, tol : Newton iteration limit and tolerance on the Newton decrement.
    prior : LinearPrior, optional
        Normal priors on the slopes and intercepts (a MAP fit): ``ridge`` becomes ``1 / slope_scale^2`` and
        :meth:`penalty` adds the intercepts' term.

    Examples
    --------
    >>> import torch
    >>> experts = LogisticExpert(torch.zeros(2, 3))
    >>> x = torch.randn(40, 3, dtype=torch.float64)
    >>> y = (x[:, 0] > 0).double()
    >>> experts.to(dtype=torch.float64).fit((x, y), torch.rand(40, 2, dtype=torch.float64)).coef.shape
    torch.Size([2, 3])
    """

    newton_tol = 1e-10
    response_values = "values in [0, 1]"

    def _valid_response(self, y: torch.Tensor) -> bool:
        return not bool((y < 0).any() or (y > 1).any())

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """``P(y = 1 | x, k)``, shape ``(N, K)``."""
        return torch.sigmoid(self.linear_predictor(x))

    def log_prob(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``y log s + (1 - y) log(1 - s)`` with ``s = sigmoid(eta_k)``, shape ``(N, K)``."""
        x, y = self._pair(data)
        eta = self.linear_predictor(x)
        return y[:, None] * F.logsigmoid(eta) + (1 - y[:, None]) * F.logsigmoid(-eta)

    def _negative_log_likelihood(self, eta: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -(y[:, None] * F.logsigmoid(eta) + (1 - y[:, None]) * F.logsigmoid(-eta))

    def _residual_and_curvature(self, eta: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.sigmoid(eta)
        return p - y[:, None], p * (1 - p)

    def response_quadrature(
        self, eta: torch.Tensor, index: torch.Tensor, n_nodes: int = 2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The two outcomes and their probabilities under log-odds ``eta``: ``(values, weights)``.

        ``values`` is ``[0, 1]`` (shape ``(2,)``, shared by every row) and ``weights[n]`` is
        ``[1 - sigmoid(eta[n]), sigmoid(eta[n])]``, so ``sum_j weights[n, j] h(values[j])``
        is ``E[h(y)]`` exactly. ``index`` and ``n_nodes`` are unused: the interface is
        that of :meth:`GaussianExpert.response_quadrature`, whose nodes depend on the row.

        Examples
        --------
        >>> import torch
        >>> experts = LogisticExpert(torch.zeros(1, 1, dtype=torch.float64))
        >>> y, w = experts.response_quadrature(torch.tensor([0.0], dtype=torch.float64), torch.tensor([0]))
        >>> y.tolist(), w.tolist()
        ([0.0, 1.0], [[0.5, 0.5]])
        """
        p = torch.sigmoid(eta)
        return torch.tensor([0.0, 1.0], dtype=eta.dtype, device=eta.device), torch.stack([1 - p, p], dim=-1)

    def pyro_dist(self, index: torch.Tensor | None = None, x: torch.Tensor | None = None) -> dist.Distribution:
        """``Bernoulli(logits = x^T coef[index] + intercept[index])``."""
        if x is None:
            raise ValueError("x (the covariates) is required for an expert's distribution")
        return dist.Bernoulli(logits=self._indexed_predictor(index, x))

    def sample(self, index: torch.Tensor, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Binary responses drawn from expert ``index[n]`` at covariates ``x[n]``."""
        p = torch.sigmoid(self._indexed_predictor(index, self._covariates(x)))
        return (torch.rand(p.shape, generator=generator, dtype=self.dtype, device=self.device) < p).to(self.dtype)

    def kl_at_predictors(
        self, eta_p: torch.Tensor, index_p: torch.Tensor, other: "LogisticExpert", eta_q: torch.Tensor
    ) -> torch.Tensor:
        """``KL(Bern(sigmoid(eta_p)) || Bern(sigmoid(eta_q)))``, broadcast over the trailing axis ``K'``.

        ``eta_p`` holds log-odds of this family's components ``index_p`` (unused: logistic
        experts have no per-component parameter besides the log-odds) and ``eta_q`` the
        log-odds of all of ``other``'s components at the same points (``(..., K')``).

        Examples
        --------
        >>> import torch
        >>> p = LogisticExpert(torch.zeros(2, 1))
        >>> p.kl_at_predictors(torch.zeros(1, 1), torch.tensor([[0]]), p, torch.zeros(1, 2)).tolist()
        [[0.0, 0.0]]
        """
        p = torch.sigmoid(eta_p)
        return p * (F.logsigmoid(eta_p) - F.logsigmoid(eta_q)) + (1 - p) * (F.logsigmoid(-eta_p) - F.logsigmoid(-eta_q))


class LogisticExpertFamily(ExpertFamily):
    """Logistic-regression experts for :class:`~ppmix.models.MixtureOfExperts` (``expert="logistic"``): a
    binary target (any two labels, coded 0/1), sites ``coef`` and ``intercept``.

    Examples
    --------
    >>> LogisticExpertFamily().check_target(np.array([0.0, 2.0]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: y must be binary (0/1) for logistic experts; got values such as [2.0]
    """

    name = "logistic"
    target_kind = "binary"
    default_ridge = 1e-2

    def check_target(self, y: np.ndarray, name: str = "y") -> None:
        if not np.isin(y, (0.0, 1.0)).all():
            bad = np.unique(y[~np.isin(y, (0.0, 1.0))])[:5].tolist()
            raise ValueError(f"{name} must be binary (0/1) for logistic experts; got values such as {bad}")

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
        return LogisticExpert(params["coef"], params["intercept"], ridge=ridge, max_iter=newton_steps, prior=prior)

    def expected_target(self, experts: ComponentFamily, x: torch.Tensor) -> torch.Tensor:
        return experts.predict_proba(x)
