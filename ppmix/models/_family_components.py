""":class:`FamilyModel`: the base class of the structures whose components come from a
:class:`~ppmix.components.family.DensityFamily` (mixture, HMM, pf model), written once against that protocol.

It turns the family's declared sites into Pyro sample statements (flat priors for
maximum likelihood, the family's weak priors under MCMC, with the hyperparameters a structure's
``priors=`` sets), checks ``priors`` and runs MAP-EM's component updates, maps the model's globals to
the fitted components and back, records the family's data scale on the training data, and starts
EM from k-means (or its seeding, or random) responsibilities. Nothing here knows which family
it serves.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.algorithms.kmeans import kmeans_plusplus, kmeans_start, nearest_centre
from ppmix.components.base import ComponentFamily
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    PriorKey,
    check_priors,
    with_priors,
)
from ppmix.components.family_tools import (
    data_rows,
    has_map_update,
    loaded,
    measure_data_scale,
    n_parameters,
    placeholder,
    rescaled,
    site_dims,
    start_points,
)
from ppmix.components.independent import FeatureStatistics
from ppmix.components.registry import family_option_hint
from ppmix.models._flat import flat_prior
from ppmix.models._missing import fill_missing
from ppmix.models.base import MixtureModel

__all__ = ["INIT_METHODS", "FamilyModel", "drop_leading_ones"]

INIT_METHODS = ("kmeans", "k-means++", "random")


def drop_leading_ones(value: torch.Tensor, dim: int) -> torch.Tensor:
    """``value`` without leading singleton dimensions beyond its ``dim`` own ones.

    A site's value replayed or conditioned from outside (e.g. Pyro's ``Predictive`` pads
    global samples with singleton dimensions up to ``max_plate_nesting``) may carry them; the
    component families want their parameters as ``(K, ...)``.

    Examples
    --------
    >>> drop_leading_ones(torch.zeros(1, 1, 2, 3), 2).shape
    torch.Size([2, 3])
    """
    while value.dim() > dim and value.shape[0] == 1:
        value = value[0]
    return value


def refuse_unknown_keywords(cls: type, kwargs: dict[str, Any]) -> None:
    """A ``TypeError`` for the first keyword of ``kwargs`` that ``cls``'s constructor does not take, saying where it
    belongs if it is a family's option (:func:`~ppmix.components.registry.family_option_hint`); nothing for a
    constructor that takes any keyword.

    Examples
    --------
    >>> from ppmix import HMM
    >>> refuse_unknown_keywords(HMM, {"emission": "gmm", "n_mix": 3})
    Traceback (most recent call last):
    ...
    TypeError: HMM() got an unexpected keyword argument 'n_mix'; 'n_mix' is an option of the 'gmm' family: pass \
emission={'name': 'gmm', 'n_mix': 3}
    """
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    for keyword, value in kwargs.items():
        if keyword in parameters:
            continue
        argument = next((name for name in ("family", "emission") if name in parameters), None)
        hint = (
            ""
            if argument is None
            else family_option_hint(argument, kwargs.get(argument, parameters[argument].default), keyword, value)
        )
        raise TypeError(
            f"{cls.__name__}() got an unexpected keyword argument {keyword!r}" + (f"; {hint}" if hint else "")
        )


class FamilyModel(MixtureModel):
    """A :class:`~ppmix.models.base.MixtureModel` whose components are those of one
    :class:`~ppmix.components.family.DensityFamily`: their Pyro sites, priors, MAP-EM updates, data scale, k-means
    starts and saved state.

    A subclass (the structure: :class:`~ppmix.models.mixture.Mixture`, :class:`~ppmix.models.hmm.HMM`) defines
    :meth:`_component_family` (the family its arguments ask for), stores ``init_params`` and sets
    ``components_`` during fitting; ``_data_scale`` is what the family
    measured on the training data (e.g. the Gaussian variance floor).
    """

    init_params: str
    components_: ComponentFamily
    _data_scale: DataScale
    #: the starts ``init_params`` may name (a structure with more of its own extends them)
    init_methods: tuple[str, ...] = INIT_METHODS
    #: the hyperparameters set by a structure's ``priors=`` (None: the defaults, and EM is maximum likelihood)
    priors: Mapping[str, Any] | None = None
    #: the class of components whose parameters a loaded save's tensors are (recorded by saves since issue 49)
    _saved_components: str | None = None
    #: the categories of the DataFrame columns the family coded in fit (column name -> categories, a code's
    #: position; None: none coded), which code every later frame the same way
    categories_: dict[str, list[Any]] | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Refuse a keyword the constructor does not take before Python does, pointing a family's option at the
        family's dict form (``HMM(3, emission="gmm", n_mix=3)``: pass ``emission={"name": "gmm", "n_mix": 3}``)."""
        refuse_unknown_keywords(cls, kwargs)
        return super().__new__(cls)

    def _component_family(self) -> DensityFamily:
        """The family of this model's components (built from its constructor arguments)."""
        raise NotImplementedError(f"{type(self).__name__} must define component_family()")

    def _validate_family_params(self) -> None:
        self._component_family()  # a family checks its settings in its constructor
        self._validate_em_settings(self.init_methods)
        self._validate_priors()

    # ---------------------------------------------------------------- priors
    def _structure_prior_keys(self) -> dict[str, PriorKey]:
        """The structure's own hyperparameters that ``priors=`` may set (e.g. the weights' concentration)."""
        return {}

    def prior_keys(self) -> dict[str, PriorKey]:
        """Every hyperparameter ``priors=`` may set: the structure's, then its family's, each with its default.

        Examples
        --------
        >>> from ppmix import Mixture
        >>> keys = Mixture(2, family="poisson").prior_keys()
        >>> sorted(keys)
        ['rate_concentration', 'rate_rate', 'weights']
        >>> keys["rate_rate"].doc
        "the Gamma rate of the rates (default 1 / the data's mean count)"
        """
        return {**self._structure_prior_keys(), **self._component_family().priors().keys()}

    def _validate_priors(self, *, map_em: bool = False) -> None:
        """``priors`` None or a mapping of :meth:`prior_keys` to values in their domains (with ``map_em``, as MAP-EM
        needs them); else a ``ValueError`` naming ``priors`` and the key."""
        owner = f"{type(self).__name__} with the {self._component_family().name!r} family"
        check_priors(self.priors, self.prior_keys(), owner, map_em=map_em)

    def _prior_family(self) -> DensityFamily:
        """The component family with the hyperparameters of ``priors`` (what MCMC, Gibbs and MAP-EM use)."""
        return with_priors(self._component_family(), self.priors)

    def _concentration(self, key: str, shape: tuple[int, ...], default: Any = 1.0) -> torch.Tensor:
        """The Dirichlet concentration ``priors[key]`` (or ``default``) as a tensor of ``shape``."""
        value = (self.priors or {}).get(key)
        opts = {"dtype": self.dtype, "device": self._device}
        tensor = torch.as_tensor(default if value is None else value, **opts)
        try:
            return tensor.expand(shape)
        except RuntimeError:
            raise ValueError(
                f"priors[{key!r}] must be a number or broadcast to shape {shape}; got shape {tuple(tensor.shape)}"
            ) from None

    def _init_values(self, data: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The start of SVI, MCMC and Gibbs: EM's start of maximum likelihood whatever ``priors`` (which the
        samplers sample under; a family without a MAP-EM update starts too)."""
        with self._overriding("priors", None):
            return super()._init_values(data, generator)

    def _map_update_components(self, stats: Any) -> None:
        """MAP-EM's M-step of the components (``priors`` set): the family's priors' ``map_update``."""
        self._validate_priors(map_em=True)
        family = self._prior_family()
        if not has_map_update(family):
            covariance_type = getattr(family, "covariance_type", None)
            settings = "" if covariance_type is None else f" with covariance_type={covariance_type!r}"
            what, instead = f"the {family.name!r} family{settings}", "engine='mcmc'"
        elif isinstance(stats, FeatureStatistics) and not getattr(family.priors(), "takes_feature_statistics", False):
            what, instead = "rows with missing entries of independent features", "impute or drop those entries"
        else:
            what = ""
        if what:
            raise ValueError(
                f"engine='em' with priors is MAP-EM, which has no M-step for {what}: use priors=None "
                f"(maximum likelihood) or {instead}"
            )
        family.priors().map_update(self.components_, stats, self._scale)

    def _map_log_prior_components(self) -> torch.Tensor:
        """The components' log prior density in MAP-EM's objective."""
        return self._prior_family().priors().map_log_prior(self.components_, int(self.n_features_in_), self._scale)

    def _saved_params(self) -> dict[str, Any]:
        """The constructor arguments, ``priors``' arrays as nested lists (JSON)."""
        params = super()._saved_params()
        if params.get("priors") is not None:
            params["priors"] = {
                k: v if v is None else torch.as_tensor(v, dtype=torch.float64).tolist()
                for k, v in params["priors"].items()
            }
        return params

    @property
    def _scale(self) -> DataScale:
        return getattr(self, "_data_scale", {})

    def _record_data_scale(self, x: torch.Tensor, name: str = "X") -> None:
        """Check that the family can model the training data ``x`` and record its scale (floors, priors);
        fitted components (a warm start) take the new scale. The family measures the data as its constructor
        arguments ask, not as an earlier fit measured it."""

        def measure(family: DensityFamily) -> DataScale:
            family.check_data(x, name)
            return family.data_scale(x, name)

        self._take_data_scale(measure)

    def _record_weighted_data_scale(self, frames: torch.Tensor, weight: torch.Tensor) -> None:
        """Replace the data scale just recorded (:meth:`_record_data_scale`) by that of the training rows (frames)
        ``(N, D)`` counted ``weight`` ``(N,)`` times each (``sample_weight``), as the family weighs it
        (:func:`~ppmix.components.family_tools.measure_data_scale`): for integer weights, the scale of the rows
        repeated. Missing entries (NaN) are filled with their columns' weighted means, as the rows repeated would be
        (:func:`fill_missing`)."""

        def measure(family: DensityFamily) -> DataScale:
            filled = fill_missing(frames, family, weight) if bool(torch.isnan(frames).any()) else frames
            return measure_data_scale(family, filled, weight=weight)

        self._take_data_scale(measure)

    def _take_data_scale(self, measure: Callable[[DensityFamily], DataScale]) -> None:
        """Record the scale ``measure`` takes with the family of the constructor's arguments (not measured by an
        earlier fit); fitted components (a warm start) take it."""
        self._data_scale = {}
        family = self._component_family()
        self._data_scale = measure(family)
        if getattr(self, "components_", None) is not None:  # the family measured on it (e.g. its number of columns)
            self.components_ = rescaled(self._component_family(), self.components_, self._data_scale)

    def _frame_coder(self, *, learn: bool) -> Callable[[Any, str], Any] | None:
        """The family's coding of a DataFrame's columns (``code_frame``, e.g. the independent family's categories),
        which records the categories in ``categories_`` when ``learn`` (fit) and codes with them otherwise; None for
        a family that codes nothing."""
        code = getattr(self._component_family(), "code_frame", None)
        if code is None:
            return None
        if learn:
            self.categories_ = None

        def coder(frame: Any, name: str) -> Any:
            coded, categories = code(frame, self.categories_, learn=learn, name=name)
            if learn:
                self.categories_ = categories
            return coded

        return coder

    def _extra_state(self) -> dict[str, Any]:
        """The data scale recorded by the fit (saved: MCMC's priors and the measured settings of a family, e.g. the
        categorical family's number of levels, read it)."""
        scale = {name: v.tolist() for name, v in self._scale.items()}
        coded = {} if self.categories_ is None else {"categories": self.categories_}
        if getattr(self, "engine_", None) == "vb":  # the factors of a variational-Bayes fit
            coded["variational_posterior"] = {k: v.tolist() for k, v in self.variational_posterior_.items()}
        if self.fixed_:  # the sites the fit held fixed (fit(..., fixed=...): ppmix.models.frozen)
            coded["fixed"] = list(self.fixed_)
        return {**super()._extra_state(), "data_scale": scale, "components": self._components_name(), **coded}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        self._saved_components = state.get("components")  # what the tensors are (saves since issue 49)
        self.categories_ = state.get("categories")
        self.fixed_ = tuple(state.get("fixed", ()))
        opts = {"dtype": self.dtype, "device": self._device}
        if "variational_posterior" in state:
            self.variational_posterior_ = {
                k: torch.tensor(v, **opts) for k, v in state["variational_posterior"].items()
            }
        self._data_scale = {name: torch.tensor(v, **opts) for name, v in state.get("data_scale", {}).items()}

    def _components_name(self) -> str:
        """The name of the class of this model's fitted components, as saved (what its state tensors mean)."""
        return self._component_family().components_class.__qualname__

    @property
    def _component_parameters(self) -> int:
        """Free parameters of the components."""
        return n_parameters(self._component_family(), int(self.n_components), self.n_features_in_)

    @property
    def means_(self) -> torch.Tensor:
        """Component means ``(K, D)``."""
        self._check_fitted()
        return self.components_.moments().mean

    @property
    def covariances_(self) -> torch.Tensor:
        """Component covariances: ``(K, D)`` for families with independent features (the diagonal Gaussian's
        variances), ``(K, D, D)`` matrices for the full Gaussian."""
        self._check_fitted()
        covariance = self.components_.moments().covariance
        if covariance is None:
            raise TypeError(f"the {self._component_family().name!r} family does not define its components' covariances")
        return covariance

    # ------------------------------------------------------------- Pyro sites
    def _simplex_prior(
        self, site: str, batch: tuple[int, ...], k: int, opts: dict, concentration: Any = 1.0
    ) -> dist.Distribution:
        """Flat on the simplex for maximum likelihood, ``Dirichlet(priors[site])`` (default ``concentration``)
        under MCMC.

        The flat prior's sampler is a point mass at the current value of ``site`` (see
        :func:`~ppmix.models._flat.flat_prior`).
        """
        if not self.is_bayesian:
            return flat_prior(self, site, constraints.simplex, batch, (k,), opts)
        return dist.Dirichlet(self._concentration(site, (*batch, k), concentration).to(**opts))

    def _component_prior(self, site: str, k: int, d: int, opts: dict) -> dist.Distribution:
        """The prior of one of the family's sites: flat for maximum likelihood, the family's own (with ``priors``)
        under MCMC."""
        if not self.is_bayesian:
            spec = self._component_family().sites(k, d)[site]
            return flat_prior(self, site, spec.support, () if spec.shared else (k,), spec.event_shape, opts)
        return self._prior_family().priors().prior(site, k, d, self._scale, opts)

    def _sample_components(self, k: int, d: int, opts: dict, plate: pyro.plate | None = None) -> ComponentFamily:
        """Sample the family's shared sites, then its other sites in the ``components`` plate (``plate`` when the
        model already opened it), and return the components."""
        family = self._component_family()
        sites = family.sites(k, d)
        values = {}
        for site, spec in sites.items():
            if spec.shared:
                value = pyro.sample(site, self._component_prior(site, k, d, opts))
                values[site] = drop_leading_ones(value, len(spec.event_shape))
        with plate if plate is not None else pyro.plate("components", k):
            for site, spec in sites.items():
                if not spec.shared:
                    value = pyro.sample(site, self._component_prior(site, k, d, opts))
                    values[site] = drop_leading_ones(value, 1 + len(spec.event_shape))
        return family.components(values, self._scale)

    # ---------------------------------------------------- sites <-> the family
    def _component_globals(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self._component_family().site_values(self.components_).items()}

    def _set_component_globals(self, values: dict[str, Any]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        family = self._component_family()
        sites = family.sites(self.n_components, 1)
        missing = sorted(set(sites) - set(values))
        if missing:
            raise ValueError(
                f"{type(self).__name__}'s {family.name} components need the sites {sorted(sites)}; the values given "
                f"lack {missing} (a subclass whose program samples other sites must write its own _set_globals, or "
                "use a structure that takes the family, e.g. HMM(emission=...))"
            )
        self.components_ = family.components({s: torch.as_tensor(values[s]).to(**opts) for s in sites}, self._scale)

    def _load_component_state(self, tensors: dict[str, torch.Tensor]) -> None:
        saved = self._saved_components
        if saved is not None and saved != self._components_name():
            params = self.get_params()
            field = next((f"field {name!r}" for name in ("emission", "family") if name in params), "the settings")
            raise ValueError(
                f"the tensors are the parameters of {saved}, but {field} of config.json names the family "
                f"{self._component_family().name!r}, whose components are {self._components_name()}"
            )
        opts = {"dtype": self.dtype, "device": self._device}
        family = self._component_family()
        state = {name: tensors[name].to(**opts) for name in family.components_class.param_names}
        self.components_ = loaded(family, state, self.n_components, self.n_features_in_, self._scale, opts)

    def _component_state_shapes(self, *, sites: bool = False) -> dict[str, tuple[int, ...]]:
        """The shapes of the components' state for these settings (``n_components``, ``n_features_in_``, the
        family): of ``components_.state_dict()``, or with ``sites`` of the Pyro site values."""
        family, k, d = self._component_family(), self.n_components, self.n_features_in_
        if sites:
            return {name: spec.value_shape(k) for name, spec in family.sites(k, d).items()}
        start = placeholder(family, k, d, self._scale, {"dtype": self.dtype, "device": torch.device("cpu")})
        return {name: tuple(value.shape) for name, value in start.state_dict().items()}

    def _component_dims(self) -> dict[str, list[str]]:
        return site_dims(self._component_family())

    # ----------------------------------------------------------- EM helpers
    def _initial_responsibilities(
        self, data: Any, generator: torch.Generator, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hard k-means (or k-means++ seeding) assignments, or random soft ones, ``(N, K)``.

        ``"kmeans"`` is :func:`~ppmix.algorithms.kmeans.kmeans_start`: the best of several k-means runs on a
        random subsample of the rows, then every row assigned to its nearest centre. With row ``weight``
        (``sample_weight``) k-means runs on the weighted rows (a weighted resample, a weighted seeding).
        """
        k = self.n_components
        x = data_rows(data)
        if self.init_params == "random":
            resp = torch.rand(x.shape[0], k, generator=generator, dtype=x.dtype).to(x.device)
            return resp / resp.sum(1, keepdim=True)
        points = start_points(data)
        if self.init_params == "kmeans":
            _, labels = kmeans_start(points, k, generator, weight=weight)
        else:
            labels = nearest_centre(points, kmeans_plusplus(points, k, generator, weight=weight))
        return torch.nn.functional.one_hot(labels, k).to(x.dtype)

    def _new_components(self, x: torch.Tensor) -> ComponentFamily:
        """Components of the right shape (parameters are set by the first M-step), with the data scale of
        the training data ``x`` (recorded by ``prepare_data(..., fitting=True)``, which every fit runs first;
        measured here if it was not)."""
        family = self._component_family()
        if not self._scale or any(v.dim() == 1 and v.shape[0] != x.shape[1] for v in self._scale.values()):
            self._data_scale = family.data_scale(x)
        return placeholder(family, self.n_components, x.shape[1], self._scale, {"dtype": x.dtype, "device": x.device})
