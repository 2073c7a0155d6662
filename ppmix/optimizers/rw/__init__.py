"""Regularized Weighting (Vainsencher, Mannor & Xu): robust learning of several models by weighting points."""

from ppmix.optimizers.rw.estimator import RegularizedWeighting
from ppmix.optimizers.rw.learners import (
    FamilyLearner,
    GaussianLearner,
    RegressionLearner,
    SquaredDistanceLearner,
    SubspaceLearner,
    WeightedLearner,
)
from ppmix.optimizers.rw.weights import WeightStepResult, joint_loss, solve_weights

__all__ = [
    "FamilyLearner",
    "GaussianLearner",
    "RegressionLearner",
    "RegularizedWeighting",
    "SquaredDistanceLearner",
    "SubspaceLearner",
    "WeightStepResult",
    "WeightedLearner",
    "joint_loss",
    "solve_weights",
]
