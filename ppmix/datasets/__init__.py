"""Synthetic data generators (later issues add the papers' settings here)."""

from ppmix.datasets.blobs import make_gaussian_mixture
from ppmix.datasets.moe import MoEData, make_moe
from ppmix.datasets.pf import PFSyntheticData, bayes_label_limits, make_pf_synthetic, make_two_mixture
from ppmix.datasets.pf_hmm import PFHMMSyntheticData, make_pf_hmm_synthetic
from ppmix.datasets.presto import PrestoSyntheticData, make_presto_synthetic
from ppmix.datasets.rw import (
    ClusteringData,
    QuadraticRegressionData,
    make_outlier_clusters,
    make_quadratic_regressions,
    make_unbalanced_clusters,
)

__all__ = [
    "ClusteringData",
    "MoEData",
    "PFHMMSyntheticData",
    "PFSyntheticData",
    "PrestoSyntheticData",
    "QuadraticRegressionData",
    "bayes_label_limits",
    "make_gaussian_mixture",
    "make_moe",
    "make_outlier_clusters",
    "make_pf_hmm_synthetic",
    "make_pf_synthetic",
    "make_presto_synthetic",
    "make_quadratic_regressions",
    "make_two_mixture",
    "make_unbalanced_clusters",
]
