"""The weight step of Regularized Weighting (Vainsencher, Mannor & Xu, 2013): the joint loss
``L_alpha(W) = alpha ||u - v||^2 + (1/k) sum_j w_j^T l_j`` of fixed losses as a function of the weights,
its certified duality gap, and the FISTA solver of ``min_W L_alpha`` over ``k`` simplices.

**Sample weights.** A point of integer weight ``m_i`` stands for ``m_i`` copies of it. In the problem on the
repeated points (``M = sum_i m_i`` of them, ``u = 1 / M``) copies have the same losses, so by symmetry and
convexity the copies of a point share its weight equally at an optimum (and every FISTA iterate from the
uniform start is symmetric: each step is permutation-equivariant). With ``w_ji`` the total weight of model
``j`` on the copies of point ``i`` (still a distribution over the ``n`` points) and ``v_i`` its mean over the
models, the joint loss of the repeated problem is

    ``alpha sum_i (v_i - m_i / M)^2 / m_i + (1/k) sum_j w_j^T l_j``,

the target of ``v`` proportional to ``m`` and each point's deviation counted per copy. The solver runs the
repeated problem's FISTA in the per-copy weights ``r_ji = w_ji / m_i``, where its Euclidean steps over the
copies are steps in the ``m``-weighted norm and its projection is the ``m``-weighted projection onto
``{r >= 0, sum_i m_i r_i = 1}`` (:func:`project_weighted_simplex`), so that it computes what it computes on the
repeated points (up to rounding). Non-integer weights give the same formulas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ppmix.algorithms.simplex import project_simplex, project_simplex_warm

__all__ = [
    "WeightStepResult",
    "joint_loss",
    "project_weighted_simplex",
    "solve_weights",
    "weight_objective_and_gap",
]


def _weigh(values: torch.Tensor, mass: torch.Tensor | None) -> torch.Tensor:
    """``values`` with every point (the last dimension) counted ``mass_i`` times (unchanged for ``None``)."""
    return values if mass is None else values * mass


def _check_mass(sample_weight: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """The point weights ``(n,)`` as float64 on ``like``'s device, checked positive and finite (``None`` stays)."""
    if sample_weight is None:
        return None
    mass = torch.as_tensor(sample_weight).to(device=like.device, dtype=torch.float64)
    if mass.shape != like.shape[-1:]:
        raise ValueError(f"sample_weight must have shape ({like.shape[-1]},); got {tuple(mass.shape)}")
    if not (torch.isfinite(mass).all() and (mass > 0).all()):
        raise ValueError("sample_weight of the weight step must be positive and finite (drop zero-weight points)")
    return mass


def project_weighted_simplex(
    v: torch.Tensor, mass: torch.Tensor | None, theta: torch.Tensor | None = None, max_pivots: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Project every row of ``v`` onto ``{r >= 0, sum_i m_i r_i = 1}`` in the norm ``sum_i m_i r_i^2``.

    The projection is ``max(v - theta, 0)`` with ``theta`` the root of ``sum_i m_i max(v_i - theta, 0) = 1``: the
    Euclidean projection onto the simplex of the vector with ``v_i`` repeated ``m_i`` times, read off one copy.
    Michelot's pivot ``theta <- (sum_{v_i > theta} m_i v_i - 1) / sum_{v_i > theta} m_i`` from ``theta`` (a
    warm start, as :func:`~ppmix.algorithms.simplex.project_simplex_warm`) or from ``(sum_i m_i v_i - 1) / sum_i m_i``;
    rows not settled after ``max_pivots`` passes are finished by sorting. ``mass=None`` (all ones) is
    :func:`~ppmix.algorithms.simplex.project_simplex_warm` itself. Returns ``(projection, theta)``.

    Examples
    --------
    >>> v = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    >>> r, _ = project_weighted_simplex(v, torch.tensor([2.0, 1.0], dtype=torch.float64))
    >>> [round(x, 6) for x in r[0].tolist()]  # = the simplex projection of (0.5, 0.5, 1.0), one copy each
    [0.166667, 0.666667]
    """
    if mass is None:
        return project_simplex_warm(v, theta, max_pivots)
    cold = (_weigh(v, mass).sum(dim=-1, keepdim=True) - 1.0) / mass.sum()
    theta = cold if theta is None else torch.where(theta < v.amax(dim=-1, keepdim=True), theta, cold)
    count = torch.full_like(theta, -1.0)
    settled = torch.zeros(theta.shape, dtype=torch.bool, device=v.device)
    for _ in range(max_pivots):
        active = v > theta
        new_count = active.sum(dim=-1, keepdim=True).to(v.dtype)  # the active set only shrinks once left of the root
        settled = new_count == count
        if settled.all():
            break
        theta = ((v * active * mass).sum(dim=-1, keepdim=True) - 1.0) / (active * mass).sum(dim=-1, keepdim=True)
        count = new_count
    if not settled.all():  # rare slow rows: the weighted sort (the largest prefix with s_r > (sum m s - 1) / sum m)
        rows = ~settled.squeeze(-1)
        s, order = torch.sort(v[rows], dim=-1, descending=True)
        cumulative_mass = mass[order].cumsum(dim=-1)
        css = (mass[order] * s).cumsum(dim=-1) - 1.0
        ranks = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)
        last = torch.where(s * cumulative_mass > css, ranks, torch.zeros_like(ranks)).argmax(dim=-1, keepdim=True)
        theta = theta.clone()
        theta[rows] = css.gather(-1, last) / cumulative_mass.gather(-1, last)
    eps = torch.finfo(v.dtype).eps
    feasible = (v >= 0).all(dim=-1, keepdim=True) & (
        ((v * mass).sum(dim=-1, keepdim=True) - 1.0).abs() <= 4 * v.shape[-1] * eps
    )
    return torch.where(feasible, v, (v - theta).clamp_min(0.0)), theta


def joint_loss(
    losses: torch.Tensor, weights: torch.Tensor, alpha: float, sample_weight: torch.Tensor | None = None
) -> float:
    """The RW joint loss ``alpha ||u - v||^2 + (1/k) sum_j w_j^T l_j`` (Vainsencher, Mannor & Xu, 2013, Definition 2).

    Parameters
    ----------
    losses : Tensor, shape (k, n)
        Non-negative loss of every point under every model.
    weights : Tensor, shape (k, n)
        One distribution over the points per model.
    alpha : float
        Regularisation strength (not divided by ``n``).
    sample_weight : Tensor, shape (n,), optional
        Positive point weights ``m`` (a point of integer weight ``m_i`` is ``m_i`` copies of it): the joint loss
        of the repeated points, ``alpha sum_i (v_i - m_i / M)^2 / m_i + (1/k) sum_j w_j^T l_j``
        (``M = sum_i m_i``; see the module docstring).

    Examples
    --------
    >>> import torch
    >>> losses = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> joint_loss(losses, torch.full((2, 2), 0.5, dtype=torch.float64), alpha=4.0)
    0.5
    >>> twice = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)  # point 0 twice
    >>> round(joint_loss(twice, torch.tensor([[0.2, 0.2, 0.6], [0.4, 0.4, 0.2]], dtype=torch.float64), 3.0), 12)
    0.72
    >>> weights = torch.tensor([[0.4, 0.6], [0.8, 0.2]], dtype=torch.float64)  # the copies' totals
    >>> round(joint_loss(losses, weights, 3.0, sample_weight=torch.tensor([2.0, 1.0], dtype=torch.float64)), 12)
    0.72
    """
    mass = _check_mass(sample_weight, losses)
    value, _ = _objective_and_gap(losses, _per_copy(weights, mass), alpha, mass)
    return value


def _per_copy(weights: torch.Tensor, mass: torch.Tensor | None) -> torch.Tensor:
    """The weight of one copy of every point, ``w_ji / m_i``."""
    return weights if mass is None else weights / mass


def weight_objective_and_gap(
    losses: torch.Tensor, weights: torch.Tensor, alpha: float, sample_weight: torch.Tensor | None = None
) -> tuple[float, float]:
    """Joint loss at ``weights`` and a certified bound on its distance to the optimum over ``W``.

    The bound is the smaller of the Frank-Wolfe gap and ``objective - D(t)``, where
    ``D`` is the Lagrange dual with one multiplier per model evaluated at the
    multipliers ``t_j = k <g_j, w_j>`` implied by ``weights`` (Lemma 2's ``t``):
    ``D(t) = sum_i [alpha (u - z_i)^2 + z_i m_i] + mean(t)``, with
    ``m_i = min_j (l_ji - t_j)`` and ``z_i = max(u - m_i / (2 alpha), 0)``. With ``sample_weight``, both are
    those of the repeated points (sums over the points count each point's weight times; see
    :func:`joint_loss`).

    Examples
    --------
    >>> import torch
    >>> losses = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> value, gap = weight_objective_and_gap(losses, torch.full((2, 2), 0.5, dtype=torch.float64), 4.0)
    >>> value, gap >= 0
    (0.5, True)
    """
    mass = _check_mass(sample_weight, losses)
    return _objective_and_gap(losses, _per_copy(weights, mass), alpha, mass)


def _objective_and_gap(
    losses: torch.Tensor, copy_weights: torch.Tensor, alpha: float, mass: torch.Tensor | None
) -> tuple[float, float]:
    """:func:`weight_objective_and_gap` in the per-copy weights ``r = w / m`` (``mass`` ``m``, ``None``: ones)."""
    k, n = losses.shape
    u = 1.0 / (n if mass is None else float(mass.sum()))
    v = copy_weights.mean(dim=0)
    grad = (losses - 2.0 * alpha * (u - v)) / k  # per copy, the gradient in the m-weighted norm
    value = alpha * _weigh((v - u).square(), mass).sum() + _weigh(losses * copy_weights, mass).sum() / k
    inner = _weigh(grad * copy_weights, mass).sum(dim=1)  # (k,)
    frank_wolfe = (inner - grad.min(dim=1).values).sum()
    t = k * inner
    m = (losses - t[:, None]).min(dim=0).values
    z = (u - m / (2.0 * alpha)).clamp_min(0.0)
    dual = _weigh(alpha * (u - z).square() + z * m, mass).sum() + t.mean()
    # one transfer of the three numbers (one synchronisation per FISTA iteration on a GPU)
    value, frank_wolfe, dual = torch.stack([value, frank_wolfe, dual]).tolist()
    return value, max(min(frank_wolfe, value - dual), 0.0)


@dataclass
class WeightStepResult:
    """Outcome of :func:`solve_weights`.

    ``gap`` is the Frank-Wolfe duality gap at ``weights``, an upper bound on
    ``objective - min``; ``converged`` says whether ``gap <= tol * objective`` was met.

    Parameters
    ----------
    weights : Tensor of shape (K, N)
        The weights of every point in every model (each row a distribution over the points).
    objective : float
        The weight step's objective at ``weights``.
    gap : float
        The Frank-Wolfe duality gap there.
    n_iter : int
        The iterations run.
    converged : bool
        Whether ``gap <= tol * objective`` was met.

    Examples
    --------
    >>> losses = torch.tensor([[0.0, 0.0, 9.0], [9.0, 0.0, 0.0]], dtype=torch.float64)
    >>> result = solve_weights(losses, alpha=1.0)
    >>> tuple(result.weights.shape), result.converged, result.gap >= 0
    ((2, 3), True, True)
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
    sample_weight: torch.Tensor | None = None,
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

    *Sample weights.* With ``sample_weight`` the solver is that of the problem on the repeated points (see the
    module docstring), run in the per-copy weights: every sum over the points counts each point's weight
    times, ``u = 1 / sum(sample_weight)`` and the projection is :func:`project_weighted_simplex`. The weights
    returned (and ``start``) are the totals over the copies, one distribution over the ``n`` points per model.

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
    sample_weight : Tensor, shape (n,), optional
        Positive point weights (an integer weight counts as that many copies of the point).

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
    >>> copies = torch.tensor([0, 1, 1, 2])  # point 1 twice
    >>> repeated = solve_weights(losses[:, copies], alpha=1.0).weights
    >>> weighted = solve_weights(losses, alpha=1.0, sample_weight=torch.tensor([1.0, 2.0, 1.0])).weights
    >>> bool(torch.allclose(weighted, torch.zeros_like(weighted).index_add(1, copies, repeated)))
    True
    """
    losses = losses.to(torch.float64)
    if losses.dim() != 2:
        raise ValueError(f"losses must have shape (k, n); got {tuple(losses.shape)}")
    if not torch.isfinite(losses).all() or (losses < 0).any():
        raise ValueError("losses must be finite and non-negative")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number; got {alpha}")
    k, n = losses.shape
    mass = _check_mass(sample_weight, losses)
    total = n if mass is None else float(mass.sum())
    u = 1.0 / total
    scaled = losses / (2.0 * alpha)

    # the iterates are per-copy weights (the weights themselves without sample_weight)
    if start is None:
        x = torch.full((k, n), u, dtype=torch.float64, device=losses.device)
    else:
        if start.shape != (k, n):
            raise ValueError(f"start must have shape {(k, n)}; got {tuple(start.shape)}")
        start = start.to(device=losses.device, dtype=torch.float64)
        x = project_simplex(start) if mass is None else project_weighted_simplex(start / mass, mass)[0]
    mean_loss = float(_weigh(losses, mass).mean()) * (n / total)  # per copy
    floor = 64 * torch.finfo(torch.float64).eps * (alpha / total + mean_loss)
    best_value, gap = _objective_and_gap(losses, x, alpha, mass)
    best = x
    iteration, converged = 0, gap <= max(tol * best_value, floor)
    y, t, theta = x, 1.0, None
    while not converged and iteration < max_iter:
        iteration += 1
        # the thresholds of consecutive projections are close: warm-start the pivot method from the last ones
        x_new, theta = project_weighted_simplex(y + (u - y.mean(dim=0)) - scaled, mass, theta)
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        if float(_weigh((y - x_new) * (x_new - x), mass).sum()) > 0:  # momentum points uphill: restart it
            t, t_new = 1.0, 1.0
        y = x_new + ((t - 1.0) / t_new) * (x_new - x)
        x, t = x_new, t_new
        value, gap = _objective_and_gap(losses, x, alpha, mass)
        if value <= best_value:
            best, best_value = x, value
        converged = gap <= max(tol * value, floor)  # f(best) <= f(x): the gap still bounds it
    weights = best if mass is None else best * mass
    return WeightStepResult(weights, best_value, gap, iteration, converged)
