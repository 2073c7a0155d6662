"""Shards held in memory where they are read, for iterative algorithms that visit every shard many times.

A *holder* reads each shard once on a worker, keeps it there in the form a model's E-step
wants (``model._em_data(model.prepare_data(X))``), and runs one step on it per call,
returning only small results. Three kinds:

- :class:`InlineHolders`: every shard in this process (``executor="inline"``);
- :class:`ProcessHolders`: shards pinned to worker processes, shard ``i`` to process
  ``i mod W`` (a local pool, ``executor=None`` or ``"processes"``), or cached per process of
  an executor you pass; a killed process is replaced, its shards are read again and the
  step is redone;
- :class:`DaskHolders`: one Dask future per shard (``executor`` a ``dask.distributed.Client``):
  the data stay in the memory of the worker that read them and every step runs there; Dask
  reads the shards of a lost worker again elsewhere.

A shard that cannot be read or has the wrong shape raises a :class:`~ppmix.parallel.TaskInputError`
naming it at once; other failures are retried, then named in a :class:`~ppmix.parallel.TaskError`.
A shard read again (by a replaced worker, by another process of an executor you pass, or by Dask
after losing a worker) must be the one read first: every step checks the digest and the size of
the shard it runs on against the first read, and a changed shard is a
:class:`~ppmix.distributed.shards.ShardChangedError`
naming it, never a fit on two versions of it. Every wait has a ``timeout``
(:func:`~ppmix.parallel.wait_all`). An empty shard (say an empty partition of a Dask DataFrame,
after a filter) is held and skipped.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import multiprocessing
import os
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ppmix.distributed.shards import check_unchanged, read_features, sequence_weights, split_weights_column
from ppmix.engines.capabilities import GlobalObjectiveEM, LabelledRows, SequenceData
from ppmix.parallel import (
    DEFAULT_TIMEOUT,
    MemoryWatch,
    TaskError,
    TaskInputError,
    executor_watch,
    raise_failures,
    stop_pool,
    wait_all,
)

__all__ = [
    "DaskHolders",
    "InlineHolders",
    "ProcessHolders",
    "ShardSummary",
    "ShardTask",
    "StepResult",
    "make_holders",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardTask:
    """One shard: its place in the list, its name (for errors) and its source (a path or data); after its first
    read also its digest and number of units, which every later read must match."""

    index: int
    name: str
    source: Any
    sample_size: int
    target: str | None = None
    first_read: tuple[str, int, int | None] | None = None
    weight: str | None = None

    def read_as(self, summary: ShardSummary) -> ShardTask:
        """This task, bound to the content of its first read."""
        return replace(self, first_read=summary.identity)

    def check(self, summary: ShardSummary) -> None:
        """Raise a :class:`~ppmix.distributed.shards.ShardChangedError` naming the shard if ``summary`` (of a
        read) differs from the first."""
        check_unchanged(self.name, self.first_read, summary.identity, summary.unit)


@dataclass(frozen=True)
class ShardSummary:
    """What reading a shard reports: sizes, a content digest, and a random sample of its units
    (rows, or whole sequences) as ``(X, y)`` (``y`` None without labels), in random order, so that
    any prefix is a uniform sample."""

    name: str
    digest: str
    n_units: int
    n_observations: float
    n_features: int | None
    sample: Any
    seconds: float
    unit: str = "rows"

    @property
    def identity(self) -> tuple[str, int, int | None]:
        """What a later read of the shard must match: its digest, units and features."""
        return self.digest, self.n_units, self.n_features


@dataclass(frozen=True)
class StepResult:
    """One shard's E-step: the M-step statistics, the objective (a sum over its data) and the seconds it took."""

    statistics: Any
    objective: float
    seconds: float


class HeldShard:
    """A shard read and prepared by a model on the worker that holds it."""

    def __init__(self, task: ShardTask, model: Any, source: Any = None) -> None:
        start = time.perf_counter()
        source = task.source if source is None else source
        try:
            if hasattr(source, "dask") and hasattr(source, "compute"):  # a block of a Dask collection
                source = source.compute(scheduler="sync")
            model = copy.deepcopy(model)
            for name in ("n_features_in_", "feature_names_in_"):  # not fitted yet: only the checks it can make
                if not hasattr(model, name):
                    setattr(model, name, None)
            x, y = read_features(source, task.target)
            weights = None
            if task.weight is not None:
                x, weights = split_weights_column(source, x, task.weight)
                if isinstance(model, SequenceData):
                    weights = sequence_weights(x, weights, model.sequence_column)
            if isinstance(x, list) and not isinstance(model, SequenceData):
                raise ValueError(
                    f"shard {task.name} holds sequences (an NPZ with 'lengths'), but {type(model).__name__} takes rows"
                )
            # an empty partition (of a filtered Dask DataFrame, say) or one whose rows all weigh zero: skipped
            if len(x) == 0 or (weights is not None and np.isfinite(weights).all() and not weights.any()):
                logger.info("shard %s is empty (or all its rows weigh zero); skipped", task.name)
                self.data, self.nbytes = None, 0
                unit = "sequences" if isinstance(model, SequenceData) else "rows"
                self.summary = ShardSummary(task.name, "", 0, 0, None, None, time.perf_counter() - start, unit)
                return
            prepared = model.prepare_data(x, y)
            if weights is not None:  # one weight per row, checked (finite, non-negative, not all zero)
                prepared = model._weigh(prepared, weights, fitting=False)
            self.data = model._em_data(prepared)
        except (KeyError, OSError, TypeError, ValueError) as err:  # the shard itself is wrong: a retry cannot help
            raise TaskInputError(str(err)) from err
        row_weight = None if weights is None else prepared.weight
        units, labels = _units(prepared.data if weights is not None else prepared)
        # what holding it costs: the data, and the E-step's caches built on first use (about three times more);
        # Dask reads this (sys.getsizeof) to weigh moving the shard against waiting for its worker
        self.nbytes = 4 * sum(u.nbytes for u in (units if isinstance(units, list) else [units]))
        content = _unit_bytes(units, labels) + (b"" if row_weight is None else row_weight.cpu().numpy().tobytes())
        digest = hashlib.blake2b(content, digest_size=16).hexdigest()
        generator = torch.Generator().manual_seed(int(digest[:8], 16))
        if row_weight is None:
            pick = torch.randperm(len(units), generator=generator)[: task.sample_size].numpy()
        else:  # a weighted resample: the start sees each row in proportion to its weight
            share = (row_weight / row_weight.sum()).cpu()
            pick = torch.multinomial(share, min(task.sample_size, len(units)), replacement=True, generator=generator)
            pick = pick.numpy()
        if isinstance(units, np.ndarray):  # rows: the sample as arrays
            sample = (units[pick], None if labels is None else labels[pick])
        else:  # sequences: the sample as lists
            sample = ([units[i] for i in pick], None if labels is None else [labels[i] for i in pick])
        self.summary = ShardSummary(
            task.name,
            digest,
            len(units),
            model._n_observations(prepared),
            int(units[0].shape[-1]),
            sample,
            time.perf_counter() - start,
            "rows" if isinstance(units, np.ndarray) else "sequences",
        )

    def __sizeof__(self) -> int:
        return self.nbytes

    def step(self, model: Any) -> StepResult:
        """The E-step: the M-step's statistics and the objective's sum over this shard (a model's terms that are
        not sums over the data, ``_em_global_objective``, are left to the driver); no statistics if it is empty."""
        start = time.perf_counter()
        if self.data is None:
            return StepResult(None, 0.0, 0.0)
        stats, objective = model._e_step(self.data)
        if isinstance(model, GlobalObjectiveEM):
            objective = objective - model._em_global_objective(self.summary.n_observations)
        statistics = model._em_statistics(self.data, stats)
        return StepResult(statistics, float(objective), time.perf_counter() - start)

    def data_statistics(self, model: Any) -> StepResult:
        """The statistics a model fits once from all the data before EM (``_em_data_statistics``)."""
        start = time.perf_counter()
        if self.data is None:
            return StepResult(None, 0.0, 0.0)
        return StepResult(model._em_data_statistics(self.data), 0.0, time.perf_counter() - start)

    def run(self, operation: str, model: Any, task: ShardTask) -> StepResult:
        """``operation`` on this shard, once it is checked to be the shard ``task`` first read."""
        task.check(self.summary)
        return getattr(self, operation)(model)


def _units(prepared: Any) -> tuple[Any, Any]:
    """The sampling units of prepared data and their labels (NaN where missing; None without labels):
    the rows of a matrix (arrays), or the sequences of a batch (lists of arrays)."""
    if isinstance(prepared, torch.Tensor):
        return prepared.cpu().numpy(), None
    if isinstance(prepared, LabelledRows):  # features and frame labels
        labels = torch.where(prepared.labels.observed, prepared.labels.y, torch.nan)
        return prepared.x.cpu().numpy(), labels.cpu().numpy()
    sequences = [s.cpu().numpy() for s in prepared.unpad(prepared.x)]
    return sequences, None if prepared.y is None else [s.cpu().numpy() for s in prepared.unpad(prepared.y)]


def _unit_bytes(units: Any, labels: Any) -> bytes:
    parts = list(units) if isinstance(units, list) else [units]
    if labels is not None:
        parts += list(labels) if isinstance(labels, list) else [labels]
    return b"".join(np.ascontiguousarray(part).tobytes() for part in parts)


# ------------------------------------------------------------------ in this process
class InlineHolders:
    """Every shard read and held in this process."""

    def __init__(self, tasks: Sequence[ShardTask], model: Any) -> None:
        self.held = []
        for task in tasks:
            try:
                self.held.append(HeldShard(task, model))
            except TaskInputError as err:
                raise TaskError({task.name: err}) from err
        self.summaries = [h.summary for h in self.held]
        self.tasks = [task.read_as(s) for task, s in zip(tasks, self.summaries)]

    def run(self, operation: str, model: Any) -> list[StepResult]:
        results = []
        for held, task in zip(self.held, self.tasks):
            try:
                results.append(held.run(operation, model, task))
            except TaskInputError as err:
                raise TaskError({task.name: err}) from err
        return results

    def close(self) -> None:
        self.held = []


# ------------------------------------------------------------------ worker processes
#: in a worker process: the shards it holds, by key
_HELD: dict[str, HeldShard] = {}


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def _load_here(key: str, task: ShardTask, model: Any) -> ShardSummary:
    _HELD[key] = HeldShard(task, model)
    return _HELD[key].summary


def _run_here(key: str, task: ShardTask, model: Any, operation: str) -> StepResult:
    held = _HELD.get(key)
    if held is None:  # a replaced process, or an executor that sent this shard elsewhere: read it (again)
        held = _HELD[key] = HeldShard(task, model)
    return held.run(operation, model, task)


def _drop_here(prefix: str) -> None:
    for key in [k for k in _HELD if k.startswith(prefix)]:
        del _HELD[key]


#: what a wait on these functions waits for, in its errors
_WHAT = {_load_here: "reading the shards", _run_here: "a step on the shards"}


class ProcessHolders:
    """Shards pinned to worker processes: our own single-process pools (shard ``i`` on pool ``i mod W``),
    or an executor you pass (each of its processes reads a shard the first time a step needs it there)."""

    def __init__(
        self,
        tasks: Sequence[ShardTask],
        model: Any,
        executor: Executor | None,
        max_workers: int | None,
        retries: int,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.tasks, self.retries, self.timeout = list(tasks), retries, timeout
        self.interrupted = False  # a wait timed out or was interrupted: tasks may still run in our pools
        self.prefix = f"{os.getpid()}-{id(self)}-"
        self.owned = executor is None
        if self.owned:
            workers = max(1, min(max_workers or os.cpu_count() or 1, len(self.tasks)))
            self.threads = max(1, (os.cpu_count() or 1) // workers)
            self.pools: list[Executor] = [self._new_pool() for _ in range(workers)]
        else:
            self.pools = [executor]
        self.summaries = self._run(_load_here, model)
        self.tasks = [task.read_as(s) for task, s in zip(self.tasks, self.summaries)]

    def run(self, operation: str, model: Any) -> list[StepResult]:
        return self._run(_run_here, model, operation)

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn: forking a process whose torch/OpenMP thread pools are running can deadlock
        context = multiprocessing.get_context("spawn")
        return ProcessPoolExecutor(1, mp_context=context, initializer=_set_threads, initargs=(self.threads,))

    def _names(self) -> dict[int, str]:
        return {i: task.name for i, task in enumerate(self.tasks)}

    def _pool_of(self, index: int) -> int:
        return index % len(self.pools)

    def _run(self, fn: Callable[..., Any], model: Any, *args: Any) -> list[Any]:
        """``fn(key, task, model, *args)`` for every shard on its pool; a broken pool is replaced and its shards
        redone."""
        pending = list(range(len(self.tasks)))
        results: dict[int, Any] = {}
        attempts = 0
        while pending:
            futures = {
                i: self.pools[self._pool_of(i)].submit(fn, self.prefix + str(i), self.tasks[i], model, *args)
                for i in pending
            }
            try:
                done, failed = wait_all(futures, self._names(), timeout=self.timeout, what=_WHAT[fn])
            except BaseException:
                self.interrupted = True
                raise
            results.update(done)
            bad = {self.tasks[i].name: err for i, err in failed.items() if isinstance(err, TaskInputError)}
            if bad:  # a bad shard: named at once, not retried
                raise TaskError(bad) from next(iter(bad.values()))
            if not failed:
                break
            attempts += 1
            if attempts > self.retries:
                raise TaskError({self.tasks[i].name: err for i, err in failed.items()})
            broken = {self._pool_of(i) for i, err in failed.items() if isinstance(err, BrokenProcessPool)}
            if broken and not self.owned:
                raise TaskError({self.tasks[i].name: err for i, err in failed.items()})
            for w in broken:
                logger.warning("a worker process died; starting a new one and reading its shards again")
                self.pools[w].shutdown(wait=True, cancel_futures=True)
                self.pools[w] = self._new_pool()
            pending = sorted(failed)  # a replaced process reads its other shards when a step first needs them
            logger.warning("shard step failed for %s; retrying", [self.tasks[i].name for i in pending])
        return [results[i] for i in range(len(self.tasks))]

    def close(self) -> None:
        if self.owned:
            for pool in self.pools:
                if self.interrupted:  # its tasks may run for ever: stopped, not waited for
                    stop_pool(pool)  # type: ignore[arg-type]
                else:
                    pool.shutdown(wait=True, cancel_futures=True)
        else:
            try:
                wait_all({0: self.pools[0].submit(_drop_here, self.prefix)}, {0: "free"}, timeout=self.timeout,
                         what="freeing the shards")  # fmt: skip
            except Exception:  # noqa: BLE001 - only frees memory in a process we do not own
                logger.debug("could not free the shards held by the executor", exc_info=True)


# ------------------------------------------------------------------ Dask
def _dask_hold(task: ShardTask, model: Any, source: Any = None) -> HeldShard:
    return HeldShard(task, model, source)


def _dask_summary(held: HeldShard) -> ShardSummary:
    return held.summary


def _same(value: Any) -> Any:
    return value


def _dask_run(held: HeldShard, model: Any, operation: str, task: ShardTask) -> StepResult:
    return held.run(operation, model, task)


class DaskHolders:
    """One future per shard on a Dask cluster: the shard stays in the memory of the worker that read it,
    and each step runs there (Dask reads a lost worker's shards again elsewhere)."""

    def __init__(
        self,
        tasks: Sequence[ShardTask],
        model: Any,
        client: Any,
        retries: int,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.client, self.tasks, self.retries, self.timeout = client, list(tasks), retries, timeout
        self.watch: MemoryWatch | None = executor_watch(client, retries)
        # blocks of a Dask collection are computed on the cluster and handed to the task there, never gathered here
        sources = [client.compute(t.source) if hasattr(t.source, "dask") else None for t in self.tasks]
        self.held = [
            client.submit(_dask_hold, task, model, source, pure=False, retries=retries)
            for task, source in zip(self.tasks, sources)
        ]
        futures = {i: client.submit(_dask_summary, h, pure=False) for i, h in enumerate(self.held)}
        summaries, failed = self._wait(futures, "reading the shards")
        if failed:
            raise_failures({self.tasks[i].name: err for i, err in failed.items()}, self.watch)
        self.summaries = [summaries[i] for i in range(len(self.tasks))]
        self.tasks = [task.read_as(s) for task, s in zip(self.tasks, self.summaries)]

    def run(self, operation: str, model: Any) -> list[StepResult]:
        """``operation`` on every shard where it is held; steps lost with a worker are redone (``retries`` times)."""
        results: dict[int, StepResult] = {}
        pending, attempts = list(range(len(self.tasks))), 0
        while True:
            # the model as a task, not scattered and broadcast: a broadcast to a worker that is dying can stall for
            # ever, a scattered copy lost with its worker is gone; a task's result is computed again where needed
            shared = self.client.submit(_same, model, pure=False)
            try:
                holders = self.client.who_has([self.held[i] for i in pending])
            except (OSError, TimeoutError) as err:  # the scheduler could not answer: the round is redone below
                failed = dict.fromkeys(pending, err)
            else:
                futures = {i: self._submit(i, holders, shared, operation) for i in pending}
                done, failed = self._wait(futures, f"a step ({operation}) on the shards")
                results.update(done)
            if not failed:
                return [results[i] for i in range(len(self.tasks))]
            attempts += 1
            if attempts > self.retries:
                raise_failures({self.tasks[i].name: err for i, err in failed.items()}, self.watch)
            logger.warning("shard steps lost (%s); redoing them", sorted({type(e).__name__ for e in failed.values()}))
            pending = sorted(failed)

    def _wait(self, futures: dict[int, Any], what: str) -> tuple[dict[int, Any], dict[int, BaseException]]:
        """The values and errors of ``futures``; a bad shard is named at once (a retry cannot help)."""
        names = {i: task.name for i, task in enumerate(self.tasks)}
        done, failed = wait_all(futures, names, timeout=self.timeout, what=what, watch=self.watch)
        bad = {names[i]: err for i, err in failed.items() if isinstance(err, TaskInputError)}
        if bad:
            raise TaskError(bad) from next(iter(bad.values()))
        return done, failed

    def _submit(self, i: int, holders: dict[str, Any], model: Any, operation: str) -> Any:
        # on the worker that holds the shard (moving it would copy the whole shard); elsewhere only if that worker
        # is gone, and then Dask reads the shard again where it recomputes it
        held = self.held[i]
        where = list(holders.get(held.key, ())) or None
        return self.client.submit(
            _dask_run,
            held,
            model,
            operation,
            self.tasks[i],
            pure=False,
            retries=self.retries,
            workers=where,
            allow_other_workers=True,
        )

    def close(self) -> None:
        for future in self.held:
            future.release()
        self.held = []


def make_holders(
    tasks: Sequence[ShardTask],
    model: Any,
    executor: Any,
    max_workers: int | None,
    retries: int,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> InlineHolders | ProcessHolders | DaskHolders:
    """The holders for ``executor``: ``"inline"``; ``None``/``"processes"`` (our pinned pools); a
    ``concurrent.futures.Executor``; or a ``dask.distributed.Client``. ``timeout``: the seconds each
    wait on the executor may last (see :func:`~ppmix.parallel.wait_all`)."""
    if executor == "inline":
        return InlineHolders(tasks, model)
    if executor is None or executor == "processes":
        return ProcessHolders(tasks, model, None, max_workers, retries, timeout)
    if isinstance(executor, Executor):
        return ProcessHolders(tasks, model, executor, max_workers, retries, timeout)
    if hasattr(executor, "submit") and hasattr(executor, "scatter"):  # dask.distributed.Client
        return DaskHolders(tasks, model, executor, retries, timeout)
    raise TypeError(
        "executor must be None or 'processes' (a local process pool), 'inline', a concurrent.futures.Executor "
        f"or a dask.distributed.Client; got {type(executor).__name__}"
    )
