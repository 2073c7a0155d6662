"""A quasi-Newton polish after EM: L-BFGS on exactly EM's objective, from EM's end point, as an engine piece.

EM climbs fast at first and then crawls where the missing information is large (overlapping
components); L-BFGS on the same objective finishes the climb. The model is reached only through
the :class:`Polishable` protocol (its globals and a differentiable objective), and its
constrained parameters through a pair of maps to and from an unconstrained space. Every iterate
that is kept raises the objective, so a history extended by the polish stays monotone.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Protocol, runtime_checkable

import torch

from ppmix.ops.threads import threads_for, torch_threads

__all__ = ["Polishable", "lbfgs_polish"]

logger = logging.getLogger(__name__)

#: correction pairs L-BFGS keeps
HISTORY_SIZE = 20
#: the most objective evaluations of one iteration (its line search)
LINE_SEARCH_EVALS = 25
#: the polish has converged when the objective per point rose by at most ``tol`` over this many iterations
#: (L-BFGS's gains are irregular: a single small one does not mean it is done)
WINDOW = 5

Values = dict[str, torch.Tensor]


@runtime_checkable
class Polishable(Protocol):
    """What the polish needs of a model: its globals, set with or without autograd, and EM's objective."""

    def _get_globals(self) -> Values: ...

    def _set_globals(self, values: Values) -> None: ...

    def _assign_globals(self, values: Values) -> None:
        """Set the globals as they are (autograd sees through them)."""

    def _penalised_log_likelihood(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """EM's objective on ``(x, y)``, differentiable in the globals."""


def _identity(values: Values) -> Values:
    return dict(values)


def lbfgs_polish(
    model: Polishable,
    data: tuple[torch.Tensor, torch.Tensor],
    max_iter: int,
    tol: float,
    to_free: Callable[[Values], Values] = _identity,
    from_free: Callable[[Values], Values] = _identity,
) -> tuple[list[float], bool]:
    """Run L-BFGS (strong-Wolfe line search) on ``model``'s objective per point from its current globals, in place.

    Parameters
    ----------
    model : Polishable
    data : (x, y)
        The data of the objective.
    max_iter : int
        The most L-BFGS iterations.
    tol : float
        Stop when the last 5 iterations gained at most this much objective per point in all.
    to_free, from_free : callables
        The globals to an unconstrained space and back (e.g. a floored variance as ``log(variance - floor)``).

    Returns
    -------
    history : list of float
        The objective per point after each iteration (empty if the first did not gain).
    converged : bool
        Whether it stopped by ``tol``, or at a point where the line search found no gain.

    Examples
    --------
    >>> class Quadratic:  # objective -(a - 3)^2 per point
    ...     values = {"a": torch.tensor([0.0], dtype=torch.float64)}
    ...     def _get_globals(self): return dict(self.values)
    ...     def _set_globals(self, values): self.values = {k: v.detach() for k, v in values.items()}
    ...     def _assign_globals(self, values): self.values = values
    ...     def _penalised_log_likelihood(self, x, y): return -((self.values["a"] - 3.0) ** 2).sum() * len(y)
    >>> model = Quadratic()
    >>> history, converged = lbfgs_polish(model, (torch.zeros(4, 1), torch.zeros(4)), max_iter=50, tol=1e-12)
    >>> round(float(model.values["a"]), 6), converged
    (3.0, True)
    """
    x, y = data
    n_rows = len(y)
    start = model._get_globals()
    free = {name: value.clone().requires_grad_(True) for name, value in to_free(start).items()}
    optimizer = torch.optim.LBFGS(
        list(free.values()),
        lr=1.0,
        max_iter=1,  # one iteration per step, so that every iteration's objective is recorded
        max_eval=LINE_SEARCH_EVALS,  # torch's default, 1.25 max_iter, would leave the line search none
        history_size=HISTORY_SIZE,
        line_search_fn="strong_wolfe",
        tolerance_grad=0.0,
        tolerance_change=0.0,
    )

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        model._assign_globals(from_free(free))
        value = -model._penalised_log_likelihood(x, y) / n_rows
        value.backward()
        return value

    def snapshot() -> Values:
        return {name: value.detach().clone() for name, value in from_free(free).items()}

    work = float(n_rows) * sum(value.numel() for value in start.values())
    best_value, best, history, converged = -float(loss().detach()), start, [], False
    with torch_threads(threads_for(work)):
        for _ in range(max_iter):
            optimizer.step(loss)
            with torch.no_grad():
                model._assign_globals(from_free(free))
                value = float(model._penalised_log_likelihood(x, y)) / n_rows
            if not math.isfinite(value) or value <= best_value:  # no gain: the line search found nothing better
                converged = True
                break
            best_value, best = value, snapshot()
            history.append(value)
            if len(history) > WINDOW and history[-1] - history[-1 - WINDOW] <= tol:
                converged = True
                break
    model._set_globals(best)
    logger.info("L-BFGS polish: objective/point %s after %d iterations", f"{best_value:.6f}", len(history))
    return history, converged
