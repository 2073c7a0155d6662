"""Run independent tasks on any executor: a local process pool, a Dask client, or in-process.

One mechanism serves every method that trains pieces in parallel (the K components of
PRESTO, the M local fits of distributed mixture-of-experts training). Results come back
in the order the tasks were given, whatever order they finish in; each carries the
seconds it spent inside the worker, so callers can report critical-path times. A task
that raises is retried, and tasks that still fail are named together in one
:class:`TaskError` — no partial result is returned silently.

Every wait on an executor goes through :func:`wait_all`: it has a ``timeout`` (an
:class:`ExecutorTimeoutError` naming the tasks that did not finish, never a hang), and on a
Dask cluster a :class:`MemoryWatch` turns workers that keep being restarted for exceeding
their memory limit into a :class:`WorkerMemoryError` instead of an endless loop.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

__all__ = [
    "DEFAULT_TIMEOUT",
    "ExecutorTimeoutError",
    "MemoryWatch",
    "TaskError",
    "TaskInputError",
    "TaskResult",
    "WorkerMemoryError",
    "check_timeout",
    "executor_watch",
    "raise_failures",
    "run_tasks",
    "shutdown_pools",
    "stop_pool",
    "wait_all",
]

logger = logging.getLogger(__name__)

#: seconds one wait on an executor may last by default (a round of tasks: a step on every shard, a batch of
#: local fits): far above what a task of ppmix takes, it turns a lost or stuck cluster into an error, not a hang
DEFAULT_TIMEOUT = 3600.0
#: seconds between two looks of a wait at its :class:`MemoryWatch`
POLL_SECONDS = 1.0

Key = TypeVar("Key", bound=Hashable)


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


class ExecutorTimeoutError(TimeoutError):
    """A wait on an executor outlasted its ``timeout``; ``pending`` names the tasks that had not finished."""

    def __init__(self, what: str, pending: Sequence[str], timeout: float) -> None:
        self.pending = list(pending)
        super().__init__(
            f"{what}: {len(self.pending)} task(s) did not finish within timeout={timeout:g} s "
            f"({', '.join(self.pending)}); the executor may have lost its workers or be stuck "
            "(raise `timeout` if the tasks are only slow)"
        )


class WorkerMemoryError(RuntimeError):
    """Workers of a Dask cluster were restarted for exceeding their memory limit: the tasks' inputs are not at
    fault, the workers need more memory (``memory_limit``) or the tasks smaller inputs."""


class MemoryWatch:
    """Watches a Dask cluster for workers its nannies restart for exceeding their memory limit.

    Calling it logs every new restart and raises a :class:`WorkerMemoryError` once there were more
    than ``allowed`` of them since it was made; :meth:`error` is that error after any restart (for
    a wait whose tasks failed), or None.
    """

    topic = "worker-restart-memory"

    def __init__(self, client: Any, allowed: int) -> None:
        self.client, self.allowed = client, allowed
        self.restarts: list[dict[str, Any]] = []
        self.seen = {self._key(stamp, event) for stamp, event in self._events()}
        self.limits = self._limits()  # now: the workers restarted later may be down when the error is made

    def _limits(self) -> set[int]:
        """The memory limits of the cluster's workers (bytes; none if they cannot be read)."""
        try:
            workers = self.client.scheduler_info()["workers"].values()
        except Exception:  # noqa: BLE001 - the limits only make the message more helpful
            return set()
        return {int(w["memory_limit"]) for w in workers if w.get("memory_limit")}

    def _events(self) -> list[tuple[float, dict[str, Any]]]:
        try:
            return list(self.client.get_events(self.topic))
        except Exception:  # noqa: BLE001 - a scheduler that cannot answer: the wait's timeout still holds
            logger.debug("could not read the Dask scheduler's events", exc_info=True)
            return []

    @staticmethod
    def _key(stamp: float, event: dict[str, Any]) -> tuple[Any, ...]:
        return stamp, event.get("worker"), event.get("pid")

    def __call__(self) -> None:
        for stamp, event in self._events():
            if self._key(stamp, event) not in self.seen:
                self.seen.add(self._key(stamp, event))
                self.restarts.append(event)
                logger.warning(
                    "Dask worker %s was restarted for exceeding its memory limit (%.0f MiB in use)",
                    event.get("worker"), event.get("rss", 0) / 2**20,
                )  # fmt: skip
        if len(self.restarts) > self.allowed:
            raise self.error()  # type: ignore[misc]

    def error(self) -> WorkerMemoryError | None:
        """The error naming the restarts so far, or None without any."""
        if not self.restarts:
            return None
        limits = sorted(self.limits | self._limits())
        largest = max(event.get("rss", 0) for event in self.restarts) / 2**20
        limit = f" (memory_limit {', '.join(f'{m / 2**20:.0f} MiB' for m in limits)})" if limits else ""
        return WorkerMemoryError(
            f"{len(self.restarts)} Dask worker restart(s) for exceeding the memory limit{limit}, up to "
            f"{largest:.0f} MiB in use: give the workers more memory (memory_limit) or use smaller inputs"
        )


def wait_all(
    futures: Mapping[Key, Any],
    names: Mapping[Key, str],
    *,
    timeout: float | None,
    what: str,
    watch: Callable[[], None] | None = None,
) -> tuple[dict[Key, Any], dict[Key, BaseException]]:
    """Wait for every future (``concurrent.futures`` or Dask), ``timeout`` seconds at most in all.

    Parameters
    ----------
    futures : mapping
        The futures, by key.
    names : mapping
        The name of each key's task, for the error.
    timeout : float or None
        Seconds the whole wait may last; None waits for ever.
    what : str
        What is waited for (the start of the error's message).
    watch : callable, optional
        Called about every :data:`POLL_SECONDS` while waiting, and once at the end if a task
        failed; it may raise (e.g. a :class:`MemoryWatch`).

    Returns
    -------
    values, errors : dict, dict
        Each key's value, or the exception its task raised.

    Raises
    ------
    ExecutorTimeoutError
        If tasks are still running after ``timeout`` seconds; it names them.

    Examples
    --------
    >>> from concurrent.futures import Future
    >>> never = Future()
    >>> wait_all({0: never}, {0: "stuck"}, timeout=0.01, what="a test")
    Traceback (most recent call last):
    ...
    ppmix.parallel.ExecutorTimeoutError: a test: 1 task(s) did not finish within timeout=0.01 s (stuck); ...
    """
    check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    values: dict[Key, Any] = {}
    errors: dict[Key, BaseException] = {}
    for key, future in futures.items():
        while key not in values and key not in errors:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                pending = [names[k] for k in futures if k not in values and k not in errors]
                raise ExecutorTimeoutError(what, pending, float(timeout))  # type: ignore[arg-type]
            wait = remaining if watch is None else min(POLL_SECONDS, remaining or POLL_SECONDS)
            try:
                values[key] = future.result(timeout=wait)
            except TimeoutError as err:
                if not future.done():  # our wait ran out, not the task
                    if watch is not None:
                        watch()
                elif _raised_timeout(future, wait):  # the task's own TimeoutError
                    errors[key] = err
                # else it finished just now: its outcome is fetched on the next turn
            except Exception as err:  # noqa: BLE001 - the task's error, for the caller to retry or name
                errors[key] = err
    if errors and watch is not None:
        watch()
    return values, errors


def check_timeout(timeout: Any) -> None:
    """Refuse a ``timeout`` that is not a positive number of seconds or None."""
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if timeout is not None and not (number and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None; got {timeout!r}")


def _raised_timeout(future: Any, wait: float | None) -> bool:
    """Whether a finished future's task raised a TimeoutError itself."""
    try:
        return isinstance(future.exception(timeout=wait), TimeoutError)
    except TimeoutError:  # its outcome is still on its way (a Dask worker): not known to be one
        return False


def executor_watch(executor: Any, allowed: int) -> MemoryWatch | None:
    """A :class:`MemoryWatch` for a Dask client (``allowed`` restarts for memory before it raises), else None."""
    return MemoryWatch(executor, allowed) if hasattr(executor, "get_events") else None


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


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a local process pool now, its workers killed: what a wait that timed out (its tasks still running)
    or an interrupt leaves behind, so that no worker outlives it (and the interpreter's exit does not wait)."""
    processes = list((pool._processes or {}).values())  # before shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


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
        _, errors = wait_all({0: pool.submit(int)}, {0: "a check"}, timeout=DEFAULT_TIMEOUT, what="the process pool")
    except BrokenProcessPool:  # raised by submit
        return True
    return isinstance(errors.get(0), BrokenProcessPool)


def run_tasks(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    names: Sequence[str] | None = None,
    *,
    executor: Any = None,
    retries: int = 1,
    max_workers: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
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
    timeout : float or None, default DEFAULT_TIMEOUT (one hour)
        Seconds one round of tasks (the first submission, then each round of retries) may
        take; None waits for ever.

    Returns
    -------
    list of TaskResult

    Raises
    ------
    TaskError
        If any task fails ``retries + 1`` times; every failed task is named.
    ExecutorTimeoutError
        If a round of tasks outlasts ``timeout``; the unfinished tasks are named.
    WorkerMemoryError
        If Dask workers were restarted for exceeding their memory limit (more than
        ``retries`` times, or while tasks failed).

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
    check_timeout(timeout)
    pool, owned = _as_executor(executor, max_workers)
    watch = executor_watch(executor, retries)
    try:
        pending = {i: pool.submit(_timed_call, fn, item) for i, item in enumerate(items)}
        attempts = dict.fromkeys(pending, 1)
        results: dict[int, TaskResult] = {}
        failures: dict[str, BaseException] = {}
        while pending:
            to_retry: list[int] = []
            done, errors = wait_all(pending, dict(enumerate(names)), timeout=timeout, what="run_tasks", watch=watch)
            for i in pending:
                if i in errors:
                    err = errors[i]
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
                value, seconds = done[i]
                results[i] = TaskResult(names[i], value, seconds, attempts[i])
            if to_retry and owned and isinstance(pool, ProcessPoolExecutor) and _is_broken(pool):
                logger.warning("a worker died and broke the process pool; starting a new one")
                pool = _shared_pool(max_workers, replace=True)
            pending = {i: pool.submit(_timed_call, fn, items[i]) for i in to_retry}
    except BaseException:
        if owned and isinstance(pool, ProcessPoolExecutor):  # interrupted or timed out: stop it, start afresh next
            _SHARED_POOLS.pop(max_workers, None)
            stop_pool(pool)
        raise
    if failures:
        raise_failures(failures, watch)
    return [results[i] for i in range(len(items))]


def raise_failures(failures: dict[str, BaseException], watch: MemoryWatch | None) -> None:
    """Raise the :class:`TaskError` naming ``failures``, or a :class:`WorkerMemoryError` (from it) when Dask workers
    were restarted for memory meanwhile: then the workers, not the tasks, are at fault."""
    error = TaskError(failures)
    memory = None if watch is None else watch.error()
    if memory is not None and not all(isinstance(err, TaskInputError) for err in failures.values()):
        raise memory from error
    raise error
