"""The random-forest baseline: scikit-learn's random forest behind the baselines' API, the prediction upper
bound (:class:`RandomForestBaseline`). Imports ``sklearn.ensemble``, so the package loads it only on first use."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.ensemble import RandomForestClassifier

from ppmix.models.baselines._base import _LabelBaseline

__all__ = ["RandomForestBaseline"]


class RandomForestBaseline(_LabelBaseline):
    """scikit-learn's ``RandomForestClassifier`` behind the baselines' API: the
    prediction upper bound of Sharma et al. (2023) (§7.1). Trained on the labelled rows only.

    Parameters
    ----------
    n_estimators, max_depth, min_samples_leaf, random_state
        Passed to :class:`sklearn.ensemble.RandomForestClassifier`.

    Attributes
    ----------
    classifier_ : sklearn.ensemble.RandomForestClassifier

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(100, n_relevant=2, n_irrelevant=2, seed=0)
    >>> RandomForestBaseline(n_estimators=20, random_state=0).fit(X, y).predict_proba(X).shape
    (100, 2)
    """

    def __init__(
        self,
        n_estimators: int = 100,
        *,
        max_depth: int | None = None,
        min_samples_leaf: int = 1,
        random_state: int | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> "RandomForestBaseline":
        """Fit the forest on the labelled rows."""
        x, labels = self._prepare_fit(X, y)
        labelled = ~np.isnan(labels)
        self.classifier_ = RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
        )
        self.classifier_.fit(x.numpy()[labelled], labels[labelled].astype(np.int64))
        self.classes_ = self._fit_classes
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(N, 2)`` (columns: y = 0, y = 1)."""
        x = self._prepare(X).numpy()
        return self.classifier_.predict_proba(x)
