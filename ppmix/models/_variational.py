"""The hooks of variational-Bayes EM (``fit(X, engine="vb")``, :func:`ppmix.engines.vb.run_vb`) for the mixtures
and the HMM: the components' factor by family (Normal-Wishart for Gaussian components, the family's conjugate
posterior for Poisson, exponential, Bernoulli and categorical ones), the latent factor (the weights; the chain), the
start, and the fitted attributes."""

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

__all__ = ["EFFECTIVE_WEIGHT", "VariationalHMM", "VariationalMixture"]

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


class _SavedPosterior:
    """Saves and loads ``variational_posterior_`` (the factors of an ``engine="vb"`` fit) with the model."""

    def _extra_state(self) -> dict[str, Any]:
        """The fit's extra state, with the variational factors of an ``engine="vb"`` fit."""
        extra = super()._extra_state()  # type: ignore[misc]
        if getattr(self, "engine_", None) == "vb":
            extra["variational_posterior"] = {k: v.tolist() for k, v in self.variational_posterior_.items()}
        return extra

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)  # type: ignore[misc]
        if "variational_posterior" in state:
            opts = {"dtype": self.dtype, "device": self._device}  # type: ignore[attr-defined]
            self.variational_posterior_ = {
                k: torch.tensor(v, **opts) for k, v in state["variational_posterior"].items()
            }


class VariationalMixture(_SavedPosterior):
    """Variational-Bayes EM for a mixture (a mixin of :class:`~ppmix.models.mixture.Mixture`): its constructor takes
    ``weight_concentration_prior_type`` and ``weight_concentration_prior``."""

    weight_concentration_prior_type: str = "dirichlet_process"
    weight_concentration_prior: float | None = None

    @property
    def n_effective_components_(self) -> int:
        """The components whose weight exceeds :data:`EFFECTIVE_WEIGHT` (1 % of the data), whatever the engine."""
        self._check_fitted()  # type: ignore[attr-defined]
        return int((self.weights_ > EFFECTIVE_WEIGHT).sum())  # type: ignore[attr-defined]

    def _vb_components(self, data: torch.Tensor, component_prior: Mapping[str, Any] | None) -> ConjugateComponents:
        """The components' factor on the training rows (:func:`components_factor`)."""
        return components_factor(self, data, component_prior)

    def _vb_latent(self, data: torch.Tensor) -> MixtureWeights:
        """The weights' factor under the constructor's prior."""
        prior_type, k = self.weight_concentration_prior_type, int(self.n_components)  # type: ignore[attr-defined]
        return MixtureWeights(prior_type, check_weight_prior(prior_type, self.weight_concentration_prior, k))

    def _vb_initial_responsibilities(self, data: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The responsibilities of ``init_params`` (:func:`start_responsibilities_of`)."""
        return start_responsibilities_of(self, data, generator)

    def _vb_record(self, latent: MixtureWeights, components: Any) -> None:
        """The posterior means as the fitted parameters and the factors as ``variational_posterior_``."""
        self.weights_ = mean_weights(latent.concentration)
        self.components_ = components.components(self._scale.get("floor"))  # type: ignore[attr-defined]
        self.variational_posterior_ = {**latent.state(), **components.state()}
        self._invalidate_guide()  # type: ignore[attr-defined]


class VariationalHMM(_SavedPosterior):
    """Variational-Bayes EM for an HMM (a mixin of :class:`~ppmix.models.hmm.HMM`): ``Dirichlet`` priors of
    concentration ``weight_concentration_prior`` (default ``1 / K``, as hmmlearn's variational HMMs) on the initial
    distribution and on every transition row, the emissions' factor as a mixture's (:func:`components_factor`), the
    forward-backward E-step under the expected log parameters (:class:`~ppmix.engines.vb.MarkovChainFactor`)."""

    weight_concentration_prior_type: str = "dirichlet_distribution"
    weight_concentration_prior: float | None = None

    @property
    def n_effective_components_(self) -> int:
        """After ``engine="vb"``: the states that explain more than :data:`EFFECTIVE_WEIGHT` (1 %) of the training
        steps (``state_occupancy_``)."""
        self._check_fitted()  # type: ignore[attr-defined]
        if getattr(self, "state_occupancy_", None) is None:
            raise AttributeError("n_effective_components_ is set by fit(X, engine='vb')")
        return int((self.state_occupancy_ > EFFECTIVE_WEIGHT).sum())

    def _vb_latent(self, data: Any) -> MarkovChainFactor:
        """The chain's factor on the batch's valid steps; a transition pattern or per-entry transition concentrations
        are refused (``ValueError`` naming them)."""
        chain_settings = (self.transition_pattern, (self.priors or {}).get("transition"), self.transition_prior)  # type: ignore[attr-defined]
        if chain_settings != (None, None, 1.0):
            raise ValueError(
                "engine='vb' takes the chain's concentration from weight_concentration_prior; transition_pattern, "
                "transition_prior and priors['transition'] are for the other engines (leave them at their defaults)"
            )
        if self.weight_concentration_prior_type != "dirichlet_distribution":
            raise ValueError(
                "weight_concentration_prior_type must be 'dirichlet_distribution' for an HMM (its initial "
                f"distribution's prior); got {self.weight_concentration_prior_type!r}"
            )
        k = int(self.n_components)  # type: ignore[attr-defined]
        alpha = check_weight_prior("dirichlet_distribution", self.weight_concentration_prior, k)
        return MarkovChainFactor(data.mask, data.lengths, alpha, alpha)

    def _vb_rows(self, data: Any) -> torch.Tensor:
        return self._step_rows(data)[data.mask]  # type: ignore[attr-defined]

    def _vb_components(self, data: Any, component_prior: Mapping[str, Any] | None) -> ConjugateComponents:
        """The emissions' factor on the valid steps (:func:`components_factor`)."""
        return components_factor(self, self._vb_rows(data), component_prior)

    def _vb_initial_responsibilities(self, data: Any, generator: torch.Generator) -> torch.Tensor:
        """The responsibilities of ``init_params`` on the valid steps (:func:`start_responsibilities_of`)."""
        return start_responsibilities_of(self, self._vb_rows(data), generator)

    def _vb_record(self, latent: MarkovChainFactor, components: Any) -> None:
        """The posterior means as ``initial_``, ``transition_`` and the emissions, the factors as
        ``variational_posterior_`` and every state's share of the training steps as ``state_occupancy_``."""
        self.initial_ = latent.initial / latent.initial.sum()
        self.transition_ = latent.transition / latent.transition.sum(-1, keepdim=True)
        self.components_ = components.components(self._scale.get("floor"))  # type: ignore[attr-defined]
        self.variational_posterior_ = {**latent.state(), **components.state()}
        self.state_occupancy_ = latent.occupancy / latent.occupancy.sum()
        self._invalidate_guide()  # type: ignore[attr-defined]
