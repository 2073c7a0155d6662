"""The Poisson family: ``K`` components over ``D`` independent counts, ``x_d ~ Poisson(rate_kd)``.

The whole family in one module, as an example of writing one (see the user guide's
``docs/guide/writing-a-family.md``): :class:`PoissonComponents` are the fitted components (``log_prob``, the MLE
from the weighted sums of :class:`~ppmix.components.family.MeanStatisticsComponents`, the Pyro
distribution, sampling, the moments); :class:`PoissonFamily` is what a structure takes (``Mixture(3,
family="poisson")``, ``HMM(3, emission="poisson")``): its Pyro site ``rate`` and the data it accepts (non-negative
integers); :class:`PoissonPriors` are its priors (MCMC's weak prior, the keys ``priors=`` sets, MAP-EM and Gibbs),
and its closed-form KL divergence is registered with :func:`~ppmix.components.divergence.register_kl`. Registered
in :mod:`ppmix.components.registry` as ``"poisson"``.
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

__all__ = ["PoissonComponents", "PoissonFamily", "PoissonPriors"]


class PoissonComponents(IndependentFeatures, MeanStatisticsComponents):
    """``K`` Poisson components with rates ``rate`` ``(K, D)``, independent across features.

    Parameters
    ----------
    rate : Tensor (K, D)
        Positive rates.
    floor : float, default 1e-10
        The smallest rate the weighted MLE returns (an empty component, or one whose rows are all zero,
        keeps a positive rate, so its log-density stays finite).

    Examples
    --------
    >>> comp = PoissonComponents(torch.tensor([[1.0], [5.0]], dtype=torch.float64))
    >>> x = torch.tensor([[0.0], [4.0], [6.0]], dtype=torch.float64)
    >>> comp.log_prob(x).shape
    torch.Size([3, 2])
    >>> comp.fit(x, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)).rate.ravel().tolist()
    [1e-10, 5.0]
    """

    param_names = ("rate",)

    def __init__(self, rate: torch.Tensor, floor: float = 1e-10) -> None:
        rate = torch.as_tensor(rate)
        if rate.dim() != 2:
            raise ValueError(f"rate must have shape (K, D); got {tuple(rate.shape)}")
        if not bool((rate > 0).all()):
            raise ValueError("rate must be positive")
        self.rate, self.floor = rate, float(floor)

    def moments(self) -> Moments:
        """The means and variances ``(K, D)``: a Poisson count's are both its rate."""
        return Moments(self.rate, self.rate)

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        """``sum_d log Poisson(x_nd | rate_kd)``, ``(N, K)``: one GEMM for ``x log(rate)``."""
        x = data.to(self.dtype)
        return x @ self.rate.log().T - self.rate.sum(1) - torch.lgamma(x + 1).sum(1, keepdim=True)

    def fit_statistics(self, stats: WeightedSums) -> "PoissonComponents":
        """The weighted MLE ``rate_kd = sum_n r_nk x_nd / sum_n r_nk``, at least ``floor``; in place."""
        self.rate = self.weighted_means(stats).clamp_min(self.floor)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        rate = self.rate if index is None else self.rate[index]
        return dist.Poisson(rate).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.poisson(self.rate[index], generator=generator)


@register_kl(PoissonComponents, PoissonComponents)
def _kl_poisson_components(p: PoissonComponents, q: PoissonComponents) -> torch.Tensor:
    """``KL(p_i || q_j)``, ``(K, K')``: ``sum_d a log(a / b) - a + b``."""
    a, b = p.rate[:, None, :], q.rate[None, :, :]
    return (a * (a.log() - b.log()) - a + b).sum(-1)


class PoissonFamily(DensityFamily):
    """Poisson components over counts, for the structures (registered as ``"poisson"``).

    Parameters
    ----------
    floor : float, default 1e-10
        The smallest fitted rate.

    Notes
    -----
    The Pyro site is ``rate`` ``(K, D)`` (as in ``torch.distributions.Poisson``); under MCMC its prior
    is ``Gamma(1, 1 / mean_d)``, an exponential whose mean is the data's mean count of feature ``d``.
    A model's ``priors=`` sets it: ``rate_concentration`` (default 1) and ``rate_rate`` (default ``1 /
    mean_d``), numbers or one per feature; MAP-EM's rate is ``(sum x + a - 1) / (n_k + b)``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.poisson(2.0, (200, 3)), rng.poisson(15.0, (200, 3))])
    >>> mix = Mixture(2, family="poisson", seed=0, progress=False).fit(X)
    >>> np.round(np.sort(mix.means_[:, 0].numpy()))
    array([ 2., 15.])
    """

    name = "poisson"
    components_class = PoissonComponents

    def __init__(self, floor: float = 1e-10) -> None:
        self.floor = floor
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        if not (isinstance(self.floor, (int, float)) and self.floor > 0):
            raise ValueError(f"floor must be a positive number; got {self.floor!r}")

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        if not bool(((x >= 0) & (x == x.round())).all()):
            raise InvalidDataError(f"{name} must hold counts (non-negative integers) for the Poisson family")

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        return {"mean": x.mean(0)}

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"rate": SiteSpec(constraints.positive, (d,))}

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> PoissonComponents:
        """The rates of the site values, with the family's floor (its components take a setting: passed here)."""
        return PoissonComponents(values["rate"], floor=self.floor)

    def priors(self) -> "PoissonPriors":
        return PoissonPriors(self)


class PoissonPriors(FamilyPriors):
    """The priors of :class:`PoissonFamily` (its :meth:`~PoissonFamily.priors`)."""

    family: PoissonFamily

    def keys(self) -> dict[str, PriorKey]:
        return {
            "rate_concentration": PriorKey("the Gamma shape of the rates (default 1)"),
            "rate_rate": PriorKey("the Gamma rate of the rates (default 1 / the data's mean count)"),
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        mean = scale.get("mean", torch.ones(d)).to(**opts).clamp_min(self.family.floor)
        shape = prior_value(self.family, "rate_concentration", torch.ones_like(mean))
        return dist.Gamma(shape, prior_value(self.family, "rate_rate", 1.0 / mean)).to_event(1)

    def map_update(self, components: PoissonComponents, stats: WeightedSums, scale: DataScale) -> None:
        """``rate_k = (sum_n r_nk x_n + a - 1) / (n_k + b)`` under ``Gamma(a, b)``, at least ``floor``."""
        opts = {"dtype": components.dtype, "device": components.device}
        posterior = self.conjugate_posterior("rate", stats, {}, scale, opts)
        components.rate = posterior_mode(posterior).to(**opts).clamp_min(components.floor)

    def conjugate_posterior(
        self, site: str, stats: WeightedSums, values: dict, scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """``rate_k | rows ~ Gamma(c + sum_n x_n, r + n_k)`` under the prior ``Gamma(c, r)``."""
        prior = self.prior(site, 1, stats.totals.shape[1], scale, opts).base_dist
        return dist.Gamma(prior.concentration + stats.totals, prior.rate + stats.counts[:, None])
