"""Batched damped Newton method shared by the logistic expert and the softmax gate."""

from __future__ import annotations

from typing import Callable

import torch

#: ``derivatives() -> (grad[B, M], hess[B, M, M])`` at the point where the objective was evaluated
Derivatives = Callable[[], tuple[torch.Tensor, torch.Tensor]]
#: ``objective(theta) -> (value[B], derivatives)``; ``derivatives`` is called only at the accepted iterates, so
#: it can reuse what the value computed (linear predictors, normalisers) instead of starting again from ``theta``
Objective = Callable[[torch.Tensor], tuple[torch.Tensor, Derivatives]]


def damped_newton(
    objective: Objective,
    theta: torch.Tensor,
    *,
    max_iter: int = 100,
    tol: float = 1e-10,
    max_halvings: int = 40,
) -> tuple[torch.Tensor, int, bool]:
    """Minimise ``B`` independent smooth convex objectives by Newton's method.

    Each step solves ``H d = g`` (a tiny jitter is added when ``H`` is not
    numerically positive definite) and backtracks (Armijo rule) until the objective
    decreases, so the iteration is monotone. A problem stops when its Newton
    decrement ``g^T d`` falls below ``tol * (1 + |f|)``; that last Newton step is
    still applied, so the parameters are accurate to about ``tol``, not ``sqrt(tol)``,
    unless it raises the objective (a small decrement allows a long step along a nearly
    flat direction, where the quadratic model fails): then the problem stops where it is.
    A problem whose step does not decrease the objective after ``max_halvings``
    halvings stays where it is and stops (reported as not converged).
    The objective is evaluated once per trial point; the accepted trial's evaluation
    supplies the next iteration's derivatives.

    Parameters
    ----------
    objective : callable
        ``objective(theta)`` returns the values ``[B]`` and a callable that returns the
        gradients ``[B, M]`` and Hessians ``[B, M, M]`` at the same ``theta``.
    theta : Tensor, shape (B, M)
        Starting point (not modified).

    Returns
    -------
    theta, n_iter, converged

    Examples
    --------
    >>> import torch
    >>> f = lambda t: ((t - 3).square().sum(-1), lambda: (2 * (t - 3), 2 * torch.eye(2).expand(1, 2, 2)))
    >>> theta, _, ok = damped_newton(f, torch.zeros(1, 2))
    >>> ok, theta.tolist()
    (True, [[3.0, 3.0]])
    """
    theta = theta.clone()
    active = torch.ones(theta.shape[0], dtype=torch.bool, device=theta.device)
    stalled = torch.zeros_like(active)
    eye = torch.eye(theta.shape[1], dtype=theta.dtype, device=theta.device)
    value, derivatives = objective(theta)
    for iteration in range(1, max_iter + 1):
        grad, hess = derivatives()
        chol, info = torch.linalg.cholesky_ex(hess)
        if (info > 0).any():
            scale = torch.diagonal(hess, dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1.0)
            chol, _ = torch.linalg.cholesky_ex(hess + 1e-8 * scale[:, None, None] * eye)
        step = torch.cholesky_solve(grad.unsqueeze(-1), chol).squeeze(-1)
        decrement = (grad * step).sum(-1)
        done = active & (decrement <= tol * (1.0 + value.abs()))
        if done.any():
            # a problem that meets the tolerance still takes its (full, quadratically convergent) step, if it
            # does not raise the objective: a small decrement allows a huge step along a nearly flat direction
            # (a saturated softmax gate), where the quadratic model no longer holds
            final = theta - step * done[:, None]
            taken = done & (objective(final)[0] <= value)
            theta = torch.where(taken[:, None], final, theta)
        active = active & ~done
        if not active.any():
            return theta, iteration, not bool(stalled.any())
        step = step * active[:, None]
        t = torch.ones_like(value)
        for _ in range(max_halvings):
            trial = theta - t[:, None] * step
            trial_value, trial_derivatives = objective(trial)
            # finished problems (zero step) only ride along
            ok = (trial_value <= value - 1e-4 * t * decrement) | ~active
            if ok.all():
                break
            t = torch.where(ok, t, 0.5 * t)
        else:
            # out of halvings: no step length decreased the objective enough. Those problems stay
            # where they are and stop, not converged. (Taking the last halved step anyway let a
            # near-singular Hessian -- a saturated logistic expert's unpenalised intercept --
            # throw the parameters to 1e175.)
            stuck = ~ok
            stalled |= stuck
            active = active & ~stuck
            trial = theta - torch.where(stuck, torch.zeros_like(t), t)[:, None] * step
            trial_value, trial_derivatives = objective(trial)
        theta, value, derivatives = trial, trial_value, trial_derivatives
        if not active.any():
            return theta, iteration, not bool(stalled.any())
    return theta, max_iter, False
