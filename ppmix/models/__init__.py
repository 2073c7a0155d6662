"""Generative mixture models: Pyro programs with ppmix's engines, and the baselines they are compared with."""

from ppmix.models.base import MixtureModel
from ppmix.models.gmm import GMM
from ppmix.models.hmm import HMM
from ppmix.models.moe import MixtureOfExperts
from ppmix.models.pf_analysis import likelihood_gaps, switch_prior_window
from ppmix.models.pf_baselines import (
    PCGMM,
    ClassSpecificGMM,
    PredictionOnlyGMM,
    RandomForestBaseline,
    SparseKMeansClassifier,
    TwoStep,
    TwoStepGMM,
    TwoStepHMM,
)
from ppmix.models.pf_gmm import PFGMM, SupervisedGMM
from ppmix.models.pf_gmm_gibbs import PFGMMGibbs
from ppmix.models.pf_hmm import PFHMM, SupervisedHMM

__all__ = [
    "GMM",
    "HMM",
    "PCGMM",
    "PFGMM",
    "PFGMMGibbs",
    "PFHMM",
    "ClassSpecificGMM",
    "MixtureModel",
    "MixtureOfExperts",
    "PredictionOnlyGMM",
    "RandomForestBaseline",
    "SparseKMeansClassifier",
    "SupervisedGMM",
    "SupervisedHMM",
    "TwoStep",
    "TwoStepGMM",
    "TwoStepHMM",
    "likelihood_gaps",
    "switch_prior_window",
]
