"""Exact computations on a Pyro program whose discrete latents are enumerated: the autoguides over
its global sites, posterior marginals of the enumerated sites, and per-point log-likelihoods."""

from __future__ import annotations

from typing import Any, Callable

import torch
from pyro import poutine
from pyro.infer import TraceEnum_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_median, init_to_value
from pyro.poutine.subsample_messenger import _Subsample

from ppmix.engines.params import local_params

__all__ = [
    "autoguide",
    "check_local_latents",
    "enumerated_log_likelihood",
    "enumerated_marginals",
    "is_enumerated",
    "sample_program",
]


def is_enumerated(msg: dict) -> bool:
    """Whether a Pyro message is a sample site marked for parallel enumeration.

    Examples
    --------
    >>> is_enumerated({"type": "sample", "infer": {"enumerate": "parallel"}})
    True
    """
    return msg["type"] == "sample" and msg.get("infer", {}).get("enumerate") == "parallel"


def autoguide(model: Callable, kind: str, init: dict[str, torch.Tensor]) -> AutoDelta | AutoNormal:
    """A guide over the global sites of ``model`` (enumerated sites hidden), started at ``init``.

    Parameters
    ----------
    model : callable
        The Pyro program.
    kind : {"delta", "normal"}
        A point mass (MAP/ML estimates) or a mean-field Gaussian in the unconstrained space.
    init : dict of str to Tensor
        Starting values by site name (others start at the prior median).

    Returns
    -------
    AutoDelta or AutoNormal

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> def model():
    ...     pyro.sample("mu", dist.Normal(0.0, 1.0))
    >>> guide = autoguide(model, "delta", {"mu": torch.tensor(2.0)})
    >>> float(guide()["mu"].detach())
    2.0
    """
    blocked = poutine.block(model, hide_fn=is_enumerated)
    init_fn = init_to_value(values=init, fallback=init_to_median)
    if kind == "delta":
        return AutoDelta(blocked, init_loc_fn=init_fn)
    if kind == "normal":
        return AutoNormal(blocked, init_loc_fn=init_fn, init_scale=0.01)
    raise ValueError(f"guide must be 'delta' or 'normal'; got {kind!r}")


def enumerated_marginals(
    model: Callable, guide: Callable, data: Any, max_plate_nesting: int
) -> dict[str, torch.Tensor]:
    """Posterior probabilities of each enumerated site given ``data`` (Pyro's ``compute_marginals``).

    Returns
    -------
    dict of str to Tensor
        Site name -> probabilities, the enumerated values in the last dimension.
    """
    with local_params(), torch.no_grad():
        elbo = TraceEnum_ELBO(max_plate_nesting=max_plate_nesting)
        marginals = elbo.compute_marginals(model, guide, data)
    return {name: d.probs.detach() for name, d in marginals.items()}


def _enumerated_trace(model: Callable, guide: Callable, data: Any, max_plate_nesting: int) -> tuple[Any, Any]:
    """The guide's trace and the model's, globals replayed from it, every enumerated site enumerated in parallel."""
    guide_trace = poutine.trace(guide).get_trace(data)
    replayed = poutine.replay(model, trace=guide_trace)
    enumerated = poutine.enum(replayed, first_available_dim=-1 - max_plate_nesting)
    return guide_trace, poutine.trace(enumerated).get_trace(data)


def _shared_enumeration_dims(trace: Any, owner: str, what: str) -> None:
    """Refuse a trace whose enumerated sites share a dimension (``pyro.markov`` recycles them along a chain):
    summing the enumerated values out site by site is then not the marginal likelihood, and one site's
    marginals are not every point's."""
    by_dim: dict[int, list[str]] = {}
    for name, site in trace.nodes.items():
        if is_enumerated(site) and not site["is_observed"]:
            by_dim.setdefault(site["infer"].get("_enumerate_dim"), []).append(name)
    shared = [names for names in by_dim.values() if len(names) > 1]
    if shared:
        raise NotImplementedError(
            f"{owner}'s program enumerates discrete latents that share enumeration dimensions ({shared[0][:4]}...: "
            "a pyro.markov chain); the inherited " + what + " serve programs with one enumerated latent per data "
            "point and would be wrong here. For a hidden Markov model with a new emission use "
            "HMM(emission=...) (see docs/guide/writing-a-family.md), or write "
            "_pointwise_log_likelihood and _posterior_marginals for this program"
        )


def check_local_latents(model: Callable, guide: Callable, data: Any, max_plate_nesting: int, owner: str) -> None:
    """Raise ``NotImplementedError`` if ``model`` enumerates latents along a ``pyro.markov`` chain (several sites
    sharing an enumeration dimension), for which the generic predictions of one latent per point are wrong.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist, torch
    >>> def chain(x):
    ...     z = None
    ...     for t in pyro.markov(range(3)):
    ...         z = pyro.sample(f"z_{t}", dist.Categorical(torch.ones(2) / 2), infer={"enumerate": "parallel"})
    ...         pyro.sample(f"x_{t}", dist.Normal(z.double(), 1.0), obs=x[t])
    >>> check_local_latents(chain, lambda x: None, torch.zeros(3), 0, "Chain")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    NotImplementedError: Chain's program enumerates discrete latents that share enumeration dimensions ...
    """
    with local_params(), torch.no_grad():
        _, trace = _enumerated_trace(model, guide, data, max_plate_nesting)
    _shared_enumeration_dims(trace, owner, "predictions, scores and ArviZ log-likelihoods")


def enumerated_log_likelihood(
    model: Callable, guide: Callable, data: Any, max_plate_nesting: int, data_plate: str, owner: str = "the model"
) -> torch.Tensor:
    """``log p(x_n | globals)`` for every point of the plate ``_data_plate``, shape ``(N,)``.

    Traces the model (globals replayed from the guide) with every enumerated site enumerated
    in parallel, adds the log-densities of the sites inside the data plate and sums the
    enumerated values out. Exact when every enumerated latent has its own enumeration dimension
    (mixtures, and several latents per point); a ``pyro.markov`` chain recycles dimensions and needs its
    own recursion (a clear ``NotImplementedError``, naming ``owner``).
    """
    with local_params(), torch.no_grad():
        guide_trace, trace = _enumerated_trace(model, guide, data, max_plate_nesting)
        _shared_enumeration_dims(trace, owner, "scores (score_samples, score, log_likelihood, to_arviz)")
        trace.compute_log_prob()
        total = torch.zeros(())
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or name in guide_trace.nodes:
                continue
            if any(frame.name == data_plate for frame in site["cond_indep_stack"]):
                total = total + site["log_prob"]
        while total.dim() > max_plate_nesting:
            total = torch.logsumexp(total, dim=0)
        return total.reshape(-1)


def sample_program(model: Callable, guide: Callable, template: Any) -> dict[str, Any]:
    """Run ``model`` unconditioned, globals replayed from ``guide``, on the placeholder ``template``.

    Returns
    -------
    dict of str to numpy.ndarray
        The value of every sample site the guide does not hold (observed and discrete sites).
    """
    with local_params(), torch.no_grad():
        guide_trace = poutine.trace(guide).get_trace(template)
        unconditioned = poutine.uncondition(poutine.replay(model, trace=guide_trace))
        trace = poutine.trace(unconditioned).get_trace(template)
    return {
        name: site["value"].detach().cpu().numpy()
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and name not in guide_trace.nodes and not isinstance(site["fn"], _Subsample)
    }
