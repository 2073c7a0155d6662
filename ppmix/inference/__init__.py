"""Engines (EM, SVI, MCMC, the pf-GMM Gibbs sampler), the OT reduction and the non-generative optimizers."""

from ppmix.inference._learners import (
    GaussianLearner,
    RegressionLearner,
    SquaredDistanceLearner,
    SubspaceLearner,
    WeightedLearner,
)
from ppmix.inference._result import ConvergenceWarning, FitResult
from ppmix.inference._simplex import project_simplex
from ppmix.inference.em import run_em
from ppmix.inference.forward_backward import ForwardBackwardResult, forward_backward, viterbi
from ppmix.inference.mcmc import run_mcmc
from ppmix.inference.ot_reduction import (
    align_experts,
    middle_estimator,
    ot_reduce,
    transport_divergence,
    weighted_average_estimator,
)
from ppmix.inference.presto import PRESTO, greedy_capacity_assignment
from ppmix.inference.presto_components import LinearSVMComponent, MLPComponent, TorchComponent
from ppmix.inference.rw import RegularizedWeighting, WeightStepResult, joint_loss, solve_weights
from ppmix.inference.svi import run_svi

__all__ = [
    "ConvergenceWarning",
    "FitResult",
    "ForwardBackwardResult",
    "GaussianLearner",
    "LinearSVMComponent",
    "MLPComponent",
    "PRESTO",
    "RegressionLearner",
    "RegularizedWeighting",
    "SquaredDistanceLearner",
    "SubspaceLearner",
    "TorchComponent",
    "WeightStepResult",
    "WeightedLearner",
    "align_experts",
    "forward_backward",
    "greedy_capacity_assignment",
    "joint_loss",
    "middle_estimator",
    "ot_reduce",
    "project_simplex",
    "run_em",
    "run_mcmc",
    "run_svi",
    "solve_weights",
    "transport_divergence",
    "viterbi",
    "weighted_average_estimator",
]
