#!/usr/bin/env python
"""Benchmark the mixture-of-experts EM engine and the OT aggregation at scale.

Setting: the simulation of Chamroukhi & Pham (2026), Supplement S4.1 (Gaussian experts, K = 4, d = 20),
``N = 10^6`` rows by default.

1. **Global EM** (:class:`ppmix.models.moe.MixtureOfExperts`, one random start): seconds
   per EM iteration (median of the iterations of the fit, measured around ``_m_step`` +
   ``_e_step``), total fit seconds (EM and its L-BFGS polish), iterations (``n_iter_``; and every
   EM iteration run), and the peak resident memory of the process that generates the data and
   fits (a fresh spawned process, so nothing else counts).
2. **Distributed fit** at ``M`` in {16, 128}: the ``N`` rows in ``M`` shards, local EM fits
   on a local process pool (:func:`ppmix.distributed.fit_distributed`; five random starts
   each by default, the protocol of S4.2), then the OT reduction. Reported: slowest and
   total local seconds, aggregation seconds and their ratio (target: aggregation < 5% of
   the local fitting time; also given per local start, i.e. as if every local fit had
   one start), critical path.

There is no maintained Python MoE library to compare with (scikit-learn has none);
the reference point is ppmix's own Global EM, as in the paper.

Usage::

    .venv/bin/python benchmarks/bench_moe.py                 # N = 10^6, writes benchmarks/results/moe.json
    .venv/bin/python benchmarks/bench_moe.py --quick         # N = 4000 smoke run, writes to the temp dir
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import multiprocessing
import platform
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "moe.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_moe_quick.json"
FULL_DEFAULTS = {"n": 1e6, "machines": [16, 128], "max_iter": 100, "local_n_init": 5}
QUICK_DEFAULTS = {"n": 4e3, "machines": [4], "max_iter": 20, "local_n_init": 2}

logger = logging.getLogger("bench_moe")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=float, help="number of rows (default 1e6; quick 4000)")
    p.add_argument("--machines", type=int, nargs="+", help="numbers of shards M (default 16 128; quick 4)")
    p.add_argument("--max-iter", type=int, help="EM iterations, global and local (default 100; quick 20)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the global fit")
    p.add_argument("--local-n-init", type=int, help="EM starts of every local fit (default 5 as in S4.2; quick 2)")
    p.add_argument("--workers", type=int, default=2, help="process-pool size for the local fits")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run with the quick defaults, written to the temp dir")
    p.add_argument("--out", type=Path, help=f"JSON path (default {DEFAULT_OUT}; --quick: {QUICK_OUT})")
    args = p.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    return args


def _global_fit(n: int, max_iter: int, threads: int, seed: int) -> dict[str, Any]:
    """Runs in a fresh process: generate the data, fit by EM, report timings and peak memory."""
    import torch

    from ppmix.datasets.moe import make_moe
    from ppmix.models.moe import MixtureOfExperts

    torch.set_num_threads(threads)
    data = make_moe(n, seed=seed)
    rss_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    iteration_seconds: list[float] = []

    class Timed(MixtureOfExperts):
        def _m_step(self, data, resp):  # noqa: ANN001 - the timed span opens at the M-step ...
            self._tick = time.perf_counter()
            super()._m_step(data, resp)

        def _e_step(self, data):  # noqa: ANN001 - ... and closes after the E-step
            out = super()._e_step(data)
            if getattr(self, "_tick", None) is not None:
                iteration_seconds.append(time.perf_counter() - self._tick)
                self._tick = None
            return out

    model = Timed(4, n_init=1, seed=seed, max_iter=max_iter, progress=False)  # one start: seconds per iteration
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(data.X, data.y)
    total = time.perf_counter() - start
    return {
        "n": n,
        "threads": threads,
        "iterations": model.n_iter_,  # EM's and the L-BFGS polish's
        "em_iterations": len(iteration_seconds),  # every EM iteration run, rejected split-and-merge moves too
        "converged": model.converged_,
        "seconds_total": round(total, 2),
        "seconds_per_iteration_median": round(float(np.median(iteration_seconds)), 4),
        "mean_log_likelihood": model.lower_bound_,
        "true_model_log_likelihood": data.true_model().log_likelihood(data.X, data.y) / len(data.y),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_after_data_mb": round(rss_data, 1),
    }


def _distributed(n: int, machines: int, max_iter: int, workers: int, seed: int, n_init: int) -> dict[str, Any]:
    from ppmix.datasets.moe import make_moe
    from ppmix.distributed import fit_distributed

    data = make_moe(n, seed=seed)
    shards = [(data.X[i::machines], data.y[i::machines]) for i in range(machines)]
    del data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full_starts = {"init_iter": None}  # every start run to convergence, as in S4.2 (not small EM)
        fit = fit_distributed(
            shards, 4, n_init=n_init, max_iter=max_iter, seed=seed, max_workers=workers, model_options=full_starts
        )
    local = fit.local_seconds
    return {
        "M": machines,
        "rows_per_shard": fit.n_rows[0],
        "support_size": int(fit.X_support.shape[0]),
        "local_seconds_max": round(max(local), 3),
        "local_seconds_total": round(sum(local), 3),
        "aggregation_seconds": round(fit.aggregation_seconds, 3),
        "local_n_init": n_init,
        "aggregation_over_local_total": round(fit.aggregation_seconds / sum(local), 4),
        "aggregation_over_local_total_per_start": round(fit.aggregation_seconds * n_init / sum(local), 4),
        "aggregation_over_local_max": round(fit.aggregation_seconds / max(local), 4),
        "critical_path_seconds": round(fit.critical_path_seconds, 3),
        "mm_iterations": fit.model.n_iter_,
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    torch.set_num_threads(args.threads)  # the aggregation runs here; local fits use one thread per worker
    n = int(args.n)
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:  # a fresh process: its peak memory is the fit's
        global_result = pool.apply(_global_fit, (n, args.max_iter, args.threads, args.seed))
    logger.info("global EM: %s", global_result)
    distributed = []
    for m in args.machines:
        distributed.append(_distributed(n, m, args.max_iter, args.workers, args.seed, args.local_n_init))
        logger.info("distributed: %s", distributed[-1])
    result = {
        "benchmark": "moe",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpus": multiprocessing.cpu_count(),
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "global_em": global_result,
        "distributed": distributed,
        "targets": {
            "global_fit_under_120s": global_result["seconds_total"] < 120,
            "peak_memory_under_4GB": global_result["peak_rss_mb"] < 4096,
            "aggregation_under_5pct_of_local": all(d["aggregation_over_local_total"] < 0.05 for d in distributed),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
