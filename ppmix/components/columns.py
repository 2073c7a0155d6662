"""Mixed-type data: :class:`Independent`, a family whose every column has a family of its own.

``Independent({"age": "gamma", "visits": "poisson", "smoker": "bernoulli", "region": "categorical", "bmi":
"gaussian"})`` models a row as independent columns given the component, ``log p_k(x) = sum_j log p_kj(x_j)``, each
column ``j`` under its own family (any registered one, its settings in the dict form, or a family object). Every
parameter belongs to one column, so EM's M-step is each column family's own M-step on its column, and a row with
missing entries (``missing="marginalize"``) is scored by its observed columns (the mechanism of
:mod:`ppmix.components.independent`, which this family joins through :meth:`IndependentComponents.feature`).

Columns are named by a pandas DataFrame's column names (the dict's keys; a DataFrame is then taken by name, in any
column order) or by position (a list, or a dict keyed ``0..D-1``). A DataFrame's columns of ``category``, string or
object dtype under the categorical or Bernoulli family are coded to integer codes when a model reads it
(:mod:`ppmix.components.frame_coding`); the categories found in ``fit`` are the model's ``categories_`` and code
every later frame the same way.

The fitted components (:class:`IndependentComponents`) hold one batch of components per column; their parameters
and Pyro sites are the column families' own, named ``"<j>.<name>"`` for column ``j`` (``"2.probs"``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Mapping, Sequence

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.bernoulli import BernoulliComponents
from ppmix.components.divergence import kl_divergence, register_kl
from ppmix.components.exponential import ExponentialComponents
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    FamilyPriors,
    PreparedRows,
    PriorKey,
    SiteSpec,
    with_priors,
)
from ppmix.components.family_tools import has_conjugate_prior, has_map_update, measure_data_scale, start_points
from ppmix.components.frame_coding import code_frame
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.independent import FeatureStatistics, IndependentFeatures, split_by_feature
from ppmix.components.poisson import PoissonComponents
from ppmix.components.registry import family_config, family_from

__all__ = ["ColumnData", "ColumnsDistribution", "Independent", "IndependentComponents", "IndependentPriors"]


#: the components whose columns the E-step scores and sums together, as one batch over all of them (their parameters
#: are ``(K, 1)`` per column, they score raw rows, their statistics are sums per feature): one pass, not one per column
JOINED_CLASSES = (DiagGaussian, PoissonComponents, BernoulliComponents, ExponentialComponents)


def _key(j: int, name: str) -> str:
    """The name of column ``j``'s parameter or site ``name``: ``"<j>.<name>"``."""
    return f"{j}.{name}"


def _as_configs(columns: Any) -> Any:
    """``columns`` with every family object as its saved form (``{"name": ..., **settings}``): the family's settings,
    which a saved model records and :func:`~ppmix.components.registry.family_from` reads back."""
    if isinstance(columns, DensityFamily):
        return family_config(columns)
    if isinstance(columns, Mapping) and "name" not in columns:
        return {key: _as_configs(spec) for key, spec in columns.items()}
    if isinstance(columns, (list, tuple)):
        return [_as_configs(spec) for spec in columns]
    return columns


def _column_scale(scale: DataScale, j: int) -> DataScale:
    """Column ``j``'s own data scale out of the family's (:meth:`Independent.data_scale`)."""
    prefix = _key(j, "")
    return {name[len(prefix) :]: value[0, 0] for name, value in scale.items() if name.startswith(prefix)}


@dataclasses.dataclass(frozen=True, eq=False)
class ColumnData(PreparedRows):
    """Rows prepared by :meth:`Independent.prepare`: the rows ``x`` ``(N, D)`` and each column as its family
    prepared it (``parts[j]``); k-means starts on the column families' start points side by side (a categorical
    column's one-hot levels)."""

    x: torch.Tensor
    parts: tuple[Any, ...]

    @property
    def rows(self) -> torch.Tensor:
        return self.x

    @property
    def start_points(self) -> torch.Tensor:
        return torch.cat([start_points(part) for part in self.parts], 1)


class ColumnsDistribution(dist.TorchDistribution):
    """The distribution of whole rows whose columns are independent: column ``j`` from ``parts[j]`` (event shape
    ``(1,)`` each), a row of event shape ``(D,)``; draws in ``dtype``.

    Examples
    --------
    >>> normal, poisson = dist.Normal(0.0, 1.0).expand([1]).to_event(1), dist.Poisson(2.0).expand([1]).to_event(1)
    >>> rows = ColumnsDistribution([normal, poisson], torch.float32)
    >>> value = torch.tensor([0.5, 1.0])
    >>> bool(torch.isclose(rows.log_prob(value), normal.log_prob(value[:1]) + poisson.log_prob(value[1:])))
    True
    """

    arg_constraints: dict = {}
    support = constraints.independent(constraints.real, 1)

    def __init__(self, parts: Sequence[dist.Distribution], dtype: torch.dtype) -> None:
        self.parts, self.value_dtype = tuple(parts), dtype
        batch_shape = torch.broadcast_shapes(*(part.batch_shape for part in self.parts))
        super().__init__(batch_shape, torch.Size([len(self.parts)]), validate_args=False)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "ColumnsDistribution":
        return ColumnsDistribution([part.expand(batch_shape) for part in self.parts], self.value_dtype)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return sum(part.log_prob(value[..., j : j + 1]) for j, part in enumerate(self.parts))

    def sample(self, sample_shape: torch.Size | tuple[int, ...] = ()) -> torch.Tensor:
        return torch.cat([part.sample(sample_shape).to(self.value_dtype) for part in self.parts], dim=-1)


class IndependentComponents(IndependentFeatures, ComponentFamily):
    """``K`` components whose columns are independent, column ``j`` from the batch of components ``parts[j]`` (of
    its family, over one column): ``log p_k(x) = sum_j log p_kj(x_j)``.

    Built by :class:`Independent` (:meth:`Independent.components`: each column's by its family) or from fitted
    batches (:meth:`of_parts`); their parameters are the columns' by name, ``"<j>.<name>"`` (a saved model's load
    into them). The class a family uses names its parameters (:meth:`Independent.components_class`).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonComponents
    >>> from ppmix.components.bernoulli import BernoulliComponents
    >>> f64 = torch.float64
    >>> comp = IndependentComponents.of_parts(
    ...     [PoissonComponents(torch.tensor([[1.0], [4.0]], dtype=f64)),
    ...      BernoulliComponents(torch.tensor([[0.2], [0.9]], dtype=f64))])
    >>> x = torch.tensor([[3.0, 1.0]], dtype=f64)
    >>> total = PoissonComponents(torch.tensor([[1.0], [4.0]], dtype=f64)).log_prob(x[:, :1]) + \\
    ...     BernoulliComponents(torch.tensor([[0.2], [0.9]], dtype=f64)).log_prob(x[:, 1:])
    >>> bool(torch.allclose(comp.log_prob(x), total))
    True
    """

    parts: tuple[ComponentFamily, ...]

    @classmethod
    def of_parts(cls, parts: Sequence[ComponentFamily]) -> "IndependentComponents":
        """The components of the fitted column batches ``parts`` (in column order)."""
        joined = object.__new__(independent_components_class(_param_names(parts)))
        joined.parts = tuple(parts)
        return joined

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its parameter names (its class is made for them)."""
        return _unpickle, (self.param_names, self.parts)

    # ------------------------------------------------------------------ access
    @property
    def n_components(self) -> int:
        return self.parts[0].n_components

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {_key(j, name): value for j, part in enumerate(self.parts) for name, value in part.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> "IndependentComponents":
        for j, part in enumerate(self.parts):
            part.load_state_dict({name: state[_key(j, name)] for name in part.param_names})
        return self

    def to(self, device: Any = None, dtype: torch.dtype | None = None) -> "IndependentComponents":
        for part in self.parts:
            part.to(device, dtype)
        return self

    def clone(self) -> "IndependentComponents":
        return type(self).of_parts([part.clone() for part in self.parts])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.parts))})"

    # ----------------------------------------------------------------- columns
    def feature(self, d: int) -> ComponentFamily:
        """Column ``d``'s components (fitting them fits these components' column ``d``)."""
        return self.parts[d]

    def join_features(self, fitted: Sequence[Any]) -> None:
        """Take the column components ``fitted`` (each :meth:`feature` fitted) as the columns."""
        self.parts = tuple(fitted)

    def _columns(self, data: Any) -> list[Any]:
        """Each column of ``data`` (:class:`ColumnData`, or rows ``(N, D)``) as its components take it."""
        if isinstance(data, ColumnData):
            return list(data.parts)
        x = torch.as_tensor(data)
        return [x[:, j : j + 1] for j in range(len(self.parts))]

    def moments(self) -> Moments:
        """Each component's mean and variance of every column ``(K, D)`` (a categorical column's: of its level code;
        the columns are independent)."""
        moments = [part.moments() for part in self.parts]
        return Moments(
            torch.cat([m.mean.reshape(self.n_components, 1) for m in moments], dim=1),
            torch.cat([m.covariance.reshape(self.n_components, 1) for m in moments], dim=1),
        )

    def imputed(self, resp: torch.Tensor) -> torch.Tensor:
        """Each row's missing entries given its posterior probabilities ``resp`` ``(N, K)``: a column family of
        independent features imputes its own (a categorical column its most probable level), the others their
        conditional mean."""
        columns = [
            part.imputed(resp) if isinstance(part, IndependentFeatures) else resp.to(self.dtype) @ part.moments().mean
            for part in self.parts
        ]
        return torch.cat(columns, dim=1)

    # ---------------------------------------------------------------- required
    def _batches(self, data: Any) -> list[tuple[list[int], ComponentFamily, Any]]:
        """The columns as the E-step scores them: the columns of each class of :data:`JOINED_CLASSES` (two or more)
        as one batch of components over them and their raw rows, every other column alone as its family prepared
        it; each as ``(columns, components, data)``."""
        x = data.x if isinstance(data, ColumnData) else torch.as_tensor(data)
        columns = self._columns(data)
        by_class: dict[type, list[int]] = {}
        for j, part in enumerate(self.parts):
            if type(part) in JOINED_CLASSES:
                by_class.setdefault(type(part), []).append(j)
        joined = [cols for cols in by_class.values() if len(cols) > 1]
        alone = sorted(set(range(len(self.parts))) - {j for cols in joined for j in cols})
        batches = [([j], self.parts[j], columns[j]) for j in alone]
        return batches + [(cols, _joined([self.parts[j] for j in cols]), x[:, cols]) for cols in joined]

    def log_prob(self, data: Any) -> torch.Tensor:
        """``sum_j log p_kj(x_nj)`` ``(N, K)``."""
        return sum(part.log_prob(rows) for _, part, rows in self._batches(data))

    def statistics(self, data: Any, weights: torch.Tensor) -> FeatureStatistics:
        """Each column family's statistics of its column (:class:`~ppmix.components.independent.FeatureStatistics`,
        which merge with those of rows with missing entries)."""
        weights = self._check_weights(weights, data.x.shape[0] if isinstance(data, ColumnData) else len(data))
        parts: list[Any] = [None] * len(self.parts)
        for cols, part, rows in self._batches(data):
            stats = part.statistics(rows, weights)
            for j, column_stats in zip(cols, split_by_feature(stats, len(cols)) if len(cols) > 1 else (stats,)):
                parts[j] = column_stats
        return FeatureStatistics(weights.sum(0), tuple(parts))

    def fit_statistics(self, stats: FeatureStatistics) -> "IndependentComponents":
        """Each column family's weighted MLE from its statistics; in place."""
        for part, column_stats in zip(self.parts, stats.features, strict=True):
            part.fit_statistics(column_stats)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> ColumnsDistribution:
        return ColumnsDistribution([part.pyro_dist(index) for part in self.parts], self.dtype)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One row per entry of ``index``, ``(N, D)``: a categorical column's level codes, as the model fitted them
        (:func:`~ppmix.components.frame_coding.decode_frame` maps them back to the categories)."""
        return torch.cat([part.sample(index, generator).to(self.dtype) for part in self.parts], dim=1)


@register_kl(IndependentComponents, IndependentComponents)
def _kl_independent_components(p: IndependentComponents, q: IndependentComponents) -> torch.Tensor:
    """``KL(p_i || q_j)`` ``(K, K')``: the sum of the columns' (each column family's closed form)."""
    return sum(kl_divergence(part, theirs) for part, theirs in zip(p.parts, q.parts, strict=True))


def _column_start(start: Any, j: int, k: int, scale: DataScale, opts: dict) -> torch.Tensor:
    """Column ``j``'s site's ``SiteSpec.start`` on that column's data scale."""
    return start(k, _column_scale(scale, j), opts)


def _joined(parts: Sequence[ComponentFamily]) -> ComponentFamily:
    """One batch of components over the columns of ``parts`` (of one class of :data:`JOINED_CLASSES`): their
    parameters side by side, and a variance floor per column where they have one."""
    first = parts[0]
    joined = object.__new__(type(first))
    joined.__dict__.update(first.__dict__)
    for name in first.param_names:
        setattr(joined, name, torch.cat([getattr(part, name) for part in parts], dim=1))
    if isinstance(first, DiagGaussian):
        floors = [torch.as_tensor(part.reg_covar, dtype=first.dtype, device=first.device).reshape(-1) for part in parts]
        joined.reg_covar = torch.cat([floor.expand(1) for floor in floors])
    return joined


def _param_names(parts: Sequence[Any]) -> tuple[str, ...]:
    return tuple(_key(j, name) for j, part in enumerate(parts) for name in part.param_names)


@functools.lru_cache(maxsize=None)
def independent_components_class(param_names: tuple[str, ...]) -> type[IndependentComponents]:
    """The :class:`IndependentComponents` class whose parameters are ``param_names`` (one per set of names: the
    structures read a components class's ``param_names``)."""
    return type("IndependentComponents", (IndependentComponents,), {"param_names": param_names})


def _unpickle(param_names: tuple[str, ...], parts: tuple[Any, ...]) -> IndependentComponents:
    joined = object.__new__(independent_components_class(param_names))
    joined.parts = parts
    return joined


class Independent(DensityFamily):
    """Components whose columns are independent, each under a family of its own, for the structures (registered as
    ``"independent"``): ``Mixture(K, family=Independent(...))``, ``HMM(K, emission=Independent(...))``.

    Parameters
    ----------
    columns : dict, list or one family, default "gaussian"
        Each column's family: a registered name (``"gaussian"``, ``"poisson"``, ``"categorical"``...), its dict form
        with settings (``{"name": "categorical", "n_levels": 4}``) or a family object. Keyed by column name (a
        DataFrame's columns, taken by name in any order; rows given as an array are taken in the keys' order), or
        by position: a list in column order, or a dict keyed ``0..D-1``. One family (not in a dict or list) is the
        family of every column, as many as the data has (``Independent("gaussian")`` is the diagonal Gaussian).

    Notes
    -----
    The log-density of a row is the sum of its columns' under their families, and EM's M-step is each column
    family's own on its column (its statistics are :class:`~ppmix.components.independent.FeatureStatistics`). A
    ``"gaussian"`` column is the one-dimensional Gaussian (all of them together are the diagonal Gaussian). A
    DataFrame's ``category``/string/object columns under the categorical or Bernoulli family are coded to
    ``0..C-1`` in fit (a ``category`` column in the order of its categories, others sorted; categories that no row
    holds left out), kept as the model's ``categories_``, and code later frames the same way (a category not seen
    in fit is a ``ValueError`` naming the column). Missing values (NaN, ``None``) need ``missing="marginalize"``:
    each column family then scores and fits its observed entries only. Sampling returns the level codes
    (:func:`~ppmix.components.frame_coding.decode_frame` maps them to the categories). MCMC, MAP-EM and Gibbs take
    each column family's priors, update and conjugate posterior (the Pyro sites are ``"<j>.<site>"``); a model's
    ``priors=`` sets a column's hyperparameters as ``"<column>.<key>"`` (``"visits.rate_rate"``; for one family of
    every column, that family's keys). Gibbs needs every column family to have a conjugate prior.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> frame = pd.DataFrame({
    ...     "visits": np.concatenate([rng.poisson(1.0, 150), rng.poisson(8.0, 150)]),
    ...     "region": pd.Categorical(np.concatenate([rng.choice(["north", "south"], 150, p=[0.9, 0.1]),
    ...                                              rng.choice(["north", "south"], 150, p=[0.1, 0.9])])),
    ...     "bmi": np.concatenate([rng.normal(22.0, 2.0, 150), rng.normal(30.0, 2.0, 150)])})
    >>> family = Independent({"visits": "poisson", "region": "categorical", "bmi": "gaussian"})
    >>> mix = Mixture(2, family=family, seed=0, progress=False).fit(frame)
    >>> mix.categories_
    {'region': ['north', 'south']}
    >>> np.round(np.sort(mix.means_[:, 0].numpy()))
    array([1., 8.])
    """

    name = "independent"

    def __init__(self, columns: Any = "gaussian") -> None:
        self.columns = _as_configs(columns)
        self._families_known()  # the settings checked here: a bad column family is an error naming it

    # ------------------------------------------------------------------ settings
    @functools.cached_property
    def _spec(self) -> tuple[tuple[str, ...] | None, tuple[DensityFamily, ...] | None]:
        """The column names (None: by position) and each column's family (None: one family for every column, as
        many as the data has)."""
        columns = self.columns
        if self._every is not None:
            return None, None
        if isinstance(columns, Mapping):
            keys = list(columns)
            if not keys:
                raise ValueError("columns must name at least one column's family")
            if all(isinstance(key, int) and not isinstance(key, bool) for key in keys):
                if sorted(keys) != list(range(len(keys))):
                    raise ValueError(f"columns keyed by position must be keyed 0..{len(keys) - 1}; got {sorted(keys)}")
                return None, tuple(self._family(columns[j], j) for j in range(len(keys)))
            if not all(isinstance(key, str) for key in keys):
                raise TypeError(f"columns must be keyed by column names (str) or positions (int); got keys {keys}")
            return tuple(keys), tuple(self._family(columns[key], key) for key in keys)
        if isinstance(columns, (list, tuple)) and columns:
            return None, tuple(self._family(spec, j) for j, spec in enumerate(columns))
        raise TypeError(
            "columns must be a dict of column name -> family (e.g. {'age': 'gamma', 'region': 'categorical'}) or a "
            f"non-empty list of families in column order; got {columns!r}"
        )

    @functools.cached_property
    def _every(self) -> DensityFamily | None:
        """The family of every column when ``columns`` is one family (a name, its dict form or an object)."""
        columns = self.columns
        one = isinstance(columns, (str, DensityFamily)) or (isinstance(columns, Mapping) and "name" in columns)
        return self._family(columns, "every column") if one else None

    def for_columns(self, d: int) -> "Independent":
        """This family over ``d`` columns: itself when its columns are named or listed, else its one family on each
        of ``d`` columns.

        Examples
        --------
        >>> [family.name for family in Independent("poisson").for_columns(3).families]
        ['poisson', 'poisson', 'poisson']
        """
        if self._spec[1] is not None:
            return self
        resolved = copy.copy(self)
        resolved.__dict__["_spec"] = (None, (self._every,) * int(d))
        return resolved

    @staticmethod
    def _family(spec: Any, key: Any) -> DensityFamily:
        family = family_from(spec, f"columns[{key!r}]")
        if isinstance(family, Independent) or callable(getattr(family, "sequence_rows", None)):
            raise ValueError(
                f"columns[{key!r}] must be a family of rows (one column's); got the {family.name!r} family, which "
                "cannot be a column of the independent family"
            )
        return family

    @property
    def names(self) -> tuple[str, ...] | None:
        """The column names the family is keyed by (None: by position)."""
        return self._spec[0]

    @property
    def families(self) -> tuple[DensityFamily, ...]:
        """Each column's family, in column order."""
        families = self._spec[1]
        if families is None:
            raise ValueError(
                f"the number of columns of {self!r} is not known yet: use the family of a fitted model (its "
                "_component_family()) or family.for_columns(n_columns)"
            )
        return families

    def labels(self) -> list[str]:
        """Each column's label in messages and prior keys: its name, or its position."""
        return list(self.names) if self.names is not None else [str(j) for j in range(len(self.families))]

    def measured(self, scale: DataScale) -> "Independent":
        """This family with each column family measured on its column's data scale (over the measured number of
        columns, ``scale["n_columns"]``, for one family of every column)."""
        if self._spec[1] is None:
            if "n_columns" not in scale:
                return self
            return self.for_columns(int(scale["n_columns"])).measured(scale)
        measured = copy.copy(self)
        families = tuple(family.measured(_column_scale(scale, j)) for j, family in enumerate(self.families))
        measured.__dict__["_spec"] = (self.names, families)
        return measured

    @property
    def start_spread(self) -> float:
        """The largest ``start_spread`` of the column families (how much k-means' hard start is softened)."""
        return max(float(getattr(family, "start_spread", 0.0)) for family in self._families_known())

    @property
    def components_class(self) -> type[ComponentFamily]:  # type: ignore[override]
        """The class of the components, named for their parameters (for one column until the number of columns of
        one family for every column is known)."""
        families = self.for_columns(1).families if self._spec[1] is None else self.families
        names = tuple(
            _key(j, name) for j, family in enumerate(families) for name in family.components_class.param_names
        )
        return independent_components_class(names)

    # ---------------------------------------------------------------------- data
    def code_frame(
        self, frame: Any, categories: dict[str, list[Any]] | None, *, learn: bool, name: str = "X"
    ) -> tuple[Any, dict[str, list[Any]] | None]:
        """A DataFrame as numbers for this family (:func:`~ppmix.components.frame_coding.code_frame`): the columns
        in the family's order, the categorical ones coded with ``categories`` (extended by what ``frame`` holds
        when ``learn``); returns the frame and the categories."""
        return code_frame(frame, self.for_columns(frame.shape[1]), categories, learn=learn, name=name)

    def _check_width(self, x: torch.Tensor, name: str) -> None:
        if x.dim() != 2 or x.shape[1] != len(self.families):
            raise InvalidDataError(
                f"{name} has {x.shape[-1]} columns, but the independent family names {len(self.families)} "
                f"({self.labels()})"
            )

    def _column_name(self, j: int, name: str) -> str:
        return f"column {self.labels()[j]!r} of {name}"

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        if self._spec[1] is None:
            return self.for_columns(x.shape[1]).check_data(x, name)
        self._check_width(x, name)
        for j, family in enumerate(self.families):
            family.check_data(x[:, j : j + 1], self._column_name(j, name))

    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """Each column family's data scale of its column (its rows counted ``weight`` times where given), under the
        names ``"<j>.<name>"`` (each value with two leading dimensions of one: not mistaken for a scale per
        feature), and the number of columns ``n_columns``."""
        family = self.for_columns(x.shape[1])
        family._check_width(x, name)
        scales = (
            measure_data_scale(f, x[:, j : j + 1], family._column_name(j, name), weight)
            for j, f in enumerate(family.families)
        )
        return family._joined_scales(x, scales)

    @staticmethod
    def _joined_scales(x: torch.Tensor, scales: Any) -> DataScale:
        joined = {_key(j, name): value[None, None] for j, scale in enumerate(scales) for name, value in scale.items()}
        joined["n_columns"] = torch.full((1, 1), float(x.shape[1]), dtype=x.dtype, device=x.device)
        return joined

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> ColumnData:
        """Each column as its family prepares it (for the fitted components' column, when given)."""
        families = self.for_columns(x.shape[1]).families
        parts = tuple(
            family.prepare(x[:, j : j + 1], None if components is None else components.parts[j])  # type: ignore[attr-defined]
            for j, family in enumerate(families)
        )
        return ColumnData(x, parts)

    # ----------------------------------------------------------- the components
    def _split_site(self, site: str) -> tuple[int, str]:
        column, _, name = site.partition(".")
        return int(column), name

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        """Each column family's sites over one column, named ``"<j>.<site>"`` (over ``d`` columns for one family of
        every column whose number of columns is not known yet)."""
        families = self.for_columns(d).families
        return {
            _key(j, site): dataclasses.replace(
                spec,
                conjugate=spec.conjugate and has_conjugate_prior(family),
                start=None if spec.start is None else functools.partial(_column_start, spec.start, j),
            )
            for j, family in enumerate(families)
            for site, spec in family.sites(k, 1).items()
        }

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> IndependentComponents:
        parts = []
        for j, family in enumerate(self.families):
            own = {site: values[_key(j, site)] for site in family.sites(1, 1)}
            parts.append(family.components(own, _column_scale(scale, j)))
        return IndependentComponents.of_parts(parts)

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        parts = components.parts  # type: ignore[attr-defined]
        return {
            _key(j, site): value
            for j, (family, part) in enumerate(zip(self.families, parts, strict=True))
            for site, value in family.site_values(part).items()
        }

    # ------------------------------------------------------------------- priors
    def priors(self) -> "IndependentPriors":
        return IndependentPriors(self)

    def _families_known(self) -> tuple[DensityFamily, ...]:
        """The column families, or the one family of every column."""
        return (self._every,) if self._spec[1] is None else self.families


class IndependentPriors(FamilyPriors):
    """The priors of :class:`Independent` (its :meth:`~Independent.priors`)."""

    family: Independent

    #: MAP-EM's update takes per-feature statistics (those of rows with missing entries too): each column's own
    takes_feature_statistics = True

    def keys(self) -> dict[str, PriorKey]:
        """Each column family's ``priors=`` keys, as ``"<column>.<key>"`` (``"visits.rate_rate"``); for one family of
        every column, that family's keys (set for every column)."""
        if self.family._every is not None:
            return self.family._every.priors().keys()
        return {
            f"{label}.{key}": PriorKey(f"column {label!r}: {prior_key.doc}", prior_key.domain)
            for label, family in zip(self.family.labels(), self.family.families, strict=True)
            for key, prior_key in family.priors().keys().items()
        }

    def _column_family(self, j: int) -> DensityFamily:
        """Column ``j``'s family with the hyperparameters of ``priors=`` that are its own."""
        family = self.family._every if self.family._spec[1] is None else self.family.families[j]
        if self.family._every is not None:  # one family of every column: its keys are every column's
            return with_priors(family, self.family._prior_settings)
        prefix = f"{self.family.labels()[j]}."
        own = {
            key[len(prefix) :]: value for key, value in self.family._prior_settings.items() if key.startswith(prefix)
        }
        return with_priors(family, own)

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        """Column ``j``'s family's prior of its site (``site`` is ``"<j>.<its site>"``)."""
        j, own = self.family._split_site(site)
        return self._column_family(j).priors().prior(own, k, 1, _column_scale(scale, j), opts)

    def map_update(self, components: ComponentFamily, stats: FeatureStatistics, scale: DataScale) -> None:
        """Each column family's MAP-EM update of its column, from its statistics (exact with missing entries too);
        a ``ValueError`` naming a column whose family has none."""
        without = [
            label for label, family in zip(self.family.labels(), self.family.families) if not has_map_update(family)
        ]
        if without:
            raise ValueError(
                f"engine='em' with priors is MAP-EM, which has no M-step for the column(s) {without} of the "
                "independent family: use priors=None (maximum likelihood) or engine='mcmc'"
            )
        parts = components.parts  # type: ignore[attr-defined]
        for j, (part, column_stats) in enumerate(zip(parts, stats.features, strict=True)):
            self._column_family(j).priors().map_update(part, column_stats, _column_scale(scale, j))

    def map_log_prior(self, components: ComponentFamily, d: int, scale: DataScale) -> torch.Tensor:
        """The sum of the column families' log prior densities of their columns (MAP-EM's objective)."""
        parts = components.parts  # type: ignore[attr-defined]
        return sum(
            self._column_family(j).priors().map_log_prior(part, 1, _column_scale(scale, j))
            for j, part in enumerate(parts)
        )

    def conjugate_posterior(
        self, site: str, stats: FeatureStatistics, values: dict[str, torch.Tensor], scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """Column ``j``'s family's conditional posterior of its site given its column's statistics."""
        j, own = self.family._split_site(site)
        prefix = _key(j, "")
        own_values = {name[len(prefix) :]: value for name, value in values.items() if name.startswith(prefix)}
        return (
            self._column_family(j)
            .priors()
            .conjugate_posterior(own, stats.features[j], own_values, _column_scale(scale, j), opts)
        )
