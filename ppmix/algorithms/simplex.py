"""The probability simplex, batched over rows: Euclidean projection onto it, and Dirichlet draws and log densities
(on every entry, or on the allowed entries of each row)."""

from __future__ import annotations

import torch

__all__ = ["dirichlet_draw", "log_dirichlet", "project_simplex"]


def project_simplex(v: torch.Tensor, method: str = "sort", max_pivots: int = 64) -> torch.Tensor:
    """Project every row of ``v`` onto the probability simplex ``{w : w >= 0, sum(w) = 1}``.

    Solves ``argmin_w ||w - v||^2`` subject to ``w`` in the simplex, independently for
    every vector along the last dimension. The answer is ``max(v - theta, 0)`` with
    ``theta`` the root of ``sum_i max(v_i - theta, 0) = 1``.

    - ``method="sort"`` (default): the sort-based algorithm of Held, Wolfe & Crowder
      (1974) / Duchi et al. (2008): sort the row in decreasing order ``s``, find the
      largest ``rho`` with ``s_rho - (sum_{i <= rho} s_i - 1) / rho > 0`` and take
      ``theta = (sum_{i <= rho} s_i - 1) / rho``. ``O(n log n)`` per row; ties need no
      special care (any order of equal entries gives the same ``theta``).
    - ``method="pivot"``: Michelot's (1986) fixed-point iteration
      ``theta <- (sum_{v_i > theta} v_i - 1) / #{v_i > theta}`` from
      ``theta = (sum v - 1) / n``, which increases monotonically to the same ``theta``
      in finitely many ``O(n)`` passes (usually a handful); rows not settled after
      ``max_pivots`` passes fall back to the sort. Several times faster for long rows,
      and what RW's weight step uses.

    Rows that already lie on the simplex (non-negative and summing to one to within
    rounding) are returned unchanged. The computation is done in the dtype of ``v``
    (use float64 for weights of order ``1/n`` with large ``n``).

    Parameters
    ----------
    v : Tensor, shape (..., n)
        Floating-point vectors, finite.
    method : {"sort", "pivot"}, default "sort"
    max_pivots : int, default 64
        Passes of the ``"pivot"`` method before falling back to the sort.

    Returns
    -------
    Tensor, shape (..., n)
        The projections, same dtype and device as ``v``.

    Raises
    ------
    TypeError
        If ``v`` is not a floating-point tensor.
    ValueError
        If ``v`` is 0-D, has an empty last dimension or holds NaN/inf.

    Examples
    --------
    >>> import torch
    >>> project_simplex(torch.tensor([[0.5, 0.5, 1.0], [2.0, 0.0, 0.0]], dtype=torch.float64))
    tensor([[0.1667, 0.1667, 0.6667],
            [1.0000, 0.0000, 0.0000]], dtype=torch.float64)
    """
    if not isinstance(v, torch.Tensor) or not v.is_floating_point():
        raise TypeError(f"v must be a floating-point tensor; got {type(v).__name__}")
    if v.dim() == 0 or v.shape[-1] == 0:
        raise ValueError(f"v must have a non-empty last dimension; got shape {tuple(v.shape)}")
    if not torch.isfinite(v).all():
        raise ValueError("v contains NaN or infinite values")
    if method == "pivot":
        return _project_pivot(v, max_pivots)
    if method != "sort":
        raise ValueError(f"method must be 'sort' or 'pivot'; got {method!r}")
    return _finish(v, _theta_sort(v))


def _theta_sort(v: torch.Tensor) -> torch.Tensor:
    n = v.shape[-1]
    s, _ = torch.sort(v, dim=-1, descending=True)
    css = s.cumsum(dim=-1) - 1.0
    ranks = torch.arange(1, n + 1, device=v.device, dtype=v.dtype)
    positive = s * ranks > css  # s_r - css_r / r > 0, written without a division
    # The condition holds on a prefix; take its last index (rho >= 1 always, since s_1 > s_1 - 1).
    rho = torch.where(positive, ranks, torch.zeros((), dtype=v.dtype, device=v.device)).argmax(dim=-1, keepdim=True)
    return css.gather(-1, rho) / (rho + 1).to(v.dtype)


def _project_pivot(v: torch.Tensor, max_pivots: int) -> torch.Tensor:
    return project_simplex_warm(v, None, max_pivots)[0]


def project_simplex_warm(
    v: torch.Tensor, theta: torch.Tensor | None, max_pivots: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pivot projection started from a guess of every row's threshold; returns ``(projection, theta)``.

    Michelot's update ``theta <- (sum_{v_i > theta} v_i - 1) / #{v_i > theta}`` is Newton's
    method on the convex, decreasing, piecewise-linear ``f(theta) = sum_i max(v_i - theta, 0) - 1``:
    from a start left of the root it increases monotonically to it; from a start right of
    the root its first step lands at or left of the root. It therefore converges from
    any start below ``max(v)``, and it has converged exactly when two consecutive
    thresholds have the same number of active entries. Warm-starting from the
    thresholds of a nearby ``v`` (consecutive FISTA steps) takes one or two passes
    instead of the several a cold start ``(sum v - 1) / n`` needs. ``v`` is not validated.

    Examples
    --------
    >>> import torch
    >>> v = torch.tensor([[0.5, 0.5, 1.0]], dtype=torch.float64)
    >>> w, theta = project_simplex_warm(v, None)
    >>> w2, _ = project_simplex_warm(v, theta + 0.3)  # a start right of the root
    >>> bool(torch.equal(w, w2)), [round(x, 6) for x in w[0].tolist()]
    (True, [0.166667, 0.166667, 0.666667])
    """
    n = v.shape[-1]
    cold = (v.sum(dim=-1, keepdim=True) - 1.0) / n
    if theta is None:
        theta = cold
    else:
        theta = torch.where(theta < v.amax(dim=-1, keepdim=True), theta, cold)
    count = torch.full_like(theta, -1.0)
    settled = torch.zeros(theta.shape, dtype=torch.bool, device=v.device)
    for _ in range(max_pivots):
        active = v > theta
        new_count = active.sum(dim=-1, keepdim=True).to(v.dtype)
        settled = new_count == count
        if settled.all():
            break
        theta = ((v * active).sum(-1, keepdim=True) - 1.0) / new_count
        count = new_count
    if not settled.all():  # rare slow rows: finish them exactly by sorting
        rows = ~settled.squeeze(-1)
        theta = theta.clone()
        theta[rows] = _theta_sort(v[rows])
    return _finish(v, theta), theta


def _finish(v: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    n = v.shape[-1]
    projected = (v - theta).clamp_min(0.0)
    eps = torch.finfo(v.dtype).eps
    feasible = ((v >= 0).all(dim=-1, keepdim=True)) & ((v.sum(dim=-1, keepdim=True) - 1.0).abs() <= 4 * n * eps)
    return torch.where(feasible, v, projected)


def dirichlet_draw(concentration: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Draws from ``Dirichlet(concentration)`` over the last axis, restricted to the ``allowed`` entries
    (zero elsewhere; every row must allow one), by normalised Gamma draws.

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> allowed = torch.tensor([[True, True, True], [False, True, True]])
    >>> p = dirichlet_draw(torch.ones(2, 3, dtype=torch.float64), allowed)
    >>> p.sum(-1).round(decimals=12).tolist(), float(p[1, 0])
    ([1.0, 1.0], 0.0)
    """
    gamma = torch._standard_gamma(concentration)
    if allowed is not None:
        gamma = torch.where(allowed, gamma, 0.0)
    gamma = gamma.clamp_min(torch.finfo(gamma.dtype).tiny) if allowed is None else gamma
    return gamma / gamma.sum(-1, keepdim=True)


def log_dirichlet(p: torch.Tensor, concentration: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """``log Dirichlet(p | concentration)`` over the last axis, on the ``allowed`` entries only.

    Examples
    --------
    >>> round(float(log_dirichlet(torch.tensor([0.5, 0.5]), torch.tensor([2.0, 2.0]))), 6)  # log(6 * 0.25)
    0.405465
    """
    if allowed is None:
        allowed = torch.ones_like(p, dtype=torch.bool)
    a = torch.where(allowed, concentration, 0.0)
    log_p = torch.where(allowed, p.clamp_min(torch.finfo(p.dtype).tiny).log(), 0.0)
    log_norm = torch.lgamma(a.sum(-1)) - torch.where(allowed, torch.lgamma(torch.where(allowed, a, 1.0)), 0.0).sum(-1)
    return log_norm + ((a - 1) * log_p).sum(-1)
