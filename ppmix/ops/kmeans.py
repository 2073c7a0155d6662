"""Initialisation of cluster centres: k-means++ seeding and Lloyd iterations, in torch."""

from __future__ import annotations

import math

import torch

__all__ = ["kmeans", "kmeans_plusplus", "nearest_centre"]


def _power_of_two_scale(x: torch.Tensor) -> float:
    """``2^e`` close to ``max |x|``: dividing by it is exact and keeps squared distances finite
    (no overflow at 1e20 in float32, no underflow at 1e-150), and the results of the
    functions here are the same for ``x`` and ``2^j x``."""
    largest = float(x.abs().max()) if x.numel() else 0.0
    if not math.isfinite(largest):
        raise ValueError("X must be finite for k-means")
    return 2.0 ** math.frexp(largest)[1] if largest > 0 else 1.0


def _squared_distances(x: torch.Tensor, centres: torch.Tensor, x_sq: torch.Tensor) -> torch.Tensor:
    offset = x_sq[:, None] + centres.square().sum(1)[None, :]
    return torch.addmm(offset, x, centres.T, alpha=-2.0).clamp_min_(0.0)


def nearest_centre(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centre for every row of ``x``."""
    scale = _power_of_two_scale(x)
    x, centres = x / scale, centres / scale
    return _squared_distances(x, centres, x.square().sum(1)).argmin(dim=1)


def kmeans_plusplus(
    x: torch.Tensor, n_clusters: int, generator: torch.Generator, n_trials: int | None = None
) -> torch.Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii, 2007).

    Each new centre is the best, by the resulting k-means potential, of ``n_trials``
    candidates drawn with probability proportional to ``D^2`` (default
    ``2 + floor(log K)``, the usual greedy variant; ``1`` is plain k-means++).

    Examples
    --------
    >>> import torch
    >>> x = torch.cat([torch.zeros(5, 2), torch.ones(5, 2) * 10])
    >>> c = kmeans_plusplus(x, 2, torch.Generator().manual_seed(0))
    >>> sorted(c[:, 0].tolist())
    [0.0, 10.0]
    """
    scale = _power_of_two_scale(x)
    x = x / scale
    n = x.shape[0]
    trials = n_trials if n_trials is not None else 2 + int(math.log(n_clusters))
    x_sq = x.square().sum(1)
    first = torch.randint(n, (1,), generator=generator).item()
    centres = [x[first]]
    closest = _squared_distances(x, x[first : first + 1], x_sq).squeeze(1)
    for _ in range(1, n_clusters):
        total = closest.sum()
        if total <= 0:  # every point coincides with a centre: pick uniformly
            candidates = torch.randint(n, (trials,), generator=generator)
        else:
            candidates = torch.multinomial((closest / total).cpu(), trials, replacement=True, generator=generator)
        candidates = candidates.to(x.device)
        updated = torch.minimum(closest[None, :], _squared_distances(x, x[candidates], x_sq).T)  # (trials, N)
        best = int(updated.sum(1).argmin())
        centres.append(x[candidates[best]])
        closest = updated[best]
    return torch.stack(centres) * scale


def kmeans(
    x: torch.Tensor, n_clusters: int, generator: torch.Generator, max_iter: int = 100, n_init: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy k-means++ seeding and Lloyd iterations until the assignment is stable.

    With ``n_init > 1`` the run with the lowest within-cluster sum of squares is
    kept. Returns the centres ``(K, D)`` and the hard assignment ``(N,)``. Empty
    clusters keep their previous centre.

    Examples
    --------
    >>> import torch
    >>> x = torch.cat([torch.zeros(5, 2), torch.ones(5, 2) * 10])
    >>> centres, labels = kmeans(x, 2, torch.Generator().manual_seed(0), n_init=2)
    >>> int(labels[0] != labels[-1])
    1
    """
    scale = _power_of_two_scale(x)
    x = x / scale
    best: tuple[float, torch.Tensor, torch.Tensor] | None = None
    for _ in range(n_init):
        centres, labels = _lloyd(x, kmeans_plusplus(x, n_clusters, generator), max_iter)
        inertia = float((x - centres[labels]).square().sum())
        if best is None or inertia < best[0]:
            best = (inertia, centres, labels)
    assert best is not None
    return best[1] * scale, best[2]


def _lloyd(
    x: torch.Tensor, centres: torch.Tensor, max_iter: int, tol: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd iterations until the assignment is stable or the centres move less than
    ``tol`` times the mean feature variance (squared distance, summed over centres)."""
    n_clusters = centres.shape[0]
    x_sq = x.square().sum(1)
    threshold = tol * float(x.var(0).mean()) if x.shape[0] > 1 else 0.0
    labels = _squared_distances(x, centres, x_sq).argmin(1)
    for _ in range(max_iter):
        onehot = torch.nn.functional.one_hot(labels, n_clusters).to(x.dtype)
        counts = onehot.sum(0)
        sums = onehot.T @ x
        new_centres = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centres)
        shift = float((new_centres - centres).square().sum())
        centres = new_centres
        new_labels = _squared_distances(x, centres, x_sq).argmin(1)
        stable = torch.equal(new_labels, labels)
        labels = new_labels
        if stable or shift <= threshold:
            break
    return centres, labels
