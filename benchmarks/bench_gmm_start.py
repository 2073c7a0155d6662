#!/usr/bin/env python
"""Quality and cost of GMM's default start: the sampled k-means start against the previous one.

``GMM(init_params="kmeans")`` keeps the best of 10 k-means runs on a random subsample of the
rows and assigns every row to its nearest centre (:func:`ppmix.algorithms.kmeans.kmeans_start`). Every fit here
runs EM to ``tol=1e-6`` (GMM's default is scikit-learn's 1e-3), so that the final log-likelihood measures
the start.
Before, every start kept the best of three k-means runs on all rows. This script fits both
starts on hard planted mixtures, over seeds, and reports the final mean log-likelihood after
EM (one float64 evaluator) and the whole ``fit`` time of each, at 1 thread:

* ``overlap``: N=100 000, D=10, K=8, diagonal, means about 2.5 component scales apart;
* ``unequal``: N=100 000, D=10, K=8, diagonal, weights Dirichlet(0.3) (the smallest near 0.1 %);
* ``full-overlap``: N=60 000, D=8, K=6, full covariances, overlapping.

The previous start is reproduced by raising the subsample size above N and setting the runs
to three (the same k-means code, three runs, on every row).

Usage::

    .venv/bin/python benchmarks/bench_gmm_start.py            # 10 seeds (about 2 minutes)
    .venv/bin/python benchmarks/bench_gmm_start.py --quick    # 2 seeds, N = 6 000 (smoke run)
"""

from __future__ import annotations

import argparse
import sys

from _common import early_threads

early_threads(default=1)

import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_gmm import mean_loglik  # noqa: E402

import ppmix.algorithms.kmeans as kmeans_module  # noqa: E402
from ppmix import GMM  # noqa: E402

logger = logging.getLogger("bench_gmm_start")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gmm_start.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_gmm_start_quick.json"


@dataclass(frozen=True)
class Hard:
    name: str
    n: int
    d: int
    k: int
    covariance_type: str
    separation: float  # typical distance between means, in component scales
    concentration: float  # Dirichlet concentration of the weights


SETTINGS = (
    Hard("overlap", 100_000, 10, 8, "diag", 2.5, 5.0),
    Hard("unequal", 100_000, 10, 8, "diag", 6.0, 0.3),
    Hard("full-overlap", 60_000, 8, 6, "full", 3.0, 5.0),
)


def make_data(s: Hard, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(s.k, s.concentration))
    weights = np.maximum(weights, 1e-3)
    weights /= weights.sum()
    means = rng.normal(0.0, s.separation / math.sqrt(2 * s.d), size=(s.k, s.d))
    z = rng.choice(s.k, size=n, p=weights)
    eps = rng.standard_normal((n, s.d))
    if s.covariance_type == "diag":
        scales = rng.uniform(0.5, 1.5, size=(s.k, s.d))
        return means[z] + eps * scales[z]
    chols = np.empty((s.k, s.d, s.d))
    for j in range(s.k):
        q, _ = np.linalg.qr(rng.normal(size=(s.d, s.d)))
        chols[j] = np.linalg.cholesky((q * rng.uniform(0.25, 2.0, size=s.d)) @ q.T)
    return means[z] + np.einsum("nij,nj->ni", chols[z], eps)


def fit(x: np.ndarray, s: Hard, seed: int, previous_start: bool) -> dict[str, float]:
    saved = kmeans_module.START_SAMPLE_ROWS, kmeans_module.START_RUNS
    if previous_start:
        kmeans_module.START_SAMPLE_ROWS, kmeans_module.START_RUNS = x.shape[0] + 1, 3
    try:
        # a tight tolerance (not GMM's default 1e-3): the final log-likelihood then measures the start, not the stop
        gmm = GMM(s.k, covariance_type=s.covariance_type, seed=seed, tol=1e-6, progress=False)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gmm.fit(x)
        wall = time.perf_counter() - start
    finally:
        kmeans_module.START_SAMPLE_ROWS, kmeans_module.START_RUNS = saved
    ll = mean_loglik(x, gmm.weights_.numpy(), gmm.means_.numpy(), gmm.covariances_.numpy(), s.covariance_type)
    return {"fit_wall_s": wall, "mean_loglik": ll, "n_iter": int(gmm.n_iter_)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, N = 6 000 (smoke run)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    seeds = range(2 if args.quick else args.seeds)
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    report = {
        "benchmark": "gmm_start",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "threads": args.threads,
        "settings": [],
    }
    lines = [f"{'setting':<13} {'start':<10} {'median LL':>11} {'worst LL':>11} {'median fit s':>12} {'wins':>5}"]
    for s in SETTINGS:
        n = 6_000 if args.quick else s.n
        runs = {"sampled": [], "previous": []}
        for seed in seeds:
            x = make_data(s, n, seed)
            for label in runs:
                runs[label].append(fit(x, s, seed, previous_start=label == "previous"))
            logger.info(
                "%s seed %d: sampled %.6f (%.2fs), previous %.6f (%.2fs)",
                s.name,
                seed,
                runs["sampled"][-1]["mean_loglik"],
                runs["sampled"][-1]["fit_wall_s"],
                runs["previous"][-1]["mean_loglik"],
                runs["previous"][-1]["fit_wall_s"],
            )
        entry = {"name": s.name, "n": n, "d": s.d, "k": s.k, "covariance_type": s.covariance_type, "runs": runs}
        for label, rows in runs.items():
            other = runs["previous" if label == "sampled" else "sampled"]
            wins = sum(a["mean_loglik"] >= b["mean_loglik"] - 1e-9 for a, b in zip(rows, other, strict=True))
            entry[label] = {
                "median_mean_loglik": statistics.median(r["mean_loglik"] for r in rows),
                "worst_mean_loglik": min(r["mean_loglik"] for r in rows),
                "median_fit_wall_s": statistics.median(r["fit_wall_s"] for r in rows),
                "at_least_as_good": wins,
            }
            lines.append(
                f"{s.name:<13} {label:<10} {entry[label]['median_mean_loglik']:11.5f} "
                f"{entry[label]['worst_mean_loglik']:11.5f} {entry[label]['median_fit_wall_s']:12.3f} {wins:5d}"
            )
        report["settings"].append(entry)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wins: seeds where this start's final log-likelihood is at least the other's. Wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
