"""Gaussian components shared by the models whose clusters/states emit Gaussian data (GMM, HMM, ...).

The mixin owns the component family (diagonal or full ``DiagGaussian``/``FullGaussian``),
its Pyro sites (``locs``, ``scales`` and, for full covariance, ``corr_cholesky``), their
flat (maximum-likelihood) or weakly informative (MCMC) priors, the mapping between
sites and the family, and the k-means initialisation of responsibilities.
"""

from __future__ import annotations

from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.components import DiagGaussian, FullGaussian
from ppmix.components.centred import CentredData, as_floor
from ppmix.models._flat import flat_prior
from ppmix.ops.kmeans import kmeans_plusplus, kmeans_start, nearest_centre

COVARIANCE_TYPES = ("diag", "full")
INIT_METHODS = ("kmeans", "k-means++", "random")
#: rows of the fixed random subsample whose medians set the robust spread of the variance floor
SCALE_SAMPLE_ROWS = 20_000


#: 1 / Phi^{-1}(3/4): the median absolute deviation of a normal sample times this is its standard deviation
MAD_TO_SD = 1.4826


def scale_sample(x: torch.Tensor, size: int = SCALE_SAMPLE_ROWS) -> torch.Tensor:
    """The rows of ``x`` that estimate its spread: all of them up to ``size`` rows, else ``size``
    rows drawn with a fixed seed (so the same data give the same rows, whatever the model's seed).

    Examples
    --------
    >>> scale_sample(torch.zeros(10, 2)).shape, scale_sample(torch.zeros(100, 2), size=30).shape
    (torch.Size([10, 2]), torch.Size([30, 2]))
    """
    if x.shape[0] <= size:
        return x
    rows = torch.randint(x.shape[0], (size,), generator=torch.Generator().manual_seed(0))
    return x[rows.to(x.device)]


def median_absolute_deviation(x: torch.Tensor) -> torch.Tensor:
    """Each feature's median absolute deviation, ``(D,)``, on the rows of :func:`scale_sample`.

    Examples
    --------
    >>> median_absolute_deviation(torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])).tolist()
    [2.0, 0.0]
    """
    sample = scale_sample(x)
    return (sample - sample.median(0).values).abs().median(0).values


def relative_floor(x: torch.Tensor, reg_covar: float, mad: torch.Tensor | None = None) -> torch.Tensor:
    """The variance floor ``reg_covar * spread_d(x)**2`` of every feature, ``(D,)``.

    ``spread_d`` is the robust spread of feature ``d`` (1.4826 times its median absolute
    deviation), so that a few far outliers cannot raise the floor of every cluster; a
    feature whose median absolute deviation is zero uses its standard deviation, and a
    constant feature keeps the absolute floor ``reg_covar``. Beyond
    :data:`SCALE_SAMPLE_ROWS` rows the spread is estimated on that many rows
    (:func:`scale_sample`; its relative error is about 1 %, and the floor is a safeguard, not an
    estimate), so that it costs no more than the fit's own passes. ``mad``: the features' median
    absolute deviations if already computed (:func:`median_absolute_deviation`).

    Examples
    --------
    >>> floor = relative_floor(torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]], dtype=torch.float64), 1e-2)
    >>> [round(v, 4) for v in floor.tolist()]
    [0.0879, 0.01]
    """
    if x.shape[0] < 2:
        return torch.full_like(x[0], reg_covar)
    mad = median_absolute_deviation(x) if mad is None else mad
    mad_spread = (mad * MAD_TO_SD).square()
    spread = torch.where(mad_spread > 0, mad_spread, scale_sample(x).var(0, unbiased=False))
    return reg_covar * torch.where(spread > 0, spread, torch.ones_like(spread))


def check_squared_range(x: torch.Tensor, name: str = "X", mad: torch.Tensor | None = None) -> None:
    """Refuse data whose squared deviations the dtype cannot hold, naming ``name``.

    Gaussian fits form sums of squared deviations from the mean (and variances of that
    size): their largest sum, ``N * max |x - mean|^2``, must be finite in ``x``'s dtype,
    and the squared robust spread of every non-constant feature must be a normal number
    (not subnormal), or the variances lose their precision. ``mad``: as for :func:`relative_floor`.

    Examples
    --------
    >>> check_squared_range(torch.tensor([[0.0], [1e20]]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ppmix._validation.InvalidDataError: X is too large for torch.float32: its sums of squared deviations ...
    """
    if x.shape[0] < 2:
        return
    info = torch.finfo(x.dtype)
    # Python floats (double precision): the check itself cannot overflow
    mean = x.mean(0)
    total = float(torch.maximum(x.amax(0) - mean, mean - x.amin(0)).max()) ** 2 * x.shape[0]
    if not total < info.max:
        raise InvalidDataError(
            f"{name} is too large for {x.dtype}: its sums of squared deviations (up to about {total:.0e}) "
            f"overflow the largest {x.dtype} number ({info.max:.1e}); rescale {name} or use dtype=torch.float64"
        )
    # the spread of the floor (relative_floor), on the same rows
    spread = (median_absolute_deviation(x) if mad is None else mad).double().square()
    smallest = float(spread[spread > 0].min()) if bool((spread > 0).any()) else info.tiny
    if smallest < info.tiny:
        raise InvalidDataError(
            f"{name} is too small for {x.dtype}: its squared spread (about {smallest:.0e}) is below the smallest "
            f"normal {x.dtype} number ({info.tiny:.1e}); rescale {name} or use dtype=torch.float64"
        )


def drop_leading_ones(value: torch.Tensor, dim: int) -> torch.Tensor:
    """``value`` without leading singleton dimensions beyond its ``dim`` own ones.

    A site's value replayed or conditioned from outside (e.g. Pyro's ``Predictive`` pads
    global samples with singleton dimensions up to ``max_plate_nesting``) may carry them; the
    component families want their parameters as ``(K, D)``.

    Examples
    --------
    >>> drop_leading_ones(torch.zeros(1, 1, 2, 3), 2).shape
    torch.Size([2, 3])
    """
    while value.dim() > dim and value.shape[0] == 1:
        value = value[0]
    return value


class GaussianComponentsMixin:
    """Gaussian components for a :class:`~ppmix.models.base.MixtureModel` subclass.

    The host class stores ``covariance_type``, ``reg_covar``, ``init_params`` and
    ``n_init``/``max_iter`` and sets ``components_`` during fitting.

    ``reg_covar`` is relative: the variance floor of feature ``d`` is
    ``reg_covar`` times the squared robust spread of feature ``d`` in the training data (see
    :func:`relative_floor`; recorded when the components are created for a fit), so
    fits are unchanged when the data are rescaled. A fitted variance is
    ``max(weighted variance, floor)`` (full covariance: ``Sigma >= diag(floor)``), the
    constrained maximum-likelihood estimate, so EM never decreases its objective.
    """

    covariance_type: str
    reg_covar: float
    init_params: str
    components_: DiagGaussian | FullGaussian

    def _validate_gaussian_params(self) -> None:
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}; got {self.covariance_type!r}")
        self._validate_em_settings(INIT_METHODS)
        if not self.reg_covar >= 0:
            raise ValueError(f"reg_covar must be non-negative; got {self.reg_covar}")

    def _record_data_scale(self, x: torch.Tensor) -> None:
        """Centre and spread of the training data: for the weakly informative priors of MCMC, and the
        variance floor of every fit (a warm start of a loaded model included)."""
        mad = median_absolute_deviation(x) if x.shape[0] > 1 else None
        check_squared_range(x, mad=mad)
        self._data_mean = x.mean(0)
        # the scale of MCMC's weak priors: estimated on at most SCALE_SAMPLE_ROWS rows, like the floor
        self._data_std = scale_sample(x).std(0).clamp_min(1e-6) if x.shape[0] > 1 else torch.ones_like(x[0])
        self._feature_floor = relative_floor(x, self.reg_covar, mad=mad)
        if getattr(self, "components_", None) is not None:
            self.components_.reg_covar = as_floor(self._feature_floor)

    @property
    def _component_parameters(self) -> int:
        """Free parameters of the components: ``K D`` means and ``K D`` variances (``K D (D + 1) / 2`` covariances)."""
        k, d = self.n_components, self.n_features_in_
        return k * d + (k * d if self.covariance_type == "diag" else k * d * (d + 1) // 2)

    @property
    def means_(self) -> torch.Tensor:
        """Component means ``(K, D)``."""
        self._check_fitted()
        return self.components_.loc

    @property
    def covariances_(self) -> torch.Tensor:
        """Variances ``(K, D)`` (diag) or covariance matrices ``(K, D, D)`` (full)."""
        self._check_fitted()
        comp = self.components_
        return comp.variance if isinstance(comp, DiagGaussian) else comp.covariance

    # ------------------------------------------------------------- Pyro sites
    def _simplex_prior(self, site: str, batch: tuple[int, ...], k: int, opts: dict) -> dist.Distribution:
        """Flat on the simplex for maximum likelihood, ``Dirichlet(1)`` under MCMC.

        The flat prior's sampler is a point mass at the current value of ``site`` (see
        :func:`~ppmix.models._flat.flat_prior`).
        """
        if not self.is_bayesian:
            return flat_prior(self, site, constraints.simplex, batch, (k,), opts)
        return dist.Dirichlet(torch.ones(*batch, k, **opts))

    def _component_prior(self, site: str, k: int, d: int, opts: dict) -> dist.Distribution:
        if not self.is_bayesian:
            support = {
                "locs": constraints.real,
                "scales": constraints.positive,
                "corr_cholesky": constraints.corr_cholesky,
            }
            event = (d, d) if site == "corr_cholesky" else (d,)
            return flat_prior(self, site, support[site], (k,), event, opts)
        # before a fit (no data scale recorded) the weak priors are centred at 0 with unit scale
        mean = getattr(self, "_data_mean", torch.zeros(d)).to(**opts)
        std = getattr(self, "_data_std", torch.ones(d)).to(**opts)
        if site == "locs":
            return dist.Normal(mean, 3.0 * std).to_event(1)
        if site == "scales":
            return dist.LogNormal(std.log(), 1.0).to_event(1)
        return dist.LKJCholesky(d, torch.tensor(2.0, **opts))

    def _sample_components(
        self, k: int, d: int, opts: dict, plate: pyro.plate | None = None
    ) -> DiagGaussian | FullGaussian:
        """Sample the component sites in the ``components`` plate (``plate`` when the model
        already opened it) and return their family."""
        with plate if plate is not None else pyro.plate("components", k):
            locs = drop_leading_ones(pyro.sample("locs", self._component_prior("locs", k, d, opts)), 2)
            scales = drop_leading_ones(pyro.sample("scales", self._component_prior("scales", k, d, opts)), 2)
            if self.covariance_type == "diag":
                return DiagGaussian(locs, scales)
            corr = pyro.sample("corr_cholesky", self._component_prior("corr_cholesky", k, d, opts))
            corr = drop_leading_ones(corr, 3)
            return FullGaussian(locs, scales[..., None] * corr)

    # ---------------------------------------------------- sites <-> the family
    def _component_globals(self) -> dict[str, torch.Tensor]:
        comp = self.components_
        if isinstance(comp, DiagGaussian):
            return {"locs": comp.loc.clone(), "scales": comp.scale.clone()}
        scales = comp.scale_tril.square().sum(-1).sqrt()
        return {"locs": comp.loc.clone(), "scales": scales, "corr_cholesky": comp.scale_tril / scales[..., None]}

    def _set_component_globals(self, values: dict[str, Any]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        locs, scales = torch.as_tensor(values["locs"]).to(**opts), torch.as_tensor(values["scales"]).to(**opts)
        if self.covariance_type == "diag":
            self.components_ = DiagGaussian(locs, scales, reg_covar=self._variance_floor)
        else:
            corr = torch.as_tensor(values["corr_cholesky"]).to(**opts)
            corr = corr / corr.norm(dim=-1, keepdim=True)  # rows of a correlation Cholesky have unit norm
            self.components_ = FullGaussian(locs, scales[..., None] * corr, reg_covar=self._variance_floor)

    def _load_component_state(self, tensors: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        family = DiagGaussian if self.covariance_type == "diag" else FullGaussian
        self.components_ = family(*(tensors[n].to(**opts) for n in family.param_names), reg_covar=self._variance_floor)

    def _component_dims(self) -> dict[str, list[str]]:
        dims = {"locs": ["component", "feature"], "scales": ["component", "feature"]}
        if self.covariance_type == "full":
            dims["corr_cholesky"] = ["component", "feature", "feature_bis"]
        return dims

    # ----------------------------------------------------------- EM helpers
    def _initial_responsibilities(self, data: CentredData, generator: torch.Generator) -> torch.Tensor:
        """Hard k-means (or k-means++ seeding) assignments, or random soft ones, ``(N, K)``.

        ``"kmeans"`` is :func:`~ppmix.ops.kmeans.kmeans_start`: the best of three k-means runs on a
        random subsample of the rows, then every row assigned to its nearest centre.
        """
        x, k = data.x, self.n_components
        if self.init_params == "random":
            resp = torch.rand(x.shape[0], k, generator=generator, dtype=x.dtype).to(x.device)
            return resp / resp.sum(1, keepdim=True)
        if self.init_params == "kmeans":
            _, labels = kmeans_start(data.centred, k, generator)
        else:
            labels = nearest_centre(data.centred, kmeans_plusplus(data.centred, k, generator))
        return torch.nn.functional.one_hot(labels, k).to(x.dtype)

    @property
    def _variance_floor(self) -> float | torch.Tensor:
        """``reg_covar`` times each feature's training variance (``reg_covar`` itself before a fit)."""
        return getattr(self, "_feature_floor", self.reg_covar)

    def _new_components(self, x: torch.Tensor) -> DiagGaussian | FullGaussian:
        """A placeholder family of the right shape (parameters are set by the first M-step), with the
        relative variance floor of the training data ``x`` (recorded by ``prepare_data(..., fitting=True)``,
        which every fit runs first; computed here if it was not)."""
        k, d = self.n_components, x.shape[1]
        recorded = getattr(self, "_feature_floor", None)
        if recorded is None or recorded.shape != (d,):
            self._feature_floor = relative_floor(x, self.reg_covar)
        scale = torch.ones(k, d, dtype=x.dtype, device=x.device)
        zeros = torch.zeros(k, d, dtype=x.dtype, device=x.device)
        if self.covariance_type == "diag":
            return DiagGaussian(zeros, scale, reg_covar=self._variance_floor)
        return FullGaussian(zeros, torch.diag_embed(scale), self._variance_floor)
