"""The Normal-Wishart pieces of variational-Bayes EM for Gaussian components (``fit(X, engine="vb")``).

Under the prior ``mu_k | Lambda_k ~ N(m_0, (beta_0 Lambda_k)^{-1})``, ``Lambda_k ~ Wishart(nu_0, W_0)`` (``W_0^{-1}``
the ``covariance_prior``), the optimal factor ``q(mu_k, Lambda_k)`` given the responsibilities is Normal-Wishart
with ``beta_k = beta_0 + N_k``, ``m_k = (beta_0 m_0 + N_k xbar_k) / beta_k``, ``nu_k = nu_0 + N_k`` and
``W_k^{-1} = W_0^{-1} + S_k + N_k beta_0 / beta_k (xbar_k - m_0)(xbar_k - m_0)^T`` (Bishop, *Pattern Recognition and
Machine Learning*, 10.60-10.63; ``S_k`` the weighted scatter about ``xbar_k``). As scikit-learn's
``BayesianGaussianMixture`` (whose conventions these are, so that every iteration matches it), the posterior is kept
as ``covariances_k = W_k^{-1} / nu_k`` (the inverse of the expected precision); ``"tied"`` shares one Wishart factor
whose counts are the mean ``N / K``; ``"diag"`` and ``"spherical"`` apply the same updates to every variance
(spherical: to the mean over the features), scikit-learn's product of Gamma factors written in Wishart form.

:class:`NormalWishartMixture` holds the prepared data and the posterior of ``K`` components: one E-step pass
(the statistics under ``r_nk ∝ exp(E[log w_k] + E[log N(x_n | mu_k, Lambda_k)])``, through the fitted Gaussian
components' fused pass), the posterior update, and the Normal-Wishart terms of the lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from ppmix._validation import check_float
from ppmix.components.base import ComponentFamily
from ppmix.components.centred import CentredData, as_centred, padded_counts
from ppmix.components.family_tools import mixture_statistics
from ppmix.components.gaussian_diag import DiagGaussian, SphericalGaussian
from ppmix.components.gaussian_full import FullGaussian, TiedGaussian, checked_cholesky
from ppmix.components.gaussian_statistics import GaussianStatistics

__all__ = ["COMPONENT_PRIOR_KEYS", "NormalWishartMixture", "NormalWishartPrior", "normal_wishart_prior"]

#: the keys of ``component_prior`` (scikit-learn's names for the same hyperparameters)
COMPONENT_PRIOR_KEYS = ("mean_precision_prior", "mean_prior", "degrees_of_freedom_prior", "covariance_prior")
_MATRIX_TYPES = ("full", "tied")


@dataclass(frozen=True)
class NormalWishartPrior:
    """The Normal-Wishart prior of every component: ``beta_0`` (``mean_precision``), ``m_0`` (``mean``, ``(D,)``),
    ``nu_0`` (``degrees_of_freedom``) and ``W_0^{-1}`` (``covariance``: ``(D, D)`` for full and tied covariances,
    ``(D,)`` diagonal, ``()`` spherical)."""

    mean_precision: float
    mean: torch.Tensor
    degrees_of_freedom: float
    covariance: torch.Tensor


def normal_wishart_prior(
    x: torch.Tensor, covariance_type: str, settings: Mapping[str, Any] | None = None, name: str = "component_prior"
) -> NormalWishartPrior:
    """The prior of the components from ``settings`` (keys :data:`COMPONENT_PRIOR_KEYS`, each optional) and the data
    ``x`` ``(N, D)``; scikit-learn's defaults: ``mean_precision_prior`` 1, ``mean_prior`` the data's mean,
    ``degrees_of_freedom_prior`` ``D`` and ``covariance_prior`` the data's covariance (``ddof=1``; diagonal: the
    variances; spherical: their mean). A bad key or value is a ``ValueError`` naming ``name`` and the key.

    Examples
    --------
    >>> x = torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]], dtype=torch.float64)
    >>> prior = normal_wishart_prior(x, "diag", {"mean_precision_prior": 0.5})
    >>> prior.mean_precision, prior.mean.tolist(), prior.degrees_of_freedom, prior.covariance.tolist()
    (0.5, [2.0, 2.0], 2.0, [4.0, 3.0])
    >>> normal_wishart_prior(x, "full", {"degrees_of_freedom_prior": 0.5})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: component_prior['degrees_of_freedom_prior'] must be greater than D - 1 = 1 ...; got 0.5
    """
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(COMPONENT_PRIOR_KEYS))
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; the keys are {list(COMPONENT_PRIOR_KEYS)}")
    d, opts = x.shape[1], {"dtype": x.dtype, "device": x.device}

    def given(key: str) -> Any:
        return settings.get(key)

    beta = 1.0 if given("mean_precision_prior") is None else _positive(settings, "mean_precision_prior", name)
    mean = x.mean(0) if given("mean_prior") is None else _array(settings, "mean_prior", (d,), name, opts)
    nu = float(d) if given("degrees_of_freedom_prior") is None else _degrees_of_freedom(settings, d, name)
    if given("covariance_prior") is None:
        covariance = _data_covariance(x, covariance_type)
    else:
        covariance = _covariance_prior(settings, covariance_type, d, name, opts)
    return NormalWishartPrior(beta, mean, nu, covariance)


def _positive(settings: Mapping[str, Any], key: str, name: str) -> float:
    try:
        return check_float(settings[key], f"{name}[{key!r}]", positive=True)
    except TypeError as err:
        raise ValueError(str(err)) from None


def _array(settings: Mapping[str, Any], key: str, shape: tuple[int, ...], name: str, opts: dict) -> torch.Tensor:
    value = torch.as_tensor(np.asarray(settings[key], dtype=np.float64), **opts)
    if tuple(value.shape) != shape or not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name}[{key!r}] must be finite numbers of shape {shape}; got shape {tuple(value.shape)}")
    return value


def _degrees_of_freedom(settings: Mapping[str, Any], d: int, name: str) -> float:
    nu = _positive(settings, "degrees_of_freedom_prior", name)
    if nu <= d - 1:
        raise ValueError(
            f"{name}['degrees_of_freedom_prior'] must be greater than D - 1 = {d - 1} (the Wishart's degrees of "
            f"freedom); got {nu}"
        )
    return nu


def _data_covariance(x: torch.Tensor, covariance_type: str) -> torch.Tensor:
    """The data's covariance (``ddof=1``) in the covariance type's layout."""
    centred = x - x.mean(0)
    if covariance_type in _MATRIX_TYPES:
        return centred.T @ centred / (x.shape[0] - 1)
    variances = centred.square().sum(0) / (x.shape[0] - 1)
    return variances.mean() if covariance_type == "spherical" else variances


def _covariance_prior(settings: Mapping[str, Any], covariance_type: str, d: int, name: str, opts: dict) -> torch.Tensor:
    """A given ``covariance_prior``: symmetric positive definite ``(D, D)`` (full, tied), positive ``(D,)`` (diag)
    or a positive number (spherical)."""
    key = "covariance_prior"
    if covariance_type == "spherical":
        return torch.tensor(_positive(settings, key, name), **opts)
    if covariance_type == "diag":
        value = _array(settings, key, (d,), name, opts)
        if not bool((value > 0).all()):
            raise ValueError(f"{name}[{key!r}] must be positive variances for covariance_type='diag'")
        return value
    value = _array(settings, key, (d, d), name, opts)
    symmetric = bool(torch.allclose(value, value.T))
    if not symmetric or torch.linalg.cholesky_ex(value).info.item() != 0:
        raise ValueError(f"{name}[{key!r}] must be a symmetric positive definite (D, D) matrix")
    return value


def _multi_digamma(half_dof: torch.Tensor, d: int) -> torch.Tensor:
    """``sum_{i<D} digamma(nu / 2 - i / 2)`` for every ``nu / 2`` in ``half_dof``."""
    steps = torch.arange(d, dtype=half_dof.dtype, device=half_dof.device) / 2
    return torch.digamma(half_dof[..., None] - steps).sum(-1)


def _multi_lgamma(half_dof: torch.Tensor, d: int) -> torch.Tensor:
    """``sum_{i<D} lgamma(nu / 2 - i / 2)`` (the multivariate gamma function without its ``pi`` term)."""
    steps = torch.arange(d, dtype=half_dof.dtype, device=half_dof.device) / 2
    return torch.lgamma(half_dof[..., None] - steps).sum(-1)


class NormalWishartMixture:
    """The Normal-Wishart posterior of ``K`` Gaussian components on the training data, for variational-Bayes EM.

    Parameters
    ----------
    x : Tensor (N, D)
        The training rows.
    n_components : int
    covariance_type : {"full", "tied", "diag", "spherical"}
    prior : NormalWishartPrior
    floor : float or Tensor (D,)
        Added to the diagonal of every component's weighted covariance (scikit-learn's ``reg_covar``; per feature
        here, :func:`~ppmix.components.gaussian_family.relative_floor`).

    Attributes
    ----------
    mean_precision : Tensor (K,)
        ``beta_k``.
    means : Tensor (K, D)
        ``m_k``.
    degrees_of_freedom : Tensor (K,), or () tied
        ``nu_k``.
    covariances : Tensor
        ``W_k^{-1} / nu_k``: ``(K, D, D)`` full, ``(D, D)`` tied, ``(K, D)`` diag, ``(K,)`` spherical.

    Examples
    --------
    >>> x = torch.tensor([[0.0], [0.2], [5.0], [5.4]], dtype=torch.float64)
    >>> prior = normal_wishart_prior(x, "diag", {"mean_precision_prior": 1e-6})
    >>> mix = NormalWishartMixture(x, 2, "diag", prior, floor=0.0)
    >>> mix.update(mix.statistics(torch.tensor([[1.0, 0], [1, 0], [0, 1], [0, 1]], dtype=torch.float64)))
    >>> [round(v, 3) for v in mix.means[:, 0].tolist()]
    [0.1, 5.2]
    """

    def __init__(
        self,
        x: torch.Tensor,
        n_components: int,
        covariance_type: str,
        prior: NormalWishartPrior,
        floor: float | torch.Tensor = 0.0,
    ) -> None:
        self.data: CentredData = as_centred(x)
        self.n_components, self.covariance_type, self.prior = n_components, covariance_type, prior
        self.floor = torch.as_tensor(floor, dtype=x.dtype, device=x.device).expand(x.shape[1])
        self._plug_in: ComponentFamily = self._placeholder()

    # ------------------------------------------------------------------ the posterior
    def statistics(self, resp: torch.Tensor) -> GaussianStatistics:
        """The weighted statistics ``(N_k, xbar_k, S_k)`` of the rows under responsibilities ``resp`` ``(N, K)``."""
        return self._plug_in.statistics(self.data, resp)

    def update(self, stats: GaussianStatistics) -> None:
        """The Normal-Wishart posterior given the statistics of the responsibilities (the variational M-step)."""
        prior, k = self.prior, self.n_components
        counts = padded_counts(stats.counts)
        self.mean_precision = prior.mean_precision + counts
        sums = counts[:, None] * stats.mean
        self.means = (prior.mean_precision * prior.mean + sums) / self.mean_precision[:, None]
        offset = stats.mean - prior.mean  # xbar_k - m_0
        shrink = counts * prior.mean_precision / self.mean_precision  # N_k beta_0 / beta_k
        if self.covariance_type == "tied":
            total = counts.sum()
            self.degrees_of_freedom = prior.degrees_of_freedom + total / k
            between = (shrink[:, None] * offset).T @ offset / k
            scatter = stats.scatter.sum(0) / k + torch.diag(self.floor * total / k)
            self.covariances = (prior.covariance + scatter + between) / self.degrees_of_freedom
        elif self.covariance_type == "full":
            self.degrees_of_freedom = prior.degrees_of_freedom + counts
            between = shrink[:, None, None] * offset[:, :, None] * offset[:, None, :]
            scatter = stats.scatter + counts[:, None, None] * torch.diag(self.floor)
            self.covariances = (prior.covariance + scatter + between) / self.degrees_of_freedom[:, None, None]
        else:
            self.degrees_of_freedom = prior.degrees_of_freedom + counts
            spread = stats.scatter + counts[:, None] * self.floor + shrink[:, None] * offset.square()
            if self.covariance_type == "spherical":
                spread = spread.mean(1)
                self.covariances = (prior.covariance + spread) / self.degrees_of_freedom
            else:
                self.covariances = (prior.covariance + spread) / self.degrees_of_freedom[:, None]
        self._plug_in = self.components(0.0)

    def _placeholder(self) -> ComponentFamily:
        """Standard Gaussian components of the covariance type's class (whose statistics the first update takes)."""
        x = self.data.x
        zeros = torch.zeros(self.n_components, x.shape[1], dtype=x.dtype, device=x.device)
        if self.covariance_type in _MATRIX_TYPES:
            eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device).expand(self.n_components, -1, -1)
            return (TiedGaussian if self.covariance_type == "tied" else FullGaussian)(zeros, eye, reg_covar=0.0)
        return (SphericalGaussian if self.covariance_type == "spherical" else DiagGaussian)(zeros, zeros + 1.0, 0.0)

    def components(self, floor: float | torch.Tensor) -> ComponentFamily:
        """The fitted Gaussian components: means ``m_k``, covariances :attr:`covariances` (variance floor ``floor``
        for a later EM fit)."""
        k, covs = self.n_components, self.covariances
        if self.covariance_type == "full":
            return FullGaussian(self.means, checked_cholesky(covs), reg_covar=floor)
        if self.covariance_type == "tied":
            tril = checked_cholesky(covs[None]).expand(k, -1, -1).contiguous()
            return TiedGaussian(self.means, tril, reg_covar=floor)
        if self.covariance_type == "spherical":
            return SphericalGaussian(self.means, covs.sqrt()[:, None].expand_as(self.means).contiguous(), floor)
        return DiagGaussian(self.means, covs.sqrt(), reg_covar=floor)

    @property
    def precisions(self) -> torch.Tensor:
        """The expected precisions ``nu_k W_k``, in the layout of :attr:`covariances`."""
        if self.covariance_type in _MATRIX_TYPES:
            return torch.linalg.inv(self.covariances)
        return 1.0 / self.covariances

    # ---------------------------------------------------------------------- E-step
    def _log_det_covariances(self) -> torch.Tensor:
        """``log |covariances_k|`` ``(K,)``."""
        d, covs = self.data.x.shape[1], self.covariances
        if self.covariance_type in _MATRIX_TYPES:
            tril = self._plug_in.scale_tril  # type: ignore[attr-defined]
            return 2 * torch.diagonal(tril, dim1=-2, dim2=-1).log().sum(-1)
        return d * covs.log() if self.covariance_type == "spherical" else covs.log().sum(-1)

    def _expectation_offsets(self) -> torch.Tensor:
        """``E[log N(x | mu_k, Lambda_k)] - log N(x | m_k, covariances_k)`` ``(K,)``: ``(E[log |Lambda_k|] - log
        |nu_k W_k| - D / beta_k) / 2`` with ``E[log |Lambda_k|] = sum_i digamma((nu_k - i) / 2) + D log 2 + log
        |W_k|``."""
        d = self.data.x.shape[1]
        nu = self.degrees_of_freedom.expand(self.n_components)
        expected_log_det = _multi_digamma(nu / 2, d) + d * math.log(2.0)
        return 0.5 * (expected_log_det - d * nu.log() - d / self.mean_precision)

    def expected_log_prob(self) -> torch.Tensor:
        """``E_q[log N(x_n | mu_k, Lambda_k)]`` ``(N, K)`` of every training row (for an HMM's forward-backward)."""
        return self._plug_in.log_prob(self.data) + self._expectation_offsets()

    def e_step(self, log_weights: torch.Tensor) -> tuple[GaussianStatistics, torch.Tensor, torch.Tensor]:
        """One pass over the rows under ``r_nk ∝ exp(log_weights_k + E[log N(x_n | mu_k, Lambda_k)])``
        (``log_weights`` ``E[log w_k]`` ``(K,)``): the statistics of the responsibilities, ``sum_n log sum_k
        exp(...)`` and ``sum_{n,k} r_nk (log_weights_k + E[log N(x_n | k)])`` (from the statistics, so that the
        responsibilities' entropy costs no second pass)."""
        shift = log_weights + self._expectation_offsets()
        stats, log_norm = mixture_statistics(self._plug_in, self.data, shift)
        return stats, log_norm, (stats.counts * shift).sum() + self._plug_in_expectation(stats)

    def _plug_in_expectation(self, stats: GaussianStatistics) -> torch.Tensor:
        """``sum_{n,k} r_nk log N(x_n | m_k, covariances_k)`` from the responsibilities' statistics."""
        d, counts = self.data.x.shape[1], stats.counts
        deviation = stats.mean - self.means
        precisions = self.precisions
        if self.covariance_type in _MATRIX_TYPES:
            if self.covariance_type == "tied":
                precisions = precisions.expand(self.n_components, -1, -1)
            scatter = (precisions * stats.scatter).sum((-2, -1))
            between = torch.einsum("kd,kde,ke->k", deviation, precisions, deviation)
        else:
            precisions = precisions[:, None] if self.covariance_type == "spherical" else precisions
            scatter = (stats.scatter * precisions).sum(-1)
            between = (deviation.square() * precisions).sum(-1)
        quadratic = scatter + counts * between
        return -(counts * (0.5 * d * math.log(2 * math.pi) + 0.5 * self._log_det_covariances())).sum() - 0.5 * (
            quadratic.sum()
        )

    # ----------------------------------------------------------------- lower bound
    def bound_terms(self) -> torch.Tensor:
        """The Normal-Wishart factors' share of the lower bound: ``-sum_k log B(W_k, nu_k) - D / 2 sum_k log beta_k``
        (``B`` the Wishart's normaliser without its ``pi`` term; tied: ``K`` times the one factor's), the terms that
        remain of the bound right after an update once the constants of the prior and the data are dropped
        (scikit-learn's convention)."""
        d, nu = self.data.x.shape[1], self.degrees_of_freedom
        # log |W_k|^{1/2} = -log |nu_k covariances_k| / 2
        half_log_det_w = -0.5 * (self._log_det_covariances() + d * nu.log())
        if self.covariance_type == "tied":
            half_log_det_w = half_log_det_w[:1]
        log_norm = -(nu * half_log_det_w + nu * d * 0.5 * math.log(2.0) + _multi_lgamma(nu / 2, d))
        wishart = log_norm.sum() * (self.n_components if self.covariance_type == "tied" else 1)
        return -wishart - 0.5 * d * self.mean_precision.log().sum()

    def state(self) -> dict[str, torch.Tensor]:
        """The posterior's parameters: ``mean_precision`` ``(K,)``, ``means``, ``degrees_of_freedom`` and
        ``covariances``."""
        return {
            "mean_precision": self.mean_precision,
            "means": self.means,
            "degrees_of_freedom": torch.as_tensor(self.degrees_of_freedom),
            "covariances": self.covariances,
        }
