"""Synthetic data generators (later issues add the papers' settings here)."""

from ppmix.datasets.blobs import make_gaussian_mixture

__all__ = ["make_gaussian_mixture"]
