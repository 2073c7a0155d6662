"""Regularized Weighting (Vainsencher, Mannor & Xu): robust learning of several models by weighting points."""

from ppmix.inference.optimizers.rw.estimator import RegularizedWeighting, WeightStepResult, joint_loss, solve_weights
from ppmix.inference.optimizers.rw.learners import (
    GaussianLearner,
    RegressionLearner,
    SquaredDistanceLearner,
    SubspaceLearner,
    WeightedLearner,
)

__all__ = [
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
