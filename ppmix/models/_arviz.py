"""Build ArviZ ``InferenceData`` for any fitted ``MixtureModel`` from plain dicts.

``az.from_pyro`` accepts only MCMC objects, so ppmix assembles the groups itself:

- ``posterior``: draws of the global sites: the (relabelled) MCMC draws, draws from an
  SVI ``normal`` guide, or, for a point fit (EM, ``delta`` SVI), draws from a Laplace
  approximation at the point estimate (``approximation="laplace"``; by default,
  ``"auto"``, whenever the model has one and at most :data:`AUTO_LAPLACE_MAX_PARAMETERS`
  unconstrained parameters) or else the single point estimate (``approximation=None``);
- ``log_likelihood``: the pointwise log-likelihood for every draw (per sequence, along a
  ``sequence`` dimension, for the sequence models; the HMM scores every draw in one batched
  forward-backward, :meth:`~ppmix.models.hmm.HMM._draws_log_likelihood`);
- ``posterior_predictive``: one replicated data set per draw, drawn by Pyro's
  ``Predictive`` from the program with its observed sites unconditioned and its
  globals set to the draw (new discrete latents are drawn, not enumerated), or, for a
  model with its own ``_draws_replicated`` (the HMM), by it for every draw at once;
- ``prior`` and ``prior_predictive``: ``num_samples`` draws of the globals from the
  proper priors of :meth:`~ppmix.models.base.MixtureModel.bayesian` (the priors MCMC
  uses) and a replicated data set for each; left out when a site of the program has
  no proper prior (a flat prior, even under ``bayesian()``);
- ``sample_stats``: for NUTS, its statistics of every draw, named as ArviZ names them
  (``lp``, ``energy``, ``diverging``, ``n_steps``, ``tree_depth``, ``step_size``,
  ``acceptance_rate``; see :func:`~ppmix.engines.mcmc.run_mcmc`), for
  ``az.bfmi``, ``az.plot_energy`` and the divergences of ``az.plot_pair``; for Gibbs,
  ``lp``, the log joint density of every draw (``gibbs_log_joint_``: in the parameters'
  own space, where NUTS's ``lp`` is in the unconstrained space and adds the log-Jacobian
  of the transforms); for Laplace draws, ``lp``, the fitted objective at every draw (the
  log joint density of :func:`program_laplace_target`, the ELBO of the pf models), whose
  trace (``az.plot_trace(idata.sample_stats, var_names=["lp"])``) stands in for the energy
  plot of a sampler without a Hamiltonian; for an SVI ``normal`` guide's draws, ``lp``, the
  program's log joint density (discrete latents summed out) at every draw;
- ``observed_data``; ``discrete_posterior``: the per-draw posterior probabilities of
  the enumerated latents.

``idata.attrs["ppmix_draws"]`` says where the posterior draws come from (``"mcmc"``, ``"gibbs"``,
``"svi_normal_guide"``, ``"laplace"`` or ``"point_estimate"``). A point estimate is one
draw: ArviZ's ``loo``/``waic``/``compare`` cannot use it (ArviZ fails with an
IndexError), so building such an InferenceData warns (:class:`PointEstimateWarning`)
with the reason no Laplace draws were made and the ways to get draws.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from pyro import poutine
from pyro.distributions import ImproperUniform
from pyro.distributions.transforms import biject_to
from pyro.infer import Predictive, TraceEnum_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.poutine.runtime import NonlocalExit
from pyro.poutine.subsample_messenger import _Subsample

from ppmix.components.family_tools import has_conjugate_prior
from ppmix.engines.capabilities import ConjugateGibbs
from ppmix.engines.params import local_params
from ppmix.models._arviz_options import ArvizRequest, predictive_subset

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

logger = logging.getLogger(__name__)

APPROXIMATIONS = ("auto", "laplace", None)

#: ``approximation="auto"`` draws from the Laplace approximation of a point fit only up to this
#: many unconstrained parameters: its Hessian costs one backward pass per parameter, and every
#: draw one pass over the data (about 6 s at 329 parameters, N = 5000, on two cores)
AUTO_LAPLACE_MAX_PARAMETERS = 500


#: a Laplace approximation is refused when the precision's smallest eigenvalue is below this share of its largest
FLAT_RTOL = 1e-9


class PointEstimateWarning(UserWarning):
    """The InferenceData holds one draw (a point estimate): ``az.loo``/``az.waic``/``az.compare`` need draws.

    Examples
    --------
    It is a ``UserWarning``, so the usual filters silence it where one draw is what you want:

    >>> import warnings
    >>> issubclass(PointEstimateWarning, UserWarning)
    True
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", PointEstimateWarning)
    """


def global_draws(
    model: "MixtureModel", data: Any, num_samples: int, approximation: str | None = "auto"
) -> tuple[dict[str, torch.Tensor], str, str, dict[str, np.ndarray] | None]:
    """Draws of every global site with leading ``(chain, draw)`` dimensions, where they come from,
    (for a point estimate under ``approximation="auto"``) why there are no Laplace draws, and the statistics of
    every draw for ``sample_stats`` (the log joint ``lp`` of an SVI normal guide's draws where the program has one;
    None for a point estimate)."""
    samples = getattr(model, "mcmc_samples_", None)
    if model.engine_ in ("mcmc", "gibbs") and samples:
        return samples, model.engine_, "", _sampler_stats(model)
    guide = model.variational_guide_
    if model.engine_ == "svi" and isinstance(guide, AutoNormal):
        with local_params(), torch.no_grad(), model._forked_rng(offset=1):
            point = model._get_globals()  # the sites the guide does not draw (frozen in the fit: fixed=)
            draws = [{**point, **guide(data)} for _ in range(num_samples)]
        try:
            stats = {"lp": log_densities(program_laplace_target(model, data), draws)[None]}
        except LaplaceUnavailable:  # no program log joint to evaluate
            stats = None
        return {k: torch.stack([d[k] for d in draws])[None] for k in draws[0]}, "svi_normal_guide", "", stats
    point = {k: v[None, None] for k, v in model._get_globals().items()}
    if approximation is not None:
        limit = AUTO_LAPLACE_MAX_PARAMETERS if approximation == "auto" else None
        try:
            draws, lp = laplace_draws(model, data, num_samples, max_parameters=limit)
        except LaplaceUnavailable as err:
            if approximation == "laplace":
                raise LaplaceUnavailable(
                    err.reason, err.remedy or f"for posterior draws, {draw_remedies(model)}"
                ) from None
            return point, "point_estimate", err.reason, None
        return draws, "laplace", "", {"lp": lp}
    return point, "point_estimate", "", None


def _sampler_stats(model: "MixtureModel") -> dict[str, np.ndarray] | None:
    """The sampler's statistics per draw: NUTS's (``mcmc_sample_stats_``), or the Gibbs engine's log joint as ``lp``."""
    if model.engine_ == "mcmc":
        return getattr(model, "mcmc_sample_stats_", None)
    log_joint = getattr(model, "gibbs_log_joint_", None)
    return None if log_joint is None else {"lp": log_joint.detach().cpu().numpy()}


class LaplaceUnavailable(ValueError):
    """A point fit has no Laplace approximation (or, under ``approximation="auto"``, too many parameters)."""

    def __init__(self, reason: str, remedy: str = "") -> None:
        super().__init__(f"{reason}; {remedy}" if remedy else reason)
        self.reason, self.remedy = reason, remedy


def draw_remedies(model: "MixtureModel") -> str:
    """The fits that give ``model`` posterior draws, as the :class:`PointEstimateWarning` and
    :class:`LaplaceUnavailable` recommend them: the model's own ``posterior_remedy`` where it has one (the pf
    models, the mixture of experts), else ``engine='gibbs'`` where its family has a conjugate prior, then
    ``engine='mcmc'`` and ``engine='svi'`` with ``guide='normal'``."""
    own = getattr(model, "posterior_remedy", None)
    if own:
        return own
    ways = ["engine='mcmc' (num_chains=2 or more for r_hat)", "engine='svi' with guide='normal'"]
    if isinstance(model, ConjugateGibbs) and has_conjugate_prior(model._component_family()):
        ways.insert(0, "engine='gibbs' (blocked Gibbs on the conjugate priors, the quickest)")
    return "fit with " + ", ".join(ways[:-1]) + " or " + ways[-1]


# ------------------------------------------------------------------ Laplace approximation
@dataclass(frozen=True)
class LaplaceTarget:
    """The log density a Laplace approximation is taken of, and where.

    ``values`` are every global at the fit; ``supports`` the constraint of each global that varies (the
    others are held at ``values`` in every draw); ``held`` optional boolean masks, in the unconstrained shape
    of a varying global, of its entries held too (e.g. softmax experts' reference class, fixed at zero: a
    common shift of every class would be a flat direction); ``log_density(values)`` the fitted objective,
    differentiable in the varying values. The default (:func:`program_laplace_target`) is the program's log
    joint with every discrete latent summed out; a model whose fitted objective is another (the pf models'
    ELBO) defines ``_laplace_target(data)`` returning its own.
    """

    values: dict[str, torch.Tensor]
    supports: dict[str, Any]
    log_density: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    held: dict[str, torch.Tensor] = field(default_factory=dict)


def _empty_guide(*args: Any, **kwargs: Any) -> None:
    return None


def _program_trace(model: "MixtureModel", data: Any, values: dict[str, torch.Tensor]) -> Any:
    with local_params(), torch.no_grad(), model._fitting_priors():
        return poutine.trace(poutine.condition(model.model, values)).get_trace(data)


def global_supports(model: "MixtureModel", data: Any, names: Any) -> dict[str, Any]:
    """The support of each global ``names`` as the program samples it (the constraint Laplace maps from)."""
    trace = _program_trace(model, data, model._get_globals())
    return {n: trace.nodes[n]["fn"].support for n in names}


def program_laplace_target(model: "MixtureModel", data: Any) -> LaplaceTarget:
    """The log-likelihood with every discrete latent summed out plus the log prior density as the program writes
    it (zero under ppmix's flat priors; after MAP-EM, ``priors`` given, the proper priors as set: a Laplace
    approximation of the posterior at its mode), over every global; :class:`LaplaceUnavailable` where a global is
    no site of the program or a discrete latent is not enumerated there."""
    values = model._get_globals()
    trace = _program_trace(model, data, values)
    names = [n for n in values if n in trace.nodes and trace.nodes[n]["type"] == "sample"]
    sampled = [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and name not in values
        and not isinstance(site["fn"], _Subsample)
        and site["infer"].get("enumerate") != "parallel"
    ]
    if set(names) != set(values) or sampled:
        raise LaplaceUnavailable(
            f"a Laplace approximation needs every global of {type(model).__name__} to be a site of its program "
            "and every discrete latent enumerated there"
        )
    elbo = TraceEnum_ELBO(max_plate_nesting=model.max_plate_nesting)

    def log_density(point: dict[str, torch.Tensor]) -> torch.Tensor:
        with model._fitting_priors():
            return -elbo.differentiable_loss(poutine.condition(model.model, point), _empty_guide, data)

    varying = [n for n in names if n not in model.fixed_]  # frozen in the fit (fixed=): held at their values
    return LaplaceTarget(values, {n: trace.nodes[n]["fn"].support for n in varying}, log_density)


def laplace_draws(
    model: "MixtureModel", data: Any, num_samples: int, max_parameters: int | None = None
) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """``num_samples`` draws ``(1, S, ...)`` from a Laplace approximation at the fitted point estimates, and the
    fitted objective at each draw ``(1, S)`` (``sample_stats``' ``lp``).

    The target is the model's ``_laplace_target(data)`` where it has one (the pf models: their ELBO, see
    :func:`~ppmix.models.pf._pf_state.pf_laplace_target`; the mixture of experts: EM's penalised
    log-likelihood, :meth:`~ppmix.models.MixtureOfExperts._laplace_target`), else :func:`program_laplace_target`.
    Each varying global is mapped to the unconstrained space of its support (``biject_to``:
    log for scales, stick-breaking for weights, ...). There the posterior is approximated
    by a Gaussian centred on the point estimate whose precision is the negative Hessian of
    the target's log density; the draws are mapped back. Exact for no model, good when ``N`` is large beside
    the number of parameters and the fit is a well-separated optimum. Raises
    :class:`LaplaceUnavailable` where there is none, or where the unconstrained
    parameters outnumber ``max_parameters``.
    """
    own = getattr(model, "_laplace_target", None)
    with model._parameters_restored():  # a model's own target may set its globals to evaluate them
        target = own(data) if own is not None else program_laplace_target(model, data)
        names = list(target.supports)
        transforms = {n: biject_to(target.supports[n]) for n in names}
        values = target.values
        unconstrained = {n: transforms[n].inv(values[n]) for n in names}
        free = {  # the positions of the entries that vary, in each flattened unconstrained global
            n: torch.nonzero(~target.held[n].reshape(-1)).squeeze(1) if n in target.held else None for n in names
        }
        flat_values = {n: unconstrained[n].reshape(-1).to(torch.float64) for n in names}
        parts = [flat_values[n] if free[n] is None else flat_values[n][free[n]] for n in names]
        sizes = [part.numel() for part in parts]
        centre = torch.cat(parts)
        if max_parameters is not None and centre.numel() > max_parameters:
            raise LaplaceUnavailable(
                f"{type(model).__name__} has {centre.numel()} unconstrained parameters, more than the "
                f"{max_parameters} up to which approximation='auto' computes a Laplace approximation "
                "(its Hessian costs one pass per parameter)",
                "ask for it with approximation='laplace'",
            )

        def split(flat: torch.Tensor) -> dict[str, torch.Tensor]:
            varying = {}
            for n, part in zip(names, torch.split(flat, sizes)):
                entries = part if free[n] is None else flat_values[n].index_put((free[n],), part)
                varying[n] = transforms[n](entries.reshape(unconstrained[n].shape).to(values[n].dtype))
            return {**values, **varying}

        with local_params():
            precision = -torch.autograd.functional.hessian(lambda flat: target.log_density(split(flat)), centre)
        precision = 0.5 * (precision + precision.T)
        chol, info = torch.linalg.cholesky_ex(precision)
        if int(info) != 0 or not torch.isfinite(precision).all() or _numerically_flat(precision):
            raise LaplaceUnavailable(_flat_reason(model, data))
        with local_params(), torch.no_grad(), model._forked_rng(offset=4):
            noise = torch.randn(num_samples, centre.numel(), dtype=centre.dtype)
            steps = torch.linalg.solve_triangular(chol.T, noise.T, upper=True).T  # covariance = precision^-1
            draws = [split(centre + step) for step in steps]
        lp = log_densities(target, draws)
    return {n: torch.stack([d[n] for d in draws])[None].detach() for n in values}, lp[None]


def _flat_reason(model: "MixtureModel", data: Any) -> str:
    """Why a point fit's objective is not strictly concave: a family whose log-density has no curvature in some of
    its parameters (:func:`curvature_free_sites`), or else a flat direction of this fit."""
    sites = curvature_free_sites(model, data)
    if sites:
        return (
            f"the log-density of {type(model.components_).__name__} has no curvature in {', '.join(sites)} (it is not "
            "twice differentiable there, e.g. piecewise linear as a Laplace location's |x - loc|), so no fit of this "
            "family has a Laplace approximation"
        )
    return (
        "the fitted objective is not strictly concave at the point estimate (a flat direction: an empty or "
        "duplicated component, or a parameter at its bound?), so it has no Laplace approximation"
    )


def curvature_free_sites(model: "MixtureModel", data: Any) -> list[str]:
    """The sites of ``model``'s component family in whose (unconstrained) values the family's log-density of the
    observed rows has a Hessian-vector product exactly zero at the fit: a family not twice differentiable there
    (autograd's second derivative of ``|x - loc|`` is zero), whatever the data; empty for a model without a
    component family, or one whose components cannot be rebuilt from its sites.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> mix = Mixture(2, family="poisson", seed=0, progress=False).fit(np.arange(20.0)[:, None])
    >>> curvature_free_sites(mix, mix.prepare_data(np.arange(20.0)[:, None]))  # smooth: none
    []
    """
    components = getattr(model, "components_", None)
    if components is None or not hasattr(model, "_component_family"):
        return []
    rows = next(iter(model._observed_data(data).values()))
    family = model._component_family()
    try:
        values = family.site_values(components)
        specs = family.sites(model.n_components, rows.shape[-1])
        return [
            site for site, value in values.items() if _curvature_free(family, values, site, specs[site], rows, model)
        ]
    except (KeyError, TypeError, ValueError, RuntimeError, NotImplementedError):  # a family that cannot be rebuilt so
        return []


def _curvature_free(family: Any, values: dict, site: str, spec: Any, rows: torch.Tensor, model: Any) -> bool:
    transform = biject_to(spec.support)
    free = transform.inv(values[site].detach()).requires_grad_()
    with torch.enable_grad():
        components = family.components({**values, site: transform(free)}, model._scale)
        total = components.log_prob(family.prepare(rows, components)).sum()
        (gradient,) = torch.autograd.grad(total, free, create_graph=True)
        if not gradient.requires_grad:  # the gradient does not depend on the value: no curvature
            return True
        direction = torch.rand(free.shape, generator=torch.Generator().manual_seed(0), dtype=free.dtype)
        (curvature,) = torch.autograd.grad((gradient * direction).sum(), free, allow_unused=True)
    return curvature is None or not bool(curvature.any())


def _numerically_flat(precision: torch.Tensor) -> bool:
    """Whether the smallest eigenvalue of a positive-definite ``precision`` is below :data:`FLAT_RTOL` of its
    largest: a direction in which the objective is flat to rounding (e.g. a probability fitted at its clamp,
    1e-10 from the boundary, whose curvature in logit space is ``n p (1 - p)``), where Cholesky may still succeed
    and the draws would run off to the boundary."""
    eigenvalues = torch.linalg.eigvalsh(precision)
    return bool(eigenvalues[0] <= FLAT_RTOL * eigenvalues[-1])


def log_densities(target: LaplaceTarget, draws: list[dict[str, torch.Tensor]]) -> np.ndarray:
    """``target.log_density`` of every draw, ``(S,)`` (each value given a gradient: Pyro's differentiable loss
    refuses values without one)."""
    out = []
    with local_params():
        for draw in draws:
            values = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in draw.items()}
            out.append(float(target.log_density(values).detach()))
    return np.array(out)


# ------------------------------------------------------- the pointwise log-likelihood
def _flat(draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Draws ``(chains, draws, ...)`` as ``(chains * draws, ...)``."""
    return {k: v.reshape(-1, *v.shape[2:]) for k, v in draws.items()}


def own_hook(model: "MixtureModel", name: str, *companions: str) -> Callable[..., Any] | None:
    """``model``'s method ``name`` where the class defining it also defines the program ``model`` runs and the
    ``companions`` (the methods whose results it computes at once); None where it has none or a subclass replaced
    one of them (then ``to_arviz`` replays the program, or calls the companions, per draw)."""

    def owner(attribute: str) -> type | None:
        return next((cls for cls in type(model).__mro__ if attribute in vars(cls)), None)

    defining = owner(name)
    program = owner("model")
    # a model with no program of its own (the base's stub that raises, e.g. the HSMM's) has its hooks as they are
    needs = companions if program is None or program.__module__ == "ppmix.models.base" else ("model", *companions)
    if defining is None or any(owner(other) is not defining for other in needs):
        return None
    return getattr(model, name)


#: the methods whose results a model's own ``_draws_log_likelihood`` computes at once (:func:`own_hook`)
POINTWISE_COMPANIONS = ("_pointwise_log_likelihood", "_posterior_marginals")


def pointwise_draws(
    model: "MixtureModel",
    data: Any,
    draws: dict[str, torch.Tensor],
    per_step: bool = False,
    marginals: bool = True,
    dtype: Any = np.float64,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The pointwise log-likelihood ``(S, ...)`` (as ``dtype``) and, where ``marginals``, the posterior marginals
    ``{name: (S, ...)}`` at every draw ``{site: (S, ...)}``: the model's ``_draws_log_likelihood(data, draws)`` where
    it has one for its program (the HMM: one forward-backward over every draw; ``per_step``: its log-likelihood of
    every step), else its ``_pointwise_log_likelihood`` (and ``_posterior_marginals``) with each draw's globals set
    in turn; the fitted state and guide are left exactly as they were."""
    batched = own_hook(model, "_draws_log_likelihood", *POINTWISE_COMPANIONS)
    if batched is not None:
        options = {"per_step": True} if per_step else {}
        accepted = inspect.signature(batched).parameters
        if "marginals" in accepted:
            options["marginals"] = marginals
        if "dtype" in accepted:  # written in the asked precision: no float64 copy of every draw's values
            options["dtype"] = getattr(torch, np.dtype(dtype).name)
        with torch.no_grad():
            loglik, found = batched(data, draws, **options)
        kept = {name: probs.cpu().numpy() for name, probs in found.items()} if marginals else {}
        return loglik.cpu().numpy().astype(dtype, copy=False), kept
    n_draws = len(next(iter(draws.values())))
    loglik: np.ndarray | None = None
    discrete: dict[str, list[np.ndarray]] = {}
    with model._parameters_restored(), torch.no_grad():
        for i in range(n_draws):
            model._set_globals({k: v[i] for k, v in draws.items()})
            values = model._pointwise_log_likelihood(data).detach().cpu().numpy()
            if loglik is None:  # filled in place: no list of float64 rows beside the result
                loglik = np.empty((n_draws, *values.shape), dtype=dtype)
            loglik[i] = values
            for name, probs in (model._posterior_marginals(data) if marginals else {}).items():
                discrete.setdefault(name, []).append(probs.detach().cpu().numpy())
    assert loglik is not None
    return loglik, {name: np.stack(values) for name, values in discrete.items()}


# --------------------------------------------------------------- replicated data sets
def _replicated_sites(trace: Any) -> list[str]:
    return [
        name for name, site in trace.nodes.items() if site["type"] == "sample" and site["infer"].get("was_observed")
    ]


def _as_observed(values: dict[str, torch.Tensor], data: Any, observed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map replicated sites ``{site: (S, ...)}`` onto the observed variables' names and shapes.

    A site named like the observed variable is taken as it is; sites ``name_0, name_1, ...``
    (one per time step of a sequence model) are stacked along time and, when the data has
    a ``mask`` ``(B, T)`` of real steps, restricted to them (the frames).
    """
    out = {}
    for name, obs in observed.items():
        value = values.get(name)
        if value is None and f"{name}_0" in values:
            steps = []
            while f"{name}_{len(steps)}" in values:
                steps.append(values[f"{name}_{len(steps)}"])
            value = torch.stack(steps, dim=2)  # (S, B, T, ...)
            mask = getattr(data, "mask", None)
            if isinstance(mask, torch.Tensor) and tuple(mask.shape) == tuple(value.shape[1:3]):
                value = value[:, mask.to(value.device)]
        if value is None:
            continue
        value = value.detach().cpu().numpy()
        if value.shape[1:] != obs.shape:
            logger.debug("replicated %r has shape %s, observed %s: left out", name, value.shape[1:], obs.shape)
            continue
        out[name] = value
    return out


def posterior_predictive(
    model: "MixtureModel", data: Any, draws: dict[str, torch.Tensor], observed: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """One replicated data set per draw, ``{observed name: (chains, draws, *observed shape)}``: the model's
    ``_draws_replicated(data, draws)`` where it has one for its program (the HMM: every draw's state paths drawn
    at once), else Pyro's ``Predictive`` replaying the program once per draw."""
    n_chains, n_draws = next(iter(draws.values())).shape[:2]
    flat = _flat(draws)
    batched = own_hook(model, "_draws_replicated")
    if batched is not None:
        with torch.no_grad(), model._forked_rng(offset=2):
            values = batched(data, flat)
        replicated = _as_observed(values, data, observed)
        return {k: v.reshape(n_chains, n_draws, *v.shape[1:]) for k, v in replicated.items()}
    # conditioned on the first draw as well, so Predictive's shape-finding run never samples a prior
    program = poutine.condition(poutine.uncondition(model.model), {k: v[0] for k, v in flat.items()})
    with local_params(), torch.no_grad(), model._forked_rng(offset=2):
        trace = poutine.trace(program).get_trace(data)
        globals_ = {k: v for k, v in flat.items() if k in trace.nodes and trace.nodes[k]["type"] == "sample"}
        sites = _replicated_sites(trace)
        values = _predictive(program, data, globals_, n_chains * n_draws, sites, trace)
    return {k: v.reshape(n_chains, n_draws, *v.shape[1:]) for k, v in _as_observed(values, data, observed).items()}


def _predictive(program: Any, data: Any, posterior: dict | None, num: int, sites: list[str], trace: Any) -> dict:
    """``Predictive`` (sequential) over ``num`` runs; each site reshaped to ``(num, *its shape in trace)``."""
    predictive = Predictive(program, posterior_samples=posterior, num_samples=num, return_sites=sites)
    out = predictive(data)
    return {k: v.reshape(num, *trace.nodes[k]["value"].shape) for k, v in out.items()}


def _base_dist(fn: Any) -> Any:
    while hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


def prior_samples(
    model: "MixtureModel", data: Any, names: list[str], observed: dict[str, np.ndarray], num_samples: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """Draws of the globals ``names`` from the proper priors of ``bayesian()`` and a replicated data set for each,
    ``(1, S, ...)``; ``None`` when a global site has no proper prior. Where the program samples its globals before
    any other site and the model replicates data itself (``_draws_replicated``), the globals come from runs of the
    program stopped before its first data site (:func:`_prior_globals`) and the data sets from one batched
    ``_draws_replicated``; otherwise ``Predictive`` runs the whole program ``num_samples`` times."""
    program = poutine.uncondition(model.model)
    with local_params(), torch.no_grad(), model.bayesian(), model._forked_rng(offset=3):
        try:
            trace = poutine.trace(program).get_trace(data)
        except NotImplementedError:  # an improper prior that cannot be sampled
            return None
        globals_ = [n for n in names if n in trace.nodes and trace.nodes[n]["type"] == "sample"]
        if not globals_ or any(isinstance(_base_dist(trace.nodes[n]["fn"]), ImproperUniform) for n in globals_):
            return None
        batched = own_hook(model, "_draws_replicated")
        drawn = _prior_globals(program, data, globals_, num_samples) if batched is not None else None
        if drawn is not None:
            values = {**drawn, **batched(data, drawn)}
        else:
            values = _predictive(program, data, None, num_samples, globals_ + _replicated_sites(trace), trace)
    prior = {n: values[n].detach().cpu().numpy()[None] for n in globals_}
    replicated = {k: v[None] for k, v in _as_observed(values, data, observed).items()}
    return prior, replicated


def _prior_globals(program: Any, data: Any, globals_: list[str], num_samples: int) -> dict[str, torch.Tensor] | None:
    """``num_samples`` draws of the globals ``{site: (S, ...)}``, each from a run of ``program`` stopped at its first
    other sample site, plates aside (``poutine.escape``: the data's steps never run); None where some global comes
    after another site."""
    wanted = set(globals_)

    def other_site(msg: dict) -> bool:
        return msg["type"] == "sample" and msg["name"] not in wanted and not isinstance(msg["fn"], _Subsample)

    draws = []
    for _ in range(num_samples):
        tracer = poutine.trace(poutine.escape(program, escape_fn=other_site))
        try:
            tracer.get_trace(data)
        except NonlocalExit:
            pass
        nodes = tracer.trace.nodes
        if not wanted <= set(nodes):
            return None
        draws.append({n: nodes[n]["value"] for n in globals_})
    return {n: torch.stack([draw[n] for draw in draws]) for n in globals_}


# ------------------------------------------------------------------------- the builder
def refuse_missing_entries(model: "MixtureModel", data: Any) -> None:
    """A ``ValueError`` naming the first missing entry (NaN) of ``data``'s observed values and what takes them:
    ArviZ's draws are scored by the model's Pyro program, which cannot marginalise missing entries (only EM's
    updates and the exact predictions do, under ``missing="marginalize"``)."""
    for name, values in model._observed_data(data).items():
        missing = torch.isnan(values) if values.is_floating_point() else torch.zeros_like(values, dtype=torch.bool)
        if bool(missing.any()):
            where = torch.nonzero(missing)[0].tolist()
            raise ValueError(
                f"to_arviz() needs data without missing entries; the observed {name!r} has a NaN at {tuple(where)} "
                "(of the training data by default). Its draws are scored by the model's Pyro program, which cannot "
                "marginalise them: pass the complete rows, e.g. model.to_arviz(X[~np.isnan(X).any(axis=1)]) "
                "(sequence models: the complete sequences). With missing='marginalize', fit, partial_fit, predict, "
                "predict_proba, score, score_samples, bic, aic (and decode for sequences) take missing entries"
            )


def build_inference_data(
    model: "MixtureModel",
    data: Any,
    num_samples: int = 100,
    approximation: str | None = "auto",
    per_step: bool = False,
    request: ArvizRequest | None = None,
) -> Any:
    """``InferenceData`` with the groups listed in this module's docstring that ``request`` asks for (default
    :data:`~ppmix.models._arviz_options.DEFAULT_GROUPS`, every draw, the log-likelihood in float32).

    For a point fit (EM, ``delta`` SVI), ``approximation="laplace"`` gives
    ``num_samples`` draws from :func:`laplace_draws` (raising
    :class:`LaplaceUnavailable` where there is none), ``"auto"`` the same where the
    model has one with at most :data:`AUTO_LAPLACE_MAX_PARAMETERS` parameters and the
    point estimate otherwise, and ``None`` the single point estimate. It does not
    change the draws of MCMC or of an SVI ``normal`` guide. ``per_step``: the log-likelihood of every step of a
    sequence model (its ``_draws_log_likelihood(..., per_step=True)``) in place of every sequence's. Each group costs
    time and memory in proportion to the draws it holds (after ``request.thin``) and is computed only if asked.
    """
    import arviz as az

    request = request or ArvizRequest.checked()
    if approximation not in APPROXIMATIONS:
        raise ValueError(f"approximation must be one of {APPROXIMATIONS}; got {approximation!r}")
    refuse_missing_entries(model, data)
    draws, source, no_laplace, stats = global_draws(model, data, num_samples, approximation)
    draws, stats = _thinned(draws, stats, request.thin)
    n_chains, n_draws = next(iter(draws.values())).shape[:2]
    flat_prior = source == "laplace" and getattr(model, "priors", None) is None
    if flat_prior and request.explicit and request.wants("prior", "prior_predictive"):
        raise ValueError(
            f"groups: {sorted(request.groups & {'prior', 'prior_predictive'})} asked of Laplace draws of a maximum-"
            "likelihood fit, whose prior is flat (no proper prior to draw from): fit with priors= (MAP) for a Laplace "
            "approximation under the proper priors, or leave these groups out"
        )
    observed = {k: v.detach().cpu().numpy() for k, v in model._observed_data(data).items()}
    obs_name = next(iter(observed))
    dims = dict(model._arviz_dims())
    coords: dict[str, Any] = {}
    names = model.feature_names_in_
    if names is not None and len(names) == observed[obs_name].shape[-1]:
        coords["feature"] = names
    for name, values in observed.items():  # one name for the rows in every group: az.loo_pit aligns them
        if values.ndim <= 2:
            dims.setdefault(name, ["obs_id", "feature"][: values.ndim])
    groups: dict[str, Any] = {}
    if stats and request.wants("sample_stats"):
        groups["sample_stats"] = stats
    if request.wants("observed_data"):
        groups["observed_data"] = observed
    if request.wants("prior", "prior_predictive") and not flat_prior:
        prior = _optional("prior", lambda: prior_samples(model, data, list(draws), observed, num_samples), quiet=True)
        if prior is not None and request.wants("prior"):
            groups["prior"] = prior[0]
        if prior is not None and prior[1] and request.wants("prior_predictive"):
            groups["prior_predictive"] = prior[1]
    idata = az.from_dict(
        posterior={k: v.detach().cpu().numpy() for k, v in draws.items()},
        coords=coords or None,
        dims=dims or None,
        **groups,
    )
    _add_pointwise(idata, model, data, draws, per_step, request, obs_name, dims)
    if request.wants("posterior_predictive"):
        _add_replicated(idata, model, data, draws, observed, request, coords, dims)
    _label(idata, model, source, flat_prior)
    if n_chains * n_draws == 1:
        idata.attrs["ppmix_note"] = _one_draw_message(model, no_laplace)
        warnings.warn(idata.attrs["ppmix_note"], PointEstimateWarning, stacklevel=4)
    return idata


def _thinned(
    draws: dict[str, torch.Tensor], stats: dict[str, np.ndarray] | None, thin: int
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray] | None]:
    """Every ``thin``-th draw of every chain (and its statistics)."""
    if thin == 1:
        return draws, stats
    kept = {k: v[:, ::thin] for k, v in draws.items()}
    return kept, None if stats is None else {k: v[:, ::thin] for k, v in stats.items()}


def _add_pointwise(
    idata: Any,
    model: "MixtureModel",
    data: Any,
    draws: dict[str, torch.Tensor],
    per_step: bool,
    request: ArvizRequest,
    obs_name: str,
    dims: dict[str, Any],
) -> None:
    """The ``log_likelihood`` (in ``request.log_likelihood_dtype``) and ``discrete_posterior`` groups, as asked, from
    one pass over the draws."""
    import arviz as az

    if not request.wants("log_likelihood", "discrete_posterior"):
        return
    n_chains, n_draws = next(iter(draws.values())).shape[:2]
    wants_discrete = request.wants("discrete_posterior")
    loglik, discrete = pointwise_draws(
        model, data, _flat(draws), per_step=per_step, marginals=wants_discrete, dtype=request.log_likelihood_dtype
    )

    def per_draw(stacked: np.ndarray) -> np.ndarray:
        return stacked.reshape(n_chains, n_draws, *stacked.shape[1:])

    if request.wants("log_likelihood"):
        log_lik = per_draw(loglik)
        n_rows = len(next(iter(model._observed_data(data).values())))
        unit = ["sequence"] if log_lik.shape[2] != n_rows else ["obs_id"]  # sequence models: one value per sequence
        idata.add_groups({"log_likelihood": az.dict_to_dataset({obs_name: log_lik}, dims={obs_name: unit})})
    if wants_discrete and discrete:
        discrete_ds = az.dict_to_dataset(
            {f"{name}_probs": per_draw(values) for name, values in discrete.items()},
            dims={f"{name}_probs": ["obs_id", "component"] for name in discrete},
        )
        idata.add_groups({"discrete_posterior": discrete_ds})


def _add_replicated(
    idata: Any,
    model: "MixtureModel",
    data: Any,
    draws: dict[str, torch.Tensor],
    observed: dict[str, np.ndarray],
    request: ArvizRequest,
    coords: dict[str, Any],
    dims: dict[str, Any],
) -> None:
    """The ``posterior_predictive`` group for the draws :func:`predictive_subset` picks, its ``draw`` coordinate
    the posterior's draws they replicate."""
    import arviz as az

    n_chains, n_draws = next(iter(draws.values())).shape[:2]
    cells = sum(int(np.prod(value.shape)) for value in observed.values())
    subset = predictive_subset(n_draws, cells, n_chains, request.predictive_draws)
    chosen = draws if len(subset) == n_draws else {k: v[:, subset] for k, v in draws.items()}
    replicated = _optional("posterior_predictive", lambda: posterior_predictive(model, data, chosen, observed))
    if not replicated:
        return
    dataset = az.dict_to_dataset(
        replicated,
        coords={**coords, "draw": np.asarray(idata.posterior["draw"].values)[subset]},
        dims={k: v for k, v in dims.items() if k in replicated},
    )
    idata.add_groups({"posterior_predictive": dataset})
    if len(subset) < n_draws:
        idata.posterior_predictive.attrs["ppmix_note"] = (
            f"replicated data sets for {len(subset)} of the {n_draws} draws of every chain (draw coordinate); "
            "to_arviz(predictive_draws='all') for every draw (az.plot_loo_pit needs it)"
        )


#: what ``idata.attrs["ppmix_draws"]`` and the posterior's ``ppmix_draws`` attribute say of each source of draws
DRAW_SOURCES = {
    "mcmc": "posterior draws of NUTS (engine='mcmc')",
    "gibbs": "posterior draws of blocked Gibbs sweeps (engine='gibbs')",
    "svi_normal_guide": "draws of a variational approximation (SVI normal guide), not of the posterior",
    "laplace": (
        "draws of a Laplace approximation (a Gaussian in the unconstrained parameters at the point estimate, "
        "covariance the inverse negative Hessian of the fitted objective), not of the posterior"
    ),
    "point_estimate": "one draw: the point estimate",
}


def _label(idata: Any, model: "MixtureModel", source: str, flat_prior: bool) -> None:
    """Say where the draws come from where ArviZ shows it: the InferenceData's, the posterior's and
    ``sample_stats``' attributes (printed with the group) and ``inference_library``."""
    idata.attrs["ppmix_draws"] = source
    idata.attrs["ppmix_engine"] = model.engine_
    what = DRAW_SOURCES[source]
    approximate = source in ("laplace", "svi_normal_guide")
    for group in ("posterior", "sample_stats"):
        if hasattr(idata, group):
            attrs = getattr(idata, group).attrs
            attrs["inference_library"] = "ppmix"
            attrs["ppmix_draws"] = source
            attrs["ppmix_draws_are"] = what
            if approximate:
                attrs["approximation"] = source
    if source == "laplace":
        idata.attrs["ppmix_prior"] = (
            "flat (maximum likelihood): no prior group; fit with priors= for a Laplace approximation under proper "
            "priors"
            if flat_prior
            else "the priors set with priors= (MAP), the prior group's"
        )
    if hasattr(idata, "sample_stats") and "energy" not in idata.sample_stats:
        idata.sample_stats.attrs["ppmix_note"] = (
            "no energy: az.bfmi and az.plot_energy are for Hamiltonian samplers (engine='mcmc'); "
            "az.plot_trace(idata.sample_stats, var_names=['lp']) traces the log density instead"
        )


def _optional(group: str, build: Any, quiet: bool = False) -> Any:
    """Build an optional group; on failure warn (or, ``quiet``, log) and leave it out."""
    try:
        return build()
    except Exception as err:  # noqa: BLE001 - an optional group never stops to_arviz
        message = f"to_arviz: the {group} group is left out ({type(err).__name__}: {err})"
        if quiet:
            logger.info(message)
        else:
            warnings.warn(message, UserWarning, stacklevel=4)
        return None


def _one_draw_message(model: "MixtureModel", no_laplace: str = "") -> str:
    offers_laplace = "approximation" in inspect.signature(model.to_arviz).parameters
    if no_laplace:
        laplace = f" (no Laplace approximation: {no_laplace})"
    elif offers_laplace:
        laplace = "; or to_arviz(approximation='laplace') for draws from a Laplace approximation"
    else:
        laplace = ""
    fit = {"em": "an EM fit", "svi": "a point-mass (guide='delta') SVI fit"}.get(model.engine_, "a fit")
    return (
        f"this InferenceData holds one draw, the point estimate of {fit} of "
        f"{type(model).__name__}: az.loo, az.waic and az.compare need posterior draws (ArviZ fails on one draw "
        f"with an IndexError), and az.summary cannot compute ess or r_hat. To get draws, {draw_remedies(model)}"
        f"{laplace}."
    )
