"""The approximation guarantee of PRESTO (Sangani et al., Theorems 2 and 4) for fitted logistic or softmax
components: the constants ``alpha_G``, ``kappa_G``, ``eps_min``, ``l_min,min``, ``l_min,max`` of Theorem 2
on the training data, and the factor by which Theorem 4 bounds ``G(S_hat) / G(OPT)``.

Theorem 2 is stated for ``G(S) = sum_k min_theta sum_{i in S_k} l_i(theta) + lambda ||theta||^2`` with the
penalty on every parameter. With PRESTO's regulariser ``R = ridge / 2 ||coef||^2`` (``lambda = ridge / 2``),
which leaves the intercepts free, a single point can be fitted with loss tending to 0, so
``l_min,min = 0``, ``alpha_G = 0`` and Theorem 4 promises nothing; the constants are therefore computed
for the paper's ``G``, the intercepts penalised by ``lambda`` too, which is what makes ``l_min,min > 0``.

* ``L``, the Lipschitz constant of ``l_i`` in ``theta``: the gradient is ``(p_i - t_i)[:F] kron a_i``
  (``a_i = [x_i, 1]``, ``F = C - 1`` free classes), whose norm is below ``sqrt(s) ||a_i||`` with
  ``s = 1`` for two classes and ``s = 2`` for more (both suprema approached as ``p_i`` tends to a vertex).
* ``eps_min``: the Hessian of one point's loss, ``B_i kron a_i a_i'``, has rank at most ``F`` in
  dimension ``F (P + 1)``, so its least eigenvalue is 0 at every ``theta``: ``eps_min = 0``.
* ``l_min,min`` / ``l_min,max``: the least / largest over points of the singleton optimum
  ``min_theta l_i(theta) + lambda ||theta||^2 = min_z CE(z, t_i) + lambda ||z||^2 / ||a_i||^2`` over
  the logits ``z`` (``R^F``; the least-norm ``theta`` giving logits ``z`` has norm ``||z|| / ||a_i||``),
  solved by batched damped Newton.
* ``alpha_G = l / (l + 2 L^2 / (lambda + eps/2) + lambda L^2 / (lambda + eps/2)^2)`` with
  ``l = l_min,min`` (eq. 11), ``kappa_G = 1 - l_min,min / l_min,max``, and Theorem 4's factor
  ``1 / ((1 - kappa_G) alpha_G^2)`` with its tighter form ``N / (alpha_G (1 + (N - 1)(1 - kappa_G) alpha_G))``
  (eq. 41), ``N`` the number of points.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ppmix.algorithms.newton import damped_newton
from ppmix.components._linear import design_matrix

__all__ = ["singleton_optima", "theorem2_guarantee"]


def singleton_optima(a_norm2: torch.Tensor, targets: torch.Tensor, lam: float) -> torch.Tensor:
    """``min_z -sum_c t_c log softmax_c([z, 0]) + lam ||z||^2 / ||a||^2`` for every row, shape (N,).

    Examples
    --------
    >>> import torch
    >>> value = singleton_optima(torch.tensor([1.0], dtype=torch.float64),
    ...                          torch.tensor([[0.0, 1.0]], dtype=torch.float64), 0.5)
    >>> round(float(value[0]), 6)  # min_z log(1 + e^z) + z^2 / 2, at z = -0.4011
    0.593015
    """
    n, c = targets.shape
    weight = lam / a_norm2  # (N,)

    def objective(z: torch.Tensor):
        logits = F.pad(z, (0, 1))
        log_p = torch.log_softmax(logits, dim=1)
        value = -(targets * log_p).sum(1) + weight * z.square().sum(1)

        def derivatives() -> tuple[torch.Tensor, torch.Tensor]:
            p = log_p[:, :-1].exp()
            grad = p * targets.sum(1, keepdim=True) - targets[:, :-1] + 2 * weight[:, None] * z
            hess = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
            return grad, hess + 2 * weight[:, None, None] * torch.eye(c - 1, dtype=z.dtype, device=z.device)

        return value, derivatives

    z, _, _ = damped_newton(objective, targets.new_zeros(n, c - 1), tol=1e-14)
    return objective(z)[0]


def theorem2_guarantee(x: torch.Tensor, targets: torch.Tensor, ridge: float) -> dict[str, float]:
    """Theorem 2's constants and Theorem 4's factor on the data ``x`` ``(N, P)`` with labels ``targets`` ``(N, C)``.

    ``ridge`` is PRESTO's (``R = ridge / 2 ||coef||^2``, so ``lambda = ridge / 2``); see the module docstring.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([[-1.0], [0.5], [2.0]], dtype=torch.float64)
    >>> g = theorem2_guarantee(x, torch.eye(2, dtype=torch.float64)[[0, 1, 1]], 1.0)
    >>> g["eps_min"], 0 < g["alpha_G"] < 1, g["factor"] >= g["factor_tight"] >= 1
    (0.0, True, True)
    """
    if ridge <= 0:
        raise ValueError("Theorem 2 needs lambda > -eps_min = 0: the guarantee needs ridge > 0")
    lam, n, c = 0.5 * float(ridge), targets.shape[0], targets.shape[1]
    a_norm2 = design_matrix(x).square().sum(1)
    lipschitz = math.sqrt((1.0 if c == 2 else 2.0) * float(a_norm2.max()))
    singles = singleton_optima(a_norm2, targets, lam)
    l_min, l_max, eps = float(singles.min()), float(singles.max()), 0.0
    shifted = lam + 0.5 * eps
    alpha = l_min / (l_min + 2 * lipschitz**2 / shifted + lam * lipschitz**2 / shifted**2)
    kappa = 1.0 - l_min / l_max
    return {
        "lambda": lam,
        "lipschitz": lipschitz,
        "eps_min": eps,
        "l_min_min": l_min,
        "l_min_max": l_max,
        "alpha_G": alpha,
        "kappa_G": kappa,
        "factor": 1.0 / ((1.0 - kappa) * alpha**2),
        "factor_tight": n / (alpha * (1.0 + (n - 1) * (1.0 - kappa) * alpha)),
    }
