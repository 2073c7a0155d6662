"""Components that are themselves mixtures of Gaussians: component ``k`` is ``sum_m w_km N(loc_km, Sigma_km)``.

As an HMM's emission (``HMM(3, emission=GaussianMixtureFamily(n_mix=2))`` or ``emission="gmm"``) it is
hmmlearn's ``GMMHMM``: every state emits from its own mixture of ``M`` Gaussians, and Baum–Welch weighs the
state posteriors by the within-state responsibilities. Registered as ``"gmm"``.

The ``K x M`` Gaussians are one batch of the Gaussian family's components (diagonal or full), so the
log-densities, the weighted statistics (mergeable across shards) and the floors are the Gaussian family's own;
this module adds the within-component mixing.

Rows with missing entries (NaN, missing at random; ``missing="marginalize"``) under mixtures of diagonal
Gaussians (:class:`ObservedGaussianMixtures`): each Gaussian scores a row by the marginal density of its observed
entries, the diagonal Gaussian's own (:mod:`ppmix.components.gaussian_missing`), mixed within each component, and
the M-step takes each Gaussian's expected statistics of the missing entries under the responsibilities times the
within-component responsibilities given the observed entries: exact EM on the observed entries, the Gaussian
within a component one more latent label. Mixtures of full-covariance Gaussians refuse the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.algorithms.kmeans import kmeans
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.centred import CentredData, as_centred, as_floor, padded_counts
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    FamilyPriors,
    PriorKey,
    SiteSpec,
    Statistics,
    posterior_mode,
    with_priors,
)
from ppmix.components.family_tools import prior_value
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_full import FullGaussian
from ppmix.components.gaussian_missing import MissingRows, expected_statistics, marginal_log_prob
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.components.independent import ComponentsView

__all__ = [
    "DiagGaussianMixtures",
    "FullGaussianMixtures",
    "GaussianMixtureFamily",
    "GaussianMixturePriors",
    "MixtureStatistics",
    "ObservedGaussianMixtures",
]

#: covariance types of the Gaussians inside a component
MIXTURE_COVARIANCE_TYPES = ("diag", "full")


@dataclass(frozen=True)
class MixtureStatistics(Statistics):
    """The statistics of ``K`` components of ``n_mix`` Gaussians each: the ``K M`` Gaussians' own (``gaussians``,
    component-major), and ``counts`` the components' total weights ``(K,)`` (what a mixture's weights need)."""

    gaussians: GaussianStatistics
    n_mix: int

    @property
    def counts(self) -> torch.Tensor:
        return self.gaussians.counts.reshape(-1, self.n_mix).sum(-1)

    def merge(self, other: Any) -> "MixtureStatistics":
        if not isinstance(other, MixtureStatistics) or other.n_mix != self.n_mix:
            raise TypeError(f"cannot merge MixtureStatistics with {type(other).__name__}")
        return MixtureStatistics(self.gaussians.merge(other.gaussians), self.n_mix)

    def scaled(self, factor: float) -> "MixtureStatistics":
        return MixtureStatistics(self.gaussians.scaled(factor), self.n_mix)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "MixtureStatistics":
        return MixtureStatistics(self.gaussians.to(dtype=dtype, device=device), self.n_mix)


def _identical_within(values: torch.Tensor) -> bool:
    """Whether every component's ``M > 1`` entries of ``values`` ``(K, M, ...)`` are equal."""
    return values.shape[1] > 1 and bool((values == values[:, :1]).all())


class _GaussianMixtures(ComponentFamily):
    """``K`` components, each a mixture of ``M`` Gaussians: ``mix_weights`` ``(K, M)``, ``loc`` ``(K, M, D)`` and the
    spread of :attr:`inner_class` per Gaussian (``scale`` ``(K, M, D)`` or ``scale_tril`` ``(K, M, D, D)``).

    A fresh batch, whose ``M`` Gaussians are identical in every component (where EM starts: the sites' start
    values), splits each component's rows among its Gaussians by weighted k-means in its first :meth:`statistics`,
    since identical Gaussians would never separate.
    """

    inner_class: type[ComponentFamily]
    spread_name: str

    def __init__(
        self,
        mix_weights: torch.Tensor,
        loc: torch.Tensor,
        spread: torch.Tensor,
        reg_covar: float | torch.Tensor = 1e-6,
    ) -> None:
        mix_weights, loc, spread = torch.as_tensor(mix_weights), torch.as_tensor(loc), torch.as_tensor(spread)
        if mix_weights.dim() != 2 or loc.dim() != 3 or loc.shape[:2] != mix_weights.shape:
            raise ValueError(
                f"mix_weights must be (K, M) and loc (K, M, D); got {tuple(mix_weights.shape)}, {tuple(loc.shape)}"
            )
        self.mix_weights, self.loc, self.reg_covar = mix_weights, loc, as_floor(reg_covar)
        setattr(self, self.spread_name, spread)
        self._fresh: bool | None = None  # measured on first use (the Pyro programs never ask)
        self._inner()  # checks the spread's shape and values

    @property
    def fresh(self) -> bool:
        """Whether every component's ``M`` Gaussians are identical (their weights, means and spreads), as where EM
        starts; False once :meth:`take_gaussians` set them."""
        if self._fresh is None:
            spread = getattr(self, self.spread_name)
            self._fresh = (
                _identical_within(self.mix_weights) and _identical_within(self.loc) and _identical_within(spread)
            )
        return self._fresh

    @property
    def n_mix(self) -> int:
        return int(self.mix_weights.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.loc.shape[2])

    def _inner(self) -> ComponentFamily:
        """The ``K M`` Gaussians as one batch of the Gaussian family's components (component-major order)."""
        k, m = self.mix_weights.shape
        spread = getattr(self, self.spread_name)
        return self.inner_class(self.loc.reshape(k * m, -1), spread.reshape(k * m, *spread.shape[2:]), self.reg_covar)

    @property
    def reference(self) -> torch.Tensor:
        """The centre a plain tensor is prepared at: the mean of all the Gaussians' means."""
        return self.loc.reshape(-1, self.n_features).mean(0)

    def _mean(self) -> torch.Tensor:
        """Each component's mean ``sum_m w_km loc_km``, ``(K, D)``."""
        return torch.einsum("km,kmd->kd", self.mix_weights, self.loc)

    def _log_joint(self, data: torch.Tensor | CentredData) -> torch.Tensor:
        """``log w_km + log N(x_n | loc_km, Sigma_km)``, ``(N, K, M)``."""
        data = as_centred(data, self.dtype, self.device, shift=self.reference)
        k, m = self.mix_weights.shape
        return self._inner().log_prob(data).reshape(-1, k, m) + self.mix_weights.log()

    def log_prob(self, data: torch.Tensor | CentredData) -> torch.Tensor:
        """``log sum_m w_km N(x_n | loc_km, Sigma_km)``, ``(N, K)``."""
        return torch.logsumexp(self._log_joint(data), dim=-1)

    def statistics(self, data: torch.Tensor | CentredData, weights: torch.Tensor) -> MixtureStatistics:
        """The Gaussian statistics of the ``K M`` Gaussians under ``weights`` ``(N, K)`` times the within-component
        responsibilities ``w_km N(x | km) / sum_m' w_km' N(x | km')`` (on a fresh batch: weighted k-means
        assignments); their counts are the mixing weights' statistics."""
        data = as_centred(data, self.dtype, self.device)
        weights = self._check_weights(weights, data.n_samples)
        within = self._start_split(data, weights) if self.fresh else torch.softmax(self._log_joint(data), dim=-1)
        return MixtureStatistics(self._inner().statistics(data, (within * weights[..., None]).flatten(1)), self.n_mix)

    def _start_split(self, data: CentredData, weights: torch.Tensor) -> torch.Tensor:
        """One-hot within-component assignments ``(N, K, M)``: k-means of each component's rows, weighted by
        ``weights[:, k]`` (a fixed seed: the structure's start has already drawn its randomness)."""
        n, (k, m) = data.n_samples, self.mix_weights.shape
        within = weights.new_zeros(n, k, m)
        for component in range(k):
            if float(weights[:, component].sum()) <= 0:
                within[:, component] = 1.0 / m
                continue
            generator = torch.Generator().manual_seed(component)
            _, labels = kmeans(data.centred, m, generator, weight=weights[:, component], sample_size=4 * 1024)
            within[:, component] = torch.nn.functional.one_hot(labels, m).to(weights)
        return within

    def fit_statistics(self, stats: MixtureStatistics) -> "_GaussianMixtures":
        """The weighted maximum-likelihood update of every Gaussian (under the floor) and of the mixing weights
        (their total weights per component), in place."""
        k, m = self.mix_weights.shape
        inner = self._inner().fit_statistics(stats.gaussians)
        counts = padded_counts(stats.gaussians.counts.to(self.dtype)).reshape(k, m)
        self.mix_weights = counts / counts.sum(-1, keepdim=True)
        self.take_gaussians(inner)
        return self

    def take_gaussians(self, inner: ComponentFamily) -> None:
        """Set the ``K M`` Gaussians to ``inner`` (a batch of the Gaussian family's components, component-major,
        as :meth:`_inner` gives), in place; the components are no longer fresh."""
        k, m = self.mix_weights.shape
        self.loc = inner.loc.reshape(k, m, -1)
        spread = getattr(inner, self.spread_name)
        setattr(self, self.spread_name, spread.reshape(k, m, *spread.shape[1:]))
        self._fresh = False

    def flattened(self, log_weights: torch.Tensor) -> tuple[ComponentFamily, torch.Tensor]:
        """The mixture of these components under the log mixing weights ``log_weights`` ``(K,)`` as one mixture of
        their ``K M`` Gaussians: the Gaussians (one batch of the Gaussian family's components, component-major)
        and their log weights ``log_weights_k + log w_km`` ``(K M,)`` (conditional means and draws of missing
        entries are the flat mixture's)."""
        return self._inner(), (log_weights[:, None] + self.mix_weights.log()).reshape(-1)

    def _gaussians(self, index: torch.Tensor | None) -> dist.Distribution:
        raise NotImplementedError

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``MixtureSameFamily(Categorical(mix_weights[index]), Gaussians[index])`` (every component if None)."""
        weights = self.mix_weights if index is None else self.mix_weights[index]
        return dist.MixtureSameFamily(dist.Categorical(weights), self._gaussians(index))

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One draw from component ``index[i]`` for every ``i``: a Gaussian of its mixture, then a point of it."""
        flat = index.reshape(-1)
        within = torch.multinomial(self.mix_weights[flat].cpu(), 1, generator=generator).squeeze(-1)
        gaussian = flat * self.n_mix + within.to(flat.device)
        return self._inner().sample(gaussian, generator=generator).reshape(*index.shape, self.n_features)


class DiagGaussianMixtures(_GaussianMixtures):
    """Components that are mixtures of diagonal Gaussians (``scale`` ``(K, M, D)``).

    Examples
    --------
    >>> f64 = torch.float64
    >>> halves, locs = torch.full((1, 2), 0.5, dtype=f64), torch.tensor([[[-2.0], [2.0]]], dtype=f64)
    >>> comp = DiagGaussianMixtures(halves, locs, torch.ones(1, 2, 1, dtype=f64))
    >>> x = torch.tensor([[0.0]], dtype=f64)  # halfway: both Gaussians give the same density
    >>> round(float(comp.log_prob(x)), 6) == round(float(torch.distributions.Normal(2.0, 1.0).log_prob(x)), 6)
    True
    """

    param_names = ("mix_weights", "loc", "scale")
    inner_class = DiagGaussian
    spread_name = "scale"

    def __init__(
        self,
        mix_weights: torch.Tensor,
        loc: torch.Tensor,
        scale: torch.Tensor,
        reg_covar: Any = 1e-6,
    ) -> None:
        super().__init__(mix_weights, loc, scale, reg_covar)  # the spread under its parameter's name

    def observed(self) -> "ObservedGaussianMixtures":
        """These components seen through the observed entries of rows with missing entries
        (:class:`ObservedGaussianMixtures`)."""
        return ObservedGaussianMixtures(self)

    def moments(self) -> Moments:
        """Each component's mean ``sum_m w_km loc_km`` and variances ``sum_m w_km (scale_km^2 + loc_km^2) -
        mean_k^2``, ``(K, D)``."""
        mean = self._mean()
        second = torch.einsum("km,kmd->kd", self.mix_weights, self.scale.square() + self.loc.square())
        return Moments(mean, second - mean.square())

    def _gaussians(self, index: torch.Tensor | None) -> dist.Distribution:
        loc, scale = (self.loc, self.scale) if index is None else (self.loc[index], self.scale[index])
        return dist.Normal(loc, scale).to_event(1)


class FullGaussianMixtures(_GaussianMixtures):
    """Components that are mixtures of full-covariance Gaussians (``scale_tril`` ``(K, M, D, D)``)."""

    param_names = ("mix_weights", "loc", "scale_tril")
    inner_class = FullGaussian
    spread_name = "scale_tril"

    def __init__(
        self,
        mix_weights: torch.Tensor,
        loc: torch.Tensor,
        scale_tril: torch.Tensor,
        reg_covar: Any = 1e-6,
    ) -> None:
        super().__init__(mix_weights, loc, scale_tril, reg_covar)  # the spread under its parameter's name

    def moments(self) -> Moments:
        """Each component's mean ``sum_m w_km loc_km`` ``(K, D)`` and covariance ``sum_m w_km (Sigma_km + loc_km
        loc_km^T) - mean_k mean_k^T`` ``(K, D, D)``."""
        outer = self.scale_tril @ self.scale_tril.mT + self.loc[..., :, None] * self.loc[..., None, :]
        mean = self._mean()
        return Moments(
            mean, torch.einsum("km,kmij->kij", self.mix_weights, outer) - mean[:, :, None] * mean[:, None, :]
        )

    def _gaussians(self, index: torch.Tensor | None) -> dist.Distribution:
        loc, tril = (self.loc, self.scale_tril) if index is None else (self.loc[index], self.scale_tril[index])
        return dist.MultivariateNormal(loc, scale_tril=tril)


class ObservedGaussianMixtures(ComponentsView):
    """Mixtures of diagonal Gaussians seen through the observed entries of rows (NaN where missing): ``log_prob``
    ``log sum_m w_km N(x_o; loc_km[o], diag(scale_km[o]^2))`` ``(N, K)``, ``statistics`` the ``K M`` Gaussians'
    expected statistics under the responsibilities times the within-component responsibilities given ``x_o``
    (:class:`MixtureStatistics`, which merge with complete rows'), ``fit_statistics`` the components' M-step (in
    place). Rows are centred at the components' :attr:`~_GaussianMixtures.reference`, so a row's scores do not
    depend on its batch.

    Parameters
    ----------
    components : DiagGaussianMixtures
        The fitted components (a view: they are fitted in place).

    Examples
    --------
    >>> f64 = torch.float64
    >>> halves, locs = torch.full((1, 2), 0.5, dtype=f64), torch.tensor([[[-2.0, 0.0], [2.0, 5.0]]], dtype=f64)
    >>> comp = DiagGaussianMixtures(halves, locs, torch.ones(1, 2, 2, dtype=f64))
    >>> x = torch.tensor([[0.0, float("nan")]], dtype=f64)  # the first feature's marginal: N(-2, 1) and N(2, 1)
    >>> halfway = torch.distributions.Normal(2.0, 1.0).log_prob(torch.tensor(0.0, dtype=f64))
    >>> round(float(comp.observed().log_prob(x)), 6) == round(float(halfway), 6)
    True
    """

    def _scored(self, data: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The marginal log-densities, and the prepared rows, ``log w_km + log N(x_o | km)`` ``(N, K, M)`` and
        the Gaussians, for the statistics."""
        comp = self.components
        rows = MissingRows.of(torch.as_tensor(data).to(dtype=self.dtype, device=self.device), comp.reference)
        gaussians = comp._inner()
        k, m = comp.mix_weights.shape
        log_joint = marginal_log_prob(rows, gaussians.loc, gaussians.covariance).reshape(-1, k, m)
        log_joint = log_joint + comp.mix_weights.log()
        return torch.logsumexp(log_joint, dim=-1), (rows, log_joint, gaussians)

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        return self._scored(data)[0]

    def _statistics_given(self, data: torch.Tensor, weights: torch.Tensor, shared: Any) -> MixtureStatistics:
        rows, log_joint, gaussians = shared
        weights = self._check_weights(weights, len(rows))
        within = (torch.softmax(log_joint, dim=-1) * weights[..., None]).flatten(1)
        stats = expected_statistics(rows, within, gaussians.loc, gaussians.covariance)
        return MixtureStatistics(stats, self.components.n_mix)

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> MixtureStatistics:
        return self._statistics_given(data, weights, self._scored(data)[1])

    def fit_statistics(self, stats: Any) -> Any:
        return self.components.fit_statistics(stats)


class GaussianMixtureFamily(DensityFamily):
    """Components that are mixtures of ``n_mix`` Gaussians, for the structures (registered as ``"gmm"``): an HMM
    with these emissions is a GMM-HMM (hmmlearn's ``GMMHMM``).

    Parameters
    ----------
    n_mix : int, default 2
        Gaussians per component (per HMM state).
    covariance_type : {"diag", "full"}, default "diag"
    reg_covar : float, default 1e-6
        The variance floor relative to the data, as for :class:`~ppmix.components.gaussian_family.GaussianFamily`.

    Notes
    -----
    The Pyro sites are ``mix_weights`` ``(K, M)``, ``locs`` and ``scales`` ``(K, M, D)`` and, for full covariance,
    ``corr_cholesky`` ``(K, M, D, D)``; under MCMC: ``Dirichlet(1)`` on the mixing weights and the Gaussian family's
    data-scaled priors on every Gaussian, which ``priors=`` sets (:meth:`GaussianMixturePriors.keys`: the Gaussian's
    keys and ``mix_concentration``). MAP-EM (``engine="em"`` with ``priors``) updates every Gaussian as the Gaussian
    family's MAP-EM does and the mixing weights to their Dirichlet posterior's mode. The first M-step splits each
    component's rows among its Gaussians by weighted k-means (hmmlearn's start, within the structure's own start).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import HMM
    >>> rng = np.random.default_rng(0)
    >>> seqs = [np.r_[rng.choice([-6.0, -2.0], 20)[:, None], rng.choice([2.0, 6.0], 20)[:, None]]
    ...         + 0.3 * rng.normal(size=(40, 1)) for _ in range(10)]
    >>> hmm = HMM(2, emission=GaussianMixtureFamily(n_mix=2), seed=0, progress=False).fit(seqs)
    >>> sorted(np.round(hmm.components_.loc.numpy().ravel()).tolist())
    [-6.0, -2.0, 2.0, 6.0]
    """

    name = "gmm"

    def __init__(self, n_mix: int = 2, covariance_type: str = "diag", reg_covar: float = 1e-6) -> None:
        self.n_mix, self.covariance_type, self.reg_covar = n_mix, covariance_type, reg_covar
        self._check_settings()

    @property
    def _gaussian(self) -> GaussianFamily:
        """The Gaussian family of the Gaussians inside: data checks, scale, floors, preparation and priors (with
        :attr:`prior_settings`)."""
        return with_priors(GaussianFamily(self.covariance_type, self.reg_covar), self._prior_settings)

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        if isinstance(self.n_mix, bool) or not isinstance(self.n_mix, int) or self.n_mix < 1:
            raise ValueError(f"n_mix must be a positive integer; got {self.n_mix!r}")
        if self.covariance_type not in MIXTURE_COVARIANCE_TYPES:
            raise ValueError(
                f"covariance_type must be one of {MIXTURE_COVARIANCE_TYPES} for a mixture emission; "
                f"got {self.covariance_type!r}"
            )
        GaussianFamily(self.covariance_type, self.reg_covar)  # whose constructor checks reg_covar

    @property
    def components_class(self) -> type[ComponentFamily]:  # type: ignore[override]
        return DiagGaussianMixtures if self.covariance_type == "diag" else FullGaussianMixtures

    # ---------------------------------------------------------------------- data
    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        self._gaussian.check_data(x, name)

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        return self._gaussian.data_scale(x, name)

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> CentredData:
        return self._gaussian.prepare(x, components)

    # ----------------------------------------------------------- the components
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        m = self.n_mix
        sites = {
            # ArviZ dimensions: ``mix`` (the Gaussian within the component), then the features
            "mix_weights": SiteSpec(constraints.simplex, (m,), dims=("mix",)),
            "locs": SiteSpec(constraints.real, (m, d), dims=("mix", "feature")),
            "scales": SiteSpec(constraints.positive, (m, d), dims=("mix", "feature")),
        }
        if self.covariance_type == "full":
            sites["corr_cholesky"] = SiteSpec(
                constraints.corr_cholesky, (m, d, d), dims=("mix", "feature", "feature_bis")
            )
        return sites

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> ComponentFamily:
        """The mixtures of the site values, with the training data's variance floor (else ``reg_covar``)."""
        scales = values["scales"]
        if self.covariance_type == "full":
            corr = values["corr_cholesky"]
            scales = scales[..., None] * corr / corr.norm(dim=-1, keepdim=True)
        floor = as_floor(scale.get("floor", self.reg_covar))
        return self.components_class(values["mix_weights"], values["locs"], scales, reg_covar=floor)

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        values = {"mix_weights": components.mix_weights.clone(), "locs": components.loc.clone()}
        if isinstance(components, DiagGaussianMixtures):
            return {**values, "scales": components.scale.clone()}
        scales = components.scale_tril.square().sum(-1).sqrt()
        return {**values, "scales": scales, "corr_cholesky": components.scale_tril / scales[..., None]}

    def priors(self) -> "GaussianMixturePriors":
        return GaussianMixturePriors(self)


class GaussianMixturePriors(FamilyPriors):
    """The priors of :class:`GaussianMixtureFamily` (its :meth:`~GaussianMixtureFamily.priors`)."""

    family: GaussianMixtureFamily

    def keys(self) -> dict[str, PriorKey]:
        """The Gaussian family's keys (every Gaussian's), and ``mix_concentration``."""
        return {
            **GaussianFamily(self.family.covariance_type).priors().keys(),
            "mix_concentration": PriorKey(
                "the Dirichlet concentration of the mixing weights (default 1)", "concentration"
            ),
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        """``mix_weights ~ Dirichlet(1)``; every Gaussian under the Gaussian family's priors."""
        if site == "mix_weights":
            return dist.Dirichlet(prior_value(self.family, "mix_concentration", torch.ones(self.family.n_mix, **opts)))
        single = self.family._gaussian.priors().prior(site, k, d, scale, opts)
        return single.expand((self.family.n_mix,)).to_event(1)

    def map_update(self, components: _GaussianMixtures, stats: MixtureStatistics, scale: DataScale) -> None:
        """Every Gaussian by the Gaussian family's MAP update (one batch of ``K M``), and the mixing weights the mode
        of their Dirichlet posterior, ``(n_km + alpha - 1) / (n_k + M (alpha - 1))``."""
        k, m = components.mix_weights.shape
        opts = {"dtype": components.dtype, "device": components.device}
        inner = components._inner()
        self.family._gaussian.priors().map_update(inner, stats.gaussians, scale)
        counts = stats.gaussians.counts.to(**opts).reshape(k, m)
        concentration = self.prior("mix_weights", k, components.n_features, scale, opts).concentration
        components.mix_weights = posterior_mode(dist.Dirichlet(counts + concentration))
        components.take_gaussians(inner)

    def map_log_prior(self, components: _GaussianMixtures, d: int, scale: DataScale) -> torch.Tensor:
        """The mixing weights' ``log Dirichlet`` and the Gaussian family's log prior of every Gaussian."""
        opts = {"dtype": components.dtype, "device": components.device}
        weights = self.prior("mix_weights", components.n_components, d, scale, opts)
        return weights.log_prob(components.mix_weights).sum() + self.family._gaussian.priors().map_log_prior(
            components._inner(), d, scale
        )
