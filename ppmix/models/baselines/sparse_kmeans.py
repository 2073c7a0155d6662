"""Sparse k-means (Witten & Tibshirani, 2010, "A framework for feature selection in clustering").

Sparse k-means maximises the weighted between-cluster sum of squares

    max_{C, w}  sum_d w_d BCSS_d(C)   s.t.  ||w||_2 <= 1,  ||w||_1 <= s,  w >= 0,

by alternating (a) k-means on the features scaled by ``sqrt(w_d)`` (which minimises
``sum_d w_d WCSS_d`` for fixed ``w``) and (b) the closed-form weight step: ``w`` is the
soft-thresholded, normalised vector of per-feature BCSS, with the threshold found by a
binary search so that ``||w||_1 <= s`` (:func:`sparse_feature_weights`). The L1 bound
``s`` is chosen by the permutation gap statistic of the paper (:func:`choose_l1_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ppmix.algorithms.kmeans import _lloyd, kmeans

__all__ = ["SparseKMeansResult", "choose_l1_bound", "default_l1_bounds", "sparse_feature_weights", "sparse_kmeans"]

#: alternations of sparse k-means (the default of the authors' R package ``sparcl``)
MAX_ALTERNATIONS = 6
#: relative change of the weights at which the alternation stops (as in ``sparcl``)
WEIGHT_TOL = 1e-4
#: bisection steps of the soft threshold (interval shrinks by 2^-60: exact to rounding)
BISECTION_STEPS = 60
#: Lloyd iterations of a warm-started k-means step
LLOYD_MAX_ITER = 100


@dataclass
class SparseKMeansResult:
    """One sparse k-means fit: feature weights, hard labels, centres in the weighted space."""

    weights: np.ndarray  # (D,)
    labels: np.ndarray  # (N,)
    centres: np.ndarray  # (K, D), in the space of x * sqrt(weights)
    objective: float  # sum_d w_d BCSS_d
    n_iter: int


def _soft_threshold_normalised(a: np.ndarray, threshold: float) -> np.ndarray:
    shrunk = np.maximum(a - threshold, 0.0)
    if not shrunk.any():  # threshold at the maximum: the limit is the indicator of the (tied) maxima
        shrunk = (a == a.max()).astype(np.float64)
    return shrunk / np.linalg.norm(shrunk)


def sparse_feature_weights(bcss: np.ndarray, l1_bound: float) -> np.ndarray:
    """The weight step: ``argmax_w w . a`` s.t. ``||w||_2 <= 1``, ``||w||_1 <= s``, ``w >= 0``.

    The solution is ``S(a_+, delta) / ||S(a_+, delta)||_2`` with ``S`` the soft threshold;
    ``delta = 0`` if that already satisfies the L1 bound, otherwise the smallest ``delta``
    with ``||w||_1 <= s``, found by bisection (the L1 norm of the normalised vector
    decreases in ``delta``, down to 1 at the largest entry).

    Parameters
    ----------
    bcss : array (D,)
        Per-feature between-cluster sums of squares ``a``.
    l1_bound : float
        ``s >= 1`` (``||w||_2 = 1`` forces ``||w||_1 >= 1``).

    Returns
    -------
    ndarray (D,)
        Non-negative weights with unit L2 norm and L1 norm at most ``s``. All features
        share the weight ``1/sqrt(D)`` when no feature separates the clusters.

    Examples
    --------
    >>> w = sparse_feature_weights(np.array([9.0, 4.0, 0.1, 0.1]), l1_bound=1.2)
    >>> bool(abs(np.linalg.norm(w) - 1) < 1e-12 and w.sum() <= 1.2 + 1e-12), int((w > 0).sum())
    (True, 2)
    """
    a = np.maximum(np.asarray(bcss, dtype=np.float64), 0.0)
    if not l1_bound >= 1.0:
        raise ValueError(f"l1_bound must be >= 1; got {l1_bound}")
    if a.max() <= 0.0:
        return np.full(a.shape, 1.0 / np.sqrt(a.size))
    w = _soft_threshold_normalised(a, 0.0)
    if w.sum() <= l1_bound:
        return w
    low, high = 0.0, float(a.max())  # L1 at low exceeds s; at max(a) only the largest entries survive
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if _soft_threshold_normalised(a, mid).sum() > l1_bound:
            low = mid
        else:
            high = mid
    w = _soft_threshold_normalised(a, high)
    if w.sum() > l1_bound:  # t tied maxima with sqrt(t) > s: one of them alone is feasible and optimal
        w = (np.arange(a.size) == np.argmax(a)).astype(np.float64)
    return w


def _per_feature_bcss(x: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """``BCSS_d = TSS_d - WCSS_d`` for every feature, shape ``(D,)``."""
    counts = np.bincount(labels, minlength=n_clusters).astype(np.float64)
    sums = np.zeros((n_clusters, x.shape[1]))
    np.add.at(sums, labels, x)
    centred_sums = sums - counts[:, None] * x.mean(0)
    present = counts > 0
    return (centred_sums[present] ** 2 / counts[present, None]).sum(0)


def sparse_kmeans(
    x: np.ndarray,
    n_clusters: int,
    l1_bound: float,
    generator: torch.Generator,
    n_init: int = 3,
    initial_labels: np.ndarray | None = None,
) -> SparseKMeansResult:
    """Alternate k-means on ``x * sqrt(w)`` and :func:`sparse_feature_weights`.

    Starts from equal weights ``1/sqrt(D)`` and the best of ``n_init`` k-means++ runs
    (or ``initial_labels``, that partition, which does not depend on ``l1_bound``);
    later k-means steps are Lloyd iterations warm-started from the previous partition's
    centres, on the features with non-zero weight only (the others add nothing to any
    distance), as in the authors' ``sparcl``. Stops when ``sum |w_new - w| / sum |w|``
    falls below :data:`WEIGHT_TOL` or after :data:`MAX_ALTERNATIONS` alternations.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(60, 5))
    >>> x[:30, 0] += 8.0
    >>> res = sparse_kmeans(x, 2, 1.1, torch.Generator().manual_seed(0))
    >>> int(np.argmax(res.weights)), res.labels.shape
    (0, (60,))
    """
    d = x.shape[1]
    xt = torch.as_tensor(x, dtype=torch.float64)
    w = np.full(d, 1.0 / np.sqrt(d))
    labels = _initial_partition(xt, n_clusters, generator, n_init) if initial_labels is None else initial_labels
    n_iter = 0
    while n_iter < MAX_ALTERNATIONS:
        n_iter += 1
        new_w = sparse_feature_weights(_per_feature_bcss(x, labels, n_clusters), l1_bound)
        change = np.abs(new_w - w).sum() / np.abs(w).sum()
        w = new_w
        labels = _warm_lloyd(xt, w, labels, n_clusters)
        if change < WEIGHT_TOL:
            break
    scaled = x * np.sqrt(w)
    centres = np.stack([scaled[labels == k].mean(0) if (labels == k).any() else np.zeros(d) for k in range(n_clusters)])
    objective = float(w @ _per_feature_bcss(x, labels, n_clusters))
    return SparseKMeansResult(w, labels, centres, objective, n_iter)


def _initial_partition(x: torch.Tensor, n_clusters: int, generator: torch.Generator, n_init: int) -> np.ndarray:
    """k-means with equal feature weights, i.e. plain k-means."""
    return kmeans(x, n_clusters, generator, n_init=n_init)[1].numpy()


def _warm_lloyd(x: torch.Tensor, weights: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """Lloyd iterations on the active features of ``x * sqrt(w)`` from the centres of ``labels``."""
    active = torch.as_tensor(weights > 0)
    scaled = x[:, active] * torch.as_tensor(np.sqrt(weights[weights > 0]))
    onehot = torch.nn.functional.one_hot(torch.as_tensor(labels), n_clusters).to(scaled.dtype)
    counts = onehot.sum(0)
    centres = (onehot.T @ scaled) / counts.clamp_min(1.0)[:, None]
    if (counts == 0).any():  # an empty cluster restarts at the points farthest from their centre
        far = (scaled - centres[torch.as_tensor(labels)]).square().sum(1).argsort(descending=True)
        centres[counts == 0] = scaled[far[: int((counts == 0).sum())]]
    return _lloyd(scaled, centres[None], LLOYD_MAX_ITER)[1][0].numpy()


def default_l1_bounds(n_features: int, n_values: int = 10) -> np.ndarray:
    """The candidate bounds of ``sparcl``: ``n_values`` log-spaced from 1.2 to ``0.9 sqrt(D)`` (at least 1.2).

    Examples
    --------
    >>> default_l1_bounds(100, 3).round(3)
    array([1.2  , 3.286, 9.   ])
    """
    upper = max(0.9 * np.sqrt(n_features), 1.2)
    return np.unique(np.exp(np.linspace(np.log(1.2), np.log(upper), n_values)))


def choose_l1_bound(
    x: np.ndarray,
    n_clusters: int,
    bounds: np.ndarray,
    n_permutations: int,
    seed: int | None,
    n_init: int = 3,
) -> tuple[float, np.ndarray, np.ndarray]:
    """The gap statistic of Witten & Tibshirani: pick the bound with the largest
    ``log O(s) - mean_b log O_b(s)``, where ``O_b`` is the objective on data whose
    features were permuted independently.

    Returns the chosen bound, the gaps and their standard errors (one per bound).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(40, 6))
    >>> x[:20, :2] += 6.0
    >>> s, gaps, se = choose_l1_bound(x, 2, np.array([1.2, 2.0]), n_permutations=3, seed=0)
    >>> gaps.shape, bool(s in (1.2, 2.0))
    ((2,), True)
    """
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))

    def objectives(data: np.ndarray) -> list[float]:
        start = _initial_partition(torch.as_tensor(data), n_clusters, gen, n_init)
        return [sparse_kmeans(data, n_clusters, s, gen, n_init, initial_labels=start).objective for s in bounds]

    observed = np.array(objectives(x))
    permuted = np.empty((n_permutations, len(bounds)))
    for b in range(n_permutations):
        shuffled = np.take_along_axis(x, rng.permuted(np.tile(np.arange(x.shape[0])[:, None], x.shape[1]), axis=0), 0)
        permuted[b] = objectives(shuffled)
    log_perm = np.log(np.maximum(permuted, np.finfo(float).tiny))
    gaps = np.log(np.maximum(observed, np.finfo(float).tiny)) - log_perm.mean(0)
    se = log_perm.std(0, ddof=1) / np.sqrt(n_permutations) if n_permutations > 1 else np.zeros(len(bounds))
    return float(bounds[int(np.argmax(gaps))]), gaps, se
