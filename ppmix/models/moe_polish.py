"""Quasi-Newton polish of a :class:`~ppmix.models.MixtureOfExperts` fitted by EM.

EM on a mixture of experts climbs fast at first and then crawls: its rate is set by the
share of missing information, which is high where experts overlap, and with logistic
experts every M-step is itself a few Newton steps. On the S4.1 logistic simulation
(Chamroukhi & Pham 2026, N = 8 * 10^4, seed 1) 1 000 more EM iterations after a fit of 100
still gained 0.0010 nats per row; L-BFGS on the same objective gained as much in 100
iterations (12 s against 4 min), and the experts it ended with matched the planted ones
far better (adjusted Rand index 0.75 -> 0.93). So after EM the fit goes on by L-BFGS
(strong-Wolfe line search) on exactly EM's objective, the penalised log-likelihood
(:meth:`~ppmix.models.MixtureOfExperts.penalised_log_likelihood`), from EM's end point.
Every iterate that is kept raises that objective, so ``history_`` stays monotone.

Gaussian experts' noise scales are optimised as ``log(scale^2 - floor)``, which keeps them
above the variance floor that EM keeps them above.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from ppmix.inference.engines.result import ConvergenceWarning, FitResult
from ppmix.ops.threads import threads_for, torch_threads

if TYPE_CHECKING:
    from ppmix.models.moe import MixtureOfExperts

__all__ = ["polish", "polish_fit", "polished", "warn_unconverged"]

logger = logging.getLogger(__name__)

#: correction pairs L-BFGS keeps
_HISTORY_SIZE = 20
#: the most objective evaluations of one iteration (its line search)
_LINE_SEARCH_EVALS = 25
#: the polish has converged when the objective per point rose by at most ``tol`` over this many iterations
#: (L-BFGS's gains are irregular: a single small one does not mean it is done)
_WINDOW = 5


def _unconstrained(model: MixtureOfExperts, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The parameters on an unconstrained scale: Gaussian experts' ``scale`` as ``log(scale^2 - floor)``."""
    if "scale" not in values:
        return dict(values)
    floor = model._experts.min_variance
    excess = (values["scale"].square() - floor).clamp_min(torch.finfo(values["scale"].dtype).tiny)
    return {**values, "scale": excess.log()}


def _constrained(model: MixtureOfExperts, free: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`_unconstrained`."""
    if "scale" not in free:
        return dict(free)
    return {**free, "scale": (model._experts.min_variance + free["scale"].exp()).sqrt()}


def polish(
    model: MixtureOfExperts, data: tuple[torch.Tensor, torch.Tensor], max_iter: int, tol: float
) -> tuple[list[float], bool]:
    """Run L-BFGS on ``model``'s penalised log-likelihood per point from its current parameters, in place.

    Parameters
    ----------
    model : MixtureOfExperts
        A model fitted by EM (its gate and experts are set).
    data : (x, y)
        The standardised training data (``model.em_data``).
    max_iter : int
        The most L-BFGS iterations.
    tol : float
        Stop when the last 5 iterations gained at most this much objective per point in all (EM's ``tol``).

    Returns
    -------
    history : list of float
        The objective per point after each iteration (empty if the first did not gain).
    converged : bool
        Whether it stopped by ``tol``, or at a point where the line search found no gain.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.models import MixtureOfExperts
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 2))
    >>> y = (X[:, 0] * np.sign(X[:, 1]) + 0.3 * rng.normal(size=300) > 0).astype(float)
    >>> moe = MixtureOfExperts(2, expert="logistic", seed=0, progress=False, split_merge=0, polish=False)
    >>> moe = moe.fit(X, y, max_iter=5)
    >>> history, converged = polish(moe, moe.em_data(moe._train_data), max_iter=200, tol=1e-9)
    >>> bool(history[-1] > moe.lower_bound_), bool(np.all(np.diff(history) >= 0))
    (True, True)
    """
    x, y = data
    n_rows = len(y)
    start = model.get_globals()
    free = {name: value.clone().requires_grad_(True) for name, value in _unconstrained(model, start).items()}
    optimizer = torch.optim.LBFGS(
        list(free.values()),
        lr=1.0,
        max_iter=1,  # one iteration per step, so that every iteration's objective is recorded
        max_eval=_LINE_SEARCH_EVALS,  # torch's default, 1.25 max_iter, would leave the line search none
        history_size=_HISTORY_SIZE,
        line_search_fn="strong_wolfe",
        tolerance_grad=0.0,
        tolerance_change=0.0,
    )

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        model.assign_globals(_constrained(model, free))
        value = -model.penalised_log_likelihood(x, y) / n_rows
        value.backward()
        return value

    def snapshot() -> dict[str, torch.Tensor]:
        return {name: value.detach().clone() for name, value in _constrained(model, free).items()}

    work = float(n_rows) * sum(value.numel() for value in start.values())
    best_value, best, history, converged = -float(loss().detach()), start, [], False
    with torch_threads(threads_for(work)):
        for _ in range(max_iter):
            optimizer.step(loss)
            with torch.no_grad():
                model.assign_globals(_constrained(model, free))
                value = float(model.penalised_log_likelihood(x, y)) / n_rows
            if not math.isfinite(value) or value <= best_value:  # no gain: the line search found nothing better
                converged = True
                break
            best_value, best = value, snapshot()
            history.append(value)
            if len(history) > _WINDOW and history[-1] - history[-1 - _WINDOW] <= tol:
                converged = True
                break
    model.set_globals(best)
    logger.info("L-BFGS polish: objective/point %s after %d iterations", f"{best_value:.6f}", len(history))
    return history, converged


def polished(model: MixtureOfExperts, result: FitResult, options: dict[str, Any]) -> FitResult:
    """``result``, an EM run on ``model``'s training data, continued by :func:`polish` when ``model.polish``:
    its history extended, its iterations added and its convergence the polish's.

    ``options``' ``max_iter`` and ``tol`` (else the model's) bound the polish as they bound EM.
    """
    if not model.polish:
        return result
    max_iter, tol = options.get("max_iter", model.max_iter), options.get("tol", model.tol)
    history, converged = polish(model, model.em_data(model._train_data), int(max_iter), float(tol))
    return FitResult(list(result.history) + history, int(result.n_iter) + len(history), converged)


def polish_fit(model: MixtureOfExperts, options: dict[str, Any]) -> None:
    """Continue the EM fit recorded in ``model``'s fitted attributes by :func:`polished`."""
    model._store_result("em", polished(model, FitResult(model.history_, model.n_iter_, model.converged_), options))


def warn_unconverged(model: MixtureOfExperts) -> None:
    """Warn if the fit's last EM run and its polish stopped at ``max_iter`` before meeting ``tol``: the verdict
    that replaces EM's own warning when ``model.polish``."""
    if model.polish and not model.converged_:
        warnings.warn(
            "EM and its L-BFGS polish did not converge in max_iter iterations each; increase max_iter or tol",
            ConvergenceWarning,
            stacklevel=3,
        )
