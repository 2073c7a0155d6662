#!/usr/bin/env python
"""The non-Gaussian families against pomegranate, the peer that has them: one EM iteration, side by side.

For each family (``poisson``, ``bernoulli``, ``exponential``): planted data from ``K`` components on
``D`` features, a start made once (ppmix's k-means start and one M-step), the same start given to
pomegranate's ``GeneralMixtureModel`` of the same distributions (``Poisson``, ``Bernoulli``,
``Exponential``), then ``ITERATIONS`` EM iterations of each, every iteration timed (ppmix:
``e_step`` + ``m_step``; pomegranate: ``summarize`` + ``from_summaries``), float64, 1 thread. Both run
the same algorithm from the same start, so their mean log-likelihoods after the iterations must
agree (reported, with their difference); the speed is the ratio of the median iteration times.

Usage::

    .venv/bin/python benchmarks/bench_families.py            # N = 200 000, D = 20, K = 8 (about a minute)
    .venv/bin/python benchmarks/bench_families.py --quick    # N = 5 000 (smoke run)
"""

from __future__ import annotations

import argparse
import sys

from _common import early_threads

early_threads(default=1)

import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import machine_load, require_torch_threads, set_torch_threads  # noqa: E402

from ppmix import Mixture  # noqa: E402

logger = logging.getLogger("bench_families")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "families.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_families_quick.json"
FAMILIES = ("poisson", "bernoulli", "exponential")
ITERATIONS = 10


def make_data(family: str, n: int, d: int, k: int, seed: int) -> np.ndarray:
    """Rows from ``k`` planted components of ``family`` with random parameters."""
    rng = np.random.default_rng(seed)
    z = rng.integers(k, size=n)
    if family == "poisson":
        return rng.poisson(rng.uniform(0.5, 20.0, size=(k, d))[z]).astype(np.float64)
    if family == "bernoulli":
        return (rng.random((n, d)) < rng.uniform(0.05, 0.95, size=(k, d))[z]).astype(np.float64)
    return rng.exponential(rng.uniform(0.5, 20.0, size=(k, d))[z])


def pomegranate_model(family: str, model: Mixture):
    """pomegranate's mixture of the same family at ppmix's current parameters (float64)."""
    from pomegranate.distributions import Bernoulli, Exponential, Poisson
    from pomegranate.gmm import GeneralMixtureModel

    mean = model.components_.mean.detach().clone()  # the start (the model is not fitted yet)
    make = {
        "poisson": lambda m: Poisson(lambdas=m),
        "bernoulli": lambda m: Bernoulli(probs=m),
        "exponential": lambda m: Exponential(scales=m),
    }[family]
    dists = [make(mean[j]) for j in range(mean.shape[0])]
    return GeneralMixtureModel(dists, priors=model.weights_.detach().clone(), max_iter=1, tol=0.0).to(torch.float64)


def time_iterations(step, iterations: int) -> list[float]:
    seconds = []
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def run_family(family: str, n: int, d: int, k: int, seed: int) -> dict:
    x = make_data(family, n, d, k, seed)
    model = Mixture(k, family=family, seed=seed, progress=False)
    data = model.em_data(model.prepare_data(x, fitting=True))
    model.em_initialize(data, model.generator())
    if family == "bernoulli":  # pomegranate refuses probabilities within 1.2e-7 of 0 (the k-means start has some)
        model.components_.probs = model.components_.probs.clamp(1e-6, 1 - 1e-6)
    peer = pomegranate_model(family, model)
    xt = torch.from_numpy(x)
    objective = {}

    def ppmix_step() -> None:
        stats, loglik = model.e_step(data)
        model.m_step(data, stats)
        objective["ppmix"] = float(loglik) / n

    def peer_step() -> None:
        objective["pomegranate"] = float(peer.summarize(xt)) / n
        peer.from_summaries()

    ppmix_seconds = time_iterations(ppmix_step, ITERATIONS)
    peer_seconds = time_iterations(peer_step, ITERATIONS)
    ppmix_median, peer_median = statistics.median(ppmix_seconds), statistics.median(peer_seconds)
    result = {
        "family": family,
        "n": n,
        "d": d,
        "k": k,
        "iterations": ITERATIONS,
        "ppmix_iteration_s": ppmix_median,
        "pomegranate_iteration_s": peer_median,
        "ratio_ppmix_over_pomegranate": ppmix_median / peer_median,
        # the objective at the start of the last iteration: the same EM from the same start
        "ppmix_mean_loglik": objective["ppmix"],
        "pomegranate_mean_loglik": objective["pomegranate"],
        "loglik_difference": objective["ppmix"] - objective["pomegranate"],
    }
    logger.info(
        "%-12s ppmix %.4f s/iter, pomegranate %.4f s/iter: ratio %.2f; mean log-lik %.6f vs %.6f",
        family,
        ppmix_median,
        peer_median,
        result["ratio_ppmix_over_pomegranate"],
        objective["ppmix"],
        objective["pomegranate"],
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: N = 5 000")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    set_torch_threads(args.threads, uses_pomegranate=True)
    n, d, k = (5_000, 5, 3) if args.quick else (200_000, 20, 8)
    results = [run_family(family, n, d, k, args.seed) for family in FAMILIES]
    report = {
        "benchmark": "families",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": require_torch_threads(args.threads),
        "quick": args.quick,
        "versions": {"torch": torch.__version__, "pomegranate": version("pomegranate")},
        "load": machine_load(),
        "results": results,
    }
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
