"""The EM engine: closed-form coordinate ascent with restarts, for models that opt in."""

from __future__ import annotations

import logging
import math
import numbers
import warnings
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any, Protocol, runtime_checkable

import torch
from tqdm import tqdm

from ppmix._validation import check_positive_int
from ppmix.engines.capabilities import DataStatisticsEM
from ppmix.engines.result import ConvergenceWarning, FitResult
from ppmix.ops.selection import beats
from ppmix.ops.threads import threads_for, torch_threads

__all__ = ["EM_HOOKS", "EMModel", "run_em"]

logger = logging.getLogger(__name__)
#: relative decrease of the EM objective tolerated as rounding before a warning is logged (float64) ...
DECREASE_TOL = 1e-9
#: ... or this many machine epsilons of the objective's dtype, if more (float32: about 1.2e-4)
DECREASE_EPS = 1e3


@runtime_checkable
class EMModel(Protocol):
    """What :func:`run_em` needs of a model: the EM settings and the EM hooks.

    :class:`~ppmix.models.MixtureModel` declares the settings (class defaults ``n_init=1``,
    ``max_iter=100``, ``tol=1e-6``, ``warm_start=False``; models with EM take them as
    constructor arguments) and defaults for ``_em_data``, ``_n_observations``,
    ``_get_globals``/``_set_globals`` and ``_generator``; a model opts in to EM by writing
    the three hooks in :data:`EM_HOOKS`.

    Attributes
    ----------
    n_init, max_iter, tol, warm_start :
        Restarts, iterations per restart, tolerance on the change of the objective per
        observation (nats; unchanged when the data are rescaled), and
        whether a fitted model continues from its parameters.
    progress : bool
        Show a progress bar.
    is_fitted : bool
        Whether the model holds fitted parameters (``warm_start`` needs them).
    init_iter : int or None
        Iterations of every restart before only the best is run on (None: every restart runs to the end).
    """

    n_init: int
    init_iter: int | None
    max_iter: int
    tol: float
    warm_start: bool
    progress: bool
    is_fitted: bool

    def _em_data(self, data: Any) -> Any:
        """The data as the hooks want it (e.g. with cached statistics)."""

    def _n_observations(self, data: Any) -> int:
        """The number of data points (the objective is reported per point)."""

    def _em_initialize(self, data: Any, generator: torch.Generator) -> None:
        """Set the starting parameters of one restart."""

    def _e_step(self, data: Any) -> tuple[Any, torch.Tensor]:
        """Return (statistics for the M-step, objective at the current parameters)."""

    def _m_step(self, data: Any, stats: Any) -> None:
        """Update the parameters in place so that the objective does not decrease."""

    def _get_globals(self) -> dict[str, torch.Tensor]:
        """The current parameters (kept for the best restart)."""

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        """Restore parameters returned by ``_get_globals``."""

    def _generator(self, offset: int = 0) -> torch.Generator:
        """A seeded generator for restart ``offset``."""


#: the hooks a model writes to opt in to EM (the rest of :class:`EMModel` has defaults)
EM_HOOKS = ("_em_initialize", "_e_step", "_m_step")


def run_em(
    model: EMModel,
    data: Any,
    *,
    n_init: int | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    warm_start: bool | None = None,
    progress: bool | None = None,
    init_iter: int | None = None,
) -> FitResult:
    """Fit ``model`` by EM, keeping the best of ``n_init`` restarts.

    Every iteration is one M-step followed by one E-step; the E-step returns the
    objective (the ELBO; for a plain mixture the log-likelihood) at the current
    parameters, so the recorded history is exactly the objective of the parameters
    held after each iteration. A restart stops when the objective per observation changes
    by at most ``tol`` (an absolute change in nats, as scikit-learn's: rescaling the data
    shifts a log-likelihood by a constant, so a relative change would depend on the units).
    Torch runs on one thread where a pass is small or the CPU busy, and otherwise on its own
    setting (:mod:`ppmix.ops.threads`; ``ppmix.set_thread_policy("torch")`` turns this off).

    Parameters
    ----------
    model : EMModel
        A model with the EM settings and hooks (see :class:`EMModel`).
    data : prepared data, as returned by ``model.prepare_data``.
    n_init, max_iter, tol, warm_start, progress :
        Default to the model's attributes of the same names.
        With ``warm_start`` a fitted model continues from its current parameters
        (one restart).
    init_iter : int, optional
        "Small EM" (Biernacki, Celeux & Govaert, 2003): every restart runs only
        ``init_iter`` iterations, and only the best of them is run on to convergence,
        which buys many starts for the price of a few full runs. Defaults to the
        model's ``init_iter`` attribute where it has one; ``None`` runs every restart to
        convergence.

    Returns
    -------
    FitResult
        History of the objective per data point, iterations and convergence of the best restart.

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False)
    >>> gmm.fit(torch.randn(100, 2, generator=torch.Generator().manual_seed(0)), engine="em", max_iter=200).converged_
    True
    """
    n_init = check_positive_int(model.n_init if n_init is None else n_init, "n_init")
    max_iter = check_positive_int(model.max_iter if max_iter is None else max_iter, "max_iter")
    tol = model.tol if tol is None else tol
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real):
        raise TypeError(f"tol must be a number; got {tol!r} ({type(tol).__name__})")
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"tol must be non-negative; got {tol}")
    warm = bool(model.warm_start if warm_start is None else warm_start) and model.is_fitted
    show = model.progress if progress is None else progress
    em_data = model._em_data(data)
    n_obs = model._n_observations(data)
    if warm and warm_start is None:  # the user's warm start: only from parameters of the shapes this fit needs
        warm = _held_parameters_fit(model)

    init_iter = model.init_iter if init_iter is None else init_iter
    short = None if init_iter is None or warm or n_init == 1 else check_positive_int(init_iter, "init_iter")
    best: tuple[float, dict[str, torch.Tensor], FitResult] | None = None
    inference = getattr(model, "em_inference_mode", False)
    try:
        with ExitStack() as threads:
            # until the size of a pass is known: one thread only if the CPU is busy (ppmix.ops.threads)
            threads.enter_context(torch_threads(threads_for(math.inf)))
            threads.enter_context(_inference(model))
            if warm and isinstance(model, DataStatisticsEM):  # statistics of this fit's data, not EM parameters
                model._em_set_data_statistics(model._em_data_statistics(em_data))
            for restart in range(1 if warm else n_init):
                if not warm:
                    model._em_initialize(em_data, model._generator(restart))
                if restart == 0:  # then by the work of a pass, known once the parameters exist
                    threads.enter_context(torch_threads(threads_for(_pass_work(model, n_obs))))
                best = _better(best, model, em_data, n_obs, min(short or max_iter, max_iter), tol, show, restart)
            assert best is not None
            values, result = best[1], best[2]
            tail = short is not None and not result.converged  # small EM: run the best start on to convergence
            if tail or not inference:
                model._set_globals(values)
            if tail:
                rest = _single_run(model, em_data, n_obs, max(max_iter - result.n_iter, 1), tol, show, n_init)
                result = FitResult(result.history + rest.history[1:], result.n_iter + rest.n_iter, rest.converged)
                values = model._get_globals()
    except BaseException:  # an error or interrupt mid-EM: leave ordinary tensors behind, not inference ones
        if inference:
            _ordinary_parameters(model)
        raise
    if inference:  # the parameters set once, as ordinary tensors (autograd may use them)
        model._set_globals({name: value.clone() for name, value in values.items()})
    if not result.converged:
        warnings.warn(
            f"EM did not converge in max_iter={max_iter} iterations (tol={tol}); increase max_iter or tol",
            ConvergenceWarning,
            stacklevel=3,
        )
    return result


def _ordinary_parameters(model: EMModel) -> None:
    """Replace the parameters EM left under ``torch.inference_mode`` by ordinary copies (after an exception: the
    model may hold none yet, then there is nothing to replace)."""
    try:
        values = model._get_globals()
    except AttributeError:  # no parameters yet (the error came before the first start)
        return
    model._set_globals({name: value.clone() for name, value in values.items()})


def _inference(model: EMModel) -> AbstractContextManager[Any]:
    """``torch.inference_mode()`` for a model that declares ``em_inference_mode = True`` (its EM hooks use no
    autograd and keep no tensor beyond its globals), else nothing: torch's operations skip their autograd and
    version-counter bookkeeping, a sixth of a small Gaussian fit (``benchmarks/_defaults_small.py``)."""
    return torch.inference_mode() if getattr(model, "em_inference_mode", False) else nullcontext()


def _held_parameters_fit(model: EMModel) -> bool:
    """Whether the fitted parameters have the shapes this fit's settings and data imply (``_state_shapes()``,
    where the model declares them: the number of components, of features, ...); if not, a warning says the fit
    starts from scratch. Costs no start and no pass over the data."""
    expected = getattr(model, "_state_shapes", lambda: None)()
    if not expected:
        return True
    held = {name: tuple(value.shape) for name, value in model._state_tensors().items()}  # type: ignore[attr-defined]
    changed = [
        f"{name} {held.get(name)} -> {tuple('any' if e is None else e for e in shape)}"
        for name, shape in expected.items()
        if name not in held
        or len(held[name]) != len(shape)
        or any(e is not None and h != e for h, e in zip(held[name], shape))
    ]
    if not changed:
        return True
    warnings.warn(
        f"warm_start=True, but the fitted parameters do not have the shapes this fit needs ({', '.join(changed)}: "
        "n_components or the number of features changed); fitting from scratch",
        UserWarning,
        stacklevel=4,
    )
    return False


def _pass_work(model: EMModel, n_obs: int) -> float:
    """The work of one EM pass for the thread policy (:func:`ppmix.ops.threads.threads_for`): rows x values."""
    return float(n_obs) * sum(value.numel() for value in model._get_globals().values())


def _better(
    best: tuple[float, dict[str, torch.Tensor], FitResult] | None,
    model: EMModel,
    data: Any,
    n_obs: int,
    iterations: int,
    tol: float,
    show: bool,
    restart: int,
) -> tuple[float, dict[str, torch.Tensor], FitResult]:
    """Run one restart from the model's current parameters; the better of it and ``best``."""
    result = _single_run(model, data, n_obs, iterations, tol, show, restart)
    final = result.history[-1]
    logger.info("EM restart %d: objective/point %.6f after %d iterations", restart, final, result.n_iter)
    if beats(final, None if best is None else best[0], getattr(model, "dtype", torch.float64)):
        return final, model._get_globals(), result
    return best


def _single_run(
    model: EMModel, data: Any, n_obs: int, max_iter: int, tol: float, show: bool, restart: int
) -> FitResult:
    stats, objective = model._e_step(data)
    previous = _finite(objective, 0)
    decrease_tol = _decrease_tol(objective)
    history = [previous / n_obs]
    converged = False
    iteration = 0
    with _progress_bar(show, max_iter, restart) as bar:
        for iteration in range(1, max_iter + 1):
            model._m_step(data, stats)
            stats, objective = model._e_step(data)
            current = _finite(objective, iteration)
            history.append(current / n_obs)
            _check_ascent(previous, current, n_obs, iteration, decrease_tol)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(objective=f"{history[-1]:.6g}")
            if abs(current - previous) <= tol * n_obs:
                converged = True
                break
            previous = current
    return FitResult(history=history, n_iter=iteration, converged=converged)


def _progress_bar(show: bool, max_iter: int, restart: int) -> AbstractContextManager[tqdm | None]:
    """A restart's tqdm bar where ``show``; otherwise none at all (a disabled bar still costs its bookkeeping
    on every iteration, a measurable share of a small fit)."""
    if not show:
        return nullcontext()
    return tqdm(total=max_iter, desc=f"EM (init {restart})", leave=False)


def _decrease_tol(objective: torch.Tensor | float) -> float:
    """The relative rounding of an objective computed in ``objective``'s dtype (Python floats: float64):
    :data:`DECREASE_TOL`, or :data:`DECREASE_EPS` machine epsilons of a coarser dtype."""
    dtype = objective.dtype if isinstance(objective, torch.Tensor) and objective.is_floating_point() else torch.float64
    return max(DECREASE_TOL, DECREASE_EPS * torch.finfo(dtype).eps)


def _check_ascent(previous: float, current: float, n_obs: int, iteration: int, tol: float) -> None:
    """Log a warning when an EM step lowers the objective by more than rounding.

    Every M-step is the exact maximiser of the reported objective (the variance floor is a
    constraint), so a decrease beyond ``tol`` (relative; :func:`_decrease_tol` of the objective's
    dtype) means a bug or a numerically degenerate fit; it is logged, not raised, so a long fit is not lost.
    """
    if current < previous - tol * max(abs(previous), n_obs):
        logger.warning(
            "EM objective decreased at iteration %d: %.10g -> %.10g per observation",
            iteration,
            previous / n_obs,
            current / n_obs,
        )


def _finite(objective: torch.Tensor | float, iteration: int) -> float:
    value = float(objective)
    if not math.isfinite(value):
        raise FloatingPointError(
            f"EM objective became {value} at iteration {iteration}; the data may need scaling "
            "or a larger variance floor (reg_covar)"
        )
    return value
