"""The weight step of Regularized Weighting (Vainsencher, Mannor & Xu, 2013): the joint loss
``L_alpha(W) = alpha ||u - v||^2 + (1/k) sum_j w_j^T l_j`` of fixed losses as a function of the weights,
its certified duality gap, and the FISTA solver of ``min_W L_alpha`` over ``k`` simplices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ppmix.ops.simplex import project_simplex, project_simplex_warm

__all__ = ["WeightStepResult", "joint_loss", "solve_weights", "weight_objective_and_gap"]


def joint_loss(losses: torch.Tensor, weights: torch.Tensor, alpha: float) -> float:
    """The RW joint loss ``alpha ||u - v||^2 + (1/k) sum_j w_j^T l_j`` (Vainsencher, Mannor & Xu, 2013, Definition 2).

    Parameters
    ----------
    losses : Tensor, shape (k, n)
        Non-negative loss of every point under every model.
    weights : Tensor, shape (k, n)
        One distribution over the points per model.
    alpha : float
        Regularisation strength (not divided by ``n``).

    Examples
    --------
    >>> import torch
    >>> losses = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> joint_loss(losses, torch.full((2, 2), 0.5, dtype=torch.float64), alpha=4.0)
    0.5
    """
    k, n = losses.shape
    v = weights.mean(dim=0)
    return float(alpha * (v - 1.0 / n).square().sum() + (losses * weights).sum() / k)


def weight_objective_and_gap(losses: torch.Tensor, weights: torch.Tensor, alpha: float) -> tuple[float, float]:
    """Joint loss at ``weights`` and a certified bound on its distance to the optimum over ``W``.

    The bound is the smaller of the Frank-Wolfe gap and ``objective - D(t)``, where
    ``D`` is the Lagrange dual with one multiplier per model evaluated at the
    multipliers ``t_j = k <g_j, w_j>`` implied by ``weights`` (Lemma 2's ``t``):
    ``D(t) = sum_i [alpha (u - z_i)^2 + z_i m_i] + mean(t)``, with
    ``m_i = min_j (l_ji - t_j)`` and ``z_i = max(u - m_i / (2 alpha), 0)``.

    Examples
    --------
    >>> import torch
    >>> losses = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> value, gap = weight_objective_and_gap(losses, torch.full((2, 2), 0.5, dtype=torch.float64), 4.0)
    >>> value, gap >= 0
    (0.5, True)
    """
    k, n = losses.shape
    u = 1.0 / n
    v = weights.mean(dim=0)
    grad = (losses - 2.0 * alpha * (u - v)) / k
    value = alpha * (v - u).square().sum() + (losses * weights).sum() / k
    inner = (grad * weights).sum(dim=1)  # (k,)
    frank_wolfe = (inner - grad.min(dim=1).values).sum()
    t = k * inner
    m = (losses - t[:, None]).min(dim=0).values
    z = (u - m / (2.0 * alpha)).clamp_min(0.0)
    dual = (alpha * (u - z).square() + z * m).sum() + t.mean()
    # one transfer of the three numbers (one synchronisation per FISTA iteration on a GPU)
    value, frank_wolfe, dual = torch.stack([value, frank_wolfe, dual]).tolist()
    return value, max(min(frank_wolfe, value - dual), 0.0)


@dataclass
class WeightStepResult:
    """Outcome of :func:`solve_weights`.

    ``gap`` is the Frank-Wolfe duality gap at ``weights``, an upper bound on
    ``objective - min``; ``converged`` says whether ``gap <= tol * objective`` was met.
    """

    weights: torch.Tensor
    objective: float
    gap: float
    n_iter: int
    converged: bool


def solve_weights(
    losses: torch.Tensor,
    alpha: float,
    *,
    start: torch.Tensor | None = None,
    max_iter: int = 2000,
    tol: float = 1e-8,
) -> WeightStepResult:
    """Solve RW's weight step ``min_{W in (simplex_n)^k} alpha ||u - v(W)||^2 + (1/k) sum_j w_j^T l_j``.

    FISTA (Beck & Teboulle, 2009) with a constant step and the Euclidean projection
    onto every simplex, batched (pivot method warm-started from the previous thresholds), in float64.

    *Step size.* With ``v = (1/k) A W`` (``A = [I, ..., I]``), the gradient of the smooth
    part with respect to ``w_j`` is ``(l_j - 2 alpha (u - v)) / k``; its Hessian is
    ``(2 alpha / k^2) A^T A`` and ``A^T A`` (a ``k x k`` block matrix of identities) has
    largest eigenvalue ``k`` (directions with all ``w_j`` moving together). The
    gradient's Lipschitz constant is therefore exactly ``L = 2 alpha / k`` (the value
    ``2 alpha k^-2`` printed in §5 of the paper is too small by a factor ``k`` and can
    make a constant-step method diverge). The step ``1/L`` then reads
    ``w_j <- P(y_j + (u - v(y)) - l_j / (2 alpha))``. The momentum is restarted
    whenever it points uphill (the gradient restart of O'Donoghue & Candès, 2015), a
    standard safeguard that keeps the worst-case rate and is much faster in practice.

    *Stopping.* After every iteration a duality gap ``gap(W) >= L_alpha(W) - min L_alpha``
    is computed, the smaller of two certified bounds: the Frank-Wolfe gap
    ``sum_j (<g_j, w_j> - min_i g_ji)`` (``g`` the gradient at ``W``), and
    ``L_alpha(W) - D(t)`` with ``D`` the Lagrange dual of the simplex constraints,

        ``D(t) = sum_i [alpha (u - z_i)^2 + z_i m_i] + mean(t)``, ``m_i = min_j (l_ji - t_j)``,
        ``z_i = max(u - m_i / (2 alpha), 0)``,

    a concave function of only ``k`` multipliers (those of Lemma 2), evaluated at
    ``t_j = k <g_j, w_j>`` (at the optimum every point in the support of ``w_j`` has
    ``k g_ji = t_j``). The dual bound is far tighter than the Frank-Wolfe gap near
    the optimum. The solver stops when ``gap <= tol * L_alpha(W)`` (a certified
    relative accuracy; the objective is non-negative), or when the gap is at rounding
    level, ``gap <= 64 eps (alpha / n + mean(l))`` (which only matters when the optimum
    is zero), or after ``max_iter`` iterations. The iterate with the lowest objective
    seen, ``start`` included, is returned, so a warm-started call never increases the
    objective.

    Parameters
    ----------
    losses : Tensor, shape (k, n)
        Non-negative, finite losses ``l_ji``.
    alpha : float
        Regularisation strength, ``> 0``.
    start : Tensor, shape (k, n), optional
        Warm start (projected onto the simplices first); default uniform weights.
    max_iter : int, default 2000
    tol : float, default 1e-8
        Relative duality-gap tolerance.

    Returns
    -------
    WeightStepResult

    Examples
    --------
    >>> import torch
    >>> losses = torch.tensor([[0.0, 0.0, 9.0], [9.0, 0.0, 0.0]], dtype=torch.float64)
    >>> result = solve_weights(losses, alpha=1.0)
    >>> result.converged, [round(w, 3) for w in result.weights.mean(dim=0).tolist()]
    (True, [0.333, 0.333, 0.333])
    >>> [round(w, 3) for w in result.weights[0].tolist()]
    [0.667, 0.333, 0.0]
    """
    losses = losses.to(torch.float64)
    if losses.dim() != 2:
        raise ValueError(f"losses must have shape (k, n); got {tuple(losses.shape)}")
    if not torch.isfinite(losses).all() or (losses < 0).any():
        raise ValueError("losses must be finite and non-negative")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number; got {alpha}")
    k, n = losses.shape
    u = 1.0 / n
    scaled = losses / (2.0 * alpha)

    if start is None:
        x = torch.full((k, n), u, dtype=torch.float64, device=losses.device)
    else:
        if start.shape != (k, n):
            raise ValueError(f"start must have shape {(k, n)}; got {tuple(start.shape)}")
        x = project_simplex(start.to(device=losses.device, dtype=torch.float64))
    floor = 64 * torch.finfo(torch.float64).eps * (alpha / n + float(losses.mean()))
    best_value, gap = weight_objective_and_gap(losses, x, alpha)
    best = x
    if gap <= max(tol * best_value, floor):
        return WeightStepResult(best, best_value, gap, 0, True)
    y, t, theta = x, 1.0, None
    for iteration in range(1, max_iter + 1):
        # the thresholds of consecutive projections are close: warm-start the pivot method from the last ones
        x_new, theta = project_simplex_warm(y + (u - y.mean(dim=0)) - scaled, theta)
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        if float(((y - x_new) * (x_new - x)).sum()) > 0:  # momentum points uphill: restart it
            t, t_new = 1.0, 1.0
        y = x_new + ((t - 1.0) / t_new) * (x_new - x)
        x, t = x_new, t_new
        value, gap = weight_objective_and_gap(losses, x, alpha)
        if value <= best_value:
            best, best_value = x, value
        if gap <= max(tol * value, floor):
            return WeightStepResult(best, best_value, gap, iteration, True)  # f(best) <= f(x): gap still bounds it
    return WeightStepResult(best, best_value, gap, max_iter, False)
