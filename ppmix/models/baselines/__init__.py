"""Baselines the prediction-focused models are compared with (two-step, class-specific, prediction-constrained,
sparse k-means, random forest). They load on first use (the random forest pulls in ``sklearn.ensemble``)."""

from ppmix._lazy import lazy_exports

_EXPORTS = dict.fromkeys(
    [
        "PCGMM",
        "ClassSpecificGMM",
        "PredictionOnlyGMM",
        "RandomForestBaseline",
        "SparseKMeansClassifier",
        "TwoStep",
        "TwoStepGMM",
        "TwoStepHMM",
    ],
    "ppmix.models.baselines.estimators",
)
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
