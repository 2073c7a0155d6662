"""Engines that fit a :class:`~ppmix.models.MixtureModel`: EM, SVI, MCMC, blocked Gibbs for conjugate priors, and
the exact recursions and samplers they use (batched forward–backward and Viterbi, forward filtering backward
sampling, the pf-GMM Gibbs sampler)."""

from ppmix.inference.engines.conjugate_gibbs import run_gibbs
from ppmix.inference.engines.em import run_em
from ppmix.inference.engines.forward_backward import ForwardBackwardResult, forward_backward, viterbi
from ppmix.inference.engines.mcmc import run_mcmc
from ppmix.inference.engines.result import ConvergenceWarning, FitResult
from ppmix.inference.engines.svi import run_svi

__all__ = [
    "ConvergenceWarning",
    "FitResult",
    "ForwardBackwardResult",
    "forward_backward",
    "run_em",
    "run_gibbs",
    "run_mcmc",
    "run_svi",
    "viterbi",
]
