"""The declared protocols between component families and the structures that use them.

Two levels, as in ``torch.distributions`` (a class, then an instance with parameters):

- :class:`DensityFamily` is what a user passes to a structure (``Mixture(3, family=...)``,
  ``HMM(3, emission=...)``): the *kind* of component and its settings, without parameters.
  It knows the Pyro sites of its parameters and their priors, what data it accepts, how
  to prepare data for EM, and how to build its fitted components.
- :class:`~ppmix.components.base.ComponentFamily` is the batch of ``K`` fitted components
  (parameters with leading dimension ``K``): ``log_prob -> (N, K)``, ``statistics(data, weights)``
  and ``fit_statistics(stats)`` (the weighted MLE), ``pyro_dist``, ``sample``, ``state_dict``.

:class:`Statistics` is the one base of every family's E-step statistics: they merge across
shards (sharded EM), scale (online EM's convex combinations) and move between devices.

A new family is one module with one class of each kind: six abstract members to write (``sites`` here, five on
the components), the optional ones documented with their defaults; :func:`ppmix.testing.check_family` checks it
and :func:`~ppmix.components.registry.register_family` (or the ``ppmix.families`` entry point of an installed
package) names it for saved models. See :mod:`ppmix.components.poisson` for a whole example.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import inspect
from typing import Any, Callable, ClassVar, Collection, Mapping

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.components.base import ComponentFamily

__all__ = [
    "check_priors",
    "family_settings",
    "with_priors",
    "AdditiveStatistics",
    "DataScale",
    "DensityFamily",
    "FamilyPriors",
    "MeanStatisticsComponents",
    "PreparedRows",
    "PriorKey",
    "SiteSpec",
    "Statistics",
    "WeightedSums",
    "merge_statistics",
    "posterior_mode",
    "scale_statistics",
]

#: a family's data-dependent settings, measured once on the training data (e.g. a variance floor)
DataScale = dict[str, torch.Tensor]


def posterior_mode(posterior: dist.Distribution) -> torch.Tensor:
    """The mode of a conjugate posterior, MAP-EM's update of its site: a Gamma's ``(a - 1) / b``, a Beta's
    ``(a - 1) / (a + b - 2)`` (0 where ``a + b <= 2``: no weight under a flat prior) or a Dirichlet's
    ``(alpha - 1) / sum(alpha - 1)`` (uniform where that sum is not positive).

    Examples
    --------
    >>> posterior_mode(dist.Gamma(torch.tensor(5.0), torch.tensor(2.0))).item()
    2.0
    >>> posterior_mode(dist.Beta(torch.tensor(3.0), torch.tensor(1.0))).item()
    1.0
    >>> posterior_mode(dist.Dirichlet(torch.tensor([2.0, 3.0, 1.0]))).tolist()
    [0.3333333432674408, 0.6666666865348816, 0.0]
    """
    if isinstance(posterior, dist.Gamma):
        return (posterior.concentration - 1) / posterior.rate
    if isinstance(posterior, dist.Beta):
        a, b = posterior.concentration1, posterior.concentration0
        trials = a + b - 2
        return (a - 1) / torch.where(trials > 0, trials, 1.0)
    if isinstance(posterior, dist.Dirichlet):
        pseudo = posterior.concentration - 1
        totals = pseudo.sum(-1, keepdim=True)
        return torch.where(totals > 0, pseudo / torch.where(totals > 0, totals, 1.0), 1.0 / pseudo.shape[-1])
    raise TypeError(f"no closed-form mode for a {type(posterior).__name__} posterior")


@dataclasses.dataclass(frozen=True)
class SiteSpec:
    """One global Pyro site of a family's parameters: its support and the event shape of one component's
    value, in the ``components`` plate; or, ``shared``, one value of that shape for every component, outside
    the plate (e.g. a tied covariance).

    Parameters
    ----------
    support : torch.distributions.constraints.Constraint
        Where the site's values live (``constraints.positive`` for scales); unconstrained SVI and NUTS transform to
        it.
    event_shape : tuple of int
        The shape of one component's value (``(D,)`` for a mean vector).
    shared : bool, default False
        One value for every component, outside the ``components`` plate.
    dims : tuple of str, optional
        ArviZ names of the event dimensions (default ``feature`` and, for a square event, ``feature_bis``).
    conjugate : bool, default True
        False where the family's priors' ``conjugate_posterior`` cannot draw this site (``engine="gibbs"`` then
        refuses the family).
    start : callable, optional
        ``start(k, scale, opts)``: the site's value ``value_shape(k)`` in the components EM starts from (before its
        first M-step), given the training data's scale and the tensor options ``opts``; default: a valid point of
        ``support`` (zeros, one half, uniform on the simplex, the identity or ones). A family whose M-step depends on
        its current parameters (the Student-t's weights ``u``) declares where it starts.

    Examples
    --------
    >>> per_component = SiteSpec(constraints.positive, (3,))
    >>> per_component.value_shape(4), SiteSpec(constraints.positive, (3,), shared=True).value_shape(4)
    ((4, 3), (3,))
    """

    support: constraints.Constraint
    event_shape: tuple[int, ...]
    shared: bool = False
    dims: tuple[str, ...] | None = None
    conjugate: bool = True
    start: Callable[[int, DataScale, dict], torch.Tensor] | None = None

    def value_shape(self, k: int) -> tuple[int, ...]:
        """The shape of the site's value for ``k`` components: ``(k, *event_shape)``, or ``event_shape`` if shared.

        Examples
        --------
        >>> per_component, shared = SiteSpec(constraints.real, (2,)), SiteSpec(constraints.real, (2,), shared=True)
        >>> per_component.value_shape(3), shared.value_shape(3)
        ((3, 2), (2,))
        """
        return tuple(self.event_shape) if self.shared else (k, *self.event_shape)

    def start_value(self, k: int, scale: DataScale, opts: dict) -> torch.Tensor:
        """The site's value for ``k`` components where EM starts: ``start(k, scale, opts)``, or a valid point of
        the support (zeros, one half, uniform on the simplex, the identity, ones).

        Examples
        --------
        >>> SiteSpec(constraints.simplex, (2,)).start_value(1, {}, {}).tolist()
        [[0.5, 0.5]]
        """
        if self.start is not None:
            return self.start(k, scale, opts)
        return _a_point_of(self.support, self.value_shape(k), opts)


@dataclasses.dataclass(frozen=True)
class PriorKey:
    """One hyperparameter that a model's ``priors=`` may set: what it is and its default (``doc``), and its
    domain: ``"real"``, ``"positive"`` or ``"concentration"`` (of a Dirichlet or Beta: positive, and at least 1
    for MAP-EM, whose mode is otherwise on the boundary).

    Examples
    --------
    >>> PriorKey("the Dirichlet concentration of the weights (default 1)", "concentration").check("weights", 2)
    >>> PriorKey("a rate", "positive").check("rate_rate", -1.0)
    Traceback (most recent call last):
    ...
    ValueError: priors['rate_rate'] must be positive (a rate); got -1.0
    """

    doc: str
    domain: str = "positive"

    def check(self, key: str, value: Any, *, map_em: bool = False) -> None:
        """Refuse a value outside the domain (or not finite numbers), with a ``ValueError`` naming ``priors``."""
        try:
            tensor = None if isinstance(value, (bool, str)) else torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            tensor = None
        if tensor is None or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"priors[{key!r}] must be a finite number or array of them ({self.doc}); got {value!r}")
        if self.domain == "real":
            return
        if map_em and self.domain == "concentration":
            if not bool((tensor >= 1).all()):
                raise ValueError(
                    f"priors[{key!r}] must be at least 1 for engine='em' (MAP-EM) ({self.doc}); got {value!r}"
                )
        elif not bool((tensor > 0).all()):
            raise ValueError(f"priors[{key!r}] must be positive ({self.doc}); got {value!r}")


def check_priors(
    priors: Any,
    keys: Mapping[str, PriorKey],
    owner: str,
    *,
    map_em: bool = False,
    arrays: Collection[str] | None = None,
) -> None:
    """A model's ``priors=``: None, or a mapping of ``keys`` (a model's ``prior_keys()``) to None (the default) or
    values in their domains (:meth:`PriorKey.check`; with ``map_em``, as MAP-EM needs them), arrays only for the
    keys in ``arrays`` (None: every key); else a ``TypeError`` or ``ValueError`` naming ``priors`` and the key,
    an unknown key with the keys ``owner`` (the model, in words) takes.

    Examples
    --------
    >>> keys = {"weights": PriorKey("the weights' concentration", "concentration")}
    >>> check_priors({"weights": 2.0}, keys, "GMM")
    >>> check_priors({"weight": 2.0}, keys, "GMM")
    Traceback (most recent call last):
    ...
    ValueError: priors has an unknown key 'weight': GMM takes ['weights']
    >>> check_priors({"weights": [2.0, 3.0]}, keys, "GMM", arrays=())
    Traceback (most recent call last):
    ...
    ValueError: priors['weights'] must be a number, not an array (the weights' concentration); got [2.0, 3.0]
    """
    if priors is None:
        return
    if not isinstance(priors, Mapping):
        raise TypeError(f"priors must be None or a dict of hyperparameters; got {type(priors).__name__}")
    for key, value in priors.items():
        if key not in keys:
            raise ValueError(f"priors has an unknown key {key!r}: {owner} takes {sorted(keys)}")
        if value is None:
            continue
        keys[key].check(key, value, map_em=map_em)
        if arrays is not None and key not in arrays and torch.as_tensor(value).numel() != 1:
            raise ValueError(f"priors[{key!r}] must be a number, not an array ({keys[key].doc}); got {value!r}")


class PreparedRows(abc.ABC):
    """Base of the data a family's ``prepare`` returns in place of the rows themselves (centred rows, logarithms,
    one-hot codes, lagged frames): they know the rows they were prepared from and the points k-means starts on.

    Examples
    --------
    >>> from ppmix.components.centred import CentredData
    >>> data = CentredData.from_tensor(torch.tensor([[1.0], [3.0]]))
    >>> isinstance(data, PreparedRows), data.rows.ravel().tolist(), data.start_points.ravel().tolist()
    (True, [1.0, 3.0], [-1.0, 1.0])
    """

    @property
    @abc.abstractmethod
    def rows(self) -> torch.Tensor:
        """The ``(N, D)`` rows these data were prepared from (the inverse of ``prepare``)."""

    @property
    def start_points(self) -> torch.Tensor:
        """The points the k-means start clusters, ``(N, D')``; default: the rows."""
        return self.rows


class _Declared:
    """A member every subclass must set on its instances (a dataclass field): reading it where one did not is a
    ``TypeError`` naming the class and what the member is (not an ``AttributeError`` deep in EM)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:  # absent on the class: a dataclass field of this name gets no default from here
            raise AttributeError(self.name)
        raise TypeError(
            f"{type(instance).__name__} has no {self.name!r} ({self.what}), which every Statistics must have: "
            f"declare it as a field"
        )


class Statistics(abc.ABC):
    """Base of the E-step statistics of every family: what one M-step needs of some rows.

    Everything EM reads of them is declared here: the structures read :attr:`counts`; sharded EM merges the
    statistics of every shard (:meth:`merge`), online EM forms convex combinations (:meth:`merge` and
    :meth:`scaled`) and :meth:`to` moves them between devices. :class:`AdditiveStatistics` writes the three
    methods for statistics that are weighted sums; a family's ``fit_statistics`` reads the rest.

    Attributes
    ----------
    counts : Tensor (K,)
        The total weight of the rows in every component (the mixture's weights are their proportions).

    Examples
    --------
    A family's statistics are a subclass; :class:`WeightedSums` is the simplest:

    >>> stats = WeightedSums(torch.tensor([2.0, 1.0]), torch.tensor([[2.0], [6.0]]))
    >>> isinstance(stats, Statistics), stats.counts.tolist(), stats.to(dtype=torch.float64).counts.dtype
    (True, [2.0, 1.0], torch.float64)
    """

    #: the total weight per component ``(K,)``; a subclass sets it on its instances (a dataclass field)
    counts: Any = _Declared("the total weight of the rows per component, (K,), that EM's weights update reads")

    #: statistics that merge with a family's own from either side (the per-feature statistics of rows with missing
    #: entries, :class:`~ppmix.components.independent.FeatureStatistics`): a family's merge hands them the work
    absorbs_family_statistics: ClassVar[bool] = False

    @abc.abstractmethod
    def merge(self, other: Any) -> Any:
        """The statistics of the union of these rows and ``other``'s."""

    @abc.abstractmethod
    def scaled(self, factor: float) -> Any:
        """The statistics with every weight multiplied by ``factor``."""

    @abc.abstractmethod
    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Any:
        """The statistics on ``device`` and/or in ``dtype``."""


class AdditiveStatistics(Statistics):
    """Statistics that are plain weighted sums (a dataclass of tensors): they merge by adding and scale by
    multiplying, field by field. Subclass it with ``@dataclass(frozen=True)``.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Sums(AdditiveStatistics):
    ...     counts: torch.Tensor
    ...     totals: torch.Tensor
    >>> both = Sums(torch.tensor([1.0]), torch.tensor([2.0])).merge(Sums(torch.tensor([3.0]), torch.tensor([4.0])))
    >>> both.counts.item(), both.scaled(0.5).totals.item()
    (4.0, 3.0)
    """

    def _fields(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def merge(self, other: Any) -> Any:
        if getattr(other, "absorbs_family_statistics", False):
            return other.merge(self)
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        return type(self)(**{name: value + getattr(other, name) for name, value in self._fields().items()})

    def scaled(self, factor: float) -> Any:
        return type(self)(**{name: value * factor for name, value in self._fields().items()})

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Any:
        return type(self)(**{name: value.to(dtype=dtype, device=device) for name, value in self._fields().items()})


@dataclasses.dataclass(frozen=True)
class WeightedSums(AdditiveStatistics):
    """Per component, the total weight ``counts`` ``(K,)`` and the weighted sums of the rows ``totals`` ``(K, D)``:
    all the weighted MLE needs in families whose estimate is a function of the weighted mean (Poisson,
    Bernoulli, exponential).

    Parameters
    ----------
    counts : Tensor of shape (K,)
        The total weight of the rows in every component.
    totals : Tensor of shape (K, D)
        The weighted sums of the rows, per component.

    Examples
    --------
    >>> sums = WeightedSums(torch.tensor([2.0, 1.0]), torch.tensor([[2.0], [6.0]]))
    >>> sums.merge(sums).counts.tolist(), sums.scaled(0.5).totals.tolist()
    ([4.0, 2.0], [[1.0], [3.0]])
    """

    counts: torch.Tensor
    totals: torch.Tensor


def merge_statistics(first: object, second: object) -> object:
    """Merge two E-step statistics of the same structure: tensors add,
    :class:`~ppmix.components.family.Statistics` merge, dicts, lists and tuples merge entry by entry.

    Examples
    --------
    >>> first = {"n": torch.tensor(2.0), "s": [torch.ones(2)]}
    >>> merged = merge_statistics(first, {"n": torch.tensor(3.0), "s": [torch.ones(2)]})
    >>> merged["n"].item(), merged["s"][0].tolist()
    (5.0, [2.0, 2.0])
    """
    if isinstance(first, torch.Tensor):
        return first + second
    if isinstance(first, dict):
        if set(first) != set(second):
            raise ValueError(f"statistics with different entries cannot merge: {sorted(first)} vs {sorted(second)}")
        return {key: merge_statistics(first[key], second[key]) for key in first}
    if isinstance(first, (list, tuple)):
        return type(first)(merge_statistics(a, b) for a, b in zip(first, second, strict=True))
    if isinstance(first, Statistics):
        return first.merge(second)
    raise TypeError(f"cannot merge statistics of type {type(first).__name__}")


def scale_statistics(stats: object, factor: float) -> object:
    """E-step statistics as if every weight were multiplied by ``factor`` (tensors scale,
    :class:`~ppmix.components.family.Statistics` scale, dicts, lists and tuples entry by entry). With
    :func:`merge_statistics` this forms the convex combinations of stochastic EM.

    Examples
    --------
    >>> scale_statistics({"n": torch.tensor(4.0)}, 0.25)["n"].item()
    1.0
    """
    if isinstance(stats, torch.Tensor):
        return stats * factor
    if isinstance(stats, dict):
        return {key: scale_statistics(value, factor) for key, value in stats.items()}
    if isinstance(stats, (list, tuple)):
        return type(stats)(scale_statistics(value, factor) for value in stats)
    if isinstance(stats, Statistics):
        return stats.scaled(factor)
    raise TypeError(f"cannot scale statistics of type {type(stats).__name__}")


class MeanStatisticsComponents(ComponentFamily):
    """Base of the components whose weighted MLE depends on the rows only through their weighted means:
    :meth:`statistics` are :class:`WeightedSums`; a subclass writes ``fit_statistics`` from :meth:`weighted_means`.

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonComponents
    >>> comp = PoissonComponents(torch.tensor([[1.0], [4.0]], dtype=torch.float64))
    >>> data = torch.tensor([[0.0], [2.0], [6.0]], dtype=torch.float64)
    >>> weights = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> stats = comp.statistics(data, weights)
    >>> isinstance(comp, MeanStatisticsComponents), stats.counts.tolist(), comp.weighted_means(stats).tolist()
    (True, [2.0, 1.0], [[1.0], [6.0]])
    """

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> WeightedSums:
        weights = self._check_weights(weights, data.shape[0])
        return WeightedSums(weights.sum(0), weights.T @ data.to(self.dtype))

    def weighted_means(self, stats: WeightedSums) -> torch.Tensor:
        """``sum_n r_nk x_n / sum_n r_nk`` ``(K, D)`` (zero for a component without weight)."""
        counts = stats.counts.to(self.dtype)[:, None]
        return stats.totals.to(self.dtype) / torch.where(counts > 0, counts, 1.0)

    def fit(self, data: torch.Tensor, weights: torch.Tensor) -> Any:
        return self.fit_statistics(self.statistics(data, weights))


def _refuse_moved(cls: type, moved: Mapping[str, str]) -> None:
    """A ``TypeError`` naming a member ``cls`` defines that the family contract moved elsewhere (``moved``: the
    member, where it went), which the structures would otherwise silently ignore."""
    defined = sorted(set(moved) & set(vars(cls)))
    if defined:
        raise TypeError(
            f"{cls.__name__} defines {defined[0]!r}, which is no longer a member of the family contract: write it "
            f"as {moved[defined[0]]}"
        )


class DensityFamily(abc.ABC):
    """A kind of component for the structures (mixture, HMM): what they ask of it, declared once.

    **The family contract** is the members a family writes or may override: ``__contract__`` here and
    ``ComponentFamily.__contract__`` on its fitted components (:class:`~ppmix.components.base.ComponentFamily`),
    and nothing else (``tests/components/test_protocol.py`` counts them: 15). Six are abstract, the members every
    family writes: :meth:`sites` here, ``log_prob``, ``statistics``, ``fit_statistics``, ``pyro_dist`` and
    ``sample`` on the components. The optional ones have defaults that suit most families: the data
    (:meth:`check_data`, :meth:`data_scale`, :meth:`prepare`, :meth:`measured`), the components from the site
    values and back (:meth:`components`, :meth:`site_values`; parameters passed by name) and the priors
    (:meth:`priors`: one :class:`FamilyPriors` with MCMC's densities, the keys ``priors=`` sets, MAP-EM and Gibbs).
    :meth:`components` is the one constructor of the components: settings they take beyond their parameters (a
    floor, from the data scale or the family's own) are passed there, and every route builds them through it
    (Pyro's site values; where EM starts; a warm start's new data scale and a saved model's parameters, loaded by
    name into the components it builds: :func:`~ppmix.components.family_tools.rescaled` and
    :func:`~ppmix.components.family_tools.loaded`). The family has no private hooks to override.
    Besides them a family declares :attr:`name` and :attr:`components_class` (and may declare ``start_spread``, the
    softening of k-means' hard start clusters, and a site's ``SiteSpec.start``, where EM starts); it checks its
    settings in its constructor. What the structures derive from these members (the components EM starts from, the
    settings saved, the number of free parameters, the ArviZ dimensions, the capabilities) is machinery, in
    :mod:`ppmix.components.family_tools`; the closed-form divergences between components are a registry,
    :mod:`ppmix.components.divergence`. :func:`ppmix.testing.check_family` checks a family against the structures
    and engines.

    A *sequence family*, whose frames depend on those before them (the autoregressive family), also writes
    ``sequence_rows`` and ``sequence_scale`` (and its components ``sample_paths``), which the HMM alone reads.

    Attributes
    ----------
    name : str
        The family's name in the registry (:mod:`ppmix.components.registry`) and in saved files.
    components_class : type
        The :class:`~ppmix.components.base.ComponentFamily` subclass of its fitted components.

    Examples
    --------
    >>> from ppmix.components.registry import family_from
    >>> family = family_from("gaussian")
    >>> isinstance(family, DensityFamily), sorted(family.sites(3, 2))
    (True, ['locs', 'scales'])
    """

    name: ClassVar[str]
    components_class: ClassVar[type[ComponentFamily]]
    #: the members of the contract on the family (the rest is on its components' class)
    __contract__: ClassVar[tuple[str, ...]] = (
        "sites",
        "check_data",
        "data_scale",
        "prepare",
        "measured",
        "components",
        "site_values",
        "priors",
    )
    #: members of the contract before issue 50 and where they went: a family defining one is refused, not ignored
    _moved: ClassVar[dict[str, str]] = {
        **{name: f"priors().{name}" for name in ("prior", "map_update", "map_log_prior", "conjugate_posterior")},
        "prior_keys": "priors().keys",
        "placeholder": "the start values of its sites (SiteSpec.start)",
    }
    #: the hyperparameters :func:`with_priors` set (none: every default), read by
    #: :func:`~ppmix.components.family_tools.prior_value`
    _prior_settings: Mapping[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_moved(cls, DensityFamily._moved)

    # ------------------------------------------------------------------ settings
    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in family_settings(self).items())})"

    def measured(self, scale: DataScale) -> "DensityFamily":
        """The family with the settings it measures on the training data (:meth:`data_scale`) filled in from
        ``scale``, for the calls that take no scale (``sites``, ``check_data``, ``prepare``); a structure's
        ``_component_family()`` is this of its recorded scale. Default: the family itself (its sites do not depend
        on the data); the categorical family fills in its number of levels."""
        return self

    # ---------------------------------------------------------------------- data
    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        """Refuse data the family cannot model (e.g. negative counts), naming ``name``; default: any real data."""
        return None

    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """What the fit needs to know of the training data's scale (floors, the priors' centre), of the rows of ``x``
        ``(N, D)`` each counted ``weight`` ``(N,)`` times where given (``sample_weight``; for integer weights, that of
        the rows repeated). Default: nothing. A family may leave out ``weight``: it then gets the rows of positive
        weight (:func:`~ppmix.components.family_tools.measure_data_scale`), right for a scale that depends only on
        the values that occur (a number of levels); a family that measures spreads (a variance floor) weighs them."""
        return {}

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> Any:
        """``x`` as the fitted components' ``log_prob``/``statistics`` want it, prepared once per fit (training
        data, ``components`` None) or per prediction (``components`` the fitted ones); default: ``x`` itself."""
        return x

    # ----------------------------------------------------------- the components
    @abc.abstractmethod
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        """The global Pyro sites of ``k`` components on ``d`` features, in sampling order."""

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> ComponentFamily:
        """The fitted components from the values of :meth:`sites` (each ``SiteSpec.value_shape(K)``) and the training
        data's ``scale`` (:meth:`data_scale`): the one constructor of the components, which every route takes (Pyro's
        site values, where EM starts, a warm start's new scale, a saved model's parameters loaded into them). Default:
        the sites are the components' parameters, passed to ``components_class`` as the keywords of their names in
        its ``param_names`` (in any order), and nothing else. A family whose sites are not its parameters (a scale
        and a correlation for a Cholesky factor) or whose components take settings (a floor, from ``scale`` or the
        family's own) writes its own.

        Examples
        --------
        >>> from ppmix.components.poisson import PoissonFamily
        >>> PoissonFamily(floor=1e-3).components({"rate": torch.ones(2, 3)}, {}).floor
        0.001
        """
        cls = self.components_class
        return cls(**{name: values[name] for name in cls.param_names})

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        """The values of :meth:`sites` for ``components`` (the inverse of :meth:`components`); default: the
        components' parameters under the same names."""
        state = components.state_dict()
        return {site: state[site] for site in self.sites(components.n_components, 1)}

    # -------------------------------------------------------------------- priors
    def priors(self) -> "FamilyPriors":
        """The priors of the family's sites and what the Bayesian engines derive from them (MCMC's densities, the
        keys ``priors=`` sets, MAP-EM's update, Gibbs' conditional posteriors), one object: a
        :class:`FamilyPriors` of this family. Default: none of them (a family without priors fits by EM and SVI)."""
        return FamilyPriors(self)


class FamilyPriors:
    """The priors of a :class:`DensityFamily`'s sites, and what MCMC, MAP-EM and Gibbs ask of them: one object a
    family's :meth:`~DensityFamily.priors` returns, so the family's class holds only what every structure reads.

    A family with priors writes a subclass (``PoissonPriors``) and returns it from ``priors()``; each member has a
    default, so a family writes only what it offers:

    - :meth:`prior` ``(site, k, d, scale, opts)``: the weakly informative prior of a site, for MCMC (default: none,
      MCMC refuses the family);
    - :meth:`keys`: the hyperparameters a model's ``priors=`` may set (default: none), read back with
      :func:`~ppmix.components.family_tools.prior_value`;
    - :meth:`map_update` and :meth:`map_log_prior`: MAP-EM's M-step and the log prior density its objective adds
      (default: no MAP-EM; the log prior is :meth:`prior`'s density at the site values);
    - :meth:`conjugate_posterior`: a site's conditional posterior, for Gibbs (default: none).

    Parameters
    ----------
    family : DensityFamily
        The family whose priors these are (with the hyperparameters :func:`with_priors` set), kept as ``family``.

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> priors = PoissonFamily().priors()
    >>> sorted(priors.keys()), type(priors.prior("rate", 2, 3, {}, {})).__name__
    (['rate_concentration', 'rate_rate'], 'Independent')
    """

    def __init__(self, family: DensityFamily) -> None:
        self.family = family

    def keys(self) -> dict[str, PriorKey]:
        """The hyperparameters of :meth:`prior` that a model's ``priors=`` may set, with their defaults; default:
        none (the family's priors are fixed)."""
        return {}

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        """The weakly informative prior of ``site`` for MCMC (``bayesian()``), for one component (broadcast over
        the ``components`` plate; a shared site's, for its one value), with the hyperparameters that
        :func:`with_priors` set in place of their defaults."""
        raise NotImplementedError(f"{type(self.family).__name__} has no priors for MCMC")

    def map_update(self, components: ComponentFamily, stats: Any, scale: DataScale) -> None:
        """MAP-EM's M-step, in place: the components maximising the expected complete-data log-likelihood
        (``stats``, as for ``fit_statistics``) plus :meth:`map_log_prior`. Default: none (an error naming the
        family)."""
        raise NotImplementedError(
            f"the {self.family.name!r} family has no MAP-EM update, so engine='em' cannot fit it with priors set: use "
            "priors=None (maximum likelihood) or engine='mcmc'"
        )

    def map_log_prior(self, components: ComponentFamily, d: int, scale: DataScale) -> torch.Tensor:
        """The log prior density of ``components`` (on ``d`` features) that MAP-EM's objective adds to the
        log-likelihood; default: the density of :meth:`prior` at the site values."""
        values = self.family.site_values(components)
        k = components.n_components
        opts = {"dtype": components.dtype, "device": components.device}
        return sum(self.prior(site, k, d, scale, opts).log_prob(value).sum() for site, value in values.items())

    def conjugate_posterior(
        self, site: str, stats: Any, values: dict[str, torch.Tensor], scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """The conditional posterior of ``site`` for every component given the statistics of the rows assigned to
        it (``stats``, from ``statistics`` with 0/1 weights) and the current ``values`` of the other sites
        (``{site: (K, ...)}``; a site drawn earlier in the sweep holds its new value), under :meth:`prior`, when
        that prior is (conditionally) conjugate: a distribution of batch shape ``(K, *event)`` whose draws are the
        site's values. The blocked Gibbs sampler (``engine="gibbs"``) draws the sites in the order of the family's
        ``sites``. Default: no conjugate prior (a ``NotImplementedError`` naming the family)."""
        raise NotImplementedError(
            f"the {self.family.name!r} family's priors are not conjugate, so engine='gibbs' cannot draw its "
            "components; use engine='mcmc'"
        )


def family_settings(family: DensityFamily) -> dict[str, Any]:
    """``family``'s settings as JSON-able keyword arguments of its constructor (saved with a model): every named
    constructor argument, read back from the attribute of the same name.

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> family_settings(GaussianFamily("full"))
    {'covariance_type': 'full', 'reg_covar': 1e-06}
    """
    parameters = inspect.signature(type(family)).parameters.values()
    named = (p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return {name: getattr(family, name) for name in named}


def with_priors(family: DensityFamily, priors: Mapping[str, Any] | None) -> DensityFamily:
    """A copy of ``family`` whose priors take the entries of ``priors`` named in its ``priors().keys()`` (a model's
    ``priors=``, checked by the model; other keys are the structure's), as its settings (read by
    :func:`~ppmix.components.family_tools.prior_value`).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> with_priors(PoissonFamily(), {"rate_rate": 2.0, "weights": 3.0})._prior_settings
    {'rate_rate': 2.0}
    """
    copied = copy.copy(family)
    keys = family.priors().keys()
    copied._prior_settings = {key: value for key, value in (priors or {}).items() if key in keys}
    return copied


def _a_point_of(support: constraints.Constraint, shape: tuple[int, ...], opts: dict) -> torch.Tensor:
    """A valid value of ``support`` of ``shape`` (zeros, one half, uniform on the simplex, ones or the identity), for
    placeholders."""
    if support is constraints.real:
        return torch.zeros(shape, **opts)
    if support is constraints.unit_interval:
        return torch.full(shape, 0.5, **opts)
    if support is constraints.simplex:
        return torch.full(shape, 1.0 / shape[-1], **opts)
    if support is constraints.corr_cholesky:
        return torch.eye(shape[-1], **opts).expand(shape).clone()
    return torch.ones(shape, **opts)
