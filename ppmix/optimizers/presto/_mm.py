"""PRESTO's majorisation-minimisation sweep (Sangani et al., Algorithm 1): from a starting partition,
repeatedly bound the objective by modular scores, reassign every point under the capacities, and
refit the components, until the partition or the objective stops changing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm

from ppmix.optimizers.presto.adapters import Adapter
from ppmix.optimizers.presto.assignment import (
    greedy_capacity_assignment,
    improving_moves,
    part_loads,
    partition_onehot,
    sq_distances,
)

__all__ = ["SweepResult", "mm_sweep"]

logger = logging.getLogger(__name__)

Scores = Callable[[Adapter, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Objective = Callable[[Adapter, torch.Tensor, torch.Tensor, torch.Tensor, float], float]
#: ``router_cost(onehot) -> (N, K)``: ``mu * (-log pi_phi(k | x_i))`` of a router fitted on the partition
RouterCost = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SweepResult:
    """Outcome of :func:`mm_sweep`: the final partition (and its one-hot matrix) and the histories."""

    part: torch.Tensor
    onehot: torch.Tensor
    history: list[float]
    loss_history: list[float]
    n_iter: int
    converged: bool


def mm_sweep(
    adapter: Adapter,
    x: torch.Tensor,
    y: torch.Tensor,
    part: torch.Tensor,
    capacity: float | None,
    *,
    scores: Scores,
    objective: Objective,
    eps: float,
    max_iter: int,
    tol: float,
    progress: bool,
    router_cost: RouterCost | None = None,
    weight: torch.Tensor | None = None,
) -> SweepResult:
    """Fit ``adapter`` on ``part``, then alternate reassignment and refitting (steps 1-4 of ``PRESTO``).

    A starting ``part`` that overfills a part is first made feasible (every point to the
    nearest centre of the starting parts, under ``capacity``). Every iteration scores all
    pairs by ``scores(adapter, x, y, onehot) + eps * ||x_i - c_k||^2``, assigns greedily
    under ``capacity`` and accepts the new partition only if it does not raise the bound
    ``sum_i M[i, part_i]`` (falling back to single-point improving moves when the greedy
    does). It stops when no point moves, the bound cannot be lowered, the relative change
    of ``objective(..., eps)`` is at most ``tol``, or after ``max_iter`` iterations.

    **Router term.** With ``router_cost`` (``PRESTO(router_weight=mu)``), the router is refitted
    on the partition after every component fit, and its costs ``mu * (-log pi_phi(k | x_i))``
    join every pair's score and the history (not ``loss_history``): the sweep minimises
    ``sum_k G(S_k) + mu * sum_i -log pi_phi(part_i | x_i)`` over the partition and ``phi``.

    **Sample weights.** With row ``weight`` (positive) this is the sweep of the rows repeated ``weight``
    times, restricted to partitions that keep a row's copies together: the membership matrix ``onehot``
    holds each row's weight in its part (the fits, objectives, centres and router see weighted rows),
    ``scores`` are those of one copy of a row (its gain is that of removing one copy), the greedy sorts them
    and charges a row its weight against the capacities (:func:`greedy_capacity_assignment`), and the bound
    sums ``weight_i`` times a row's score. Without capacities nothing splits copies (they share a row of
    scores), so the sweep is that of the repeated rows; with capacities it is whenever the repeated sweep
    keeps copies together.

    **Monotonicity.** With ``scores="loss"`` and exactly optimal fits the history is
    non-increasing (the acceptance test makes this hold also when capacities bind): the
    bound ``G(S') <= sum_k [G(S_k) + sum_{i in S'_k} l_ik - sum_{i in S_k} l_ik]`` needs no
    submodularity. With ``scores="presto"`` it is guaranteed only if ``G`` is
    ``alpha``-submodular with the given ``alpha`` (Theorem 2 gives a lower bound ``alpha_G``
    depending on Lipschitz and curvature constants that are rarely known) and the gains are
    exact; the logistic gains and Newton fits are approximate, so small increases are possible.
    """
    k = adapter.k
    if capacity is not None and float(part_loads(part, k, weight).max()) > capacity:
        # make the start feasible: nearest centre of the initial parts, under the capacities
        part = greedy_capacity_assignment(sq_distances(x, partition_onehot(part, k, weight)), capacity, weight)
    onehot = partition_onehot(part, k, weight)
    adapter.fit(x, y, onehot)
    routing = None if router_cost is None else router_cost(onehot)

    def routed(value: float) -> float:
        return value if routing is None else value + float((onehot * routing).sum())

    history, loss_history = [routed(objective(adapter, x, y, onehot, eps))], [objective(adapter, x, y, onehot, 0.0)]
    converged, iteration = False, 0
    with tqdm(total=max_iter, disable=not progress, desc="PRESTO", leave=False) as bar:
        for iteration in range(1, max_iter + 1):
            bound = scores(adapter, x, y, onehot) + eps * sq_distances(x, onehot)
            if routing is not None:
                bound = bound + routing
            new = greedy_capacity_assignment(bound, capacity, weight)
            old_value = _bound_value(bound, part, weight)
            new_value = _bound_value(bound, new, weight)
            if new_value > old_value:
                # the capacity-constrained greedy is not an exact minimiser; fall back to
                # the improving single-point moves that fit under the capacities
                new = improving_moves(bound, part, capacity, weight)
                new_value = _bound_value(bound, new, weight)
            bar.update(1)
            if new_value > old_value + 1e-12 * old_value.abs():
                logger.info("PRESTO: iteration %d would raise the bound; keeping the partition", iteration)
                converged = True
                break
            moved = int((new != part).sum())
            if moved == 0:
                converged = True
                break
            part, onehot = new, partition_onehot(new, k, weight)
            adapter.fit(x, y, onehot)
            routing = None if router_cost is None else router_cost(onehot)
            value = routed(objective(adapter, x, y, onehot, eps))
            previous = history[-1]
            history.append(value)
            loss_history.append(objective(adapter, x, y, onehot, 0.0))
            bar.set_postfix(objective=f"{value:.6g}", moved=moved)
            logger.debug("PRESTO iteration %d: objective %.6g, %d points moved", iteration, value, moved)
            if abs(previous - value) <= tol * abs(value):
                converged = True
                break
    if not converged:
        logger.warning("PRESTO did not converge in max_iter=%d iterations", max_iter)
    return SweepResult(part, onehot, history, loss_history, iteration, converged)


def _bound_value(bound: torch.Tensor, part: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """``sum_i weight_i bound[i, part_i]`` (every row counted once without ``weight``)."""
    chosen = bound.gather(1, part[:, None])
    return chosen.sum() if weight is None else (weight * chosen.squeeze(1)).sum()
