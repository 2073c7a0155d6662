"""Build ArviZ ``InferenceData`` for any fitted ``MixtureModel`` from plain dicts.

``az.from_pyro`` accepts only MCMC objects, so ppmix assembles the groups itself:
draws of the global sites (MCMC draws, draws from the SVI guide, or the single
point estimate), the pointwise log-likelihood and the discrete-latent posterior
for every draw, and the observed data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pyro.infer.autoguide import AutoNormal

from ppmix.inference.engines.params import local_params

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel


def global_draws(model: "MixtureModel", data: Any, num_samples: int) -> dict[str, torch.Tensor]:
    """Draws of every global site with leading ``(chain, draw)`` dimensions."""
    samples = getattr(model, "mcmc_samples_", None)
    if model.engine_ == "mcmc" and samples:
        return samples
    guide = model.variational_guide_
    if model.engine_ == "svi" and isinstance(guide, AutoNormal):
        with local_params(), torch.no_grad(), model.forked_rng(offset=1):
            draws = [guide(data) for _ in range(num_samples)]
        return {k: torch.stack([d[k] for d in draws])[None] for k in draws[0]}
    return {k: v[None, None] for k, v in model.get_globals().items()}


def build_inference_data(model: "MixtureModel", data: Any, num_samples: int = 100) -> Any:
    """``InferenceData`` with posterior, log_likelihood, observed_data and discrete_posterior groups."""
    import arviz as az

    draws = global_draws(model, data, num_samples)
    n_chains, n_draws = next(iter(draws.values())).shape[:2]
    saved_state, saved_guide = model.state_tensors(), model._guide_cache
    loglik, discrete = [], {}
    try:
        for c in range(n_chains):
            for d in range(n_draws):
                model.set_globals({k: v[c, d] for k, v in draws.items()})
                loglik.append(model.pointwise_log_likelihood(data).detach().cpu().numpy())
                for name, probs in model.posterior_marginals(data).items():
                    discrete.setdefault(name, []).append(probs.detach().cpu().numpy())
    finally:  # the fitted state and guide (e.g. a trained AutoNormal) are left exactly as they were
        model.load_state_tensors(saved_state)
        model._set_guide(saved_guide)

    def per_draw(arrays: list[np.ndarray]) -> np.ndarray:
        stacked = np.stack(arrays)
        return stacked.reshape(n_chains, n_draws, *stacked.shape[1:])

    observed = {k: v.detach().cpu().numpy() for k, v in model.observed_data(data).items()}
    obs_name = next(iter(observed))
    dims = dict(model.arviz_dims())
    coords: dict[str, Any] = {}
    names = model.feature_names_in_
    if names is not None and len(names) == observed[obs_name].shape[-1]:
        coords["feature"] = names
        dims[obs_name] = ["obs_id", "feature"]
    idata = az.from_dict(
        posterior={k: v.detach().cpu().numpy() for k, v in draws.items()},
        log_likelihood={obs_name: per_draw(loglik)},
        observed_data=observed,
        coords=coords or None,
        dims=dims or None,
    )
    if discrete:
        discrete_ds = az.dict_to_dataset(
            {f"{name}_probs": per_draw(values) for name, values in discrete.items()},
            dims={f"{name}_probs": ["obs_id", "component"] for name in discrete},
        )
        idata.add_groups({"discrete_posterior": discrete_ds})
    return idata
