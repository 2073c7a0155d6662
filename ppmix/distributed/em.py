"""Exact EM on data shards that stay where they are read: GMM and HMM beyond one machine's memory.

EM's E-step statistics are sums over the data, so one EM iteration on shards is a
map-reduce: every worker runs the E-step on the shards it holds and returns the M-step's
statistics (:meth:`_em_statistics`: counts, weighted means and scatters, expected transition
counts), the driver merges them exactly (:func:`~ppmix.components.family.merge_statistics`,
a tree in shard order), runs the M-step (:meth:`_em_update`) and sends the new parameters
back. The objective is the same sum, so the fit equals in-memory EM from the same start up to
rounding, for any number and order of shards. Only parameters and statistics travel: per
iteration ``O(K D^2)`` numbers per shard, independent of the number of rows.

**Initialisation** without gathering the data: every shard returns a uniform random sample of
its units (rows, or whole sequences for an HMM) when it is read; the driver keeps from each
a share proportional to its size (about ``sample_size`` units in all, in content-digest
order, so the start does not depend on the order of the shards) and runs the model's own
initialisation on that sample (k-means, ``n_init`` restarts seeded as in memory). Its cost
is one k-means on ``sample_size`` rows; the relative variance floor is also measured on the
sample. A model fitted before (``warm_start=True``) starts from its parameters instead. What the sample may miss is
measured over every shard: a categorical family's number of levels (the largest code of any shard plus one, the
distinct codes of every shard merged), so a level that occurs only in a shard outside the sample is no error.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ppmix.components.categorical import CategoricalFamily, distinct_codes, measured_levels
from ppmix.components.family import merge_statistics
from ppmix.components.family_tools import data_rows
from ppmix.distributed.holders import ShardSummary, ShardTask, make_holders
from ppmix.distributed.shards import shard_columns
from ppmix.engines.capabilities import DataStatisticsEM, GlobalObjectiveEM, SequenceData, ShardableEM
from ppmix.engines.em import run_em
from ppmix.models._missing import PartlyObserved
from ppmix.models._weights import split_weights
from ppmix.parallel import DEFAULT_TIMEOUT, TaskError, TaskInputError, check_timeout

__all__ = ["fit_em", "merge_in_tree"]

logger = logging.getLogger(__name__)

#: units (rows, or sequences) the initialisation sees by default
DEFAULT_SAMPLE_SIZE = 20_000
#: the EM settings ``fit_em`` passes on to :func:`~ppmix.engines.em.run_em`
EM_OPTIONS = frozenset({"n_init", "max_iter", "tol", "progress", "warm_start"})


def merge_in_tree(statistics: Sequence[Any]) -> Any:
    """Merge per-shard statistics pairwise, level by level (a tree sum, in the given order).

    Examples
    --------
    >>> merge_in_tree([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)]).item()
    6.0
    """
    items = list(statistics)
    if not items:
        raise ValueError("no statistics to merge")
    while len(items) > 1:
        pairs = [items[i : i + 2] for i in range(0, len(items), 2)]
        items = [merge_statistics(*pair) if len(pair) == 2 else pair[0] for pair in pairs]
    return items[0]


class _ShardedEM:
    """The EM protocol of :func:`~ppmix.engines.em.run_em` over held shards: the E-step runs
    on every shard and the statistics merge; the M-step and the initialisation run here."""

    def __init__(self, model: Any, holders: Any, start_data: Any, n_observations: int, data_stats: Any) -> None:
        self.model, self.holders, self.start_data, self.total = model, holders, start_data, n_observations
        self.data_stats = data_stats
        self.step_seconds: list[list[float]] = []
        self.iteration_seconds: list[float] = []

    def __getattr__(self, name: str) -> Any:  # the settings, get_globals/set_globals, generator
        return getattr(self.model, name)

    def _em_data(self, data: Any) -> Any:
        return data

    def _n_observations(self, data: Any) -> int:
        return self.total

    def _em_initialize(self, data: Any, generator: torch.Generator) -> None:
        self.model._em_initialize(self.start_data, generator)
        self._em_set_data_statistics(self.data_stats)

    def _em_data_statistics(self, data: Any) -> Any:
        """What the model fits once from all the data (merged from every shard before EM; None if nothing)."""
        return self.data_stats

    def _em_set_data_statistics(self, stats: Any) -> None:
        if stats is not None:  # what the model fits once from all the data, not from the sample
            self.model._em_set_data_statistics(stats)

    def _e_step(self, data: Any) -> tuple[Any, torch.Tensor]:
        start = time.perf_counter()
        results = self.holders.run("step", self.model)
        self.step_seconds.append([r.seconds for r in results])
        merged = merge_in_tree(_statistics(results))
        objective = math.fsum(r.objective for r in results)
        if isinstance(self.model, GlobalObjectiveEM):
            objective += float(self.model._em_global_objective(self.total))
        self.iteration_seconds.append(time.perf_counter() - start)
        return merged, torch.tensor(objective, dtype=torch.float64)

    def _m_step(self, data: Any, stats: Any) -> None:
        self.model._em_update(stats)


def _statistics(results: Sequence[Any]) -> list[Any]:
    """The statistics of the shards' step results, those of empty shards left out."""
    return [r.statistics for r in results if r.statistics is not None]


class _ShardCodes:
    """Stands in for the model in a pass over the held shards (``holders.run("data_statistics", ...)``): each
    shard's distinct level codes per feature (:func:`~ppmix.components.categorical.distinct_codes`) of
    the family's rows (a mixture's) or frames (an HMM's)."""

    def __init__(self, family: CategoricalFamily) -> None:
        self.family = family

    def _em_data_statistics(self, data: Any) -> list[torch.Tensor]:
        inner = split_weights(data)[0]
        frames = getattr(inner, "frames", inner)
        rows = frames.x if isinstance(frames, PartlyObserved) else data_rows(frames)
        return distinct_codes(rows)


def _levels_over_shards(model: Any, holders: Any) -> int | None:
    """The number of levels of a categorical family measured over every shard (the distinct codes of each merged;
    id-like codes refused, :func:`~ppmix.components.categorical.measured_levels`); None for any other
    family, or one whose ``n_levels`` is given (every shard was checked against it when read)."""
    get_family = getattr(model, "_component_family", None)
    if get_family is None:
        return None
    earlier = hasattr(model, "_data_scale")  # the family of the constructor's arguments, not an earlier fit's
    with model._overriding("_data_scale", {}) if earlier else contextlib.nullcontext():
        family = get_family()
    if not isinstance(family, CategoricalFamily) or family.n_levels is not None:
        return None
    per_shard = _statistics(holders.run("data_statistics", _ShardCodes(family)))
    merged = [torch.unique(torch.cat(parts)) for parts in zip(*per_shard, strict=True)]
    return measured_levels(merged, "the shards")


def _record_levels(model: Any, levels: int | None) -> None:
    """The model's data scale (measured on the start sample) with ``n_levels`` measured over every shard."""
    if levels is None:
        return
    scale = dict(model._scale)
    scale["n_levels"] = torch.tensor(float(levels), dtype=model.dtype, device=model._device)
    model._take_data_scale(lambda family: scale)


def _shard_name(shard: Any, index: int) -> str:
    return str(shard) if isinstance(shard, (str, Path)) else f"shard-{index}"


def _start_sample(summaries: list[ShardSummary], sample_size: int, weighted: bool = False) -> tuple[Any, Any]:
    """About ``sample_size`` units ``(X, y)``, from every shard in proportion to its size (its total weight where
    ``weighted``: each shard's sample is then a weighted resample of its rows), in digest order."""
    size = (lambda s: s.n_observations) if weighted else (lambda s: s.n_units)
    total = sum(size(s) for s in summaries)
    xs, ys = [], []
    for summary in sorted((s for s in summaries if s.n_units), key=lambda s: s.digest):
        x, y = summary.sample
        take = min(len(x), max(1, round(sample_size * size(summary) / total)))
        xs.append(x[:take])
        ys.append(None if y is None else y[:take])
    if any(y is None for y in ys) or not any(_has_label(y) for y in ys):
        ys = None  # no label in the sample (e.g. a pf model fitted without target=): fit it without labels
    if isinstance(xs[0], np.ndarray):
        return np.concatenate(xs), None if ys is None else np.concatenate(ys)
    return [u for part in xs for u in part], None if ys is None else [u for part in ys for u in part]


def _has_label(y: Any) -> bool:
    """Whether the labels of rows (an array) or of sequences (a list of arrays) hold any value that is not NaN."""
    parts = y if isinstance(y, list) else [y]
    return any(not np.isnan(np.asarray(part, dtype=float)).all() for part in parts)


def _as_shards(shards: Any) -> tuple[list[Any], list[str] | None]:
    """A list of shards and, for a Dask DataFrame, its column names: a Dask array (chunks of rows) or
    DataFrame gives one shard per block/partition."""
    if hasattr(shards, "to_delayed") and hasattr(shards, "dask"):
        if hasattr(shards, "numblocks"):  # dask.array: whole rows per block
            shards = shards.rechunk({1: -1}) if shards.ndim == 2 and shards.numblocks[1] > 1 else shards
            return list(shards.to_delayed().ravel()), None
        return list(shards.to_delayed()), [str(c) for c in shards.columns]
    return list(shards), None


def _check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - EM_OPTIONS)
    if unknown:
        raise TypeError(f"fit_em got unexpected options {unknown}; it takes {sorted(EM_OPTIONS)}")


def fit_em(
    model: Any,
    shards: Sequence[Any],
    *,
    executor: Any = None,
    max_workers: int | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    retries: int = 1,
    target: str | None = None,
    weight: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    **options: Any,
) -> Any:
    """Fit ``model`` (GMM, HMM, PFGMM, SupervisedGMM, PFHMM, SupervisedHMM) by exact EM on shards.

    Every shard is read once, where it is held (a worker process or a Dask worker), and
    stays there in memory; per iteration only the parameters go out and the M-step's
    statistics come back (see the module documentation). The fit equals in-memory EM from
    the same start up to rounding.

    Parameters
    ----------
    model : GMM, HMM or a pf model
        Its settings (``n_components``, ``covariance_type``, ``n_init``, ``max_iter``,
        ``tol``, ``seed``, ``warm_start``, ...) apply as in ``fit``; a pf-GMM's
        ``n_restarts`` does not (one start), and its ``switch_prior`` must be a number.
    shards : sequence
        Paths to Parquet/CSV files (every column a feature; for an HMM also its
        ``sequence_column``), NPY files of rows, NPZ files with ``X`` (and ``lengths`` for
        sequences), or data in memory (arrays, DataFrames, lists of sequences); or a Dask
        array or DataFrame, one shard per block (on a Dask client computed on the workers,
        never gathered on the driver). Every shard must have the first shard's columns
        (reordered by name when named). An empty shard (e.g. an empty partition after a
        filter) is skipped; if all are empty, the fit is refused. A shard read again during
        the fit (by a replaced worker) must be the one read first (its digest and size),
        else a :class:`~ppmix.distributed.shards.ShardChangedError` names it.
    executor : None, "processes", "inline", concurrent.futures.Executor or dask.distributed.Client
        ``None``/``"processes"``: local worker processes, shard ``i`` pinned to process
        ``i mod W``; ``"inline"``: this process; an executor you pass (each of its
        processes reads a shard when a step first needs it there); a Dask client: one
        future per shard, the shards in the workers' memory. A killed worker's shards are
        read again and the iteration is redone; a shard that cannot be read is named.
    max_workers : int, optional
        Local processes (default: the number of CPUs, at most one per shard).
    sample_size : int, default 20000
        Units (rows, or sequences) of the initialisation sample.
    retries : int, default 1
        Attempts after a failure, per step.
    target : str, optional
        The label column (array in NPZ files) of a supervised model's shards (the pf
        models); in-memory shards are then ``(X, y)`` pairs. None: the shards hold features only.
    weight : str, optional
        The column (Parquet/CSV files, DataFrames) or NPZ array of every shard holding one sample weight per row
        (``GMM``, ``Mixture``, ``PFGMM``, ``SupervisedGMM``) or per sequence (``HMM``, ``PFHMM``,
        ``SupervisedHMM``: one per sequence, or one per row equal within each sequence): the fit is ``fit(X, y,
        sample_weight=w)`` on all the data at once (an integer weight counts the row or sequence that many times,
        zero drops it); the start's sample is drawn in proportion to the weights.
    timeout : float or None, default one hour
        Seconds each wait on the executor may last (reading the shards, one step on all of
        them); past it an :class:`~ppmix.parallel.ExecutorTimeoutError` names the shards
        still running, instead of a hang. None waits for ever. On a Dask cluster, workers
        restarted for exceeding their memory limit more than ``retries`` times raise a
        :class:`~ppmix.parallel.WorkerMemoryError`.
    **options
        ``n_init``, ``max_iter``, ``tol``, ``progress``: override the model's values.

    Returns
    -------
    model
        Fitted, with ``fit_report_``: per shard its size and the seconds of reading it and
        of its E-steps, and ``iteration_seconds``, the seconds of every distributed E-step
        (``n_iter_ + 1`` of them: the first at the start).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> rng = np.random.default_rng(0)
    >>> shards = [np.r_[rng.normal(size=(100, 2)), rng.normal(size=(100, 2)) + 5] for _ in range(3)]
    >>> gmm = fit_em(GMM(2, seed=0, progress=False), shards, executor="inline")
    >>> sorted(np.round(gmm.weights_.numpy(), 2).tolist()), gmm.fit_report_["n_shards"]
    ([0.5, 0.5], 3)
    """
    if not isinstance(model, ShardableEM):
        raise TypeError(f"fit_em needs a model with sharded EM (GMM, HMM, the pf models); got {type(model).__name__}")
    model._validate_hyperparameters()
    _check_options(options)
    shards, collection_columns = _as_shards(shards)
    if not shards:
        raise ValueError("shards is empty: give at least one shard")
    names = [_shard_name(s, i) for i, s in enumerate(shards)]
    paths = [str(Path(s).resolve()) for s in shards if isinstance(s, (str, Path))]
    if len(set(paths)) != len(paths):
        raise ValueError("a shard is listed twice: each file may appear once")
    if not (isinstance(sample_size, int) and sample_size >= 1):
        raise ValueError(f"sample_size must be a positive integer; got {sample_size!r}")
    check_timeout(timeout)
    if hasattr(model, "fit_report_"):  # a report of an earlier fit must not outlive a failed one
        del model.fit_report_
    model._release_training_data()  # nothing of an earlier in-memory fit travels to the workers
    excluded = {model.sequence_column if isinstance(model, SequenceData) else None, target, weight}
    columns = (shard_columns(s, "") for s in shards)
    named = collection_columns or next((c for c in columns if c is not None), None)
    model.feature_names_in_ = None if named is None else [c for c in named if c not in excluded]
    if not model.is_fitted:
        model.n_features_in_ = None
    tasks = [
        ShardTask(i, name, shard, sample_size, target, weight=weight)
        for i, (name, shard) in enumerate(zip(names, shards))
    ]
    start = time.perf_counter()
    holders = make_holders(tasks, model, executor, max_workers, retries, timeout)
    try:
        summaries = holders.summaries
        load_seconds = time.perf_counter() - start
        if not any(s.n_units for s in summaries):
            raise ValueError(f"every shard is empty ({len(summaries)} shards, no rows): there is nothing to fit")
        widths = {s.name: s.n_features for s in summaries if s.n_units}
        if len(set(widths.values())) > 1:
            first = next(iter(widths.values()))
            raise TaskError(
                {name: TaskInputError(f"{width} features, the first shard {first}") for name, width in widths.items()
                 if width != first}
            )  # fmt: skip
        names_in = model.feature_names_in_
        levels = _levels_over_shards(model, holders)
        sample_x, sample_y = _start_sample(summaries, sample_size, weighted=weight is not None)
        prepared = model.prepare_data(sample_x, sample_y, fitting=True)
        _record_levels(model, levels)
        start_data = model._em_data(prepared)
        model.feature_names_in_ = names_in
        data_stats = None
        if isinstance(model, DataStatisticsEM):  # fitted once from all the data (e.g. the pf background)
            data_stats = merge_in_tree(_statistics(holders.run("data_statistics", model)))
            model._em_set_data_statistics(data_stats)
        sharded = _ShardedEM(model, holders, start_data, sum(s.n_observations for s in summaries), data_stats)
        result = run_em(sharded, None, **options)
    finally:
        holders.close()
    model._record_result("em", result)
    model.fit_report_ = {
        "n_shards": len(shards),
        "shards": [
            {
                "name": s.name,
                "n_units": s.n_units,
                "n_observations": s.n_observations,
                "read_seconds": s.seconds,
                "e_step_seconds_mean": float(np.mean([it[i] for it in sharded.step_seconds])),
            }
            for i, s in enumerate(summaries)
        ],
        "read_seconds": load_seconds,
        "iteration_seconds": sharded.iteration_seconds,
        "start_sample_units": len(sample_x),
    }
    return model
