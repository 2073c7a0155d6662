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
from ppmix.ops.kmeans import kmeans

__all__ = ["greedy_capacity_assignment", "improving_moves", "initial_partition", "partition_onehot", "sq_distances"]


def greedy_capacity_assignment(scores: torch.Tensor, capacity: torch.Tensor | int | None) -> torch.Tensor:
    """Assign every row to one column, cheapest pairs first, under column capacities.

    All ``N K`` pairs are sorted once (ascending; ``+inf`` pairs are never taken);
    a pair is accepted when its point is still free and its column has room
    (lines 19-24 of Algorithm 1, with the capacities of App. D.3).

    Parameters
    ----------
    scores : Tensor, shape (N, K)
    capacity : int, Tensor of shape (K,), or None (unbounded)
        Must satisfy ``sum(capacity) >= N``.

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
    """
    n, k = scores.shape
    if capacity is None:
        cap = np.full(k, n, dtype=np.int64)
    else:
        cap = np.broadcast_to(np.asarray(torch.as_tensor(capacity).cpu(), dtype=np.int64), (k,)).copy()
    if cap.sum() < n:
        raise ValueError(f"capacities sum to {int(cap.sum())} < {n} points; not every point can be assigned")
    finite = torch.isfinite(scores)
    if not finite.any(dim=1).all():
        raise ValueError("every point needs at least one finite score")
    flat = torch.where(finite, scores, torch.full_like(scores, math.inf)).reshape(-1).cpu()
    order = torch.argsort(flat, stable=True)
    order = order[torch.isfinite(flat[order])].numpy()
    rows, cols = np.divmod(order, k)
    assigned = np.full(n, -1, dtype=np.int64)
    remaining = n
    for i, c in zip(rows.tolist(), cols.tolist()):
        if assigned[i] < 0 and cap[c] > 0:
            assigned[i] = c
            cap[c] -= 1
            remaining -= 1
            if remaining == 0:
                break
    if remaining:
        raise ValueError("the capacities could not hold every point with a finite score")
    return torch.as_tensor(assigned, device=scores.device)


def improving_moves(bound: torch.Tensor, part: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """Move points to their cheapest part, largest improvement first, while capacity allows.

    Every accepted move lowers ``sum_i bound[i, part_i]``, so the result never raises it.
    """
    n, k = bound.shape
    best = bound.argmin(1)
    gain = bound.gather(1, part[:, None]).squeeze(1) - bound.gather(1, best[:, None]).squeeze(1)
    order = torch.argsort(gain, descending=True, stable=True)
    order = order[gain[order] > 0].tolist()
    new = as_numpy(part).copy()
    counts = np.bincount(new, minlength=k)
    cap = n if capacity is None else int(capacity)
    target = as_numpy(best)
    for i in order:
        if counts[target[i]] < cap:
            counts[new[i]] -= 1
            counts[target[i]] += 1
            new[i] = target[i]
    return torch.as_tensor(new, device=part.device)


def initial_partition(
    x: torch.Tensor, k: int, init: Any, capacity: int | None, generator: torch.Generator
) -> torch.Tensor:
    """The starting partition of PRESTO's ``init`` (App. D.3 initialises by a clustering).

    ``"random"``: a random balanced labelling; ``"kmeans"``: k-means on standardised ``x``,
    balanced under ``capacity``; ``"ward"``: scikit-learn's Ward agglomerative clustering
    (quadratic memory, small ``N`` only); or an integer array of shape ``(N,)`` with values
    in ``[0, k)``. Random draws come from the CPU ``generator``.
    """
    n = x.shape[0]
    if isinstance(init, str):
        if init == "random":
            return (torch.randperm(n, generator=generator) % k).to(x.device)
        if init == "kmeans":
            scale = x.std(0).clamp_min(1e-12)
            centres, _ = kmeans((x - x.mean(0)) / scale, k, generator, n_init=3)
            dist = torch.cdist((x - x.mean(0)) / scale, centres).square()
            return greedy_capacity_assignment(dist, capacity)
        if init == "ward":
            from sklearn.cluster import AgglomerativeClustering

            labels = AgglomerativeClustering(k, linkage="ward").fit_predict(as_numpy(x))
            return torch.as_tensor(labels, dtype=torch.long, device=x.device)
        raise ValueError(f"init must be 'kmeans', 'ward', 'random' or an array of shape ({n},); got {init!r}")
    arr = as_numpy(init)
    if arr.shape != (n,) or arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= k:
        raise ValueError(f"init must be an integer array of shape ({n},) with values in [0, {k}); got {arr!r}")
    return torch.as_tensor(arr, dtype=torch.long, device=x.device)


def partition_onehot(part: torch.Tensor, k: int) -> torch.Tensor:
    """One-hot float64 matrix of a partition, shape (N, K)."""
    return torch.nn.functional.one_hot(part, k).to(torch.float64)


def sq_distances(x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Squared distances of every point to the centre (mean) of every part, shape (N, K)."""
    counts = onehot.sum(0)
    centres = (onehot.T @ x) / counts.clamp_min(1.0)[:, None]
    centres = torch.where(counts[:, None] > 0, centres, x.mean(0, keepdim=True).expand_as(centres))
    return torch.cdist(x, centres).square()
