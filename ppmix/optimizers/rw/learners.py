"""Weighted base learners for Regularized Weighting.

A *weighted base learner* (Vainsencher, Mannor & Xu, 2013, Definition 1) holds ``k`` models, fits each
model ``j`` to the data weighted by its own distribution ``weights[:, j]`` over the
points, and reports the non-negative loss of every point under every model. RW
(:class:`ppmix.optimizers.rw.estimator.RegularizedWeighting`) talks to learners only through
the small :class:`WeightedLearner` protocol, which follows the convention of
:class:`~ppmix.components.base.ComponentFamily`: ``data`` is ``X``, or the pair ``(X, y)``
for supervised learners, weights and losses have shape ``(n_samples, k)``. Any component
family can be passed to RW as it is (:class:`FamilyLearner` adapts it).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Protocol, Union, runtime_checkable

import torch

from ppmix.components.base import ComponentFamily
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.gaussian_expert import GaussianExpert

__all__ = [
    "FamilyLearner",
    "GaussianLearner",
    "RegressionLearner",
    "SquaredDistanceLearner",
    "SubspaceLearner",
    "WeightedLearner",
    "make_learner",
]

Data = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]

PROTOCOL = (
    "init(data, k, generator) -> self, fit(data, weights) -> self with weights of shape (n_samples, k), "
    "loss(data) -> (n_samples, k); data is X, or the pair (X, y) for supervised learners"
)


@runtime_checkable
class WeightedLearner(Protocol):
    """What RW needs from a family of ``k`` models (the :class:`~ppmix.components.base.ComponentFamily` convention).

    - ``init(data, k, generator) -> self``: set up ``k`` initial models (randomised
      through ``generator`` only, so that a fit is deterministic given a seed);
    - ``fit(data, weights) -> self``: refit model ``j`` to the points weighted by
      ``weights[:, j]`` (``weights`` has shape ``(n_samples, k)``, every column on the simplex);
    - ``loss(data) -> Tensor[n_samples, k]``: non-negative loss of every point under every model.

    ``data`` is ``X`` (a float64 tensor) when RW is fitted without targets, and the pair
    ``(X, y)`` when it is given ``y``. Learners written for the earlier
    ``init(X, y, k, generator)``, ``fit(X, y, weights[k, n])``, ``loss(X, y) -> [k, n]``
    protocol are refused with a ``TypeError`` by :func:`make_learner`.

    Examples
    --------
    >>> isinstance(SquaredDistanceLearner(), WeightedLearner)
    True
    """

    def init(self, data: Data, k: int, generator: torch.Generator) -> "WeightedLearner": ...

    def fit(self, data: Data, weights: torch.Tensor) -> "WeightedLearner": ...

    def loss(self, data: Data) -> torch.Tensor: ...


def features(data: Data) -> torch.Tensor:
    """The covariates ``X`` of ``data`` (``X`` itself, or the first of the pair ``(X, y)``).

    Examples
    --------
    >>> features((torch.zeros(2, 1), torch.ones(2))).shape
    torch.Size([2, 1])
    """
    return data[0] if isinstance(data, (tuple, list)) else data


def learner_data(X: torch.Tensor, y: torch.Tensor | None) -> Data:
    """What RW gives a learner: ``X``, or the pair ``(X, y)`` when it has targets.

    Examples
    --------
    >>> learner_data(torch.zeros(2, 1), None).shape
    torch.Size([2, 1])
    """
    return X if y is None else (X, y)


def _random_points(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` distinct indices in ``range(n)`` (``k <= n``)."""
    return torch.randperm(n, generator=generator)[:k]


def _subset_weights(n: int, k: int, size: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``(n, k)`` weights, each column uniform over its own random subset of ``size`` points."""
    size = min(size, n)
    weights = torch.zeros(n, k, dtype=dtype)
    for j in range(k):
        weights[_random_points(n, size, generator), j] = 1.0 / size
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
    where RW is meant to ignore them. Targets in ``data`` are ignored.

    Attributes
    ----------
    centres_ : Tensor, shape (k, d)

    Examples
    --------
    >>> import torch
    >>> X = torch.tensor([[0.0], [1.0], [10.0]], dtype=torch.float64)
    >>> learner = SquaredDistanceLearner().init(X, 2, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[0.5, 0.0], [0.5, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> learner.fit(X, w).centres_.squeeze(1).tolist()
    [0.5, 10.0]
    >>> learner.loss(X).tolist()
    [[0.25, 100.0], [0.25, 81.0], [90.25, 0.0]]
    """

    def init(self, data: Data, k: int, generator: torch.Generator) -> "SquaredDistanceLearner":
        X = features(data)
        self.centres_ = X[_robust_seeds(X, k, generator)].clone()
        return self

    def fit(self, data: Data, weights: torch.Tensor) -> "SquaredDistanceLearner":
        self.centres_ = (weights.T @ features(data)) / weights.sum(dim=0)[:, None]
        return self

    def loss(self, data: Data) -> torch.Tensor:
        # exact differences (no ||x||^2 + ||m||^2 - 2 x.m cancellation next to far outliers)
        return torch.cdist(features(data), self.centres_, compute_mode="donot_use_mm_for_euclid_dist").square()


class RegressionLearner:
    """Linear regression models ``y ~ x^T beta_j + b_j``: weighted least squares, loss = squared residual.

    A thin adapter over the :class:`~ppmix.components.GaussianExpert` family: the fit is
    the family's weighted least squares (its noise scale is estimated too but not used by
    the loss). ``data`` must be the pair ``(X, y)``. ``init`` fits every model to its own
    random subset of ``p + 2`` points.

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
    >>> w = torch.tensor([[1 / 3] * 3 + [0.0] * 3, [0.0] * 3 + [1 / 3] * 3], dtype=torch.float64).T
    >>> learner = RegressionLearner().init((x, y), 2, torch.Generator().manual_seed(0)).fit((x, y), w)
    >>> [round(v, 4) for v in learner.coef_[:, 0].tolist()], [round(v, 4) for v in learner.intercept_.tolist()]
    ([2.0, -1.0], [0.0, 5.0])
    """

    def __init__(self, ridge: float = 1e-8) -> None:
        self.ridge = ridge

    def init(self, data: Data, k: int, generator: torch.Generator) -> "RegressionLearner":
        X, _ = self._pair(data)
        if self.ridge < 0:
            raise ValueError(f"ridge must be non-negative; got {self.ridge}")
        self.experts_ = GaussianExpert(torch.zeros(k, X.shape[1], dtype=X.dtype), ridge=float(self.ridge))
        return self.fit(data, _subset_weights(X.shape[0], k, X.shape[1] + 2, generator, X.dtype))

    def fit(self, data: Data, weights: torch.Tensor) -> "RegressionLearner":
        self.experts_.fit(self._pair(data), weights)
        return self

    def loss(self, data: Data) -> torch.Tensor:
        X, y = self._pair(data)
        return (y[:, None] - self.experts_.mean(X)).square()

    @property
    def coef_(self) -> torch.Tensor:
        """Slopes, shape ``(k, p)``."""
        return self.experts_.coef

    @property
    def intercept_(self) -> torch.Tensor:
        """Intercepts, shape ``(k,)``."""
        return self.experts_.intercept

    @staticmethod
    def _pair(data: Data) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(data, (tuple, list)) or data[1] is None:
            raise ValueError("y is required for the regression learner: data must be the pair (X, y)")
        return data[0], data[1]


class SubspaceLearner:
    """Subspace models (weighted PCA): loss = squared distance to a ``dim``-dimensional subspace.

    Model ``j`` is the subspace spanned by the top ``dim`` eigenvectors of the
    ``w_j``-weighted second-moment matrix, taken about the weighted mean
    (``affine=True``: an affine subspace through the weighted mean) or about the origin
    (``affine=False``: a linear subspace). This is the exact minimiser of the weighted
    sum of squared distances. ``init`` fits every model to its own random subset of
    ``dim + 1`` points. Targets in ``data`` are ignored.

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
    >>> learner = SubspaceLearner(dim=1).init(X, 1, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[1 / 3], [1 / 3], [1 / 3], [0.0]], dtype=torch.float64)
    >>> [round(v, 6) for v in learner.fit(X, w).loss(X)[:, 0].tolist()]
    [0.0, 0.0, 0.0, 4.0]
    """

    def __init__(self, dim: int, affine: bool = True) -> None:
        self.dim = dim
        self.affine = affine

    def init(self, data: Data, k: int, generator: torch.Generator) -> "SubspaceLearner":
        X = features(data)
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or not 0 <= self.dim < X.shape[1]:
            raise ValueError(f"dim must be an integer in [0, n_features={X.shape[1]}); got {self.dim!r}")
        return self.fit(X, _subset_weights(X.shape[0], k, self.dim + 1, generator, X.dtype))

    def fit(self, data: Data, weights: torch.Tensor) -> "SubspaceLearner":
        X = features(data)
        w = (weights / weights.sum(dim=0)).T  # (k, n)
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

    def loss(self, data: Data) -> torch.Tensor:
        centred = features(data)[None, :, :] - self.means_[:, None, :]  # (k, n, d)
        inside = (centred @ self.bases_).square().sum(-1)
        return (centred.square().sum(-1) - inside).clamp_min(0.0).T


class FamilyLearner:
    """Any :class:`~ppmix.components.base.ComponentFamily` as a weighted learner.

    The fit is the family's own weighted fit; the loss of point ``i`` under model ``j`` is
    the shifted negative log-likelihood ``-log p_j(data_i) - c_j``, clamped at zero, where
    ``c_j`` is the smallest ``-log p_j`` over the data of the last fit (a density can
    exceed one, so ``-log p`` can be negative, and RW needs non-negative losses). Because
    every weight column sums to one, a per-model constant changes ``w_j^T l_j`` by exactly
    ``c_j`` and leaves the weight step's solution unchanged. ``init`` fits every model to
    its own random subset of ``n_features + 2`` points.

    Parameters
    ----------
    family : ComponentFamily
        A template with ``n_components`` equal to RW's ``n_models`` (copied, never modified);
        its ``log_prob`` and ``fit`` take the ``data`` RW passes (``X``, or ``(X, y)``).

    Attributes
    ----------
    components_ : ComponentFamily
        The fitted family.
    shift_ : Tensor, shape (k,)
        The per-model constants ``c_j``.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components import DiagGaussian
    >>> X = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=torch.float64)
    >>> family = DiagGaussian(torch.zeros(2, 1, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64))
    >>> learner = FamilyLearner(family).init(X, 2, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]], dtype=torch.float64).T
    >>> [round(m, 6) for m in learner.fit(X, w).components_.loc.squeeze(1).tolist()]
    [0.5, 10.5]
    >>> bool((learner.loss(X) >= 0).all()), learner.loss(X).shape
    (True, torch.Size([4, 2]))
    """

    def __init__(self, family: ComponentFamily) -> None:
        if not isinstance(family, ComponentFamily):
            raise TypeError(f"family must be a ComponentFamily; got {type(family).__name__}")
        self.family = family

    def init(self, data: Data, k: int, generator: torch.Generator) -> "FamilyLearner":
        if self.family.n_components != k:
            raise ValueError(
                f"the {type(self.family).__name__} learner has {self.family.n_components} components, "
                f"but RW fits n_models={k}"
            )
        X = features(data)
        self.components_ = self.family.clone().to(device=X.device, dtype=X.dtype)
        return self.fit(data, _subset_weights(X.shape[0], k, X.shape[1] + 2, generator, X.dtype))

    def fit(self, data: Data, weights: torch.Tensor) -> "FamilyLearner":
        self.components_.fit(data, weights)
        self.shift_ = self._nll(data).min(dim=0).values
        return self

    def loss(self, data: Data) -> torch.Tensor:
        return (self._nll(data) - self._offset()).clamp_min(0.0)

    def _nll(self, data: Data) -> torch.Tensor:
        return -self.components_.log_prob(data)

    def _offset(self) -> torch.Tensor:
        """The per-model constants ``c_j`` subtracted from ``-log p_j``, shape ``(k,)``."""
        return self.shift_


class GaussianLearner(FamilyLearner):
    """Diagonal Gaussian models: a :class:`FamilyLearner` over :class:`~ppmix.components.DiagGaussian`.

    The fit is the family's weighted maximum likelihood (variance floor ``reg_covar``).
    The loss of point ``i`` under model ``j`` is ``-log p_j(x_i)`` minus its value at the
    model's mode (its mean), ``-log p_j(m_j)``: half the squared Mahalanobis distance to
    the mean, non-negative, and a function of the point and the model only. As for every
    :class:`FamilyLearner` the shift is a per-model constant that leaves the weight step's
    solution unchanged; it depends on the model, though, so the reported joint loss of RW
    with this learner is not guaranteed to be monotone across alternations (the unshifted
    objective is). Targets in ``data`` are ignored.

    ``init`` seeds the means as :class:`SquaredDistanceLearner` does (k-means++ with
    capped distances), with scales equal to the per-feature robust spread (median
    absolute deviation) of the data. Passing a plain ``DiagGaussian`` family to RW gives
    this learner (with the family's ``reg_covar``).

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
    >>> learner = GaussianLearner().init(X, 2, torch.Generator().manual_seed(0))
    >>> w = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]], dtype=torch.float64).T
    >>> [round(m, 6) for m in learner.fit(X, w).components_.loc.squeeze(1).tolist()]
    [0.5, 10.5]
    >>> bool((learner.loss(X) >= 0).all())
    True
    """

    def __init__(self, reg_covar: float = 1e-6) -> None:
        self.reg_covar = reg_covar

    def init(self, data: Data, k: int, generator: torch.Generator) -> "GaussianLearner":
        X = features(data)
        loc = X[_robust_seeds(X, k, generator)].clone()
        scale = _robust_scale(X).expand(k, -1).clone()
        self.components_ = DiagGaussian(loc, scale, reg_covar=float(self.reg_covar))
        return self

    def fit(self, data: Data, weights: torch.Tensor) -> "GaussianLearner":
        self.components_.fit(features(data), weights)
        return self

    def _nll(self, data: Data) -> torch.Tensor:
        return -self.components_.log_prob(features(data))

    def _offset(self) -> torch.Tensor:
        return -self.components_.log_prob(self.components_.loc).diagonal()


_LEARNERS = {
    "kmeans": SquaredDistanceLearner,
    "regression": RegressionLearner,
    "subspace": lambda: SubspaceLearner(dim=1, affine=True),
    "gaussian": GaussianLearner,
}


def _required_positional(method: Any) -> int | None:
    """How many positional arguments ``method`` requires (``None``: it takes ``*args`` or has no signature)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional and p.default is p.empty)


def _check_protocol(learner: Any) -> None:
    """A ``TypeError`` naming the :class:`WeightedLearner` protocol unless ``learner`` follows it."""
    name = type(learner).__name__
    if not isinstance(learner, WeightedLearner):
        raise TypeError(f"learner must be a string, a ComponentFamily or a WeightedLearner ({PROTOCOL}); got {name}")
    for method, arity in (("init", 3), ("fit", 2), ("loss", 1)):
        got = _required_positional(getattr(learner, method))
        if got is not None and got != arity:
            raise TypeError(
                f"{name}.{method} takes {got} positional arguments, but the WeightedLearner protocol is {PROTOCOL}. "
                "Learners written for the earlier init(X, y, k, generator), fit(X, y, weights[k, n]) and "
                "loss(X, y) -> [k, n] must be updated (weights and losses are now (n_samples, k))"
            )


def make_learner(learner: str | ComponentFamily | WeightedLearner) -> WeightedLearner:
    """A fresh learner for RW's ``learner`` argument: a named one, a family adapter, or a copy.

    A :class:`~ppmix.components.DiagGaussian` family gives :class:`GaussianLearner` (with
    its ``reg_covar``), any other :class:`~ppmix.components.base.ComponentFamily` a
    :class:`FamilyLearner`; an object is checked against the :class:`WeightedLearner`
    protocol (a ``TypeError`` names it) and copied.

    Examples
    --------
    >>> type(make_learner("kmeans")).__name__
    'SquaredDistanceLearner'
    >>> make_learner(object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: learner must be a string, a ComponentFamily or a WeightedLearner (init(data, k, generator) ...
    """
    if isinstance(learner, str):
        if learner not in _LEARNERS:
            raise ValueError(f"learner must be one of {sorted(_LEARNERS)} or a WeightedLearner; got {learner!r}")
        return _LEARNERS[learner]()
    if isinstance(learner, DiagGaussian):
        return GaussianLearner(reg_covar=learner.reg_covar)
    if isinstance(learner, ComponentFamily):
        return FamilyLearner(learner.clone())
    _check_protocol(learner)
    return copy.deepcopy(learner)
