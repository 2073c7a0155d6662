"""The sparse-clustering baseline: sparse k-means (Witten & Tibshirani, 2010) on ``X``, then logistic
regression on the one-hot cluster labels (:class:`SparseKMeansClassifier`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from ppmix._validation import check_positive_int
from ppmix.models._params import store_params
from ppmix.models.baselines._base import _LabelBaseline
from ppmix.models.baselines.sparse_kmeans import choose_l1_bound, default_l1_bounds, sparse_kmeans

__all__ = ["SparseKMeansClassifier"]

logger = logging.getLogger(__name__)


class SparseKMeansClassifier(_LabelBaseline):
    """Sparse k-means (Witten & Tibshirani, 2010) followed by logistic regression on the
    one-hot cluster labels ("sparse clustering" of Sharma et al. (2023), §7.1).

    The clustering uses every row of ``X`` (labelled or not); see
    :mod:`ppmix.models.baselines.sparse_kmeans` for the algorithm. With ``l1_bound=None`` the
    bound ``s`` is chosen among ``n_bounds`` log-spaced values in ``[1.2, 0.9 sqrt(D)]``
    by the permutation gap statistic with ``n_permutations`` permutations (25 in the
    paper, E.2). Features are used as given (scale them first if their units differ).

    Parameters
    ----------
    n_clusters : int, default 4
    l1_bound : float, optional
        ``s >= 1``: the L1 bound of the feature weights (smaller = sparser).
    n_permutations : int, default 25
    n_bounds : int, default 10
    n_init : int, default 3
        k-means++ restarts inside every k-means step.
    C : float, default 1.0
        Inverse regularisation of the logistic regression.
    seed : int, optional

    Attributes
    ----------
    feature_weights_ : ndarray (D,)
        Non-negative, unit L2 norm; zero for the features the clustering ignores.
    l1_bound_ : float
    cluster_centers_ : ndarray (K, D)
        Centres in the weighted space ``x * sqrt(feature_weights_)``.
    labels_ : ndarray (N,)
    l1_bounds_, gaps_, gap_se_ : ndarray
        The candidate bounds and their gap statistics (only when ``l1_bound`` is None).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(80, 6))
    >>> y = (rng.random(80) < 0.5).astype(float)
    >>> X[y == 1, 0] += 6.0
    >>> model = SparseKMeansClassifier(2, l1_bound=1.1, seed=0).fit(X, y)
    >>> int(model.feature_weights_.argmax()), model.predict_proba(X).shape
    (0, (80, 2))
    """

    def __init__(
        self,
        n_clusters: int = 4,
        *,
        l1_bound: float | None = None,
        n_permutations: int = 25,
        n_bounds: int = 10,
        n_init: int = 3,
        C: float = 1.0,
        seed: int | None = None,
    ) -> None:
        store_params(self, locals())

    def fit(self, X: Any, y: Any) -> "SparseKMeansClassifier":
        """Sparse k-means on all rows of ``X``, then logistic regression on the labelled rows."""
        k = check_positive_int(self.n_clusters, "n_clusters")
        n_init = check_positive_int(self.n_init, "n_init")
        if self.l1_bound is not None and not self.l1_bound >= 1:
            raise ValueError(f"l1_bound must be >= 1 (||w||_2 = 1 forces ||w||_1 >= 1); got {self.l1_bound}")
        x_t, labels = self._prepare_fit(X, y)
        x = x_t.numpy()
        if k > x.shape[0]:
            raise ValueError(f"n_clusters={k} is larger than the number of samples ({x.shape[0]})")
        if self.l1_bound is None:
            bounds = default_l1_bounds(x.shape[1], check_positive_int(self.n_bounds, "n_bounds"))
            permutations = check_positive_int(self.n_permutations, "n_permutations")
            s, self.gaps_, self.gap_se_ = choose_l1_bound(x, k, bounds, permutations, self.seed, n_init)
            self.l1_bounds_ = bounds
            logger.info("sparse k-means: l1 bound %.3g chosen by the gap statistic", s)
        else:
            s = float(self.l1_bound)
        gen = torch.Generator()
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(self.seed))
        result = sparse_kmeans(x, k, s, gen, n_init)
        self.l1_bound_ = s
        self.feature_weights_ = result.weights
        self.cluster_centers_ = result.centres
        self.labels_ = result.labels
        labelled = ~np.isnan(labels)
        self.classifier_ = LogisticRegression(C=self.C, max_iter=1000)
        self.classifier_.fit(self._one_hot(result.labels)[labelled], labels[labelled].astype(np.int64))
        self.classes_ = self._fit_classes
        return self

    def _one_hot(self, clusters: np.ndarray) -> np.ndarray:
        return np.eye(self.n_clusters)[clusters]

    def predict_cluster(self, X: Any) -> np.ndarray:
        """Nearest cluster centre in the weighted feature space, ``(N,)``."""
        x = self._prepare(X).numpy() * np.sqrt(self.feature_weights_)
        return ((x[:, None, :] - self.cluster_centers_[None]) ** 2).sum(-1).argmin(1)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Logistic regression on the one-hot nearest cluster, shape ``(N, 2)``."""
        clusters = self.predict_cluster(X)
        return self.classifier_.predict_proba(self._one_hot(clusters))
