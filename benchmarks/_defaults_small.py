#!/usr/bin/env python
"""Default GMM fits on small real data against scikit-learn's (issue 49, item 4), and one large planted fit.

Every configuration is a default fit of both libraries on the same standardised data: scikit-learn's
``load_iris``, ``load_wine`` and ``load_breast_cancer`` (``StandardScaler``), ``K`` = 2, 3, 5 and the four
covariance types (36 configurations): ``GMM(K, covariance_type=..., seed=0, progress=False).fit(X)`` against
``GaussianMixture(K, covariance_type=..., random_state=0).fit(X)``. At one thread (torch's and every BLAS and
OpenMP pool), the repetitions are interleaved (every configuration once per round, the two libraries in
alternating order), and the median over the rounds is reported, in wall and in CPU time. Both fits are scored by
one float64 evaluator (the mean log-likelihood per row of the training data under each fitted mixture).

Unless ``--quick``, the same comparison at N = 200 000 (benchmarks/bench_gmm.py's setting A: D = 50, K = 8,
diagonal, planted), one fit each.

The criterion of issue 49: the geometric mean of the 36 time ratios (ppmix / scikit-learn) at most 1.0, none above
1.5, the median log-likelihood difference no worse than -1e-3 nats per row, and at most 0.5 at N = 200 000.

Usage::

    .venv/bin/python benchmarks/_defaults_small.py            # 5 rounds and the 200k fit (about a minute)
    .venv/bin/python benchmarks/_defaults_small.py --quick    # 1 round, no 200k fit (a few seconds)

:func:`run` is what ``benchmarks/bench_defaults.py`` calls (its caller sets the thread variables first).
"""

from __future__ import annotations

import argparse
import sys

from _common import early_threads, gaussian_mixture_mean_loglik, machine_load

if __name__ == "__main__":  # thread limits must be in the environment before numpy/torch load their pools
    early_threads(default=1)

import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

logger = logging.getLogger("defaults_small")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "defaults_small.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_defaults_small_quick.json"

DATASETS = ("iris", "wine", "breast_cancer")
N_COMPONENTS = (2, 3, 5)
COVARIANCE_TYPES = ("diag", "spherical", "full", "tied")
#: the issue's criterion: geometric mean and largest time ratio, median log-likelihood difference, ratio at 200k
MAX_GEOMEAN_RATIO, MAX_RATIO, MIN_MEDIAN_LOGLIK_DIFF, MAX_LARGE_RATIO = 1.0, 1.5, -1e-3, 0.5
#: the planted large setting (bench_gmm.py's setting A)
LARGE = {"n": 200_000, "d": 50, "k": 8, "covariance_type": "diag"}


def load(name: str) -> np.ndarray:
    """A scikit-learn toy data set's features, standardised (``StandardScaler``)."""
    from sklearn import datasets
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(getattr(datasets, f"load_{name}")().data)


def sklearn_covariances(gm: Any, d: int) -> np.ndarray:
    """scikit-learn's ``covariances_`` as ``(K, D)`` diagonals or ``(K, D, D)`` matrices."""
    k, cov = gm.n_components, np.asarray(gm.covariances_)
    if gm.covariance_type == "spherical":
        return np.repeat(cov[:, None], d, axis=1)
    if gm.covariance_type == "tied":
        return np.broadcast_to(cov, (k, d, d))
    return cov


def fit_ppmix(x: np.ndarray, k: int, covariance_type: str) -> dict[str, Any]:
    """A default ppmix fit: its parameters and iterations."""
    from ppmix import GMM

    gmm = GMM(k, covariance_type=covariance_type, seed=0, progress=False).fit(x)
    return {"params": (gmm.weights_, gmm.means_, gmm.covariances_), "n_iter": int(gmm.n_iter_)}


def fit_sklearn(x: np.ndarray, k: int, covariance_type: str) -> dict[str, Any]:
    """A default scikit-learn fit: its parameters and iterations."""
    from sklearn.mixture import GaussianMixture

    gm = GaussianMixture(k, covariance_type=covariance_type, random_state=0).fit(x)
    params = (gm.weights_, gm.means_, sklearn_covariances(gm, x.shape[1]))
    return {"params": params, "n_iter": int(gm.n_iter_)}


FITS: dict[str, Callable[[np.ndarray, int, str], dict[str, Any]]] = {"ppmix": fit_ppmix, "sklearn": fit_sklearn}


def timed(fit: Callable[[np.ndarray, int, str], dict[str, Any]], *args: Any) -> dict[str, Any]:
    """One fit, its wall and CPU seconds (warnings, e.g. unconverged fits, silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wall, cpu = time.perf_counter(), time.process_time()
        result = fit(*args)
        result["wall_s"], result["cpu_s"] = time.perf_counter() - wall, time.process_time() - cpu
    return result


def small_configurations() -> list[tuple[str, int, str]]:
    return [(name, k, ct) for name in DATASETS for k in N_COMPONENTS for ct in COVARIANCE_TYPES]


def time_small(rounds: int, pause: float) -> list[dict[str, Any]]:
    """The 36 configurations, ``rounds`` interleaved rounds (libraries in alternating order), medians and LLs."""
    data = {name: load(name) for name in DATASETS}
    configs = small_configurations()
    for name, k, ct in configs[:2]:  # warm both libraries' code paths (imports, first-call dispatch)
        for fit in FITS.values():
            timed(fit, data[name], k, ct)
    samples: dict[tuple[str, int, str], dict[str, list[dict[str, Any]]]] = {
        c: {lib: [] for lib in FITS} for c in configs
    }
    for round_ in range(rounds):
        gc.collect()
        order = list(FITS) if round_ % 2 == 0 else list(reversed(FITS))
        for config in configs:
            for library in order:
                samples[config][library].append(timed(FITS[library], data[config[0]], *config[1:]))
        time.sleep(pause)
    rows = []
    for (name, k, ct), runs in samples.items():
        row: dict[str, Any] = {"dataset": name, "n": int(data[name].shape[0]), "d": int(data[name].shape[1])}
        row.update({"k": k, "covariance_type": ct})
        for library, results in runs.items():
            row[library] = {
                "wall_s": statistics.median(r["wall_s"] for r in results),
                "cpu_s": statistics.median(r["cpu_s"] for r in results),
                "n_iter": results[-1]["n_iter"],
                "mean_loglik": gaussian_mixture_mean_loglik(data[name], *results[-1]["params"]),
            }
        row["ratio"] = row["ppmix"]["wall_s"] / row["sklearn"]["wall_s"]
        row["cpu_ratio"] = row["ppmix"]["cpu_s"] / row["sklearn"]["cpu_s"]
        row["loglik_diff"] = row["ppmix"]["mean_loglik"] - row["sklearn"]["mean_loglik"]
        rows.append(row)
    return rows


def planted_large(seed: int = 0) -> np.ndarray:
    """bench_gmm.py's setting A: N = 200 000, D = 50, K = 8 diagonal Gaussians, means about 6 scales apart."""
    rng = np.random.default_rng(seed)
    n, d, k = LARGE["n"], LARGE["d"], LARGE["k"]
    weights = rng.dirichlet(np.full(k, 5.0))
    means = rng.normal(0.0, 6.0 / math.sqrt(2 * d), size=(k, d))
    scales = rng.uniform(0.5, 1.5, size=(k, d))
    z = rng.choice(k, size=n, p=weights)
    return means[z] + rng.standard_normal((n, d)) * scales[z]


def time_large() -> dict[str, Any]:
    """One default fit of each library at N = 200 000 (ppmix first, then scikit-learn)."""
    x = planted_large()
    out: dict[str, Any] = dict(LARGE)
    for library, fit in FITS.items():
        gc.collect()
        result = timed(fit, x, LARGE["k"], LARGE["covariance_type"])
        out[library] = {
            "wall_s": result["wall_s"],
            "cpu_s": result["cpu_s"],
            "n_iter": result["n_iter"],
            "mean_loglik": gaussian_mixture_mean_loglik(x, *result["params"]),
        }
    out["ratio"] = out["ppmix"]["wall_s"] / out["sklearn"]["wall_s"]
    out["cpu_ratio"] = out["ppmix"]["cpu_s"] / out["sklearn"]["cpu_s"]
    out["loglik_diff"] = out["ppmix"]["mean_loglik"] - out["sklearn"]["mean_loglik"]
    return out


def geometric_mean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def summarise(rows: list[dict[str, Any]], large: dict[str, Any] | None) -> dict[str, Any]:
    """Geometric mean and largest of the ratios (wall and CPU), the median log-likelihood difference, the verdict."""
    ratios, cpu_ratios = [r["ratio"] for r in rows], [r["cpu_ratio"] for r in rows]
    summary = {
        "geomean_ratio": geometric_mean(ratios),
        "max_ratio": max(ratios),
        "geomean_cpu_ratio": geometric_mean(cpu_ratios),
        "max_cpu_ratio": max(cpu_ratios),
        "median_loglik_diff": statistics.median(r["loglik_diff"] for r in rows),
        "worst_loglik_diff": min(r["loglik_diff"] for r in rows),
        "large_ratio": None if large is None else large["ratio"],
    }
    summary["meets_criterion"] = (
        summary["geomean_ratio"] <= MAX_GEOMEAN_RATIO
        and summary["max_ratio"] <= MAX_RATIO
        and summary["median_loglik_diff"] >= MIN_MEDIAN_LOGLIK_DIFF
        and (large is None or large["ratio"] <= MAX_LARGE_RATIO)
    )
    return summary


def run(quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
    """Time the 36 small configurations (and, unless ``quick``, the 200k fit) at one thread; the report as a dict.

    Parameters
    ----------
    quick : bool
        One round and no 200k fit (a smoke run: a few seconds).
    rounds : int, optional
        Interleaved rounds (default 5; quick 1).
    """
    rounds = rounds or (1 if quick else 5)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            rows = time_small(rounds, pause=0.0 if quick else 0.5)
            large = None if quick else time_large()
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    return {
        "benchmark": "defaults_small",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "rounds": rounds,
        "torch_threads": threads,
        "machine": machine_load(),
        "criterion": {
            "max_geomean_ratio": MAX_GEOMEAN_RATIO,
            "max_ratio": MAX_RATIO,
            "min_median_loglik_diff": MIN_MEDIAN_LOGLIK_DIFF,
            "max_large_ratio": MAX_LARGE_RATIO,
        },
        "summary": summarise(rows, large),
        "configurations": rows,
        "large": large,
    }


def table(report: dict[str, Any]) -> str:
    """The report as a text table."""
    lines = [
        f"{'data':14s} {'K':>2s} {'cov':9s} {'ppmix ms':>9s} {'sklearn ms':>10s} {'ratio':>6s} {'cpu':>5s} "
        f"{'it':>7s} {'LL diff':>9s}"
    ]
    for r in report["configurations"]:
        lines.append(
            f"{r['dataset']:14s} {r['k']:2d} {r['covariance_type']:9s} {1e3 * r['ppmix']['wall_s']:9.2f} "
            f"{1e3 * r['sklearn']['wall_s']:10.2f} {r['ratio']:6.2f} {r['cpu_ratio']:5.2f} "
            f"{r['ppmix']['n_iter']:3d}/{r['sklearn']['n_iter']:<3d} {r['loglik_diff']:+9.4f}"
        )
    s = report["summary"]
    lines.append(
        f"geometric mean ratio {s['geomean_ratio']:.3f} (cpu {s['geomean_cpu_ratio']:.3f}), largest {s['max_ratio']:.3f} "
        f"(cpu {s['max_cpu_ratio']:.3f}); median LL diff {s['median_loglik_diff']:+.5f}, worst {s['worst_loglik_diff']:+.4f}"
    )
    if report["large"] is not None:
        big = report["large"]
        lines.append(
            f"N = {big['n']}: ppmix {big['ppmix']['wall_s']:.2f} s, scikit-learn {big['sklearn']['wall_s']:.2f} s, "
            f"ratio {big['ratio']:.3f}; LL diff {big['loglik_diff']:+.4f}"
        )
    lines.append(f"criterion met: {s['meets_criterion']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, no 200k fit; writes a temporary file")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT.relative_to(ROOT)})")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; quick 1)")
    parser.add_argument("--threads", type=int, default=1, help="thread variables set before the imports (default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    report = run(quick=args.quick, rounds=args.rounds)
    report["command"] = " ".join(["python", "benchmarks/_defaults_small.py", *(argv or sys.argv[1:])])
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    logger.info("%s\nwrote %s", table(report), out)
    return report


if __name__ == "__main__":
    main()
