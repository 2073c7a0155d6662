"""The MCMC engine: Pyro's NUTS over the continuous globals, discrete latents enumerated."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide import init_to_median, init_to_value

from ppmix._validation import check_positive_int
from ppmix.inference.engines.params import local_params
from ppmix.inference.engines.result import FitResult

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["run_mcmc"]

logger = logging.getLogger(__name__)


def run_mcmc(
    model: "MixtureModel",
    data: Any,
    *,
    num_samples: int = 200,
    warmup_steps: int = 200,
    num_chains: int = 1,
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 8,
    progress: bool | None = None,
) -> FitResult:
    """Sample the posterior of the global sites with NUTS.

    The model runs under :meth:`MixtureModel.bayesian` (proper priors); discrete
    latents are summed out by enumeration. Chains start at ``model.init_values``
    (the EM initialisation for models with EM). The draws are kept in
    ``model.mcmc_samples_`` (``{site: (chains, draws, ...)}``) and the point
    estimates are set to their posterior means; :meth:`MixtureModel.to_arviz`
    turns them into ``InferenceData``.

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> x = torch.cat([torch.randn(30, 1) - 3, torch.randn(30, 1) + 3])
    >>> gmm = GMM(2, seed=0, progress=False).fit(x, engine="mcmc", num_samples=10, warmup_steps=10)
    >>> gmm.mcmc_samples_["locs"].shape
    torch.Size([1, 10, 2, 1])
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    warmup_steps = check_positive_int(warmup_steps, "warmup_steps")
    num_chains = check_positive_int(num_chains, "num_chains")
    show = model.progress if progress is None else progress


    with local_params(), model.bayesian(), model.forked_rng():
        init = model.init_values(data, model.generator())
        kernel = NUTS(
            model.model,
            max_plate_nesting=model.max_plate_nesting,
            target_accept_prob=target_accept_prob,
            max_tree_depth=max_tree_depth,
            init_strategy=init_to_value(values=init, fallback=init_to_median) if init else init_to_median,
        )
        mcmc = MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            num_chains=num_chains,
            disable_progbar=not show,
        )
        mcmc.run(data)
    samples = {k: v.detach() for k, v in mcmc.get_samples(group_by_chain=True).items()}
    model.mcmc_samples_ = samples
    model.set_globals({k: v.mean(dim=(0, 1)) for k, v in samples.items()})
    diagnostics = mcmc.diagnostics()
    logger.info(
        "NUTS finished: %d chains x %d draws; divergences %s", num_chains, num_samples, diagnostics.get("divergences")
    )
    return FitResult(history=[], n_iter=num_samples, converged=True)
