"""Softmax gating network: ``P(k | x) = softmax(x^T coef + intercept)_k`` with the last gate fixed to 0."""

from __future__ import annotations

import pyro.distributions as dist
import torch

from ppmix.components._linear import LinearFamily, design_matrix
from ppmix.components._newton import damped_newton

__all__ = ["SoftmaxGate"]


class SoftmaxGate(LinearFamily):
    """Multinomial-logistic gate over ``K`` components; row ``K-1`` of the parameters is 0.

    ``fit(x, targets)`` maximises ``sum_nk targets[n, k] log P(k | x_n)`` (soft targets,
    e.g. EM responsibilities; rows need not sum to one: their sum acts as a sample
    weight) minus ``ridge / 2 * ||coef||^2``, by damped Newton.

    Parameters
    ----------
    coef : Tensor, shape (K, P)
    intercept : Tensor, shape (K,), optional (zeros)
    ridge : float, default 1e-6
    max_iter, tol : Newton iteration limit and tolerance on the Newton decrement.

    Examples
    --------
    >>> import torch
    >>> gate = SoftmaxGate(torch.zeros(3, 2, dtype=torch.float64))
    >>> x = torch.randn(30, 2, dtype=torch.float64)
    >>> gate.fit(x, torch.softmax(x @ torch.randn(2, 3, dtype=torch.float64), -1)).log_prob(x).shape
    torch.Size([30, 3])
    >>> float(gate.coef[-1].abs().sum())
    0.0
    """

    param_names = ("coef", "intercept")

    def __init__(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor | None = None,
        ridge: float = 1e-6,
        max_iter: int = 100,
        tol: float = 1e-10,
    ) -> None:
        self._init_linear(coef, intercept, ridge)
        if self.coef.shape[0] < 1:
            raise ValueError("a gate needs at least one component")
        self.coef = self.coef - self.coef[-1]
        self.intercept = self.intercept - self.intercept[-1]
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.n_iter_: int = 0
        self.converged_: bool = False

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log P(k | x_n)``, shape ``(N, K)``."""
        return torch.log_softmax(self.linear_predictor(x), dim=-1)

    def fit(self, x: torch.Tensor, weights: torch.Tensor) -> "SoftmaxGate":
        """Softmax regression on soft targets ``weights[N, K]`` by damped Newton, in place."""
        x = self._covariates(x)
        targets = self._check_weights(weights, x.shape[0])
        k, m = self.n_components, self.n_covariates + 1
        if k == 1:
            return self
        a = design_matrix(x)
        totals = targets.sum(1)
        ridge = self._ridge_matrix()
        free = k - 1

        def full(theta: torch.Tensor) -> torch.Tensor:
            return torch.cat([theta.reshape(free, m), torch.zeros(1, m, dtype=theta.dtype, device=theta.device)])

        def objective(theta: torch.Tensor, derivatives: bool):
            params = full(theta[0])
            log_p = torch.log_softmax(a @ params.T, dim=-1)  # (N, K)
            value = -(targets * log_p).sum() + 0.5 * ((params @ ridge) * params).sum()
            if not derivatives:
                return value[None], None, None
            p = log_p.exp()[:, :free]
            grad = ((totals[:, None] * p - targets[:, :free]).T @ a + params[:free] @ ridge).reshape(1, -1)
            hess = torch.empty(free, m, free, m, dtype=a.dtype, device=a.device)
            for i in range(free):
                for j in range(i, free):
                    c = totals * p[:, i] * (float(i == j) - p[:, j])
                    block = (c[:, None] * a).T @ a
                    if i == j:
                        block = block + ridge
                    hess[i, :, j, :] = block
                    hess[j, :, i, :] = block.T
            return value[None], grad, hess.reshape(1, free * m, free * m)

        start = self._stacked()[:free].reshape(1, -1)
        theta, self.n_iter_, self.converged_ = damped_newton(objective, start, max_iter=self.max_iter, tol=self.tol)
        self._unstack(full(theta[0]))
        return self

    def pyro_dist(self, index: torch.Tensor | None = None, x: torch.Tensor | None = None) -> dist.Distribution:
        """``Categorical(logits = x^T coef + intercept)`` over the components (``index`` unused)."""
        if x is None:
            raise ValueError("x (the covariates) is required for the gate's distribution")
        return dist.Categorical(logits=self.linear_predictor(x))

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One component index per row of ``x``."""
        return torch.multinomial(self.log_prob(x).exp(), 1, generator=generator).squeeze(-1)
