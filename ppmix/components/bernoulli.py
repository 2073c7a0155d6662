"""The Bernoulli family: ``K`` components over ``D`` independent binary features, ``x_d ~ Bernoulli(probs_kd)``.

A mixture of them is latent class analysis; an HMM of them has multivariate binary emissions.
Registered in :mod:`ppmix.components.registry` as ``"bernoulli"`` (the label family of the pf models
is :class:`~ppmix.components.BernoulliLabel`, one binary label per component).
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.components.base import Moments
from ppmix.components.divergence import register_kl
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    FamilyPriors,
    MeanStatisticsComponents,
    PriorKey,
    SiteSpec,
    WeightedSums,
    posterior_mode,
)
from ppmix.components.family_tools import prior_value
from ppmix.components.independent import IndependentFeatures

__all__ = ["BernoulliComponents", "BernoulliFamily", "BernoulliPriors"]


class BernoulliComponents(IndependentFeatures, MeanStatisticsComponents):
    """``K`` components of independent Bernoulli features with success probabilities ``probs`` ``(K, D)``.

    Parameters
    ----------
    probs : Tensor (K, D)
        Probabilities in ``[0, 1]``.
    floor : float, default 1e-10
        The weighted MLE keeps every probability in ``[floor, 1 - floor]`` (a feature that is constant
        within a component keeps a finite log-density for the other value).

    Examples
    --------
    >>> comp = BernoulliComponents(torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64))
    >>> x = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    >>> comp.log_prob(x).exp()
    tensor([[0.2500, 0.8100],
            [0.2500, 0.0900]], dtype=torch.float64)
    """

    param_names = ("probs",)

    def __init__(self, probs: torch.Tensor, floor: float = 1e-10) -> None:
        probs = torch.as_tensor(probs)
        if probs.dim() != 2:
            raise ValueError(f"probs must have shape (K, D); got {tuple(probs.shape)}")
        if not bool(((probs >= 0) & (probs <= 1)).all()):
            raise ValueError("probs must lie in [0, 1]")
        self.probs, self.floor = probs, float(floor)

    def moments(self) -> Moments:
        """The means ``p`` and variances ``p (1 - p)`` ``(K, D)``."""
        return Moments(self.probs, self.probs * (1 - self.probs))

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        """``sum_d x log p + (1 - x) log(1 - p)``, ``(N, K)``, as two GEMMs (a probability of exactly 0 or 1 is
        taken as the smallest positive number away from it, so no ``0 * inf`` appears)."""
        x = data.to(self.dtype)
        tiny = torch.finfo(self.dtype).tiny
        log_p, log_q = self.probs.clamp_min(tiny).log(), (1 - self.probs).clamp_min(tiny).log()
        return x @ log_p.T + (1 - x) @ log_q.T

    def fit_statistics(self, stats: WeightedSums) -> "BernoulliComponents":
        """The weighted MLE ``probs_kd = sum_n r_nk x_nd / sum_n r_nk``, kept in ``[floor, 1 - floor]``; in place."""
        self.probs = self.weighted_means(stats).clamp(self.floor, 1 - self.floor)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        probs = self.probs if index is None else self.probs[index]
        return dist.Bernoulli(probs=probs).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.bernoulli(self.probs[index], generator=generator)


@register_kl(BernoulliComponents, BernoulliComponents)
def _kl_bernoulli_components(p: BernoulliComponents, q: BernoulliComponents) -> torch.Tensor:
    """``KL(p_i || q_j)``, ``(K, K')``."""
    p, q = p.probs[:, None, :], q.probs[None, :, :]
    return (torch.xlogy(p, p / q) + torch.xlogy(1 - p, (1 - p) / (1 - q))).sum(-1)


class BernoulliFamily(DensityFamily):
    """Bernoulli components over binary features, for the structures (registered as ``"bernoulli"``).

    Parameters
    ----------
    floor : float, default 1e-10
        Fitted probabilities stay in ``[floor, 1 - floor]``.

    Notes
    -----
    The Pyro site is ``probs`` ``(K, D)`` (as in ``torch.distributions.Bernoulli``); under MCMC its prior is
    ``Beta(1, 1)`` (uniform). A model's ``priors=`` sets it: ``probs_concentration1`` ``a`` and
    ``probs_concentration0`` ``b`` (default 1 each; numbers or one per feature); MAP-EM's probability is
    ``(successes + a - 1) / (n_k + a + b - 2)``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.random((200, 6)) < 0.9, rng.random((200, 6)) < 0.1]).astype(float)
    >>> mix = Mixture(2, family="bernoulli", seed=0, progress=False).fit(X)
    >>> np.round(np.sort(mix.means_.mean(1).numpy()), 1)
    array([0.1, 0.9])
    """

    name = "bernoulli"
    #: k-means' hard clusters start softened (:mod:`ppmix.models._starts`):
    #: a feature constant in a hard cluster would start at 0 or 1
    start_spread = 0.5
    components_class = BernoulliComponents

    def __init__(self, floor: float = 1e-10) -> None:
        self.floor = floor
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        if not (isinstance(self.floor, (int, float)) and 0 < self.floor < 0.5):
            raise ValueError(f"floor must be a number in (0, 0.5); got {self.floor!r}")

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        if not bool(((x == 0) | (x == 1)).all()):
            raise InvalidDataError(f"{name} must hold binary values (0 or 1) for the Bernoulli family")

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"probs": SiteSpec(constraints.unit_interval, (d,))}

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> BernoulliComponents:
        """The probabilities of the site values, with the family's floor."""
        return BernoulliComponents(values["probs"], floor=self.floor)

    def priors(self) -> "BernoulliPriors":
        return BernoulliPriors(self)


class BernoulliPriors(FamilyPriors):
    """The priors of :class:`BernoulliFamily` (its :meth:`~BernoulliFamily.priors`)."""

    family: BernoulliFamily

    def keys(self) -> dict[str, PriorKey]:
        return {
            "probs_concentration1": PriorKey("the Beta concentration of the ones (default 1)", "concentration"),
            "probs_concentration0": PriorKey("the Beta concentration of the zeros (default 1)", "concentration"),
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        ones = torch.ones(d, **opts)
        a, b = (
            prior_value(self.family, "probs_concentration1", ones),
            prior_value(self.family, "probs_concentration0", ones),
        )
        return dist.Beta(a, b).to_event(1)

    def map_update(self, components: BernoulliComponents, stats: WeightedSums, scale: DataScale) -> None:
        """``probs_k = (successes + a - 1) / (n_k + a + b - 2)`` under ``Beta(a, b)`` (0 without any weight),
        kept in ``[floor, 1 - floor]``."""
        opts = {"dtype": components.dtype, "device": components.device}
        probs = posterior_mode(self.conjugate_posterior("probs", stats, {}, scale, opts)).to(**opts)
        components.probs = probs.clamp(components.floor, 1 - components.floor)

    def conjugate_posterior(
        self, site: str, stats: WeightedSums, values: dict, scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """``probs_k | rows ~ Beta(a + successes, b + failures)`` under the prior ``Beta(a, b)``."""
        prior = self.prior(site, 1, stats.totals.shape[1], scale, opts).base_dist
        failures = stats.counts[:, None] - stats.totals
        return dist.Beta(prior.concentration1 + stats.totals, prior.concentration0 + failures)
