"""Run independent tasks on any executor: a local process pool, a Dask client, or in-process.

One mechanism serves every method that trains pieces in parallel (the K components of
PRESTO, the M local fits of distributed mixture-of-experts training). Results come back
in the order the tasks were given, whatever order they finish in; each carries the
seconds it spent inside the worker, so callers can report critical-path times. A task
that raises is retried, and tasks that still fail are named together in one
:class:`TaskError` — no partial result is returned silently.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["TaskError", "TaskInputError", "TaskResult", "run_tasks", "shutdown_pools"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskResult:
    """The value of one task, the seconds it ran inside its worker and how many attempts it took."""

    name: str
    value: Any
    seconds: float
    attempts: int


class TaskError(RuntimeError):
    """Raised when tasks still fail after their retries; ``failures`` maps each task name to its error."""

    def __init__(self, failures: dict[str, BaseException]) -> None:
        self.failures = failures
        lines = "; ".join(f"{name}: {type(err).__name__}: {err}" for name, err in failures.items())
        retried = not all(isinstance(err, TaskInputError) for err in failures.values())
        super().__init__(f"{len(failures)} task(s) failed{' after retrying' if retried else ''}: {lines}")


class TaskInputError(ValueError):
    """Raised by a task whose input is wrong (a malformed shard, a missing column): retrying cannot help,
    so :func:`run_tasks` reports it at once instead of resubmitting it."""


def _timed_call(fn: Callable[[Any], Any], item: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn(item)
    return value, time.perf_counter() - start


class _InlineExecutor(Executor):
    """Runs each task at submission, in this process (no pickling, no parallelism)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - delivered through the future like a real executor
            future.set_exception(err)
        return future


def _process_pool(max_workers: int | None) -> ProcessPoolExecutor:
    # spawn: forking a process whose torch/OpenMP thread pools are running can deadlock
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"))


#: the local process pools of this session, by size: started on first use, kept for later calls (a pool's
#: start-up, spawning workers that import torch and ppmix, costs seconds), replaced when a worker died
_SHARED_POOLS: dict[int | None, ProcessPoolExecutor] = {}


def _shared_pool(max_workers: int | None, *, replace: bool = False) -> ProcessPoolExecutor:
    """The session's local process pool of ``max_workers`` workers; a new one if asked, or if a worker died."""
    pool = _SHARED_POOLS.get(max_workers)
    if pool is not None and (replace or _is_broken(pool)):
        pool.shutdown(wait=False, cancel_futures=True)
        pool = None
    if pool is None:
        pool = _SHARED_POOLS[max_workers] = _process_pool(max_workers)
    return pool


def shutdown_pools() -> None:
    """Stop the local process pools that ``executor=None`` started (they are kept for later calls, and stopped
    at exit): frees their workers' memory.

    Examples
    --------
    >>> shutdown_pools()
    """
    while _SHARED_POOLS:
        _SHARED_POOLS.popitem()[1].shutdown(wait=True, cancel_futures=True)


atexit.register(shutdown_pools)


def _as_executor(executor: Any, max_workers: int | None) -> tuple[Executor, bool]:
    """Normalise ``executor`` to a ``concurrent.futures.Executor``; the flag says whether it is ours (the shared
    local pool, or inline), to replace when a worker dies."""
    if executor is None:
        return _shared_pool(max_workers), True
    if executor == "inline":
        return _InlineExecutor(), True
    if isinstance(executor, Executor):
        return executor, False
    if hasattr(executor, "get_executor"):  # dask.distributed.Client
        return executor.get_executor(), False
    raise TypeError(
        "executor must be None (a local process pool), 'inline', a concurrent.futures.Executor "
        f"or a dask.distributed.Client; got {type(executor).__name__}"
    )


def _is_broken(pool: ProcessPoolExecutor) -> bool:
    """Whether submitting to ``pool`` would fail because a worker died."""
    try:
        pool.submit(int).result()
    except BrokenProcessPool:
        return True
    return False


def run_tasks(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    names: Sequence[str] | None = None,
    *,
    executor: Any = None,
    retries: int = 1,
    max_workers: int | None = None,
) -> list[TaskResult]:
    """Apply ``fn`` to every item on an executor and return the results in input order.

    Parameters
    ----------
    fn : callable
        A picklable function of one argument (module-level for process pools and Dask).
    items : sequence
        The task inputs.
    names : sequence of str, optional
        One name per item, used in logs and errors (default ``task-0``, ``task-1``, ...).
    executor : None, 'inline', concurrent.futures.Executor or dask.distributed.Client
        Where to run. ``None``: the session's local process pool of ``max_workers`` workers,
        started on first use and kept for later calls (:func:`shutdown_pools` stops it);
        ``'inline'``: in this process; an executor or a Dask client you pass is left running.
    retries : int
        How many times a failing task is resubmitted before it counts as failed (a
        :class:`TaskInputError` is never resubmitted). A worker
        that dies (killed, out of memory) breaks a process pool: when the pool is ours it is
        replaced and the tasks it lost are resubmitted under the same budget; a broken pool
        you passed is reported as such, naming the tasks.
    max_workers : int, optional
        Pool size when ``executor`` is ``None``.

    Returns
    -------
    list of TaskResult

    Raises
    ------
    TaskError
        If any task fails ``retries + 1`` times; every failed task is named.

    Examples
    --------
    >>> [r.value for r in run_tasks(abs, [-1, 2, -3], executor="inline")]
    [1, 2, 3]
    """
    items = list(items)
    names = [f"task-{i}" for i in range(len(items))] if names is None else [str(n) for n in names]
    if len(names) != len(items):
        raise ValueError(f"names has {len(names)} entries but items has {len(items)}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0; got {retries}")
    pool, owned = _as_executor(executor, max_workers)
    try:
        pending = {i: pool.submit(_timed_call, fn, item) for i, item in enumerate(items)}
        attempts = dict.fromkeys(pending, 1)
        results: dict[int, TaskResult] = {}
        failures: dict[str, BaseException] = {}
        while pending:
            to_retry: list[int] = []
            for i, future in pending.items():
                try:
                    value, seconds = future.result()
                except Exception as err:  # noqa: BLE001 - any task error is retried, then reported by name
                    if isinstance(err, BrokenProcessPool) and not owned:
                        err = BrokenProcessPool(f"the executor's process pool broke (a worker died): {err}")
                    broken_pool_not_ours = isinstance(err, BrokenProcessPool) and not owned
                    retryable = not isinstance(err, TaskInputError) and not broken_pool_not_ours
                    if attempts[i] <= retries and retryable:
                        logger.warning("task %s failed (%s: %s); retrying", names[i], type(err).__name__, err)
                        attempts[i] += 1
                        to_retry.append(i)
                    else:
                        failures[names[i]] = err
                    continue
                results[i] = TaskResult(names[i], value, seconds, attempts[i])
            if to_retry and owned and isinstance(pool, ProcessPoolExecutor) and _is_broken(pool):
                logger.warning("a worker died and broke the process pool; starting a new one")
                pool = _shared_pool(max_workers, replace=True)
            pending = {i: pool.submit(_timed_call, fn, items[i]) for i in to_retry}
    except BaseException:
        if owned and isinstance(pool, ProcessPoolExecutor):  # interrupted: drop its queued tasks, start afresh next
            _SHARED_POOLS.pop(max_workers, None)
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    if failures:
        raise TaskError(failures)
    return [results[i] for i in range(len(items))]
