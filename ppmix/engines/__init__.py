"""Engines that fit a :class:`~ppmix.models.MixtureModel`: EM, SVI, MCMC, blocked Gibbs for conjugate priors and
the pf-GMM Gibbs sampler. They sit below :mod:`ppmix.models` (models call them through the small protocols of
:mod:`.capabilities`); the recursions and samplers they use (forward–backward, Viterbi, FFBS, Newton) are in
:mod:`ppmix.algorithms`, below them."""

from ppmix.engines.conjugate_gibbs import run_gibbs
from ppmix.engines.em import run_em
from ppmix.engines.mcmc import run_mcmc
from ppmix.engines.result import ConvergenceWarning, FitResult
from ppmix.engines.svi import run_svi
from ppmix.engines.vb import run_vb

__all__ = [
    "ConvergenceWarning",
    "FitResult",
    "run_em",
    "run_gibbs",
    "run_mcmc",
    "run_svi",
    "run_vb",
]
