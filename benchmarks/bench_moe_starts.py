#!/usr/bin/env python
"""Benchmark how MixtureOfExperts' EM starts find the best optimum: one plain start, the default small EM, full starts.

Setting: two-expert problems in two covariates, each a random hyperplane gate switching between two
random linear rules with Gaussian noise (size 100-500, noise 0.1, 0.3 or 1.0, drawn per problem),
several seeds per problem. For every (problem, seed) three fits of ``MixtureOfExperts(2)``:

* ``one start``: ``n_init=1`` (the default before small EM);
* ``small EM`` (the default): ``n_init=10`` starts of ``init_iter=5`` EM iterations, the best run on;
* ``five full starts``: ``n_init=5, init_iter=None``, every start run to convergence.

Each fit also runs the default split-and-merge moves. A fit *misses* when its final log-likelihood per
point is more than 0.02 below the best of the three. Reported: misses and total seconds per
strategy, and each strategy's seconds as a ratio to ``one start`` (ratios, not absolute times, are
comparable across machines).

Usage::

    .venv/bin/python benchmarks/bench_moe_starts.py           # 8 problems x 5 seeds -> benchmarks/results/moe_starts.json
    .venv/bin/python benchmarks/bench_moe_starts.py --quick   # problem 0, seeds 3 and 4 (one start misses at 4)
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _common import early_threads

# Thread limits must be in the environment before numpy/torch load their pools.
THREADS = early_threads(default=1)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "moe_starts.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_moe_starts_quick.json"
STRATEGIES = {
    "one start": {"n_init": 1},
    "small EM": {},
    "five full starts": {"n_init": 5, "init_iter": None},
}
#: a fit more than this far below the best of the three (log-likelihood per point) missed the optimum
MISS = 0.02

logger = logging.getLogger("bench_moe_starts")


def make_problem(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Problem ``index``: a hyperplane gate between two random linear rules (sizes and noise drawn from ``index``)."""
    rng = np.random.default_rng(index)
    n, noise = int(rng.integers(100, 500)), float(rng.choice([0.1, 0.3, 1.0]))
    x = rng.normal(size=(n, 2))
    first, second, gate = rng.normal(size=2) * 2, rng.normal(size=2) * 2, rng.normal(size=2) * 2
    y = np.where(x @ gate > 0, x @ first, x @ second + 1) + noise * rng.normal(size=n)
    return x, y


def compare(problems: list[int], seeds: list[int]) -> dict[str, Any]:
    """Fit every strategy on every (problem, seed); misses, seconds and the per-fit log-likelihoods."""
    import torch

    from ppmix import MixtureOfExperts

    torch.set_num_threads(THREADS)
    fits: list[dict[str, Any]] = []
    for problem in problems:
        x, y = make_problem(problem)
        for seed in seeds:
            row: dict[str, Any] = {"problem": problem, "seed": seed}
            for name, options in STRATEGIES.items():
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = MixtureOfExperts(2, seed=seed, progress=False, **options).fit(x, y)
                row[name] = {"log_likelihood": model.lower_bound_, "seconds": time.perf_counter() - start}
            fits.append(row)
            scores = {n: round(row[n]["log_likelihood"], 3) for n in STRATEGIES}
            logger.info("problem %d seed %d: %s", problem, seed, scores)
    summary = {}
    for name in STRATEGIES:
        missed = [f for f in fits if f[name]["log_likelihood"] < max(f[s]["log_likelihood"] for s in STRATEGIES) - MISS]
        summary[name] = {"misses": len(missed), "seconds": round(sum(f[name]["seconds"] for f in fits), 3)}
    for name in STRATEGIES:
        summary[name]["seconds_over_one_start"] = round(summary[name]["seconds"] / summary["one start"]["seconds"], 3)
    return {"fits": len(fits), "strategies": summary, "per_fit": fits}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, nargs="+", help="problem indices (default 0-7; quick 0)")
    p.add_argument("--seeds", type=int, nargs="+", help="seeds of every problem (default 0-4; quick 3 4)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--quick", action="store_true", help="smoke run, written to the temp dir")
    p.add_argument("--out", type=Path, help=f"JSON path (default {DEFAULT_OUT}; --quick: {QUICK_OUT})")
    args = p.parse_args(argv)
    args.problems = args.problems or ([0] if args.quick else list(range(8)))
    args.seeds = args.seeds or ([3, 4] if args.quick else list(range(5)))
    args.out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    result = {
        "benchmark": "moe_starts",
        "settings": {
            "problems": args.problems,
            "seeds": args.seeds,
            "threads": THREADS,
            "quick": args.quick,
            "miss_threshold": MISS,
        },  # fmt: skip
        **compare(args.problems, args.seeds),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["strategies"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
