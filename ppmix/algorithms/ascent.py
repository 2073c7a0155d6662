"""Batched monotone Newton ascent on smooth objectives that need not be concave (MAP-EM's numerical M-steps)."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["newton_ascent"]

#: ``theta (B, M) -> values (B,)`` (``-inf`` or NaN outside the domain)
Values = Callable[[torch.Tensor], torch.Tensor]
#: ``theta (B, M) -> (gradients (B, M), Hessians (B, M, M))``
Derivatives = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
#: ``(theta, gradients, negative Hessians) -> (gradients, negative Hessians)`` restricted to the free directions
Restriction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def newton_ascent(
    values: Values,
    derivatives: Derivatives,
    theta: torch.Tensor,
    *,
    project: Callable[[torch.Tensor], torch.Tensor] | None = None,
    restrict: Restriction | None = None,
    max_steps: int = 4,
    tol: float = 1e-12,
    max_halvings: int = 40,
) -> torch.Tensor:
    """Raise ``B`` independent objectives by Newton steps from ``theta``, each step taken only where it raises its
    objective: a generalised EM's M-step, which need only increase, and converges over EM's iterations.

    Each step solves with the Hessian's eigenvalues made negative (their absolute values, at least ``1e-10`` times
    the largest), an ascent direction where the objective is not concave; ``restrict`` may first remove directions
    (bounds that hold); the trial point is ``project``-ed (onto the feasible set) and the step halved until the
    objective rises by Armijo's rule, else not taken. A problem stops once its Newton decrement is below ``tol * (1
    + |objective|)``, after that last step (taken if it does not lower the objective), or after ``max_steps``.
    :func:`~ppmix.algorithms.newton.damped_newton` is the convex case's solver to convergence.

    Parameters
    ----------
    values, derivatives : callable
        The objectives ``(B,)`` and their gradients ``(B, M)`` and Hessians ``(B, M, M)`` at a ``(B, M)`` point.
    theta : Tensor, shape (B, M)
        The start (feasible; not modified).

    Returns
    -------
    Tensor, shape (B, M)

    Examples
    --------
    A double well ``-(t^2 - 1)^2`` started at its local minimum's side: the first step goes uphill, away from
    ``t = 0`` where the Hessian is positive, and the iterates reach the maximum at 1:

    >>> f = lambda t: -(t.square() - 1).square().sum(-1)
    >>> d = lambda t: (-4 * t * (t.square() - 1), torch.diag_embed(-12 * t.square() + 4))
    >>> newton_ascent(f, d, torch.tensor([[0.1]], dtype=torch.float64), max_steps=20).round(decimals=10).tolist()
    [[1.0]]
    """
    theta = theta if project is None else project(theta)
    value = values(theta)
    for _ in range(max_steps):
        gradient, hessian = derivatives(theta)
        curvature = -hessian
        if restrict is not None:
            gradient, curvature = restrict(theta, gradient, curvature)
        eigenvalues, vectors = torch.linalg.eigh(curvature)
        magnitude = eigenvalues.abs()
        magnitude = magnitude.clamp_min(1e-10 * magnitude.amax(-1, keepdim=True).clamp_min(1e-300))
        step = (vectors @ ((vectors.mT @ gradient.unsqueeze(-1)).squeeze(-1) / magnitude).unsqueeze(-1)).squeeze(-1)
        decrement = (gradient * step).sum(-1)
        # a converged problem still takes its last (quadratically convergent) step, if that does not lower it
        done = ~(decrement > tol * (1.0 + value.abs()))
        sufficient = torch.where(done, 0.0, 1e-4 * decrement)
        length = torch.ones_like(value)
        for _ in range(max_halvings):
            trial = theta + length[:, None] * step
            trial = trial if project is None else project(trial)
            trial_value = values(trial)
            better = trial_value >= value + length * sufficient
            if bool((better | done).all()):
                break
            length = torch.where(better | done, length, 0.5 * length)
        # out of halvings (or a last step that would lower the objective): no step
        theta = torch.where(better[:, None], trial, theta)
        value = torch.where(better, trial_value, value)
        if bool(done.all()):
            break
    return theta
