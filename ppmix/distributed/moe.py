"""Distributed mixture-of-experts training: local EM fits on shards, one communication round, OT reduction.

:func:`fit_distributed` fits a :class:`~ppmix.models.moe.MixtureOfExperts` on every shard
where the shard lives (a process pool, a Dask cluster or in-process, through
:func:`ppmix.parallel.run_tasks`), brings back only each local model's parameters and a
small random part of its rows (the supporting sample, Chamroukhi & Pham, 2026, §4.1), and reduces
the local models to one by :func:`ppmix.optimizers.ot.reduction.ot_reduce`.

Shards are file paths (Parquet, CSV or NPZ, read on the worker), ``(X, y)`` array pairs
or pandas DataFrames holding the target column. Every shard's EM seed and its place in
the aggregation come from a digest of its contents, so results do not depend on the
order the shards are given in.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ppmix._validation import check_positive_int
from ppmix.distributed.gate_rounds import ROUND_OBJECTIVES, GateRounds, model_parameters, refit_gate_on_shards
from ppmix.distributed.local_screening import REFIT_STARTS, poor_local_fits
from ppmix.distributed.shards import align_columns, check_unchanged, read_shard, shard_columns
from ppmix.parallel import DEFAULT_TIMEOUT, TaskInputError, check_timeout, run_tasks

__all__ = ["DistributedFit", "fit_distributed"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _ShardTask:
    name: str
    shard: Any
    target: str
    n_experts: int
    model_options: dict
    seed: int
    support_rows: int | None
    n_shards: int
    threads: int
    columns: list[str] | None = None
    #: the digest, rows and columns of the first read, which every later read (a refit, a second round) must match
    first_read: tuple[str, int, int] | None = None


@dataclass(frozen=True)
class _ShardResult:
    name: str
    digest: str
    n_rows: int
    feature_names: list[str] | None
    params: dict[str, np.ndarray]
    support_X: np.ndarray
    support_y: np.ndarray
    n_iter: int
    converged: bool
    mean_log_likelihood: float


def _fit_shard(task: _ShardTask) -> _ShardResult:
    """Worker side: read the shard, fit a local MoE by EM, draw its part of the supporting sample.

    Torch runs on ``task.threads`` threads during the fit (restored afterwards): several
    workers on one machine must not each start a thread per core.
    """
    from ppmix.ops.threads import torch_threads

    with torch_threads(task.threads):
        return _fit_shard_here(task)


def _read_task_shard(task: _ShardTask) -> tuple[np.ndarray, np.ndarray, list[str] | None, str]:
    """Worker side: the shard's checked covariates (columns in the first shard's order), response, names and
    content digest.

    A shard that is itself wrong raises :class:`~ppmix.parallel.TaskInputError` naming it (a retry cannot help),
    one that is not its first read a :class:`~ppmix.distributed.shards.ShardChangedError`.
    """
    from ppmix._validation import check_matrix
    from ppmix.components.registry import expert_family_from
    from ppmix.models.moe_data import check_response

    try:
        X, y, names = read_shard(task.shard, task.target)
        X, names = align_columns(X, names, task.columns, task.name)
        x, _ = check_matrix(X, f"X of shard {task.name}")
        expert = expert_family_from(task.model_options.get("expert", "gaussian"))
        response = check_response(y, x.shape[0], expert, f"y of shard {task.name}")
    except (KeyError, ValueError, TypeError) as err:  # the shard itself is wrong: a retry cannot help
        raise TaskInputError(f"shard {task.name}: {err}") from err
    x_np, y_np = x.numpy(), response.numpy()
    digest = hashlib.blake2b(x_np.tobytes() + y_np.tobytes(), digest_size=16).hexdigest()
    check_unchanged(task.name, task.first_read, (digest, *x_np.shape))
    return x_np, y_np, names, digest


def _read_covariates(task: _ShardTask) -> np.ndarray:
    """Worker side, second round: the shard's checked covariates (read and checked as in the first)."""
    return _read_task_shard(task)[0]


def _read_rows(task: _ShardTask) -> tuple[np.ndarray, np.ndarray]:
    """Worker side, second round on the observed responses: the shard's checked covariates and responses."""
    return _read_task_shard(task)[:2]


def _fit_shard_here(task: _ShardTask) -> _ShardResult:
    from ppmix.models.moe import MixtureOfExperts

    x_np, y_np, names, digest = _read_task_shard(task)
    local_seed = (task.seed + int(digest[:8], 16)) % (2**31)
    model = MixtureOfExperts(task.n_experts, seed=local_seed, progress=False, **task.model_options)
    model.fit(x_np, y_np)
    n = x_np.shape[0]
    rows = task.support_rows if task.support_rows is not None else math.ceil(n / task.n_shards)
    pick = np.sort(np.random.default_rng(local_seed).choice(n, size=min(rows, n), replace=False))
    return _ShardResult(
        task.name,
        digest,
        n,
        names,
        model_parameters(model),
        x_np[pick],
        y_np[pick],
        model.n_iter_,
        model.converged_,
        model.lower_bound_,
    )


@dataclass
class DistributedFit:
    """The reduced model of :func:`fit_distributed` with its local models and timings.

    Attributes
    ----------
    model : MixtureOfExperts
        The reduction estimator.
    local_models : list of MixtureOfExperts
        One per shard, in the order the shards were given.
    shard_names : list of str
    n_rows : list of int
    local_seconds : list of float
        Seconds each local fit spent inside its worker (reading included).
    aggregation_seconds : float
        Seconds of the OT reduction (gate refit included).
    critical_path_seconds : float
        ``max(local_seconds) + aggregation_seconds``: the learning time of the paper.
    X_support, y_support : ndarray
        The supporting sample the shards sent.
    canonical_order : list of int
        Shard indices in the (content-digest) order used for the aggregation.
    gate_rounds : GateRounds or None
        With ``rounds=2``: the second round's objective history, passes and seconds
        (:class:`~ppmix.distributed.gate_rounds.GateRounds`); ``None`` with one round.
    one_round_model : MixtureOfExperts or None
        With ``rounds=2``: the one-round reduction estimator that the second round started from.
    refitted : list of str
        Shards whose poor local fit was replaced by a refit with more starts (``refit_poor_fits``).

    Examples
    --------
    >>> from ppmix.datasets import make_moe
    >>> from ppmix.distributed import fit_distributed
    >>> data = make_moe(600, n_experts=2, n_features=2, seed=0)
    >>> fit = fit_distributed([(data.X[i::2], data.y[i::2]) for i in range(2)], 2, executor="inline")
    >>> fit.n_rows, len(fit.local_models), fit.gate_rounds is None
    ([300, 300], 2, True)
    """

    model: Any
    local_models: list
    shard_names: list[str]
    n_rows: list[int]
    local_seconds: list[float]
    aggregation_seconds: float
    X_support: np.ndarray
    y_support: np.ndarray
    canonical_order: list[int] = field(default_factory=list)
    gate_rounds: GateRounds | None = None
    one_round_model: Any = None
    refitted: list[str] = field(default_factory=list)

    @property
    def critical_path_seconds(self) -> float:
        """The slowest local fit, the aggregation and (with two rounds) the second round's critical path."""
        extra = 0.0 if self.gate_rounds is None else self.gate_rounds.critical_path_seconds
        return max(self.local_seconds) + self.aggregation_seconds + extra

    @property
    def second_round_share(self) -> dict[str, float] | None:
        """The second round's cost relative to the local fits (``None`` with one round).

        ``"critical_path"``: its critical path over the slowest local fit's seconds;
        ``"compute"``: its seconds summed over shards and passes, plus the driver's, over
        the local fits' summed seconds.
        """
        if self.gate_rounds is None:
            return None
        rounds = self.gate_rounds
        return {
            "critical_path": rounds.critical_path_seconds / max(self.local_seconds),
            "compute": (rounds.worker_seconds + rounds.driver_seconds) / sum(self.local_seconds),
        }

    @property
    def weights(self) -> list[float]:
        """``lambda_m = N_m / N`` in shard order."""
        total = sum(self.n_rows)
        return [n / total for n in self.n_rows]

    def summary(self) -> dict[str, Any]:
        """A JSON-able report: the reduced model, per-shard rows and seconds, the critical path."""
        return {
            "model": self.model.summary(),
            "shards": [
                {"name": name, "n_rows": n, "seconds": s}
                for name, n, s in zip(self.shard_names, self.n_rows, self.local_seconds)
            ],
            "aggregation_seconds": self.aggregation_seconds,
            "critical_path_seconds": self.critical_path_seconds,
            "support_size": int(self.X_support.shape[0]),
            "rounds": 1 if self.gate_rounds is None else 2,
            "refitted": self.refitted,
            **({} if self.gate_rounds is None else {"second_round": self.gate_rounds.summary()}),
            **({} if self.gate_rounds is None else {"second_round_share": self.second_round_share}),
        }


def _shard_name(shard: Any, index: int) -> str:
    return str(shard) if isinstance(shard, (str, Path)) else f"shard-{index}"


def fit_distributed(
    shards: Sequence[Any],
    n_experts: int,
    *,
    expert: str = "gaussian",
    target: str = "y",
    executor: Any = None,
    support_size: int | None = None,
    n_init: int = 10,
    max_iter: int = 100,
    tol: float = 1e-6,
    seed: int = 0,
    retries: int = 1,
    max_workers: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    threads_per_task: int = 1,
    model_options: dict[str, Any] | None = None,
    reduction_options: dict[str, Any] | None = None,
    rounds: int = 1,
    round_max_iter: int = 5,
    round_tol: float = 1e-7,
    round_objective: str = "likelihood",
    refit_poor_fits: bool = True,
) -> DistributedFit:
    """Fit a mixture of experts on every shard and reduce the local fits to one by optimal transport.

    Parameters
    ----------
    shards : sequence
        Paths to Parquet/CSV files with a ``target`` column or NPZ files with arrays
        ``X`` and ``target`` (read on the worker); ``(X, y)`` pairs; or DataFrames.
    n_experts : int
    expert : {"gaussian", "logistic", "poisson"}
    target : str, default "y"
        Name of the response column/array in file and DataFrame shards.
    executor : None, 'inline', concurrent.futures.Executor or dask.distributed.Client
        Where the local fits run (see :func:`ppmix.parallel.run_tasks`); ``None`` is the
        session's local process pool, started on first use and kept for later calls.
    support_size : int, optional
        Total size of the supporting sample; each shard sends ``ceil(support_size / M)``
        rows. Default: each shard sends ``ceil(N_m / M)`` rows, so ``S ~ N / M`` as in
        the paper.
    n_init, max_iter, tol : EM settings of every local fit (short "small EM" starts, see ``MixtureOfExperts``).
    seed : int
        With the shard contents, determines every random choice.
    retries : int, default 1
        A failing shard (unreadable, too few rows, invalid values, EM failure) is
        retried this many times and then named in a :class:`~ppmix.parallel.TaskError`.
    max_workers : int, optional
        Size of the default process pool.
    timeout : float or None, default one hour
        Seconds each round of tasks may take (see :func:`~ppmix.parallel.run_tasks`); past it an
        :class:`~ppmix.parallel.ExecutorTimeoutError` names the shards still running. None waits for ever.
    threads_per_task : int, default 1
        Torch threads of each local fit (small fits run fastest on one thread each).
    model_options : dict, optional
        Further :class:`~ppmix.models.moe.MixtureOfExperts` arguments (``ridge``, ...).
    reduction_options : dict, optional
        Arguments of :func:`~ppmix.optimizers.ot.reduction.ot_reduce` (``n_init``, ...).
    rounds : {1, 2}, default 1
        ``1`` is the paper's method: one communication round, the reduced gate fitted over
        the supporting sample. ``2`` (beyond the paper) then refits the reduced gate, the
        experts fixed, to the same objective over every row of every shard: a few Newton
        steps, each one more pass over the shards in which the workers send the
        objective's gradient and Hessian on their rows
        (:func:`~ppmix.distributed.gate_rounds.refit_gate_on_shards`). The result keeps
        the one-round model in ``one_round_model`` and the round's history and seconds in
        ``gate_rounds``.
    round_max_iter : int, default 5
        Passes over the shards of the second round after its first.
    round_tol : float, default 1e-7
        The second round stops when the predicted gain of a Newton step per row is at most
        ``round_tol * max(1, |L|)``.
    round_objective : {"likelihood", "kl"}, default "likelihood"
        The second round's objective: ``"likelihood"`` uses the shards' observed responses
        (the reduced model's log-likelihood of the training rows, which a global fit's gate
        maximises); ``"kl"`` keeps the first round's, ``f^W``'s expected log-likelihood. On
        the S4.1 Gaussian simulation (N = 10^5, seeds 0–4, M = 4 and 16) the likelihood
        round brought the Reduction within 0.6% of Global's test RPE on every seed, where
        the KL round left seed 3 at +3.5% (M = 4) and +9.6% (M = 16), and it cost 0.3–4% of
        the slowest local fit against 8–46% (``benchmarks/results/dmoe_gaussian_seeds0-4.json``).
    refit_poor_fits : bool, default True
        Refit, with three times the starts, every shard whose local fit's mean
        log-likelihood lies far below the other shards' (a poor EM optimum; see
        :mod:`ppmix.distributed.local_screening`), and keep the better fit; ``refitted``
        names the shards whose refit was kept. ``False`` is the paper's method.

    Returns
    -------
    DistributedFit

    Raises
    ------
    ValueError
        No shards, shards with different numbers of features, or ``rounds`` not 1 or 2.
    ppmix.parallel.TaskError
        Shards that still fail after their retries, each named with its error.

    Examples
    --------
    >>> from ppmix.datasets.moe import make_moe
    >>> data = make_moe(1200, n_experts=2, n_features=2, seed=0)
    >>> parts = [(data.X[i::3], data.y[i::3]) for i in range(3)]
    >>> fit = fit_distributed(parts, 2, executor="inline", n_init=2)
    >>> fit.model.n_experts, len(fit.local_models), fit.critical_path_seconds > 0
    (2, 3, True)
    >>> two = fit_distributed(parts, 2, executor="inline", n_init=2, rounds=2)  # the gate refitted on all rows
    >>> two.gate_rounds.history[-1] >= two.gate_rounds.history[0], two.one_round_model.coef_.equal(two.model.coef_)
    (True, True)
    """
    from ppmix.models.moe import MixtureOfExperts
    from ppmix.optimizers.ot.reduction import ot_reduce

    shards = list(shards)
    if not shards:
        raise ValueError("shards is empty: give at least one shard")
    if not isinstance(rounds, (int, np.integer)) or isinstance(rounds, bool) or rounds not in (1, 2):
        raise ValueError(
            f"rounds must be 1 (the paper's one round) or 2 (the gate refitted on all shards); got {rounds!r}"
        )
    if round_objective not in ROUND_OBJECTIVES:
        raise ValueError(f"round_objective must be one of {ROUND_OBJECTIVES}; got {round_objective!r}")
    round_max_iter = check_positive_int(round_max_iter, "round_max_iter")
    n_experts = check_positive_int(n_experts, "n_experts")
    if n_experts < 2:
        raise ValueError(f"n_experts must be an integer >= 2; got {n_experts!r}")
    if expert not in ("gaussian", "logistic", "poisson"):
        raise ValueError(
            f"expert must be 'gaussian', 'logistic' or 'poisson' (the OT reduction has no softmax experts); "
            f"got {expert!r}"
        )
    if support_size is not None:
        support_size = check_positive_int(support_size, "support_size")
    paths = [str(Path(s).resolve()) for s in shards if isinstance(s, (str, Path))]
    repeated = sorted({p for p in paths if paths.count(p) > 1})
    if repeated:
        raise ValueError(f"shards lists the same file more than once: {repeated}")
    options = {"expert": expert, "n_init": n_init, "max_iter": max_iter, "tol": tol, **(model_options or {})}
    if options.get("priors") is not None:  # the reduction and the gate rounds would drop them: the fit is not MAP
        raise ValueError(
            "model_options['priors'] is not taken by fit_distributed: it reduces maximum-likelihood local fits (with "
            "their ridge) by optimal transport; fit MixtureOfExperts(priors=...) on the pooled rows for a MAP fit"
        )
    # settings that would fail on every shard are checked here, before any task is sent
    MixtureOfExperts(n_experts, seed=seed, progress=False, **options)._validate_hyperparameters()
    check_timeout(timeout)
    per_shard = None if support_size is None else math.ceil(support_size / len(shards))
    names = [_shard_name(s, i) for i, s in enumerate(shards)]
    columns = next((c for c in (shard_columns(s, target) for s in shards) if c is not None), None)
    tasks = [
        _ShardTask(name, shard, target, n_experts, options, seed, per_shard, len(shards), threads_per_task, columns)
        for name, shard in zip(names, shards)
    ]
    run = {"executor": executor, "retries": retries, "max_workers": max_workers, "timeout": timeout}
    results = run_tasks(_fit_shard, tasks, names, **run)
    fits = [r.value for r in results]
    local_seconds = [r.seconds for r in results]
    tasks = [dataclasses.replace(t, first_read=(f.digest, f.n_rows, f.support_X.shape[1])) for t, f in zip(tasks, fits)]
    refitted = _refit_poor_fits(tasks, fits, local_seconds, run) if refit_poor_fits else []
    widths = {f.name: f.support_X.shape[1] for f in fits}
    if len(set(widths.values())) > 1:
        raise ValueError(f"shards have different numbers of features: {widths}")
    feature_names = fits[0].feature_names
    local_models = [
        MixtureOfExperts.from_parameters(
            **f.params, feature_names=f.feature_names, engine="em", **_model_kwargs(options)
        )
        for f in fits
    ]
    order = sorted(range(len(fits)), key=lambda i: fits[i].digest)
    start = time.perf_counter()
    X_support = np.concatenate([fits[i].support_X for i in order])
    y_support = np.concatenate([fits[i].support_y for i in order])
    model = ot_reduce(
        [local_models[i] for i in order],
        X_support,
        weights=[fits[i].n_rows for i in order],
        seed=seed,
        **(reduction_options or {}),
    )
    aggregation = time.perf_counter() - start
    model.feature_names_in_ = feature_names
    logger.info("reduced %d local fits in %.3fs", len(fits), aggregation)
    one_round, gate_rounds = None, None
    if rounds == 2:
        one_round, likelihood = model, round_objective == "likelihood"
        model, gate_rounds = refit_gate_on_shards(
            model,
            [local_models[i] for i in order],
            [fits[i].n_rows for i in order],
            [functools.partial(_read_rows if likelihood else _read_covariates, tasks[i]) for i in order],
            [names[i] for i in order],
            **run,
            threads_per_task=threads_per_task,
            model_kwargs=_model_kwargs(options),
            max_iter=round_max_iter,
            tol=round_tol,
            reduction_options=reduction_options,
            objective=round_objective,
        )
    return DistributedFit(
        model=model,
        local_models=local_models,
        shard_names=names,
        n_rows=[f.n_rows for f in fits],
        local_seconds=local_seconds,
        aggregation_seconds=aggregation,
        X_support=X_support,
        y_support=y_support,
        canonical_order=order,
        gate_rounds=gate_rounds,
        one_round_model=one_round,
        refitted=refitted,
    )


def _refit_poor_fits(
    tasks: list[_ShardTask],
    fits: list[_ShardResult],
    local_seconds: list[float],
    run: dict[str, Any],
) -> list[str]:
    """Refit the shards whose local fit is poor (:func:`~ppmix.distributed.local_screening.poor_local_fits`) with
    more and other starts; keep the better fit of each in ``fits`` (the seconds add up). Returns the shards whose
    refit was kept. ``run``: the settings of :func:`~ppmix.parallel.run_tasks`."""
    poor = poor_local_fits([f.mean_log_likelihood for f in fits])
    if not poor:
        return []
    retry = [
        dataclasses.replace(
            tasks[i],
            seed=tasks[i].seed + 1,
            model_options={**tasks[i].model_options, "n_init": REFIT_STARTS * tasks[i].model_options["n_init"]},
        )
        for i in poor
    ]
    again = run_tasks(_fit_shard, retry, [t.name for t in retry], **run)
    kept = []
    for i, result in zip(poor, again):
        local_seconds[i] += result.seconds
        if result.value.mean_log_likelihood > fits[i].mean_log_likelihood:
            kept.append(tasks[i].name)
            logger.warning(
                "shard %s: local fit at a poor optimum (%.4f per row) refitted with more starts: %.4f",
                tasks[i].name,
                fits[i].mean_log_likelihood,
                result.value.mean_log_likelihood,
            )
            fits[i] = result.value
    return kept


def _model_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments a rebuilt local model keeps (the fit settings are not needed)."""
    return {k: v for k, v in options.items() if k in ("expert", "ridge", "min_variance", "dtype")}
