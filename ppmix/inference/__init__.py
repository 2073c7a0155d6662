"""Engines (EM, SVI, MCMC) and, in later modules, the non-generative optimizers."""

from ppmix.inference._result import ConvergenceWarning, FitResult
from ppmix.inference.em import run_em
from ppmix.inference.forward_backward import ForwardBackwardResult, forward_backward, viterbi
from ppmix.inference.mcmc import run_mcmc
from ppmix.inference.presto import PRESTO, greedy_capacity_assignment
from ppmix.inference.svi import run_svi

__all__ = [
    "ConvergenceWarning",
    "FitResult",
    "ForwardBackwardResult",
    "PRESTO",
    "forward_backward",
    "greedy_capacity_assignment",
    "run_em",
    "run_mcmc",
    "run_svi",
    "viterbi",
]
