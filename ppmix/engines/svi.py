"""The SVI engine: ``TraceEnum_ELBO`` with mini-batches, a learning-rate schedule and early stopping."""

from __future__ import annotations

import itertools
import logging
import math
from typing import TYPE_CHECKING, Any

import pyro
import torch
from pyro import poutine
from pyro.infer import TraceEnum_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from pyro.poutine.subsample_messenger import _Subsample
from tqdm import tqdm

from ppmix._validation import check_positive_int
from ppmix.engines.enumeration import autoguide
from ppmix.engines.params import local_params
from ppmix.engines.result import FitResult

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["fitted_autoguide", "run_svi"]

logger = logging.getLogger(__name__)

#: numbers the guides of :func:`fitted_autoguide`, so that their parameters have names of their own
_GUIDE_NUMBERS = itertools.count()


def run_svi(
    model: "MixtureModel",
    data: Any,
    *,
    num_steps: int = 1000,
    lr: float = 0.05,
    lr_decay: float = 0.1,
    batch_size: int | None = None,
    guide: str = "delta",
    num_particles: int = 1,
    patience: int | None = None,
    min_delta: float = 1e-5,
    init: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> FitResult:
    """Fit ``model`` by stochastic variational inference with Adam.

    The discrete latents are summed out exactly by ``TraceEnum_ELBO``; the global
    sites get the guide of ``model._make_svi_guide`` (point masses by default, i.e.
    maximum likelihood/MAP), started at ``model._init_values``.

    Parameters
    ----------
    num_steps : int
        Maximum number of optimisation steps.
    lr : float
        Initial Adam learning rate.
    lr_decay : float
        Learning rate after ``num_steps`` as a fraction of ``lr`` (exponential schedule).
    batch_size : int, optional
        Mini-batch size of the data plate (full batch when None).
    guide : {"delta", "normal"}
        Variational family of the globals when the model does not define its own guide.
    patience : int, optional
        Stop early when the smoothed loss has not improved by a relative ``min_delta``
        for this many steps (default: never stop early on full batches,
        ``max(50, num_steps // 10)`` steps with mini-batches).
    init : dict, optional
        Starting values of global sites (overriding ``model._init_values``); needed
        for user models with flat priors and no EM initialisation.

    Returns
    -------
    FitResult
        ``history`` is the ELBO per data point at every step (of the mini-batch).

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False).fit(torch.randn(80, 2), engine="svi", num_steps=50)
    >>> len(gmm.history_)
    50
    """
    num_steps = check_positive_int(num_steps, "num_steps")
    if batch_size is not None:
        batch_size = check_positive_int(batch_size, "batch_size")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0; got lr={lr!r}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1]; got lr_decay={lr_decay!r}")
    n_obs = model._n_observations(data)
    if batch_size is not None and batch_size >= n_obs:
        batch_size = None
    if patience is None:
        patience = num_steps if batch_size is None else max(50, num_steps // 10)
    show = model.progress if progress is None else progress

    with local_params(), model._forked_rng(), model._fitting_priors():  # MAP where the model's priors are set
        start = model._init_values(data, model._generator())
        start.update({k: torch.as_tensor(v, dtype=model.dtype, device=model._device) for k, v in (init or {}).items()})
        guide_fn, _ = model._make_svi_guide(guide, start)
        elbo = TraceEnum_ELBO(max_plate_nesting=model.max_plate_nesting, num_particles=num_particles)
        history: list[float] = []
        with model._subsampling(batch_size):
            elbo.differentiable_loss(model.model, guide_fn, data)  # creates the guide's parameters
            params = _parameters(model, guide_fn)
            if not params:
                raise ValueError("the model and guide have no parameters to optimise")
            optimizer = torch.optim.Adam(params, lr=lr)
            scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=lr_decay ** (1.0 / num_steps))
            smoothed, best, since_best, converged = None, float("inf"), 0, False
            validate = is_validation_enabled()
            with tqdm(total=num_steps, disable=not show, desc="SVI", leave=False) as bar:
                for step in range(1, num_steps + 1):
                    optimizer.zero_grad()
                    # the first step ran with Pyro's validation; later steps skip it (~30% faster)
                    with pyro.validation_enabled(step == 1 and validate):
                        loss = _step_loss(elbo, model, guide_fn, data, step, lr)
                    loss.backward()
                    optimizer.step()
                    scheduler.step()
                    value = float(loss.detach())
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"SVI loss became {value} at step {step}; try a smaller lr")
                    history.append(-value / n_obs)
                    bar.update(1)
                    bar.set_postfix(elbo=f"{history[-1]:.6g}")
                    smoothed = value if smoothed is None else 0.9 * smoothed + 0.1 * value
                    if smoothed < best - min_delta * abs(best if best != float("inf") else smoothed):
                        best, since_best = smoothed, 0
                    else:
                        since_best += 1
                        if since_best >= patience:
                            converged = True
                            break
        with torch.no_grad():
            model._set_globals(_point_estimates(guide_fn, model, data))
        if guide == "normal" and isinstance(guide_fn, AutoNormal):
            model._set_variational_guide(guide_fn)
    logger.info("SVI stopped after %d steps (early stop: %s), ELBO/point %.6f", step, converged, history[-1])
    return FitResult(history=history, n_iter=step, converged=converged)


def _step_loss(elbo: TraceEnum_ELBO, model: "MixtureModel", guide_fn: Any, data: Any, step: int, lr: float) -> Any:
    """The ELBO loss of one step; parameters that an earlier step made invalid raise one clear error."""
    try:
        return elbo.differentiable_loss(model.model, guide_fn, data)
    except ValueError as err:
        if step == 1:
            raise
        first_line = str(err).splitlines()[0]
        raise FloatingPointError(
            f"SVI parameters became invalid at step {step} ({first_line}); try a smaller lr than {lr}"
        ) from None


def _parameters(model: "MixtureModel", guide_fn: Any) -> list[torch.nn.Parameter]:
    seen: dict[int, torch.nn.Parameter] = {}
    modules = [model] + ([guide_fn] if isinstance(guide_fn, torch.nn.Module) else [])
    for module in modules:
        for p in module.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def _point_estimates(guide_fn: Any, model: "MixtureModel", data: Any) -> dict[str, torch.Tensor]:
    if hasattr(guide_fn, "median"):
        return {k: v.detach() for k, v in guide_fn.median(data).items()}
    return model._get_globals()


def _discrete_latent(msg: dict) -> bool:
    """A latent sample site with a finite support (an assignment, a state, a switch): no autoguide site."""
    return (
        msg["type"] == "sample"
        and not msg["is_observed"]
        and not isinstance(msg["fn"], _Subsample)
        and bool(getattr(msg["fn"], "has_enumerate_support", False))
    )


def fitted_autoguide(
    model: "MixtureModel", kind: str = "normal", X: Any = None, y: Any = None
) -> AutoDelta | AutoNormal:
    """A Pyro autoguide over the global sites of a fitted model's program, started at the fit.

    What a user's own ``AutoNormal(m.model, init_loc_fn=init_to_value(values=m._get_globals()))`` is meant
    to be, without its two pitfalls: the discrete latents (assignments, states, switches) are hidden from
    the guide (an autoguide cannot hold them; enumerate them in the model), and the guide's parameters
    are named apart (``"<Model>_fit_<n>.AutoNormal.locs.<site>"``), so a value that Pyro's global
    parameter store still holds under the default names (from an earlier guide, of another model) cannot
    replace the fit.

    Parameters
    ----------
    model : MixtureModel
        A fitted model (any engine).
    kind : {"normal", "delta"}
        ``AutoNormal`` (mean-field Gaussian in the unconstrained space, locations at the fit, scales 0.01)
        or ``AutoDelta`` (point masses at the fit).
    X, y : optional
        Data the guide is first run on, to create its parameters (default: the training data).

    Returns
    -------
    AutoNormal or AutoDelta
        Its parameters exist (its median is the fit); use it with ``m.model`` in ``TraceEnum_ELBO``, with
        ``Predictive(m.model, guide=...)``, or as the start of your own ``SVI``. For the pf models,
        whose program leaves its assignments and switches to the guide, enumerate them in the model:
        ``config_enumerate(m.model, "parallel")``.

    Raises
    ------
    ValueError
        If a global site of the program has no fitted value (the guide would start at its prior median).

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> x = torch.cat([torch.randn(40, 1) - 3, torch.randn(40, 1) + 3]).double()
    >>> gmm = GMM(2, seed=0, progress=False).fit(x)
    >>> guide = fitted_autoguide(gmm, "normal")
    >>> torch.allclose(guide.median(gmm.prepare_data(x))["locs"], gmm.means_)
    True
    """
    model._check_fitted()
    if (data := model._train_data if X is None else model.prepare_data(X, y)) is None:
        raise ValueError("X is required: this model holds no training data (loaded from disk, or fitted on shards)")
    values = model._get_globals()
    guide = autoguide(poutine.block(model.model, hide_fn=_discrete_latent), kind, values)
    holder = PyroModule(name=f"{type(model).__name__}_fit_{next(_GUIDE_NUMBERS)}")
    holder.add_module(type(guide).__name__, guide)  # names the guide's parameters under the holder's name
    with model._forked_rng(offset=5):
        guide(data)
    unfitted = sorted(
        name
        for name, site in guide.prototype_trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name not in values
    )
    if unfitted:
        raise ValueError(
            f"the program of {type(model).__name__} has global sites without a fitted value ({', '.join(unfitted)}): "
            "an autoguide would start them at their prior median, not at the fit"
        )
    return guide
