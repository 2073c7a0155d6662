#!/usr/bin/env python
"""Benchmark torch's thread count on ppmix fits, on an idle machine and under a load this script makes.

For every case (a model and a problem size) the same fit runs

* at **1 thread** (``torch.set_num_threads(1)``),
* at **all threads** (torch's default, one per core) with ppmix's thread policy switched off
  (``set_thread_policy("torch")``): what a plain torch loop does,
* at **all threads with the policy** (``set_thread_policy("auto")``, ppmix's default): ppmix
  lowers the count to 1 inside fits whose passes are too small for a second thread to pay
  (:mod:`ppmix.ops.threads`),

first with the machine as it is ("idle": nothing started by the script) and then under a
generated background load: one process per core spinning in a pure-Python loop, the
situation of a shared server. The three settings alternate within every repeat, so drift
in the machine's load hits them alike. Every fit runs in a worker process that holds the
data; one still running after ``--cap`` seconds (default 180) is stopped and recorded as
censored (``null`` in the JSON, "past the cap" in the table). Reported: median seconds per setting and the
ratios to 1 thread, per case and load. Ratios, not absolute times, compare across machines.

Usage::

    .venv/bin/python benchmarks/bench_threads.py            # all cases, 3 repeats -> benchmarks/results/threads.json
    .venv/bin/python benchmarks/bench_threads.py --quick    # two tiny cases, 1 repeat, one spinner
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from _common import machine_load

from ppmix import GMM, HMM, MixtureOfExperts
from ppmix.datasets.blobs import make_gaussian_mixture
from ppmix.datasets.moe import make_moe
from ppmix.ops.threads import set_thread_policy
from ppmix.optimizers.presto import PRESTO

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "threads.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_threads_quick.json"
SETTINGS = ("1 thread", "all threads", "all threads + policy")

logger = logging.getLogger("bench_threads")


def _sequences(n_sequences: int, length: int, n_features: int, seed: int) -> list[np.ndarray]:
    """Sequences that switch between two shifted regimes every 100 frames."""
    rng = np.random.default_rng(seed)
    shift = (np.arange(length)[:, None] // 100 % 2) * 3.0
    return [rng.normal(size=(length, n_features)) + shift for _ in range(n_sequences)]


def _presto_data(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two linear regimes split by the sign of the first covariate."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.where(x[:, 0] > 0, x[:, 1], -x[:, 2]) + 0.1 * rng.normal(size=n)


def make_cases(quick: bool) -> dict[str, Callable[[], Any]]:
    """Case name -> a fit to time (its data made once, here)."""
    cases: dict[str, Callable[[], Any]] = {}

    def gmm(n: int, d: int, k: int, covariance: str, iters: int) -> None:
        x = make_gaussian_mixture(n, k, d, seed=0).X
        cases[f"GMM {covariance} N={n} D={d} K={k}"] = lambda: GMM(
            k, covariance_type=covariance, seed=0, progress=False, max_iter=iters, tol=0
        ).fit(x)

    def moe(n: int, d: int, k: int, **options: Any) -> None:
        data = make_moe(n, n_experts=k, n_features=d, seed=0)
        name = f"MoE N={n} d={d} K={k}" + "".join(f" {key}={value}" for key, value in options.items())
        cases[name] = lambda: MixtureOfExperts(k, seed=0, progress=False, **options).fit(data.X, data.y)

    def hmm(n_sequences: int, length: int, d: int, k: int, iters: int) -> None:
        seqs = _sequences(n_sequences, length, d, seed=0)
        cases[f"HMM {n_sequences}x{length} D={d} K={k}"] = lambda: HMM(
            k, seed=0, progress=False, max_iter=iters, tol=0
        ).fit(seqs)

    def presto(n: int, d: int, k: int) -> None:
        x, y = _presto_data(n, d, seed=0)
        cases[f"PRESTO linear N={n} D={d} K={k}"] = lambda: PRESTO(k, "linear", seed=0, progress=False).fit(x, y)

    if quick:
        gmm(2000, 3, 3, "diag", 5)
        moe(600, 2, 2, n_init=1, max_iter=5)
        return cases
    gmm(20_000, 5, 4, "diag", 30)
    gmm(50_000, 20, 8, "full", 20)
    gmm(100_000, 50, 8, "diag", 10)
    moe(48_000, 3, 3, max_iter=50)
    moe(200_000, 10, 4, n_init=1, max_iter=20)
    hmm(50, 400, 5, 4, 30)
    hmm(200, 500, 10, 8, 10)
    presto(5_000, 10, 3)
    presto(50_000, 20, 4)
    return cases


def _spin() -> None:  # pragma: no cover - runs in a child process until terminated
    while True:
        pass


class BackgroundLoad:
    """``spinners`` processes, each a pure-Python busy loop, for the duration of a ``with`` block."""

    def __init__(self, spinners: int) -> None:
        self.spinners = spinners
        self.processes: list[multiprocessing.Process] = []

    def __enter__(self) -> "BackgroundLoad":
        context = multiprocessing.get_context("spawn")
        self.processes = [context.Process(target=_spin, daemon=True) for _ in range(self.spinners)]
        for process in self.processes:
            process.start()
        time.sleep(1.0)  # let them reach the loop
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.join()


def _time_setting(fit: Callable[[], Any], setting: str, all_threads: int) -> float:
    torch.set_num_threads(1 if setting == "1 thread" else all_threads)
    set_thread_policy("auto" if setting.endswith("policy") else "torch")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit()
    return time.perf_counter() - start


_worker_cases: dict[str, Callable[[], Any]] = {}


def _time_in_worker(name: str, setting: str, all_threads: int, quick: bool) -> float:
    """Worker side: make the cases once per process, time one fit."""
    if not _worker_cases:
        _worker_cases.update(make_cases(quick))
    return _time_setting(_worker_cases[name], setting, all_threads)


class CaseWorker:
    """A child process that holds the cases' data and times fits, killed and replaced when one runs past ``cap``."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.pool: Any = None

    def time(self, name: str, setting: str, all_threads: int, cap: float) -> float | None:
        """Seconds of one fit, or ``None`` when it ran past ``cap`` seconds (the worker is then replaced)."""
        if self.pool is None:
            self.pool = multiprocessing.get_context("spawn").Pool(1)
        pending = self.pool.apply_async(_time_in_worker, (name, setting, all_threads, self.quick))
        try:
            return pending.get(timeout=cap)
        except multiprocessing.TimeoutError:
            self.close()
            return None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def measure(
    names: list[str], repeats: int, all_threads: int, cap: float, quick: bool
) -> dict[str, dict[str, float | None]]:
    """Median seconds per case and setting (``None``: past ``cap``); the settings rotate their order per repeat.

    Each fit runs in a worker process holding the data, so that one stalled beyond ``cap``
    seconds is stopped and recorded as censored instead of holding up the benchmark.
    """
    times: dict[str, dict[str, list[float]]] = {name: {s: [] for s in SETTINGS} for name in names}
    worker = CaseWorker(quick)
    try:
        for name in names:
            for repeat in range(repeats):
                order = SETTINGS[repeat % 3 :] + SETTINGS[: repeat % 3]
                for setting in order:
                    seconds = worker.time(name, setting, all_threads, cap)
                    times[name][setting].append(math.inf if seconds is None else seconds)
                    logger.info("%s | %s | %s", name, setting, "past the cap" if seconds is None else f"{seconds:.3f}s")
    finally:
        worker.close()
    return {
        name: {s: (None if math.isinf(m := statistics.median(v)) else m) for s, v in per.items()}
        for name, per in times.items()
    }


def _ratios(medians: dict[str, float | None]) -> dict[str, float | None]:
    one = medians["1 thread"]
    return {
        f"{s} / 1 thread": None if medians[s] is None or one is None else round(medians[s] / one, 3)
        for s in SETTINGS[1:]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="the 'all threads' count")
    parser.add_argument("--spinners", type=int, default=os.cpu_count() or 2, help="busy processes of the load")
    parser.add_argument("--cap", type=float, default=180.0, help="seconds after which a fit is stopped (censored)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    repeats, spinners = (1, 1) if args.quick else (args.repeats, args.spinners)
    names = list(make_cases(args.quick))
    report: dict[str, Any] = {
        "benchmark": "threads",
        "quick": args.quick,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "all_threads": args.threads,
        "spinners": spinners,
        "repeats": repeats,
        "cap_seconds": args.cap,
        "machine_before": machine_load(),
        "loads": {},
    }
    for load in ("idle", "loaded"):
        if load == "idle":
            medians = measure(names, repeats, args.threads, args.cap, args.quick)
        else:
            with BackgroundLoad(spinners):
                medians = measure(names, repeats, args.threads, args.cap, args.quick)
        report["loads"][load] = {
            name: {"seconds": {s: None if v is None else round(v, 4) for s, v in m.items()}, **_ratios(m)}
            for name, m in medians.items()
        }
    report["machine_after"] = machine_load()
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for load, rows in report["loads"].items():
        for name, row in rows.items():
            ratios = ", ".join(
                f"{k} {'past the cap' if v is None else f'{v:.2f}'}" for k, v in row.items() if k != "seconds"
            )
            print(f"{load:6s} {name:40s} 1 thread {row['seconds']['1 thread']}s; {ratios}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
