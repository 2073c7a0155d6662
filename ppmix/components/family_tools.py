"""The machinery around the family contract: what the structures and engines derive from a family's members and
that no family writes.

:class:`~ppmix.components.family.DensityFamily` and :class:`~ppmix.components.base.ComponentFamily` declare the
contract, the members a family writes or may override. Everything here is computed from them, once, for every
family: the components EM starts from (:func:`placeholder`), a saved model's components (:func:`loaded`) and
fitted components on a new data scale (:func:`rescaled`), all three built by the family's ``components``; a
family's settings (:func:`family_settings`), its hyperparameters as ``priors=`` set them (:func:`prior_value`), its
capabilities (:func:`has_map_update`, :func:`has_conjugate_prior`), its number of free parameters
(:func:`n_parameters`) and ArviZ dimensions (:func:`site_dims`), both read off its
:class:`~ppmix.components.family.SiteSpec`, its data scale under ``sample_weight`` (:func:`measure_data_scale`) and
the E-step of a mixture of its components (:func:`mixture_statistics`), and the rows and k-means points of its
prepared data (:func:`data_rows`, :func:`start_points`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from pyro.distributions.transforms import biject_to

from ppmix.components.base import ComponentFamily
from ppmix.components.family import DataScale, DensityFamily, FamilyPriors, PreparedRows, family_settings

__all__ = [
    "data_rows",
    "family_settings",
    "has_conjugate_prior",
    "has_map_update",
    "measure_data_scale",
    "mixture_statistics",
    "n_parameters",
    "placeholder",
    "loaded",
    "prior_value",
    "rescaled",
    "site_dims",
    "start_points",
]


def prior_value(family: DensityFamily, key: str, default: torch.Tensor) -> torch.Tensor:
    """The hyperparameter ``key`` of ``family``'s priors (:class:`~ppmix.components.family.FamilyPriors`): the value a
    model's ``priors=`` set (:func:`~ppmix.components.family.with_priors`) broadcast to ``default``'s shape, or
    ``default``.

    Examples
    --------
    >>> from ppmix.components.family import with_priors
    >>> from ppmix.components.poisson import PoissonFamily
    >>> family = with_priors(PoissonFamily(), {"rate_rate": 2.0})
    >>> prior_value(family, "rate_rate", torch.ones(2)).tolist()
    [2.0, 2.0]
    >>> prior_value(family, "rate_concentration", torch.ones(2)).tolist()  # not set: the default
    [1.0, 1.0]
    """
    value = family._prior_settings.get(key)
    if value is None:
        return default
    tensor = torch.as_tensor(value, dtype=default.dtype, device=default.device)
    try:
        return tensor.expand_as(default)
    except RuntimeError:
        raise ValueError(
            f"priors[{key!r}] must be a number or broadcast to shape {tuple(default.shape)}; got shape "
            f"{tuple(tensor.shape)}"
        ) from None


def has_map_update(family: DensityFamily) -> bool:
    """Whether ``family``'s priors write :meth:`~ppmix.components.family.FamilyPriors.map_update` (what MAP-EM,
    ``engine="em"`` with ``priors``, needs).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> has_map_update(PoissonFamily())
    True
    """
    return type(family.priors()).map_update is not FamilyPriors.map_update


def has_conjugate_prior(family: DensityFamily) -> bool:
    """Whether ``family``'s :meth:`~ppmix.components.family.FamilyPriors.conjugate_posterior` draws every site (what
    ``engine="gibbs"`` needs): the family writes it and none of its sites is declared not conjugate
    (``SiteSpec(conjugate=False)``: a full covariance's scales and correlations).

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> has_conjugate_prior(GaussianFamily("diag")), has_conjugate_prior(GaussianFamily("full"))
    (True, False)
    """
    if type(family.priors()).conjugate_posterior is FamilyPriors.conjugate_posterior:
        return False
    return all(spec.conjugate for spec in family.sites(1, 2).values())


def placeholder(family: DensityFamily, k: int, d: int, scale: DataScale, opts: dict) -> ComponentFamily:
    """``k`` of ``family``'s components on ``d`` features where EM starts, its first M-step to set their parameters:
    the family measured on ``scale`` (:meth:`~ppmix.components.family.DensityFamily.measured`) builds them from the
    start value of each of its sites (:meth:`~ppmix.components.family.SiteSpec.start_value`). ``opts`` are the
    tensors' ``dtype`` and ``device``.

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> placeholder(PoissonFamily(), 2, 3, {}, {"dtype": torch.float64}).rate.shape
    torch.Size([2, 3])
    """
    measured = family.measured(scale)
    values = {site: spec.start_value(k, scale, opts) for site, spec in measured.sites(k, d).items()}
    return measured.components(values, scale)


def loaded(
    family: DensityFamily, state: dict[str, torch.Tensor], k: int, d: int, scale: DataScale, opts: dict
) -> ComponentFamily:
    """``k`` of ``family``'s components on ``d`` features with the parameters ``state`` (a saved model's, by their
    names in ``param_names``), bit for bit: the components EM starts from (:func:`placeholder`, built by the family's
    ``components`` with the settings it takes from ``scale``) with ``state`` loaded. ``opts`` are the tensors'
    ``dtype`` and ``device``.

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> tril = torch.tensor([[[2.0, 0.0], [1.0, 3.0]]], dtype=torch.float64)
    >>> state = {"loc": torch.zeros(1, 2, dtype=torch.float64), "scale_tril": tril}
    >>> comp = loaded(GaussianFamily("full"), state, 1, 2, {"floor": torch.tensor(0.5)}, {"dtype": torch.float64})
    >>> torch.equal(comp.scale_tril, tril), float(comp.reg_covar)
    (True, 0.5)
    """
    return placeholder(family, k, d, scale, opts).load_state_dict(state)  # type: ignore[return-value]


def rescaled(family: DensityFamily, components: ComponentFamily, scale: DataScale) -> ComponentFamily:
    """``components`` as ``family`` builds them on the data scale ``scale`` (a warm start's new training data: the
    settings the family's ``components`` takes from it, e.g. a floor), their parameters unchanged bit for bit: the
    family's ``components`` of their site values, with their state loaded.

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> family = GaussianFamily("full")
    >>> fitted = placeholder(family, 2, 3, {}, {"dtype": torch.float64})
    >>> again = rescaled(family, fitted, {"floor": torch.tensor(0.25)})
    >>> torch.equal(again.scale_tril, fitted.scale_tril), float(fitted.reg_covar), float(again.reg_covar)
    (True, 1e-06, 0.25)
    """
    rebuilt = family.components(family.site_values(components), scale)
    return rebuilt.load_state_dict(components.state_dict())  # type: ignore[return-value]


def n_parameters(family: DensityFamily, k: int, d: int) -> int:
    """Free parameters of ``k`` of ``family``'s components on ``d`` features (for the information criteria): the
    dimensions of its sites' values in their unconstrained coordinates (a simplex of ``m`` entries counts ``m - 1``,
    a correlation Cholesky factor ``d (d - 1) / 2``; a shared site once).

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> n_parameters(GaussianFamily("full"), 3, 2), n_parameters(GaussianFamily("tied"), 3, 2)
    (15, 9)
    """
    total = 0
    for spec in family.sites(k, d).values():
        shape = spec.value_shape(k)
        total += int(torch.Size(biject_to(spec.support).inv.forward_shape(shape)).numel())
    return total


def site_dims(family: DensityFamily) -> dict[str, list[str]]:
    """ArviZ dimension names of each of ``family``'s sites beyond the draws: ``component`` (not for a shared site),
    then the site's declared ``SiteSpec.dims``, by default ``feature`` and, for a square event, ``feature_bis``.

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> site_dims(GaussianFamily("tied"))["corr_cholesky"], site_dims(GaussianFamily("tied"))["locs"]
    (['feature', 'feature_bis'], ['component', 'feature'])
    """
    dims = {}
    for site, spec in family.sites(1, 2).items():
        event = list(spec.dims) if spec.dims is not None else ["feature", "feature_bis"][: len(spec.event_shape)]
        dims[site] = event if spec.shared else ["component", *event]
    return dims


def measure_data_scale(
    family: DensityFamily, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None
) -> DataScale:
    """``family``'s :meth:`~ppmix.components.family.DensityFamily.data_scale` of the rows ``x`` ``(N, D)``, each
    counted ``weight`` ``(N,)`` times where given (``sample_weight``; for integer weights, that of the rows repeated).
    A family whose ``data_scale`` takes no ``weight`` gets the rows of positive weight, which is the repeated rows'
    scale for a scale that depends only on the values that occur (a number of levels).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> x = torch.tensor([[1.0], [3.0], [8.0]], dtype=torch.float64)
    >>> measure_data_scale(PoissonFamily(), x, weight=torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    {'mean': tensor([2.], dtype=torch.float64)}
    """
    if weight is None:
        return family.data_scale(x, name)
    if "weight" in inspect.signature(family.data_scale).parameters:
        return family.data_scale(x, name, weight=weight)
    return family.data_scale(x[weight > 0], name)


def mixture_statistics(
    components: ComponentFamily, data: Any, log_weights: torch.Tensor, row_weights: torch.Tensor | None = None
) -> tuple[Any, torch.Tensor]:
    """The E-step of a mixture of ``components``: their statistics under the responsibilities
    ``r_nk ∝ weights_k p_k(x_n)`` and the log-likelihood ``sum_n log sum_k weights_k p_k(x_n)`` (``log_weights`` the
    log mixing weights ``(K,)``); with ``row_weights`` ``(N,)`` (``sample_weight``) row ``n`` counts
    ``row_weights[n]`` times. The Gaussians compute both in one fused pass (a private fast path of theirs, equal to
    the definition up to rounding).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonComponents
    >>> comp = PoissonComponents(torch.tensor([[1.0], [4.0]], dtype=torch.float64))
    >>> x = torch.tensor([[0.0], [5.0]], dtype=torch.float64)
    >>> stats, log_lik = mixture_statistics(comp, x, torch.tensor([0.5, 0.5], dtype=torch.float64).log())
    >>> [round(v, 3) for v in stats.counts.tolist()], round(float(log_lik), 3)
    ([0.972, 1.028], -4.174)
    """
    return components._expected_statistics(data, log_weights, row_weights)


def data_rows(data: Any) -> torch.Tensor:
    """The ``(N, D)`` rows of a family's prepared data (the inverse of its ``prepare``): a
    :class:`~ppmix.components.family.PreparedRows`'s ``rows``, or the rows themselves.

    Examples
    --------
    >>> from ppmix.components.centred import CentredData
    >>> x = torch.tensor([[1.0], [3.0]])
    >>> data_rows(CentredData.from_tensor(x)) is x, data_rows(x) is x
    (True, True)
    """
    return data.rows if isinstance(data, PreparedRows) else data


def start_points(data: Any) -> torch.Tensor:
    """The points the k-means start clusters for a family's prepared data: a
    :class:`~ppmix.components.family.PreparedRows`'s ``start_points`` (centred rows, centred logarithms, one-hot
    codes, count profiles), or the rows themselves.

    Examples
    --------
    >>> from ppmix.components.centred import CentredData
    >>> start_points(CentredData.from_tensor(torch.tensor([[1.0], [3.0]]))).ravel().tolist()
    [-1.0, 1.0]
    """
    return data.start_points if isinstance(data, PreparedRows) else data
