"""Generative mixture models: Pyro programs with ppmix's engines."""

from ppmix.models.base import MixtureModel
from ppmix.models.gmm import GMM
from ppmix.models.hmm import HMM

__all__ = ["GMM", "HMM", "MixtureModel"]
