"""Frozen parameters: ``fit(X, fixed={"weights": w, "locs": mu, ...})`` keeps the named parameters exactly as given in
every engine, and fits the others given them.

**Names.** A key is a global site of the structure's Pyro program: the structure's own (``weights`` of
:class:`~ppmix.models.mixture.Mixture` and :class:`~ppmix.models.gmm.GMM`; ``initial`` and ``transition`` of
:class:`~ppmix.models.hmm.HMM`) or one of its family's (:meth:`~ppmix.components.family.DensityFamily.sites`: the
Gaussian's ``locs``, ``scales`` and, full or tied, ``corr_cholesky``; the Poisson's ``rate``; ...). The fitted
attributes users know are aliases (:data:`ALIASES`): ``weights_``; ``startprob_``/``initial_``/``start`` and
``transmat_``/``transition_``; ``means_`` (``locs``); and, for Gaussian components, ``covariances_`` (or
``covariances``) in the layout of the fitted attribute, which is turned into the sites ``scales`` (and
``corr_cholesky``: the rows of the covariance's Cholesky factor, normalised). A site's value is kept bit for bit; a
covariance given by alias is kept to rounding (its square roots and Cholesky factor).

**Checks.** An unknown key, a value of the wrong shape, not finite or off its site's support (weights and every
row of ``transition`` on the simplex, a transition ``transition_pattern`` forbids, a scale not positive, a
covariance not positive definite), or a structure or engine that takes no frozen parameters: a ``ValueError``
naming ``fixed`` and the key.

**The engines.** One object, :class:`Fixed`, serves every engine while the fit runs (``model._fixed``):

- **EM** (exact, so the objective never decreases): the M-step fits the free parameters given the frozen ones and
  puts the frozen ones back (:meth:`Fixed.given`, :meth:`Fixed.impose`): weights, an HMM's initial distribution and
  transitions are independent of the components' M-step; frozen Gaussian means make the covariances the weighted
  scatter around *them* (the statistics moved to the frozen means: ``S + n (m - mu)(m - mu)^T``, then the family's
  own floored M-step); frozen Gaussian covariances leave the means the weighted means. Other partly frozen
  families (e.g. a gamma's shape without its rate) have no closed-form M-step given the rest: EM refuses them
  (freeze every site of the family, or use SVI or MCMC). The start (k-means, every restart) starts from the frozen
  values: the rows go to their nearest frozen mean, or to their posterior under frozen components.
- **SVI and MCMC**: the program is conditioned on the frozen sites (``pyro.poutine.condition``), so the guide and
  NUTS see only the free ones (ppmix's NUTS potential drops their coordinates); the draws of a frozen site
  (``mcmc_samples_``) are its value repeated. MCMC's draws are not relabelled by default: frozen parameters name
  the components.
- **Gibbs**: the draws of the frozen sites are skipped (the others are drawn given them).
- ``engine="vb"`` takes none.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.distributions.transforms import biject_to

from ppmix.algorithms.kmeans import nearest_centre
from ppmix.components.family import SiteSpec
from ppmix.components.family_tools import data_rows
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_statistics import GaussianStatistics

__all__ = ["ALIASES", "FIXING_ENGINES", "Fixed", "fixing", "frozen_parameter_count", "resolve_fixed"]

#: the engines that keep frozen parameters
FIXING_ENGINES = ("em", "svi", "mcmc", "gibbs")

#: the fitted-attribute names accepted for a site (``covariances_`` is converted: :func:`_covariance_sites`)
ALIASES = {
    "weights_": "weights",
    "startprob_": "initial",
    "initial_": "initial",
    "start": "initial",
    "transmat_": "transition",
    "transition_": "transition",
    "means_": "locs",
    "means": "locs",
}

#: the aliases of a Gaussian family's covariance sites
COVARIANCE_KEYS = ("covariances_", "covariances")


@dataclass(frozen=True, eq=False)
class Fixed:
    """The frozen parameters of one fit, as the engines use them.

    Attributes
    ----------
    values : dict of str to Tensor
        The frozen value of every frozen site, in the model's dtype and on its device.
    attributes : dict of str to str
        The structure's frozen sites and the fitted attribute each is (``{"weights": "weights_"}``).
    component_sites : tuple of str
        Every site of the family (the frozen ones among them are in ``values``).

    Examples
    --------
    >>> fixed = Fixed({"weights": torch.tensor([0.5, 0.5])}, {"weights": "weights_"}, ("rate",))
    >>> sorted(fixed.complete({"rate": torch.ones(2, 1)}))
    ['rate', 'weights']
    >>> fixed.draws({"rate": torch.ones(3, 4, 2, 1)})["weights"].shape  # (chains, draws, K)
    torch.Size([3, 4, 2])
    """

    values: dict[str, torch.Tensor]
    attributes: dict[str, str]
    component_sites: tuple[str, ...]

    @property
    def frozen_components(self) -> tuple[str, ...]:
        """The frozen sites of the family."""
        return tuple(site for site in self.component_sites if site in self.values)

    @property
    def every_component(self) -> bool:
        """Whether every site of the family is frozen (the components are then fixed whole)."""
        return len(self.frozen_components) == len(self.component_sites)

    def complete(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``values`` of the global sites with the frozen sites at their frozen values (what SVI's guide and NUTS
        give, which hold only the free sites)."""
        return {**values, **self.values}

    def draws(self, samples: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Draws ``{site: (chains, draws, ...)}`` with every frozen site's value repeated in every draw."""
        chains, kept = next(iter(samples.values())).shape[:2]
        repeated = {name: value.expand(chains, kept, *value.shape).clone() for name, value in self.values.items()}
        return {**samples, **repeated}

    def chain_values(self, site: str, n_chains: int) -> torch.Tensor:
        """The frozen ``site`` for ``n_chains`` chains stacked as Gibbs stacks them: components ``(C K, ...)``
        (chain ``c``'s component ``k`` at ``c K + k``), the structure's sites ``(C, ...)``."""
        value = self.values[site]
        if site in self.component_sites:
            return value.repeat(n_chains, *[1] * (value.dim() - 1))
        return value.expand(n_chains, *value.shape).clone()

    # ------------------------------------------------------------------ EM
    def given(self, statistics: Any) -> Any:
        """The family's statistics as the M-step of the free sites given the frozen ones needs them: Gaussian
        statistics moved to the frozen means (the weighted scatter around them: ``S + n (m - mu)(m - mu)^T``), so
        that the family's own M-step sets the means to the frozen ones and the covariances (floored as ever) to that
        scatter; others as they are."""
        if "locs" not in self.values or self.every_component:
            return statistics
        if not isinstance(statistics, GaussianStatistics):
            raise ValueError(
                "fixed['locs'] with partly observed rows: engine='em' fits covariances around frozen means for "
                "complete rows only; impute the missing entries or use engine='svi' or 'mcmc'"
            )
        locs = self.values["locs"].to(statistics.mean)
        offset = statistics.mean - locs
        counts = statistics.counts.to(offset)
        if statistics.scatter.dim() == 2:
            between = counts[:, None] * offset.square()
        else:
            between = counts[:, None, None] * offset[:, :, None] * offset[:, None, :]
        return GaussianStatistics(statistics.counts, locs, statistics.scatter + between)

    def impose(self, model: Any) -> None:
        """Put the frozen values in the fitted state: the structure's attributes set to them, the components rebuilt
        from their sites with the frozen ones where a fitted value differs."""
        for site, attribute in self.attributes.items():
            setattr(model, attribute, self.values[site])
        frozen = self.frozen_components
        if not frozen or getattr(model, "components_", None) is None:
            return
        family = model._component_family()
        current = family.site_values(model.components_)
        if all(torch.equal(current[site], self.values[site]) for site in frozen):
            return
        model.components_ = family.components(self.complete(current), model._scale)
        model._invalidate_guide()

    def start(self, model: Any, rows: Any, resp: torch.Tensor) -> torch.Tensor:
        """EM's start responsibilities ``(n, K)`` from the frozen values: every row's posterior under frozen
        components (and the frozen weights, else uniform ones), or one-hot at its nearest frozen mean; ``resp`` (the
        default start's) where no component site is frozen."""
        if self.every_component:
            family = model._component_family()
            components = family.components(self.values, model._scale)
            weights = self.values.get("weights")
            log_weights = resp.new_zeros(resp.shape[1]) if weights is None else weights.to(resp).log()
            return torch.softmax(components.log_prob(rows) + log_weights, dim=1)
        if "locs" in self.values:
            labels = nearest_centre(data_rows(rows), self.values["locs"].to(resp))
            return torch.nn.functional.one_hot(labels, resp.shape[1]).to(resp)
        return resp


# ------------------------------------------------------------------- resolving the user's dict
def resolve_fixed(model: Any, fixed: Any, engine: str) -> Fixed | None:
    """The :class:`Fixed` of ``fit``'s ``fixed`` for ``model`` (prepared on its training data: ``n_features_in_``
    known) and ``engine``; None where ``fixed`` is None or empty.

    Raises
    ------
    ValueError
        ``fixed`` not a dict, an unknown key, a value of the wrong shape or off its support, a structure or engine
        that takes none, or a partly frozen family EM cannot fit given the rest.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> gmm = GMM(2)
    >>> _ = gmm.prepare_data(np.zeros((4, 1)), fitting=True)
    >>> sorted(resolve_fixed(gmm, {"weights_": [0.25, 0.75], "means_": [[0.0], [1.0]]}, "em").values)
    ['locs', 'weights']
    >>> resolve_fixed(gmm, {"weights": [0.5, 0.6]}, "em")
    Traceback (most recent call last):
    ...
    ValueError: fixed['weights'] must be on the simplex (non-negative, summing to 1); got tensor([0.5000, 0.6000], ...
    """
    if fixed is None:
        return None
    if not isinstance(fixed, Mapping):
        raise ValueError(f"fixed must be a dict of parameter names to values; got {type(fixed).__name__}")
    if not fixed:
        return None
    name = type(model).__name__
    structure = model._fixed_structure_sites()
    if structure is None:
        raise ValueError(f"{name} takes no fixed parameters (fixed= is for Mixture, GMM and HMM)")
    if engine not in FIXING_ENGINES:
        raise ValueError(f"fixed is taken by engine in {FIXING_ENGINES}; got engine={engine!r}")
    family = model._component_family()
    k, d = int(model.n_components), int(model.n_features_in_)
    component_specs = family.sites(k, d)
    specs = {site: spec for site, (_, spec) in structure.items()} | component_specs
    opts = {"dtype": model.dtype, "device": model._device}
    values: dict[str, torch.Tensor] = {}
    for key, value in fixed.items():
        for site, tensor in _site_values(key, value, family, specs, opts).items():
            if site in values:
                raise ValueError(f"fixed[{key!r}] names the site {site!r} a second time: give each parameter once")
            _check_value(key, site, tensor, specs[site], k)
            values[site] = tensor
    _check_transition_pattern(model, values)
    resolved = Fixed(values, {s: structure[s][0] for s in values if s in structure}, tuple(component_specs))
    if engine == "em":
        _check_em_can_fit(model, family, resolved)
    return resolved


def _site_values(key: Any, value: Any, family: Any, specs: dict[str, SiteSpec], opts: dict) -> dict[str, torch.Tensor]:
    """The site values ``key`` names: ``{site: value}`` for a site or its alias, the Gaussian covariance sites of
    ``covariances_``."""
    if not isinstance(key, str):
        raise ValueError(f"fixed's keys must be parameter names (str); got {key!r}")
    tensor = _as_tensor(key, value, opts)
    if key in COVARIANCE_KEYS and isinstance(family, GaussianFamily):
        return _covariance_sites(key, tensor, family.covariance_type)
    site = ALIASES.get(key, key)
    if site not in specs:
        accepted = sorted(specs) + sorted(a for a, s in ALIASES.items() if s in specs)
        if isinstance(family, GaussianFamily):
            accepted += list(COVARIANCE_KEYS)
        raise ValueError(f"fixed has an unknown key {key!r}: this model's parameters are {sorted(accepted)}")
    return {site: tensor}


def _as_tensor(key: str, value: Any, opts: dict) -> torch.Tensor:
    """``value`` as a tensor in the model's dtype and device; a ``ValueError`` naming ``fixed[key]`` for non-numbers
    or values that are not finite."""
    try:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to(**opts)
        else:
            tensor = torch.as_tensor(value, **opts)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"fixed[{key!r}] must be an array of numbers; got {value!r}") from None
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"fixed[{key!r}] holds NaN or inf")
    return tensor


def _covariance_sites(key: str, value: torch.Tensor, covariance_type: str) -> dict[str, torch.Tensor]:
    """The Gaussian sites of covariances given in the layout of ``covariances_``: diag ``(K, D)`` variances ->
    ``scales``; spherical ``(K,)`` or ``(K, D)`` (equal along each row) -> ``scales`` ``(K,)``; full ``(K, D, D)``
    and tied ``(D, D)`` (or ``(K, D, D)``, the same matrix K times) -> ``scales`` and ``corr_cholesky`` from the
    Cholesky factor (a ``ValueError`` where it is not positive definite)."""
    if covariance_type in ("diag", "spherical"):
        if covariance_type == "spherical" and value.dim() == 2:
            if not bool((value == value[:, :1]).all()):
                raise ValueError(f"fixed[{key!r}] of spherical components must be equal along each row")
            value = value[:, 0]
        if not bool((value > 0).all()):
            raise ValueError(f"fixed[{key!r}] must hold positive variances")
        return {"scales": value.sqrt()}
    if covariance_type == "tied" and value.dim() == 3:
        if not bool((value == value[:1]).all()):
            raise ValueError(f"fixed[{key!r}] of a tied covariance must be one (D, D) matrix (or the same K times)")
        value = value[0]
    if value.dim() < 2 or value.shape[-1] != value.shape[-2] or not torch.allclose(value, value.mT):
        raise ValueError(f"fixed[{key!r}] must hold symmetric (D, D) matrices; got shape {tuple(value.shape)}")
    factor, info = torch.linalg.cholesky_ex(value)
    if bool((info != 0).any()):
        raise ValueError(f"fixed[{key!r}] must hold positive-definite covariance matrices")
    scales = factor.square().sum(-1).sqrt()
    return {"scales": scales, "corr_cholesky": factor / scales[..., None]}


def _check_value(key: str, site: str, value: torch.Tensor, spec: SiteSpec, k: int) -> None:
    """``value`` of the site's shape and on its support; else a ``ValueError`` naming ``fixed[key]``."""
    name = f"fixed[{key!r}]" + ("" if key == site else f" (site {site!r})")
    shape = tuple(spec.value_shape(k))
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}; got {tuple(value.shape)}")
    support = spec.support
    if support is constraints.simplex:
        if bool((value < 0).any()) or not torch.allclose(value.sum(-1), torch.ones_like(value[..., 0]), atol=1e-8):
            raise ValueError(f"{name} must be on the simplex (non-negative, summing to 1); got {value!r}")
        return
    if not bool(support.check(value).all()):
        raise ValueError(f"{name} is outside the support of the site ({support}); got {value!r}")


def _check_transition_pattern(model: Any, values: dict[str, torch.Tensor]) -> None:
    """A frozen ``transition`` of an HMM: no probability on a move ``transition_pattern`` forbids, and not an
    input-driven chain (whose transitions are gates)."""
    if "transition" not in values:
        return
    if getattr(model, "_input_driven", False):
        raise ValueError("fixed['transition'] is not taken by an input-driven HMM (its transitions are gates)")
    allowed = model._transition_mask.to(values["transition"].device)
    forbidden = torch.nonzero((values["transition"] != 0) & ~allowed)
    if forbidden.numel():
        i, j = forbidden[0].tolist()
        raise ValueError(
            f"fixed['transition'] gives the move {i} -> {j} a positive probability, which "
            f"transition_pattern={model.transition_pattern!r} forbids"
        )


def _check_em_can_fit(model: Any, family: Any, fixed: Fixed) -> None:
    """Refuse, for EM, a partly frozen family whose M-step given the frozen sites has no closed form (other than
    Gaussian means, or Gaussian covariances, under maximum likelihood)."""
    frozen = fixed.frozen_components
    if not frozen or fixed.every_component:
        return
    covariance = {"scales", "corr_cholesky"} & set(fixed.component_sites)
    gaussian = isinstance(family, GaussianFamily) and set(frozen) in ({"locs"}, covariance)
    if gaussian and getattr(model, "priors", None) is None:
        return
    why = "with priors (MAP-EM), " if gaussian else ""
    raise ValueError(
        f"fixed[{frozen[0]!r}]: {why}engine='em' fits the other parameters of the {family.name!r} family given the "
        f"frozen ones in closed form only for Gaussian means, or Gaussian covariances, under maximum likelihood; "
        f"freeze all of {list(fixed.component_sites)} or none, or use engine='svi' or 'mcmc'"
    )


def frozen_parameter_count(model: Any) -> int:
    """The free parameters the last fit held fixed (``fixed_``), which the information criteria do not count: each
    frozen site's unconstrained size (a simplex of ``m`` entries counts ``m - 1``), an HMM's frozen ``transition``
    its allowed entries less one per row (as :attr:`~ppmix.models.hmm.HMM.n_parameters` counts them).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False).fit(np.arange(8.0)[:, None], fixed={"weights": [0.5, 0.5]})
    >>> frozen_parameter_count(gmm), gmm.n_parameters
    (1, 5)
    """
    if not model.fixed_:
        return 0
    specs = {site: spec for site, (_, spec) in (model._fixed_structure_sites() or {}).items()}
    specs |= model._component_family().sites(int(model.n_components), int(model.n_features_in_))
    count = 0
    for site in model.fixed_:
        if site == "transition":
            count += int(model._transition_mask.sum()) - int(model.n_components)
        else:
            shape = specs[site].value_shape(int(model.n_components))
            count += int(torch.Size(biject_to(specs[site].support).inv.forward_shape(shape)).numel())
    return count


# --------------------------------------------------------------------- the fit
@contextlib.contextmanager
def fixing(model: Any, fixed: Any, engine: str, options: dict[str, Any]) -> Iterator[None]:
    """Inside the context ``model._fixed`` is the :class:`Fixed` of ``fixed`` (None without), the model's program is
    conditioned on the frozen sites and setting its globals keeps them (:meth:`Fixed.complete`, :meth:`Fixed.impose`);
    a warm start starts at them; MCMC's and Gibbs' draws are not relabelled unless ``options`` ask for it.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> gmm = GMM(2)
    >>> _ = gmm.prepare_data(np.zeros((4, 1)), fitting=True)
    >>> with fixing(gmm, {"weights": [0.25, 0.75]}, "svi", {}):
    ...     sorted(gmm._fixed.values)
    ['weights']
    >>> gmm._fixed is None
    True
    """
    resolved = resolve_fixed(model, fixed, engine)
    model.fixed_ = () if resolved is None else tuple(resolved.values)
    if resolved is None:
        yield
        return
    if engine in ("mcmc", "gibbs"):
        options.setdefault("relabel", False)  # the frozen parameters name the components
    program, set_globals = model.model, model._set_globals

    def set_fixed_globals(values: dict[str, torch.Tensor]) -> None:
        set_globals(resolved.complete(values))
        resolved.impose(model)

    with model._overriding("_fixed", resolved):
        object.__setattr__(model, "model", poutine.condition(program, data=resolved.values))
        object.__setattr__(model, "_set_globals", set_fixed_globals)
        try:
            if getattr(model, "components_", None) is not None:  # a warm start starts at the frozen values
                resolved.impose(model)
            yield
        finally:
            model.__dict__.pop("model", None)
            model.__dict__.pop("_set_globals", None)
            model._invalidate_guide()
