"""The one place where a family's name leads to its class: ``Mixture(3, family="poisson")``,
``HMM(3, emission="poisson")`` and saved models look families up here.

Each built-in entry is ``name: "module:Class"``, imported on first use, so ``import ppmix`` loads none of
them. A user's family joins them without editing this module: :func:`register_family` (one call), or, for an
installed package, an entry point in the group ``ppmix.families`` (``name = "module:Class"``), read on the first
look-up of a name that is not registered.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import threading
from typing import Any

from ppmix.components.expert_family import ExpertFamily
from ppmix.components.family import DensityFamily
from ppmix.components.family_tools import family_settings

__all__ = [
    "EXPERT_FAMILIES",
    "FAMILIES",
    "INPUT_FAMILIES",
    "expert_family_from",
    "family_class",
    "family_config",
    "family_from",
    "family_option_hint",
    "family_options",
    "register_family",
]

#: the entry-point group of installed packages' density families: ``name = "module:Class"``
ENTRY_POINT_GROUP = "ppmix.families"

#: registered density families: name -> "module:Class" (built in, or an entry point) or the class (registered)
FAMILIES: dict[str, str | type] = {
    "gaussian": "ppmix.components.gaussian_family:GaussianFamily",
    "poisson": "ppmix.components.poisson:PoissonFamily",
    "bernoulli": "ppmix.components.bernoulli:BernoulliFamily",
    "exponential": "ppmix.components.exponential:ExponentialFamily",
    "gmm": "ppmix.components.gaussian_mixture:GaussianMixtureFamily",
    "student_t": "ppmix.components.student_t:StudentTFamily",
    "multinomial": "ppmix.components.multinomial:MultinomialFamily",
    "categorical": "ppmix.components.categorical:CategoricalFamily",
    "gamma": "ppmix.components.gamma:GammaFamily",
    "lognormal": "ppmix.components.lognormal:LogNormalFamily",
    "autoregressive": "ppmix.components.autoregressive:AutoRegressiveFamily",
    "independent": "ppmix.components.columns:Independent",
}

#: density families that read each step's inputs, an HMM's emissions ``x_t | z_t, u_t`` fitted with ``fit(X,
#: inputs=...)``: looked up by name as those of :data:`FAMILIES`, kept apart from them because every use of them
#: takes ``inputs=`` (the regression emissions: one family of any expert, and its three named experts)
INPUT_FAMILIES: dict[str, str] = {
    "regression": "ppmix.components.regression_emission:RegressionFamily",
    "linear_regression": "ppmix.components.regression_emission:LinearRegressionFamily",
    "logistic_regression": "ppmix.components.regression_emission:LogisticRegressionFamily",
    "poisson_regression": "ppmix.components.regression_emission:PoissonRegressionFamily",
}

#: registered expert (conditional) families of MixtureOfExperts: name -> "module:Class"
EXPERT_FAMILIES: dict[str, str] = {
    "gaussian": "ppmix.components.gaussian_expert:GaussianExpertFamily",
    "logistic": "ppmix.components.logistic_expert:LogisticExpertFamily",
    "softmax": "ppmix.components.softmax_expert:SoftmaxExpertFamily",
    "poisson": "ppmix.components.poisson_expert:PoissonExpertFamily",
}


_entry_points_read = False
_entry_points_lock = threading.Lock()


def _read_entry_points() -> None:
    """Add the families of installed packages (entry points of :data:`ENTRY_POINT_GROUP`) to :data:`FAMILIES`, once;
    a registered or built-in name keeps its family. Threads wait for the one that reads them (none sees the flag
    set before the families are in)."""
    global _entry_points_read
    if _entry_points_read:
        return
    with _entry_points_lock:
        if _entry_points_read:
            return
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            FAMILIES.setdefault(entry.name, entry.value)
        _entry_points_read = True


def register_family(name: str, cls: type) -> None:
    """Register the density family ``cls`` under ``name``: structures take it by name (``Mixture(3,
    family=name)``) and saved models that use it load back (:func:`family_from` reads their config).

    ``name`` must be ``cls.name`` (what a saved model records); registering the same class again does nothing, and
    a name registered to another class is an error. Check the family first with :func:`ppmix.testing.check_family`.
    An installed package can register its families without a call, by entry points in the group
    ``ppmix.families`` (``laplace = "my_package.laplace:LaplaceFamily"``).

    Parameters
    ----------
    name : str
        The family's name; must equal ``cls.name``.
    cls : type
        A subclass of :class:`~ppmix.components.DensityFamily`.

    Raises
    ------
    TypeError
        ``cls`` is not a concrete subclass of :class:`~ppmix.components.DensityFamily`.
    ValueError
        ``name`` is not ``cls.name``, or is registered to another class.

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> class CountFamily(PoissonFamily):
    ...     name = "counts_example"
    >>> register_family("counts_example", CountFamily)
    >>> type(family_from("counts_example")).__name__
    'CountFamily'
    >>> del FAMILIES["counts_example"]
    """
    if not (isinstance(cls, type) and issubclass(cls, DensityFamily)):
        raise TypeError(f"cls must be a subclass of DensityFamily; got {cls!r}")
    if inspect.isabstract(cls):
        raise TypeError(f"cls {cls.__name__} is abstract: it must write {sorted(cls.__abstractmethods__)}")
    if getattr(cls, "name", None) != name:
        raise ValueError(
            f"name must be the family's own name, {cls.__name__}.name = {getattr(cls, 'name', None)!r} (what saved "
            f"models record); got {name!r}"
        )
    _read_entry_points()
    if name in FAMILIES and family_class(name) is not cls:
        raise ValueError(f"the name {name!r} is registered to another family, {family_class(name).__name__}")
    FAMILIES[name] = cls


def family_class(name: str, registry: dict[str, Any] | None = None) -> type:
    """The class registered under ``name`` (in :data:`FAMILIES`, with the entry points of installed packages, or
    the ``registry`` given).

    Examples
    --------
    >>> family_class("gaussian").__name__, family_class("gaussian", EXPERT_FAMILIES).__name__
    ('GaussianFamily', 'GaussianExpertFamily')
    """
    registry = FAMILIES if registry is None else registry
    if name not in registry and registry is FAMILIES:
        _read_entry_points()
        registry = INPUT_FAMILIES if name in INPUT_FAMILIES else registry
    if name not in registry:
        kind = "component" if registry is FAMILIES else "expert"
        given_inputs = f" (and, given inputs=, {sorted(INPUT_FAMILIES)})" if registry is FAMILIES else ""
        raise ValueError(f"unknown {kind} family {name!r}; registered: {sorted(registry)}{given_inputs}")
    entry = registry[name]
    if isinstance(entry, type):
        return entry
    module, _, cls = entry.partition(":")
    return getattr(importlib.import_module(module), cls)


def family_options(name: str, registry: dict[str, Any] | None = None) -> list[str] | None:
    """The settings (constructor keywords) of the family registered as ``name``; None for one that takes any.

    Examples
    --------
    >>> family_options("exponential"), family_options("gmm")
    ([], ['n_mix', 'covariance_type', 'reg_covar'])
    """
    init = family_class(name, registry).__init__
    if init is object.__init__ or init.__module__ == "typing":  # no constructor of its own (a Protocol's stand-in)
        return []
    parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _checked_settings(name: str, settings: dict[str, Any], registry: dict[str, Any] | None = None) -> dict[str, Any]:
    """``settings`` of the dict form ``{"name": name, **settings}``, or a ``TypeError`` naming an unknown one and what
    the family accepts."""
    accepted = family_options(name, registry)
    unknown = [] if accepted is None else [key for key in settings if key not in accepted]
    if unknown:
        takes = f"accepted: {', '.join(accepted)}" if accepted else "it takes no options"
        raise TypeError(f"unknown option {unknown[0]!r} for family {name!r}; {takes}")
    return settings


def family_option_hint(argument: str, family: Any, keyword: str, value: Any) -> str:
    """Where a keyword given to a structure (``HMM(3, emission="gmm", n_mix=3)``) belongs if it is a registered
    family's option: the dict form of ``argument``; ``""`` if no family takes it.

    Examples
    --------
    >>> family_option_hint("emission", "gmm", "n_mix", 3)
    "'n_mix' is an option of the 'gmm' family: pass emission={'name': 'gmm', 'n_mix': 3}"
    >>> family_option_hint("family", "poisson", "n_mix", 3)
    "'n_mix' is an option of the family 'gmm', not of 'poisson': pass it as family={'name': 'gmm', 'n_mix': 3}"
    """
    takers = [name for name in FAMILIES if keyword in (family_options(name) or ())]
    if not takers:
        return ""
    if family in takers:
        return f"{keyword!r} is an option of the {family!r} family: pass {_dict_form(argument, family, keyword, value)}"
    named = "family " + repr(takers[0]) if len(takers) == 1 else "families " + ", ".join(map(repr, takers))
    given = f", not of {family!r}" if isinstance(family, str) else ""
    return (
        f"{keyword!r} is an option of the {named}{given}: pass it as {_dict_form(argument, takers[0], keyword, value)}"
    )


def _dict_form(argument: str, name: str, keyword: str, value: Any) -> str:
    return f"{argument}={{'name': {name!r}, {keyword!r}: {value!r}}}"


def expert_family_from(expert: Any, argument: str = "expert") -> ExpertFamily:
    """An :class:`~ppmix.components.expert_family.ExpertFamily` from what a user gave as ``argument``: a family
    object (returned as is), a registered name (:data:`EXPERT_FAMILIES`) or a saved config.

    Examples
    --------
    >>> expert_family_from("logistic").target_kind
    'binary'
    """
    if isinstance(expert, ExpertFamily):
        return expert
    if isinstance(expert, dict) and isinstance(expert.get("name"), str):
        settings = {k: v for k, v in expert.items() if k != "name"}
        return family_class(expert["name"], EXPERT_FAMILIES)(
            **_checked_settings(expert["name"], settings, EXPERT_FAMILIES)
        )
    if isinstance(expert, str):
        if expert not in EXPERT_FAMILIES:
            raise ValueError(f"{argument} must be one of {tuple(EXPERT_FAMILIES)} or an ExpertFamily; got {expert!r}")
        return family_class(expert, EXPERT_FAMILIES)()
    raise TypeError(
        f"{argument} must be a registered expert family name ({sorted(EXPERT_FAMILIES)}), an ExpertFamily object or "
        f"a saved family config; got {expert!r} ({type(expert).__name__})"
    )


@functools.lru_cache(maxsize=None)
def _constructor_parameters(cls: type) -> frozenset[str]:
    """The parameter names of ``cls``'s constructor, read once per class (:func:`family_from` runs at every
    evaluation of a model's likelihood, e.g. at each of NUTS's leapfrog steps, and ``inspect.signature`` costs more
    than a small likelihood)."""
    return frozenset(inspect.signature(cls).parameters)


def family_from(family: Any, argument: str = "family", **defaults: Any) -> DensityFamily:
    """A :class:`~ppmix.components.family.DensityFamily` from what a user gave as ``argument``: a family
    object (returned as is), a registered name, or a saved config ``{"name": ..., **settings}``.

    ``defaults`` are settings a structure offers for its default family (e.g. ``covariance_type`` for the
    Gaussian); those the family's constructor does not take are ignored.

    Examples
    --------
    >>> family_from("gaussian", covariance_type="full").covariance_type
    'full'
    >>> family_from({"name": "gaussian", "covariance_type": "diag", "reg_covar": 1e-3}).reg_covar
    0.001
    """
    if isinstance(family, DensityFamily):
        return family
    if isinstance(family, dict) and isinstance(family.get("name"), str):
        settings = {k: v for k, v in family.items() if k != "name"}
        return family_class(family["name"])(**_checked_settings(family["name"], settings))
    if isinstance(family, str):
        cls = family_class(family)
        accepted = _constructor_parameters(cls)
        return cls(**{k: v for k, v in defaults.items() if k in accepted})
    _read_entry_points()
    raise TypeError(
        f"{argument} must be a registered family name ({sorted(FAMILIES)}), a DensityFamily object or a saved "
        f"family config; got {family!r} ({type(family).__name__})"
    )


def family_config(family: Any) -> Any:
    """What a saved model records of a family argument: a name as is, a family object as
    ``{"name": ..., **settings}`` (which :func:`family_from` reads back).

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> family_config(GaussianFamily("full"))
    {'name': 'gaussian', 'covariance_type': 'full', 'reg_covar': 1e-06}
    """
    if isinstance(family, (DensityFamily, ExpertFamily)):
        density = isinstance(family, DensityFamily)
        registry = EXPERT_FAMILIES
        if density:
            _read_entry_points()
            registry = INPUT_FAMILIES if family.name in INPUT_FAMILIES else FAMILIES
        if family.name not in registry or family_class(family.name, registry) is not type(family):
            remedy = (
                f"register it: ppmix.components.register_family({family.name!r}, {type(family).__name__})"
                if density
                else "register it in ppmix.components.registry.EXPERT_FAMILIES"
            )
            raise ValueError(
                f"{type(family).__name__} is not the family registered as {family.name!r}: a saved model could not "
                f"load it back; {remedy}"
            )
        return {"name": family.name, **(family_settings(family) if density else family.config())}
    return family
