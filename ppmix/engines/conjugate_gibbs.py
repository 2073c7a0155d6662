"""The blocked Gibbs engine (``engine="gibbs"``): for models whose priors are conjugate, every chain
alternates exact draws of the global parameters given the latent assignments (or state paths) and of the
latents given the globals, all chains at once as tensors.

A model offers it by the :class:`~ppmix.engines.capabilities.ConjugateGibbs` hook, which builds its sampler (the
mixture's and the HMM's of a family with a conjugate prior: :mod:`ppmix.models._gibbs`). The draws are
kept as MCMC's are (``mcmc_samples_``, relabelled, r_hat in ``mcmc_diagnostics_``), with the log joint
density of every draw, ``log p(x | theta) + log p(theta)`` (the latents summed out: the quantity NUTS
samples on), in ``gibbs_log_joint_`` ``(chains, draws)``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from ppmix._validation import check_positive_int
from ppmix.engines.capabilities import ConjugateGibbs
from ppmix.engines.chain_starts import warn_single_chain
from ppmix.engines.draws import keep_draws
from ppmix.engines.params import local_params
from ppmix.engines.result import FitResult

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["run_gibbs"]

logger = logging.getLogger(__name__)


def run_gibbs(
    model: "MixtureModel",
    data: Any,
    *,
    num_samples: int = 1000,
    warmup_steps: int = 500,
    num_chains: int = 4,
    relabel: bool = True,
) -> FitResult:
    """Sample the posterior of the global sites by blocked Gibbs sweeps, ``num_chains`` chains at once.

    Every chain starts from its own point (:func:`~ppmix.engines.chain_starts.chain_starts`: chain 0 at
    ``model._init_values``, the EM start, every other chain at an initialisation of its own seed, as NUTS's
    chains) with its own draw of the latents given it, so chains in different modes of the posterior show in
    r_hat (a :class:`~ppmix.engines.draws.ChainsDisagreeWarning` names the sites); one chain warns
    (:class:`~ppmix.engines.chain_starts.SingleChainWarning`: r_hat is NaN). Every chain runs
    ``warmup_steps + num_samples`` sweeps; the last ``num_samples`` are kept in ``model.mcmc_samples_``
    (``{site: (chains, draws, ...)}``), relabelled as
    :func:`~ppmix.engines.mcmc.run_mcmc` relabels its draws, and the point estimates are
    set to their posterior means. A sweep costs about one EM iteration per chain and its draws are
    exact conditionals: no step size, no rejections.

    Parameters
    ----------
    model : MixtureModel
        A Mixture, GMM or HMM whose family has conjugate priors; usually called by
        ``model.fit(X, engine="gibbs")``.
    data : Any
        The data as the model's ``prepare_data`` returns it.
    num_samples : int, default 1000
        Draws kept per chain.
    warmup_steps : int, default 500
        Sweeps discarded per chain before them.
    num_chains : int, default 4
        Chains, run together.
    relabel : bool, default True
        Relabel the draws against label switching, as :func:`run_mcmc` does.

    Returns
    -------
    FitResult
        Empty ``history``; ``n_iter`` is ``num_samples``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.poisson(2.0, (100, 1)), rng.poisson(12.0, (100, 1))]
    >>> mix = Mixture(2, family="poisson", seed=0, progress=False)
    >>> _ = mix.fit(X, engine="gibbs", num_samples=200, warmup_steps=50, num_chains=2)
    >>> mix.mcmc_samples_["rate"].shape, np.round(np.sort(mix.means_[:, 0].numpy()))
    (torch.Size([2, 200, 2, 1]), array([ 2., 12.]))
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    warmup_steps = check_positive_int(warmup_steps, "warmup_steps")
    num_chains = check_positive_int(num_chains, "num_chains")
    if not isinstance(model, ConjugateGibbs):
        raise ValueError(
            f"engine='gibbs' needs conjugate priors (Mixture, GMM and HMM whose family has one); "
            f"{type(model).__name__} has none (use engine='mcmc')"
        )
    warn_single_chain(num_chains, "gibbs")
    kept: list[dict[str, torch.Tensor]] = []
    log_joint: list[torch.Tensor] = []
    # torch's global generator, seeded from the model's seed, draws every conditional: hold it alone as the other
    # engines do (two threads with the same seed draw what one thread draws)
    with local_params(), model.bayesian(), model._forked_rng():
        sampler = model._gibbs_sampler()
        latent = sampler.start(data, num_chains, model._generator())
        for sweep in range(warmup_steps + num_samples):
            values, joint, latent = sampler.sweep(data, latent)
            if sweep >= warmup_steps:
                kept.append(values)
                log_joint.append(joint)
    samples = {site: torch.stack([draw[site] for draw in kept], dim=1) for site in kept[0]}
    model.gibbs_log_joint_ = torch.stack(log_joint, dim=1)
    keep_draws(model, data, samples, relabel)
    logger.info("Gibbs finished: %d chains x %d draws (%d warmup sweeps)", num_chains, num_samples, warmup_steps)
    return FitResult(history=[], n_iter=num_samples, converged=True)
