"""The EM engine: one loop of closed-form coordinate ascent, fed by a source of E-steps, with restarts.

:func:`em_loop` is the only EM loop of ppmix: E-step, then M-step and E-step until the objective per observation
stops changing, recording the history. Where its E-steps come from is an :class:`EMSource`:

- :class:`InMemory` (``fit``, :func:`run_em`): every E-step a pass over all the data, by the model's hooks;
- the shards of :func:`ppmix.distributed.fit_em`: every E-step the statistics of the shards, merged where the
  workers hold them;
- the stream of ``partial_fit`` (:mod:`ppmix.models._online`): every E-step a new chunk, averaged into the running
  statistics (online EM's stochastic approximation); the loop ends when the stream does.

:func:`fit_source` runs the loop from ``n_init`` starts of a source that can start (in memory, on shards) and keeps
the best.
"""

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

__all__ = ["EM_HOOKS", "EMModel", "EMSource", "InMemory", "em_loop", "fit_source", "run_em"]

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


@runtime_checkable
class EMSource(Protocol):
    """Where :func:`em_loop` takes its E-steps and puts its M-steps.

    Attributes
    ----------
    n_observations : float
        The observations of the last E-step's data (the objective is reported per observation).
    monotone : bool
        Whether every E-step sees the same data, so that the objective never decreases and its change measures
        convergence (in memory, on shards); a stream's E-steps see new data.
    """

    n_observations: float
    monotone: bool

    def e_step(self) -> tuple[Any, torch.Tensor] | None:
        """The M-step's statistics and the objective at the current parameters; None where the source has no more
        data (the end of a stream)."""

    def m_step(self, stats: Any) -> None:
        """Update the parameters from the statistics of the last E-step."""


class InMemory:
    """The data in memory: every E-step one pass of the model's hooks over all of them.

    Parameters
    ----------
    model : EMModel
    data : prepared data, as returned by ``model.prepare_data`` (or ``model._weigh``)

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False)
    >>> x = torch.randn(100, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> source = InMemory(gmm, gmm.prepare_data(torch.cat([x[:50] - 5, x[50:] + 5]), fitting=True))
    >>> source.start(gmm._generator(0))
    >>> em_loop(source, max_iter=100, tol=1e-6).converged, source.n_observations
    (True, 100)
    """

    monotone = True

    def __init__(self, model: EMModel, data: Any) -> None:
        self.model = model
        self.data = model._em_data(data)
        self.n_observations = model._n_observations(data)

    def start(self, generator: torch.Generator) -> None:
        """A restart's starting parameters (the model's initialisation on the data)."""
        self.model._em_initialize(self.data, generator)

    def warm(self) -> None:
        """Before a warm start: what the model fits once from all the data, from this data."""
        if isinstance(self.model, DataStatisticsEM):
            self.model._em_set_data_statistics(self.model._em_data_statistics(self.data))

    def e_step(self) -> tuple[Any, torch.Tensor]:
        return self.model._e_step(self.data)

    def m_step(self, stats: Any) -> None:
        self.model._m_step(self.data, stats)


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
    return _restarts(model, InMemory(model, data), n_init, max_iter, tol, warm_start, progress, init_iter)


def fit_source(
    model: EMModel,
    source: Any,
    *,
    n_init: int | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    warm_start: bool | None = None,
    progress: bool | None = None,
    init_iter: int | None = None,
) -> FitResult:
    """Fit ``model`` by :func:`em_loop` on ``source``, keeping the best of ``n_init`` restarts (the options as for
    :func:`run_em`).

    ``source`` is an :class:`EMSource` that can also start (``source.start(generator)``: a restart's starting
    parameters) and prepare a warm start (``source.warm()``): :class:`InMemory`, or the shards of
    :func:`ppmix.distributed.fit_em`.
    """
    return _restarts(model, source, n_init, max_iter, tol, warm_start, progress, init_iter)


def _restarts(
    model: EMModel,
    source: Any,
    n_init: int | None,
    max_iter: int | None,
    tol: float | None,
    warm_start: bool | None,
    progress: bool | None,
    init_iter: int | None,
) -> FitResult:
    """:func:`fit_source`'s work, two frames below the user's call (``fit``, ``fit_em``) that its warnings name."""
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
    n_obs = source.n_observations
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
            if warm:  # statistics of this fit's data, not EM parameters
                source.warm()
            for restart in range(1 if warm else n_init):
                if not warm:
                    source.start(model._generator(restart))
                if restart == 0:  # then by the work of a pass, known once the parameters exist
                    threads.enter_context(torch_threads(threads_for(_pass_work(model, n_obs))))
                best = _better(best, model, source, min(short or max_iter, max_iter), tol, show, restart)
            assert best is not None
            values, result = best[1], best[2]
            tail = short is not None and not result.converged  # small EM: run the best start on to convergence
            if tail or not inference:
                model._set_globals(values)
            if tail:
                rest = em_loop(source, max(max_iter - result.n_iter, 1), tol, show, n_init)
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
            stacklevel=4,
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
        stacklevel=5,
    )
    return False


def _pass_work(model: EMModel, n_obs: int) -> float:
    """The work of one EM pass for the thread policy (:func:`ppmix.ops.threads.threads_for`): rows x values."""
    return float(n_obs) * sum(value.numel() for value in model._get_globals().values())


def _better(
    best: tuple[float, dict[str, torch.Tensor], FitResult] | None,
    model: EMModel,
    source: EMSource,
    iterations: int,
    tol: float,
    show: bool,
    restart: int,
) -> tuple[float, dict[str, torch.Tensor], FitResult]:
    """Run one restart from the model's current parameters; the better of it and ``best``."""
    result = em_loop(source, iterations, tol, show, restart)
    final = result.history[-1]
    logger.info("EM restart %d: objective/point %.6f after %d iterations", restart, final, result.n_iter)
    if beats(final, None if best is None else best[0], getattr(model, "dtype", torch.float64)):
        return final, model._get_globals(), result
    return best


def em_loop(source: EMSource, max_iter: int, tol: float, show: bool = False, restart: int = 0) -> FitResult:
    """The EM loop: an E-step, then up to ``max_iter`` times an M-step and an E-step, from the source's current
    parameters.

    The history holds the objective per observation after every E-step (the first at the start). A monotone
    source (:attr:`EMSource.monotone`) stops when the objective per observation changes by at most ``tol``, and a
    decrease beyond rounding is logged; any source stops when its E-step has no more data.

    Examples
    --------
    >>> class Halving:  # the objective -x**2 climbed by halving x: 1, 0.5, 0.25, ...
    ...     monotone, n_observations, x = True, 1, 1.0
    ...     def e_step(self):
    ...         return None, torch.tensor(-self.x**2)
    ...     def m_step(self, stats):
    ...         self.x /= 2
    >>> result = em_loop(Halving(), max_iter=50, tol=1e-6)
    >>> result.converged, result.n_iter, result.history[:2]
    (True, 11, [-1.0, -0.25])
    """
    stats, objective = source.e_step()
    previous = _finite(objective, 0)
    decrease_tol = _decrease_tol(objective)
    history = [previous / source.n_observations]
    converged = False
    iteration = 0
    with _progress_bar(show, max_iter, restart) as bar:
        for iteration in range(1, max_iter + 1):
            source.m_step(stats)
            step = source.e_step()
            if step is None:  # the end of a stream
                break
            stats, objective = step
            current = _finite(objective, iteration)
            n_obs = source.n_observations
            history.append(current / n_obs)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(objective=f"{history[-1]:.6g}")
            if source.monotone:
                _check_ascent(previous, current, n_obs, iteration, decrease_tol)
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
