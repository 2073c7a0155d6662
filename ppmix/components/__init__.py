"""Component families shared by every model and optimizer in ppmix.

Each family is a batch of ``K`` components with the protocol of
:class:`~ppmix.components.base.ComponentFamily`: ``log_prob -> (N, K)``, weighted
``fit(data, weights)``, ``pyro_dist``, ``sample``, ``kl`` (where closed-form),
``state_dict``/``load_state_dict`` and ``to(device, dtype)``. The density families that the
structures take (``Mixture(family=...)``, ``HMM(emission=...)``) are declared by
:class:`~ppmix.components.family.DensityFamily` and found by name in :mod:`ppmix.components.registry`.
"""

from ppmix.components.base import ComponentFamily, ParameterBatch
from ppmix.components.bernoulli import BernoulliLabel
from ppmix.components.categorical import CategoricalLabel
from ppmix.components.expert_family import ExpertFamily
from ppmix.components.family import (
    AdditiveStatistics,
    DensityFamily,
    MeanStatisticsComponents,
    SiteSpec,
    Statistics,
    WeightedSums,
)
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.gaussian_expert import GaussianExpert
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_full import FullGaussian
from ppmix.components.logistic_expert import LogisticExpert
from ppmix.components.poisson_expert import PoissonExpert
from ppmix.components.registry import register_family
from ppmix.components.softmax_expert import SoftmaxExpert
from ppmix.components.softmax_gate import SoftmaxGate

__all__ = [
    "AdditiveStatistics",
    "BernoulliLabel",
    "CategoricalLabel",
    "ComponentFamily",
    "DensityFamily",
    "DiagGaussian",
    "ExpertFamily",
    "FullGaussian",
    "GaussianExpert",
    "GaussianFamily",
    "LogisticExpert",
    "PoissonExpert",
    "MeanStatisticsComponents",
    "ParameterBatch",
    "SoftmaxExpert",
    "SiteSpec",
    "SoftmaxGate",
    "Statistics",
    "WeightedSums",
    "register_family",
]
