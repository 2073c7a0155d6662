#!/usr/bin/env python
"""Variational-Bayes EM: ppmix's ``GMM.fit(X, engine="vb")`` against scikit-learn's ``BayesianGaussianMixture``,
time per iteration and the lower bound, every covariance type, side by side in one process.

Data: a planted mixture of 5 Gaussians (fixed seed), N = 50 000 rows, D = 10 features, fitted with K = 10
components (the issue's setting), at 1 thread by default. Both libraries start from the same responsibilities
(random soft ones, fixed seed: scikit-learn's start is replaced by its own ``_initialize`` on them, ppmix's
``_vb_initial_responsibilities`` returns them), with ``reg_covar=0``, ``tol=0``, the default priors and stick-breaking
weights, so both run the same iterations.

Time per iteration: the median time of the public ``fit`` of ``1 + ITERATIONS`` iterations minus the median time
of the ``fit`` of 1 iteration, over ``ITERATIONS`` (the setup, data checks and the first M-step cancel). The fits
alternate between the libraries (``--repeats`` rounds, the order flipped every round); the ratio ppmix / scikit-learn
is reported (the goal: at most 0.5). Beside them, the largest relative difference of the two libraries' lower
bounds over the iterations (scikit-learn's ``lower_bounds_`` against ppmix's ``history_`` times N).

Usage::

    .venv/bin/python benchmarks/bench_vb.py            # writes benchmarks/results/vb.json
    .venv/bin/python benchmarks/bench_vb.py --quick    # small sizes (a smoke run)
"""

from __future__ import annotations

import argparse
import os
import sys

from _common import early_threads, machine_load

early_threads(default=1)

import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
import torch  # noqa: E402
from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning  # noqa: E402
from sklearn.mixture import BayesianGaussianMixture  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ppmix import GMM  # noqa: E402
from ppmix.engines.result import ConvergenceWarning  # noqa: E402

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
OUT = Path(__file__).resolve().parent / "results" / "vb.json"


def planted(n: int, d: int, seed: int = 0) -> np.ndarray:
    """``n`` rows of a mixture of 5 Gaussians in ``d`` features with random correlated covariances."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(5, d))
    mixing = rng.normal(scale=0.5, size=(5, d, d)) + np.eye(d)
    labels = rng.integers(5, size=n)
    return centres[labels] + np.einsum("nd,nde->ne", rng.normal(size=(n, d)), mixing[labels])


def sklearn_fit(x: np.ndarray, resp: np.ndarray, covariance_type: str, iterations: int) -> BayesianGaussianMixture:
    bgm = BayesianGaussianMixture(
        n_components=resp.shape[1], covariance_type=covariance_type, max_iter=iterations, tol=0.0, reg_covar=0.0
    )
    bgm._initialize_parameters = lambda X, random_state, xp=None: bgm._initialize(X, resp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SklearnConvergenceWarning)
        return bgm.fit(x)


def ppmix_fit(x: np.ndarray, resp: np.ndarray, covariance_type: str, iterations: int) -> GMM:
    gmm = GMM(resp.shape[1], covariance_type=covariance_type, reg_covar=0.0, tol=0.0, seed=0, progress=False)
    start = torch.as_tensor(resp)
    gmm._vb_initial_responsibilities = lambda data, generator: start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gmm.fit(x, engine="vb", max_iter=iterations)


def timed(fit, *args) -> float:
    begin = time.perf_counter()
    fit(*args)
    return time.perf_counter() - begin


def bound_difference(x: np.ndarray, resp: np.ndarray, covariance_type: str, iterations: int) -> float:
    """The largest relative difference of the lower bounds over ``iterations`` iterations."""
    bgm = sklearn_fit(x, resp, covariance_type, iterations)
    gmm = ppmix_fit(x, resp, covariance_type, iterations)
    reference = np.ravel(bgm.lower_bounds_)
    return float(np.max(np.abs(np.asarray(gmm.history_) * x.shape[0] - reference) / np.abs(reference)))


def run(covariance_type: str, x: np.ndarray, resp: np.ndarray, iterations: int, repeats: int) -> dict:
    fits = {"ppmix": ppmix_fit, "scikit-learn": sklearn_fit}
    lengths = (1, 1 + iterations)
    times: dict[str, dict[int, list[float]]] = {name: {length: [] for length in lengths} for name in fits}
    for fit in fits.values():  # warm up both
        fit(x, resp, covariance_type, 1)
    for round_ in range(repeats):
        for name in list(fits)[:: 1 if round_ % 2 == 0 else -1]:
            for length in lengths:
                times[name][length].append(timed(fits[name], x, resp, covariance_type, length))
    medians = {
        name: (statistics.median(runs[1 + iterations]) - statistics.median(runs[1])) / iterations
        for name, runs in times.items()
    }
    return {
        "covariance_type": covariance_type,
        "seconds_per_iteration": medians,
        "fit_seconds": {
            name: {f"{length}_iterations": runs[length] for length in lengths} for name, runs in times.items()
        },
        "ratio_ppmix_to_sklearn": medians["ppmix"] / medians["scikit-learn"],
        "lower_bound_max_rel_diff": bound_difference(x, resp, covariance_type, iterations),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, d, k = (3_000, 4, 5) if args.quick else (50_000, 10, 10)
    iterations = 10
    repeats = args.repeats or (2 if args.quick else 7)
    x = planted(n, d)
    resp = np.random.default_rng(1).dirichlet(np.ones(k), size=n)
    settings = [run(covariance_type, x, resp, iterations, repeats) for covariance_type in COVARIANCE_TYPES]
    report = {
        "benchmark": "vb_gmm",
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"n": n, "d": d, "k": k, "iterations": iterations, "repeats": repeats, "threads": args.threads},
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "sklearn": sklearn.__version__,
            "torch_num_threads": torch.get_num_threads(),
            **machine_load(),
        },
        "settings": settings,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for row in settings:
        seconds = row["seconds_per_iteration"]
        print(
            f"{row['covariance_type']:9s} ppmix {seconds['ppmix'] * 1e3:8.2f} ms  scikit-learn "
            f"{seconds['scikit-learn'] * 1e3:8.2f} ms  ratio {row['ratio_ppmix_to_sklearn']:.2f}  "
            f"bound diff {row['lower_bound_max_rel_diff']:.1e}"
        )


if __name__ == "__main__":
    main()
