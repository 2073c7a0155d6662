"""The Student-t family of heavy-tailed real data: ``K`` components over ``D`` features,
``x | k ~ t_{df_k}(loc_k, Sigma_k)`` (the multivariate t: the features share the component's latent precision)
with a diagonal scale matrix ``Sigma_k = diag(scale_k^2)`` or a full one ``Sigma_k = scale_tril_k
scale_tril_k^T`` (``covariance_type="full"``). Registered as ``"student_t"``.

As a Gaussian scale mixture, ``x = loc + L z / sqrt(u)`` (``L L^T = Sigma``) with ``z ~ N(0, I)`` and
``u ~ Gamma(df / 2, df / 2)``, the t admits EM (Peel & McLachlan 2000, "Robust mixture modelling using
the t distribution"): under the current parameters a row's expected precision in component ``k`` is
``u_nk = (df_k + D) / (df_k + delta_nk)`` (``delta`` the Mahalanobis distance), so far rows weigh little.
The E-step's statistics are weighted sums under the responsibilities ``r_nk``: ``sum r``, the ``r u``-weighted
mean and scatter of the rows, and ``sum r (E[log u] - u)``. The M-step (ECM) sets ``loc`` and ``Sigma`` in
closed form and ``df`` by a 1-D root find; each step maximises the expected complete-data log-likelihood,
so EM never decreases the log-likelihood.
"""

from __future__ import annotations

import functools
import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import check_float
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.centred import as_floor, padded_counts
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    FamilyPriors,
    PriorKey,
    SiteSpec,
    with_priors,
)
from ppmix.components.family_tools import prior_value
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_full import FullGaussian, checked_cholesky, floored_covariance
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.components.student_t_missing import ObservedFullStudentT, ObservedStudentT
from ppmix.components.student_t_statistics import StudentTStatistics

__all__ = [
    "FullStudentTComponents",
    "StudentTBase",
    "StudentTComponents",
    "StudentTFamily",
    "StudentTPriors",
    "StudentTStatistics",
    "solve_df",
]

#: the default range of the fitted degrees of freedom: below 0.5 the tails are heavier than any data need;
#: above 200 the t is a Gaussian to within the rounding of a fit
DF_RANGE = (0.5, 200.0)
#: the degrees of freedom EM starts from (the ``df`` site's start value), which the first M-step updates
START_DF = 10.0
#: the family's scale matrices: diagonal (:class:`StudentTComponents`) or full (:class:`FullStudentTComponents`)
COVARIANCE_TYPES = ("diag", "full")
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


def solve_df(
    mean_log_precision: torch.Tensor,
    df_range: tuple[float, float] = DF_RANGE,
    prior: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The root of :func:`df_equation` in ``df_range`` for every component (bisection on ``log df``, in
    float64), or the end of the range the root lies beyond: the maximiser of the expected complete-data
    log-likelihood in ``df`` over that range (it is concave in ``df``).

    ``prior``: ``(a, b, n)``, a ``Gamma(a, b)`` prior on ``df`` (``a >= 1``) and the components' total
    responsibilities ``n`` ``(K,)``: the root of ``df_equation + 2 ((a - 1) / df - b) / n`` (still decreasing in
    ``df``), the maximiser of the expected complete-data log-likelihood plus ``log Gamma(df | a, b)`` (MAP-EM's).

    Examples
    --------
    >>> m = torch.tensor([-1.2, -1.0000001, -9.0], dtype=torch.float64)
    >>> [round(v, 4) for v in solve_df(m).tolist()]
    [5.3097, 200.0, 0.5]
    >>> a, b, empty = torch.tensor(2.0), torch.tensor(0.1), torch.zeros(1)
    >>> round(solve_df(torch.zeros(1), prior=(a, b, empty)).item(), 4)  # no rows: the prior's mode (a - 1) / b
    10.0
    """
    m = mean_log_precision.to(torch.float64)
    if prior is None:
        equation = df_equation
    else:
        a, b, counts = (torch.as_tensor(v, dtype=torch.float64) for v in prior)
        counts = padded_counts(counts)

        def equation(df: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return df_equation(df, m) + 2 * ((a - 1) / df - b) / counts

    smallest, largest = (torch.full_like(m, end) for end in df_range)
    low, high = smallest.log(), largest.log()
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        above = equation(middle.exp(), m) > 0  # the root lies above the middle
        low, high = torch.where(above, middle, low), torch.where(above, high, middle)
    df = ((low + high) / 2).exp()
    df = torch.where(equation(largest, m) >= 0, largest, df)  # exactly the end the root lies beyond
    return torch.where(equation(smallest, m) <= 0, smallest, df).to(mean_log_precision.dtype)


class StudentTBase(ComponentFamily):
    """What the t components of both variants share: ``K`` multivariate t components with degrees of freedom
    ``df`` ``(K,)``, ``loc`` ``(K, D)`` and a scale matrix ``Sigma_k`` (diagonal: :class:`StudentTComponents`;
    full: :class:`FullStudentTComponents`). A subclass gives the Mahalanobis distances, the log-determinant, the
    scatter of the weighted rows, the scale's M-step and the Cholesky factors of ``Sigma_k``."""

    param_names = ("df", "loc")

    def _set_common(
        self, df: torch.Tensor, loc: torch.Tensor, reg_covar: float | torch.Tensor, df_range: tuple[float, float]
    ) -> None:
        if not bool((df > 0).all()):
            raise ValueError("df must be positive")
        self.df, self.loc = df, loc
        self.reg_covar, self.df_range = as_floor(reg_covar), (float(df_range[0]), float(df_range[1]))

    @property
    def n_features(self) -> int:
        return int(self.loc.shape[1])

    def _covariance_inflation(self) -> torch.Tensor:
        """``df / (df - 2)`` ``(K,)``, the covariance over ``Sigma`` (infinite where ``df <= 2``)."""
        return torch.where(self.df > 2, self.df / (self.df - 2), torch.inf)

    def mahalanobis(self, data: torch.Tensor) -> torch.Tensor:
        """``delta_nk = (x_n - loc_k)^T Sigma_k^{-1} (x_n - loc_k)`` ``(N, K)``."""
        raise NotImplementedError

    def log_det(self) -> torch.Tensor:
        """``log |Sigma_k|^{1/2}`` ``(K,)``."""
        raise NotImplementedError

    def scale_tril_matrix(self) -> torch.Tensor:
        """The lower Cholesky factors of ``Sigma_k`` ``(K, D, D)``."""
        raise NotImplementedError

    def _scatter(self, weighted: torch.Tensor, x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``sum_n w_nk (x_n - mean_k)^2`` ``(K, D)`` (diagonal) or its outer products ``(K, D, D)`` (full)."""
        raise NotImplementedError

    def _fit_scale(self, scatter: torch.Tensor, counts: torch.Tensor) -> None:
        """The scale's M-step from the ``r u``-weighted scatter and the total responsibilities, in place."""
        raise NotImplementedError

    def _scaled_noise(self, noise: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Standard normal ``noise`` ``index.shape + (D,)`` times the Cholesky factor of ``Sigma_index``."""
        raise NotImplementedError

    def precision_weights(self, data: torch.Tensor) -> torch.Tensor:
        """The expected latent precisions ``u_nk = (df_k + D) / (df_k + delta_nk)`` ``(N, K)``."""
        return (self.df + self.n_features) / (self.df + self.mahalanobis(data))

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        """``log Gamma((df + D) / 2) - log Gamma(df / 2) - D/2 log(df pi) - log |Sigma|^{1/2} - (df + D)/2
        log(1 + delta / df)``, ``(N, K)``."""
        return self._log_prob(self.mahalanobis(data))

    def _log_prob(self, delta: torch.Tensor) -> torch.Tensor:
        d = self.n_features
        half = (self.df + d) / 2
        const = torch.lgamma(half) - torch.lgamma(self.df / 2) - d / 2 * (self.df * math.pi).log()
        return const - self.log_det() - half * torch.log1p(delta / self.df)

    def _scored(self, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-densities and the distances ``delta`` they come from: the statistics reuse them (one pass over
        the components, not two)."""
        delta = self.mahalanobis(data)
        return self._log_prob(delta), delta

    def _statistics_given(self, data: torch.Tensor, weights: torch.Tensor, shared: torch.Tensor) -> StudentTStatistics:
        return self._statistics(data.to(self.dtype), self._check_weights(weights, data.shape[0]), shared)

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
        return self._statistics(x, self._check_weights(weights, x.shape[0]), self.mahalanobis(x))

    def _statistics(self, x: torch.Tensor, weights: torch.Tensor, delta: torch.Tensor) -> StudentTStatistics:
        half = (self.df + self.n_features) / 2
        precision = half / ((self.df + delta) / 2)
        expected_log = torch.digamma(half) - ((self.df + delta) / 2).log()
        weighted = weights * precision
        totals = weighted.sum(0)
        mean = weighted.T @ x / padded_counts(totals)[:, None]
        log_precision = (weights * (expected_log - precision)).sum(0)
        scatter = self._scatter(weighted, x, mean)
        return StudentTStatistics(weights.sum(0), GaussianStatistics(totals, mean, scatter), log_precision)

    def fit_statistics(self, stats: StudentTStatistics) -> "StudentTBase":
        """One ECM M-step, in place: ``loc`` the ``r u``-weighted mean, ``Sigma`` the ``r u``-weighted scatter over
        ``sum r`` under the floor ``reg_covar``, ``df`` the root of :func:`df_equation` in ``df_range``."""
        stats = stats.to(dtype=self.dtype, device=self.device)
        counts = padded_counts(stats.counts)
        self._fit_scale(stats.weighted.scatter, counts)
        self.loc = stats.weighted.mean
        self.df = solve_df(stats.log_precision / counts, self.df_range)
        return self

    def fit(self, data: torch.Tensor, weights: torch.Tensor) -> "StudentTBase":
        """One ECM step under ``weights`` (from the current parameters), in place: repeated, it reaches the
        weighted maximum-likelihood estimate."""
        return self.fit_statistics(self.statistics(data, weights))

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``MultivariateStudentT(df, loc, scale_tril)`` of the components ``index`` (all if None)."""
        params = (self.df, self.loc, self.scale_tril_matrix())
        df, loc, tril = params if index is None else (param[index] for param in params)
        return dist.MultivariateStudentT(df, loc, tril)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draws ``loc + L z / sqrt(u)``, ``z ~ N(0, I)``, ``u ~ Gamma(df / 2, df / 2)``, ``L L^T = Sigma``:
        ``index.shape + (D,)``.

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
        return self.loc[index] + self._scaled_noise(noise, index) / precision.to(self.device).sqrt()[..., None]


class StudentTComponents(StudentTBase):
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
        if not bool((scale > 0).all()):
            raise ValueError("df and scale must be positive")
        self._set_common(df, loc, reg_covar, df_range)
        self.scale = scale

    def moments(self) -> Moments:
        """The locations (the means where ``df > 1``) and the variances ``scale^2 df / (df - 2)`` ``(K, D)``
        (infinite where ``df <= 2``)."""
        return Moments(self.loc, self.scale.square() * self._covariance_inflation()[:, None])

    def observed(self) -> ComponentFamily:
        """The components seen through the observed entries of rows with missing entries
        (:class:`~ppmix.components.student_t_missing.ObservedStudentT`)."""
        return ObservedStudentT(self)

    def mahalanobis(self, data: torch.Tensor) -> torch.Tensor:
        """``delta_nk = sum_d ((x_nd - loc_kd) / scale_kd)^2``, ``(N, K)`` (from the deviations, one component at
        a time: no cancellation for rows far from the origin)."""
        x = data.to(self.dtype)
        return torch.stack([((x - self.loc[k]) / self.scale[k]).square().sum(1) for k in range(self.n_components)], 1)

    def log_det(self) -> torch.Tensor:
        return self.scale.log().sum(1)

    def scale_tril_matrix(self) -> torch.Tensor:
        return torch.diag_embed(self.scale)

    def _scatter(self, weighted: torch.Tensor, x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return torch.stack([weighted[:, k] @ (x - mean[k]).square() for k in range(self.n_components)])

    def _fit_scale(self, scatter: torch.Tensor, counts: torch.Tensor) -> None:
        """``scale^2 = max(sum r u (x - loc)^2 / sum r, reg_covar)``."""
        floor = torch.as_tensor(self.reg_covar, dtype=self.dtype, device=self.device)
        self.scale = torch.maximum(scatter / counts[:, None], floor).sqrt()

    def _scaled_noise(self, noise: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self.scale[index] * noise


class FullStudentTComponents(StudentTBase):
    """``K`` multivariate t components with full scale matrices ``Sigma_k = scale_tril_k scale_tril_k^T``:
    ``df`` ``(K,)``, ``loc`` ``(K, D)``, ``scale_tril`` ``(K, D, D)``.

    Parameters
    ----------
    df, loc, scale_tril : Tensor
        Positive degrees of freedom ``(K,)``, locations ``(K, D)`` and lower Cholesky factors ``(K, D, D)``
        (positive diagonal).
    reg_covar : float or Tensor (D,), default 1e-6
        The floor of the fitted ``Sigma``: ``Sigma >= diag(reg_covar)``, as the full Gaussian's
        (:func:`~ppmix.components.gaussian_full.floored_covariance`).
    df_range : tuple of float, default (0.5, 200)
        The range of the fitted ``df`` (:func:`solve_df`).

    Examples
    --------
    >>> f64 = torch.float64
    >>> tril = torch.tensor([[[1.0, 0.0], [0.8, 0.6]]], dtype=f64)  # unit variances, correlation 0.8
    >>> comp = FullStudentTComponents(torch.tensor([3.0], dtype=f64), torch.zeros(1, 2, dtype=f64), tril)
    >>> x = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=f64)
    >>> [round(v, 4) for v in comp.mahalanobis(x).ravel().tolist()]  # along the correlation, then across it
    [1.1111, 10.0]
    """

    param_names = ("df", "loc", "scale_tril")

    def __init__(
        self,
        df: torch.Tensor,
        loc: torch.Tensor,
        scale_tril: torch.Tensor,
        reg_covar: float | torch.Tensor = 1e-6,
        df_range: tuple[float, float] = DF_RANGE,
    ) -> None:
        df, loc, scale_tril = torch.as_tensor(df), torch.as_tensor(loc), torch.as_tensor(scale_tril)
        if loc.dim() != 2 or scale_tril.shape != (*loc.shape, loc.shape[1]) or df.shape != loc.shape[:1]:
            raise ValueError(
                f"df, loc and scale_tril must have shapes (K,), (K, D), (K, D, D); got {tuple(df.shape)}, "
                f"{tuple(loc.shape)}, {tuple(scale_tril.shape)}"
            )
        if not bool((torch.diagonal(scale_tril, dim1=-2, dim2=-1) > 0).all()):
            raise ValueError("scale_tril must have a positive diagonal")
        self._set_common(df, loc, reg_covar, df_range)
        self.scale_tril = scale_tril.tril()

    def moments(self) -> Moments:
        """The locations ``(K, D)`` (the means where ``df > 1``) and the covariances ``Sigma df / (df - 2)``
        ``(K, D, D)`` (infinite where ``df <= 2``)."""
        return Moments(self.loc, self.scale_tril @ self.scale_tril.mT * self._covariance_inflation()[:, None, None])

    def observed(self) -> ComponentFamily:
        """The components seen through the observed entries of rows with missing entries
        (:class:`~ppmix.components.student_t_missing.ObservedFullStudentT`)."""
        return ObservedFullStudentT(self)

    def mahalanobis(self, data: torch.Tensor) -> torch.Tensor:
        """``delta_nk = |L_k^{-1} (x_n - loc_k)|^2`` ``(N, K)`` by triangular solves of the deviations from each
        component's ``loc`` (no cancellation for rows far from the origin)."""
        x = data.to(self.dtype)
        return torch.stack(
            [
                torch.linalg.solve_triangular(self.scale_tril[k], (x - self.loc[k]).T, upper=False).square().sum(0)
                for k in range(self.n_components)
            ],
            1,
        )

    def log_det(self) -> torch.Tensor:
        return torch.diagonal(self.scale_tril, dim1=-2, dim2=-1).log().sum(-1)

    def scale_tril_matrix(self) -> torch.Tensor:
        return self.scale_tril

    def _scatter(self, weighted: torch.Tensor, x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        deviations = [x - mean[k] for k in range(self.n_components)]
        return torch.stack([(weighted[:, k, None] * dev).T @ dev for k, dev in enumerate(deviations)])

    def _fit_scale(self, scatter: torch.Tensor, counts: torch.Tensor) -> None:
        """``Sigma = sum r u (x - loc)(x - loc)^T / sum r`` under the floor ``Sigma >= diag(reg_covar)``.

        Raises
        ------
        ValueError
            If a ``Sigma`` is not positive definite even under the floor.
        """
        covs = floored_covariance(scatter / counts[:, None, None], self.reg_covar)
        self.scale_tril = checked_cholesky(covs)

    def _scaled_noise(self, noise: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return (self.scale_tril[index] @ noise.unsqueeze(-1)).squeeze(-1)


def _data_start(key: str, default: float, d: int, k: int, scale: DataScale, opts: dict) -> torch.Tensor:
    """The data scale's ``key`` (``default`` before one is measured) on ``d`` features for each of ``k`` components:
    where the Student-t's ``loc`` (``"mean"``) and scales (``"std"``) start."""
    return scale.get(key, torch.full((d,), default)).to(**opts).expand(k, d).clone()


class StudentTFamily(DensityFamily):
    """Student-t components with diagonal or full scale matrices, for heavy-tailed real data (registered as
    ``"student_t"``).

    Parameters
    ----------
    covariance_type : {"diag", "full"}, default "diag"
        The scale matrices: diagonal (:class:`StudentTComponents`, ``scale`` ``(K, D)``) or full
        (:class:`FullStudentTComponents`, ``scale_tril`` ``(K, D, D)``).
    reg_covar : float, default 1e-6
        The floor of ``scale^2`` (full: ``Sigma >= diag(floor)``) relative to the data, as
        :class:`~ppmix.components.gaussian_family.GaussianFamily`'s.
    min_df, max_df : float, default 0.5 and 200
        The range of the fitted degrees of freedom (the M-step's root find is bracketed there; a root beyond
        it gives the nearer end, which is the constrained maximiser).

    Notes
    -----
    The Pyro sites are ``df`` ``(K,)`` and ``loc`` ``(K, D)``, then ``scale`` ``(K, D)`` (diagonal) or, as the
    full Gaussian's, ``scales`` ``(K, D)`` and ``corr_cholesky`` ``(K, D, D)`` (``scale_tril = scales *
    corr_cholesky``); under MCMC their priors are ``df ~ Gamma(2, 0.1)`` (mean 20) and the Gaussian family's (of
    the same covariance type): ``loc ~ N(mean(X), 3 std(X))``, every ``scale^2 ~ InverseGamma(1, var(X) / 100)`` and
    ``corr_cholesky ~ LKJCholesky(D, 2)``; ``priors=`` sets them (:meth:`StudentTPriors.keys`: the Gaussian's keys and
    ``df_concentration``, ``df_rate``).

    MAP-EM (``engine="em"`` with ``priors``) is the ECM of maximum likelihood with the prior added to each
    conditional step: ``loc`` and ``Sigma`` by the Gaussian family's MAP update
    (:meth:`~ppmix.components.gaussian_family.GaussianPriors.weighted_map_update`) on the ``r u``-weighted rows, whose
    number in ``log |Sigma|`` is ``sum r``; then ``df`` by :func:`solve_df` with its Gamma prior.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.standard_t(3, (300, 2)), 10 + rng.standard_t(3, (300, 2))])
    >>> mix = Mixture(2, family="student_t", seed=0, progress=False).fit(X)
    >>> bool(np.allclose(np.sort(mix.means_.mean(1).numpy()), [0.0, 10.0], atol=0.3))
    True
    >>> from ppmix.components.family_tools import n_parameters
    >>> sorted(StudentTFamily("full").sites(2, 3)), n_parameters(StudentTFamily("full"), 2, 3)
    (['corr_cholesky', 'df', 'loc', 'scales'], 20)
    """

    name = "student_t"

    def __init__(
        self,
        covariance_type: str = "diag",
        reg_covar: float = 1e-6,
        min_df: float = DF_RANGE[0],
        max_df: float = DF_RANGE[1],
    ) -> None:
        self.covariance_type = covariance_type
        self.reg_covar, self.min_df, self.max_df = reg_covar, min_df, max_df
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}; got {self.covariance_type!r}")
        check_float(self.reg_covar, "reg_covar", positive=False)
        check_float(self.min_df, "min_df", positive=True)
        check_float(self.max_df, "max_df", positive=True)
        if not self.min_df < self.max_df:
            raise ValueError(f"min_df must be below max_df; got {self.min_df} and {self.max_df}")

    @property
    def components_class(self) -> type[StudentTBase]:  # type: ignore[override]
        return FullStudentTComponents if self.covariance_type == "full" else StudentTComponents

    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """The Gaussian family's: column means, standard deviations and the floor of ``scale^2``."""
        return GaussianFamily(reg_covar=self.reg_covar).data_scale(x, name, weight)

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        """``df``, ``loc`` and ``scale`` (full: ``scales`` and ``corr_cholesky``). EM starts at the data's centre and
        spread (full: uncorrelated) with ``df = 10``: the first M-step (from the start's responsibilities) weighs
        every start cluster's rows nearly alike, and ``df`` starts moderately heavy-tailed (from ``max_df`` EM takes
        about three times as many iterations to bring it down to data with ``df = 3``)."""
        sites = {
            "df": SiteSpec(constraints.positive, (), start=self._start_df),
            "loc": SiteSpec(constraints.real, (d,), start=functools.partial(_data_start, "mean", 0.0, d)),
        }
        spread = SiteSpec(constraints.positive, (d,), start=functools.partial(_data_start, "std", 1.0, d))
        if self.covariance_type != "full":
            return {**sites, "scale": spread}
        return {**sites, "scales": spread, "corr_cholesky": SiteSpec(constraints.corr_cholesky, (d, d))}

    def _start_df(self, k: int, scale: DataScale, opts: dict) -> torch.Tensor:
        """``df = 10`` (:data:`START_DF`) for each of ``k`` components, within ``[min_df, max_df]``."""
        return torch.full((k,), START_DF, **opts).clamp(self.min_df, self.max_df)

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> ComponentFamily:
        """The Student-t components of the site values, with the training data's variance floor (else
        ``reg_covar``) and the family's range of degrees of freedom."""
        options = {"reg_covar": as_floor(scale.get("floor", self.reg_covar)), "df_range": (self.min_df, self.max_df)}
        if self.covariance_type != "full":
            return StudentTComponents(values["df"], values["loc"], values["scale"], **options)
        corr = values["corr_cholesky"]
        corr = corr / corr.norm(dim=-1, keepdim=True)  # rows of a correlation Cholesky have unit norm
        tril = values["scales"][..., None] * corr
        return FullStudentTComponents(values["df"], values["loc"], tril, **options)

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        if not isinstance(components, FullStudentTComponents):
            return super().site_values(components)
        scales = components.scale_tril.square().sum(-1).sqrt()
        return {
            "df": components.df.clone(),
            "loc": components.loc.clone(),
            "scales": scales,
            "corr_cholesky": components.scale_tril / scales[..., None],
        }

    def priors(self) -> "StudentTPriors":
        return StudentTPriors(self)


class StudentTPriors(FamilyPriors):
    """The priors of :class:`StudentTFamily` (its :meth:`~StudentTFamily.priors`)."""

    family: StudentTFamily

    def _gaussian(self) -> GaussianFamily:
        """The Gaussian family of the same covariance type, with :attr:`prior_settings`: the priors of ``loc`` and
        the scale matrix, and their MAP update."""
        return with_priors(
            GaussianFamily(self.family.covariance_type, self.family.reg_covar), self.family._prior_settings
        )

    def _df_prior(self, opts: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The shape and rate of the Gamma prior of ``df``."""
        return (
            prior_value(self.family, "df_concentration", torch.tensor(2.0, **opts)),
            prior_value(self.family, "df_rate", torch.tensor(0.1, **opts)),
        )

    def _gaussian_view(self, components: StudentTBase) -> ComponentFamily:
        """Gaussian components sharing the t components' ``loc`` and scale matrices (what the Gaussian family's MAP
        update and log prior read)."""
        if isinstance(components, FullStudentTComponents):
            return FullGaussian(components.loc, components.scale_tril, components.reg_covar)
        return DiagGaussian(components.loc, components.scale, components.reg_covar)

    def keys(self) -> dict[str, PriorKey]:
        """The Gaussian family's keys (``locs_loc``, ``locs_scale``, ``variance_concentration``, ``variance_rate``;
        full: ``corr_concentration``), and the Gamma prior of ``df``."""
        return {
            **GaussianFamily(self.family.covariance_type).priors().keys(),
            "df_concentration": PriorKey("the Gamma shape of the degrees of freedom (default 2)", "concentration"),
            "df_rate": PriorKey("the Gamma rate of the degrees of freedom (default 0.1)"),
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        if site == "df":
            return dist.Gamma(*self._df_prior(opts))
        return self._gaussian().priors().prior({"loc": "locs", "scale": "scales"}.get(site, site), k, d, scale, opts)

    def map_update(self, components: StudentTBase, stats: StudentTStatistics, scale: DataScale) -> None:
        """One MAP-ECM step: ``loc`` and the scale matrix by the Gaussian family's MAP update of the ``r u``-weighted
        rows (``sum r`` of them in ``log |Sigma|``), then ``df`` by :func:`solve_df` under its Gamma prior."""
        stats = stats.to(dtype=components.dtype, device=components.device)
        gaussian = self._gaussian_view(components)
        self._gaussian().priors().weighted_map_update(gaussian, stats.weighted, stats.counts, scale)
        components.loc = gaussian.loc
        if isinstance(components, FullStudentTComponents):
            components.scale_tril = gaussian.scale_tril
        else:
            components.scale = gaussian.scale
        a, b = self._df_prior({"dtype": components.dtype, "device": components.device})
        mean_log_precision = stats.log_precision / padded_counts(stats.counts)
        components.df = solve_df(mean_log_precision, components.df_range, prior=(a, b, stats.counts))

    def map_log_prior(self, components: StudentTBase, d: int, scale: DataScale) -> torch.Tensor:
        """The Gaussian family's log prior of ``loc`` and the scale matrix, plus ``log Gamma(df | a, b)``."""
        opts = {"dtype": components.dtype, "device": components.device}
        log_df = dist.Gamma(*self._df_prior(opts)).log_prob(components.df).sum()
        return self._gaussian().priors().map_log_prior(self._gaussian_view(components), d, scale) + log_df
