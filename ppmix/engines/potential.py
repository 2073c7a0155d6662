"""NUTS's potential energy from a model's own batched log-likelihood, not from a trace of its Pyro program.

Pyro's NUTS on a program traces it at every leapfrog step (a Gaussian HMM of 100 steps: 100 ``pyro.markov``
steps in Python, each enumerated). A model with EM already computes ``log p(x | theta)`` in one batched pass with
its discrete latents summed out (one ``logsumexp`` over the components for a mixture, the forward algorithm for an
HMM: :meth:`~ppmix.models.base.MixtureModel._pointwise_log_likelihood`). :class:`LikelihoodPotential` adds the
priors of the program's global sites and the log-Jacobians of the maps from the unconstrained space::

    U(u) = -( log p(x | theta) + sum_s log p_s(theta_s) + sum_s log |d theta_s / d u_s| ),  theta_s = T_s(u_s)

with ``T_s = biject_to(support of site s)``, the transform Pyro's NUTS uses for a traced program, so the two
potentials are the same function of the same unconstrained coordinates (tested equal to ``1e-8``:
``tests/inference/test_potential.py``). The program stays the definition: the sites, their priors and supports are
read from one trace of it under :meth:`~ppmix.models.base.MixtureModel.bayesian`.

:func:`likelihood_potential` builds it for the models whose likelihood hooks describe their program: ppmix's own
structures with EM (:class:`~ppmix.models.mixture.Mixture`, :class:`~ppmix.models.gmm.GMM`,
:class:`~ppmix.models.hmm.HMM`, every family and covariance type), without latents known for some points. It
returns None for a subclass that writes its own ``model()`` (its program is no longer the one the hooks compute),
a model without EM, a program with a discrete global site (the pf models' relevance indicators) or whose global
priors depend on other global sites: NUTS then runs on the traced program as before.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

import pyro
import torch
from pyro import poutine
from pyro.distributions import Distribution
from pyro.distributions.transforms import StickBreakingTransform, Transform, biject_to
from pyro.poutine.subsample_messenger import _Subsample

from ppmix.engines.enumeration import is_enumerated
from ppmix.engines.hmm_chains import packed_chains_log_likelihood
from ppmix.engines.nuts_priors import closed_form
from ppmix.engines.potential_grads import (
    component_log_prob,
    fused_hmm_log_likelihood,
    fused_mixture_log_likelihood,
    hmm_fusable,
    mixture_log_likelihood,
)
from ppmix.engines.site_gradients import site_gradient

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["FlatPotential", "LikelihoodPotential", "likelihood_potential"]

logger = logging.getLogger(__name__)

#: the hooks a potential computes the program's likelihood with: they must come from the class that wrote ``model``
#: or one of its subclasses (a user subclass replacing ``model()`` keeps the hooks of a program it replaced)
_HOOKS = ("_pointwise_log_likelihood", "_set_globals", "_get_globals")


@dataclass(frozen=True)
class GlobalSite:
    """One global sample site of the program: its prior (with the batch shape of its plates) and the map
    ``T = biject_to(prior.support)`` from the unconstrained space onto its support."""

    prior: Distribution
    transform: Transform

    def unconstrained_full(self, value: float, opts: dict[str, Any]) -> torch.Tensor:
        """A point of the unconstrained space with every coordinate ``value`` (``opts``: dtype and device)."""
        return torch.full(self.transform.inverse_shape(self.prior.shape()), value, **opts)

    def log_density(self, unconstrained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The constrained value ``T(u)`` and ``log p(T(u)) + log |dT/du|`` summed over the site."""
        value, log_density = self.chains_log_density(unconstrained[None])
        return value[0], log_density[0]

    def chains_log_density(self, unconstrained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`log_density` of every chain at once: ``u`` ``(C, *shape)`` gives ``T(u)`` and ``(C,)`` densities
        (the prior and the transform broadcast over the leading chain dimension)."""
        value = self.transform(unconstrained)
        log_jacobian = self.transform.log_abs_det_jacobian(unconstrained, value)
        chains = unconstrained.shape[0]
        log_prior = self.log_prior(value)
        return value, log_prior.reshape(chains, -1).sum(-1) + log_jacobian.reshape(chains, -1).sum(-1)

    @cached_property
    def log_prior(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The prior's log-density in closed form (:func:`~ppmix.engines.nuts_priors.closed_form`: its constant
        computed once), or its ``log_prob`` for a family without one."""
        return closed_form(self.prior) or self.prior.log_prob


class LikelihoodPotential:
    """``U(u) = -log p(x, theta(u)) - log |J|``, discrete latents summed out by the model's own likelihood.

    Parameters
    ----------
    model : MixtureModel
        A model whose :meth:`_set_globals` and :meth:`_pointwise_log_likelihood` describe its program (see
        :func:`likelihood_potential`, which checks it); calling the potential sets the model's globals.
    data : object
        The prepared data, as the program takes it.
    sites : dict of str to GlobalSite
        The program's global sites.

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> x = torch.cat([torch.randn(20, 1) - 3, torch.randn(20, 1) + 3]).double()
    >>> gmm = GMM(2, seed=0, progress=False).fit(x)
    >>> data = gmm.prepare_data(x)
    >>> with gmm.bayesian():
    ...     potential = likelihood_potential(gmm, data)
    >>> u = potential.unconstrained(gmm._get_globals())
    >>> sorted(u), potential(u).shape
    (['locs', 'scales', 'weights'], torch.Size([]))
    """

    def __init__(self, model: "MixtureModel", data: Any, sites: dict[str, GlobalSite]) -> None:
        self.model, self.data, self.sites = model, data, sites
        opts = {"dtype": model.dtype, "device": model._device}
        #: each site's density and its gradient without autograd, where it has one (:mod:`.site_gradients`)
        self.site_gradients = {name: site_gradient(site.prior, site.transform, opts) for name, site in sites.items()}

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        log_joint = torch.zeros((), dtype=self.model.dtype, device=self.model._device)
        values = {}
        for name, site in self.sites.items():
            values[name], log_density = site.log_density(params[name])
            log_joint = log_joint + log_density
        # the setter autograd sees through: a model whose ``_set_globals`` detaches (a MixtureOfExperts) has one
        getattr(self.model, "_assign_globals", self.model._set_globals)(values)
        return -(log_joint + self._log_likelihood())

    def chains(self, params: dict[str, torch.Tensor], gradients: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The potential of every chain, ``(C,)``, at unconstrained coordinates ``{site: (C, *shape)}``: the priors
        and log-Jacobians of all chains in one broadcast pass per site, the likelihood chain by chain (an HMM's
        forward algorithm over every chain's sequences at once: :func:`_hmm_chains_log_likelihood`).

        With a dict ``gradients``, the sites with a closed-form gradient (:attr:`site_gradients`) add their prior
        and log-Jacobian as constants, outside the autograd graph, and put the gradient of that term with respect to
        their coordinates in ``gradients``: the caller adds it (with the potential's sign) to autograd's."""
        chains = next(iter(params.values())).shape[0]
        log_joint = torch.zeros(chains, dtype=self.model.dtype, device=self.model._device)
        values = {}
        for name, site in self.sites.items():
            closed = None if gradients is None else self.site_gradients[name]
            if closed is None:
                values[name], log_density = site.chains_log_density(params[name])
            else:
                values[name] = site.transform(params[name])
                log_density, gradients[name], _, _ = closed(params[name].detach())
            log_joint = log_joint + log_density
        values = _with_frozen(self.model, values, chains)
        if _is_hmm(self.model):
            return -(log_joint + _hmm_chains_log_likelihood(self.model, self.data, values))
        if _stacks_components(self.model, values):
            return -(log_joint + _mixture_chains_log_likelihood(self.model, self.data, values))
        per_chain = []
        assign = getattr(self.model, "_assign_globals", self.model._set_globals)  # as in :meth:`__call__`
        for c in range(chains):
            assign({name: value[c] for name, value in values.items()})
            per_chain.append(self._log_likelihood())
        return -(log_joint + torch.stack(per_chain))

    def _log_likelihood(self) -> torch.Tensor:
        """``log p(x | theta)`` at the model's globals: its ``_summed_log_likelihood`` hook where it has one (an HMM:
        the forward-backward's gradients, no graph through the steps), else its pointwise log-likelihoods summed."""
        summed = getattr(self.model, "_summed_log_likelihood", None)
        return summed(self.data) if summed is not None else self.model._pointwise_log_likelihood(self.data).sum()

    def unconstrained(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The unconstrained coordinates ``T^{-1}(theta)`` of constrained site values (any leading batch)."""
        return {name: site.transform.inv(values[name].to(self.model.dtype)) for name, site in self.sites.items()}

    def constrained(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The site values ``T(u)`` of unconstrained coordinates (any leading batch)."""
        return {name: site.transform(params[name]) for name, site in self.sites.items()}

    @property
    def to_unconstrained(self) -> dict[str, Transform]:
        """``T^{-1}`` by site: what Pyro's ``MCMC(transforms=...)`` maps the draws back with."""
        return {name: site.transform.inv for name, site in self.sites.items()}


class FlatPotential:
    """A :class:`LikelihoodPotential` on flat ``(C, P)`` coordinates, every chain in one call, with its gradient:
    what :func:`ppmix.engines.nuts.sample_nuts` takes.

    Parameters
    ----------
    potential : LikelihoodPotential
        The potential by site.

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> x = torch.cat([torch.randn(20, 1) - 3, torch.randn(20, 1) + 3]).double()
    >>> gmm = GMM(2, seed=0, progress=False).fit(x)
    >>> with gmm.bayesian():
    ...     flat = FlatPotential(likelihood_potential(gmm, gmm.prepare_data(x)))
    >>> z = flat.pack({k: torch.stack([v, v]) for k, v in flat.potential.unconstrained(gmm._get_globals()).items()})
    >>> u, grad = flat(z)
    >>> tuple(z.shape), tuple(u.shape), tuple(grad.shape)  # 2 chains; weights 1, locs 2, scales 2 coordinates
    ((2, 5), (2,), (2, 5))
    """

    def __init__(self, potential: LikelihoodPotential) -> None:
        self.potential = potential
        opts = {"dtype": potential.model.dtype, "device": potential.model._device}
        self.shapes = {name: site.unconstrained_full(0.0, opts).shape for name, site in potential.sites.items()}
        self.sizes = [int(torch.Size(shape).numel()) for shape in self.shapes.values()]
        #: the site whose values each of the components' parameters is, found at :meth:`_direct`'s first call
        self._parameter_sites: dict[str, str] = {}

    @cached_property
    def _is_hmm(self) -> bool:
        return _is_hmm(self.potential.model)

    @cached_property
    def _layout(self) -> tuple[Any, dict[str, Any]]:
        """The model's component family and its sites (:func:`_stacked_components`), looked up once."""
        model = self.potential.model
        family = model._component_family()
        return family, family.sites(int(model.n_components), int(model.n_features_in_))

    @cached_property
    def _direct_possible(self) -> bool:
        """Whether :meth:`_direct` may apply: nothing frozen, every site with a closed-form gradient, and the potential
        a stacked mixture's (:func:`_stacks_components`) with its weights under the stick-breaking map, or an HMM's
        (:func:`_is_hmm`, its own ``_set_globals``) whose emission sites each have a state axis and whose initial
        distribution and transitions are under the stick-breaking map."""
        potential = self.potential
        model, sites = potential.model, potential.sites
        if model._fixed is not None or any(gradient is None for gradient in potential.site_gradients.values()):
            return False
        if _is_hmm(model):
            specs = model._component_family().sites(int(model.n_components), int(model.n_features_in_))
            return (
                _is_own(model, "_set_globals")
                and not any(spec.shared for spec in specs.values())
                and set(sites) == {"initial", "transition", *specs}
                and all(isinstance(sites[s].transform, StickBreakingTransform) for s in ("initial", "transition"))
            )
        return _stacks_components(model, sites) and isinstance(sites["weights"].transform, StickBreakingTransform)

    def _direct(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The potential and its gradient with no autograd graph: each site's prior, log-Jacobian, value and
        derivative in closed form (:mod:`~ppmix.engines.site_gradients`), the likelihood's value and gradients with
        respect to the components' parameters and the log weights (a mixture:
        :func:`~ppmix.engines.potential_grads.fused_mixture_log_likelihood`) or the log initial distribution and log
        transitions (an HMM: :func:`~ppmix.engines.potential_grads.fused_hmm_log_likelihood`) from a compiled kernel,
        chained to the coordinates: an element-wise site's by its map's derivative, a simplex's through the
        stick-breaking map (:func:`_stick_breaking_gradient`). None where the components' parameters are not the site
        values themselves or the family has no kernel here; an HMM whose kernel's rescaling fails at ``z`` (a nearly
        impossible step) gets the autograd path's answer."""
        chains = z.shape[0]
        params = self.unpack(z)
        log_joint = z.new_zeros(chains)
        values, grads, derivatives = {}, {}, {}
        for name, gradient in self.potential.site_gradients.items():
            h, grads[name], values[name], derivatives[name] = gradient(params[name])
            log_joint = log_joint + h
        model = self.potential.model
        if self._is_hmm:
            likelihood = self._hmm_likelihood(values)
            if likelihood is None:
                return None
            if likelihood is _TRANSIENT:
                return self._by_autograd(z)
            value, likelihood_grads, components, stacked = likelihood
            allowed = model._transition_mask.to(z.device)
            simplexes = {"initial": ("log_init", None), "transition": ("log_trans", allowed)}
        else:
            components, log_weights, stacked = _stacked_components(model, values, self._layout)
            fused = fused_mixture_log_likelihood(components, self.potential.data, log_weights)
            if fused is None:
                return None
            value, likelihood_grads = fused
            simplexes = {"weights": ("log_weights", None)}
        simplex_keys = {key for key, _ in simplexes.values()}
        for parameter, g in likelihood_grads.items():
            if parameter in simplex_keys:
                continue
            site = self._parameter_sites.get(parameter)
            if site is None:
                site = next((s for s, v in stacked.items() if getattr(components, parameter) is v), None)
                if site is None:
                    return None
                self._parameter_sites[parameter] = site
            grads[site] = grads[site] + g.reshape(values[site].shape) * derivatives[site]
        for site, (key, allowed) in simplexes.items():
            g = likelihood_grads[key]
            grads[site] = grads[site] + _stick_breaking_gradient(g, params[site], values[site], allowed)
        grad = torch.cat([grads[name].reshape(chains, -1) for name in self.shapes], dim=-1)
        return -(log_joint + value), -grad

    def _hmm_likelihood(self, values: dict[str, torch.Tensor]) -> Any:
        """An HMM's likelihood for :meth:`_direct`: its value, gradients, emission components and the stacked
        emission site values they were built from; None where the family has no kernel here or the rows are not
        all observed; :data:`_TRANSIENT` where the kernel's rescaling fails at these values."""
        model, data = self.potential.model, self.potential.data
        batch = _prediction_batch(model, data)
        chains, k = values["initial"].shape
        family = model._component_family()
        specs = family.sites(k, int(model.n_features_in_))
        stacked = {site: values[site].reshape(chains * k, *values[site].shape[2:]) for site in specs}
        components = family.components(stacked, model._scale)
        if batch.observed is not None or not hmm_fusable(components):
            return None
        log_init, log_trans = _hmm_chains_chain(model, values)
        fused = fused_hmm_log_likelihood(components, batch.rows, log_init, log_trans, data.lengths)
        if fused is None:
            return _TRANSIENT
        return (*fused, components, stacked)

    def _by_autograd(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The potential and its gradient: the sites without a closed-form gradient and the likelihood by autograd."""
        closed: dict[str, torch.Tensor] = {}
        with torch.enable_grad():
            z = z.detach().requires_grad_()
            potential = self.potential.chains(self.unpack(z), closed)
            # a likelihood computed outside the graph (the sites' closed-form terms being outside it too) adds nothing
            connected = potential.requires_grad
            (grad,) = torch.autograd.grad(potential.sum(), z) if connected else (torch.zeros_like(z),)
        if closed:  # the closed-form sites' priors and log-Jacobians: d(-h)/du
            chains = z.shape[0]
            parts = [
                closed[name].reshape(chains, -1) if name in closed else z.new_zeros(chains, size)
                for name, size in zip(self.shapes, self.sizes)
            ]
            grad = grad - torch.cat(parts, dim=-1)
        return potential.detach(), grad

    def pack(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """``{site: (C, *shape)}`` to ``(C, P)``."""
        return torch.cat([params[name].reshape(params[name].shape[0], -1) for name in self.shapes], dim=-1)

    def unpack(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(C, P)`` to ``{site: (C, *shape)}``."""
        parts = torch.split(z, self.sizes, dim=-1)
        return {name: part.reshape(z.shape[0], *shape) for (name, shape), part in zip(self.shapes.items(), parts)}

    def __call__(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The potential ``(C,)`` of every row of ``z`` and its gradient ``(C, P)``: without autograd where
        :meth:`_direct` can, else the sites without a closed-form gradient and the likelihood by autograd."""
        if self._direct_possible:
            direct = self._direct(z.detach())
            if direct is not None:
                return direct
            self._direct_possible = False
        return self._by_autograd(z)


#: :meth:`FlatPotential._hmm_likelihood`'s answer where the kernel's rescaling fails at the given values only
_TRANSIENT = object()


def _stick_breaking_gradient(
    g: torch.Tensor, u: torch.Tensor, y: torch.Tensor, allowed: torch.Tensor | None
) -> torch.Tensor:
    """The gradient with respect to the unconstrained ``u`` (``(..., K - 1)``) of ``sum_i g_i log p_i``, ``p`` the
    simplex ``y = SB(u)`` (torch's stick-breaking map) masked by ``allowed`` and normalised (as the models normalise
    it; None: nothing masked, and ``y`` sums to one, so ``p = y``). With ``G = sum_i g_i`` and ``S = sum_i a_i y_i``,
    ``d / d log y_i = g_i - a_i y_i G / S`` (``g_i = 0`` where ``a_i`` is not), and ``log y_i = log z_i + sum_{j<i}
    log(1 - z_j)`` (``z_m = sigmoid(u_m - log(K - 1 - m))``) gives ``d / du_m = g_m (1 - z_m) - z_m sum_{i>m} g_i``."""
    if allowed is not None and not bool(allowed.all()):
        masked = y * allowed
        g = g - masked / masked.sum(-1, keepdim=True) * g.sum(-1, keepdim=True)
    k = g.shape[-1]
    offset = torch.arange(k - 1, 0, -1, dtype=u.dtype, device=u.device).log()
    fraction = torch.sigmoid(u - offset)  # z_m
    later = g.flip(-1).cumsum(-1).flip(-1)[..., 1:]  # sum_{i>m} g_i
    return g[..., :-1] * (1 - fraction) - fraction * later


def _is_hmm(model: "MixtureModel") -> bool:
    """Whether the model's likelihood is ppmix's HMM's forward algorithm on its chain and emissions hooks (its
    ``_summed_log_likelihood`` not replaced by a subclass)."""
    owner = _owner(type(model), "_summed_log_likelihood") if hasattr(model, "_summed_log_likelihood") else None
    return owner is not None and (owner.__module__, owner.__name__) == ("ppmix.models.hmm", "HMM")


def _with_frozen(model: Any, values: dict[str, torch.Tensor], chains: int) -> dict[str, torch.Tensor]:
    """Every chain's values of the globals ``{site: (C, ...)}`` with the frozen ones (``fit(..., fixed=...)``, which
    have no coordinates) repeated over the ``chains``."""
    if model._fixed is None:
        return values
    return {**{name: v.expand(chains, *v.shape) for name, v in model._fixed.values.items()}, **values}


def _stacks_components(model: Any, sites: dict[str, Any]) -> bool:
    """Whether a mixture's likelihood is ppmix's ``Mixture``'s ``logsumexp`` over its family's components, whose
    sites each have a component axis (no tied covariance), so that every chain's components stack into one set."""
    hooks = ("_pointwise_log_likelihood", "_log_joint")
    if not all(hasattr(model, hook) for hook in hooks) or getattr(model, "_accepts_missing", True):
        return False
    owners = {(_owner(type(model), hook).__module__, _owner(type(model), hook).__name__) for hook in hooks}
    if owners != {("ppmix.models.mixture", "Mixture")}:
        return False
    specs = model._component_family().sites(int(model.n_components), int(model.n_features_in_))
    return not any(spec.shared for spec in specs.values()) and set(sites) == {"weights", *specs}


def _stacked_components(
    model: Any, values: dict[str, torch.Tensor], layout: tuple[Any, dict[str, Any]] | None = None
) -> tuple[Any, torch.Tensor, dict[str, torch.Tensor]]:
    """Every chain's components as one set of ``C K`` (chain ``c``'s component ``k`` at ``c K + k``), the log weights
    ``(C, K)`` normalised as :meth:`Mixture._set_globals` normalises them, and the stacked site values the components
    were built from ``{site: (C K, ...)}`` (``layout``: the model's component family and its sites, if looked up
    already)."""
    k = int(model.n_components)
    family, specs = layout or (model._component_family(), model._component_family().sites(k, int(model.n_features_in_)))
    chains = values["weights"].shape[0]
    stacked = {site: values[site].reshape(chains * k, *values[site].shape[2:]) for site in specs}
    weights = values["weights"]
    log_weights = (weights / weights.sum(-1, keepdim=True)).log()
    return family.components(stacked, model._scale), log_weights, stacked


def _mixture_chains_log_likelihood(model: Any, data: torch.Tensor, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """``sum_n log sum_k w_k p_k(x_n)`` of a mixture at every chain's globals ``{site: (C, ...)}``, ``(C,)``: the
    components of all chains as one set of ``C K`` (:func:`_stacked_components`), scored by one ``log_prob``; the
    gradient in closed form where the family has one (:func:`~ppmix.engines.potential_grads.mixture_log_likelihood`),
    else by autograd."""
    chains, k = values["weights"].shape
    components, log_weights, _ = _stacked_components(model, values)
    closed_form = mixture_log_likelihood(components, data, log_weights)
    if closed_form is not None:
        return closed_form
    joint = components.log_prob(data).reshape(-1, chains, k) + log_weights
    top = joint.detach().amax(-1, keepdim=True)  # a constant shift (its gradient would cancel): faster than logsumexp
    return (top[..., 0] + (joint - top).exp().sum(-1).log()).sum(0)


def _hmm_chains_log_likelihood(model: Any, data: Any, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """``sum_b log p(x_b)`` of an HMM at every chain's globals ``{site: (C, ...)}``, ``(C,)``: each chain's
    initial distribution and transitions as :meth:`HMM._summed_log_likelihood` computes them
    (:func:`_hmm_chains_chain`), the emission log-densities of every chain's valid steps at once
    (:func:`_hmm_chains_emissions`), then one forward algorithm over every chain's sequences
    (:func:`~ppmix.engines.hmm_chains.packed_chains_log_likelihood`: compiled loops on the CPU, its gradient from the
    backward recursion)."""
    log_init, log_trans = _hmm_chains_chain(model, values)
    frames = _hmm_chains_emissions(model, data, values)
    return packed_chains_log_likelihood(log_init, log_trans, frames, data.lengths)


def _hmm_chains_chain(model: Any, values: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The log initial distributions ``(C, K)`` and log transitions ``(C, K, K)`` of every chain (``-inf`` at the
    transitions ``transition_pattern`` forbids, with a zero gradient): normalised and masked as
    :meth:`HMM._set_globals` does, all chains at once; chain by chain through a subclass's own ``_set_globals``."""
    allowed = model._transition_mask.to(model._device)
    if _is_own(model, "_set_globals"):
        opts = {"dtype": model.dtype, "device": model._device}
        initial, transition = values["initial"].to(**opts), values["transition"].to(**opts)
        initial = initial / initial.sum(-1, keepdim=True)
        transition = transition * allowed
        transition = transition / transition.sum(-1, keepdim=True)
    else:
        chains = next(iter(values.values())).shape[0]
        initial_c, transition_c = [], []
        for c in range(chains):
            model._set_globals({name: value[c] for name, value in values.items()})
            initial_c.append(model.initial_)
            transition_c.append(model.transition_)
        initial, transition = torch.stack(initial_c), torch.stack(transition_c)
    safe = torch.where(allowed, transition, torch.ones_like(transition))
    return initial.log(), safe.log().masked_fill(~allowed, float("-inf"))


def _is_own(model: Any, hook: str) -> bool:
    """Whether ``model``'s ``hook`` is :class:`~ppmix.models.hmm.HMM`'s own (no subclass replaced it)."""
    owner = _owner(type(model), hook)
    return (owner.__module__, owner.__name__) == ("ppmix.models.hmm", "HMM")


def _hmm_chains_emissions(model: Any, data: Any, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """The emission log-densities ``(N, C, K)`` of every chain at the ``N`` valid steps (in the order of the batch's
    mask), as :meth:`HMM._log_emissions` scores them: the components of all chains as one set of ``C K`` scored by
    one ``log_prob`` (its gradient in closed form: :func:`~ppmix.engines.potential_grads.component_log_prob`), whose
    ``(N, C K)`` result is the answer viewed, where every emission site has a component axis and every frame is
    observed; else chain by chain."""
    chains, k = next(iter(values.values())).shape[0], int(model.n_components)
    batch = _prediction_batch(model, data)
    family = model._component_family()
    specs = family.sites(k, int(model.n_features_in_))
    if batch.observed is not None or any(spec.shared for spec in specs.values()) or not set(specs) <= set(values):
        per_chain = []
        for c in range(chains):
            model._set_globals({name: value[c] for name, value in values.items()})
            per_chain.append(model._log_emissions(batch)[batch.sequences.mask])
        return torch.stack(per_chain, 1)
    stacked = {site: values[site].reshape(chains * k, *values[site].shape[2:]) for site in specs}
    scored = component_log_prob(family.components(stacked, model._scale), batch.rows)  # (N, C K)
    return scored.reshape(-1, chains, k)


#: the last :func:`_prediction_batch`: weak references to its model, data and the model's components, and the batch
#: (forgotten with the model)
_last_prediction: list[tuple[Any, Any, Any, Any]] = []


def _prediction_batch(model: Any, data: Any) -> Any:
    """``model._prediction_data(data)`` (the frames gathered from the padded batch and prepared for the components),
    remembered for the next call on the same model, data and components (every leapfrog step of a NUTS run: the
    chains' parameters do not enter it); one batch at a time, kept no longer than its model."""
    key = (model, data, model.components_)
    if _last_prediction:
        *refs, batch = _last_prediction[0]
        if all(ref() is obj for ref, obj in zip(refs, key)):
            return batch
    batch = model._prediction_data(data)
    refs = (weakref.ref(model, lambda _: _last_prediction.clear()), weakref.ref(data), weakref.ref(model.components_))
    _last_prediction[:] = [(*refs, batch)]
    return batch


def _owner(cls: type, attribute: str) -> type:
    """The class of ``cls``'s MRO that defines ``attribute``."""
    return next(klass for klass in cls.__mro__ if attribute in vars(klass))


def describes_program(model: "MixtureModel") -> bool:
    """Whether ``model``'s likelihood hooks describe its program: a ppmix structure with EM whose ``model()`` is
    written by a class that the hooks' classes derive from (so no subclass replaced the program, keeping them), and
    no latents known for some points (whose clamped likelihood the hooks do not compute).

    Examples
    --------
    >>> from ppmix import GMM, MixtureModel
    >>> describes_program(GMM(2))
    True
    >>> class Custom(GMM):
    ...     def model(self, x):
    ...         super().model(x)
    >>> describes_program(Custom(2))
    False
    """
    cls = type(model)
    program = _owner(cls, "model")
    if not model.supports_em or not program.__module__.startswith("ppmix.") or program.__name__ == "MixtureModel":
        return False
    if getattr(model, "_known_latents", None) is not None:
        return False
    return all(issubclass(_owner(cls, hook), program) for hook in _HOOKS)


def program_sites(model: "MixtureModel", data: Any) -> dict[str, GlobalSite] | None:
    """The global sample sites of one run of the program (its current mode: call under ``bayesian()``), in order;
    None if one of them is discrete (e.g. a pf model's relevance indicators: NUTS samples continuous sites only).

    Examples
    --------
    >>> import torch
    >>> from ppmix import Mixture
    >>> mix = Mixture(2, family="poisson", seed=0, progress=False).fit(torch.tensor([[1.0], [2.0], [9.0]]))
    >>> with mix.bayesian():
    ...     sites = program_sites(mix, mix.prepare_data(torch.tensor([[1.0]])))
    >>> {name: tuple(site.prior.shape()) for name, site in sites.items()}  # rate: (components, features)
    {'weights': (2,), 'rate': (2, 1)}
    """
    # the priors built without argument validation: the potential is evaluated at every leapfrog step, always on
    # the supports (the transforms map onto them)
    with torch.no_grad(), poutine.block(), pyro.validation_enabled(False):
        trace = poutine.trace(model.model).get_trace(data)
    priors = {
        name: site["fn"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not is_enumerated(site)
        and not isinstance(site["fn"], _Subsample)
    }
    if any(prior.support.is_discrete for prior in priors.values()):
        return None
    return {name: GlobalSite(prior, biject_to(prior.support)) for name, prior in priors.items()}


def _priors_fixed(model: "MixtureModel", data: Any, sites: dict[str, GlobalSite]) -> bool:
    """Whether the priors read from one trace hold at other values of the globals: the program traced again with
    the globals moved (to ``T(0.5)`` in every unconstrained coordinate) gives every site the same log prior density."""
    opts = {"dtype": model.dtype, "device": model._device}
    with torch.no_grad(), poutine.block():
        moved = {name: site.transform(site.unconstrained_full(0.5, opts)) for name, site in sites.items()}
        trace = poutine.trace(poutine.condition(model.model, data=moved)).get_trace(data)
        for name, site in sites.items():
            again = trace.nodes[name]["fn"].log_prob(moved[name]).sum()
            if not torch.allclose(again, site.prior.log_prob(moved[name]).sum(), rtol=1e-12, atol=1e-12):
                return False
    return True


def _free_globals(model: "MixtureModel") -> set[str]:
    """The names of the model's globals that are not frozen (``fit(..., fixed=...)`` conditions the program on the
    frozen ones, and setting the globals keeps them: :mod:`ppmix.models.frozen`)."""
    frozen = set() if model._fixed is None else set(model._fixed.values)
    return set(model._get_globals()) - frozen


def likelihood_potential(model: "MixtureModel", data: Any) -> LikelihoodPotential | None:
    """The potential of ``model``'s posterior on ``data`` from its own likelihood, or None where the model's hooks do
    not describe its program (:func:`describes_program`) or the priors of its globals depend on other globals.

    Call it under :meth:`~ppmix.models.base.MixtureModel.bayesian` (the priors are the program's in its current
    mode). See :class:`LikelihoodPotential` for an example.
    """
    if not describes_program(model):
        return None
    sites = program_sites(model, data)
    if sites is None or set(sites) != _free_globals(model) or not _priors_fixed(model, data, sites):
        logger.info(
            "%s: NUTS runs on the traced program (its global sites are not the hooks' globals)", type(model).__name__
        )
        return None
    return LikelihoodPotential(model, data, sites)
