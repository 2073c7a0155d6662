"""What an estimator's target ``y`` is, and the scikit-learn face that follows from it: a regressor (real or count
``y``), a binary classifier or a multi-class one (scikit-learn's tags, ``score``, ``classes_`` and the labels
predicted). :class:`~ppmix.models.moe.MixtureOfExperts` and :class:`~ppmix.inference.PRESTO` hold a
:class:`TargetCoding` chosen by their components; the prediction-focused models and the label baselines hold the
binary one (:data:`BINARY`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.utils import ClassifierTags, RegressorTags

from ppmix._validation import InvalidDataError
from ppmix.models._labels import (
    binary_classes,
    decode_binary_labels,
    encode_binary_labels,
    encode_multiclass_labels,
    multiclass_classes,
)

__all__ = ["BINARY", "TARGET_KINDS", "TargetCoding"]

#: the kinds of target: two of a regressor, two of a classifier
TARGET_KINDS = ("real", "count", "binary", "categorical")


@dataclass(frozen=True)
class TargetCoding:
    """The kind of an estimator's target and its coding: a regressor's ``y`` as it is, a binary classifier's two
    labels (any two values, recorded in ``fit`` as ``classes_``) as codes 0/1, a multi-class one's sorted labels as
    ``0..C-1``. It also gives the estimator scikit-learn's tags and ``score``: R² of ``predict`` (the conditional
    mean) for a regressor, its accuracy for a classifier.

    Parameters
    ----------
    kind : {"real", "count", "binary", "categorical"}

    Examples
    --------
    >>> TargetCoding("binary").classifies, TargetCoding("count").classifies
    (True, False)
    >>> from ppmix import MixtureOfExperts
    >>> from sklearn.utils import get_tags
    >>> get_tags(MixtureOfExperts(expert="logistic")).estimator_type
    'classifier'
    """

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"kind must be one of {TARGET_KINDS}; got {self.kind!r}")

    @property
    def classifies(self) -> bool:
        """Whether ``y`` holds class labels (binary or categorical)."""
        return self.kind in ("binary", "categorical")

    @property
    def multiclass(self) -> bool:
        """Whether ``y`` may hold any number of classes (categorical)."""
        return self.kind == "categorical"

    def tags(self, tags: Any) -> Any:
        """``tags`` (an estimator's ``super().__sklearn_tags__()``) made those of this kind's estimator, as
        scikit-learn's ``ClassifierMixin`` and ``RegressorMixin`` make them (a binary classifier not multi-class)."""
        tags.target_tags.required = True
        if self.classifies:
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags(multi_class=self.multiclass)
        else:
            tags.estimator_type = "regressor"
            tags.regressor_tags = RegressorTags()
        return tags

    def score(self, estimator: Any, X: Any, y: Any, sample_weight: Any = None) -> float:
        """The accuracy of ``estimator.predict`` (a classifier) or its R² (a regressor), as scikit-learn scores."""
        kind = ClassifierMixin if self.classifies else RegressorMixin
        return kind.score(estimator, X, y, sample_weight)  # type: ignore[arg-type]

    def encode(self, estimator: Any, y: Any, *, fitting: bool) -> Any:
        """A classifier's ``y`` as codes 0/1 (0..C-1 for a multi-class one) of ``estimator.classes_`` (recorded
        there when ``fitting``); a regressor's, or a missing ``y``, unchanged."""
        if not self.classifies or y is None:
            return y
        classes_of, encode = (
            (multiclass_classes, encode_multiclass_labels)
            if self.multiclass
            else (binary_classes, encode_binary_labels)
        )
        if fitting:
            estimator.classes_ = classes_of(y)
        # a model built from parameters (from_parameters, a distributed fit) codes by the classes of y itself
        codes = encode(y, estimator.classes_ if hasattr(estimator, "classes_") else classes_of(y))
        if fitting and np.unique(codes[~np.isnan(codes)]).size < 2:
            raise InvalidDataError("y holds one class only: logistic components need both classes to train")
        return codes

    def decode(self, estimator: Any, codes: torch.Tensor, like: Any) -> Any:
        """Predicted codes as the labels of ``estimator.classes_`` (tensor in, tensor out for labels
        ``0..C-1``; :func:`~ppmix.models._labels.decode_binary_labels`)."""
        return decode_binary_labels(codes, getattr(estimator, "classes_", None), like)


#: the target of a binary classifier (the prediction-focused models, the label baselines)
BINARY = TargetCoding("binary")
