"""Evaluation metrics used across ppmix.

Every public function accepts numpy arrays, Python lists, pandas Series or
torch tensors, validates its input (raising :class:`ValueError` with a message
that names the offending argument) and returns a plain Python ``float``.

Density and predictive metrics
    :func:`mean_log_px`, :func:`mean_log_py_given_x`, :func:`auroc`.
Clustering metrics
    :func:`adjusted_rand_index`, :func:`normalized_mutual_info`,
    :func:`permutation_accuracy`.
Regression metrics
    :func:`relative_prediction_error`.

Examples
--------
>>> from ppmix.metrics import permutation_accuracy
>>> permutation_accuracy([0, 0, 1, 1], [1, 1, 0, 0])
1.0
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import (
    adjusted_rand_score,
    normalized_mutual_info_score,
    roc_auc_score,
)
from sklearn.metrics.cluster import contingency_matrix

__all__ = [
    "adjusted_rand_index",
    "auroc",
    "mean_log_px",
    "mean_log_py_given_x",
    "normalized_mutual_info",
    "permutation_accuracy",
    "relative_prediction_error",
]

_PROB_CLIP = 1e-12
_ROW_SUM_TOL = 1e-6


# --------------------------------------------------------------------------
# private helpers
# --------------------------------------------------------------------------


def _as_numpy(x: Any, name: str) -> np.ndarray:
    """Convert ``x`` (array, list, pandas object or torch tensor) to numpy.

    Torch tensors go through ``.detach().cpu().numpy()``; pandas objects
    through ``.to_numpy()``; anything else through :func:`numpy.asarray`.
    ``None`` is rejected with a message naming ``name``.
    """
    if x is None:
        raise ValueError(f"{name} must not be None")
    torch = sys.modules.get("torch")  # a tensor implies torch is imported
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if hasattr(x, "to_numpy") and callable(x.to_numpy):  # pandas Series/DataFrame
        return np.asarray(x.to_numpy())
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as exc:  # ragged nested lists, etc.
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc


def _check_1d(x: Any, name: str, *, numeric: bool = True) -> np.ndarray:
    """Return ``x`` as a non-empty 1-D array; numeric ones must be finite."""
    arr = _as_numpy(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if numeric:
        arr = _require_numeric(arr, name)
        _check_finite(arr, name)
    elif arr.dtype.kind in "fc":
        _check_finite(arr, name)
    elif arr.dtype.kind == "O":
        if any(v is None or (isinstance(v, float) and np.isnan(v)) for v in arr):
            raise ValueError(f"{name} contains NaN or None")
    return arr


def _require_numeric(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind == "b":
        return arr.astype(np.float64)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return arr


def _check_finite(arr: np.ndarray, name: str) -> None:
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains inf")


def _check_same_length(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{name_a} and {name_b} have different lengths ({a.shape[0]} != {b.shape[0]})")


def _integer_labels(y: np.ndarray, n_classes: int, name: str) -> np.ndarray:
    """Check that numeric 1-D ``y`` holds integers in ``{0, ..., n_classes-1}``."""
    if y.dtype.kind == "f" and not np.all(y == np.round(y)):
        raise ValueError(f"{name} must contain integer class labels")
    yi = y.astype(np.int64)
    if yi.min() < 0 or yi.max() >= n_classes:
        raise ValueError(
            f"{name} must contain labels in {{0, ..., {n_classes - 1}}}, got values in [{yi.min()}, {yi.max()}]"
        )
    return yi


def _check_prob_rows(p: np.ndarray, name: str) -> None:
    if (p < 0).any() or (p > 1).any():
        raise ValueError(f"{name} must contain probabilities in [0, 1]")
    if p.ndim == 2:
        sums = p.sum(axis=1)
        if np.any(np.abs(sums - 1.0) > _ROW_SUM_TOL):
            worst = float(np.max(np.abs(sums - 1.0)))
            raise ValueError(
                f"rows of {name} must sum to 1 (tolerance {_ROW_SUM_TOL:g}); largest deviation is {worst:.3g}"
            )


def _check_labelings(labels_true: Any, labels_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    t = _check_1d(labels_true, "labels_true", numeric=False)
    p = _check_1d(labels_pred, "labels_pred", numeric=False)
    _check_same_length(t, p, "labels_true", "labels_pred")
    return t, p


# --------------------------------------------------------------------------
# density / predictive metrics
# --------------------------------------------------------------------------


def mean_log_px(log_px: Any) -> float:
    """Mean per-point log-density.

    Parameters
    ----------
    log_px : array-like of shape (N,)
        Per-point log-densities :math:`\\log p(x_n)`, e.g. the output of a
        fitted model's ``score_samples``. Must be finite.

    Returns
    -------
    float
        :math:`\\frac{1}{N}\\sum_n \\log p(x_n)`.

    Raises
    ------
    ValueError
        If ``log_px`` is not 1-D, is empty, or contains NaN/inf.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.metrics import mean_log_px
    >>> round(mean_log_px(np.log([0.5, 0.25])), 6)  # -1.5 * log 2
    -1.039721
    """
    arr = _check_1d(log_px, "log_px")
    return float(np.mean(arr, dtype=np.float64))


def mean_log_py_given_x(y_true: Any, y_prob: Any) -> float:
    """Mean log predictive probability of the true labels.

    Parameters
    ----------
    y_true : array-like of shape (N,)
        Integer class labels in ``{0, ..., C-1}`` (integral floats and bools
        are accepted).
    y_prob : array-like of shape (N,) or (N, C)
        Predicted probabilities. A 1-D array is read as the binary
        :math:`P(y=1 \\mid x)`; a 2-D array holds one row of class
        probabilities per point (``C >= 2``), each row summing to 1 within
        ``1e-6``.

    Returns
    -------
    float
        :math:`\\frac{1}{N}\\sum_n \\log p(y_n \\mid x_n)`, with probabilities
        clipped to ``[1e-12, 1]`` before the log so the result is finite.

    Raises
    ------
    ValueError
        On wrong shapes, mismatched lengths, empty input, NaN/inf,
        probabilities outside ``[0, 1]``, rows not summing to 1, or labels
        that are not integers in ``{0, ..., C-1}``.

    Examples
    --------
    >>> from ppmix.metrics import mean_log_py_given_x
    >>> round(mean_log_py_given_x([1, 0], [0.8, 0.4]), 6)  # (log .8 + log .6) / 2
    -0.366985
    >>> round(mean_log_py_given_x([2, 0], [[0.1, 0.1, 0.8], [0.6, 0.2, 0.2]]), 6)
    -0.366985
    """
    y = _check_1d(y_true, "y_true")
    p = _require_numeric(_as_numpy(y_prob, "y_prob"), "y_prob")
    if p.ndim not in (1, 2):
        raise ValueError(f"y_prob must be 1-D or 2-D, got shape {p.shape}")
    if p.size == 0:
        raise ValueError("y_prob is empty")
    _check_finite(p, "y_prob")
    _check_same_length(y, p, "y_true", "y_prob")
    p = p.astype(np.float64, copy=False)
    if p.ndim == 1:
        _check_prob_rows(p, "y_prob")
        yi = _integer_labels(y, 2, "y_true")
        p_true = np.where(yi == 1, p, 1.0 - p)
    else:
        n_classes = p.shape[1]
        if n_classes < 2:
            raise ValueError(f"y_prob must have at least 2 columns, got shape {p.shape}")
        _check_prob_rows(p, "y_prob")
        yi = _integer_labels(y, n_classes, "y_true")
        p_true = p[np.arange(p.shape[0]), yi]
    return float(np.mean(np.log(np.clip(p_true, _PROB_CLIP, 1.0))))


def auroc(y_true: Any, y_score: Any) -> float:
    """Area under the ROC curve (via :func:`sklearn.metrics.roc_auc_score`).

    Parameters
    ----------
    y_true : array-like of shape (N,)
        True labels. Binary case: exactly two distinct values; the larger one
        is the positive class. Multiclass case: integers in
        ``{0, ..., C-1}``, every class present.
    y_score : array-like of shape (N,), (N, 2) or (N, C)
        Binary: scores for the positive class, or an (N, 2) probability
        matrix whose column 1 is used. Multiclass (``C > 2``): class
        probabilities (rows summing to 1 within ``1e-6``); the one-vs-rest
        macro average is returned.

    Returns
    -------
    float
        The AUROC, in ``[0, 1]``. Ties in the scores count one half.

    Raises
    ------
    ValueError
        On wrong shapes, mismatched lengths, empty input, NaN/inf, a
        ``y_true`` with only one class (the AUROC is undefined), or, for
        multiclass, labels outside ``{0, ..., C-1}``, missing classes or
        rows not summing to 1.

    Examples
    --------
    >>> from ppmix.metrics import auroc
    >>> auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    >>> auroc([0, 1, 2], [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    1.0
    """
    y = _check_1d(y_true, "y_true")
    s = _require_numeric(_as_numpy(y_score, "y_score"), "y_score")
    if s.ndim not in (1, 2):
        raise ValueError(f"y_score must be 1-D or 2-D, got shape {s.shape}")
    if s.size == 0:
        raise ValueError("y_score is empty")
    _check_finite(s, "y_score")
    _check_same_length(y, s, "y_true", "y_score")
    if s.ndim == 2 and s.shape[1] < 2:
        raise ValueError(f"y_score must have at least 2 columns, got shape {s.shape}")

    if s.ndim == 1 or s.shape[1] == 2:
        classes = np.unique(y)
        if classes.size < 2:
            raise ValueError("y_true contains only one class; AUROC is undefined")
        if classes.size > 2:
            raise ValueError(f"y_true has {classes.size} classes but y_score is binary (shape {s.shape})")
        pos_score = s if s.ndim == 1 else s[:, 1]
        return float(roc_auc_score(y, pos_score))

    n_classes = s.shape[1]
    yi = _integer_labels(y, n_classes, "y_true")
    present = np.unique(yi)
    if present.size < 2:
        raise ValueError("y_true contains only one class; AUROC is undefined")
    if present.size < n_classes:
        missing = sorted(set(range(n_classes)) - set(present.tolist()))
        raise ValueError(f"y_true is missing classes {missing}; one-vs-rest AUROC is undefined for them")
    _check_prob_rows(s, "y_score")
    return float(roc_auc_score(yi, s, multi_class="ovr", average="macro", labels=np.arange(n_classes)))


# --------------------------------------------------------------------------
# clustering metrics
# --------------------------------------------------------------------------


def adjusted_rand_index(labels_true: Any, labels_pred: Any) -> float:
    """Adjusted Rand index between two labelings.

    Thin wrapper around :func:`sklearn.metrics.adjusted_rand_score`.
    Invariant to relabelling of either partition.

    Parameters
    ----------
    labels_true : array-like of shape (N,)
        Reference cluster/class labels (any hashable values).
    labels_pred : array-like of shape (N,)
        Predicted cluster labels.

    Returns
    -------
    float
        1.0 for identical partitions, about 0 for independent ones (can be
        negative).

    Raises
    ------
    ValueError
        On non-1-D, empty, NaN/inf-containing or different-length inputs.

    Examples
    --------
    >>> from ppmix.metrics import adjusted_rand_index
    >>> adjusted_rand_index([0, 0, 1, 1], [5, 5, 3, 3])
    1.0
    """
    t, p = _check_labelings(labels_true, labels_pred)
    return float(adjusted_rand_score(t, p))


def normalized_mutual_info(labels_true: Any, labels_pred: Any) -> float:
    """Normalized mutual information between two labelings.

    Thin wrapper around :func:`sklearn.metrics.normalized_mutual_info_score`
    (arithmetic-mean normalisation, scikit-learn's default).

    Parameters
    ----------
    labels_true : array-like of shape (N,)
        Reference cluster/class labels (any hashable values).
    labels_pred : array-like of shape (N,)
        Predicted cluster labels.

    Returns
    -------
    float
        In ``[0, 1]``; 1.0 for identical partitions.

    Raises
    ------
    ValueError
        On non-1-D, empty, NaN/inf-containing or different-length inputs.

    Examples
    --------
    >>> from ppmix.metrics import normalized_mutual_info
    >>> normalized_mutual_info([0, 0, 1, 1], [1, 1, 0, 0])
    1.0
    """
    t, p = _check_labelings(labels_true, labels_pred)
    return float(normalized_mutual_info_score(t, p))


def permutation_accuracy(labels_true: Any, labels_pred: Any) -> float:
    """Accuracy under the best one-to-one matching of clusters to classes.

    The matching maximises the total count on the contingency table and is
    found with :func:`scipy.optimize.linear_sum_assignment` (Hungarian
    algorithm). The numbers of predicted clusters and true classes may
    differ: points in clusters left unmatched (or of classes left unmatched)
    count as errors.

    Parameters
    ----------
    labels_true : array-like of shape (N,)
        True class labels (any hashable values).
    labels_pred : array-like of shape (N,)
        Predicted cluster labels (any hashable values).

    Returns
    -------
    float
        Fraction of points whose cluster is matched to their true class.

    Raises
    ------
    ValueError
        On non-1-D, empty, NaN/inf-containing or different-length inputs.

    Examples
    --------
    >>> from ppmix.metrics import permutation_accuracy
    >>> permutation_accuracy([0, 0, 1, 1, 2], [2, 2, 0, 0, 0])
    0.8
    """
    t, p = _check_labelings(labels_true, labels_pred)
    table = contingency_matrix(t, p)  # rows: true classes, cols: clusters
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum() / t.shape[0])


# --------------------------------------------------------------------------
# regression metrics
# --------------------------------------------------------------------------


def relative_prediction_error(y_true: Any, y_pred: Any) -> float:
    """Relative prediction error (RPE).

    .. math::

        \\mathrm{RPE} = \\frac{\\sum_i (y_i - \\hat y_i)^2}{\\sum_i y_i^2},

    as defined in Chamroukhi & Pham, "Optimal Transport Aggregation for
    Distributed Mixture-of-Experts" (arXiv:2312.09877), Sec. 5. Returned as a
    fraction, not a percentage.

    Parameters
    ----------
    y_true : array-like of shape (N,)
        True responses.
    y_pred : array-like of shape (N,)
        Predicted responses.

    Returns
    -------
    float
        The RPE (0 for a perfect prediction).

    Raises
    ------
    ValueError
        On non-1-D, empty, NaN/inf-containing or different-length inputs, or
        if ``sum(y_true**2) == 0`` (the RPE is undefined).

    Examples
    --------
    >>> from ppmix.metrics import relative_prediction_error
    >>> relative_prediction_error([1.0, 2.0], [1.0, 1.0])
    0.2
    """
    y = _check_1d(y_true, "y_true").astype(np.float64, copy=False)
    yhat = _check_1d(y_pred, "y_pred").astype(np.float64, copy=False)
    _check_same_length(y, yhat, "y_true", "y_pred")
    denom = float(np.sum(y**2))
    if denom == 0.0:
        raise ValueError("y_true has sum of squares 0; RPE is undefined")
    return float(np.sum((y - yhat) ** 2) / denom)
