"""Synthetic data generators (later issues add the papers' settings here)."""

from ppmix.datasets.blobs import make_gaussian_mixture
from ppmix.datasets.presto import PrestoSyntheticData, make_presto_synthetic

__all__ = ["PrestoSyntheticData", "make_gaussian_mixture", "make_presto_synthetic"]
