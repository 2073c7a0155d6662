"""Shared parts of the baselines: label validation (:func:`check_binary_labels`), the exact marginal
``log p(x_R)`` of a Gaussian mixture (:func:`gaussian_mixture_marginal_log_prob`), and the two base classes
(``fit``/``predict`` plumbing, ``log_likelihood_relevant`` for Gaussian-mixture densities)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from ppmix._estimator import Estimator
from ppmix._validation import NotFittedError, check_matrix
from ppmix.components import DiagGaussian, FullGaussian
from ppmix.models._labels import binary_classes, encode_binary_labels
from ppmix.models._params import check_seed
from ppmix.models._target import BINARY

__all__ = ["check_binary_labels", "gaussian_mixture_marginal_log_prob"]


def _numpy(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def check_binary_labels(y: Any, n_samples: int, name: str = "y") -> np.ndarray:
    """Validate binary labels with NaN for missing ones; return them as float64 ``(N,)``.

    Raises
    ------
    ValueError
        If ``y`` is missing, not 1-D, of the wrong length, has labels outside {0, 1},
        has no observed label, or its observed labels are all of one class.

    Examples
    --------
    >>> check_binary_labels([0, 1, float("nan")], 3)
    array([ 0.,  1., nan])
    """
    if y is None:
        raise ValueError(
            f"{name} is required: binary labels in {{0, 1}}, NaN where missing (this estimator requires y to be "
            "passed, but the target y is None)"
        )
    try:
        labels = _numpy(y.to_numpy(dtype=np.float64) if hasattr(y, "to_numpy") else y).astype(np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must hold numbers (0, 1 or NaN); {err}") from None
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {labels.shape}")
    if labels.shape[0] != n_samples:
        raise ValueError(f"{name} has {labels.shape[0]} labels but X has {n_samples} rows")
    observed = labels[~np.isnan(labels)]
    if observed.size == 0:
        raise ValueError(f"{name} has no observed label (all are missing)")
    bad = np.unique(observed[~np.isin(observed, (0.0, 1.0))])
    if bad.size:
        raise ValueError(f"{name} has labels outside {{0, 1}}: {bad[:5].tolist()} (use NaN for a missing label)")
    if np.unique(observed).size < 2:
        raise ValueError(f"{name} must contain both classes among its observed labels; it holds one class only")
    return labels


def _check_relevant_mask(relevant_mask: Any, n_features: int) -> torch.Tensor:
    mask = _numpy(relevant_mask)
    if mask.dtype != bool or mask.shape != (n_features,):
        raise ValueError(
            f"relevant_mask must be a boolean array of shape ({n_features},); got {mask.dtype} {mask.shape}"
        )
    if not mask.any():
        raise ValueError("relevant_mask selects no feature")
    return torch.as_tensor(mask)


def gaussian_mixture_marginal_log_prob(
    weights: Any, means: Any, covariances: Any, X: Any, relevant_mask: Any
) -> np.ndarray:
    """``log p(x_R)`` of a Gaussian mixture: the mixture of the components' marginals on ``R``.

    Parameters
    ----------
    weights : (K,)
    means : (K, D)
    covariances : (K, D) variances (diagonal) or (K, D, D) covariance matrices
    X : (N, D) full feature matrix; only the columns in ``relevant_mask`` are used.
    relevant_mask : bool array (D,)

    Returns
    -------
    ndarray (N,)

    Examples
    --------
    >>> import numpy as np
    >>> lp = gaussian_mixture_marginal_log_prob([1.0], [[0.0, 5.0]], [[1.0, 4.0]], [[0.0, 9.0]], [True, False])
    >>> bool(np.isclose(lp[0], -0.5 * np.log(2 * np.pi)))
    True
    """
    w = torch.as_tensor(_numpy(weights), dtype=torch.float64)
    mu = torch.as_tensor(_numpy(means), dtype=torch.float64)
    cov = torch.as_tensor(_numpy(covariances), dtype=torch.float64)
    x, _ = check_matrix(X, "X", n_features=mu.shape[1])
    mask = _check_relevant_mask(relevant_mask, mu.shape[1])
    if cov.shape == mu.shape:
        family = DiagGaussian(mu[:, mask], cov[:, mask].sqrt())
    elif cov.shape == (*mu.shape, mu.shape[1]):
        family = FullGaussian(mu[:, mask], torch.linalg.cholesky(cov[:, mask][:, :, mask]))
    else:
        raise ValueError(f"covariances must be (K, D) or (K, D, D) for means {tuple(mu.shape)}; got {tuple(cov.shape)}")
    return torch.logsumexp(family.log_prob(x[:, mask]) + w.log(), dim=1).numpy()


class _LabelBaseline(Estimator, ABC):
    """``fit(X, y)`` input handling, the fitted check and ``predict`` from ``predict_proba``; a scikit-learn
    binary classifier (``get_params``/``set_params``, ``clone``, ``score`` the accuracy, its tags:
    :data:`~ppmix.models._target.BINARY`) for labels 0/1."""

    def __sklearn_tags__(self) -> Any:
        return BINARY.tags(super().__sklearn_tags__())

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """The accuracy of :meth:`predict` on ``(X, y)``, as scikit-learn's classifiers score."""
        return BINARY.score(self, X, y, sample_weight)

    def _prepare_fit(self, X: Any, y: Any) -> tuple[torch.Tensor, np.ndarray]:
        check_seed(getattr(self, "seed", None))
        x, names = check_matrix(X, "X")
        if y is None:
            check_binary_labels(y, x.shape[0])
        self._fit_classes = binary_classes(y)
        labels = check_binary_labels(encode_binary_labels(y, self._fit_classes), x.shape[0])
        self.n_features_in_ = int(x.shape[1])
        self.feature_names_in_ = names
        return x, labels

    def _check_fitted(self) -> None:
        if not hasattr(self, "classes_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _prepare(self, X: Any) -> torch.Tensor:
        self._check_fitted()
        return check_matrix(X, "X", n_features=self.n_features_in_)[0]

    @abstractmethod
    def predict_proba(self, X: Any) -> Any:
        """``[P(y=0 | x), P(y=1 | x)]`` per row (one ``(T, 2)`` array per sequence for sequence input)."""

    def predict(self, X: Any) -> Any:
        """The more probable label of each row (one array per sequence for sequence input)."""
        proba = self.predict_proba(X)
        if isinstance(proba, list):
            return [self.classes_[p.argmax(1)] for p in proba]
        return self.classes_[proba.argmax(1)]


class _GaussianMixtureDensity(ABC):
    """``log_likelihood_relevant`` for baselines whose density is one Gaussian mixture."""

    @abstractmethod
    def _mixture_parameters(self) -> tuple[Any, Any, Any]:
        """``(weights, means, covariances)`` of the fitted density of ``X``."""

    def log_likelihood_relevant(self, X: Any, relevant_mask: Any) -> np.ndarray:
        """``log p(x_R)`` per row: the fitted mixture marginalised onto the features in ``relevant_mask``.

        ``X`` is the full ``(N, D)`` matrix; ``relevant_mask`` a boolean array ``(D,)``.
        """
        self._check_fitted()
        return gaussian_mixture_marginal_log_prob(*self._mixture_parameters(), X, relevant_mask)
