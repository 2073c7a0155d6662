"""Planted mixtures of every registered component family, with overlapping components: where a start matters."""

from __future__ import annotations

import numpy as np

from ppmix._validation import check_positive_int

__all__ = ["FAMILY_FEATURES", "LEVELS", "TRIALS", "make_family_mixture"]

#: levels of a categorical feature; trials of a multinomial row
LEVELS, TRIALS = 4, 20
#: features per family (three for the others; Bernoulli's twelve as in issue 49)
FAMILY_FEATURES = {
    "bernoulli": 12,
    "categorical": 4,
    "multinomial": 6,
    "gaussian": 2,
    "independent": 2,
    "gmm": 2,
    "student_t": 2,
}


def make_family_mixture(
    family: str, n_samples: int = 2000, n_components: int = 3, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(X, labels)``: ``n_samples`` rows from ``n_components`` planted components of the registered ``family``,
    with random parameters of moderate overlap and weights from ``Dirichlet(5)``.

    Features per family: :data:`FAMILY_FEATURES` (else 3). Parameters: Poisson rates ``exp N(1.5, 0.5)``;
    Bernoulli probabilities ``U(0.05, 0.95)``; categorical levels ``Dirichlet(1)`` over :data:`LEVELS`;
    multinomial shares ``Dirichlet(2)`` of :data:`TRIALS` trials; exponential means ``exp N(0, 0.8)``; gamma
    shapes ``U(1, 6)`` and means ``exp N(0, 0.6)``; log-normal ``N(N(0, 0.6), U(0.3, 1))`` on the log scale;
    Gaussian means ``N(0, 2)`` and scales ``U(0.5, 1.5)`` (``gmm``: each component two such Gaussians 1.5 apart;
    ``student_t``: a multivariate t with 5 degrees of freedom; ``independent``: its default, Gaussian columns).

    Examples
    --------
    >>> X, labels = make_family_mixture("categorical", 5, seed=0)
    >>> X.shape, labels.shape
    ((5, 4), (5,))
    """
    n = check_positive_int(n_samples, "n_samples")
    k = check_positive_int(n_components, "n_components")
    rng = np.random.default_rng(seed)
    d = FAMILY_FEATURES.get(family, 3)
    z = rng.choice(k, size=n, p=rng.dirichlet(np.full(k, 5.0)))
    return _rows(family, rng, z, k, d), z


def _rows(family: str, rng: np.random.Generator, z: np.ndarray, k: int, d: int) -> np.ndarray:
    n = len(z)
    if family == "poisson":
        return rng.poisson(np.exp(rng.normal(1.5, 0.5, (k, d)))[z]).astype(np.float64)
    if family == "bernoulli":
        return (rng.random((n, d)) < rng.uniform(0.05, 0.95, (k, d))[z]).astype(np.float64)
    if family == "categorical":
        cumulative = rng.dirichlet(np.ones(LEVELS), (k, d)).cumsum(-1)[z]
        return (rng.random((n, d, 1)) > cumulative).sum(-1).clip(max=LEVELS - 1).astype(np.float64)
    if family == "multinomial":
        return rng.multinomial(TRIALS, rng.dirichlet(np.full(d, 2.0), k)[z]).astype(np.float64)
    if family == "exponential":
        return rng.exponential(np.exp(rng.normal(0.0, 0.8, (k, d)))[z])
    if family == "gamma":
        shape, mean = rng.uniform(1.0, 6.0, (k, d)), np.exp(rng.normal(0.0, 0.6, (k, d)))
        return rng.gamma(shape[z], (mean / shape)[z])
    if family == "lognormal":
        return np.exp(rng.normal(rng.normal(0.0, 0.6, (k, d))[z], rng.uniform(0.3, 1.0, (k, d))[z]))
    if family not in ("gaussian", "gmm", "student_t", "independent"):  # independent: its default, Gaussian columns
        raise ValueError(f"family must be a registered family name; got {family!r}")
    noise = rng.normal(size=(n, d))
    if family == "student_t":
        noise /= np.sqrt(rng.gamma(2.5, 1 / 2.5, (n, 1)))  # df = 5
    locs = rng.normal(0.0, 2.0, (k, d))[z]
    if family == "gmm":  # each component's two Gaussians 1.5 apart in a random direction, equally likely
        offset = rng.normal(size=(k, d))
        locs = locs + 0.75 * (offset / np.linalg.norm(offset, axis=1, keepdims=True))[z] * rng.choice([-1, 1], (n, 1))
    return locs + rng.uniform(0.5, 1.5, (k, d))[z] * noise
