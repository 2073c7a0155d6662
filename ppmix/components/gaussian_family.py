"""The Gaussian family (diagonal or full covariance) as the structures use it: its Pyro sites
``locs``, ``scales`` and, for full covariance, ``corr_cholesky``; their weakly informative, data-scaled
priors for MCMC; and the data-relative variance floor measured once on the training data.

The fitted components are :class:`~ppmix.components.DiagGaussian` or
:class:`~ppmix.components.FullGaussian`; EM data are :class:`~ppmix.components.centred.CentredData`.
"""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch.distributions.transforms import PowerTransform

from ppmix._validation import InvalidDataError, check_float
from ppmix.components.base import ComponentFamily
from ppmix.components.centred import CentredData, as_floor
from ppmix.components.family import DataScale, DensityFamily, FamilyPriors, PriorKey, SiteSpec
from ppmix.components.family_tools import has_conjugate_prior, prior_value
from ppmix.components.gaussian_diag import DiagGaussian, SphericalGaussian
from ppmix.components.gaussian_full import FullGaussian, TiedGaussian
from ppmix.components.gaussian_map import covariance_log_prior, map_covariance, map_means
from ppmix.ops.scaling import column_moments, column_variance, weighted_lower_median

__all__ = [
    "COVARIANCE_TYPES",
    "GaussianFamily",
    "GaussianPriors",
    "check_squared_range",
    "relative_floor",
    "robust_spread",
    "rounding_tolerance",
    "scale_sample",
    "variance_floor",
    "weighted_data_scale",
]

COVARIANCE_TYPES = ("diag", "full", "spherical", "tied")
#: rows of the fixed random subsample whose medians set the robust spread of the variance floor (a median
#: absolute deviation from this many rows is within about 2 % of the whole data's: ample for a safeguard, and
#: its two medians cost a few milliseconds where 20 000 rows cost a tenth of a small fit)
SCALE_SAMPLE_ROWS = 8_192


#: 1 / Phi^{-1}(3/4): the median absolute deviation of a normal sample times this is its standard deviation
MAD_TO_SD = 1.4826


def scale_sample(x: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """The rows of ``x`` that estimate its spread: all of them up to ``size`` rows, else ``size``
    rows drawn with a fixed seed (so the same data give the same rows, whatever the model's seed).

    Examples
    --------
    >>> scale_sample(torch.zeros(10, 2)).shape, scale_sample(torch.zeros(100, 2), size=30).shape
    (torch.Size([10, 2]), torch.Size([30, 2]))
    """
    size = SCALE_SAMPLE_ROWS if size is None else size
    if x.shape[0] <= size:
        return x
    rows = torch.randint(x.shape[0], (size,), generator=torch.Generator().manual_seed(0))
    return x[rows.to(x.device)]


#: a deviation from a feature's median within this many units of rounding (machine epsilons) of the median's
#: magnitude is rounding, not spread: sixty copies of 0.1, or ``c * (1 + a few eps)``, are a constant feature
ROUNDING_ULPS = 16


def rounding_tolerance(value: torch.Tensor) -> torch.Tensor:
    """The largest deviation from ``value`` that is rounding, not spread: :data:`ROUNDING_ULPS` machine epsilons of
    its magnitude (elementwise).

    Examples
    --------
    >>> x = torch.full((60,), 0.1, dtype=torch.float64)
    >>> bool((x - x.mean()).abs().max() <= rounding_tolerance(torch.tensor(0.1, dtype=torch.float64)))
    True
    """
    return ROUNDING_ULPS * torch.finfo(value.dtype).eps * value.abs()


def robust_spread(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Each feature's robust spread, ``(D,)``: 1.4826 times the median absolute deviation from its median, zero for a
    feature that is constant up to rounding; rows counted ``weight`` ``(N,)`` times (once when None).

    Deviations within :data:`ROUNDING_ULPS` machine epsilons of the median's magnitude count as zero. Where more
    than half of the rows sit at the median (a pixel that is mostly blank), the median absolute deviation is zero
    and the spread is that of the rows that deviate: 1.4826 times their median deviation (how far the feature moves
    when it moves, whatever the share of rows that move). Every step scales with the data, so the spread of
    ``c * x + b`` is ``|c|`` times that of ``x``.

    Examples
    --------
    >>> x = torch.tensor([[0.0, 0.1, 0.0], [2.0, 0.1, 0.0], [4.0, 0.1, 3.0]], dtype=torch.float64)
    >>> [round(v, 4) for v in robust_spread(x).tolist()]
    [2.9652, 0.0, 4.4478]
    """
    centre = weighted_lower_median(x, weight)
    deviation = (x - centre).abs()
    deviation = torch.where(deviation > rounding_tolerance(centre), deviation, torch.zeros_like(deviation))
    mad = weighted_lower_median(deviation, weight)
    if bool((mad > 0).all()):
        return MAD_TO_SD * mad
    moving = (deviation > 0).to(x) * (1.0 if weight is None else weight.to(x)[:, None])
    return MAD_TO_SD * torch.where(mad > 0, mad, weighted_lower_median(deviation, moving))


def variance_floor(spread: torch.Tensor, reg_covar: float) -> torch.Tensor:
    """The variance floor of features of robust spread ``spread`` (:func:`robust_spread`), ``(D,)``:
    ``reg_covar * spread**2``, and the absolute ``reg_covar`` for a feature without spread (constant to rounding).

    Examples
    --------
    >>> variance_floor(torch.tensor([2.0, 0.0], dtype=torch.float64), 1e-2).tolist()
    [0.04, 0.01]
    """
    square = spread.square()
    return reg_covar * torch.where(square > 0, square, torch.ones_like(square))


def relative_floor(
    x: torch.Tensor, reg_covar: float, spread: torch.Tensor | None = None, sample: torch.Tensor | None = None
) -> torch.Tensor:
    """The variance floor ``reg_covar * spread_d(x)**2`` of every feature, ``(D,)`` (:func:`variance_floor`).

    ``spread_d`` is the robust spread of feature ``d`` (:func:`robust_spread`: 1.4826 times its median absolute
    deviation, or that of the rows off the median where most rows sit on it), so that a few far outliers cannot
    raise the floor of every cluster; a feature constant up to rounding keeps the absolute floor ``reg_covar``.
    Beyond :data:`SCALE_SAMPLE_ROWS` rows the spread is estimated on that many rows (:func:`scale_sample`; its
    relative error is about 1 %, and the floor is a safeguard, not an estimate), so that it costs no more than the
    fit's own passes. ``spread``: the features' robust spreads if already computed; ``sample``: the rows of
    :func:`scale_sample` if already drawn.

    Examples
    --------
    >>> x = torch.tensor([[0.0, 1.0, 0.1], [2.0, 1.0, 0.1], [4.0, 1.0, 0.1]], dtype=torch.float64)
    >>> [round(v, 4) for v in relative_floor(x, 1e-2).tolist()]
    [0.0879, 0.01, 0.01]
    """
    if x.shape[0] < 2:
        return torch.full_like(x[0], reg_covar)
    spread = robust_spread(scale_sample(x) if sample is None else sample) if spread is None else spread
    return variance_floor(spread, reg_covar)


def weighted_data_scale(x: torch.Tensor, weight: torch.Tensor, reg_covar: float) -> DataScale:
    """The Gaussian family's data scale (``mean``, ``std`` and the variance ``floor``, as
    :meth:`GaussianFamily.data_scale` measures them) of the rows of ``x`` each counted ``weight`` times: for integer
    weights, the scale of the rows repeated (that one estimates the spread on a subsample beyond
    :data:`SCALE_SAMPLE_ROWS` rows; this uses every row). Where ``x`` has missing entries (NaN), each column's
    scale is that of its observed entries.

    Examples
    --------
    >>> x = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 3.0], [9.0, 1.0]], dtype=torch.float64)
    >>> weight = torch.tensor([2.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    >>> repeated = GaussianFamily("diag").data_scale(x[[0, 0, 2, 3]])
    >>> all(torch.allclose(weighted_data_scale(x, weight, 1e-6)[k], v) for k, v in repeated.items())
    True
    """
    observed = ~torch.isnan(x)
    if not bool(observed.all()):  # missing entries: each column's scale from its observed entries
        columns = [weighted_data_scale(x[o, d : d + 1], weight[o], reg_covar) for d, o in enumerate(observed.T)]
        return {key: torch.cat([column[key] for column in columns]) for key in ("mean", "std", "floor")}
    weight = weight.to(x)
    mean, std = column_moments(x, weight)
    floor = variance_floor(robust_spread(x, weight), reg_covar)
    return {"mean": mean, "std": std.clamp_min(1e-6), "floor": floor}


def check_squared_range(x: torch.Tensor, name: str = "X", spread: torch.Tensor | None = None) -> None:
    """Refuse data whose squared deviations the dtype cannot hold, naming ``name``.

    Gaussian fits form sums of squared deviations from the mean (and variances of that
    size): their largest sum, ``N * max |x - mean|^2``, must be finite in ``x``'s dtype,
    and the squared robust spread of every feature that is not constant (up to rounding: :func:`robust_spread`)
    must be a normal number (not subnormal), or the variances lose their precision. ``spread``: as for
    :func:`relative_floor`.

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
    deviation = float(torch.maximum(x.amax(0) - mean, mean - x.amin(0)).max())
    total = deviation * deviation * x.shape[0]  # inf, not an OverflowError as ``** 2`` would raise
    if not total < info.max:
        raise InvalidDataError(
            f"{name} is too large for {x.dtype}: its sums of squared deviations (up to about {total:.0e}) "
            f"overflow the largest {x.dtype} number ({info.max:.1e}); rescale {name} or use dtype=torch.float64"
        )
    # the spread of the floor (relative_floor), on the same rows
    square = (robust_spread(scale_sample(x)) if spread is None else spread).double().square()
    smallest = float(square[square > 0].min()) if bool((square > 0).any()) else info.tiny
    if smallest < info.tiny:
        raise InvalidDataError(
            f"{name} is too small for {x.dtype}: its squared spread (about {smallest:.0e}) is below the smallest "
            f"normal {x.dtype} number ({info.tiny:.1e}); rescale {name} or use dtype=torch.float64"
        )


#: the inverse-gamma prior of every variance under MCMC/Gibbs: shape 1 and rate this share of the data's variance,
#: so its density in log variance is flat above that share and vanishes below it (a weak prior that lets a
#: component be far narrower than the data, but not collapse)
VARIANCE_PRIOR_SHARE = 0.01


class GaussianFamily(DensityFamily):
    """Gaussian components, diagonal, full or spherical covariance, with a variance floor relative to the data.

    Parameters
    ----------
    covariance_type : {"diag", "full", "spherical", "tied"}, default "diag"
        ``"spherical"``: one variance per component (:class:`~ppmix.components.gaussian_diag.SphericalGaussian`,
        whose ``scales`` site is ``(K,)``); ``"tied"``: one full covariance shared by all components
        (:class:`~ppmix.components.gaussian_full.TiedGaussian`; its sites ``scales`` ``(D,)`` and
        ``corr_cholesky`` ``(D, D)`` are shared, outside the ``components`` plate).
    reg_covar : float, default 1e-6
        The variance floor of feature ``d`` is ``reg_covar`` times the squared robust spread of feature
        ``d`` in the training data (:func:`relative_floor`), so fits do not depend on the data's units;
        a feature constant up to rounding has no spread and gets ``reg_covar`` itself. A fitted variance is
        ``max(weighted variance, floor)`` (full: ``Sigma >= diag(floor)``), the constrained maximum-likelihood
        estimate, so EM never decreases its objective.

    Notes
    -----
    The floor beside scikit-learn's ``GaussianMixture(reg_covar=1e-6)``, which adds ``1e-6`` to every fitted
    variance (``variance + 1e-6``, in whatever units the data have), where ppmix takes ``max(variance, floor)``:

    - a feature of robust spread ``s`` (1.4826 times its median absolute deviation): floor ``1e-6 * s**2``, in the
      feature's units, so ``c * x`` gets the same fit;
    - a feature mostly at one value (its median absolute deviation is zero: a pixel blank in most images): ``s`` is
      that of the rows off that value (1.4826 times their median deviation), whatever their share, so a cluster
      where the pixel is blank keeps a variance of at least ``1e-6 * s**2``, ``s`` how far the pixel moves when it
      moves (on raw ``load_digits`` this makes held-out rows score better than scikit-learn's, where the old
      fallback, the feature's variance, shrank with the share of rows that move);
    - a feature constant, or constant up to rounding (every deviation from the median within 16 machine epsilons
      of the median's magnitude, :func:`rounding_tolerance`): floor ``1e-6``, as scikit-learn's ``0 + 1e-6``.

    The floor is never below ``reg_covar`` in the feature's own scale, but it is not the absolute ``1e-6`` of a
    feature that has a scale: two clusters 4 apart, fitted in units of 1e-6, are recovered (adjusted Rand index
    0.98 at every scale) where an absolute floor, as scikit-learn's, merges them (0.00). A constant feature adds
    ``-log(2 pi reg_covar) / 2`` (about 6 nats) to each row's log-likelihood, as in scikit-learn, not the ~39
    nats of a floor set by rounding noise.

    MAP-EM (``engine="em"`` with ``priors``) under the family's priors
    (:meth:`~ppmix.components.gaussian_family.GaussianPriors.prior`) has every covariance type: diagonal and
    spherical in closed form (:meth:`~ppmix.components.gaussian_family.GaussianPriors.map_update`), full and tied by
    generalised EM (:mod:`~ppmix.components.gaussian_map`), every variance at least the floor.

    Examples
    --------
    >>> from ppmix.components.family_tools import n_parameters
    >>> family = GaussianFamily("full")
    >>> sorted(family.sites(3, 2)), n_parameters(family, 3, 2)
    (['corr_cholesky', 'locs', 'scales'], 15)
    """

    name = "gaussian"

    def __init__(self, covariance_type: str = "diag", reg_covar: float = 1e-6) -> None:
        self.covariance_type, self.reg_covar = covariance_type, reg_covar
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}; got {self.covariance_type!r}")
        check_float(self.reg_covar, "reg_covar", positive=False)

    @property
    def components_class(self) -> type[ComponentFamily]:  # type: ignore[override]
        classes = {"diag": DiagGaussian, "spherical": SphericalGaussian, "tied": TiedGaussian}
        return classes.get(self.covariance_type, FullGaussian)

    # ---------------------------------------------------------------------- data
    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """Column means, standard deviations (for MCMC's weak priors) and the variance floor (``floor``),
        from at most :data:`SCALE_SAMPLE_ROWS` rows; refuses data whose squares the dtype cannot hold. With ``weight``,
        of the rows of ``x`` each counted ``weight`` times
        (:func:`~ppmix.components.gaussian_family.weighted_data_scale`)."""
        if weight is not None:
            return weighted_data_scale(x, weight, self.reg_covar)
        if x.shape[0] < 2:
            return {"mean": x.mean(0), "std": torch.ones_like(x[0]), "floor": relative_floor(x, self.reg_covar)}
        sample = scale_sample(x)  # drawn once: the robust spread and the prior's scale
        spread = robust_spread(sample)
        check_squared_range(x, name, spread=spread)
        return {
            "mean": x.mean(0),
            "std": column_variance(sample, correction=1).sqrt().clamp_min(1e-6),
            "floor": relative_floor(x, self.reg_covar, spread=spread),
        }

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> CentredData:
        """Training data centred at their mean; prediction data at the fitted components' ``reference``
        (so a row's output depends on that row and the model only)."""
        return CentredData.from_tensor(x, None if components is None else components.reference)

    # ----------------------------------------------------------- the components
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        scales = () if self.covariance_type == "spherical" else (d,)
        tied = self.covariance_type == "tied"
        # the means and variances of diagonal and spherical components are conditionally conjugate, a full or tied
        # covariance's scales and LKJ correlation are not (:meth:`GaussianPriors.conjugate_posterior`)
        matrix = self.covariance_type in ("full", "tied")
        sites = {
            "locs": SiteSpec(constraints.real, (d,)),
            "scales": SiteSpec(constraints.positive, scales, shared=tied, conjugate=not matrix),
        }
        if matrix:
            sites["corr_cholesky"] = SiteSpec(constraints.corr_cholesky, (d, d), shared=tied, conjugate=False)
        return sites

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> ComponentFamily:
        """The Gaussians of the site values, with the training data's variance floor (else ``reg_covar``)."""
        locs, scales = values["locs"], values["scales"]
        floor = as_floor(scale.get("floor", self.reg_covar))
        if self.covariance_type == "spherical":
            return SphericalGaussian(locs, scales[..., None].expand_as(locs), reg_covar=floor)
        if self.covariance_type == "diag":
            return DiagGaussian(locs, scales, reg_covar=floor)
        corr = values["corr_cholesky"]
        corr = corr / corr.norm(dim=-1, keepdim=True)  # rows of a correlation Cholesky have unit norm
        tril = scales[..., None] * corr
        if self.covariance_type == "tied":  # one matrix for every component
            return TiedGaussian(locs, tril.expand(locs.shape[0], *tril.shape), reg_covar=floor)
        return FullGaussian(locs, tril, reg_covar=floor)

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        if isinstance(components, SphericalGaussian):
            return {"locs": components.loc.clone(), "scales": components.scale[:, 0].clone()}
        if isinstance(components, DiagGaussian):
            return {"locs": components.loc.clone(), "scales": components.scale.clone()}
        tril = components.scale_tril[0] if isinstance(components, TiedGaussian) else components.scale_tril
        scales = tril.square().sum(-1).sqrt()
        return {"locs": components.loc.clone(), "scales": scales, "corr_cholesky": tril / scales[..., None]}

    def priors(self) -> "GaussianPriors":
        return GaussianPriors(self)


class GaussianPriors(FamilyPriors):
    """The priors of :class:`GaussianFamily` (its :meth:`~GaussianFamily.priors`)."""

    family: GaussianFamily

    def keys(self) -> dict[str, PriorKey]:
        keys = {
            "locs_loc": PriorKey("the prior mean of the component means (default the data's mean)", "real"),
            "locs_scale": PriorKey("the prior standard deviation of the means (default 3 times the data's)"),
            "variance_concentration": PriorKey("the inverse-gamma shape of every variance (default 1)"),
            "variance_rate": PriorKey("the inverse-gamma rate of every variance (default 1/100 of the data's)"),
        }
        if self.family.covariance_type in ("full", "tied"):
            keys["corr_concentration"] = PriorKey("the LKJ concentration of the correlations (default 2)")
        return keys

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        """``locs ~ N(mean(X), 3 std(X))``; every variance ``scales**2 ~ InverseGamma(1, var(X) / 100)`` (flat in
        log variance above a hundredth of the data's variance, :data:`VARIANCE_PRIOR_SHARE`; spherical: of the mean
        variance over the features); ``corr_cholesky ~ LKJCholesky(D, 2)`` (before a fit: centred at 0 with unit
        scale); each hyperparameter as :meth:`with_priors` sets it (:meth:`keys`). Diagonal and spherical
        components are thus conditionally conjugate (:meth:`conjugate_posterior`: ``engine="gibbs"``)."""
        mean = scale.get("mean", torch.zeros(d)).to(**opts)
        std = scale.get("std", torch.ones(d)).to(**opts)
        if site == "locs":
            return dist.Normal(
                prior_value(self.family, "locs_loc", mean), prior_value(self.family, "locs_scale", 3.0 * std)
            ).to_event(1)
        if site == "scales":
            shape, rate = self._variance_prior(std)
            scales = dist.TransformedDistribution(dist.InverseGamma(shape, rate), [PowerTransform(0.5)])
            return scales if self.family.covariance_type == "spherical" else scales.to_event(1)
        return dist.LKJCholesky(d, self._corr_concentration(opts))

    def _corr_concentration(self, opts: dict) -> torch.Tensor:
        """The LKJ concentration of the correlations (default 2)."""
        return prior_value(self.family, "corr_concentration", torch.tensor(2.0, **opts))

    def _variance_prior(self, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape and rate of the inverse-gamma prior of every variance, from the data's standard deviations."""
        variance = std.square().mean() if self.family.covariance_type == "spherical" else std.square()
        shape = prior_value(self.family, "variance_concentration", torch.ones_like(variance))
        return shape, prior_value(self.family, "variance_rate", VARIANCE_PRIOR_SHARE * variance)

    def map_update(self, components: ComponentFamily, stats: Any, scale: DataScale) -> None:
        """Diagonal or spherical components, one conditional maximisation after the other (ECM, so MAP-EM's
        objective never decreases): ``locs_k = (m0 / s0^2 + n_k xbar_k / var_k) / (1 / s0^2 + n_k / var_k)`` at the
        current variances, then ``var_k = (2 b + S_k + n_k (xbar_k - locs_k)^2) / (2 a + 2 + n_k)`` (spherical:
        summed over the features, ``2 a + 2 + n_k D``), the mode of ``InverseGamma(a, b)`` times the likelihood,
        at least the variance floor. Full and tied: the means given the covariances in closed form, then Newton
        steps on the covariances that raise the log posterior (:mod:`~ppmix.components.gaussian_map`), every
        variance at least the floor."""
        self.weighted_map_update(components, stats, stats.counts, scale)

    def weighted_map_update(self, components: Any, stats: Any, rows: torch.Tensor, scale: DataScale) -> None:
        """:meth:`map_update` where the rows' weights in the means (``stats.counts``, ``n_k`` in the means' formula)
        differ from their number in the covariance's log-determinant (``rows`` ``(K,)``, ``n_k`` in the variances'
        denominators): a Student-t's ECM step, whose rows weigh ``r u`` in the scatter and ``r`` in ``log|Sigma|``."""
        opts = {"dtype": components.dtype, "device": components.device}
        d = stats.mean.shape[1]
        counts, rows = stats.counts.to(**opts), rows.to(**opts)
        seen = counts[:, None] > 0
        sample_mean = torch.where(seen, stats.mean.to(**opts), 0.0)
        locs = self.prior("locs", 1, d, scale, opts).base_dist
        shape, rate = self._variance_prior(scale.get("std", torch.ones(d)).to(**opts))
        floor = torch.as_tensor(components.reg_covar, **opts)
        if self.family.covariance_type in ("full", "tied"):
            self._map_update_covariance(components, stats, (counts, rows), sample_mean, (locs, shape, rate, floor))
            return
        counts, rows = counts[:, None], rows[:, None]
        precision = locs.scale.pow(-2) + counts / components.variance
        loc = (locs.loc * locs.scale.pow(-2) + counts * sample_mean / components.variance) / precision
        squares = torch.where(seen, stats.scatter.to(**opts), 0.0) + counts * (sample_mean - loc).square()
        if self.family.covariance_type == "spherical":
            variance = (2 * rate + squares.sum(1, keepdim=True)) / (2 * shape + 2 + rows * d)
            variance = torch.maximum(variance, floor.mean()).expand_as(loc)
        else:
            variance = torch.maximum((2 * rate + squares) / (2 * shape + 2 + rows), floor)
        components.loc, components.scale = loc, variance.sqrt().contiguous()

    def _map_update_covariance(
        self, components: Any, stats: Any, counts: tuple, sample_mean: torch.Tensor, prior: tuple
    ) -> None:
        """:meth:`weighted_map_update` of full or tied components: :func:`~ppmix.components.gaussian_map.map_means`
        at the current covariances, then :func:`~ppmix.components.gaussian_map.map_covariance` on the scatter about
        the new means (tied: one covariance, the components' scatters and rows summed)."""
        (counts, rows), (locs, shape, rate, floor) = counts, prior
        loc = map_means(locs.loc, locs.scale, counts, sample_mean, components.scale_tril)
        deviation = sample_mean - loc
        seen = (counts > 0)[:, None, None]
        scatter = torch.where(seen, stats.scatter.to(loc), 0.0) + counts[:, None, None] * (
            deviation[:, :, None] * deviation[:, None, :]
        )
        tril = components.scale_tril
        if self.family.covariance_type == "tied":
            scatter, rows, tril = scatter.sum(0)[None], rows.sum()[None], tril[:1]
        concentration = self._corr_concentration({"dtype": loc.dtype, "device": loc.device})
        tril = map_covariance(scatter, rows, tril, shape, rate, concentration, floor)
        components.loc = loc
        components.scale_tril = (
            tril.expand(loc.shape[0], -1, -1).contiguous() if self.family.covariance_type == "tied" else tril
        )

    def map_log_prior(self, components: ComponentFamily, d: int, scale: DataScale) -> torch.Tensor:
        """``log N(locs | m0, s0^2) + log InverseGamma(variances | a, b)`` (the variances' density, whose mode
        :meth:`map_update` takes), full and tied plus ``log LKJCholesky(corr_cholesky | D, eta)`` (tied: once, for
        the one covariance): :func:`~ppmix.components.gaussian_map.covariance_log_prior`."""
        opts = {"dtype": components.dtype, "device": components.device}
        shape, rate = self._variance_prior(scale.get("std", torch.ones(d)).to(**opts))
        log_locs = self.prior("locs", 1, d, scale, opts).log_prob(components.loc).sum()
        if self.family.covariance_type in ("full", "tied"):
            values = self.family.site_values(components)
            variance, corr = values["scales"].square(), values["corr_cholesky"]
            if self.family.covariance_type == "tied":
                variance, corr = variance[None], corr[None]
            return log_locs + covariance_log_prior(variance, corr, shape, rate, self._corr_concentration(opts)).sum()
        variance = components.variance[:, 0] if self.family.covariance_type == "spherical" else components.variance
        return log_locs + dist.InverseGamma(shape, rate).log_prob(variance).sum()

    def conjugate_posterior(
        self, site: str, stats: Any, values: dict[str, torch.Tensor], scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """Diagonal or spherical components given their rows' :class:`GaussianStatistics` (``n_k``, mean
        ``xbar_k``, scatter ``S_k``): ``locs_k | var_k ~ N(m, 1 / P)`` with ``P = 1 / s0^2 + n_k / var_k`` and
        ``m = (m0 / s0^2 + n_k xbar_k / var_k) / P`` under the prior ``N(m0, s0^2)``; then ``var_k | locs_k ~
        InverseGamma(a + n_k / 2, b + (S_k + n_k (xbar_k - locs_k)^2) / 2)`` under ``InverseGamma(a, b)``
        (spherical: summed over the features, ``a + n_k D / 2``), drawn as ``scales = sqrt(var)``."""
        if not has_conjugate_prior(self.family):
            raise NotImplementedError(
                f"covariance_type={self.family.covariance_type!r}: the scales and LKJ correlation are not conjugate"
            )
        d = stats.mean.shape[1]
        counts = stats.counts.to(**opts)[:, None]
        seen = counts > 0
        sample_mean = torch.where(seen, stats.mean.to(**opts), 0.0)
        if site == "locs":
            prior = self.prior("locs", 1, d, scale, opts).base_dist
            var = values["scales"].square()
            var = var[:, None] if self.family.covariance_type == "spherical" else var
            precision = prior.scale.pow(-2) + counts / var
            centre = (prior.loc * prior.scale.pow(-2) + counts * sample_mean / var) / precision
            return dist.Normal(centre, precision.rsqrt())
        squares = torch.where(seen, stats.scatter.to(**opts), 0.0) + counts * (sample_mean - values["locs"]).square()
        shape, rate = self._variance_prior(scale.get("std", torch.ones(d)).to(**opts))
        if self.family.covariance_type == "spherical":
            shape, rate = shape + counts[:, 0] * d / 2, rate + squares.sum(1) / 2
        else:
            shape, rate = shape + counts / 2, rate + squares / 2
        return dist.TransformedDistribution(dist.InverseGamma(shape, rate), [PowerTransform(0.5)])
