"""Softmax gating network: ``P(k | x) = softmax(x^T coef + intercept)_k`` with the last gate fixed to 0."""

from __future__ import annotations

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import TorchDistribution, constraints

from ppmix.algorithms.newton import damped_newton
from ppmix.components._linear import LinearFamily, LinearPrior, design_matrix, weighted_grams

__all__ = ["ReferencedNormal", "SoftmaxGate"]


def softmax_hessian(a: torch.Tensor, weighted: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``sum_n kron(diag(w_n) - w_n p_n^T, a_n a_n^T)``, shape ``(F * M, F * M)``.

    The Hessian of ``sum_n t_n log(1 + sum_i exp(a_n^T theta_i))`` over the ``F`` free
    rows ``theta_i`` of a softmax regression, given the design ``a`` ``(N, M)``, the
    probabilities ``p`` ``(N, F)`` and ``weighted = t[:, None] * p``: block ``(i, j)`` is
    ``A^T diag(c_ij) A`` with ``c_ij = weighted_i (delta_ij - p_j)``. One GEMM per chunk
    of rows (:func:`~ppmix.components._linear.weighted_grams`) gives the ``F (F + 1) / 2``
    distinct blocks, ``A_c^T [c_ij A_c]_{i <= j}``, with ``c`` and that
    ``(rows, F (F + 1) / 2 * M)`` operand made chunk by chunk, in cache.

    Examples
    --------
    >>> import torch
    >>> a, t = torch.randn(50, 3, dtype=torch.float64), torch.rand(50, dtype=torch.float64)
    >>> p = torch.softmax(torch.randn(50, 3, dtype=torch.float64), 1)[:, :2]
    >>> block = softmax_hessian(a, t[:, None] * p, p)[:3, 3:]
    >>> torch.allclose(block, (-t * p[:, 0] * p[:, 1])[:, None].mul(a).T @ a)
    True
    """
    m, free = a.shape[1], p.shape[1]
    rows, cols = torch.triu_indices(free, free, device=a.device)
    same = (rows == cols).to(a.dtype)

    def curvature(chunk: slice) -> torch.Tensor:  # (chunk size, pairs), made per chunk: pairs grows as K^2
        return weighted[chunk, rows] * (same - p[chunk, cols])

    blocks = weighted_grams(a, curvature, n_weights=len(rows))  # (pairs, M, M)
    hess = a.new_empty(free, m, free, m)
    hess[rows, :, cols] = blocks
    hess[cols, :, rows] = blocks.mT
    return hess.reshape(free * m, free * m)


class ReferencedNormal(TorchDistribution):
    """The free rows ``theta_k = beta_k - beta_K`` (``k < K``) of ``K`` rows ``beta_k`` with entries iid
    ``N(0, scale^2)``: the prior of a softmax gate's free rows whose reference row ``K`` is fixed at zero.

    Along the rows, every entry of the trailing shape is ``N(0, scale^2 (I + 1 1^T))``, a distribution that does
    not depend on which row is the reference; its log density is
    ``-sum_k ||theta_k - mean_j theta_j||^2 / (2 scale^2)`` (the mean over all ``K`` rows, the reference's zero
    included: :meth:`SoftmaxGate.penalty`'s centred ridge) plus a constant.

    Parameters
    ----------
    scale : float
        The standard deviation of every entry of the ``K`` rows before the reference's is subtracted.
    shape : tuple of int
        ``(K - 1, ...)``: the free rows and the shape of each (``(K - 1, P)`` slopes, ``(K - 1,)`` intercepts).
    dtype, device : of the draws.

    Examples
    --------
    >>> import torch
    >>> prior = ReferencedNormal(2.0, (1, 3), dtype=torch.float64)
    >>> theta = torch.tensor([[1.0, 0.0, -2.0]], dtype=torch.float64)
    >>> log_normal = torch.distributions.Normal(0.0, 2.0 * 2**0.5).log_prob(theta).sum()  # K = 2: one difference
    >>> bool(torch.isclose(prior.log_prob(theta), log_normal)), tuple(prior.sample((5,)).shape)
    (True, (5, 1, 3))
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(
        self,
        scale: float,
        shape: tuple[int, ...],
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
        validate_args: bool | None = None,
    ) -> None:
        free = int(shape[0])
        covariance = float(scale) ** 2 * (torch.eye(free, dtype=dtype, device=device) + 1.0)
        self._rows = dist.MultivariateNormal(torch.zeros(free, dtype=dtype, device=device), covariance)
        self.scale = float(scale)
        super().__init__(torch.Size(), torch.Size(shape), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.event_shape))

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = ()) -> torch.Tensor:
        sample_shape = torch.Size(sample_shape)
        draws = self._rows.rsample(sample_shape + self.event_shape[1:])  # (*sample, *trailing, K - 1)
        return draws.movedim(-1, len(sample_shape))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        event_dim = len(self.event_shape)
        log_density = self._rows.log_prob(value.movedim(-event_dim, -1))  # (..., *trailing)
        return log_density.flatten(log_density.dim() - event_dim + 1).sum(-1) if event_dim > 1 else log_density


class SoftmaxGate(LinearFamily):
    """Multinomial-logistic gate over ``K`` components; row ``K-1`` of the parameters is 0.

    ``fit(x, targets)`` maximises ``sum_nk targets[n, k] log P(k | x_n)`` (soft targets,
    e.g. EM responsibilities; rows need not sum to one: their sum acts as a sample
    weight) minus the ridge :meth:`penalty`, by damped Newton.

    Parameters
    ----------
    coef : Tensor, shape (K, P)
    intercept : Tensor, shape (K,), optional (zeros)
    ridge : float, default 1e-6
    max_iter, tol : Newton iteration limit and tolerance on the Newton decrement.
    centred_penalty : bool, default True
        The penalty is ``ridge / 2 * sum_k ||coef[k] - mean_j coef[j]||^2``: it shrinks the
        slopes towards their mean, so it does not depend on which component is the reference
        (the row fixed at 0). That is the right prior for exchangeable components (a mixture's
        gate: relabelling them must not change the fit). False: ``ridge / 2 * ||coef||^2``,
        shrinkage towards the reference, for categories with a fixed identity (the classes of
        :class:`~ppmix.components.SoftmaxExpert`).
    prior : LinearPrior, optional
        Normal priors on the rows before the reference's are subtracted (a MAP fit): it sets ``ridge`` to
        ``1 / slope_scale^2`` and adds ``1 / (2 intercept_scale^2) * sum_k (intercept[k] - mean_j intercept[j])^2``
        (centred, as the slopes; without ``centred_penalty``, ``intercept[k]^2``: its ``intercept_loc`` must be 0) to
        the penalty.
        With ``centred_penalty`` this is the density of :class:`ReferencedNormal`, up to a constant.

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
        centred_penalty: bool = True,
        prior: LinearPrior | None = None,
    ) -> None:
        self._init_linear(coef, intercept, ridge, prior=prior)
        if self.intercept_loc != 0:
            raise ValueError("a gate's intercept prior is centred at 0 (its intercept_loc must be 0)")
        self.centred_penalty = bool(centred_penalty)
        if self.coef.shape[0] < 1:
            raise ValueError("a gate needs at least one component")
        self.coef = self.coef - self.coef[-1]
        self.intercept = self.intercept - self.intercept[-1]
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.n_iter_: int = 0
        self.converged_: bool = False

    def penalty(self) -> torch.Tensor:
        """The ridge term of each component, shape ``(K,)``: ``ridge / 2 * ||coef[k] - mean_j coef[j]||^2``
        (``centred_penalty``; else ``ridge / 2 * ||coef[k]||^2``). The intercepts are not shrunk.

        Examples
        --------
        >>> import torch
        >>> gate = SoftmaxGate(torch.tensor([[3.0, 4.0], [-3.0, 2.0], [0.0, 0.0]]), ridge=2.0)
        >>> gate.penalty().tolist()  # the mean slope is (0, 2): shifting the reference leaves it unchanged
        [13.0, 9.0, 4.0]
        >>> float(SoftmaxGate(gate.coef - gate.coef[1], ridge=2.0).penalty().sum())
        26.0
        """
        if not self.centred_penalty:
            return super().penalty()
        penalty = 0.5 * self.ridge * (self.coef - self.coef.mean(0)).square().sum(-1)
        return penalty + 0.5 * self.intercept_ridge * (self.intercept - self.intercept.mean(0)).square()

    def penalty_hessian(self) -> torch.Tensor:
        """The Hessian of the summed :meth:`penalty` in the free parameters (rows ``0..K-2`` of ``[coef,
        intercept]``, flattened row by row), shape ``((K - 1) (P + 1), (K - 1) (P + 1))``: ``kron(C, R)`` with
        ``R`` the ridge on the slopes (and the intercepts' prior precision) and ``C = I - 1 1^T / K`` (``I`` without
        ``centred_penalty``).

        Examples
        --------
        >>> import torch
        >>> gate = SoftmaxGate(torch.randn(3, 2, dtype=torch.float64), ridge=2.0)
        >>> theta = gate._stacked()[:2].reshape(-1)
        >>> torch.allclose(0.5 * theta @ gate.penalty_hessian() @ theta, gate.penalty().sum())
        True
        """
        free = self.n_components - 1
        centring = torch.eye(free, dtype=self.dtype, device=self.device)
        if self.centred_penalty:
            centring = centring - 1.0 / self.n_components
        return torch.kron(centring, self._ridge_matrix())

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
        free = k - 1
        a = design_matrix(x)
        totals = targets.sum(1)
        # sum_nk targets[n, k] * eta[n, k] = <params, target_sums>: the targets enter the objective only through it
        target_sums = targets[:, :free].T @ a
        block_ridge = self.penalty_hessian()

        def objective(theta: torch.Tensor):
            params = theta.reshape(free, m)
            eta = a @ params.T  # (N, K-1); the last component's predictor is 0
            log_norm = torch.logsumexp(F.pad(eta, (0, 1)), dim=1)
            penalty_grad = (block_ridge @ theta.reshape(-1)).reshape(free, m)
            value = totals @ log_norm - (params * target_sums).sum() + 0.5 * (penalty_grad * params).sum()

            def derivatives() -> tuple[torch.Tensor, torch.Tensor]:
                p = (eta - log_norm[:, None]).exp_()
                weighted = totals[:, None] * p
                grad = weighted.T @ a - target_sums + penalty_grad
                return grad.reshape(1, -1), (softmax_hessian(a, weighted, p) + block_ridge)[None]

            return value[None], derivatives

        start = self._stacked()[:free].reshape(1, -1)
        theta, self.n_iter_, self.converged_ = damped_newton(objective, start, max_iter=self.max_iter, tol=self.tol)
        self._unstack(torch.cat([theta.reshape(free, m), theta.new_zeros(1, m)]))
        return self

    def pyro_dist(self, index: torch.Tensor | None = None, x: torch.Tensor | None = None) -> dist.Distribution:
        """``Categorical(logits = x^T coef + intercept)`` over the components (``index`` unused)."""
        if x is None:
            raise ValueError("x (the covariates) is required for the gate's distribution")
        return dist.Categorical(logits=self.linear_predictor(x))

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One component index per row of ``x``."""
        return torch.multinomial(self.log_prob(x).exp(), 1, generator=generator).squeeze(-1)
