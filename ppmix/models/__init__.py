"""Generative mixture models: Pyro programs with ppmix's engines, and the baselines they are compared with.

``ppmix.models.pf`` holds the prediction-focused models, ``ppmix.models.baselines`` their
baselines (one module each). The names below load on first use.
"""

from ppmix._lazy import lazy_exports

_BASELINES = "ppmix.models.baselines"
_PF = "ppmix.models.pf"
_EXPORTS = {
    "MixtureModel": "ppmix.models.base",
    "Mixture": "ppmix.models.mixture",
    "GMM": "ppmix.models.gmm",
    "HMM": "ppmix.models.hmm",
    "HSMM": "ppmix.models.hsmm",
    "MixtureOfExperts": "ppmix.models.moe",
    "FlatPriorError": "ppmix.models._flat",
    "PointEstimateWarning": "ppmix.models._arviz",
    "ComponentSelection": "ppmix.models.selection",
    "select_components": "ppmix.models.selection",
    "latent_posterior": "ppmix.models._predictions",
    **dict.fromkeys(
        [
            "PFGMM",
            "SupervisedGMM",
            "PFHMM",
            "SupervisedHMM",
            "PFGMMGibbs",
            "likelihood_gaps",
            "switch_prior_window",
        ],
        _PF,
    ),
    **dict.fromkeys(
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
        _BASELINES,
    ),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
