"""A second communication round for :func:`~ppmix.distributed.moe.fit_distributed`: the gate refitted on all shards.

The reduction estimator of Chamroukhi & Pham (2026) uses one communication round: the
shards send their local models and a supporting sample of ``S`` rows, and the reduced
gate is fitted to ``f^W`` (the weighted average of the local models) over those ``S``
rows only (:func:`~ppmix.optimizers.ot.gate_refit.refit_gate`). Where ``f^W``'s
gate boundaries run through sparse tails of the covariates, a few thousand rows can place
them poorly. This module goes beyond the paper: with the reduced experts held fixed,
the gate is refitted to the same objective (the expected log-likelihood of ``f^W``'s
responses) over **every** training row, by Newton's method in which every iteration is
one pass over the shards. Each worker reads its shard, builds ``f^W`` on its rows and
returns the sums of the objective, its gradient and its curvature
(:func:`~ppmix.optimizers.ot.gate_refit.gate_statistics`); the driver adds
them up with the ridge and takes the step. The exact Hessian is used where it is
negative definite, else one between it and the EM surrogate's; a step that lowers
the objective is shortened (backtracking) on the next pass, so the objective never decreases.
Only parameters travel: ``(K - 1)(P + 1)`` numbers and two square matrices of that size
per shard and pass.

With ``objective="likelihood"`` the workers use their observed responses instead of
``f^W``'s: the gate then maximises the reduced model's own log-likelihood of the training
data, experts fixed, which is what a global fit's gate does
(:func:`~ppmix.optimizers.ot.gate_refit.observed_gate_statistics`). On the
S4.1 Gaussian simulation, seed 3 with ``M = 16``, this took the test RPE to 0.0089 against
Global's 0.0088, where ``"kl"`` reached 0.0096: ``f^W`` itself misplaces the boundaries
in the covariates' sparse tails, and only the observed responses correct it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from ppmix.components import SoftmaxGate
from ppmix.parallel import DEFAULT_TIMEOUT, TaskInputError, run_tasks

if TYPE_CHECKING:
    from ppmix.models.moe import MixtureOfExperts
    from ppmix.optimizers.ot.gate_refit import GateStatistics

__all__ = ["ROUND_OBJECTIVES", "GateRounds", "model_parameters", "refit_gate_on_shards"]

logger = logging.getLogger(__name__)

#: where the exact Hessian is not negative definite, the missing information is scaled to this fraction of the
#: largest multiple that keeps the curvature positive definite (see ``_newton_step``)
_DAMPING = 0.9
#: shortenings of a step that lowered the objective before the round stops
_MAX_SHORTENINGS = 4


@dataclass
class GateRounds:
    """What the second round did and what it cost.

    Attributes
    ----------
    history : list of float
        The objective ``L`` (per row, ridge included) over all training rows: at the
        one-round gate, then after every accepted Newton step; never decreasing.
    steps : list of str
        The kind of every pass's step: ``"newton"`` (exact Hessian), ``"damped"`` (where the
        exact Hessian was not negative definite, the curvature of ``_newton_step``), ``"em"``
        (the EM surrogate's Hessian, where even that was singular) or ``"shortened"`` (a
        step that lowered the objective, shortened by backtracking).
    shard_seconds : list of list of float
        Seconds inside each worker (reading included), one list per pass, the shards in the canonical
        (content-digest) order of ``DistributedFit.canonical_order``.
    driver_seconds : float
        Seconds of the driver's own work (sums, Newton solves, the final model).
    wall_seconds : float
        Seconds of the whole round as the driver saw it (waiting for the workers included).
    converged : bool
        The predicted gain of the next step fell below ``tol``.
    objective : {"kl", "likelihood"}
        What the gate maximised (see :func:`refit_gate_on_shards`).

    Examples
    --------
    >>> from ppmix.datasets import make_moe
    >>> from ppmix.distributed import fit_distributed
    >>> data = make_moe(600, n_experts=2, n_features=2, seed=0)
    >>> parts = [(data.X[i::2], data.y[i::2]) for i in range(2)]
    >>> rounds = fit_distributed(parts, 2, executor="inline", rounds=2).gate_rounds
    >>> rounds.objective, rounds.history[-1] >= rounds.history[0], len(rounds.steps) == len(rounds.history) - 1
    ('likelihood', True, True)
    """

    history: list[float] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    shard_seconds: list[list[float]] = field(default_factory=list)
    driver_seconds: float = 0.0
    wall_seconds: float = 0.0
    converged: bool = False
    objective: str = "kl"

    @property
    def n_passes(self) -> int:
        """Passes over the shards (communication rounds after the first)."""
        return len(self.shard_seconds)

    @property
    def critical_path_seconds(self) -> float:
        """The slowest shard of every pass, plus the driver."""
        return sum(max(p) for p in self.shard_seconds) + self.driver_seconds

    @property
    def worker_seconds(self) -> float:
        """Total seconds over all shards and passes (the compute spent)."""
        return float(sum(sum(p) for p in self.shard_seconds))

    def summary(self) -> dict[str, Any]:
        """A JSON-able report."""
        return {
            "history": self.history,
            "steps": self.steps,
            "n_passes": self.n_passes,
            "worker_seconds": self.worker_seconds,
            "driver_seconds": self.driver_seconds,
            "wall_seconds": self.wall_seconds,
            "critical_path_seconds": self.critical_path_seconds,
            "converged": self.converged,
            "objective": self.objective,
        }


#: the second round's objectives: ``f^W``'s expected log-likelihood, or the observed responses' log-likelihood
ROUND_OBJECTIVES = ("kl", "likelihood")


@dataclass(frozen=True)
class _GateTask:
    """One shard's pass: how to read its rows, ``f^W`` and the reduced model at the current gate.

    ``read`` returns the covariates for ``objective="kl"`` and ``(covariates, responses)`` for ``"likelihood"``.
    """

    read: Callable[[], Any]
    threads: int
    model_kwargs: dict[str, Any]
    local_params: list[dict[str, np.ndarray]]
    weights: list[float]
    reduced_params: dict[str, np.ndarray]
    mass_tol: float
    objective: str = "kl"


def _shard_gate_statistics(task: _GateTask) -> "GateStatistics":
    """Worker side: read the shard, build ``f^W`` on its rows, return the gate statistics there."""
    from ppmix.ops.threads import torch_threads

    with torch_threads(task.threads):
        return _statistics_here(task)


def _statistics_here(task: _GateTask) -> "GateStatistics":
    from ppmix.models.moe import MixtureOfExperts
    from ppmix.optimizers.ot.gate_refit import gate_statistics, observed_gate_statistics
    from ppmix.optimizers.ot.reduction import LocalMixture

    reduced = MixtureOfExperts.from_parameters(**task.reduced_params, **task.model_kwargs)
    rows = task.read()
    X, y = rows if task.objective == "likelihood" else (rows, None)
    x = torch.as_tensor(X, dtype=reduced.dtype)
    if x.shape[1] != reduced.n_features_in_:  # the shard changed since the first round: a retry cannot help
        raise TaskInputError(
            f"it now has {x.shape[1]} feature columns; the first round fitted {reduced.n_features_in_}"
        )
    if y is not None:
        return observed_gate_statistics(reduced.gate_, reduced.experts_, x, torch.as_tensor(y, dtype=reduced.dtype))
    models = [MixtureOfExperts.from_parameters(**p, engine="em", **task.model_kwargs) for p in task.local_params]
    local = LocalMixture.from_models(models, x, task.weights, task.mass_tol)
    return gate_statistics(local, reduced.gate_, reduced.experts_)


def model_parameters(model: "MixtureOfExperts") -> dict[str, np.ndarray]:
    """A fitted Gaussian or logistic MoE's parameters on the user's scale, as ``from_parameters`` takes them.

    Examples
    --------
    >>> from ppmix.models.moe import MixtureOfExperts
    >>> moe = MixtureOfExperts.from_parameters(gate_coef=[[1.0], [0.0]], gate_intercept=[0.0, 0.0],
    ...                                        coef=[[1.0], [-1.0]], intercept=[0.0, 0.0], scale=[1.0, 1.0])
    >>> sorted(model_parameters(moe))
    ['coef', 'gate_coef', 'gate_intercept', 'intercept', 'scale']
    """
    params = {
        "gate_coef": model.gate_coef_.numpy(),
        "gate_intercept": model.gate_intercept_.numpy(),
        "coef": model.coef_.numpy(),
        "intercept": model.intercept_.numpy(),
    }
    if model.target_kind == "real":
        params["scale"] = model.scale_.numpy()
    return params


def refit_gate_on_shards(
    model: "MixtureOfExperts",
    local_models: Sequence["MixtureOfExperts"],
    weights: Sequence[float],
    readers: Sequence[Callable[[], np.ndarray]],
    names: Sequence[str],
    *,
    executor: Any = None,
    retries: int = 1,
    max_workers: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    threads_per_task: int = 1,
    model_kwargs: dict[str, Any] | None = None,
    max_iter: int = 5,
    tol: float = 1e-7,
    reduction_options: dict[str, Any] | None = None,
    objective: str = "kl",
) -> tuple["MixtureOfExperts", GateRounds]:
    """Refit ``model``'s gate over every row of the shards, its experts fixed (the second round).

    :func:`~ppmix.distributed.moe.fit_distributed` calls it with ``rounds=2``.

    Parameters
    ----------
    model : MixtureOfExperts
        The one-round reduction estimator; its gate is the starting point (not modified).
    local_models : sequence of MixtureOfExperts
        The local fits that make ``f^W``.
    weights : sequence of float
        Their weights ``lambda_m`` (e.g. row counts; normalised here).
    readers : sequence of callables
        One per shard: a picklable function of no arguments, run on the worker at every
        pass, that returns the shard's covariates ``(N_m, P)`` (``objective="kl"``) or
        its covariates and responses ``(X, y)`` (``"likelihood"``; logistic: 0/1).
    names : sequence of str
        The shards' names, used in logs and errors.
    executor, retries, max_workers, timeout, threads_per_task :
        As in :func:`~ppmix.distributed.moe.fit_distributed`.
    model_kwargs : dict, optional
        ``MixtureOfExperts`` arguments (``dtype``, ...) with which the workers rebuild the models.
    max_iter : int, default 5
        Passes over the shards after the first (a shortened step costs one).
    tol : float, default 1e-7
        Stop when the predicted gain of the next Newton step, per row, is at most ``tol``
        times ``max(1, |L|)``.
    reduction_options : dict, optional
        The first round's :func:`~ppmix.optimizers.ot.reduction.ot_reduce` options:
        its ``gate_ridge`` and ``mass_tol`` are kept.
    objective : {"kl", "likelihood"}, default "kl"
        ``"kl"``: the expected log-likelihood of ``f^W``'s responses (the first round's gate
        objective, :func:`~ppmix.optimizers.ot.gate_refit.gate_statistics`).
        ``"likelihood"``: the log-likelihood of the shards' observed responses
        (:func:`~ppmix.optimizers.ot.gate_refit.observed_gate_statistics`), the
        objective of a global fit's gate given these experts.

    Returns
    -------
    model : MixtureOfExperts
        The same experts with the refitted gate.
    rounds : GateRounds

    Raises
    ------
    ppmix.parallel.TaskError
        Shards that still fail after their retries, each named with its error.

    Examples
    --------
    >>> import functools
    >>> from ppmix.datasets.moe import make_moe
    >>> from ppmix.optimizers.ot.reduction import ot_reduce
    >>> from ppmix.models.moe import MixtureOfExperts
    >>> data = make_moe(1200, n_experts=2, n_features=2, seed=0)
    >>> models = [MixtureOfExperts(2, seed=0, progress=False).fit(data.X[i::2], data.y[i::2]) for i in range(2)]
    >>> reduced = ot_reduce(models, data.X[:100], weights=[600, 600])
    >>> readers = [functools.partial(data.X.__getitem__, slice(i, None, 2)) for i in range(2)]
    >>> refitted, rounds = refit_gate_on_shards(reduced, models, [600, 600], readers, ["a", "b"], executor="inline")
    >>> rounds.history[-1] >= rounds.history[0], refitted.coef_.equal(reduced.coef_)
    (True, True)
    """
    from ppmix.optimizers.ot.reduction import GATE_RIDGE, MASS_TOL

    if objective not in ROUND_OBJECTIVES:
        raise ValueError(f"objective must be one of {ROUND_OBJECTIVES}; got {objective!r}")
    options = reduction_options or {}
    ridge, mass_tol = float(options.get("gate_ridge", GATE_RIDGE)), float(options.get("mass_tol", MASS_TOL))
    start = time.perf_counter()
    local_params = [model_parameters(m) for m in local_models]
    lam = [float(w) / float(sum(weights)) for w in weights]
    gate = model.gate_
    free, m = gate.n_components - 1, gate.n_covariates + 1
    block_ridge = SoftmaxGate(gate.coef, gate.intercept, ridge=ridge).penalty_hessian()
    rounds = GateRounds(objective=objective)
    waiting = 0.0

    def stacked(theta: torch.Tensor) -> torch.Tensor:  # (K, P + 1) with the pinned last row
        return torch.cat([theta.reshape(free, m), theta.new_zeros(1, m)])

    def evaluate(theta: torch.Tensor) -> tuple[float, "GateStatistics"]:
        """One pass over the shards at the free parameters ``theta``: ``L`` (per row, ridge included) and the sums."""
        nonlocal waiting
        params = stacked(theta)
        reduced = {
            **model_parameters(model),
            "gate_coef": params[:, :-1].numpy(),
            "gate_intercept": params[:, -1].numpy(),
        }
        tasks = [
            _GateTask(read, threads_per_task, model_kwargs or {}, local_params, lam, reduced, mass_tol, objective)
            for read in readers
        ]
        before = time.perf_counter()
        results = run_tasks(
            _shard_gate_statistics,
            tasks,
            names,
            executor=executor,
            retries=retries,
            max_workers=max_workers,
            timeout=timeout,
        )
        waiting += time.perf_counter() - before
        rounds.shard_seconds.append([r.seconds for r in results])
        total = results[0].value
        for r in results[1:]:
            total = total + r.value
        return (total.value - 0.5 * float(theta @ block_ridge @ theta)) / total.n_rows, total

    theta = gate._stacked()[:free].reshape(-1)
    value, stats = evaluate(theta)
    rounds.history.append(value)
    while rounds.n_passes <= max_iter:
        gradient = stats.gradient - block_ridge @ theta
        step, kind = _newton_step(stats, block_ridge, gradient)
        slope = float(gradient @ step) / stats.n_rows  # dL/dt along the step, per row
        if 0.5 * slope <= tol * max(1.0, abs(value)):  # the predicted gain of the step
            rounds.converged = True
            break
        accepted, length = False, 1.0
        for tries in range(min(_MAX_SHORTENINGS + 1, max_iter + 1 - rounds.n_passes)):
            rounds.steps.append(kind if tries == 0 else "shortened")
            candidate = theta + length * step
            new_value, new_stats = evaluate(candidate)
            if new_value >= value:
                theta, value, stats, accepted = candidate, new_value, new_stats, True
                rounds.history.append(value)
                break
            # the maximiser of the parabola through L(0), L'(0) and L(length), kept within [0.1, 0.5] * length
            curvature = new_value - value - slope * length
            length = min(max(-slope * length**2 / (2 * curvature), 0.1 * length), 0.5 * length)
        if not accepted:  # out of passes, or no halving raised the objective along this direction
            break
    params = stacked(theta)
    refitted = SoftmaxGate(params[:, :-1], params[:, -1], ridge=ridge)
    new = type(model)._from_families(refitted, model.experts_, engine="ot-reduction", expert=model.expert)
    for name in ("history_", "n_iter_", "converged_", "gate_targets_", "gate_history_", "feature_names_in_"):
        setattr(new, name, getattr(model, name))
    rounds.wall_seconds = time.perf_counter() - start
    rounds.driver_seconds = rounds.wall_seconds - waiting
    logger.info(
        "second round: objective %.6g -> %.6g in %d passes (%s)",
        rounds.history[0],
        value,
        rounds.n_passes,
        rounds.steps,
    )
    return new, rounds


def _newton_step(
    stats: "GateStatistics", block_ridge: torch.Tensor, gradient: torch.Tensor
) -> tuple[torch.Tensor, str]:
    """The Newton direction with the exact Hessian where it is negative definite, else a safe curvature.

    Minus the Hessian is ``I - M`` (``I``: the EM surrogate's information with the ridge,
    positive definite; ``M``: the missing information, positive semi-definite). Where it is
    not positive definite (the largest generalised eigenvalue ``c`` of ``(M, I)`` is >= 1),
    ``I - (0.9 / c) M`` is used: the exact curvature scaled back just enough to stay
    positive definite (its eigenvalues relative to ``I`` are >= 0.1), between the EM
    surrogate's step (``M`` left out: safe but slow) and Newton's.
    """
    information = stats.information + block_ridge
    factor, info = torch.linalg.cholesky_ex(information - stats.missing)
    if int(info) == 0:
        return torch.cholesky_solve(gradient[:, None], factor)[:, 0], "newton"
    factor, info = torch.linalg.cholesky_ex(information)
    if int(info) != 0:  # a gate with no mass anywhere: the least-squares EM-gradient step
        return torch.linalg.lstsq(information, gradient[:, None]).solution[:, 0], "em"
    inverse = torch.linalg.solve_triangular(factor, torch.eye(len(factor), dtype=factor.dtype), upper=False)
    largest = float(torch.linalg.eigvalsh(inverse @ stats.missing @ inverse.T).max())
    damped = information - (_DAMPING / largest) * stats.missing
    return torch.linalg.solve(damped, gradient), "damped"
