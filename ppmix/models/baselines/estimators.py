"""Baselines of the prediction-focused mixtures paper (seed 003, §7.1, Supplement E.1–E.2, F).

Every baseline has the same API: ``fit(X, y)`` with binary labels ``y`` in {0, 1} and
NaN for a missing label (rows without a label are used only by the unsupervised
parts), ``predict_proba(X) -> (N, 2)`` and ``predict(X)``; the generative ones add
``score_samples(X)`` (``log p(x)`` per row) and ``log_likelihood_relevant(X, mask)``
(``log p(x_R)`` per row, the exact marginal of the fitted density on the features
in ``mask``).

* :class:`TwoStep` — a generative model of ``X`` alone (default :class:`~ppmix.GMM`;
  an :class:`~ppmix.HMM` for sequences), then logistic regression on its posteriors
  (:func:`TwoStepGMM`, :func:`TwoStepHMM` only set defaults).
* :class:`ClassSpecificGMM` — one GMM per class, ``p(y | x)`` by Bayes' rule (Supplement F).
* :class:`PCGMM` — the prediction-constrained GMM of Hughes et al. (2017), trained by
  Adam on ``w log p(X) + lambda log p(Y | X)``; :class:`PredictionOnlyGMM` is the same
  with the generative term dropped ("pf-GMM, prediction term only").
* :class:`SparseKMeansClassifier` — sparse k-means (Witten & Tibshirani, 2010), then
  logistic regression on the one-hot cluster labels.
* :class:`RandomForestBaseline` — scikit-learn's random forest, the prediction upper bound.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

from ppmix._validation import NotFittedError, check_matrix, check_positive_int
from ppmix.components import DiagGaussian, FullGaussian
from ppmix.components._centred import CentredData
from ppmix.models.baselines.sparse_kmeans import choose_l1_bound, default_l1_bounds, sparse_kmeans
from ppmix.models.gmm import GMM
from ppmix.models.hmm import HMM

__all__ = [
    "ClassSpecificGMM",
    "PCGMM",
    "PredictionOnlyGMM",
    "RandomForestBaseline",
    "SparseKMeansClassifier",
    "TwoStep",
    "TwoStepGMM",
    "TwoStepHMM",
    "check_binary_labels",
    "gaussian_mixture_marginal_log_prob",
]

logger = logging.getLogger(__name__)

#: window (Adam steps) of the pc-GMM stopping rule
PC_PATIENCE = 50


# ---------------------------------------------------------------------------- helpers
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
        raise ValueError(f"{name} is required: binary labels in {{0, 1}}, NaN where missing")
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
        raise ValueError(f"{name} must contain both classes 0 and 1 among its observed labels")
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


# ----------------------------------------------------------------------- base classes
class _LabelBaseline(ABC):
    """``fit(X, y)`` input handling, the fitted check and ``predict`` from ``predict_proba``."""

    def _prepare_fit(self, X: Any, y: Any) -> tuple[torch.Tensor, np.ndarray]:
        x, names = check_matrix(X, "X")
        labels = check_binary_labels(y, x.shape[0])
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
            return [p.argmax(1) for p in proba]
        return proba.argmax(1)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.endswith("_") and not k.startswith("_"))
        return f"{type(self).__name__}({args})"


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


# -------------------------------------------------------------------------- 2-step
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
        self.classes_ = np.array([0, 1])
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


def TwoStepGMM(
    n_components: int = 4,
    *,
    covariance_type: str = "diag",
    n_init: int = 1,
    seed: int | None = None,
    C: float = 1.0,
) -> TwoStep:
    """2-Step-GMM: ``TwoStep(GMM(n_components, ...), C=C)``.

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> TwoStepGMM(2, seed=0).fit(X, y).predict(X).shape
    (200,)
    """
    gmm = GMM(n_components, covariance_type=covariance_type, n_init=n_init, seed=seed, progress=False)
    return TwoStep(gmm, C=C)


def TwoStepHMM(
    n_components: int = 4,
    *,
    covariance_type: str = "diag",
    n_init: int = 1,
    seed: int | None = None,
    C: float = 1.0,
) -> TwoStep:
    """2-Step-HMM: ``TwoStep(HMM(n_components, ...), C=C)`` on a list of sequences.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> seqs = [rng.normal(size=(8, 2)) for _ in range(5)]
    >>> labels = [rng.integers(0, 2, 8) for _ in range(5)]
    >>> [p.shape for p in TwoStepHMM(2, seed=0).fit(seqs, labels).predict_proba(seqs[:2])]
    [(8, 2), (8, 2)]
    """
    hmm = HMM(n_components, covariance_type=covariance_type, n_init=n_init, seed=seed, progress=False)
    return TwoStep(hmm, C=C)


# ------------------------------------------------------------------ class-specific GMM
class ClassSpecificGMM(_GaussianMixtureDensity, _LabelBaseline):
    """One GMM per class (Supplement F): ``p(x | y = c)`` is a ``K``-component GMM fitted
    on the rows with label ``c``; ``p(y | x)`` follows by Bayes' rule with the class
    frequencies as priors, and ``p(x) = sum_c pi_c p_c(x)``. Rows without a label are
    not used (the per-class fits have no unsupervised part).

    Parameters
    ----------
    n_components : int, default 4
        Components per class.
    covariance_type : {"diag", "full"}, default "diag"
    n_init, max_iter : int
        Passed to each :class:`~ppmix.GMM`.
    seed : int, optional
        Class ``c`` uses ``seed + c``.

    Attributes
    ----------
    gmms_ : list of two fitted :class:`~ppmix.GMM`
    class_prior_ : ndarray (2,)

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = ClassSpecificGMM(1, seed=0).fit(X, y)
    >>> model.class_prior_.round(2), model.score_samples(X).shape
    (array([0.44, 0.56]), (200,))
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        covariance_type: str = "diag",
        n_init: int = 1,
        max_iter: int = 100,
        seed: int | None = None,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.n_init = n_init
        self.max_iter = max_iter
        self.seed = seed

    def fit(self, X: Any, y: Any) -> "ClassSpecificGMM":
        """Fit one GMM on the rows of each class."""
        k = check_positive_int(self.n_components, "n_components")
        x, labels = self._prepare_fit(X, y)
        counts = np.array([(labels == c).sum() for c in (0, 1)], dtype=np.float64)
        for c in (0, 1):
            if k > counts[c]:
                raise ValueError(f"n_components={k} is larger than the number of samples with y={c} ({counts[c]:.0f})")
        self.gmms_ = [
            GMM(
                k,
                covariance_type=self.covariance_type,
                n_init=self.n_init,
                max_iter=self.max_iter,
                seed=None if self.seed is None else self.seed + c,
                progress=False,
            ).fit(x[torch.as_tensor(labels == c)])
            for c in (0, 1)
        ]
        self.class_prior_ = counts / counts.sum()
        self.classes_ = np.array([0, 1])
        return self

    def _class_log_joint(self, X: Any) -> torch.Tensor:
        """``log pi_c + log p_c(x)``, shape ``(N, 2)``."""
        x = self._prepare(X)
        log_px = torch.stack([gmm.score_samples(x) for gmm in self.gmms_], dim=1)
        return log_px + torch.as_tensor(np.log(self.class_prior_))

    def predict_proba(self, X: Any) -> np.ndarray:
        """``p(y = c | x) = pi_c p_c(x) / sum_c' pi_c' p_c'(x)``, shape ``(N, 2)``."""
        return torch.softmax(self._class_log_joint(X), dim=1).numpy()

    def score_samples(self, X: Any) -> np.ndarray:
        """``log p(x) = log sum_c pi_c p_c(x)`` per row."""
        return torch.logsumexp(self._class_log_joint(X), dim=1).numpy()

    def _mixture_parameters(self) -> tuple[Any, Any, Any]:
        # a mixture of mixtures is one mixture with the weights pi_c w_ck
        weights = torch.cat([float(p) * g.weights_ for p, g in zip(self.class_prior_, self.gmms_)])
        return (
            weights,
            torch.cat([g.means_ for g in self.gmms_]),
            torch.cat([g.covariances_ for g in self.gmms_]),
        )


# ----------------------------------------------------------------------- pc-GMM
class PCGMM(_GaussianMixtureDensity, _LabelBaseline):
    """Prediction-constrained GMM (Hughes et al., 2017; seed 003, Supplement E.2).

    A supervised diagonal GMM over ``(x, y)``: ``z ~ Cat(theta)``,
    ``x | z = k ~ N(mu_k, diag(sigma_k^2))``, ``y | z = k ~ Bern(eta_k)``, with the
    prediction ``p(y = 1 | x) = sum_k p(k | x) eta_k``. It maximises, by full-batch
    Adam in an unconstrained parametrisation (softmax weights, log scales, logit
    label probabilities),

        generative_weight * mean_n log p(x_n) + lam * mean_{labelled n} log p(y_n | x_n),

    from ``n_init`` starts, each the k-means-initialised EM fit of a
    :class:`~ppmix.GMM` on ``X`` (seeds ``seed, seed + 1, ...``) with ``eta_k`` the
    responsibility-weighted label mean; the start whose final objective is highest
    is kept. Unlabelled rows enter only the generative term.

    Parameters
    ----------
    n_components : int, default 4
    lam : float, default 10.0
        Weight ``lambda`` of the prediction term. The generative term is a sum over
        ``D`` features, so ``lambda`` must grow with ``D`` to matter.
    lr : float, default 0.05
        Adam learning rate.
    num_steps : int, default 500
        Most Adam steps per start.
    tol : float, default 1e-6
        A start stops early when the best objective of its last
        :data:`PC_PATIENCE` steps exceeds the best before them by at most
        ``tol * (1 + |objective|)``; ``0`` runs all ``num_steps``.
    generative_weight : float, default 1.0
        ``0`` drops the generative term (see :class:`PredictionOnlyGMM`).
    n_init : int, default 3
    reg_covar : float, default 1e-6
        Variance floor: ``sigma^2 = exp(2 s) + reg_covar``.
    seed : int, optional

    Attributes
    ----------
    weights_ : ndarray (K,)
    means_ : ndarray (K, D)
    covariances_ : ndarray (K, D)
        Variances.
    label_probs_ : ndarray (K,)
        ``eta_k = P(y = 1 | z = k)``.
    initial_objective_, objective_ : float
        Training objective of the kept start at its initialisation and after training.
    history_ : list of float
        Objective before every Adam step of the kept start.
    n_iter_ : int
        Adam steps the kept start took.
    converged_ : bool
        Whether it stopped by ``tol`` rather than ``num_steps``.

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = PCGMM(2, lam=5.0, num_steps=50, n_init=1, seed=0).fit(X, y)
    >>> model.initial_objective_ <= model.objective_, model.predict_proba(X).shape
    (True, (200, 2))
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        lam: float = 10.0,
        lr: float = 0.05,
        num_steps: int = 500,
        tol: float = 1e-6,
        generative_weight: float = 1.0,
        n_init: int = 3,
        reg_covar: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        self.n_components = n_components
        self.lam = lam
        self.lr = lr
        self.num_steps = num_steps
        self.tol = tol
        self.generative_weight = generative_weight
        self.n_init = n_init
        self.reg_covar = reg_covar
        self.seed = seed

    def _validate_params(self) -> None:
        check_positive_int(self.n_components, "n_components")
        check_positive_int(self.n_init, "n_init")
        check_positive_int(self.num_steps, "num_steps")
        for name in ("lam", "tol", "generative_weight", "reg_covar"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be non-negative; got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive; got {self.lr}")
        if self.lam == 0 and self.generative_weight == 0:
            raise ValueError("lam and generative_weight are both 0: the objective is empty")

    # ---------------------------------------------------------------- the objective
    def _log_joint(self, params: dict[str, torch.Tensor], data: CentredData) -> torch.Tensor:
        """``log theta_k + log N(x_n | mu_k, sigma_k)``, shape ``(N, K)``."""
        scale = (torch.exp(2 * params["log_scale"]) + self.reg_covar).sqrt()
        return DiagGaussian(params["loc"], scale).log_prob(data) + torch.log_softmax(params["logits"], 0)

    def _terms(
        self, params: dict[str, torch.Tensor], data: CentredData, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row ``log p(x_n)`` ``(N,)`` and ``log p(y | x)`` of the labelled rows."""
        log_joint = self._log_joint(params, data)
        log_px = torch.logsumexp(log_joint, 1)
        labelled = ~torch.isnan(y)
        log_post = log_joint[labelled] - log_px[labelled, None]
        eta = params["label_logit"]
        log_eta = torch.stack([torch.nn.functional.logsigmoid(-eta), torch.nn.functional.logsigmoid(eta)])  # (2, K)
        log_label = log_eta[y[labelled].long()]
        return log_px, torch.logsumexp(log_post + log_label, 1)

    def _objective(self, params: dict[str, torch.Tensor], data: CentredData, y: torch.Tensor) -> torch.Tensor:
        log_px, log_pyx = self._terms(params, data, y)
        return self.generative_weight * log_px.mean() + self.lam * log_pyx.mean()

    def objective(self, X: Any, y: Any) -> float:
        """The training objective at the fitted parameters on ``(X, y)`` (per point, as in :meth:`fit`)."""
        x = self._prepare(X)
        labels = torch.as_tensor(check_binary_labels(y, x.shape[0]))
        with torch.no_grad():
            return float(self._objective(self._params, CentredData.from_tensor(x), labels))

    # -------------------------------------------------------------------------- fit
    def _start(self, x: torch.Tensor, y: torch.Tensor, seed: int | None) -> dict[str, torch.Tensor]:
        """Parameters from an EM fit of a GMM on ``X`` and responsibility-weighted label means."""
        # EM needs a variance floor even when Adam's parametrisation does not (reg_covar = 0)
        gmm = GMM(self.n_components, seed=seed, reg_covar=max(self.reg_covar, 1e-6), progress=False).fit(x)
        resp = gmm.predict_proba(x)
        labelled = ~torch.isnan(y)
        eta = (resp[labelled].T @ y[labelled] + 0.5) / (resp[labelled].sum(0) + 1.0)
        variance = (gmm.covariances_ - self.reg_covar).clamp_min(1e-12)
        return {
            "logits": gmm.weights_.log(),
            "loc": gmm.means_.clone(),
            "log_scale": 0.5 * variance.log(),
            "label_logit": torch.logit(eta),
        }

    def _train(
        self, params: dict[str, torch.Tensor], data: CentredData, y: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], list[float], float, bool]:
        params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        optimizer = torch.optim.Adam(list(params.values()), lr=self.lr)
        history: list[float] = []
        converged = False
        for step in range(self.num_steps):
            optimizer.zero_grad()
            objective = self._objective(params, data, y)
            (-objective).backward()
            optimizer.step()
            history.append(objective.item())
            if step >= PC_PATIENCE:
                recent, before = max(history[-PC_PATIENCE:]), max(history[:-PC_PATIENCE])
                if recent - before <= self.tol * (1.0 + abs(recent)):
                    converged = True
                    break
        with torch.no_grad():
            final = float(self._objective(params, data, y))
        return {k: v.detach() for k, v in params.items()}, history, final, converged

    def fit(self, X: Any, y: Any) -> "PCGMM":
        """Adam on the prediction-constrained objective from ``n_init`` GMM starts; keep the best."""
        self._validate_params()
        x, labels = self._prepare_fit(X, y)
        data, y_t = CentredData.from_tensor(x), torch.as_tensor(labels)
        best = None
        for restart in range(self.n_init):
            start = self._start(x, y_t, None if self.seed is None else self.seed + restart)
            with torch.no_grad():
                initial = float(self._objective(start, data, y_t))
            params, history, final, converged = self._train(start, data, y_t)
            logger.debug("PCGMM start %d: objective %.6g -> %.6g", restart, initial, final)
            if not np.isfinite(final):
                continue
            if best is None or final > best[0]:
                best = (final, initial, params, history, converged)
        if best is None:
            raise RuntimeError("every PCGMM start diverged (non-finite objective); lower lr")
        self.objective_, self.initial_objective_, self._params, self.history_, self.converged_ = best
        self.n_iter_ = len(self.history_)
        self.classes_ = np.array([0, 1])
        return self

    # ---------------------------------------------------------------- attributes
    @property
    def weights_(self) -> np.ndarray:
        self._check_fitted()
        return torch.softmax(self._params["logits"], 0).numpy()

    @property
    def means_(self) -> np.ndarray:
        self._check_fitted()
        return self._params["loc"].numpy()

    @property
    def covariances_(self) -> np.ndarray:
        self._check_fitted()
        return (torch.exp(2 * self._params["log_scale"]) + self.reg_covar).numpy()

    @property
    def label_probs_(self) -> np.ndarray:
        self._check_fitted()
        return torch.sigmoid(self._params["label_logit"]).numpy()

    def _mixture_parameters(self) -> tuple[Any, Any, Any]:
        return self.weights_, self.means_, self.covariances_

    # --------------------------------------------------------------- predictions
    def predict_proba(self, X: Any) -> np.ndarray:
        """``p(y = 1 | x) = sum_k p(k | x) eta_k`` (and its complement), shape ``(N, 2)``."""
        x = self._prepare(X)
        with torch.no_grad():
            post = torch.softmax(self._log_joint(self._params, CentredData.from_tensor(x)), 1)
            p1 = post @ torch.sigmoid(self._params["label_logit"])
        return torch.stack([1 - p1, p1], 1).numpy()

    def score_samples(self, X: Any) -> np.ndarray:
        """``log p(x)`` per row under the fitted mixture."""
        x = self._prepare(X)
        with torch.no_grad():
            return torch.logsumexp(self._log_joint(self._params, CentredData.from_tensor(x)), 1).numpy()


class PredictionOnlyGMM(PCGMM):
    """The "pf-GMM (prediction term only)" of Supplement E.1/E.2: :class:`PCGMM` with the
    generative term dropped, i.e. Adam on ``mean log p(Y | X)`` alone.

    Parameters are those of :class:`PCGMM` without ``generative_weight`` (fixed to 0)
    and with ``lam = 1``. ``score_samples`` still reports ``log p(x)`` of the mixture
    it ends with, which nothing in training asks to be good.

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = PredictionOnlyGMM(2, num_steps=50, n_init=1, seed=0).fit(X, y)
    >>> model.generative_weight, model.predict_proba(X).shape
    (0.0, (200, 2))
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        lam: float = 1.0,
        lr: float = 0.05,
        num_steps: int = 500,
        tol: float = 1e-6,
        n_init: int = 3,
        reg_covar: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            n_components,
            lam=lam,
            lr=lr,
            num_steps=num_steps,
            tol=tol,
            generative_weight=0.0,
            n_init=n_init,
            reg_covar=reg_covar,
            seed=seed,
        )


# ----------------------------------------------------------------- sparse k-means
class SparseKMeansClassifier(_LabelBaseline):
    """Sparse k-means (Witten & Tibshirani, 2010) followed by logistic regression on the
    one-hot cluster labels ("sparse clustering" of seed 003, §7.1).

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
        self.n_clusters = n_clusters
        self.l1_bound = l1_bound
        self.n_permutations = n_permutations
        self.n_bounds = n_bounds
        self.n_init = n_init
        self.C = C
        self.seed = seed

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
        self.classes_ = np.array([0, 1])
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


# ------------------------------------------------------------------ random forest
class RandomForestBaseline(_LabelBaseline):
    """scikit-learn's ``RandomForestClassifier`` behind the baselines' API: the
    prediction upper bound of seed 003 (§7.1). Trained on the labelled rows only.

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
