"""Choosing the number of components ``K`` of any ppmix model: one function, three criteria, one plot."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

__all__ = ["ComponentSelection", "select_components"]

logger = logging.getLogger(__name__)

CRITERIA = ("bic", "aic", "cv")


@dataclass
class ComponentSelection:
    """What :func:`select_components` found.

    Parameters
    ----------
    criterion : "bic", "aic" or "cv"
    parameter : the constructor argument that was varied (``n_components``; ``n_experts`` for a mixture of experts)
    ks : the numbers of components tried
    scores : the criterion at each ``k`` (BIC/AIC: lower is better; cv: the mean held-out ``score``, higher is better)
    best_k : the ``k`` the criterion prefers
    best_model : the model with ``best_k`` components, fitted on all the data

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> from ppmix.models import select_components
    >>> X = np.random.default_rng(0).normal(size=(150, 2))
    >>> found = select_components(GMM(seed=0, progress=False), X, ks=[1, 2])
    >>> found.criterion, found.ks, found.best_model.n_components == found.best_k
    ('bic', [1, 2], True)
    """

    criterion: str
    parameter: str
    ks: list[int]
    scores: list[float]
    best_k: int
    best_model: Any

    def plot(self, ax: Any = None) -> Any:
        """The criterion against ``k`` with the choice marked; returns the matplotlib ``Axes``."""
        import matplotlib.pyplot as plt

        ax = ax if ax is not None else plt.subplots(figsize=(5, 3.5))[1]
        ax.plot(self.ks, self.scores, marker="o")
        ax.axvline(self.best_k, color="0.5", linestyle=":", label=f"chosen {self.parameter} = {self.best_k}")
        better = "higher" if self.criterion == "cv" else "lower"
        ax.set(xlabel=self.parameter, ylabel=f"{self.criterion} ({better} is better)", xticks=self.ks)
        ax.legend()
        return ax


def _component_parameter(model: Any) -> str:
    params = model.get_params(deep=False)
    for name in ("n_experts", "n_components"):
        if name in params:
            return name
    raise TypeError(f"{type(model).__name__} has no n_components (or n_experts) parameter to vary")


def select_components(
    model: Any,
    X: Any,
    y: Any = None,
    ks: Iterable[int] = range(1, 7),
    *,
    criterion: str = "bic",
    cv: Any = 5,
    **fit_options: Any,
) -> ComponentSelection:
    """Fit ``model`` with each number of components in ``ks`` and choose one by ``criterion``.

    Parameters
    ----------
    model : a ppmix model (unfitted or not; it is cloned with each ``k``, never changed)
    X, y : the data, as for ``model.fit`` (``y`` for models with a target)
    ks : the numbers of components to try (``n_experts`` for a mixture of experts)
    criterion : {"bic", "aic", "cv"}
        ``"bic"``/``"aic"``: the information criterion on the training data (lower is
        better), with the model's free parameters (for a model of your own, counted from
        its Pyro program). ``"cv"``: the mean of ``model.score`` over ``cv`` folds of
        scikit-learn's ``cross_val_score`` (higher is better): the held-out log-likelihood
        of a density model, the accuracy or R² of a classifier or regressor.
    cv : folds or a scikit-learn splitter, for ``criterion="cv"``
    **fit_options : passed to every ``fit`` (e.g. ``engine="svi", num_steps=500``)

    Returns
    -------
    ComponentSelection
        The scores, the chosen ``best_k``, ``best_model`` (fitted on all of ``X``) and ``plot()``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-5, 1, (100, 2)), rng.normal(5, 1, (100, 2))])
    >>> select_components(GMM(seed=0, progress=False), X, ks=[1, 2, 3]).best_k
    2
    """
    from sklearn.base import clone

    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}; got {criterion!r}")
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be a non-empty list of positive integers; got {ks}")
    parameter = _component_parameter(model)
    scores, fitted = [], []
    for k in ks:
        candidate = clone(model).set_params(**{parameter: k})
        if criterion == "cv":
            from sklearn.model_selection import cross_val_score

            scores.append(float(np.mean(cross_val_score(candidate, X, y, cv=cv, params=fit_options or None))))
            fitted.append(None)
        else:
            candidate.fit(X, y, **fit_options)
            scores.append(float(getattr(candidate, criterion)(X, y)))
            fitted.append(candidate)
        logger.info("select_components: %s=%d, %s %.6g", parameter, k, criterion, scores[-1])
    best = int(np.argmax(scores)) if criterion == "cv" else int(np.argmin(scores))
    best_model = fitted[best] if fitted[best] is not None else clone(model).set_params(**{parameter: ks[best]})
    if fitted[best] is None:
        best_model.fit(X, y, **fit_options)
    return ComponentSelection(criterion, parameter, ks, scores, ks[best], best_model)
