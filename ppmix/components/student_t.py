"""The Student-t family of heavy-tailed real data: ``K`` components over ``D`` features with a diagonal
scale matrix, ``x | k ~ t_{df_k}(loc_k, diag(scale_k^2))`` (the multivariate t: the features share the
component's latent precision). Registered as ``"student_t"``.

As a Gaussian scale mixture, ``x = loc + scale * z / sqrt(u)`` with ``z ~ N(0, I)`` and
``u ~ Gamma(df / 2, df / 2)``, the t admits EM (Peel & McLachlan 2000, "Robust mixture modelling using
the t distribution"): under the current parameters a row's expected precision in component ``k`` is
``u_nk = (df_k + D) / (df_k + delta_nk)`` (``delta`` the Mahalanobis distance), so far rows weigh little.
The E-step's statistics are weighted sums under the responsibilities ``r_nk``: ``sum r``, the ``r u``-weighted
mean and scatter of the rows, and ``sum r (E[log u] - u)``. The M-step (ECM) sets ``loc`` and ``scale`` in
closed form and ``df`` by a 1-D root find; each step maximises the expected complete-data log-likelihood,
so EM never decreases the log-likelihood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import check_float
from ppmix.components.base import ComponentFamily
from ppmix.components.centred import as_floor, padded_counts
from ppmix.components.family import DataScale, DensityFamily, SiteSpec, Statistics
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.statistics import GaussianStatistics

__all__ = ["StudentTComponents", "StudentTFamily", "StudentTStatistics", "solve_df"]

#: the default range of the fitted degrees of freedom: below 0.5 the tails are heavier than any data need;
#: above 200 the t is a Gaussian to within the rounding of a fit
DF_RANGE = (0.5, 200.0)
#: the degrees of freedom of the placeholder components whose parameters the first M-step sets
START_DF = 10.0
#: bisection steps of :func:`solve_df` on ``log df``: the bracket shrinks to below float64's resolution
BISECTION_STEPS = 64


def df_equation(df: torch.Tensor, mean_log_precision: torch.Tensor) -> torch.Tensor:
    """Peel & McLachlan's equation for ``df``: ``log(df / 2) - digamma(df / 2) + 1 + m`` with ``m`` the
    weighted mean of ``E[log u] - u`` (``<= -1``); decreasing in ``df``, zero at the M-step's ``df``.

    Examples
    --------
    >>> df = torch.tensor([4.0], dtype=torch.float64)
    >>> round(float(df_equation(df, -1 - (df.log() - math.log(2) - torch.digamma(df / 2)))), 12)
    0.0
    """
    return (df / 2).log() - torch.digamma(df / 2) + 1 + mean_log_precision


def solve_df(mean_log_precision: torch.Tensor, df_range: tuple[float, float] = DF_RANGE) -> torch.Tensor:
    """The root of :func:`df_equation` in ``df_range`` for every component (bisection on ``log df``, in
    float64), or the end of the range the root lies beyond: the maximiser of the expected complete-data
    log-likelihood in ``df`` over that range (it is concave in ``df``).

    Examples
    --------
    >>> m = torch.tensor([-1.2, -1.0000001, -9.0], dtype=torch.float64)
    >>> [round(v, 4) for v in solve_df(m).tolist()]
    [5.3097, 200.0, 0.5]
    """
    m = mean_log_precision.to(torch.float64)
    smallest, largest = (torch.full_like(m, end) for end in df_range)
    low, high = smallest.log(), largest.log()
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        above = df_equation(middle.exp(), m) > 0  # the root lies above the middle
        low, high = torch.where(above, middle, low), torch.where(above, high, middle)
    df = ((low + high) / 2).exp()
    df = torch.where(df_equation(largest, m) >= 0, largest, df)  # exactly the end the root lies beyond
    return torch.where(df_equation(smallest, m) <= 0, smallest, df).to(mean_log_precision.dtype)


@dataclass(frozen=True)
class StudentTStatistics(Statistics):
    """One E-step's statistics of ``K`` t components: per component the total responsibility ``counts``
    ``(K,)``, the ``r u``-weighted rows as :class:`~ppmix.components.statistics.GaussianStatistics`
    (``sum r u``, the ``r u``-weighted mean and ``sum r u (x - mean)^2``) and ``log_precision``
    ``sum r (E[log u] - u)`` ``(K,)``. They merge exactly (the weighted rows by Chan et al.'s update)."""

    counts: torch.Tensor
    weighted: GaussianStatistics
    log_precision: torch.Tensor

    def merge(self, other: "StudentTStatistics") -> "StudentTStatistics":
        return StudentTStatistics(
            self.counts + other.counts, self.weighted.merge(other.weighted), self.log_precision + other.log_precision
        )

    def scaled(self, factor: float) -> "StudentTStatistics":
        return StudentTStatistics(self.counts * factor, self.weighted.scaled(factor), self.log_precision * factor)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "StudentTStatistics":
        return StudentTStatistics(
            self.counts.to(dtype=dtype, device=device),
            self.weighted.to(dtype=dtype, device=device),
            self.log_precision.to(dtype=dtype, device=device),
        )


class StudentTComponents(ComponentFamily):
    """``K`` multivariate t components with diagonal scale: degrees of freedom ``df`` ``(K,)``, ``loc`` and
    ``scale`` ``(K, D)``; the log-density is the multivariate t's with ``Sigma_k = diag(scale_k^2)``.

    Parameters
    ----------
    df, loc, scale : Tensor
        Positive degrees of freedom ``(K,)``, locations ``(K, D)`` and positive scales ``(K, D)``.
    reg_covar : float or Tensor (D,), default 1e-6
        The floor of the fitted ``scale^2`` (per feature when a tensor), as the Gaussian's variance floor.
    df_range : tuple of float, default (0.5, 200)
        The range of the fitted ``df`` (:func:`solve_df`).

    Examples
    --------
    >>> f64 = torch.float64
    >>> comp = StudentTComponents(*(torch.tensor(v, dtype=f64) for v in ([3.0], [[0.0, 0.0]], [[1.0, 1.0]])))
    >>> x = torch.tensor([[0.0, 0.0], [10.0, 0.0]], dtype=f64)
    >>> comp.precision_weights(x).ravel().tolist()  # (df + D) / (df + delta): the far row weighs little
    [1.6666666666666667, 0.04854368932038835]
    """

    param_names = ("df", "loc", "scale")

    def __init__(
        self,
        df: torch.Tensor,
        loc: torch.Tensor,
        scale: torch.Tensor,
        reg_covar: float | torch.Tensor = 1e-6,
        df_range: tuple[float, float] = DF_RANGE,
    ) -> None:
        df, loc, scale = torch.as_tensor(df), torch.as_tensor(loc), torch.as_tensor(scale)
        if loc.dim() != 2 or scale.shape != loc.shape or df.shape != loc.shape[:1]:
            raise ValueError(
                f"df, loc and scale must have shapes (K,), (K, D), (K, D); got {tuple(df.shape)}, "
                f"{tuple(loc.shape)}, {tuple(scale.shape)}"
            )
        if not bool((scale > 0).all()) or not bool((df > 0).all()):
            raise ValueError("df and scale must be positive")
        self.df, self.loc, self.scale = df, loc, scale
        self.reg_covar, self.df_range = as_floor(reg_covar), (float(df_range[0]), float(df_range[1]))

    @property
    def n_features(self) -> int:
        return int(self.loc.shape[1])

    @property
    def mean(self) -> torch.Tensor:
        """The locations ``(K, D)`` (the means where ``df > 1``)."""
        return self.loc

    @property
    def covariance(self) -> torch.Tensor:
        """The variances ``scale^2 df / (df - 2)`` ``(K, D)`` (infinite where ``df <= 2``)."""
        inflation = torch.where(self.df > 2, self.df / (self.df - 2), torch.inf)
        return self.scale.square() * inflation[:, None]

    def mahalanobis(self, data: torch.Tensor) -> torch.Tensor:
        """``delta_nk = sum_d ((x_nd - loc_kd) / scale_kd)^2``, ``(N, K)`` (from the deviations, one component at
        a time: no cancellation for rows far from the origin)."""
        x = data.to(self.dtype)
        return torch.stack([((x - self.loc[k]) / self.scale[k]).square().sum(1) for k in range(self.n_components)], 1)

    def precision_weights(self, data: torch.Tensor) -> torch.Tensor:
        """The expected latent precisions ``u_nk = (df_k + D) / (df_k + delta_nk)`` ``(N, K)``."""
        return (self.df + self.n_features) / (self.df + self.mahalanobis(data))

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        """``log Gamma((df + D) / 2) - log Gamma(df / 2) - D/2 log(df pi) - sum_d log scale - (df + D)/2
        log(1 + delta / df)``, ``(N, K)``."""
        d = self.n_features
        half = (self.df + d) / 2
        const = torch.lgamma(half) - torch.lgamma(self.df / 2) - d / 2 * (self.df * math.pi).log()
        return const - self.scale.log().sum(1) - half * torch.log1p(self.mahalanobis(data) / self.df)

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> StudentTStatistics:
        """The E-step's statistics under the responsibilities ``weights`` ``(N, K)`` and the current parameters.

        Examples
        --------
        >>> f64 = torch.float64
        >>> comp = StudentTComponents(*(torch.tensor(v, dtype=f64) for v in ([4.0], [[0.0]], [[1.0]])))
        >>> x, ones = torch.tensor([[0.0], [1.0], [30.0]], dtype=f64), torch.ones(3, 1, dtype=f64)
        >>> merged = comp.statistics(x[:2], ones[:2]).merge(comp.statistics(x[2:], ones[2:]))
        >>> whole = comp.statistics(x, ones)
        >>> bool(torch.allclose(merged.weighted.scatter, whole.weighted.scatter)), merged.counts.item()
        (True, 3.0)
        """
        x = data.to(self.dtype)
        weights = self._check_weights(weights, x.shape[0])
        delta = self.mahalanobis(x)
        half = (self.df + self.n_features) / 2
        precision = half / ((self.df + delta) / 2)
        expected_log = torch.digamma(half) - ((self.df + delta) / 2).log()
        weighted = weights * precision
        totals = weighted.sum(0)
        mean = weighted.T @ x / padded_counts(totals)[:, None]
        scatter = torch.stack([weighted[:, k] @ (x - mean[k]).square() for k in range(self.n_components)])
        log_precision = (weights * (expected_log - precision)).sum(0)
        return StudentTStatistics(weights.sum(0), GaussianStatistics(totals, mean, scatter), log_precision)

    def fit_statistics(self, stats: StudentTStatistics) -> "StudentTComponents":
        """One ECM M-step, in place: ``loc`` the ``r u``-weighted mean, ``scale^2 = max(sum r u (x - loc)^2 /
        sum r, reg_covar)``, ``df`` the root of :func:`df_equation` in ``df_range``."""
        stats = stats.to(dtype=self.dtype, device=self.device)
        counts = padded_counts(stats.counts)
        floor = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device)
        self.loc = stats.weighted.mean
        self.scale = torch.maximum(stats.weighted.scatter / counts[:, None], floor).sqrt()
        self.df = solve_df(stats.log_precision / counts, self.df_range)
        return self

    def fit(self, data: torch.Tensor, weights: torch.Tensor) -> "StudentTComponents":
        """One ECM step under ``weights`` (from the current parameters), in place: repeated, it reaches the
        weighted maximum-likelihood estimate."""
        return self.fit_statistics(self.statistics(data, weights))

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``MultivariateStudentT(df, loc, diag(scale))`` of the components ``index`` (all if None)."""
        params = (self.df, self.loc, self.scale)
        df, loc, scale = params if index is None else (param[index] for param in params)
        return dist.MultivariateStudentT(df, loc, torch.diag_embed(scale))

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draws ``loc + scale * z / sqrt(u)``, ``z ~ N(0, I)``, ``u ~ Gamma(df / 2, df / 2)``: ``index.shape + (D,)``.

        Examples
        --------
        >>> comp = StudentTComponents(torch.tensor([3.0]), torch.zeros(1, 2), torch.ones(1, 2))
        >>> comp.sample(torch.zeros(5, dtype=torch.long), torch.Generator().manual_seed(0)).shape
        torch.Size([5, 2])
        """
        half = (self.df[index] / 2).cpu()
        seed = int(torch.randint(2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            precision = torch._standard_gamma(half) / half
        noise = torch.randn((*index.shape, self.n_features), generator=generator, dtype=self.dtype, device=self.device)
        return self.loc[index] + self.scale[index] * noise / precision.to(self.device).sqrt()[..., None]


class StudentTFamily(DensityFamily):
    """Student-t components with diagonal scale, for heavy-tailed real data (registered as ``"student_t"``).

    Parameters
    ----------
    reg_covar : float, default 1e-6
        The floor of ``scale^2`` relative to the data, as :class:`~ppmix.components.gaussian_family.GaussianFamily`'s.
    min_df, max_df : float, default 0.5 and 200
        The range of the fitted degrees of freedom (the M-step's root find is bracketed there; a root beyond
        it gives the nearer end, which is the constrained maximiser).

    Notes
    -----
    The Pyro sites are ``df`` ``(K,)``, ``loc`` and ``scale`` ``(K, D)``; under MCMC their priors are
    ``df ~ Gamma(2, 0.1)`` (mean 20), ``loc ~ N(mean(X), 3 std(X))`` and ``scale ~ LogNormal(log std(X), 1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.standard_t(3, (300, 2)), 10 + rng.standard_t(3, (300, 2))])
    >>> mix = Mixture(2, family="student_t", seed=0, progress=False).fit(X)
    >>> bool(np.allclose(np.sort(mix.means_.mean(1).numpy()), [0.0, 10.0], atol=0.3))
    True
    """

    name = "student_t"
    components_class = StudentTComponents

    def __init__(self, reg_covar: float = 1e-6, min_df: float = DF_RANGE[0], max_df: float = DF_RANGE[1]) -> None:
        self.reg_covar, self.min_df, self.max_df = reg_covar, min_df, max_df

    def validate(self) -> None:
        check_float(self.reg_covar, "reg_covar", positive=False)
        check_float(self.min_df, "min_df", positive=True)
        check_float(self.max_df, "max_df", positive=True)
        if not self.min_df < self.max_df:
            raise ValueError(f"min_df must be below max_df; got {self.min_df} and {self.max_df}")

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        """The Gaussian family's: column means, standard deviations and the floor of ``scale^2``."""
        return GaussianFamily(reg_covar=self.reg_covar).data_scale(x, name)

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {
            "df": SiteSpec(constraints.positive, ()),
            "loc": SiteSpec(constraints.real, (d,)),
            "scale": SiteSpec(constraints.positive, (d,)),
        }

    def _component_options(self, scale: DataScale) -> dict:
        return {"reg_covar": as_floor(scale.get("floor", self.reg_covar)), "df_range": (self.min_df, self.max_df)}

    def placeholder(self, k: int, d: int, scale: DataScale, opts: dict) -> ComponentFamily:
        """Components at the data's centre and spread with ``df = 10``: the first M-step (from the start's
        responsibilities) weighs every start cluster's rows nearly alike, and ``df`` starts moderately heavy-tailed
        (from ``max_df`` EM takes about three times as many iterations to bring it down to data with ``df = 3``)."""
        mean = scale.get("mean", torch.zeros(d)).to(**opts)
        std = scale.get("std", torch.ones(d)).to(**opts)
        df = torch.full((k,), START_DF, **opts).clamp(self.min_df, self.max_df)
        return self.components({"df": df, "loc": mean.expand(k, d).clone(), "scale": std.expand(k, d).clone()}, scale)

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        if site == "df":
            return dist.Gamma(torch.tensor(2.0, **opts), torch.tensor(0.1, **opts))
        mean = scale.get("mean", torch.zeros(d)).to(**opts)
        std = scale.get("std", torch.ones(d)).to(**opts)
        if site == "loc":
            return dist.Normal(mean, 3.0 * std).to_event(1)
        return dist.LogNormal(std.log(), 1.0).to_event(1)

    def n_parameters(self, k: int, d: int) -> int:
        """``K`` degrees of freedom, ``K D`` locations and ``K D`` scales."""
        return k * (2 * d + 1)
