"""The hooks of variational-Bayes EM (``fit(X, engine="vb")``, :func:`ppmix.engines.vb.run_vb`) for the mixtures:
the components' factor by family (Normal-Wishart for Gaussian components, the family's conjugate posterior for
Poisson, exponential, Bernoulli and categorical ones), the start, and the fitted attributes."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ppmix.components.conjugate_vb import PLUG_INS, ConjugateMixture, supports_conjugate_vb
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_vb import NormalWishartMixture, normal_wishart_prior
from ppmix.engines.vb import ConjugateComponents, MixtureWeights, check_weight_prior, mean_weights
from ppmix.models._starts import start_responsibilities

__all__ = ["EFFECTIVE_WEIGHT", "VariationalMixture"]

#: a component counts in ``n_effective_components_`` when its weight exceeds this share of the data
EFFECTIVE_WEIGHT = 1e-2


class VariationalMixture:
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
        """The components' factor on the training rows: Normal-Wishart (Gaussian components, under
        ``component_prior``: :func:`~ppmix.components.gaussian_vb.normal_wishart_prior`) or the family's conjugate
        posterior (under its prior, set by ``priors``); else a ``ValueError`` naming the family."""
        family = self._component_family()  # type: ignore[attr-defined]
        if isinstance(family, GaussianFamily):
            prior = normal_wishart_prior(data, family.covariance_type, component_prior)
            floor = self._scale.get("floor", torch.tensor(family.reg_covar))  # type: ignore[attr-defined]
            return NormalWishartMixture(data, self.n_components, family.covariance_type, prior, floor)  # type: ignore[attr-defined]
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
        prepared = family.prepare(data)
        return ConjugateMixture(self._prior_family(), prepared, self.n_components, self._scale)  # type: ignore[attr-defined]

    def _vb_latent(self, data: torch.Tensor) -> MixtureWeights:
        """The weights' factor under the constructor's prior."""
        prior_type, k = self.weight_concentration_prior_type, int(self.n_components)  # type: ignore[attr-defined]
        return MixtureWeights(prior_type, check_weight_prior(prior_type, self.weight_concentration_prior, k))

    def _vb_initial_responsibilities(self, data: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The responsibilities of ``init_params``, as EM's start (k-means' clusters softened for the families that
        ask)."""
        family = self._component_family()  # type: ignore[attr-defined]
        resp = self._initial_responsibilities(family.prepare(data), generator)  # type: ignore[attr-defined]
        return resp if self.init_params == "random" else start_responsibilities(family, resp)  # type: ignore[attr-defined]

    def _vb_record(self, latent: MixtureWeights, components: Any) -> None:
        """The posterior means as the fitted parameters and the factors as ``variational_posterior_``."""
        self.weights_ = mean_weights(latent.concentration)
        self.components_ = components.components(self._scale.get("floor"))  # type: ignore[attr-defined]
        self.variational_posterior_ = {**latent.state(), **components.state()}
        self._invalidate_guide()  # type: ignore[attr-defined]

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
