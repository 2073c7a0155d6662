"""Softmax-regression (multinomial logistic) experts: ``y | x, k ~ Categorical(softmax(coef[k] x + intercept[k]))``."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyro.distributions as dist
import torch

from ppmix.components._linear import LinearFamily, LinearPrior
from ppmix.components.expert_family import ExpertFamily, TargetScale
from ppmix.components.softmax_gate import SoftmaxGate

__all__ = ["SoftmaxExpert", "SoftmaxExpertFamily"]


class SoftmaxExpert(LinearFamily):
    """``K`` softmax-regression experts for a response with ``C`` classes.

    Expert ``k`` gives class ``c`` the probability ``softmax_c(coef[k] @ x + intercept[k])``.
    The last class is the reference: ``coef[k, C-1]`` and ``intercept[k, C-1]`` are fixed at 0
    (the given parameters are shifted so, which leaves every probability unchanged), so with
    ``C = 2`` an expert is a :class:`~ppmix.components.LogisticExpert` whose log-odds of class 1
    are ``-(coef[k, 0] @ x + intercept[k, 0])``, with the same penalty.

    ``fit((x, y), weights)`` maximises, for every expert at once,
    ``sum_n weights[n, k] sum_c T[n, c] log P(c | x_n, k) - ridge / 2 * ||coef[k]||^2``
    (the intercepts are not shrunk) by damped Newton: each expert is a
    :class:`~ppmix.components.SoftmaxGate` fit on the soft targets ``weights[:, k] * T``,
    with its Hessian (:func:`~ppmix.components.softmax_gate.softmax_hessian`).
    ``T`` is the one-hot matrix of integer labels ``y`` in ``{0, ..., C-1}``, or ``y`` itself
    when it is given as rows of class probabilities of shape ``(N, C)``.

    Parameters
    ----------
    coef : Tensor, shape (K, C, P)
    intercept : Tensor, shape (K, C), optional (zeros)
    ridge : float, default 1e-6
        Penalty ``ridge / 2 * ||coef[k]||^2``; keeps the fit finite on separable data.
    max_iter, tol : Newton iteration limit and tolerance on the Newton decrement (per expert).
    prior : LinearPrior, optional
        Normal priors on every class's slopes and intercepts (centred at 0; the reference class's are the fixed
        zeros): ``ridge`` becomes ``1 / slope_scale^2`` and the intercepts are shrunk too (a MAP fit).

    Examples
    --------
    >>> import torch
    >>> experts = SoftmaxExpert(torch.zeros(2, 3, 4, dtype=torch.float64), ridge=1e-2)
    >>> x = torch.randn(60, 4, dtype=torch.float64)
    >>> y = x[:, :2].argmax(1) + (x[:, 2] > 1)
    >>> experts.fit((x, y), torch.rand(60, 2, dtype=torch.float64)).predict_proba(x).shape
    torch.Size([60, 2, 3])
    >>> experts.n_classes, float(experts.coef[:, -1].abs().sum())
    (3, 0.0)
    """

    param_names = ("coef", "intercept")

    def __init__(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor | None = None,
        ridge: float = 1e-6,
        max_iter: int = 100,
        tol: float = 1e-10,
        prior: LinearPrior | None = None,
    ) -> None:
        self._init_linear(coef, intercept, ridge, shape="(K, C, P)", prior=prior)
        if self.coef.shape[1] < 2:
            raise ValueError(f"coef must have shape (K, C, P) with C >= 2 classes; got {tuple(self.coef.shape)}")
        self.coef = self.coef - self.coef[:, -1:]  # the last class is the reference
        self.intercept = self.intercept - self.intercept[:, -1:]
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.n_iter_: int = 0
        self.converged_: bool = False

    @property
    def n_classes(self) -> int:
        """Number of classes ``C``."""
        return int(self.coef.shape[1])

    def _targets(self, y: torch.Tensor, n: int) -> torch.Tensor:
        """``T``: one-hot rows of integer labels, or the given rows of class probabilities, shape ``(N, C)``."""
        c = self.n_classes
        y = torch.as_tensor(y).to(device=self.device)
        if y.shape == (n, c) and y.is_floating_point():
            y = y.to(self.dtype)
            if (y < 0).any() or not torch.allclose(y.sum(1), torch.ones_like(y[:, 0])):
                raise ValueError("y given as class probabilities must have non-negative rows that sum to 1")
            return y
        if y.shape != (n,) or (y != y.round()).any() or (y < 0).any() or (y >= c).any():
            raise ValueError(f"y must have shape ({n},) with integer labels in [0, {c}), or shape ({n}, {c})")
        return torch.nn.functional.one_hot(y.long(), c).to(self.dtype)

    def _pair(self, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError("data must be a pair (x, y)")
        x = self._covariates(data[0])
        return x, self._targets(data[1], x.shape[0])

    def linear_predictor(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``coef[k] @ x_n + intercept[k]``, shape ``(N, K, C)`` (0 for the last class)."""
        return torch.einsum("np,kcp->nkc", self._covariates(x), self.coef) + self.intercept

    def _indexed_predictor(self, index: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """Logits of expert ``index`` (broadcast against the rows of ``x``), shape ``(..., C)``."""
        if index is None:
            return self.linear_predictor(x)
        return (self.coef[index] * x[..., None, :]).sum(-1) + self.intercept[index]

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """``P(y = c | x, k)``, shape ``(N, K, C)``."""
        return torch.softmax(self.linear_predictor(x), dim=-1)

    def log_prob(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``sum_c T[n, c] log P(c | x_n, k)``, shape ``(N, K)``."""
        x, targets = self._pair(data)
        return torch.einsum("nkc,nc->nk", torch.log_softmax(self.linear_predictor(x), dim=-1), targets)

    def fit(self, data: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor) -> "SoftmaxExpert":
        """Weighted penalised MLE of every expert by damped Newton, in place (see the class docstring)."""
        x, targets = self._pair(data)
        weights = self._check_weights(weights, x.shape[0])
        coef, intercept = self.coef.clone(), self.intercept.clone()
        n_iter, converged = 0, True
        for k in range(self.n_components):
            gate = SoftmaxGate(
                coef[k],
                intercept[k],
                ridge=self.ridge,
                max_iter=self.max_iter,
                tol=self.tol,
                centred_penalty=False,
                prior=self.prior,
            )
            gate.fit(x, weights[:, k : k + 1] * targets)
            coef[k], intercept[k] = gate.coef, gate.intercept
            n_iter, converged = max(n_iter, gate.n_iter_), converged and gate.converged_
        self.coef, self.intercept, self.n_iter_, self.converged_ = coef, intercept, n_iter, converged
        return self

    def pyro_dist(self, index: torch.Tensor | None = None, x: torch.Tensor | None = None) -> dist.Distribution:
        """``Categorical(logits = coef[index] @ x + intercept[index])`` over the ``C`` classes."""
        if x is None:
            raise ValueError("x (the covariates) is required for an expert's distribution")
        return dist.Categorical(logits=self._indexed_predictor(index, x))

    def sample(self, index: torch.Tensor, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Class labels (as floats of the family's dtype) drawn from expert ``index[n]`` at covariates ``x[n]``."""
        proba = torch.softmax(self._indexed_predictor(index, self._covariates(x)), dim=-1)
        return torch.multinomial(proba, 1, generator=generator).squeeze(-1).to(self.dtype)

    def kl(self, other: "SoftmaxExpert", x: torch.Tensor) -> torch.Tensor:
        """``KL(Cat(p_k(x_n)) || Cat(q_l(x_n)))`` for every point and pair, shape ``(N, K, K')``.

        Examples
        --------
        >>> import torch
        >>> experts = SoftmaxExpert(torch.zeros(2, 3, 1))
        >>> experts.kl(experts, torch.ones(4, 1)).abs().max().item()
        0.0
        """
        log_p = torch.log_softmax(self.linear_predictor(x), dim=-1)[:, :, None]
        log_q = torch.log_softmax(other.linear_predictor(x), dim=-1)[:, None]
        return (log_p.exp() * (log_p - log_q)).sum(-1)


class SoftmaxExpertFamily(ExpertFamily):
    """Softmax-regression experts for :class:`~ppmix.models.MixtureOfExperts` (``expert="softmax"``): a
    categorical target (any labels, coded ``0, ..., C-1``), sites ``coef`` ``(K, C, P)`` and ``intercept``
    ``(K, C)`` (the last class the reference).

    Examples
    --------
    >>> SoftmaxExpertFamily().n_parameters(2, 3, 4)
    24
    """

    name = "softmax"
    target_kind = "categorical"
    default_ridge = 1e-2

    def check_target(self, y: np.ndarray, name: str = "y") -> None:
        if (y < 0).any() or (y != np.round(y)).any():
            raise ValueError(f"{name} must hold class codes 0, 1, ..., C-1 for softmax experts")

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
        return SoftmaxExpert(params["coef"], params["intercept"], ridge=ridge, max_iter=newton_steps, prior=prior)
