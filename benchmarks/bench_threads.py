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
in the machine's load hits them alike. Reported: median seconds per setting and the
ratios to 1 thread, per case and load. Ratios, not absolute times, compare across machines.

Usage::

    .venv/bin/python benchmarks/bench_threads.py            # all cases, 3 repeats -> benchmarks/results/threads.json
    .venv/bin/python benchmarks/bench_threads.py --quick    # two tiny cases, 1 repeat, one spinner
"""

from __future__ import annotations

import argparse
import json
import logging
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
from ppmix.inference.optimizers.presto import PRESTO
from ppmix.ops.threads import set_thread_policy

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


def measure(cases: dict[str, Callable[[], Any]], repeats: int, all_threads: int) -> dict[str, dict[str, float]]:
    """Median seconds per case and setting; the settings rotate their order within each repeat."""
    times: dict[str, dict[str, list[float]]] = {name: {s: [] for s in SETTINGS} for name in cases}
    for name, fit in cases.items():
        for repeat in range(repeats):
            order = SETTINGS[repeat % 3 :] + SETTINGS[: repeat % 3]
            for setting in order:
                seconds = _time_setting(fit, setting, all_threads)
                times[name][setting].append(seconds)
                logger.info("%s | %s | %.3fs", name, setting, seconds)
    return {name: {s: statistics.median(v) for s, v in per.items()} for name, per in times.items()}


def _ratios(medians: dict[str, float]) -> dict[str, float]:
    one = medians["1 thread"]
    return {f"{s} / 1 thread": round(medians[s] / one, 3) for s in SETTINGS[1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="the 'all threads' count")
    parser.add_argument("--spinners", type=int, default=os.cpu_count() or 2, help="busy processes of the load")
    parser.add_argument("--out", type=Path)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    repeats, spinners = (1, 1) if args.quick else (args.repeats, args.spinners)
    cases = make_cases(args.quick)
    report: dict[str, Any] = {
        "benchmark": "threads",
        "quick": args.quick,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "all_threads": args.threads,
        "spinners": spinners,
        "repeats": repeats,
        "machine_before": machine_load(),
        "loads": {},
    }
    for load in ("idle", "loaded"):
        if load == "idle":
            medians = measure(cases, repeats, args.threads)
        else:
            with BackgroundLoad(spinners):
                medians = measure(cases, repeats, args.threads)
        report["loads"][load] = {
            name: {"seconds": {s: round(v, 4) for s, v in m.items()}, **_ratios(m)} for name, m in medians.items()
        }
    report["machine_after"] = machine_load()
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for load, rows in report["loads"].items():
        for name, row in rows.items():
            ratios = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "seconds")
            print(f"{load:6s} {name:40s} 1 thread {row['seconds']['1 thread']:.2f}s; {ratios}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
