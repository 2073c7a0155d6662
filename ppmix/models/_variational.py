"""Variational-Bayes EM (``fit(X, engine="vb")``, :func:`ppmix.engines.vb.run_vb`) for the mixtures and the HMM,
as functions of the model that their ``_vb_*`` hooks call: the components' factor by family (Normal-Wishart for
Gaussian components, the family's conjugate posterior for Poisson, exponential, Bernoulli and categorical ones), the
latent factor (the weights; the chain), the start, and the fitted attributes (with ``variational_posterior_``,
which :class:`~ppmix.models._family_components.FamilyModel` saves)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ppmix.components.conjugate_vb import PLUG_INS, ConjugateMixture, supports_conjugate_vb
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_vb import NormalWishartMixture, normal_wishart_prior
from ppmix.engines.vb import (
    ConjugateComponents,
    MarkovChainFactor,
    MixtureWeights,
    check_weight_prior,
    mean_weights,
)
from ppmix.models._starts import start_responsibilities

__all__ = [
    "EFFECTIVE_WEIGHT",
    "chain_factor",
    "components_factor",
    "effective_components",
    "record_chain",
    "record_weights",
    "start_responsibilities_of",
    "weights_factor",
]

#: a component counts in ``n_effective_components_`` when its weight exceeds this share of the data
EFFECTIVE_WEIGHT = 1e-2


def components_factor(model: Any, rows: torch.Tensor, component_prior: Mapping[str, Any] | None) -> ConjugateComponents:
    """The components' factor of ``model`` on the training ``rows`` ``(N, D)``: Normal-Wishart (Gaussian components,
    under ``component_prior``: :func:`~ppmix.components.gaussian_vb.normal_wishart_prior`) or the family's conjugate
    posterior (under its prior, set by the model's ``priors``); else a ``ValueError`` naming the family."""
    family = model._component_family()
    if isinstance(family, GaussianFamily):
        prior = normal_wishart_prior(rows, family.covariance_type, component_prior)
        floor = model._scale.get("floor", torch.tensor(family.reg_covar))
        return NormalWishartMixture(rows, int(model.n_components), family.covariance_type, prior, floor)
    if not supports_conjugate_vb(family):
        raise ValueError(
            f"engine='vb' needs Gaussian components or a family with a conjugate prior among {sorted(PLUG_INS)}; "
            f"got the {family.name!r} family"
        )
    if component_prior is not None:
        raise ValueError(
            f"component_prior is for Gaussian components; the {family.name!r} family's conjugate prior is set by "
            "the model's priors= (its keys: prior_keys())"
        )
    return ConjugateMixture(model._prior_family(), rows, int(model.n_components), model._scale)


def start_responsibilities_of(model: Any, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The responsibilities of the model's ``init_params`` on ``rows``, as EM's start (k-means' clusters softened for
    the families that ask)."""
    family = model._component_family()
    resp = model._initial_responsibilities(family.prepare(rows), generator)
    return resp if model.init_params == "random" else start_responsibilities(family, resp)


def weights_factor(model: Any) -> MixtureWeights:
    """A mixture's weights factor under its constructor's prior (``weight_concentration_prior_type``, ``_prior``)."""
    prior_type, k = model.weight_concentration_prior_type, int(model.n_components)
    return MixtureWeights(prior_type, check_weight_prior(prior_type, model.weight_concentration_prior, k))


def record_weights(model: Any, latent: MixtureWeights, components: Any) -> None:
    """A mixture's posterior means as its fitted parameters, and the factors as ``variational_posterior_``."""
    model.weights_ = mean_weights(latent.concentration)
    model.components_ = components.components(model._scale.get("floor"))
    model.variational_posterior_ = {**latent.state(), **components.state()}
    model._invalidate_guide()


def chain_factor(model: Any, data: Any) -> MarkovChainFactor:
    """An HMM's chain factor on the batch's valid steps: ``Dirichlet`` priors of concentration
    ``weight_concentration_prior`` (default ``1 / K``, as hmmlearn's variational HMMs) on the initial distribution
    and every transition row; a transition pattern, transition priors, input-driven transitions or a stick-breaking
    prior are refused (``ValueError`` naming them)."""
    chain_settings = (model.transition_pattern, (model.priors or {}).get("transition"), model.transition_prior)
    if chain_settings != (None, None, 1.0) or model.transitions != "homogeneous":
        raise ValueError(
            "engine='vb' takes the chain's concentration from weight_concentration_prior; transition_pattern, "
            "transition_prior, priors['transition'] and transitions='input-driven' are for the other engines (leave "
            "them at their defaults)"
        )
    if model.weight_concentration_prior_type != "dirichlet_distribution":
        raise ValueError(
            "weight_concentration_prior_type must be 'dirichlet_distribution' for an HMM (its initial "
            f"distribution's prior); got {model.weight_concentration_prior_type!r}"
        )
    k = int(model.n_components)
    alpha = check_weight_prior("dirichlet_distribution", model.weight_concentration_prior, k)
    return MarkovChainFactor(data.mask, data.lengths, alpha, alpha)


def record_chain(model: Any, latent: MarkovChainFactor, components: Any) -> None:
    """An HMM's posterior means as ``initial_``, ``transition_`` and the emissions, the factors as
    ``variational_posterior_`` and every state's share of the training steps as ``state_occupancy_``."""
    model.initial_ = latent.initial / latent.initial.sum()
    model.transition_ = latent.transition / latent.transition.sum(-1, keepdim=True)
    model.components_ = components.components(model._scale.get("floor"))
    model.variational_posterior_ = {**latent.state(), **components.state()}
    model.state_occupancy_ = latent.occupancy / latent.occupancy.sum()
    model._invalidate_guide()


def effective_components(shares: torch.Tensor) -> int:
    """How many components hold more than :data:`EFFECTIVE_WEIGHT` (1 %) of the data, given their ``shares``."""
    return int((shares > EFFECTIVE_WEIGHT).sum())
