"""Flat (improper) priors for maximum-likelihood fits of Pyro models.

A :class:`FlatPrior` has log-density zero everywhere, so with these priors and a point-mass
guide ``TraceEnum_ELBO`` is exactly the log-likelihood (SVI is maximum likelihood and matches
the EM objective). Unlike Pyro's ``ImproperUniform`` it can be *sampled*: ``sample()`` returns
the model's current value of the site (the fitted estimate, or the starting value during a
fit), i.e. the prior's sampler is a documented point mass at the point estimate. The model
programs can thus be traced, rendered, and used with ``Predictive``, ``infer_discrete`` and
autoguides outside of :meth:`~ppmix.models.base.MixtureModel.bayesian`, and they then run the
fitted model. Before a fit there is no value, and ``sample()`` raises :class:`FlatPriorError`
saying so (fit first, or use ``with model.bayesian():`` for proper priors).

Sampling never enters an objective: ELBOs, EM and MCMC use ``log_prob`` only (or proper priors).
"""

from __future__ import annotations

from typing import Any, Callable

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.util import broadcast_shape

from ppmix._validation import NotFittedError

__all__ = ["FlatPrior", "FlatPriorError", "flat_prior"]


class FlatPriorError(NotFittedError):
    """A flat prior was sampled but its model holds no value for the site (it is not fitted yet).

    Examples
    --------
    Running an unfitted model's Pyro program forward samples its flat priors, which hold no value yet:

    >>> import numpy as np, pyro, torch
    >>> from ppmix import GMM
    >>> X = torch.as_tensor(np.random.default_rng(0).normal(size=(60, 2)))
    >>> try:
    ...     pyro.poutine.trace(GMM(2, seed=0).model).get_trace(X)
    ... except FlatPriorError as error:
    ...     print(str(error)[:60])
    the flat (maximum-likelihood) prior of site 'weights' cannot
    """


class FlatPrior(dist.ImproperUniform):
    """Pyro's ``ImproperUniform`` with a zero log-density of the value's dtype and device, whose
    ``sample()`` returns a point estimate.

    Parameters
    ----------
    support : Constraint
    batch_shape, event_shape : tuple of int
    value : Tensor or callable returning Tensor or None, optional
        What ``sample()`` returns (broadcast to ``sample_shape + batch_shape + event_shape``):
        the model's current parameter value. A callable is asked at sampling time (so building
        the prior costs nothing); ``None`` makes ``sample()`` raise :class:`FlatPriorError`.
    site : str, optional
        The site's name as error messages quote it (e.g. ``"'locs'"``).
    owner : str, optional
        Who holds the value (e.g. the model's class name), for error messages.

    Notes
    -----
    The log-density is zero, so with a point-mass guide ``TraceEnum_ELBO`` equals the
    log-likelihood; the sampler is a point mass at ``value``, used only when the program is run
    forward (``poutine.trace``, ``Predictive`` without a guide, ``pyro.render_model``,
    ``infer_discrete``, autoguide initialisation). It is therefore not a proper distribution:
    ``log_prob`` does not describe ``sample``.

    Examples
    --------
    >>> import torch
    >>> from pyro.distributions import constraints
    >>> FlatPrior(constraints.positive, (2,), (3,)).log_prob(torch.ones(2, 3, dtype=torch.float64)).dtype
    torch.float64
    >>> FlatPrior(constraints.real, (2,), (), value=torch.tensor([1.0, 2.0])).sample((3,)).shape
    torch.Size([3, 2])
    """

    def __init__(
        self,
        support: constraints.Constraint,
        batch_shape: tuple[int, ...] | torch.Size,
        event_shape: tuple[int, ...] | torch.Size,
        value: torch.Tensor | Callable[[], torch.Tensor | None] | None = None,
        *,
        site: str | None = None,
        owner: str | None = None,
    ) -> None:
        super().__init__(support, torch.Size(batch_shape), torch.Size(event_shape))
        self._value, self._site, self._owner = value, site, owner

    def expand(self, batch_shape: Any, _instance: Any = None) -> "FlatPrior":
        new = self._get_checked_instance(FlatPrior, _instance)
        new = super().expand(batch_shape, _instance=new)
        new._value, new._site, new._owner = self._value, self._site, self._owner
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        batch_shape = broadcast_shape(value.shape[: value.dim() - self.event_dim], self.batch_shape)
        return value.new_zeros(()).expand(batch_shape)

    def sample(self, sample_shape: torch.Size | tuple[int, ...] = ()) -> torch.Tensor:
        """The point estimate, broadcast to ``sample_shape + batch_shape + event_shape``."""
        value = self._value() if callable(self._value) else self._value
        site = f" of site {self._site}" if self._site else ""
        owner = f"this {self._owner}" if self._owner else "the model"
        if value is None:
            raise FlatPriorError(
                f"the flat (maximum-likelihood) prior{site} cannot be sampled: {owner} has no value for it yet. "
                "Under the default flat priors, running the Pyro program forward (poutine.trace, Predictive, "
                "pyro.render_model, infer_discrete, autoguides) uses the fitted parameters as point masses, so "
                "fit the model first; or run the program inside `with model.bayesian():` for its proper priors"
            )
        shape = torch.Size(sample_shape) + self.batch_shape + self.event_shape
        value = value.detach()
        try:
            return value.expand(shape).clone()
        except RuntimeError as err:
            raise ValueError(
                f"the flat prior{site} holds {owner}'s value of shape {tuple(value.shape)}, which does not "
                f"match the shape {tuple(shape)} the program asks for (data of another size than at fit time?)"
            ) from err


class _CurrentValue:
    """``model._get_globals()[site]`` on the given dtype/device, or ``None`` while the model has none."""

    def __init__(self, model: Any, site: str, opts: dict | None) -> None:
        self.model, self.site, self.opts = model, site, opts or {}

    def __call__(self) -> torch.Tensor | None:
        try:
            values = self.model._get_globals()
        except AttributeError:  # parameters not set yet (NotFittedError is an AttributeError too)
            return None
        value = values.get(self.site)
        return None if value is None else torch.as_tensor(value).to(**self.opts)


def flat_prior(
    model: Any,
    site: str,
    support: constraints.Constraint,
    batch_shape: tuple[int, ...],
    event_shape: tuple[int, ...],
    opts: dict | None = None,
) -> FlatPrior:
    """The flat prior of ``model``'s global ``site``: log-density 0, sampler a point mass at
    ``model._get_globals()[site]`` (looked up only when sampled).

    Examples
    --------
    >>> class Model:
    ...     def _get_globals(self):
    ...         return {"mu": torch.tensor([1.0, 2.0])}
    >>> flat_prior(Model(), "mu", constraints.real, (), (2,)).sample().tolist()
    [1.0, 2.0]
    """
    value = _CurrentValue(model, site, opts)
    return FlatPrior(support, batch_shape, event_shape, value, site=repr(site), owner=type(model).__name__)
