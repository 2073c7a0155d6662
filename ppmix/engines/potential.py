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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyro
import torch
from pyro import poutine
from pyro.distributions import Distribution
from pyro.distributions.transforms import Transform, biject_to
from pyro.poutine.subsample_messenger import _Subsample

from ppmix.engines.enumeration import is_enumerated

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["LikelihoodPotential", "likelihood_potential"]

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
        value = self.transform(unconstrained)
        log_jacobian = self.transform.log_abs_det_jacobian(unconstrained, value)
        return value, self.prior.log_prob(value).sum() + log_jacobian.sum()


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

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        log_joint = torch.zeros((), dtype=self.model.dtype, device=self.model._device)
        values = {}
        for name, site in self.sites.items():
            values[name], log_density = site.log_density(params[name])
            log_joint = log_joint + log_density
        self.model._set_globals(values)
        return -(log_joint + self._log_likelihood())

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


def likelihood_potential(model: "MixtureModel", data: Any) -> LikelihoodPotential | None:
    """The potential of ``model``'s posterior on ``data`` from its own likelihood, or None where the model's hooks do
    not describe its program (:func:`describes_program`) or the priors of its globals depend on other globals.

    Call it under :meth:`~ppmix.models.base.MixtureModel.bayesian` (the priors are the program's in its current
    mode). See :class:`LikelihoodPotential` for an example.
    """
    if not describes_program(model):
        return None
    sites = program_sites(model, data)
    if sites is None or set(sites) != set(model._get_globals()) or not _priors_fixed(model, data, sites):
        logger.info(
            "%s: NUTS runs on the traced program (its global sites are not the hooks' globals)", type(model).__name__
        )
        return None
    return LikelihoodPotential(model, data, sites)
