"""The log-normal family of positive data: ``K`` components over ``D`` independent features,
``log x_d ~ Normal(loc_kd, scale_kd)`` (``torch.distributions.LogNormal(loc, scale)``). Registered as ``"lognormal"``.

A log-normal component is a diagonal Gaussian on ``log x`` whose density carries the Jacobian ``-sum_d log x_d``:
the statistics, the weighted MLE with its variance floor (relative to the spread of ``log x``), the fused E-step
and the KL divergence (unchanged by the bijection ``exp``) are :class:`~ppmix.components.DiagGaussian`'s on the
logarithms.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import check_float
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.centred import as_floor
from ppmix.components.divergence import kl_divergence, register_kl
from ppmix.components.family import DataScale, FamilyPriors, PriorKey, SiteSpec, with_priors
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.gaussian_family import GaussianFamily, robust_spread, scale_sample
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.components.independent import IndependentFeatures
from ppmix.components.positive import LogData, LogDataFamily, as_log_data

__all__ = ["LogNormalComponents", "LogNormalFamily", "LogNormalPriors"]


class LogNormalComponents(IndependentFeatures, ComponentFamily):
    """``K`` log-normal components, ``log x | k ~ N(loc[k], diag(scale[k]^2))`` (``torch.distributions.LogNormal``).

    Parameters
    ----------
    loc, scale : Tensor (K, D)
        The means and (positive) standard deviations of ``log x``.
    reg_covar : float or Tensor (D,), default 1e-6
        The floor of the fitted variances of ``log x`` (:class:`~ppmix.components.DiagGaussian`'s).

    Examples
    --------
    >>> f64 = torch.float64
    >>> comp = LogNormalComponents(torch.zeros(1, 1, dtype=f64), torch.ones(1, 1, dtype=f64))
    >>> x = torch.tensor([[1.0], [100.0]], dtype=f64)
    >>> fitted = comp.fit(x, torch.ones(2, 1, dtype=f64))
    >>> round(fitted.loc.item(), 6), round(fitted.scale.item(), 6)  # log 10 and log 10
    (2.302585, 2.302585)
    """

    param_names = ("loc", "scale")

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, reg_covar: float | torch.Tensor = 1e-6) -> None:
        self.loc, self.scale, self.reg_covar = torch.as_tensor(loc), torch.as_tensor(scale), as_floor(reg_covar)
        self._normal()  # checks the shapes and the scales

    def _normal(self) -> DiagGaussian:
        """The Gaussian components of ``log x`` with these parameters (sharing the tensors)."""
        return DiagGaussian(self.loc, self.scale, self.reg_covar)

    def feature(self, d: int) -> "LogNormalComponents":
        """The components on feature ``d`` alone, with that feature's variance floor."""
        part = super().feature(d)
        if isinstance(self.reg_covar, torch.Tensor):
            part.reg_covar = self.reg_covar[d : d + 1]
        return part

    def moments(self) -> Moments:
        """The means ``exp(loc + scale^2 / 2)`` and variances ``(exp(scale^2) - 1) exp(2 loc + scale^2)`` ``(K, D)``."""
        variance = self.scale.square()
        return Moments((self.loc + variance / 2).exp(), variance.expm1() * (2 * self.loc + variance).exp())

    @property
    def reference(self) -> torch.Tensor:
        """The centre of the logarithms of prediction data: the mean of ``loc`` (as
        :attr:`~ppmix.components.DiagGaussian.reference`)."""
        return self.loc.mean(dim=0)

    def _log_data(self, data: torch.Tensor | LogData) -> LogData:
        return as_log_data(data, self.dtype, self.device, shift=self.reference)

    def log_prob(self, data: torch.Tensor | LogData) -> torch.Tensor:
        """``log N(log x | loc, scale) - sum_d log x_d``, ``(N, K)``."""
        data = self._log_data(data)
        return self._normal().log_prob(data.log) - data.log.x.sum(1, keepdim=True)

    def _expected_statistics(
        self, data: torch.Tensor | LogData, log_weights: torch.Tensor, row_weights: torch.Tensor | None = None
    ) -> tuple[GaussianStatistics, torch.Tensor]:
        """The fused E-step of :class:`~ppmix.components.DiagGaussian` on ``log x``, its log-likelihood less the
        (row-weighted) Jacobian ``sum_n sum_d log x_nd``."""
        data = self._log_data(data)
        stats, log_likelihood = self._normal()._expected_statistics(data.log, log_weights, row_weights)
        jacobian = data.log.x.sum(1)
        if row_weights is None:
            return stats, log_likelihood - jacobian.sum()
        return stats, log_likelihood - jacobian @ row_weights.to(dtype=self.dtype, device=self.device)

    def statistics(self, data: torch.Tensor | LogData, weights: torch.Tensor) -> GaussianStatistics:
        """The Gaussian statistics of ``log x`` (total weights, weighted means and scatters; they merge exactly)."""
        return self._normal().statistics(self._log_data(data).log, weights)

    def fit_statistics(self, stats: GaussianStatistics) -> "LogNormalComponents":
        """The weighted MLE: the weighted mean and variance of ``log x``, the variance at least ``reg_covar``."""
        normal = self._normal().fit_statistics(stats)
        self.loc, self.scale = normal.loc, normal.scale
        return self

    def fit(self, data: torch.Tensor | LogData, weights: torch.Tensor) -> "LogNormalComponents":
        return self.fit_statistics(self.statistics(data, weights))

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        loc, scale = (self.loc, self.scale) if index is None else (self.loc[index], self.scale[index])
        return dist.LogNormal(loc, scale).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self._normal().sample(index, generator).exp()


@register_kl(LogNormalComponents, LogNormalComponents)
def _kl_log_normal_components(p: LogNormalComponents, q: LogNormalComponents) -> torch.Tensor:
    """``KL(p_i || q_j)``, ``(K, K')``: the Gaussians' on ``log x`` (``exp`` is a bijection)."""
    return kl_divergence(p._normal(), q._normal())


class LogNormalFamily(LogDataFamily):
    """Log-normal components over positive data, for the structures (registered as ``"lognormal"``).

    Parameters
    ----------
    reg_covar : float, default 1e-6
        The floor of the fitted variances of ``log x_d``: ``reg_covar`` times the squared robust spread of
        ``log x_d`` in the training data (:func:`~ppmix.components.gaussian_family.relative_floor`); ``reg_covar``
        itself where ``x_d`` is constant up to rounding (decided on ``x``, whose relative rounding is an absolute
        one on ``log x``: a column of ``1 + eps`` is constant, its logarithms ``0`` and ``eps`` are not).

    Notes
    -----
    The Pyro sites are ``loc`` and ``scale`` ``(K, D)`` (as in ``torch.distributions.LogNormal``); under MCMC their
    priors are the diagonal Gaussian family's on ``log x``: ``loc ~ N(mean(log X), 3 std(log X))`` and ``scale^2 ~
    InverseGamma(1, var(log X) / 100)``, whose hyperparameters ``priors=`` sets under the Gaussian family's keys
    (:meth:`LogNormalPriors.keys`). The prior is conjugate on ``log x`` (the Jacobian ``-sum log x`` does not depend on
    the parameters), so MAP-EM (``engine="em"`` with ``priors``) is the diagonal Gaussian's closed-form update on the
    logarithms, and ``engine="gibbs"`` draws from the diagonal Gaussian's conditional posteriors on them.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.exp(np.concatenate([rng.normal(1.0, 0.5, (300, 3)), rng.normal(4.0, 0.5, (300, 3))]))
    >>> mix = Mixture(2, family="lognormal", seed=0, progress=False).fit(X)
    >>> np.sort(mix.components_.loc.mean(1).numpy()).round(1).tolist()
    [1.0, 4.0]
    """

    name = "lognormal"
    components_class = LogNormalComponents

    def __init__(self, reg_covar: float = 1e-6) -> None:
        self.reg_covar = reg_covar
        self._check_settings()

    def _log_gaussian(self) -> GaussianFamily:
        """The diagonal Gaussian family of ``log x``, whose data scale and priors (with :attr:`prior_settings`) these
        are."""
        return with_priors(GaussianFamily("diag", self.reg_covar), self._prior_settings)

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        check_float(self.reg_covar, "reg_covar", positive=False)

    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """The mean, standard deviation and variance floor (``floor``) of ``log x`` (the Gaussian family's), the
        floor ``reg_covar`` where ``x`` is constant up to rounding."""
        scale = self._log_gaussian().data_scale(x.log(), name, weight)
        return self._floored_where_constant(scale, robust_spread(scale_sample(x) if weight is None else x, weight))

    def _floored_where_constant(self, scale: DataScale, spread: torch.Tensor) -> DataScale:
        """``scale`` with the absolute floor ``reg_covar`` on the features whose robust spread in ``x`` is zero."""
        return {**scale, "floor": torch.where(spread > 0, scale["floor"], torch.full_like(spread, self.reg_covar))}

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> LogData:
        """Training data with their logarithms centred at their mean; prediction data at the components' reference."""
        return LogData.from_tensor(x, None if components is None else components.reference)

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"loc": SiteSpec(constraints.real, (d,)), "scale": SiteSpec(constraints.positive, (d,))}

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> LogNormalComponents:
        """The log-scale Gaussians of the site values, with the training data's variance floor (else
        ``reg_covar``)."""
        floor = as_floor(scale.get("floor", self.reg_covar))
        return LogNormalComponents(values["loc"], values["scale"], reg_covar=floor)

    def priors(self) -> "LogNormalPriors":
        return LogNormalPriors(self)


class LogNormalPriors(FamilyPriors):
    """The priors of :class:`LogNormalFamily` (its :meth:`~LogNormalFamily.priors`)."""

    family: LogNormalFamily

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        return self.family._log_gaussian().priors().prior({"loc": "locs", "scale": "scales"}[site], k, d, scale, opts)

    def keys(self) -> dict[str, PriorKey]:
        """The diagonal Gaussian family's, on ``log x``: ``locs_loc``, ``locs_scale``, ``variance_concentration`` and
        ``variance_rate``."""
        return GaussianFamily("diag").priors().keys()

    def map_update(self, components: LogNormalComponents, stats: GaussianStatistics, scale: DataScale) -> None:
        """The diagonal Gaussian's MAP update on ``log x`` (its statistics are those of the logarithms)."""
        normal = components._normal()
        self.family._log_gaussian().priors().map_update(normal, stats, scale)
        components.loc, components.scale = normal.loc, normal.scale

    def map_log_prior(self, components: LogNormalComponents, d: int, scale: DataScale) -> torch.Tensor:
        """The diagonal Gaussian's log prior of the means and variances of ``log x``."""
        return self.family._log_gaussian().priors().map_log_prior(components._normal(), d, scale)

    def conjugate_posterior(
        self, site: str, stats: GaussianStatistics, values: dict[str, torch.Tensor], scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """The diagonal Gaussian's conditional posterior on ``log x`` (``engine="gibbs"``): ``loc`` given ``scale``
        normal, ``scale**2`` given ``loc`` inverse-gamma, from the statistics of the logarithms."""
        renamed = {"loc": "locs", "scale": "scales"}
        gaussian_values = {renamed[name]: value for name, value in values.items() if name in renamed}
        return (
            self.family._log_gaussian().priors().conjugate_posterior(renamed[site], stats, gaussian_values, scale, opts)
        )
