"""Synthetic settings of Regularized Weighting (Vainsencher, Mannor & Xu, 2013): unbalanced clusters,
clusters with adversarial outliers, and two quadratic regressions with fat-tailed noise."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppmix._validation import check_positive_int

__all__ = [
    "ClusteringData",
    "QuadraticRegressionData",
    "make_outlier_clusters",
    "make_quadratic_regressions",
    "make_unbalanced_clusters",
]


@dataclass
class ClusteringData:
    """Points ``X`` with their true cluster ``labels`` (``-1`` for outliers) and the planted ``centres``.

    ``outlier_mask`` marks the outliers; ``radius`` is the radius of a ball about the
    origin that holds every inlier (``R`` of Theorem 2).

    Parameters
    ----------
    X : ndarray of shape (N, D)
        The points, inliers and outliers.
    labels : ndarray of shape (N,)
        The true cluster of every point; ``-1`` for an outlier.
    centres : ndarray of shape (K, D)
        The planted cluster centres.
    outlier_mask : ndarray of shape (N,), bool
        Which points are outliers.
    radius : float
        The radius of a ball about the origin that holds every inlier.

    Examples
    --------
    >>> from ppmix.datasets import make_unbalanced_clusters
    >>> data = make_unbalanced_clusters(60, (0.35, 0.65), seed=0)
    >>> data.X.shape, data.centres.shape, bool(data.outlier_mask.any())
    ((60, 1), (2, 1), False)
    """

    X: np.ndarray
    labels: np.ndarray
    centres: np.ndarray
    outlier_mask: np.ndarray
    radius: float


@dataclass
class QuadraticRegressionData:
    """Two quadratic regressions ``y = intercept[j] + coef[j, 0] x + coef[j, 1] x^2 + noise``.

    ``x`` holds the scalar covariate and ``X = [x, x^2]`` the design for a linear
    learner; ``labels`` says which curve generated each point.

    Parameters
    ----------
    x : ndarray of shape (N,)
        The scalar covariate.
    X : ndarray of shape (N, 2)
        The design ``[x, x^2]``.
    y : ndarray of shape (N,)
        The responses.
    labels : ndarray of shape (N,)
        Which of the two curves generated each point.
    coef : ndarray of shape (2, 2)
        The slopes on ``x`` and ``x^2`` of each curve.
    intercept : ndarray of shape (2,)
        The intercept of each curve.

    Examples
    --------
    >>> from ppmix.datasets import make_quadratic_regressions
    >>> data = make_quadratic_regressions(40, seed=0)
    >>> data.coef.shape, data.intercept.shape, sorted(set(data.labels.tolist()))
    ((2, 2), (2,), [0, 1])
    """

    x: np.ndarray
    X: np.ndarray
    y: np.ndarray
    labels: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray


def _check_fraction(value: float, name: str, *, upper: float = 1.0) -> float:
    value = float(value)
    if not 0.0 <= value < upper:
        raise ValueError(f"{name} must be in [0, {upper}); got {value}")
    return value


def _ball_radius(x: np.ndarray) -> float:
    return float(np.sqrt((x**2).sum(axis=1)).max()) if len(x) else 0.0


def make_unbalanced_clusters(
    n_samples: int = 60,
    proportions: tuple[float, ...] = (0.35, 0.65),
    n_features: int = 1,
    *,
    centres: np.ndarray | None = None,
    spread: float = 0.1,
    seed: int | None = 0,
) -> ClusteringData:
    """Clusters of unequal size (Vainsencher, Mannor & Xu, 2013, Figure 2.2: 21 and 39 points in 1-D).

    Cluster ``j`` holds ``round(proportions[j] * n_samples)`` points (the last takes the
    remainder) drawn uniformly in a ball of radius ``spread`` about its centre.
    The default centres are ``-0.4`` and ``0.3`` on the first axis (as in Fig. 2.2),
    more clusters are spaced ``0.7`` apart.

    Parameters
    ----------
    n_samples : int
        The number of points.
    proportions : tuple of float
        The share of the points in every cluster.
    n_features : int
        The dimension of every point.
    centres : ndarray of shape (K, n_features), optional
        The cluster centres; see above for the default.
    spread : float
        The radius of every cluster.
    seed : int or None
        The seed of NumPy's generator.

    Returns
    -------
    ClusteringData

    Examples
    --------
    >>> data = make_unbalanced_clusters(60, (0.35, 0.65), seed=0)
    >>> data.X.shape, np.bincount(data.labels).tolist()
    ((60, 1), [21, 39])
    """
    n = check_positive_int(n_samples, "n_samples")
    d = check_positive_int(n_features, "n_features")
    props = np.asarray(proportions, dtype=float)
    if props.ndim != 1 or len(props) == 0 or (props <= 0).any() or not np.isclose(props.sum(), 1.0):
        raise ValueError(f"proportions must be positive and sum to one; got {proportions}")
    k = len(props)
    if centres is None:
        centres = np.zeros((k, d))
        centres[:, 0] = -0.4 + 0.7 * np.arange(k)
    centres = np.asarray(centres, dtype=float)
    if centres.shape != (k, d):
        raise ValueError(f"centres must have shape ({k}, {d}); got {centres.shape}")
    sizes = np.round(props * n).astype(int)
    sizes[-1] = n - sizes[:-1].sum()
    if (sizes < 1).any():
        raise ValueError(f"n_samples={n} leaves an empty cluster for proportions {proportions}")
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(k), sizes)
    x = centres[labels] + _uniform_ball(rng, n, d, spread)
    return ClusteringData(X=x, labels=labels, centres=centres, outlier_mask=np.zeros(n, bool), radius=_ball_radius(x))


def _uniform_ball(rng: np.random.Generator, n: int, d: int, radius: float) -> np.ndarray:
    direction = rng.normal(size=(n, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    return direction * radius * rng.uniform(size=(n, 1)) ** (1.0 / d)


def make_outlier_clusters(
    n_samples: int = 600,
    n_clusters: int = 2,
    n_features: int = 2,
    *,
    eta: float = 0.01,
    outlier_distance: float = 1e6,
    separation: float = 10.0,
    spread: float = 1.0,
    seed: int | None = 0,
) -> ClusteringData:
    """Balanced clusters plus a fraction ``eta`` of adversarial outliers (Vainsencher, Mannor & Xu, 2013, §3).

    Inliers: ``n_clusters`` equal clusters, each uniform in a ball of radius
    ``spread``, with centres on a circle (a line in 1-D) of diameter ``separation``
    about the origin. Outliers: ``round(eta * n_samples)`` points all placed (with
    ``spread``-sized jitter) about one point at distance ``outlier_distance`` from the
    origin, the worst case for k-means, which then spends a centre on them. Theorem 2
    guarantees RW's robustness for ``eta < 1 / (22 k^2)``.

    Parameters
    ----------
    n_samples : int
        The number of points, inliers and outliers.
    n_clusters : int
        The number of inlier clusters.
    n_features : int
        The dimension of every point.
    eta : float
        The fraction of outliers.
    outlier_distance : float
        How far from the origin the outliers sit.
    separation : float
        The diameter of the circle the cluster centres lie on.
    spread : float
        The radius of every cluster (and of the outliers' jitter).
    seed : int or None
        The seed of NumPy's generator.

    Returns
    -------
    ClusteringData

    Examples
    --------
    >>> data = make_outlier_clusters(200, 2, eta=0.01, seed=0)
    >>> data.X.shape, int(data.outlier_mask.sum()), sorted(set(data.labels.tolist()))
    ((200, 2), 2, [-1, 0, 1])
    """
    n = check_positive_int(n_samples, "n_samples")
    k = check_positive_int(n_clusters, "n_clusters")
    d = check_positive_int(n_features, "n_features")
    eta = _check_fraction(eta, "eta")
    if not (np.isfinite(outlier_distance) and outlier_distance >= 0):
        raise ValueError(f"outlier_distance must be finite and non-negative; got {outlier_distance}")
    rng = np.random.default_rng(seed)
    n_out = int(round(eta * n))
    n_in = n - n_out
    if n_in < k:
        raise ValueError(f"too few inliers ({n_in}) for {k} clusters")
    centres = np.zeros((k, d))
    if k > 1:
        angles = 2 * np.pi * np.arange(k) / k
        if d == 1:
            centres[:, 0] = np.linspace(-separation / 2, separation / 2, k)
        else:
            centres[:, 0], centres[:, 1] = separation / 2 * np.cos(angles), separation / 2 * np.sin(angles)
    labels_in = np.arange(n_in) % k
    inliers = centres[labels_in] + _uniform_ball(rng, n_in, d, spread)
    direction = rng.normal(size=d)
    direction /= np.linalg.norm(direction)
    outliers = outlier_distance * direction + _uniform_ball(rng, n_out, d, spread)
    x = np.concatenate([inliers, outliers])
    labels = np.concatenate([labels_in, np.full(n_out, -1)])
    mask = labels < 0
    return ClusteringData(X=x, labels=labels, centres=centres, outlier_mask=mask, radius=_ball_radius(inliers))


def make_quadratic_regressions(
    n_samples: int = 40,
    *,
    noise_scale: float = 0.05,
    tail_df: float = 1.5,
    coef: np.ndarray | None = None,
    intercept: np.ndarray | None = None,
    seed: int | None = 0,
) -> QuadraticRegressionData:
    """A mixture of two quadratic regressions with positive fat-tailed noise (Vainsencher et al., 2013, Fig. 2.1).

    ``x`` is uniform on ``[0, 0.8]``; each point comes from one of two quadratics
    (alternately, so the classes are balanced) and gets noise
    ``noise_scale * |t_df|``, a half Student-t with ``tail_df`` degrees of freedom
    (infinite variance for ``tail_df <= 2``), so a few points lie far above their curve.

    Parameters
    ----------
    n_samples : int
        The number of points (half from each curve).
    noise_scale : float
        The scale of the half Student-t noise.
    tail_df : float
        Its degrees of freedom (infinite variance at or below 2).
    coef : ndarray of shape (2, 2), optional
        The curves' slopes on ``x`` and ``x^2``; the paper's by default.
    intercept : ndarray of shape (2,), optional
        The curves' intercepts; the paper's by default.
    seed : int or None
        The seed of NumPy's generator.

    Returns
    -------
    QuadraticRegressionData

    Examples
    --------
    >>> data = make_quadratic_regressions(40, seed=0)
    >>> data.X.shape, data.y.shape, bool((data.X[:, 1] == data.x**2).all())
    ((40, 2), (40,), True)
    """
    n = check_positive_int(n_samples, "n_samples")
    if not (noise_scale >= 0 and np.isfinite(noise_scale)):
        raise ValueError(f"noise_scale must be finite and non-negative; got {noise_scale}")
    if not tail_df > 0:
        raise ValueError(f"tail_df must be positive; got {tail_df}")
    coef = np.array([[1.0, -2.0], [-2.0, 1.5]]) if coef is None else np.asarray(coef, dtype=float)
    intercept = np.array([-1.0, -2.5]) if intercept is None else np.asarray(intercept, dtype=float)
    if coef.shape != (2, 2) or intercept.shape != (2,):
        raise ValueError(f"coef must have shape (2, 2) and intercept (2,); got {coef.shape}, {intercept.shape}")
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 0.8, size=n)
    design = np.stack([x, x**2], axis=1)
    labels = np.arange(n) % 2
    noise = noise_scale * np.abs(rng.standard_t(tail_df, size=n))
    y = intercept[labels] + (design * coef[labels]).sum(axis=1) + noise
    return QuadraticRegressionData(x=x, X=design, y=y, labels=labels, coef=coef, intercept=intercept)
