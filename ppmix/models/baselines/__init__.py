"""Baselines the prediction-focused models are compared with (Sharma et al., 2023, §7.1, Supplement E.1–E.2, F).

Every baseline has the same API: ``fit(X, y)`` with binary labels ``y`` in {0, 1} and NaN for a missing
label (rows without a label are used only by the unsupervised parts), ``predict_proba(X) -> (N, 2)`` and
``predict(X)``; the generative ones add ``score_samples(X)`` (``log p(x)`` per row) and
``log_likelihood_relevant(X, mask)`` (``log p(x_R)`` per row, the exact marginal of the fitted density on the
features in ``mask``). One module per family: ``two_step`` (:class:`TwoStep`, :func:`TwoStepGMM`,
:func:`TwoStepHMM`), ``class_specific`` (:class:`ClassSpecificGMM`), ``prediction_constrained``
(:class:`PCGMM`, :class:`PredictionOnlyGMM`), ``sparse_kmeans_classifier`` (:class:`SparseKMeansClassifier`,
on the algorithm in ``sparse_kmeans``) and ``random_forest`` (:class:`RandomForestBaseline`, the prediction
upper bound). They load on first use (the random forest pulls in ``sklearn.ensemble``).
"""

from ppmix._lazy import lazy_exports

_PACKAGE = "ppmix.models.baselines"
_EXPORTS = {
    "TwoStep": f"{_PACKAGE}.two_step",
    "TwoStepGMM": f"{_PACKAGE}.two_step",
    "TwoStepHMM": f"{_PACKAGE}.two_step",
    "ClassSpecificGMM": f"{_PACKAGE}.class_specific",
    "PCGMM": f"{_PACKAGE}.prediction_constrained",
    "PredictionOnlyGMM": f"{_PACKAGE}.prediction_constrained",
    "SparseKMeansClassifier": f"{_PACKAGE}.sparse_kmeans_classifier",
    "RandomForestBaseline": f"{_PACKAGE}.random_forest",
    "check_binary_labels": f"{_PACKAGE}._base",
    "gaussian_mixture_marginal_log_prob": f"{_PACKAGE}._base",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
