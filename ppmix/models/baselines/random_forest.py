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
    **rf_kwargs
        Passed to :class:`sklearn.ensemble.RandomForestClassifier` (e.g.
        ``n_estimators``, ``random_state``).

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

    def __init__(self, **rf_kwargs: Any) -> None:
        self.rf_kwargs = rf_kwargs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.rf_kwargs.items())})"

    def fit(self, X: Any, y: Any) -> "RandomForestBaseline":
        """Fit the forest on the labelled rows."""
        x, labels = self._prepare_fit(X, y)
        labelled = ~np.isnan(labels)
        self.classifier_ = RandomForestClassifier(**self.rf_kwargs)
        self.classifier_.fit(x.numpy()[labelled], labels[labelled].astype(np.int64))
        self.classes_ = np.array([0, 1])
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(N, 2)`` (columns: y = 0, y = 1)."""
        x = self._prepare(X).numpy()
        return self.classifier_.predict_proba(x)
