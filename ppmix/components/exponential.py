"""The exponential family of positive data: ``K`` components over ``D`` independent features,
``x_d ~ Exponential(rate_kd)`` (waiting times, durations, sizes). Registered as ``"exponential"``."""

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

__all__ = ["ExponentialComponents", "ExponentialFamily", "ExponentialPriors"]


class ExponentialComponents(IndependentFeatures, MeanStatisticsComponents):
    """``K`` exponential components with rates ``rate`` ``(K, D)`` (means ``1 / rate``).

    Parameters
    ----------
    rate : Tensor (K, D)
        Positive rates.
    max_rate : float, default 1e10
        The largest rate the weighted MLE returns (a component whose rows are all zero keeps a finite rate).

    Examples
    --------
    >>> comp = ExponentialComponents(torch.tensor([[1.0], [0.25]], dtype=torch.float64))
    >>> x = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    >>> comp.fit(x, torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)).rate.ravel().tolist()
    [1.0, 0.3333333333333333]
    """

    param_names = ("rate",)

    def __init__(self, rate: torch.Tensor, max_rate: float = 1e10) -> None:
        rate = torch.as_tensor(rate)
        if rate.dim() != 2:
            raise ValueError(f"rate must have shape (K, D); got {tuple(rate.shape)}")
        if not bool((rate > 0).all()):
            raise ValueError("rate must be positive")
        self.rate, self.max_rate = rate, float(max_rate)

    def moments(self) -> Moments:
        """The means ``1 / rate`` and variances ``1 / rate^2`` ``(K, D)``."""
        return Moments(1 / self.rate, self.rate.square().reciprocal())

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        """``sum_d log rate - rate x``, ``(N, K)``: one GEMM."""
        return self.rate.log().sum(1) - data.to(self.dtype) @ self.rate.T

    def fit_statistics(self, stats: WeightedSums) -> "ExponentialComponents":
        """The weighted MLE ``rate_kd = sum_n r_nk / sum_n r_nk x_nd``, at most ``max_rate``; in place."""
        # a component whose rows are all zero (or that has none) has mean 0: its rate is max_rate
        self.rate = self.weighted_means(stats).reciprocal().clamp(torch.finfo(self.dtype).tiny, self.max_rate)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        rate = self.rate if index is None else self.rate[index]
        return dist.Exponential(rate).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        uniform = torch.rand(self.rate[index].shape, generator=generator, dtype=self.dtype).to(self.device)
        return -torch.log1p(-uniform) / self.rate[index]


@register_kl(ExponentialComponents, ExponentialComponents)
def _kl_exponential_components(p: ExponentialComponents, q: ExponentialComponents) -> torch.Tensor:
    """``KL(p_i || q_j)``, ``(K, K')``: ``sum_d log(a / b) + b / a - 1``."""
    a, b = p.rate[:, None, :], q.rate[None, :, :]
    return (a.log() - b.log() + b / a - 1).sum(-1)


class ExponentialFamily(DensityFamily):
    """Exponential components over non-negative data, for the structures (registered as ``"exponential"``).

    Notes
    -----
    The Pyro site is ``rate`` ``(K, D)`` (as in ``torch.distributions.Exponential``); under MCMC its prior
    is ``Gamma(1, mean_d)``, whose mean is the rate of the data's mean in feature ``d``. A model's ``priors=``
    sets it: ``rate_concentration`` (default 1) and ``rate_rate`` (default ``mean_d``), numbers or one per
    feature; MAP-EM's rate is ``(n_k + a - 1) / (sum x + b)``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.exponential(1.0, (300, 4)), rng.exponential(20.0, (300, 4))])
    >>> mix = Mixture(2, family="exponential", seed=0, progress=False).fit(X)
    >>> bool(np.allclose(np.sort(mix.means_.mean(1).numpy()), [1.0, 20.0], rtol=0.2))
    True
    """

    name = "exponential"
    #: k-means' hard clusters start softened (:mod:`ppmix.models._starts`):
    #: slices of the axis cut by k-means would start at rates too far apart
    start_spread = 0.5
    components_class = ExponentialComponents

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        if not bool((x >= 0).all()):
            raise InvalidDataError(f"{name} must be non-negative for the exponential family")

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        return {"mean": x.mean(0)}

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"rate": SiteSpec(constraints.positive, (d,))}

    def priors(self) -> "ExponentialPriors":
        return ExponentialPriors(self)


class ExponentialPriors(FamilyPriors):
    """The priors of :class:`ExponentialFamily` (its :meth:`~ExponentialFamily.priors`)."""

    family: ExponentialFamily

    def keys(self) -> dict[str, PriorKey]:
        return {
            "rate_concentration": PriorKey("the Gamma shape of the rates (default 1)"),
            "rate_rate": PriorKey("the Gamma rate of the rates (default the data's mean)"),
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        mean = scale.get("mean", torch.ones(d)).to(**opts).clamp_min(torch.finfo(opts.get("dtype", torch.float64)).tiny)
        shape = prior_value(self.family, "rate_concentration", torch.ones_like(mean))
        return dist.Gamma(shape, prior_value(self.family, "rate_rate", mean)).to_event(1)

    def map_update(self, components: ExponentialComponents, stats: WeightedSums, scale: DataScale) -> None:
        """``rate_k = (n_k + a - 1) / (sum_n r_nk x_n + b)`` under ``Gamma(a, b)``, in ``(0, max_rate]``."""
        opts = {"dtype": components.dtype, "device": components.device}
        rate = posterior_mode(self.conjugate_posterior("rate", stats, {}, scale, opts)).to(**opts)
        components.rate = rate.clamp(torch.finfo(components.dtype).tiny, components.max_rate)

    def conjugate_posterior(
        self, site: str, stats: WeightedSums, values: dict, scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """``rate_k | rows ~ Gamma(c + n_k, r + sum_n x_n)`` under the prior ``Gamma(c, r)``."""
        prior = self.prior(site, 1, stats.totals.shape[1], scale, opts).base_dist
        return dist.Gamma(prior.concentration + stats.counts[:, None], prior.rate + stats.totals)
