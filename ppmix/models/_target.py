"""Estimators whose kind follows their components: a regressor with Gaussian (linear) components, a binary
classifier with logistic ones, a multi-class classifier with softmax ones (scikit-learn's tags, ``score``,
``classes_`` and the labels predicted).
:class:`~ppmix.models.moe.MixtureOfExperts` and :class:`~ppmix.inference.PRESTO` are such estimators."""

from __future__ import annotations

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

__all__ = ["TargetKindMixin"]


class TargetKindMixin:
    """The scikit-learn face of an estimator that is a regressor or a classifier by its components.

    A host says which by :attr:`_classifies` (and :attr:`_multiclass`). A regressor's ``score`` is
    R² of ``predict`` (the conditional mean); a binary classifier records the two labels seen in
    ``fit`` (any two values) as ``classes_``, a multi-class one all the labels seen (sorted);
    a classifier predicts them and scores by accuracy.

    Examples
    --------
    >>> from ppmix import MixtureOfExperts
    >>> from sklearn.utils import get_tags
    >>> get_tags(MixtureOfExperts(expert="logistic")).estimator_type
    'classifier'
    """

    classes_: Any

    @property
    def _classifies(self) -> bool:
        """Whether the components are classifiers (logistic); the host defines it."""
        raise NotImplementedError

    @property
    def _multiclass(self) -> bool:
        """Whether the classifier takes any number of classes (softmax components); binary by default."""
        return False

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.target_tags.required = True
        if self._classifies:
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags(multi_class=self._multiclass)
        else:
            tags.estimator_type = "regressor"
            tags.regressor_tags = RegressorTags()
        return tags

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy of :meth:`predict` (a classifier) or its R² (a regressor), as scikit-learn's classifiers and
        regressors score."""
        mixin = ClassifierMixin if self._classifies else RegressorMixin
        return mixin.score(self, X, y, sample_weight)  # type: ignore[arg-type]

    def _encode_response(self, y: Any, *, fitting: bool) -> Any:
        """A classifier's ``y`` as codes 0/1 (0..C-1 for a multi-class one) of ``classes_`` (recorded when
        fitting); a regressor's unchanged."""
        if not self._classifies or y is None:
            return y
        classes_of, encode = (
            (multiclass_classes, encode_multiclass_labels)
            if self._multiclass
            else (binary_classes, encode_binary_labels)
        )
        if fitting:
            self.classes_ = classes_of(y)
        # a model built from parameters (from_parameters, a distributed fit) codes by the classes of y itself
        codes = encode(y, self.classes_ if hasattr(self, "classes_") else classes_of(y))
        if fitting and np.unique(codes[~np.isnan(codes)]).size < 2:
            raise InvalidDataError("y holds one class only: logistic components need both classes to train")
        return codes

    def _decode_prediction(self, codes: torch.Tensor, like: Any) -> Any:
        return decode_binary_labels(codes, getattr(self, "classes_", None), like)
