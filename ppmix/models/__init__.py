"""Generative mixture models: Pyro programs with ppmix's engines."""

from ppmix.models.base import MixtureModel
from ppmix.models.gmm import GMM

__all__ = ["GMM", "MixtureModel"]
