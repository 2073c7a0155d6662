"""Prediction-focused mixtures (Sharma et al.): feature switches, pf-GMM, pf-HMM, the Gibbs sampler and the
analytic switch-prior window."""

from ppmix.models.pf.analysis import likelihood_gaps, switch_prior_window
from ppmix.models.pf.gibbs import PFGMMGibbs
from ppmix.models.pf.pf_gmm import PFGMM, SupervisedGMM
from ppmix.models.pf.pf_hmm import PFHMM, SupervisedHMM

__all__ = ["PFGMM", "PFGMMGibbs", "PFHMM", "SupervisedGMM", "SupervisedHMM", "likelihood_gaps", "switch_prior_window"]
