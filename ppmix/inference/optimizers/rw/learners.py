"""Weighted base learners for Regularized Weighting.

A *weighted base learner* (Vainsencher, Mannor & Xu, 2013, Definition 1) holds ``k`` models, fits each
model ``j`` to the data weighted by its own distribution ``weights[j]`` over the
points, and reports the non-negative loss of every point under every model. RW
(:class:`ppmix.inference.optimizers.rw.estimator.RegularizedWeighting`) talks to learners only through
the small :class:`WeightedLearner` protocol, so any model class with a weighted fit
and a per-point loss can be plugged in.
"""

from __future__ import annotations

import copy
from typing import Protocol, runtime_checkable

import torch

from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.gaussian_expert import GaussianExpert

__all__ = [
    "GaussianLearner",
    "RegressionLearner",
    "SquaredDistanceLearner",
    "SubspaceLearner",
    "WeightedLearner",
    "make_learner",
]


@runtime_checkable
class WeightedLearner(Protocol):
    """What RW needs from a family of ``k`` models.

    - ``init(X, y, k, generator) -> self``: set up ``k`` initial models (randomised
      through ``generator`` only, so that a fit is deterministic given a seed);
    - ``fit(X, y, weights) -> self``: refit model ``j`` to the points weighted by
      ``weights[j]`` (``weights`` has shape ``(k, n)``, every row on the simplex);
    - ``loss(X, y) -> Tensor[k, n]``: non-negative loss of every point under every model.

    ``y`` is ``None`` for unsupervised learners. ``X`` arrives as a float64 tensor.

    Examples
    --------
    >>> isinstance(SquaredDistanceLearner(), WeightedLearner)
    True
    """

    def init(
        self, X: torch.Tensor, y: torch.Tensor | None, k: int, generator: torch.Generator
    ) -> "WeightedLearner": ...

    def fit(self, X: torch.Tensor, y: torch.Tensor | None, weights: torch.Tensor) -> "WeightedLearner": ...

    def loss(self, X: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor: ...


def _random_points(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` distinct indices in ``range(n)`` (``k <= n``)."""
    return torch.randperm(n, generator=generator)[:k]


def _subset_weights(n: int, k: int, size: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``(k, n)`` weights, each row uniform over its own random subset of ``size`` points."""
    size = min(size, n)
    weights = torch.zeros(k, n, dtype=dtype)
    for j in range(k):
        weights[j, _random_points(n, size, generator)] = 1.0 / size
    return weights


def _robust_seeds(X: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` seed indices by k-means++ with truncated distances.

    As k-means++ (Arthur & Vassilvitskii, 2007), each new seed is drawn with probability
    proportional to its squared distance ``D^2`` to the nearest seed so far, but ``D^2``
    is capped at 4 times its median: a far outlier is then no likelier to be drawn than
    a point of a distant cluster, instead of being drawn almost surely.
    """
    n = X.shape[0]
    seeds = [int(torch.randint(n, (1,), generator=generator))]
    closest = torch.cdist(X, X[seeds], compute_mode="donot_use_mm_for_euclid_dist").square().squeeze(1)
    for _ in range(1, k):
        cap = 4.0 * float(closest.median())
        score = closest.clamp_max(cap) if cap > 0 else closest
        if float(score.sum()) <= 0:  # every point coincides with a seed: pick an unused one uniformly
            score = torch.ones(n, dtype=X.dtype)
            score[seeds] = 0.0
        new = int(torch.multinomial(score / score.sum(), 1, generator=generator))
        seeds.append(new)
        distance = torch.cdist(X, X[new : new + 1], compute_mode="donot_use_mm_for_euclid_dist").square().squeeze(1)
        closest = torch.minimum(closest, distance)
    return torch.tensor(seeds)


def _robust_scale(X: torch.Tensor) -> torch.Tensor:
    """Per-feature median absolute deviation (times 1.4826), floored; insensitive to far outliers."""
    mad = (X - X.median(dim=0).values).abs().median(dim=0).values * 1.4826
    return mad.clamp_min(1e-6 * (1.0 + float(mad.max())))


class SquaredDistanceLearner:
    """k-means-style models: a centre per model, loss ``||x - m_j||^2``, fit = weighted mean.

    ``init`` seeds the centres by k-means++ with squared distances capped at four times
    their median: plain k-means++ is drawn to far outliers almost surely, exactly
    where RW is meant to ignore them.

    Attributes
    ----------
    centres_ : Tensor, shape (k, d)

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[0.0], [1.0], [10.0]], dtype=torch.float64)
    >>> learner = SquaredDistanceLearner().init(X, None, 2, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    >>> learner.fit(X, None, w).centres_.squeeze(1).tolist()
    [0.5, 10.0]
    >>> learner.loss(X, None).tolist()
    [[0.25, 0.25, 90.25], [100.0, 81.0, 0.0]]
    """

    def init(
        self, X: torch.Tensor, y: torch.Tensor | None, k: int, generator: torch.Generator
    ) -> "SquaredDistanceLearner":
        self.centres_ = X[_robust_seeds(X, k, generator)].clone()
        return self

    def fit(self, X: torch.Tensor, y: torch.Tensor | None, weights: torch.Tensor) -> "SquaredDistanceLearner":
        self.centres_ = (weights @ X) / weights.sum(dim=1, keepdim=True)
        return self

    def loss(self, X: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        # exact differences (no ||x||^2 + ||m||^2 - 2 x.m cancellation next to far outliers)
        return torch.cdist(self.centres_, X, compute_mode="donot_use_mm_for_euclid_dist").square()


class RegressionLearner:
    """Linear regression models ``y ~ x^T beta_j + b_j``: weighted least squares, loss = squared residual.

    The fit is the shared :class:`~ppmix.components.GaussianExpert` family's weighted
    least squares (its noise scale is estimated too but not used by the loss).
    ``init`` fits every model to its own random subset of ``p + 2`` points.

    Parameters
    ----------
    ridge : float, default 1e-8
        Ridge penalty on the slopes (not the intercept), which keeps the weighted
        least squares solvable when a model's weight sits on few points.

    Attributes
    ----------
    experts_ : GaussianExpert
        The ``k`` fitted experts (``coef_`` and ``intercept_`` are views of their parameters).

    Examples
    --------
    >>> import torch
    >>> x = torch.linspace(0, 1, 6, dtype=torch.float64)[:, None]
    >>> y = torch.cat([2 * x[:3, 0], -x[3:, 0] + 5])
    >>> w = torch.tensor([[1 / 3] * 3 + [0.0] * 3, [0.0] * 3 + [1 / 3] * 3], dtype=torch.float64)
    >>> learner = RegressionLearner().init(x, y, 2, torch.Generator().manual_seed(0)).fit(x, y, w)
    >>> [round(v, 4) for v in learner.coef_[:, 0].tolist()], [round(v, 4) for v in learner.intercept_.tolist()]
    ([2.0, -1.0], [0.0, 5.0])
    """

    def __init__(self, ridge: float = 1e-8) -> None:
        self.ridge = ridge

    def init(self, X: torch.Tensor, y: torch.Tensor | None, k: int, generator: torch.Generator) -> "RegressionLearner":
        y = self._target(y)
        if self.ridge < 0:
            raise ValueError(f"ridge must be non-negative; got {self.ridge}")
        self.experts_ = GaussianExpert(torch.zeros(k, X.shape[1], dtype=X.dtype), ridge=float(self.ridge))
        weights = _subset_weights(X.shape[0], k, X.shape[1] + 2, generator, X.dtype)
        return self.fit(X, y, weights)

    def fit(self, X: torch.Tensor, y: torch.Tensor | None, weights: torch.Tensor) -> "RegressionLearner":
        self.experts_.fit((X, self._target(y)), weights.T)
        return self

    def loss(self, X: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return (self._target(y)[None, :] - self.experts_.mean(X).T).square()

    @property
    def coef_(self) -> torch.Tensor:
        """Slopes, shape ``(k, p)``."""
        return self.experts_.coef

    @property
    def intercept_(self) -> torch.Tensor:
        """Intercepts, shape ``(k,)``."""
        return self.experts_.intercept

    @staticmethod
    def _target(y: torch.Tensor | None) -> torch.Tensor:
        if y is None:
            raise ValueError("y is required for the regression learner")
        return y


class SubspaceLearner:
    """Subspace models (weighted PCA): loss = squared distance to a ``dim``-dimensional subspace.

    Model ``j`` is the subspace spanned by the top ``dim`` eigenvectors of the
    ``w_j``-weighted second-moment matrix, taken about the weighted mean
    (``affine=True``: an affine subspace through the weighted mean) or about the origin
    (``affine=False``: a linear subspace). This is the exact minimiser of the weighted
    sum of squared distances. ``init`` fits every model to its own random subset of
    ``dim + 1`` points.

    Parameters
    ----------
    dim : int
        Dimension of every subspace, ``0 <= dim < n_features`` (``dim=0`` with
        ``affine=True`` is k-means).
    affine : bool, default True

    Attributes
    ----------
    means_ : Tensor, shape (k, d)
        Offsets (zeros when ``affine=False``).
    bases_ : Tensor, shape (k, d, dim)
        Orthonormal bases.

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    >>> learner = SubspaceLearner(dim=1).init(X, None, 1, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]], dtype=torch.float64)
    >>> [round(v, 6) for v in learner.fit(X, None, w).loss(X, None)[0].tolist()]
    [0.0, 0.0, 0.0, 4.0]
    """

    def __init__(self, dim: int, affine: bool = True) -> None:
        self.dim = dim
        self.affine = affine

    def init(self, X: torch.Tensor, y: torch.Tensor | None, k: int, generator: torch.Generator) -> "SubspaceLearner":
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or not 0 <= self.dim < X.shape[1]:
            raise ValueError(f"dim must be an integer in [0, n_features={X.shape[1]}); got {self.dim!r}")
        weights = _subset_weights(X.shape[0], k, self.dim + 1, generator, X.dtype)
        return self.fit(X, y, weights)

    def fit(self, X: torch.Tensor, y: torch.Tensor | None, weights: torch.Tensor) -> "SubspaceLearner":
        w = weights / weights.sum(dim=1, keepdim=True)
        if self.affine:
            means = w @ X  # (k, d)
        else:
            means = torch.zeros(w.shape[0], X.shape[1], dtype=X.dtype, device=X.device)
        centred = X[None, :, :] - means[:, None, :]  # (k, n, d)
        scatter = (centred * w[:, :, None]).mT @ centred  # (k, d, d)
        _, vectors = torch.linalg.eigh(scatter)  # ascending eigenvalues
        self.means_ = means
        self.bases_ = vectors[:, :, X.shape[1] - self.dim :].flip(-1).contiguous()
        return self

    def loss(self, X: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        centred = X[None, :, :] - self.means_[:, None, :]  # (k, n, d)
        inside = (centred @ self.bases_).square().sum(-1)
        return (centred.square().sum(-1) - inside).clamp_min(0.0)


class GaussianLearner:
    """Diagonal Gaussian models (the shared :class:`~ppmix.components.DiagGaussian` family).

    The fit is the family's weighted maximum likelihood (variance floor ``reg_covar``).
    The loss of point ``i`` under model ``j`` is the shifted negative log-likelihood

        ``l_ji = -log p_j(x_i) - min_i' (-log p_j(x_i'))``,

    i.e. ``-log p_j`` minus its minimum over the data passed to :meth:`loss`, so that
    losses are non-negative as RW assumes (a density can exceed one, so
    ``-log p`` can be negative). The shift ``c_j`` is a per-model constant; because every
    ``w_j`` sums to one it changes ``w_j^T l_j`` by exactly ``c_j`` and leaves the
    weight step's solution unchanged. It does depend on the model, though, so the
    reported joint loss of RW with this learner is not guaranteed to be monotone
    across alternations (the unshifted objective is). Note that :meth:`loss`, and so
    ``predict``, shift by the minimum over the data they are given.

    ``init`` seeds the means as :class:`SquaredDistanceLearner` does (k-means++ with
    capped distances), with scales equal to the per-feature robust spread (median
    absolute deviation) of the data.

    Parameters
    ----------
    reg_covar : float, default 1e-6

    Attributes
    ----------
    components_ : DiagGaussian

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=torch.float64)
    >>> learner = GaussianLearner().init(X, None, 2, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]], dtype=torch.float64)
    >>> [round(m, 6) for m in learner.fit(X, None, w).components_.loc.squeeze(1).tolist()]
    [0.5, 10.5]
    >>> bool((learner.loss(X, None) >= 0).all())
    True
    """

    def __init__(self, reg_covar: float = 1e-6) -> None:
        self.reg_covar = reg_covar

    def init(self, X: torch.Tensor, y: torch.Tensor | None, k: int, generator: torch.Generator) -> "GaussianLearner":
        loc = X[_robust_seeds(X, k, generator)].clone()
        scale = _robust_scale(X).expand(k, -1).clone()
        self.components_ = DiagGaussian(loc, scale, reg_covar=float(self.reg_covar))
        return self

    def fit(self, X: torch.Tensor, y: torch.Tensor | None, weights: torch.Tensor) -> "GaussianLearner":
        self.components_.fit(X, weights.T)
        return self

    def loss(self, X: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        # minus log-density relative to each model's mode (its mean): non-negative, and a point's loss depends
        # on that point and the model only (a constant per model leaves RW's weights and fits unchanged)
        nll = -self.components_.log_prob(X).T  # (k, n)
        at_mode = -self.components_.log_prob(self.components_.loc).diagonal()  # (k,)
        return (nll - at_mode[:, None]).clamp_min(0.0)


_LEARNERS = {
    "kmeans": SquaredDistanceLearner,
    "regression": RegressionLearner,
    "subspace": lambda: SubspaceLearner(dim=1, affine=True),
    "gaussian": GaussianLearner,
}


def make_learner(learner: str | WeightedLearner) -> WeightedLearner:
    """A fresh learner for RW's ``learner`` argument: a named one, or a copy of a :class:`WeightedLearner`.

    Examples
    --------
    >>> type(make_learner("kmeans")).__name__
    'SquaredDistanceLearner'
    """
    if isinstance(learner, str):
        if learner not in _LEARNERS:
            raise ValueError(f"learner must be one of {sorted(_LEARNERS)} or a WeightedLearner; got {learner!r}")
        return _LEARNERS[learner]()
    if not isinstance(learner, WeightedLearner):
        raise TypeError(
            f"learner must be a string or an object with init, fit and loss methods; got {type(learner).__name__}"
        )
    return copy.deepcopy(learner)
