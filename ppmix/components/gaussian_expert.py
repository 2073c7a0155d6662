"""Gaussian regression experts: ``y | x, k ~ N(x^T coef[k] + intercept[k], scale[k]^2)``."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch.distributions.transforms import PowerTransform

from ppmix.components._linear import LinearFamily, LinearPrior, weighted_grams
from ppmix.components.base import ComponentFamily
from ppmix.components.centred import component_counts
from ppmix.components.expert_family import DEFAULT_PRIOR_SCALE, ExpertFamily, TargetScale
from ppmix.components.family import PriorKey, SiteSpec

__all__ = ["GaussianExpert", "GaussianExpertFamily"]

#: the default rate of the noise variances' inverse-gamma prior under ``priors=``, in units of ``var(y)``
VARIANCE_RATE = 0.01


class GaussianExpert(LinearFamily):
    """``K`` linear-Gaussian regression experts.

    Data are pairs ``(x, y)`` with ``x`` of shape ``(N, P)`` and ``y`` of shape ``(N,)``.

    Parameters
    ----------
    coef : Tensor, shape (K, P)
    intercept : Tensor, shape (K,), optional (zeros)
    scale : Tensor, shape (K,), optional (ones)
        Noise standard deviations.
    ridge : float, default 0.0
        Penalty ``ridge * ||coef[k]||^2`` added to the weighted least squares; in log-likelihood units
        ``ridge ||coef[k]||^2 / (2 scale[k]^2)`` (:meth:`penalty`), a Gaussian prior on the slopes whose
        scale follows the noise, so that :meth:`fit` maximises the penalised likelihood jointly.
    min_variance : float, default 1e-8
        Floor of the noise variance in :meth:`fit`.
    prior : LinearPrior, optional
        Normal priors on the slopes and intercepts (in ``y``'s units, not scaled by the noise; ``ridge`` is then
        unused): :meth:`fit` is a MAP update (see there) and :meth:`penalty` minus their log density.
    variance_prior : (float, float), optional
        With ``prior``: the shape ``a`` and rate ``b`` of an inverse-gamma prior on every noise variance
        ``scale[k]^2`` (as a prior on ``scale[k]``, with its Jacobian ``2 scale[k]``); None: flat in the scale.

    Examples
    --------
    >>> import torch
    >>> experts = GaussianExpert(torch.zeros(2, 3))
    >>> x, y = torch.randn(50, 3), torch.randn(50)
    >>> experts.fit((x, y), torch.rand(50, 2)).log_prob((x, y)).shape
    torch.Size([50, 2])
    """

    param_names = ("coef", "intercept", "scale")

    def __init__(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor | None = None,
        scale: torch.Tensor | None = None,
        ridge: float = 0.0,
        min_variance: float = 1e-8,
        prior: LinearPrior | None = None,
        variance_prior: tuple[float, float] | None = None,
    ) -> None:
        self._init_linear(coef, intercept, ridge, prior=prior)
        self.variance_prior = None if variance_prior is None else (float(variance_prior[0]), float(variance_prior[1]))
        if scale is None:
            scale = torch.ones(self.coef.shape[0], dtype=self.coef.dtype, device=self.coef.device)
        scale = torch.as_tensor(scale)
        if scale.shape != self.coef.shape[:1] or (scale <= 0).any():
            raise ValueError(f"scale must be a positive tensor of shape ({self.coef.shape[0]},)")
        self.scale, self.min_variance = scale.to(self.coef.dtype), float(min_variance)

    def _pair(self, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TypeError("data must be a pair (x, y)")
        x = self._covariates(data[0])
        y = torch.as_tensor(data[1]).to(device=self.device, dtype=self.dtype)
        if y.shape != (x.shape[0],):
            raise ValueError(f"y must have shape ({x.shape[0]},); got {tuple(y.shape)}")
        return x, y

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Conditional means ``E[y | x, k]``, shape ``(N, K)``."""
        return self.linear_predictor(x)

    def log_prob(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``log N(y_n | x_n^T coef[k] + intercept[k], scale[k]^2)``, shape ``(N, K)``."""
        x, y = self._pair(data)
        resid = (y[:, None] - self.linear_predictor(x)) / self.scale
        return -0.5 * (math.log(2 * math.pi) + resid.square()) - self.scale.log()

    def fit(self, data: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor) -> "GaussianExpert":
        """Weighted ridge least squares for every expert at once, then the noise variance.

        The exact maximiser of the weighted log-likelihood less :meth:`penalty`: the ridge fit
        does not depend on the noise, and the variance is then
        ``(RSS_k + ridge ||coef[k]||^2) / n_k`` (floored at ``min_variance``). One pass over the
        data: the weighted Grams of ``b = [x, 1, y - mean(y)]`` hold the normal equations and the
        residual sums of squares.

        With a ``prior`` the update is a MAP (ECM) step, which never lowers the weighted log-likelihood less
        :meth:`penalty`: the coefficients maximise it at the current noise scales (ridge least squares with
        precisions ``scale[k]^2 / slope_scale^2`` and ``scale[k]^2 / intercept_scale^2``, towards the prior
        means), then the variance ``(RSS_k + 2 b) / (n_k + 2 a + 1)`` at those coefficients (``b = 0, a = -1/2``
        without ``variance_prior``: ``RSS_k / n_k``).
        """
        x, y = self._pair(data)
        weights = self._check_weights(weights, x.shape[0])
        m = self.n_covariates + 1
        # y enters centred (an exact reparametrisation: the intercept is not penalised) so that y'Wy,
        # and with it the cancellation in the residual sum of squares below, does not carry mean(y)^2
        shift = y.mean()
        b = torch.cat([x, torch.ones_like(y)[:, None], (y - shift)[:, None]], dim=1)  # (N, P+2)
        grams = weighted_grams(b, weights)  # (K, P+2, P+2): [[a'Wa, a'Wy], [y'Wa, y'Wy]]
        a_wa, a_wy, y_wy = grams[:, :m, :m], grams[:, :m, m], grams[:, m, m]
        if self.prior is None:
            theta, info = torch.linalg.solve_ex(a_wa + self._ridge_matrix(), a_wy)
        else:  # at the current noise scales, towards the prior mean (its intercept shifted as y is)
            precision = self.scale.square()[:, None, None] * self._ridge_matrix()
            centre = self._prior_centre()
            centre[-1] -= shift
            theta, info = torch.linalg.solve_ex(a_wa + precision, a_wy + precision @ centre)
        if (info > 0).any():
            raise ValueError("weighted least squares is singular for some expert; set ridge > 0")
        # sum_n w_nk (y_n - a_n'theta_k)^2 = y'Wy - 2 theta'a'Wy + theta'a'Wa theta. Rounding: its absolute
        # error is ~ eps * y'Wy, i.e. a relative error ~ eps / (1 - R^2) with R^2 the fit's weighted
        # coefficient of determination around mean(y) (1e-16 / 1e-6 for a fit with 0.1 % residual sd
        # in float64). Clamped at 0 for fits that are exact up to rounding; min_variance floors it anyway.
        rss = y_wy - 2 * (theta * a_wy).sum(-1) + (theta * (a_wa @ theta[:, :, None]).squeeze(-1)).sum(-1)
        theta[:, -1] += shift
        self._unstack(theta)
        if self.prior is None:
            var = (rss.clamp_min(0) + self.ridge * self.coef.square().sum(-1)) / component_counts(weights)
        else:
            shape, rate = self.variance_prior or (-0.5, 0.0)
            var = (rss.clamp_min(0) + 2 * rate) / (component_counts(weights) + 2 * shape + 1)
        self.scale = var.clamp_min(self.min_variance).sqrt()
        return self

    def penalty(self) -> torch.Tensor:
        """The ridge term of each expert's penalised log-likelihood, ``ridge ||coef[k]||^2 / (2 scale[k]^2)``,
        shape ``(K,)``. With a ``prior``, minus the log prior density up to a constant: the normal priors'
        :meth:`LinearFamily.penalty` plus, with ``variance_prior`` ``(a, b)``, ``(2 a + 1) log scale[k] +
        b / scale[k]^2``.

        Examples
        --------
        >>> import torch
        >>> experts = GaussianExpert(torch.tensor([[3.0, 4.0]]), scale=torch.tensor([5.0]), ridge=2.0)
        >>> experts.penalty().tolist()
        [1.0]
        """
        if self.prior is None:
            return self.ridge * self.coef.square().sum(-1) / (2 * self.scale.square())
        penalty = super().penalty()
        if self.variance_prior is None:
            return penalty
        shape, rate = self.variance_prior
        return penalty + (2 * shape + 1) * self.scale.log() + rate / self.scale.square()

    def response_quadrature(
        self, eta: torch.Tensor, index: torch.Tensor, n_nodes: int = 8
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gauss-Hermite nodes and weights of ``N(eta[n], scale[index[n]]^2)``, each of shape ``(N, n_nodes)``.

        ``sum_j weights[n, j] h(values[n, j])`` approximates ``E[h(y)]`` under the
        component ``index[n]`` with mean ``eta[n]``; it is exact for polynomials ``h`` of
        degree below ``2 n_nodes``. The weights of a row sum to one.

        Examples
        --------
        >>> import torch
        >>> experts = GaussianExpert(torch.zeros(1, 1, dtype=torch.float64), scale=torch.tensor([2.0]))
        >>> y, w = experts.response_quadrature(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0]), 3)
        >>> round(float((w * y).sum()), 12), round(float((w * (y - 1) ** 2).sum()), 12)
        (1.0, 4.0)
        """
        if n_nodes < 1:
            raise ValueError(f"n_nodes must be a positive integer; got {n_nodes!r}")
        nodes, node_weights = np.polynomial.hermite.hermgauss(n_nodes)
        nodes = torch.as_tensor(nodes, dtype=self.dtype, device=self.device)
        node_weights = torch.as_tensor(node_weights / math.sqrt(math.pi), dtype=self.dtype, device=self.device)
        values = eta[:, None] + math.sqrt(2.0) * self.scale[index][:, None] * nodes
        return values, node_weights.expand_as(values)

    def pyro_dist(self, index: torch.Tensor | None = None, x: torch.Tensor | None = None) -> dist.Distribution:
        """``Normal(x^T coef[index] + intercept[index], scale[index])`` for covariates ``x``."""
        if x is None:
            raise ValueError("x (the covariates) is required for an expert's distribution")
        scale = self.scale if index is None else self.scale[index]
        return dist.Normal(self._indexed_predictor(index, x), scale)

    def sample(self, index: torch.Tensor, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Responses ``y_n`` drawn from expert ``index[n]`` at covariates ``x[n]``."""
        mean = self._indexed_predictor(index, self._covariates(x))
        noise = torch.randn(mean.shape, generator=generator, dtype=self.dtype, device=self.device)
        return mean + self.scale[index] * noise

    def kl(self, other: "GaussianExpert", x: torch.Tensor) -> torch.Tensor:
        """``KL(p_k(y|x_n) || q_l(y|x_n))`` for every point and pair, shape ``(N, K, K')``."""
        index = torch.arange(self.n_components, device=self.coef.device)[:, None]
        return self.kl_at_predictors(self.mean(x)[:, :, None], index, other, other.mean(x)[:, None, :])

    def kl_at_predictors(
        self, eta_p: torch.Tensor, index_p: torch.Tensor, other: "GaussianExpert", eta_q: torch.Tensor
    ) -> torch.Tensor:
        """``KL(N(eta_p, scale[index_p]^2) || N(eta_q, other.scale^2))``, broadcast over the trailing axis ``K'``.

        ``eta_p`` holds means of this family's components ``index_p`` (same shape) and
        ``eta_q`` the means of all of ``other``'s components at the same points
        (``(..., K')``): the cost of moving a component of one mixture to each of another's.

        Examples
        --------
        >>> import torch
        >>> p = GaussianExpert(torch.zeros(2, 1), scale=torch.tensor([1.0, 2.0]))
        >>> p.kl_at_predictors(torch.zeros(1, 1), torch.tensor([[1]]), p, torch.zeros(1, 2)).tolist()
        [[0.8068528175354004, 0.0]]
        """
        var_p, var_q = self.scale.square()[index_p], other.scale.square()
        return 0.5 * (var_q.log() - var_p.log() + (var_p + (eta_p - eta_q).square()) / var_q - 1.0)


class GaussianExpertFamily(ExpertFamily):
    """Linear-Gaussian regression experts for :class:`~ppmix.models.MixtureOfExperts` (``expert="gaussian"``):
    sites ``coef``, ``intercept`` and the noise ``scale``; under MCMC ``intercept ~ N(mean(y), 10 std(y))``
    and ``scale ~ LogNormal(log std(y), 1)``. Under a model's ``priors=`` (:meth:`configured_prior`): ``coef ~
    N(0, (slope_scale std(y))^2)``, ``intercept ~ N(mean(y), (intercept_scale std(y))^2)`` and ``scale^2 ~
    InverseGamma(variance_concentration, variance_rate var(y))``.

    Examples
    --------
    >>> GaussianExpertFamily().n_parameters(2, 3, None)
    10
    """

    name = "gaussian"
    target_kind = "real"
    default_ridge = 1e-6

    def sites(self, k: int, p: int, n_classes: int | None) -> dict[str, SiteSpec]:
        return {**super().sites(k, p, n_classes), "scale": SiteSpec(constraints.positive, ())}

    def site_dims(self) -> dict[str, list[str]]:
        return {**super().site_dims(), "scale": ["expert"]}

    def prior_keys(self) -> dict[str, PriorKey]:
        """The slopes' and intercepts' prior sds (in units of ``std(y)``) and the noise variances' inverse-gamma prior.

        Examples
        --------
        >>> sorted(GaussianExpertFamily().prior_keys())
        ['intercept_scale', 'slope_scale', 'variance_concentration', 'variance_rate']
        """
        return {
            "slope_scale": PriorKey(
                f"the prior sd of every expert slope, in units of std(y) (default {DEFAULT_PRIOR_SCALE:g})"
            ),
            "intercept_scale": PriorKey(
                f"the prior sd of every expert intercept around mean(y), in units of std(y) (default "
                f"{DEFAULT_PRIOR_SCALE:g})"
            ),
            "variance_concentration": PriorKey("the inverse-gamma shape of every noise variance (default 1)"),
            "variance_rate": PriorKey(
                f"the inverse-gamma rate of every noise variance, in units of var(y) (default {VARIANCE_RATE:g})"
            ),
        }

    def linear_prior(self, priors: Mapping[str, float], scale: TargetScale) -> LinearPrior:
        """Normal priors on the slopes (at 0) and the intercepts (at ``mean(y)``) whose sds are in units of
        ``std(y)``."""
        prior = super().linear_prior(priors, scale)
        y_std = float(scale.get("std", torch.tensor(1.0)))
        y_mean = float(scale.get("mean", torch.tensor(0.0)))
        return LinearPrior(prior.slope_scale * y_std, prior.intercept_scale * y_std, y_mean)

    def variance_prior(self, priors: Mapping[str, float], scale: TargetScale) -> tuple[float, float]:
        """The shape and rate of the inverse-gamma prior on every noise variance."""
        y_var = float(scale.get("std", torch.tensor(1.0))) ** 2
        return float(priors.get("variance_concentration", 1.0)), float(
            priors.get("variance_rate", VARIANCE_RATE)
        ) * y_var

    def configured_prior(
        self, site: str, k: int, event: tuple[int, ...], priors: Mapping[str, float], scale: TargetScale, opts: dict
    ) -> dist.Distribution:
        """``scale^2 ~ InverseGamma(a, b)`` (a prior on ``scale``, with its Jacobian), else the normal priors."""
        if site != "scale":
            return super().configured_prior(site, k, event, priors, scale, opts)
        shape, rate = self.variance_prior(priors, scale)
        variance = dist.InverseGamma(torch.full((k,), shape, **opts), torch.full((k,), rate, **opts))
        return dist.TransformedDistribution(variance, [PowerTransform(0.5)])

    def prior(self, site: str, k: int, event: tuple[int, ...], scale: TargetScale, opts: dict) -> dist.Distribution:
        y_mean = scale.get("mean", torch.tensor(0.0)).to(**opts)
        y_std = scale.get("std", torch.tensor(1.0)).to(**opts)
        if site == "scale":
            return dist.LogNormal(y_std.log().expand(k), 1.0)
        if site == "intercept":
            return dist.Normal(torch.zeros(k, **opts) + y_mean, 10.0 * y_std)
        return super().prior(site, k, event, scale, opts)

    def experts(
        self,
        params: dict[str, torch.Tensor],
        ridge: float,
        newton_steps: int,
        noise_floor: float,
        priors: Mapping[str, float] | None = None,
        scale: TargetScale | None = None,
    ) -> Any:
        if priors is None:
            return GaussianExpert(**params, ridge=ridge, min_variance=noise_floor)
        prior, variance = self.linear_prior(priors, scale or {}), self.variance_prior(priors, scale or {})
        return GaussianExpert(**params, min_variance=noise_floor, prior=prior, variance_prior=variance)

    def n_parameters(self, k: int, p: int, n_classes: int | None) -> int:
        return super().n_parameters(k, p, n_classes) + k

    def expected_target(self, experts: ComponentFamily, x: torch.Tensor) -> torch.Tensor:
        return experts.mean(x)
