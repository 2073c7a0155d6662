"""Shared machinery of the families with a linear predictor ``x @ coef[k] + intercept[k]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ppmix.algorithms.newton import damped_newton
from ppmix.components.base import ParameterBatch
from ppmix.ops.threads import torch_threads

#: elements of the per-chunk GEMM operand of :func:`weighted_grams` (4 MiB in float64: cache-sized;
#: fastest at N = 10^6)
_CHUNK_ELEMENTS = 2**19


def design_matrix(x: torch.Tensor) -> torch.Tensor:
    """``[x, 1]``: the covariates with an intercept column appended."""
    return torch.cat([x, torch.ones_like(x[:, :1])], dim=1)


def weighted_grams(
    a: torch.Tensor,
    weights: torch.Tensor | Callable[[slice], torch.Tensor],
    n_weights: int | None = None,
) -> torch.Tensor:
    """Weighted Gram matrices ``a^T diag(weights[:, q]) a`` for every column ``q``, shape ``(Q, M, M)``.

    Chunk by chunk of rows, one GEMM per chunk gives all ``Q`` Grams at once,
    ``A_c^T [w_cq A_c]_q`` with the ``(rows, Q * M)`` operand made in cache, instead of a
    ``(Q, N, M)`` temporary. The loop runs on one thread: on a busy 2-core machine a parallel
    region per chunk waits at its barriers (a softmax Hessian at N = 10^6 took 7.5 s instead of 0.3 s).

    Parameters
    ----------
    a : Tensor, shape (N, M)
        The design.
    weights : Tensor, shape (N, Q), or callable
        The weight columns; or a function that maps a slice of rows to that chunk's
        ``(rows, Q)`` weights, for weights that are cheap to make per chunk and would be large
        to hold in full (then ``n_weights`` gives ``Q``).
    n_weights : int, optional
        ``Q``; required when ``weights`` is a callable.

    Returns
    -------
    Tensor, shape (Q, M, M)
        ``out[q] = a.T @ (weights[:, q:q + 1] * a)`` (symmetric up to rounding).

    Examples
    --------
    >>> import torch
    >>> a, w = torch.randn(100, 3, dtype=torch.float64), torch.rand(100, 2, dtype=torch.float64)
    >>> grams = weighted_grams(a, w)
    >>> grams.shape
    torch.Size([2, 3, 3])
    >>> torch.allclose(grams[1], a.T @ (w[:, 1:] * a))
    True
    >>> torch.allclose(weighted_grams(a, lambda rows: w[rows], n_weights=2), grams)
    True
    """
    if callable(weights):
        if n_weights is None:
            raise ValueError("n_weights is required when weights is a callable")
        q, weights_of = int(n_weights), weights
    else:
        if weights.dim() != 2 or weights.shape[0] != a.shape[0]:
            raise ValueError(f"weights must have shape ({a.shape[0]}, Q); got {tuple(weights.shape)}")
        q, weights_of = weights.shape[1], weights.__getitem__
    (n, m) = a.shape
    grams = a.new_zeros(m, q * m)
    step = max(1, _CHUNK_ELEMENTS // max(1, q * m))
    with torch_threads(1):
        for start in range(0, n, step):
            rows = slice(start, start + step)
            chunk = a[rows]
            grams.addmm_(chunk.T, (weights_of(rows)[:, :, None] * chunk[:, None, :]).flatten(1))
    return grams.view(m, q, m).transpose(0, 1).contiguous()


@dataclass(frozen=True)
class LinearPrior:
    """Independent normal priors on a linear predictor's parameters: ``coef ~ N(0, slope_scale^2)`` entry by entry,
    ``intercept ~ N(intercept_loc, intercept_scale^2)`` (a MAP fit's penalty, :meth:`LinearFamily.penalty`, is minus
    their log density up to a constant).

    Examples
    --------
    >>> prior = LinearPrior(slope_scale=10.0, intercept_scale=2.0, intercept_loc=1.0)
    >>> prior.slope_precision, prior.intercept_precision
    (0.01, 0.25)
    """

    slope_scale: float
    intercept_scale: float
    intercept_loc: float = 0.0

    @property
    def slope_precision(self) -> float:
        return 1.0 / self.slope_scale**2

    @property
    def intercept_precision(self) -> float:
        return 1.0 / self.intercept_scale**2


class LinearFamily(ParameterBatch):
    """A family whose ``K`` members each have coefficients ``coef[k]`` and ``intercept[k]``."""

    #: the normal prior on the intercepts a MAP fit adds (precision 0: flat, the intercepts are not shrunk)
    intercept_ridge: float = 0.0
    intercept_loc: float = 0.0

    def _init_linear(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor | None,
        ridge: float,
        shape: str = "(K, P)",
        prior: LinearPrior | None = None,
    ) -> None:
        """Check and set ``coef`` of ``shape`` (``"(K, P)"``, or ``"(K, C, P)"`` with one row per class),
        ``intercept`` of ``coef``'s shape less its last axis (zeros when ``None``) and ``ridge``; a ``prior`` sets
        the ridge (``1 / slope_scale^2``) and the intercepts' normal prior in its place."""
        coef = torch.as_tensor(coef)
        if coef.dim() != shape.count(",") + 1:
            raise ValueError(f"coef must have shape {shape}; got {tuple(coef.shape)}")
        if intercept is None:
            intercept = torch.zeros(coef.shape[:-1], dtype=coef.dtype, device=coef.device)
        intercept = torch.as_tensor(intercept)
        if intercept.shape != coef.shape[:-1]:
            raise ValueError(f"intercept must have shape {tuple(coef.shape[:-1])}; got {tuple(intercept.shape)}")
        if ridge < 0:
            raise ValueError("ridge must be non-negative")
        self.coef, self.intercept, self.ridge = coef, intercept.to(coef.dtype), float(ridge)
        self.prior = prior
        if prior is not None:
            self.ridge, self.intercept_ridge = prior.slope_precision, prior.intercept_precision
            self.intercept_loc = float(prior.intercept_loc)

    @property
    def n_covariates(self) -> int:
        return int(self.coef.shape[-1])

    def _covariates(self, x: torch.Tensor, name: str = "x") -> torch.Tensor:
        x = torch.as_tensor(x).to(device=self.device, dtype=self.dtype)
        if x.dim() != 2 or x.shape[1] != self.n_covariates:
            raise ValueError(f"{name} must have shape (N, {self.n_covariates}); got {tuple(x.shape)}")
        return x

    def linear_predictor(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ coef.T + intercept``, shape ``(N, K)``."""
        return torch.addmm(self.intercept, self._covariates(x), self.coef.T)

    def _indexed_predictor(self, index: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """Linear predictor of component ``index`` (broadcast against the rows of ``x``)."""
        if index is None:
            return self.linear_predictor(x)
        return (self.coef[index] * x).sum(-1) + self.intercept[index]

    def _stacked(self) -> torch.Tensor:
        """Parameters as one ``(K, P + 1)`` matrix matching :func:`design_matrix`."""
        return torch.cat([self.coef, self.intercept[:, None]], dim=1)

    def _unstack(self, theta: torch.Tensor) -> None:
        self.coef, self.intercept = theta[:, :-1].contiguous(), theta[:, -1].contiguous()

    def penalty(self) -> torch.Tensor:
        """The ridge term of each member's penalised log-likelihood, ``ridge / 2 * ||coef[k]||^2`` (the intercept
        is not shrunk; with a :class:`LinearPrior`, ``intercept_ridge / 2 * ||intercept[k] - intercept_loc||^2`` is
        added), shape ``(K,)``: what :meth:`fit` subtracts from the weighted log-likelihood it maximises.

        Examples
        --------
        >>> import torch
        >>> from ppmix.components import LogisticExpert
        >>> LogisticExpert(torch.tensor([[3.0, 4.0], [0.0, 1.0]]), ridge=2.0).penalty().tolist()
        [25.0, 1.0]
        >>> prior = LinearPrior(slope_scale=1.0, intercept_scale=0.5, intercept_loc=1.0)
        >>> LogisticExpert(torch.tensor([[3.0, 4.0]]), torch.tensor([2.0]), prior=prior).penalty().tolist()
        [14.5]
        """
        penalty = 0.5 * self.ridge * self.coef.square().flatten(1).sum(-1)
        offset = (self.intercept - self.intercept_loc).reshape(self.intercept.shape[0], -1)  # intercept_ridge 0: none
        return penalty + 0.5 * self.intercept_ridge * offset.square().sum(-1)

    def _ridge_matrix(self) -> torch.Tensor:
        """Ridge penalty on the coefficients, and on the intercept the precision of its prior (0 without one)."""
        diag = torch.full((self.n_covariates + 1,), self.ridge, dtype=self.dtype, device=self.device)
        diag[-1] = self.intercept_ridge
        return torch.diag(diag)

    def _prior_centre(self) -> torch.Tensor:
        """The prior mean of ``[coef[k], intercept[k]]`` (zeros, and ``intercept_loc`` last), shape ``(P + 1,)``."""
        centre = torch.zeros(self.n_covariates + 1, dtype=self.dtype, device=self.device)
        centre[-1] = self.intercept_loc
        return centre


class GLMExperts(LinearFamily):
    """``K`` generalised-linear experts of a scalar response with linear predictor ``eta_k = x^T coef[k] +
    intercept[k]``: the constructor, the ``(x, y)`` check, the weighted penalised maximum-likelihood M-step by
    damped Newton and the pairwise KL, shared by the logistic and the Poisson experts.

    A subclass gives the per-point negative log-likelihood in ``eta`` (up to a term free of the parameters),
    its first and second derivatives, which responses it takes (``_valid_response``, described by
    ``response_values``) and ``kl_at_predictors``. ``tol`` defaults to the subclass's ``newton_tol``.
    """

    param_names = ("coef", "intercept")
    #: the Newton tolerance (on the decrement) when ``tol`` is not given
    newton_tol = 1e-10
    #: what ``y`` must hold, for the error of a bad one
    response_values = "any values"

    def __init__(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor | None = None,
        ridge: float = 1e-6,
        max_iter: int = 100,
        tol: float | None = None,
        prior: LinearPrior | None = None,
    ) -> None:
        self._init_linear(coef, intercept, ridge, prior=prior)
        self.max_iter, self.tol = int(max_iter), float(self.newton_tol if tol is None else tol)
        self.n_iter_: int = 0
        self.converged_: bool = False

    def _valid_response(self, y: torch.Tensor) -> bool:
        return True

    def _negative_log_likelihood(self, eta: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``-log p(y_n | eta_nk)`` up to a term free of ``eta``, ``(N, K)`` (``y`` is ``(N,)``)."""
        raise NotImplementedError(f"{type(self).__name__} must define _negative_log_likelihood")

    def _residual_and_curvature(self, eta: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first and second derivatives of :meth:`_negative_log_likelihood` in ``eta``, ``(N, K)`` each."""
        raise NotImplementedError(f"{type(self).__name__} must define _residual_and_curvature")

    def kl_at_predictors(
        self, eta_p: torch.Tensor, index_p: torch.Tensor, other: "GLMExperts", eta_q: torch.Tensor
    ) -> torch.Tensor:
        """``KL(p(. | eta_p) || q(. | eta_q))``, broadcast over the trailing axis ``K'``."""
        raise NotImplementedError(f"{type(self).__name__} must define kl_at_predictors")

    def _pair(self, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError("data must be a pair (x, y)")
        x = self._covariates(data[0])
        y = torch.as_tensor(data[1]).to(device=self.device, dtype=self.dtype)
        if y.shape != (x.shape[0],) or not self._valid_response(y):
            raise ValueError(f"y must have shape ({x.shape[0]},) with {self.response_values}")
        return x, y

    def fit(self, data: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor) -> "GLMExperts":
        """Weighted penalised MLE of every expert at once by damped Newton (IRLS), in place: minimises
        ``sum_n w_nk nll(y_n | eta_nk) + penalty_k`` for every ``k`` (:meth:`penalty`: ``ridge / 2 ||coef[k]||^2``,
        and with a :class:`LinearPrior` its intercept term)."""
        x, y = self._pair(data)
        weights = self._check_weights(weights, x.shape[0])
        a = design_matrix(x)
        ridge = self._ridge_matrix()
        centre = self._prior_centre()

        def objective(theta: torch.Tensor):
            eta = a @ theta.T  # (N, K)
            shrunk = (theta - centre) @ ridge
            value = (weights * self._negative_log_likelihood(eta, y)).sum(0) + 0.5 * (shrunk * (theta - centre)).sum(-1)

            def derivatives() -> tuple[torch.Tensor, torch.Tensor]:
                residual, curvature = self._residual_and_curvature(eta, y)
                return (weights * residual).T @ a + shrunk, weighted_grams(a, weights * curvature) + ridge

            return value, derivatives

        theta, self.n_iter_, self.converged_ = damped_newton(
            objective, self._stacked(), max_iter=self.max_iter, tol=self.tol
        )
        self._unstack(theta)
        return self

    def kl(self, other: "GLMExperts", x: torch.Tensor) -> torch.Tensor:
        """``KL(self_k(. | x_n) || other_l(. | x_n))`` for every point and pair, shape ``(N, K, K')``."""
        index = torch.arange(self.n_components, device=self.coef.device)[:, None]
        eta_p, eta_q = self.linear_predictor(x)[:, :, None], other.linear_predictor(x)[:, None, :]
        return self.kl_at_predictors(eta_p, index, other, eta_q)
