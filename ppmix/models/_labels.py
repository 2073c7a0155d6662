"""Class labels of any values (0/1, ±1, booleans, strings) for ppmix's classifiers.

The binary models compute with codes 0/1 (NaN for a missing label); :func:`encode_labels`
records the two classes seen in ``fit`` as ``classes_`` (scikit-learn's convention: sorted,
``classes_[1]`` is the positive class of ``predict_proba[:, 1]``) and maps labels to codes
and predictions back to labels. A multi-class estimator (PRESTO with softmax components) codes
its ``C`` sorted classes ``0..C-1`` (:func:`multiclass_classes`, :func:`encode_multiclass_labels`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from ppmix._validation import InvalidDataError, ravel_column_vector, to_output

__all__ = [
    "binary_classes",
    "decode_binary_labels",
    "encode_binary_labels",
    "encode_labels",
    "encode_multiclass_labels",
    "multiclass_classes",
]

_DEFAULT_CLASSES = np.array([0, 1])


def _flat_values(y: Any) -> np.ndarray:
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    elif hasattr(y, "to_numpy"):  # pandas Series / one-column DataFrame
        y = y.to_numpy()
    return ravel_column_vector(np.asarray(y))


def _is_missing(values: np.ndarray) -> np.ndarray:
    return np.asarray(pd.isna(values), dtype=bool) if values.dtype.kind in "fOcmM" else np.zeros(values.shape, bool)


def _observed_labels(values: np.ndarray, name: str) -> np.ndarray:
    """The labels that are not missing (numbers given as objects made numeric); continuous values refused."""
    observed = values[~_is_missing(values)]
    if observed.dtype == object:
        kinds = {type(v) for v in observed.tolist()}
        if kinds and all(issubclass(k, (int, float, np.number)) and not issubclass(k, bool) for k in kinds):
            observed = observed.astype(np.float64)
    if observed.dtype.kind == "f" and not np.isfinite(observed).all():
        raise InvalidDataError(
            f"{name} contains infinite values (e.g. {float(observed[~np.isfinite(observed)][0])}); class labels "
            "must be finite (NaN or None marks a missing label)"
        )
    if observed.dtype.kind == "f" and not np.array_equal(observed, np.round(observed)):
        raise InvalidDataError(
            f"{name} must hold class labels, not continuous values (Unknown label type: continuous, "
            f"e.g. {observed[observed != np.round(observed)][0]!r}); use a regressor"
        )
    return observed


def binary_classes(y: Any, name: str = "y") -> np.ndarray:
    """The two classes of ``y`` (missing labels, NaN or None, left out), sorted.

    Numeric labels within {0, 1} give ``[0, 1]`` whether or not both occur (a partly
    labelled fit may observe one class); booleans give ``[False, True]``; any other labels
    must take exactly two values.

    Raises
    ------
    InvalidDataError
        If ``y`` takes more than two values, or one value that is not 0/1.

    Examples
    --------
    >>> binary_classes(["spam", "ham", None, "spam"]).tolist(), binary_classes([-1, 1]).tolist()
    (['ham', 'spam'], [-1, 1])
    >>> binary_classes([1.0, float("nan")]).tolist()
    [0, 1]
    """
    observed = _observed_labels(_flat_values(y), name)
    if observed.dtype.kind == "b":
        return np.array([False, True])
    if observed.dtype.kind in "iuf" and np.isin(observed, (0, 1)).all():
        return _DEFAULT_CLASSES.copy()
    classes = np.unique(observed)
    if classes.size != 2:
        shown = classes[:5].tolist()
        raise InvalidDataError(
            f"Only binary classification is supported: {name} must hold two classes (NaN or None where "
            f"missing); found {classes.size} "
            f"class(es): {shown}{' ...' if classes.size > 5 else ''}"
        )
    return classes


def encode_binary_labels(y: Any, classes: np.ndarray, name: str = "y") -> np.ndarray:
    """Codes ``0.0``/``1.0`` of ``y`` by position in ``classes`` (NaN where a label is missing).

    Raises
    ------
    InvalidDataError
        If ``y`` holds a label that is not one of ``classes``.

    Examples
    --------
    >>> encode_binary_labels(["b", None, "a"], binary_classes(["a", "b"])).tolist()
    [1.0, nan, 0.0]
    """
    values = _flat_values(y)
    missing = _is_missing(values)
    codes = np.full(values.shape, np.nan)
    observed = values[~missing]
    if np.array_equal(classes, _DEFAULT_CLASSES) and observed.dtype == object:
        try:
            observed = observed.astype(np.float64)
        except (TypeError, ValueError):
            pass
    positive = observed == classes[1]
    unknown = ~(positive | (observed == classes[0]))
    if unknown.any():
        raise InvalidDataError(
            f"{name} holds labels outside the classes {classes.tolist()} (NaN or None for a missing label): "
            f"{np.unique(observed[unknown])[:5].tolist()}"
        )
    codes[~missing] = positive.astype(np.float64)
    return codes


def multiclass_classes(y: Any, name: str = "y") -> np.ndarray:
    """The sorted distinct labels of ``y`` (missing labels, NaN or None, left out), at least two.

    Raises
    ------
    InvalidDataError
        If ``y`` holds continuous or infinite values, or fewer than two classes.

    Examples
    --------
    >>> multiclass_classes(["b", "c", "a", None, "b"]).tolist(), multiclass_classes([2.0, 0.0, 7.0]).tolist()
    (['a', 'b', 'c'], [0, 2, 7])
    """
    observed = _observed_labels(_flat_values(y), name)
    classes = np.unique(observed)
    if classes.dtype.kind == "f":
        classes = classes.astype(np.int64)
    if classes.size < 2:
        raise InvalidDataError(
            f"{name} holds {classes.size} class(es) {classes.tolist()}: a classifier needs two or more"
        )
    return classes


def encode_multiclass_labels(y: Any, classes: np.ndarray, name: str = "y") -> np.ndarray:
    """Codes ``0.0, ..., C-1`` of ``y`` by position in the sorted ``classes`` (NaN where a label is missing).

    Raises
    ------
    InvalidDataError
        If ``y`` holds a label that is not one of ``classes``.

    Examples
    --------
    >>> encode_multiclass_labels(["c", None, "a"], np.array(["a", "b", "c"])).tolist()
    [2.0, nan, 0.0]
    """
    values = _flat_values(y)
    missing = _is_missing(values)
    observed = _observed_labels(values, name)
    position = np.searchsorted(classes, observed).clip(0, classes.size - 1)
    unknown = classes[position] != observed
    if unknown.any():
        raise InvalidDataError(
            f"{name} holds labels outside the classes {classes.tolist()[:10]} (NaN or None for a missing label): "
            f"{np.unique(observed[unknown])[:5].tolist()}"
        )
    codes = np.full(values.shape, np.nan)
    codes[~missing] = position.astype(np.float64)
    return codes


def decode_binary_labels(codes: torch.Tensor, classes: np.ndarray | None, like: Any) -> Any:
    """Labels of predicted codes (0/1, or ``0..C-1`` of a multi-class model): the codes themselves (tensor in,
    tensor out, as every ppmix output) for ``classes = [0, 1, ..., C-1]`` or ``None`` (a model saved before
    ``classes_`` was saved), else an array of the classes.

    Examples
    --------
    >>> decode_binary_labels(torch.tensor([1, 0]), np.array(["ham", "spam"]), None).tolist()
    ['spam', 'ham']
    >>> decode_binary_labels(torch.tensor([2, 0]), np.arange(3), None).tolist()
    [2, 0]
    """
    if classes is None or np.array_equal(classes, np.arange(len(classes))):
        return to_output(codes, like)
    return classes[codes.detach().cpu().numpy().astype(np.int64)]


def encode_labels(estimator: Any, y: Any, *, fitting: bool) -> np.ndarray | None:
    """Codes 0/1 of a binary classifier's ``y`` (None stays None); when ``fitting``, first record
    ``estimator.classes_`` from ``y`` (``[0, 1]`` without labels). A model not fitted by ``fit`` (e.g. on shards)
    codes by the classes of ``y`` itself.

    Examples
    --------
    >>> class Model:
    ...     pass
    >>> model = Model()
    >>> encode_labels(model, ["b", "a", None], fitting=True).tolist(), model.classes_.tolist()
    ([1.0, 0.0, nan], ['a', 'b'])
    """
    if fitting:
        estimator.classes_ = _DEFAULT_CLASSES.copy() if y is None else binary_classes(y)
    if y is None:
        return None
    return encode_binary_labels(y, estimator.classes_ if hasattr(estimator, "classes_") else binary_classes(y))
