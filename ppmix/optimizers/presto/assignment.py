"""Assigning points to PRESTO's parts: the greedy capacity-constrained assignment of Algorithm 1
(Sangani et al.), the single-point improving moves it falls back to, the initial partition, and the
one-hot and distance-to-centre matrices of a partition.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ppmix._validation import as_numpy
from ppmix.algorithms.kmeans import kmeans
from ppmix.ops.scaling import column_moments

__all__ = [
    "greedy_capacity_assignment",
    "improving_moves",
    "initial_partition",
    "part_loads",
    "partition_onehot",
    "sq_distances",
]


def greedy_capacity_assignment(
    scores: torch.Tensor, capacity: torch.Tensor | float | None, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Assign every row to one column, cheapest pairs first, under column capacities.

    All ``N K`` pairs are sorted once (ascending; ``+inf`` pairs are never taken);
    a pair is accepted when its point is still free and its column has room
    (lines 19-24 of Algorithm 1, with the capacities of App. D.3).

    With row weights (``sample_weight``) a row of weight ``w`` takes ``w`` of its column's capacity, and it
    is kept whole: a pair is accepted when the column has room for all of it. ``scores`` are then those of
    one copy of the row, so this is the greedy of the rows repeated ``w`` times, as long as it never splits
    a row's copies between columns (it cannot without capacities); a row can always be placed when no
    weight exceeds ``sum(capacity) - sum(weight)`` divided by ``K - 1``.

    Parameters
    ----------
    scores : Tensor, shape (N, K)
    capacity : number, Tensor of shape (K,), or None (unbounded)
        Must satisfy ``sum(capacity) >= N`` (the total weight with ``weight``).
    weight : Tensor, shape (N,), optional
        Positive row weights (default: every row counts one).

    Returns
    -------
    Tensor, shape (N,)
        Column of every row.

    Examples
    --------
    >>> import torch
    >>> s = torch.tensor([[0.0, 1.0], [0.1, 2.0], [0.2, 0.3]])
    >>> greedy_capacity_assignment(s, 2).tolist()
    [0, 0, 1]
    >>> greedy_capacity_assignment(s, 3, weight=torch.tensor([3.0, 1.0, 1.0])).tolist()  # row 0 fills part 0
    [0, 1, 1]
    """
    n, k = scores.shape
    sizes = _row_sizes(weight, n)
    total = float(sizes.sum())
    if capacity is None:
        cap = np.full(k, total)
    else:
        cap = np.broadcast_to(np.asarray(torch.as_tensor(capacity).cpu(), dtype=np.float64), (k,)).copy()
    if cap.sum() < total:
        raise ValueError(f"capacities sum to {cap.sum():g} < {total:g} points; not every point can be assigned")
    finite = torch.isfinite(scores)
    if not finite.any(dim=1).all():
        raise ValueError("every point needs at least one finite score")
    flat = torch.where(finite, scores, torch.full_like(scores, math.inf)).reshape(-1).cpu()
    order = torch.argsort(flat, stable=True)
    order = order[torch.isfinite(flat[order])].numpy()
    rows, cols = np.divmod(order, k)
    assigned, room, size = [-1] * n, cap.tolist(), sizes.tolist()  # Python scalars: the loop's fastest
    remaining = n
    for i, c in zip(rows.tolist(), cols.tolist()):
        if assigned[i] < 0 and room[c] >= size[i]:
            assigned[i] = c
            room[c] -= size[i]
            remaining -= 1
            if remaining == 0:
                break
    if remaining:
        unplaced = assigned.index(-1)
        hint = f" (row {unplaced} of weight {size[unplaced]:g} is kept whole)" if weight is not None else ""
        raise ValueError(f"the capacities could not hold every point with a finite score{hint}")
    return torch.as_tensor(assigned, dtype=torch.long, device=scores.device)


def _row_sizes(weight: torch.Tensor | None, n: int) -> np.ndarray:
    """How much capacity every row takes: its weight, or one."""
    return np.ones(n) if weight is None else as_numpy(weight).astype(np.float64)


def part_loads(part: torch.Tensor, k: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The number of rows (the total weight with ``weight``) in each of the ``k`` parts, shape (K,).

    Examples
    --------
    >>> part = torch.tensor([0, 2, 2])
    >>> part_loads(part, 3).tolist(), part_loads(part, 3, torch.tensor([0.5, 1.0, 2.0])).tolist()
    ([1, 0, 2], [0.5, 0.0, 3.0])
    """
    return torch.bincount(part, weights=weight, minlength=k)


def improving_moves(
    bound: torch.Tensor, part: torch.Tensor, capacity: float | None, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Move points to their cheapest part, largest improvement first, while capacity allows.

    Every accepted move lowers ``sum_i w_i bound[i, part_i]``, so the result never raises it. With row
    weights ``w`` (``bound`` per copy of a row) a row takes ``w_i`` of the capacity and moves whole.
    """
    n, k = bound.shape
    best = bound.argmin(1)
    gain = bound.gather(1, part[:, None]).squeeze(1) - bound.gather(1, best[:, None]).squeeze(1)
    order = torch.argsort(gain, descending=True, stable=True)
    order = order[gain[order] > 0].tolist()
    new = as_numpy(part).copy()
    sizes = _row_sizes(weight, n)
    loads = np.bincount(new, weights=sizes, minlength=k)
    cap = sizes.sum() if capacity is None else float(capacity)
    target = as_numpy(best)
    for i in order:
        if loads[target[i]] + sizes[i] <= cap:
            loads[new[i]] -= sizes[i]
            loads[target[i]] += sizes[i]
            new[i] = target[i]
    return torch.as_tensor(new, device=part.device)


def initial_partition(
    x: torch.Tensor,
    k: int,
    init: Any,
    capacity: float | None,
    generator: torch.Generator,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The starting partition of PRESTO's ``init`` (App. D.3 initialises by a clustering).

    ``"random"``: a random balanced labelling; ``"kmeans"``: k-means on standardised ``x``,
    balanced under ``capacity``; ``"ward"``: scikit-learn's Ward agglomerative clustering
    (quadratic memory, small ``N`` only); or an integer array of shape ``(N,)`` with values
    in ``[0, k)``. Random draws come from the CPU ``generator``. With row weights (``sample_weight``)
    k-means standardises by the weighted moments, runs on a resample of the rows drawn in proportion to
    the weights (:func:`~ppmix.algorithms.kmeans.kmeans`) and balances the total weight; Ward's merge costs
    count rows, not weights, so ``"ward"`` refuses them.
    """
    n = x.shape[0]
    if isinstance(init, str):
        if init == "random":
            return (torch.randperm(n, generator=generator) % k).to(x.device)
        if init == "kmeans":
            if weight is None:
                mean, scale = x.mean(0), x.std(0).clamp_min(1e-12)
            else:
                mean, std = column_moments(x, weight)
                scale = std.clamp_min(1e-12)
            centres, _ = kmeans((x - mean) / scale, k, generator, n_init=3, weight=weight)
            dist = torch.cdist((x - mean) / scale, centres).square()
            return greedy_capacity_assignment(dist, capacity, weight)
        if init == "ward":
            if weight is not None:
                raise ValueError(
                    "init='ward' does not take sample_weight (its merge costs count rows, not weights); "
                    "use init='kmeans', 'random' or an array"
                )
            from sklearn.cluster import AgglomerativeClustering

            labels = AgglomerativeClustering(k, linkage="ward").fit_predict(as_numpy(x))
            return torch.as_tensor(labels, dtype=torch.long, device=x.device)
        raise ValueError(f"init must be 'kmeans', 'ward', 'random' or an array of shape ({n},); got {init!r}")
    arr = as_numpy(init)
    if arr.shape != (n,) or arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= k:
        raise ValueError(f"init must be an integer array of shape ({n},) with values in [0, {k}); got {arr!r}")
    return torch.as_tensor(arr, dtype=torch.long, device=x.device)


def partition_onehot(part: torch.Tensor, k: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """One-hot float64 matrix of a partition, shape (N, K); with row weights, every row's weight in its part
    (the membership weights PRESTO fits, scores and routes with)."""
    onehot = torch.nn.functional.one_hot(part, k).to(torch.float64)
    return onehot if weight is None else onehot * weight[:, None]


def sq_distances(x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Squared distances of every point to the centre (mean) of every part, shape (N, K); with membership
    weights (:func:`partition_onehot`), the centres are the weighted means."""
    counts = onehot.sum(0)
    centres = (onehot.T @ x) / counts.clamp_min(1.0)[:, None]
    centres = torch.where(counts[:, None] > 0, centres, x.mean(0, keepdim=True).expand_as(centres))
    return torch.cdist(x, centres).square()
