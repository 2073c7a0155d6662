"""Information criteria of every generative model, as functions of the model (what
:meth:`~ppmix.models.base.MixtureModel.bic` and :meth:`~ppmix.models.base.MixtureModel.aic` call): ``bic`` and
``aic`` from its log-likelihood and its count of free parameters (the model's own ``n_parameters``, or else counted
from its Pyro program)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from pyro import poutine
from pyro.distributions.transforms import biject_to

from ppmix.models.frozen import frozen_parameter_count

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["aic", "bic", "criterion_terms", "program_parameter_count"]


def program_parameter_count(model: Callable[..., Any], data: Any, data_plate: str) -> int:
    """Free parameters of a Pyro program: the unconstrained size of each global sample site.

    A global site is one that is neither observed, discrete nor inside the plate ``_data_plate``; its
    free parameters are the elements of its value mapped to the unconstrained space of its
    support (a ``K``-simplex has ``K - 1``, a ``D x D`` correlation Cholesky factor
    ``D (D - 1) / 2``). The program runs once on ``data`` (a fitted ppmix model's flat priors
    sample their fitted values).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist, torch
    >>> def program(x):
    ...     w = pyro.sample("w", dist.Dirichlet(torch.ones(3)))
    ...     with pyro.plate("components", 3):
    ...         loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         z = pyro.sample("z", dist.Categorical(w))
    ...         pyro.sample("x", dist.Normal(loc[z], 1.0), obs=x)
    >>> program_parameter_count(program, torch.zeros(5), "data")
    5
    """
    trace = poutine.trace(model).get_trace(data)
    count = 0
    for site in trace.nodes.values():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        support = getattr(site["fn"], "support", None)  # None: a plate's subsample site
        if support is None or support.is_discrete:
            continue  # data, and discrete latents (assignments, feature switches), are not parameters
        if any(frame.name == data_plate for frame in site["cond_indep_stack"]):
            continue
        count += biject_to(support).inv(site["value"]).numel()
    return count


def bic(model: MixtureModel, X: Any, y: Any = None) -> float:
    """``-2 log L + p log N`` of ``model`` on ``(X, y)`` (:func:`criterion_terms`)."""
    log_likelihood, n, p = criterion_terms(model, X, y)
    return -2.0 * log_likelihood + p * math.log(n)


def aic(model: MixtureModel, X: Any, y: Any = None) -> float:
    """``-2 log L + 2 p`` of ``model`` on ``(X, y)`` (:func:`criterion_terms`)."""
    log_likelihood, _, p = criterion_terms(model, X, y)
    return -2.0 * log_likelihood + 2.0 * p


def criterion_terms(model: MixtureModel, X: Any, y: Any) -> tuple[float, int, int]:
    """``(log L, N, p)`` on ``(X, y)``: the model's ``_pointwise_log_likelihood`` summed, its ``_n_observations``
    (the rows of a mixture, the time steps of an HMM: ``N`` in ``p log N``) and its free parameters,
    ``n_parameters`` where the model defines it, else counted from its program (:func:`program_parameter_count`),
    so a user's model has them too, less those the fit held fixed
    (:func:`~ppmix.models.frozen.frozen_parameter_count`)."""
    model._check_fitted()
    data = model.prepare_data(X, y)
    if getattr(type(model), "n_parameters", None) is not None:
        p = int(model.n_parameters)
    else:
        p = program_parameter_count(model.model, data, model.data_plate_name)
    p -= frozen_parameter_count(model)  # parameters held fixed by the fit (fit(..., fixed=...)) are not free
    return float(model._pointwise_log_likelihood(data).sum()), model._n_observations(data), p
