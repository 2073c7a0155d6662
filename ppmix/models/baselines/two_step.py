"""The two-step baselines: a generative model of ``X`` alone (a :class:`~ppmix.GMM`, or an
:class:`~ppmix.HMM` for sequences), then logistic regression on its posteriors (:class:`TwoStep`;
:func:`TwoStepGMM` and :func:`TwoStepHMM` only set defaults)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
from sklearn.linear_model import LogisticRegression

from ppmix.models.baselines._base import _GaussianMixtureDensity, _LabelBaseline, _numpy, check_binary_labels
from ppmix.models.gmm import GMM
from ppmix.models.hmm import HMM

__all__ = ["TwoStep", "TwoStepGMM", "TwoStepHMM"]


def _is_sequence_list(X: Any) -> bool:
    return isinstance(X, (list, tuple)) and len(X) > 0 and all(np.ndim(seq) == 2 for seq in X)


def _sequence_labels(X: list, y: Any) -> np.ndarray:
    """Per-step labels of a list of sequences, concatenated and checked."""
    if not isinstance(y, (list, tuple)) or len(y) != len(X):
        n = len(y) if isinstance(y, (list, tuple)) else type(y).__name__
        raise ValueError(f"y must be a list of per-step label arrays, one per sequence ({len(X)}); got {n}")
    parts = []
    for b, (seq, lab) in enumerate(zip(X, y)):
        arr = _numpy(lab).astype(np.float64).reshape(-1)
        if arr.shape[0] != len(seq):
            raise ValueError(f"y[{b}] has {arr.shape[0]} labels but sequence {b} has {len(seq)} steps")
        parts.append(arr)
    labels = np.concatenate(parts)
    return check_binary_labels(labels, labels.shape[0])


class TwoStep(_GaussianMixtureDensity, _LabelBaseline):
    """Two-step baseline: fit a generative model on ``X`` alone, then logistic regression on its posteriors.

    With matrix input the posteriors are the responsibilities ``p(z | x)`` of each row
    (2-Step-GMM). With a list of sequences (``y`` a list of per-step label arrays) the
    generative model is a sequence model whose ``predict_proba`` returns the smoothed
    per-step posteriors ``p(z_t | x_{1:T})`` (2-Step-HMM), and ``predict_proba`` returns
    one ``(T, 2)`` array per sequence. Rows (steps) with a missing label still train
    the generative model.

    Parameters
    ----------
    generative_model : estimator, optional
        An unfitted model with ``fit(X)`` and ``predict_proba(X)`` (posteriors); it is
        copied, not modified. Default: ``GMM(n_components=2, progress=False)``; see
        :func:`TwoStepGMM` and :func:`TwoStepHMM` for the usual choices.
    C : float, default 1.0
        Inverse L2 regularisation of the logistic regression.
    max_iter : int, default 1000
        Iterations of the logistic-regression solver.

    Attributes
    ----------
    generative_model_ : the fitted generative model
    classifier_ : sklearn.linear_model.LogisticRegression
    classes_ : ndarray ``[0, 1]``

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = TwoStep(GMM(2, seed=0, progress=False)).fit(X, y)
    >>> model.predict_proba(X).shape
    (200, 2)
    """

    def __init__(self, generative_model: Any = None, *, C: float = 1.0, max_iter: int = 1000) -> None:
        self.generative_model = generative_model
        self.C = C
        self.max_iter = max_iter

    def fit(self, X: Any, y: Any) -> "TwoStep":
        """Fit the generative model on ``X``, then the classifier on the labelled posteriors."""
        model = GMM(2, progress=False) if self.generative_model is None else copy.deepcopy(self.generative_model)
        self.sequences_ = _is_sequence_list(X)
        if self.sequences_:
            labels = _sequence_labels(X, y)
            self._fit_classes = np.array([0, 1])  # per-step labels of sequences are numeric 0/1
            model.fit(X)
            self.n_features_in_ = int(model.n_features_in_)
            self.feature_names_in_ = getattr(model, "feature_names_in_", None)
        else:
            x, labels = self._prepare_fit(X, y)
            model.fit(x)
        self.generative_model_ = model
        features = self._posterior_features(X if self.sequences_ else x)
        labelled = ~np.isnan(labels)
        self.classifier_ = LogisticRegression(C=self.C, max_iter=self.max_iter)
        self.classifier_.fit(features[labelled], labels[labelled].astype(np.int64))
        self.classes_ = self._fit_classes
        return self

    def _posterior_features(self, X: Any) -> np.ndarray:
        posterior = self.generative_model_.predict_proba(X)
        if isinstance(posterior, list):
            return np.concatenate([_numpy(p) for p in posterior])
        return _numpy(posterior)

    def predict_proba(self, X: Any) -> Any:
        """``[p(y=0 | x), p(y=1 | x)]`` per row ``(N, 2)``, or one ``(T, 2)`` array per sequence."""
        self._check_fitted()
        if not self.sequences_:
            return self.classifier_.predict_proba(self._posterior_features(self._prepare(X)))
        if not _is_sequence_list(X):
            raise TypeError("this TwoStep was fitted on sequences; X must be a list of (length, n_features) arrays")
        proba = self.classifier_.predict_proba(self._posterior_features(X))
        return np.split(proba, np.cumsum([len(seq) for seq in X])[:-1])

    def score_samples(self, X: Any) -> np.ndarray:
        """``log p(x)`` per row under the generative model (``log p(x_{1:T})`` per sequence for a sequence model)."""
        self._check_fitted()
        return _numpy(self.generative_model_.score_samples(X if self.sequences_ else self._prepare(X)))

    def _mixture_parameters(self) -> tuple[Any, Any, Any]:
        model = self.generative_model_
        if self.sequences_ or not all(hasattr(model, a) for a in ("weights_", "means_", "covariances_")):
            raise TypeError(
                f"log_likelihood_relevant needs a Gaussian mixture (weights_, means_, covariances_); "
                f"got {type(model).__name__}"
            )
        return model.weights_, model.means_, model.covariances_


def _two_step_factory(model_cls: type[GMM] | type[HMM], name: str, doc: str) -> Callable[..., TwoStep]:
    """A function ``name(n_components, *, covariance_type, n_init, seed, C)`` building
    ``TwoStep(model_cls(n_components, ...), C=C)``, documented by ``doc``."""

    def factory(
        n_components: int = 4,
        *,
        covariance_type: str = "diag",
        n_init: int = 1,
        seed: int | None = None,
        C: float = 1.0,
    ) -> TwoStep:
        model = model_cls(n_components, covariance_type=covariance_type, n_init=n_init, seed=seed, progress=False)
        return TwoStep(model, C=C)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    return factory


TwoStepGMM = _two_step_factory(
    GMM,
    "TwoStepGMM",
    """2-Step-GMM: ``TwoStep(GMM(n_components, ...), C=C)``.

    Parameters
    ----------
    n_components : int, default 4
        The number of components of the GMM.
    covariance_type : {"diag", "full", "spherical", "tied"}, default "diag"
        As for :class:`~ppmix.GMM`.
    n_init : int, default 1
        EM restarts of the GMM.
    seed : int, optional
        The seed of the GMM.
    C : float, default 1.0
        Inverse L2 regularisation of the logistic regression on the posteriors.

    Returns
    -------
    TwoStep
        The unfitted two-step estimator.

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> TwoStepGMM(2, seed=0).fit(X, y).predict(X).shape
    (200,)
    """,
)

TwoStepHMM = _two_step_factory(
    HMM,
    "TwoStepHMM",
    """2-Step-HMM: ``TwoStep(HMM(n_components, ...), C=C)`` on a list of sequences.

    Parameters
    ----------
    n_components : int, default 4
        The number of hidden states of the HMM.
    covariance_type : {"diag", "full", "spherical", "tied"}, default "diag"
        As for :class:`~ppmix.HMM`.
    n_init : int, default 1
        EM restarts of the HMM.
    seed : int, optional
        The seed of the HMM.
    C : float, default 1.0
        Inverse L2 regularisation of the logistic regression on the posteriors.

    Returns
    -------
    TwoStep
        The unfitted two-step estimator.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> seqs = [rng.normal(size=(8, 2)) for _ in range(5)]
    >>> labels = [rng.integers(0, 2, 8) for _ in range(5)]
    >>> [p.shape for p in TwoStepHMM(2, seed=0).fit(seqs, labels).predict_proba(seqs[:2])]
    [(8, 2), (8, 2)]
    """,
)
