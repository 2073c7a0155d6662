"""The gamma family of positive data: ``K`` components over ``D`` independent features,
``x_d ~ Gamma(concentration_kd, rate_kd)`` (sizes, durations, intensities: right-skewed positive data).
Registered as ``"gamma"``.

The weighted MLE depends on the rows through the weighted means of ``x`` and ``log x`` only; its shape
solves ``log a - digamma(a) = log(mean x) - mean(log x)`` (:func:`gamma_shape`, Minka's generalised Newton
method), then ``rate = a / mean x``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.algorithms.ascent import newton_ascent
from ppmix.components.base import Moments
from ppmix.components.divergence import register_kl
from ppmix.components.family import DataScale, FamilyPriors, MeanStatisticsComponents, PriorKey, SiteSpec, WeightedSums
from ppmix.components.family_tools import prior_value
from ppmix.components.independent import IndependentFeatures
from ppmix.components.positive import LogData, LogDataFamily, as_log_data

__all__ = ["GammaComponents", "GammaFamily", "GammaPriors", "LogWeightedSums", "gamma_shape", "log_minus_digamma"]

logger = logging.getLogger(__name__)

#: shapes from which :func:`log_minus_digamma` uses the asymptotic series (``log a - digamma(a)`` cancels there)
SERIES_FROM = 10.0
#: Newton steps of :func:`gamma_shape` beyond which it stops (it converges in about five from Minka's start)
MAX_NEWTON_STEPS = 100


@dataclass(frozen=True)
class LogWeightedSums(WeightedSums):
    """:class:`~ppmix.components.family.WeightedSums` with the weighted sums of the logarithms of the rows,
    ``log_totals`` ``(K, D)``: all the gamma MLE needs (they merge by adding, as every field does)."""

    log_totals: torch.Tensor


def log_minus_digamma(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``f(a) = log a - digamma(a)`` and its derivative ``1 / a - trigamma(a)``, elementwise.

    From ``a = 10`` on, both come from the asymptotic series in the Bernoulli numbers (seven terms, a relative
    error below 1e-14 there), which avoids the cancellation of the direct difference for large shapes.

    Examples
    --------
    >>> f, df = log_minus_digamma(torch.tensor([1.0, 1e4], dtype=torch.float64))
    >>> [round(v, 12) for v in f.tolist()], [float(f"{v:.6e}") for v in df.tolist()]
    ([0.577215664902, 5.0000833e-05], [-0.6449341, -5.000167e-09])
    """
    small = a < SERIES_FROM
    direct = a.clamp_max(SERIES_FROM)
    u = 1 / a.clamp_min(SERIES_FROM)
    w = u * u
    series = u / 2 + w * (
        1 / 12 + w * (-1 / 120 + w * (1 / 252 + w * (-1 / 240 + w * (1 / 132 + w * (-691 / 32760 + w / 12)))))
    )
    tail = 1 / 6 + w * (-1 / 30 + w * (1 / 42 + w * (-1 / 30 + w * (5 / 66 + w * (-691 / 2730 + w * 7 / 6)))))
    series_derivative = -w / 2 - u * w * tail  # minus the sum of B_2k / a^(2k + 1)
    value = torch.where(small, direct.log() - torch.digamma(direct), series)
    derivative = torch.where(small, 1 / direct - torch.polygamma(1, direct), series_derivative)
    return value, derivative


def gamma_shape(log_ratio: torch.Tensor, max_concentration: float = 1e6) -> torch.Tensor:
    """The gamma shape ``a`` with ``log a - digamma(a) = log_ratio``, elementwise, at most ``max_concentration``.

    ``log_ratio = log(mean x) - mean(log x)`` (weighted) is positive by Jensen's inequality and zero only
    for constant data, whose likelihood grows without bound with the shape: a ratio at or below that of
    ``max_concentration`` (constant rows, or ratios rounded to zero or below) gives ``max_concentration``.
    Minka's generalised Newton method (Newton's method on ``1 / a``, from his closed-form start; Minka 2002,
    "Estimating a Gamma distribution"), until a step changes ``1 / a`` by at most 100 machine epsilons relative.

    Examples
    --------
    >>> a = gamma_shape(torch.tensor([0.5772156649015329, 0.0], dtype=torch.float64))
    >>> [round(v, 12) for v in a.tolist()]
    [1.0, 1000000.0]
    """
    floor, _ = log_minus_digamma(torch.tensor(float(max_concentration), dtype=log_ratio.dtype))
    s = torch.maximum(log_ratio, floor.to(log_ratio.device))
    a = (3 - s + ((s - 3).square() + 24 * s).sqrt()) / (12 * s)  # Minka's start
    u = 1 / a
    tol = 100 * torch.finfo(s.dtype).eps
    for _ in range(MAX_NEWTON_STEPS):
        a = 1 / u
        value, derivative = log_minus_digamma(a)
        step = (value - s) / (a * a * derivative)
        u = torch.where(u + step > 0, u + step, u / 2)  # a safeguard: Newton on the convex 1 / a stays positive
        if bool((step.abs() <= tol * u).all()):
            break
    else:
        logger.warning("the gamma shape's Newton method stopped after %d steps", MAX_NEWTON_STEPS)
    return torch.where(log_ratio <= floor, max_concentration, 1 / u).clamp_max(max_concentration)


class GammaComponents(IndependentFeatures, MeanStatisticsComponents):
    """``K`` gamma components with shapes ``concentration`` and rates ``rate`` ``(K, D)`` (means ``concentration /
    rate``), as in ``torch.distributions.Gamma``.

    Parameters
    ----------
    concentration, rate : Tensor (K, D)
        Positive shapes and rates.
    max_concentration : float, default 1e6
        The largest shape the weighted MLE returns (:func:`gamma_shape`): a component on constant rows (or
        one collapsing onto a point) keeps a finite likelihood, with a coefficient of variation of at least
        ``max_concentration ** -0.5``.

    Examples
    --------
    >>> f64 = torch.float64
    >>> comp = GammaComponents(torch.ones(1, 1, dtype=f64), torch.ones(1, 1, dtype=f64))
    >>> x = torch.tensor([[1.0], [2.0], [4.0]], dtype=f64)
    >>> fitted = comp.fit(x, torch.ones(3, 1, dtype=f64))
    >>> round(fitted.concentration.item(), 6), round(fitted.moments().mean.item(), 12)
    (3.401201, 2.333333333333)
    """

    param_names = ("concentration", "rate")

    def __init__(self, concentration: torch.Tensor, rate: torch.Tensor, max_concentration: float = 1e6) -> None:
        concentration, rate = torch.as_tensor(concentration), torch.as_tensor(rate)
        if concentration.dim() != 2 or rate.shape != concentration.shape:
            raise ValueError(
                f"concentration and rate must both have shape (K, D); got {tuple(concentration.shape)}, "
                f"{tuple(rate.shape)}"
            )
        if not bool((concentration > 0).all() and (rate > 0).all()):
            raise ValueError("concentration and rate must be positive")
        self.concentration, self.rate, self.max_concentration = concentration, rate, float(max_concentration)

    def moments(self) -> Moments:
        """The means ``concentration / rate`` and variances ``concentration / rate^2`` ``(K, D)``."""
        return Moments(self.concentration / self.rate, self.concentration / self.rate.square())

    def log_prob(self, data: torch.Tensor | LogData) -> torch.Tensor:
        """``sum_d (a - 1) log x - b x + a log b - lgamma(a)``, ``(N, K)``: two GEMMs."""
        data = as_log_data(data, self.dtype, self.device)
        a, b = self.concentration, self.rate
        const = (a * b.log() - torch.lgamma(a)).sum(1)
        return data.log.x @ (a - 1).T - data.x @ b.T + const

    def statistics(self, data: torch.Tensor | LogData, weights: torch.Tensor) -> LogWeightedSums:
        """The total weights ``(K,)`` and weighted sums of ``x`` and ``log x`` ``(K, D)``."""
        data = as_log_data(data, self.dtype, self.device)
        weights = self._check_weights(weights, data.n_samples)
        return LogWeightedSums(weights.sum(0), weights.T @ data.x, weights.T @ data.log.x)

    def fit_statistics(self, stats: LogWeightedSums) -> "GammaComponents":
        """The weighted MLE: the shape from :func:`gamma_shape` on ``log(mean x) - mean(log x)``, then ``rate =
        shape / mean x``; a component without weight keeps its parameters. In place."""
        stats = stats.to(dtype=self.dtype, device=self.device)
        has_weight = (stats.counts > 0)[:, None]
        mean = self.weighted_means(stats)
        mean_log = stats.log_totals / torch.where(has_weight, stats.counts[:, None], 1.0)
        log_ratio = torch.where(has_weight, mean.log() - mean_log, 1.0)
        shape = gamma_shape(log_ratio, self.max_concentration)
        self.concentration = torch.where(has_weight, shape, self.concentration)
        self.rate = torch.where(has_weight, shape / torch.where(has_weight, mean, 1.0), self.rate)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        a, b = (self.concentration, self.rate) if index is None else (self.concentration[index], self.rate[index])
        return dist.Gamma(a, b).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # torch.distributions.Gamma's own sampler, which takes a generator
        return torch._standard_gamma(self.concentration[index], generator=generator) / self.rate[index]


@register_kl(GammaComponents, GammaComponents)
def _kl_gamma_components(p: GammaComponents, q: GammaComponents) -> torch.Tensor:
    """``KL(p_i || q_j)``, ``(K, K')``: ``sum_d (a - a') digamma(a) - lgamma(a) + lgamma(a') +
    a' log(b / b') + a (b' - b) / b``."""
    a, b = p.concentration[:, None, :], p.rate[:, None, :]
    a2, b2 = q.concentration[None, :, :], q.rate[None, :, :]
    terms = (a - a2) * torch.digamma(a) - torch.lgamma(a) + torch.lgamma(a2) + a2 * (b.log() - b2.log())
    return (terms + a * (b2 - b) / b).sum(-1)


class _GammaObjective:
    """MAP-EM's objective of every component and feature, ``(K D,)``, at ``theta = (log a, log b)`` ``(K D, 2)``, and
    its gradient and Hessian: ``n (a log b - lgamma a) + (a - 1) L - b X`` (``n``, ``X``, ``L``: the weighted count and
    sums of ``x`` and ``log x``) plus the log-normal log priors ``-log a - (log a - m_a)^2 / (2 s_a^2)`` and
    ``-log b - (log b - m_b)^2 / (2 s_b^2)`` (and their constants, in the value)."""

    def __init__(self, stats: LogWeightedSums, shapes: dist.LogNormal, rates: dist.LogNormal) -> None:
        counts = stats.counts[:, None].expand_as(stats.totals)
        self.counts, self.totals, self.log_totals = (
            counts.reshape(-1),
            stats.totals.reshape(-1),
            stats.log_totals.reshape(-1),
        )
        self.shapes, self.rates = shapes.expand(stats.totals.shape), rates.expand(stats.totals.shape)

    def value(self, theta: torch.Tensor) -> torch.Tensor:
        a, b = theta[:, 0].exp(), theta[:, 1].exp()
        likelihood = self.counts * (a * theta[:, 1] - torch.lgamma(a)) + (a - 1) * self.log_totals - b * self.totals
        prior = self.shapes.log_prob(a.reshape(self.shapes.batch_shape)) + self.rates.log_prob(
            b.reshape(self.rates.batch_shape)
        )
        return likelihood + prior.reshape(-1)

    def derivatives(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = theta[:, 0].exp(), theta[:, 1].exp()
        shape_loc, shape_scale = self.shapes.loc.reshape(-1), self.shapes.scale.reshape(-1)
        rate_loc, rate_scale = self.rates.loc.reshape(-1), self.rates.scale.reshape(-1)
        slope = a * (self.counts * (theta[:, 1] - torch.digamma(a)) + self.log_totals)
        gradient = torch.stack(
            [
                slope - 1 - (theta[:, 0] - shape_loc) / shape_scale.square(),
                self.counts * a - b * self.totals - 1 - (theta[:, 1] - rate_loc) / rate_scale.square(),
            ],
            -1,
        )
        shape_shape = slope - self.counts * a.square() * torch.polygamma(1, a) - shape_scale.pow(-2)
        rate_rate = -b * self.totals - rate_scale.pow(-2)
        cross = self.counts * a
        hessian = torch.stack([torch.stack([shape_shape, cross], -1), torch.stack([cross, rate_rate], -1)], -2)
        return gradient, hessian


class GammaFamily(LogDataFamily):
    """Gamma components over positive data, for the structures (registered as ``"gamma"``).

    Parameters
    ----------
    max_concentration : float, default 1e6
        The largest fitted shape (see :class:`GammaComponents`).

    Notes
    -----
    The Pyro sites are ``concentration`` and ``rate`` ``(K, D)`` (as in ``torch.distributions.Gamma``); under MCMC their
    priors are ``LogNormal(0, 1.5)`` (shapes from about 0.05 to 20 within two standard deviations) and ``LogNormal(-log
    mean_d, 2)``, centred at the rate of an exponential with the data's mean in feature ``d``; ``priors=`` sets their
    hyperparameters (:meth:`GammaPriors.keys`). MAP-EM (``engine="em"`` with ``priors``) takes the mode of the density
    of ``(concentration, rate)`` by Newton steps (:meth:`GammaPriors.map_update`): no closed form.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.gamma(2.0, 1.0, (300, 3)), rng.gamma(20.0, 2.0, (300, 3))])
    >>> mix = Mixture(2, family="gamma", seed=0, progress=False).fit(X)
    >>> np.round(np.sort(mix.means_.mean(1).numpy()))
    array([ 2., 40.])
    """

    name = "gamma"
    #: k-means' hard clusters start softened (:mod:`ppmix.models._starts`):
    #: a slice of the axis cut by k-means would start at a huge shape
    start_spread = 0.5
    components_class = GammaComponents

    def __init__(self, max_concentration: float = 1e6) -> None:
        self.max_concentration = max_concentration
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        if not (isinstance(self.max_concentration, (int, float)) and self.max_concentration > 0):
            raise ValueError(f"max_concentration must be a positive number; got {self.max_concentration!r}")

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        return {"mean": x.mean(0)}

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"concentration": SiteSpec(constraints.positive, (d,)), "rate": SiteSpec(constraints.positive, (d,))}

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> GammaComponents:
        """The shapes and rates of the site values, with the family's bound on the shapes."""
        return GammaComponents(values["concentration"], values["rate"], max_concentration=self.max_concentration)

    def priors(self) -> "GammaPriors":
        return GammaPriors(self)


class GammaPriors(FamilyPriors):
    """The priors of :class:`GammaFamily` (its :meth:`~GammaFamily.priors`)."""

    family: GammaFamily

    def keys(self) -> dict[str, PriorKey]:
        return {
            "concentration_loc": PriorKey("the log-normal location of the shapes (default 0)", "real"),
            "concentration_scale": PriorKey("the log-normal scale of the shapes (default 1.5)"),
            "rate_loc": PriorKey("the log-normal location of the rates (default -log of the data's mean)", "real"),
            "rate_scale": PriorKey("the log-normal scale of the rates (default 2)"),
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        """``concentration ~ LogNormal(0, 1.5)`` and ``rate ~ LogNormal(-log mean_d, 2)``, each hyperparameter as
        ``priors=`` sets it (:meth:`keys`)."""
        if site == "concentration":
            loc = prior_value(self.family, "concentration_loc", torch.zeros(d, **opts))
            return dist.LogNormal(
                loc, prior_value(self.family, "concentration_scale", torch.full((d,), 1.5, **opts))
            ).to_event(1)
        mean = scale.get("mean", torch.ones(d)).to(**opts).clamp_min(torch.finfo(opts.get("dtype", torch.float64)).tiny)
        loc = prior_value(self.family, "rate_loc", -mean.log())
        return dist.LogNormal(loc, prior_value(self.family, "rate_scale", torch.full((d,), 2.0, **opts))).to_event(1)

    def map_update(self, components: GammaComponents, stats: LogWeightedSums, scale: DataScale) -> None:
        """Newton steps on ``(log a, log b)`` of every component and feature
        (:func:`~ppmix.algorithms.ascent.newton_ascent`, a generalised EM's M-step: each step raises the objective) on
        ``n (a log b - lgamma a) + (a - 1) sum r log x - b sum r x`` plus the log-normal log priors of ``a`` and
        ``b`` (:meth:`prior`'s densities, which :meth:`map_log_prior` adds), from the current parameters, the shape at
        most ``max_concentration``."""
        opts = {"dtype": components.dtype, "device": components.device}
        stats = stats.to(**opts)
        k, d = components.concentration.shape
        shapes, rates = (self.prior(site, k, d, scale, opts).base_dist for site in ("concentration", "rate"))
        objective = _GammaObjective(stats, shapes, rates)
        start = torch.stack([components.concentration.log(), components.rate.log()], -1).reshape(-1, 2)
        most = math.log(self.family.max_concentration)
        theta = newton_ascent(
            objective.value,
            objective.derivatives,
            start,
            project=lambda theta: torch.stack([theta[:, 0].clamp_max(most), theta[:, 1]], -1),
        ).reshape(k, d, 2)
        components.concentration, components.rate = theta[..., 0].exp(), theta[..., 1].exp()

    def map_log_prior(self, components: GammaComponents, d: int, scale: DataScale) -> torch.Tensor:
        """The log-normal log densities (:meth:`prior`'s) of every shape and rate, differentiable in them."""
        opts = {"dtype": components.dtype, "device": components.device}
        k = components.n_components
        log_shapes = self.prior("concentration", k, d, scale, opts).log_prob(components.concentration).sum()
        return log_shapes + self.prior("rate", k, d, scale, opts).log_prob(components.rate).sum()
