"""Data drawn from a planted Gaussian mixture."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppmix._validation import check_positive_int

__all__ = ["GaussianMixtureData", "make_gaussian_mixture"]


@dataclass
class GaussianMixtureData:
    """Samples ``X`` with their component ``labels`` and the planted parameters."""

    X: np.ndarray
    labels: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    scales: np.ndarray


def make_gaussian_mixture(
    n_samples: int = 1000,
    n_components: int = 3,
    n_features: int = 2,
    *,
    separation: float = 6.0,
    seed: int | None = 0,
) -> GaussianMixtureData:
    """Draw ``n_samples`` points from a random diagonal Gaussian mixture.

    Means are drawn uniformly in a cube of side ``separation * n_components ** (1/D)``,
    scales uniformly in ``[0.5, 1.5]`` and weights from ``Dirichlet(5)``.

    Parameters
    ----------
    n_samples : int
        The number of points.
    n_components : int
        The number of mixture components.
    n_features : int
        The dimension ``D`` of every point.
    separation : float
        Scales the cube the means are drawn in; larger separates the components more.
    seed : int or None
        The seed of NumPy's generator; ``None`` draws a fresh one.

    Returns
    -------
    GaussianMixtureData
        ``X`` (N, D), ``labels`` (N,) and the planted ``weights``, ``means`` and ``scales``.

    Examples
    --------
    >>> data = make_gaussian_mixture(100, 3, 2, seed=0)
    >>> data.X.shape, data.labels.shape, data.means.shape
    ((100, 2), (100,), (3, 2))
    """
    n = check_positive_int(n_samples, "n_samples")
    k = check_positive_int(n_components, "n_components")
    d = check_positive_int(n_features, "n_features")
    rng = np.random.default_rng(seed)
    side = separation * k ** (1.0 / d)
    means = rng.uniform(-side / 2, side / 2, size=(k, d))
    scales = rng.uniform(0.5, 1.5, size=(k, d))
    weights = rng.dirichlet(np.full(k, 5.0))
    labels = rng.choice(k, size=n, p=weights)
    x = means[labels] + scales[labels] * rng.normal(size=(n, d))
    return GaussianMixtureData(X=x, labels=labels, weights=weights, means=means, scales=scales)
