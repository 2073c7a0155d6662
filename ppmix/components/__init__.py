"""Component families shared by every model and optimizer in ppmix.

A density family is two classes: a :class:`~ppmix.components.family.DensityFamily` (the kind of component
and its settings, what ``Mixture(family=...)`` and ``HMM(emission=...)`` take; abstract: ``sites``) and its
fitted :class:`~ppmix.components.base.ComponentFamily` (``K`` components; abstract: ``log_prob -> (N, K)``,
``statistics``, ``fit_statistics``, ``pyro_dist``, ``sample``), whose statistics are a
:class:`~ppmix.components.family.Statistics` (``counts``, ``merge``, ``scaled``, ``to``). The two classes'
``__contract__`` lists every member a family writes or may override (15, six abstract; a family's priors are one
:class:`~ppmix.components.family.FamilyPriors`, its components' means and covariances one
:class:`~ppmix.components.base.Moments`); what the structures derive from them is in
:mod:`ppmix.components.family_tools`, closed-form divergences between components are registered by class pairs
(:func:`register_kl`, :func:`kl_divergence`), and a family's prepared data other than the rows is a
:class:`~ppmix.components.family.PreparedRows`. Families are found
by name in :mod:`ppmix.components.registry`; :func:`register_family` (or the ``ppmix.families`` entry point of
an installed package) adds a user's, and :func:`ppmix.testing.check_family` checks one. Every batch of
components (labels, experts, gates too) is a :class:`~ppmix.components.base.ParameterBatch`.
"""

from ppmix.components.autoregressive import AutoRegressiveComponents, AutoRegressiveFamily
from ppmix.components.base import ComponentFamily, Moments, ParameterBatch
from ppmix.components.bernoulli_label import BernoulliLabel
from ppmix.components.categorical_label import CategoricalLabel
from ppmix.components.columns import Independent
from ppmix.components.divergence import kl_divergence, register_kl
from ppmix.components.expert_family import ExpertFamily
from ppmix.components.family import (
    AdditiveStatistics,
    DensityFamily,
    FamilyPriors,
    MeanStatisticsComponents,
    PreparedRows,
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
    "AutoRegressiveComponents",
    "AutoRegressiveFamily",
    "BernoulliLabel",
    "CategoricalLabel",
    "ComponentFamily",
    "DensityFamily",
    "DiagGaussian",
    "ExpertFamily",
    "FamilyPriors",
    "FullGaussian",
    "GaussianExpert",
    "GaussianFamily",
    "Independent",
    "LogisticExpert",
    "PoissonExpert",
    "MeanStatisticsComponents",
    "Moments",
    "ParameterBatch",
    "PreparedRows",
    "SoftmaxExpert",
    "SiteSpec",
    "SoftmaxGate",
    "Statistics",
    "WeightedSums",
    "kl_divergence",
    "register_family",
    "register_kl",
]
