#!/usr/bin/env python
"""Default starts of every registered family: does ``Mixture(K, family=...).fit(X)`` reach the optimum?

For every family registered in :data:`ppmix.components.registry.FAMILIES`, planted data (``N`` rows from ``K``
components with random parameters of moderate overlap: :func:`ppmix.datasets.families.make_family_mixture`), for
each of 10 data seeds:

* the **default** fit, ``Mixture(K, family=name, seed=seed)``: its final mean log-likelihood, whether it
  converged within the default ``max_iter``, its iterations and seconds;
* the **best of 10 random starts**, ``init_params="random"`` with seeds 0..9, each run to convergence
  (``max_iter=RANDOM_MAX_ITER``): the reference optimum;
* **pomegranate's default** (``GeneralMixtureModel`` of the matching distribution, its defaults: a k-means
  start of three Lloyd steps on the raw rows, up to 1000 iterations, ``tol=0.1`` on the total log-likelihood)
  where pomegranate has the family (gamma, categorical, Bernoulli, Poisson, exponential): its fitted
  parameters re-scored by ppmix (:func:`rescore`, float64), and its fit's seconds.

Per family: the median over the seeds of the default's final log-likelihood minus the best random start's
(nats per row; the criterion is ``>= -1e-3``), the fraction of default fits converged, the median iterations,
pomegranate's median gap beside it and the median ratio of ppmix's default fit time to pomegranate's.

Usage::

    .venv/bin/python benchmarks/_defaults_starts.py           # N = 2000, K = 3, 10 seeds -> results/defaults_starts.json
    .venv/bin/python benchmarks/_defaults_starts.py --quick   # N = 600, 2 seeds, 3 random starts, to a temp file
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable

from _common import early_threads

if __name__ == "__main__":  # thread limits before numpy and torch load (bench_defaults.py sets its own)
    early_threads(default=1)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import machine_load, set_torch_threads  # noqa: E402

from ppmix import Mixture  # noqa: E402
from ppmix.components.registry import FAMILIES, family_class  # noqa: E402
from ppmix.datasets.families import make_family_mixture  # noqa: E402

logger = logging.getLogger("defaults_starts")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "defaults_starts.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_defaults_starts_quick.json"
#: the criterion: a default fit's median final log-likelihood at most this far below the best random start's
TOLERANCE = 1e-3
#: the families a mixture takes: every registered one but those whose frames need their sequence (autoregressive)
MIXTURE_FAMILIES = tuple(name for name in FAMILIES if not hasattr(family_class(name), "sequence_rows"))
#: iterations a random start may run (to convergence: it is the reference)
RANDOM_MAX_ITER = 5000


def fit_mixture(family: str, x: np.ndarray, k: int, **options: Any) -> tuple[Mixture, float]:
    """A ppmix mixture fitted on ``x`` with ``options`` and its seconds (warnings, e.g. of no convergence, off)."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Mixture(k, family=family, progress=False, **options).fit(x)
    return model, time.perf_counter() - start


def best_random(family: str, x: np.ndarray, k: int, starts: int) -> tuple[float, int]:
    """The best final mean log-likelihood of ``starts`` random starts (seeds ``0..starts-1``, each run to
    convergence) and their median iterations."""
    fits = [fit_mixture(family, x, k, seed=s, init_params="random", max_iter=RANDOM_MAX_ITER)[0] for s in range(starts)]
    return max(float(m.score(x)) for m in fits), int(statistics.median(m.n_iter_ for m in fits))


def _peers() -> dict[str, tuple[Callable[[], Any], Callable[[Any], dict[str, torch.Tensor]]]]:
    """pomegranate's distribution for each family it has, and its fitted parameters as ppmix's sites."""
    from pomegranate.distributions import Bernoulli, Categorical, Exponential, Gamma, Poisson

    return {
        "gamma": (Gamma, lambda d: {"concentration": d.shapes, "rate": d.rates}),
        "categorical": (Categorical, lambda d: {"probs": d.probs}),
        "bernoulli": (Bernoulli, lambda d: {"probs": d.probs}),
        "poisson": (Poisson, lambda d: {"rate": d.lambdas}),
        "exponential": (Exponential, lambda d: {"rate": 1 / d.scales}),
    }


def rescore(family: str, x: np.ndarray, k: int, weights: torch.Tensor, sites: dict[str, torch.Tensor]) -> float:
    """The mean log-likelihood of ``x`` under a ``family`` mixture with these parameters, scored by ppmix
    (float64): a one-iteration fit records the data's scale and the fitted state, then takes the parameters."""
    model, _ = fit_mixture(family, x, k, seed=0, max_iter=1)
    model._set_globals(
        {"weights": weights.detach().to(torch.float64), **{n: v.detach().to(torch.float64) for n, v in sites.items()}}
    )
    return float(model.score(x))


def pomegranate_default(family: str, x: np.ndarray, k: int, seed: int) -> tuple[float | None, float]:
    """pomegranate's default fit of ``family`` (seed ``seed``): ppmix's mean log-likelihood of its parameters
    (None where its fit fails: an error, or NaN parameters), and its seconds."""
    from pomegranate.gmm import GeneralMixtureModel

    make, sites = _peers()[family]
    xt = torch.from_numpy(x.astype(np.int64) if family == "categorical" else x.astype(np.float32))
    start = time.perf_counter()
    try:
        model = GeneralMixtureModel([make() for _ in range(k)], random_state=seed).fit(xt)
    except RuntimeError as error:  # e.g. its Categorical on an empty k-means cluster: "max(): Expected reduction dim"
        logger.debug("pomegranate's %s fit failed: %s", family, error)
        return None, time.perf_counter() - start
    seconds = time.perf_counter() - start
    probs = model.priors.detach().to(torch.float64)
    merged = {
        name: torch.stack([sites(d)[name] for d in model.distributions]) for name in sites(model.distributions[0])
    }
    if not all(bool(torch.isfinite(v).all()) for v in (probs, *merged.values())):
        return None, seconds  # pomegranate's fit failed (NaN parameters)
    if family == "bernoulli":  # float32 probabilities may round just past 1
        merged["probs"] = merged["probs"].clamp(0.0, 1.0)
    return rescore(family, x, k, probs, merged), seconds


def measure_seed(family: str, n: int, k: int, seed: int, starts: int) -> dict[str, Any]:
    """One data seed of ``family``: the default fit, the best random start and pomegranate's default."""
    x, _ = make_family_mixture(family, n, k, seed=seed)
    model, seconds = fit_mixture(family, x, k, seed=seed)
    best, random_iter = best_random(family, x, k, starts)
    row: dict[str, Any] = {
        "seed": seed,
        "default_loglik": float(model.score(x)),
        "best_random_loglik": best,
        "gap": float(model.score(x)) - best,
        "converged": bool(model.converged_),
        "n_iter": int(model.n_iter_),
        "random_median_n_iter": random_iter,
        "seconds": seconds,
    }
    if family in _peers():
        peer_loglik, peer_seconds = pomegranate_default(family, x, k, seed)
        peer_gap = None if peer_loglik is None else peer_loglik - best
        row.update(peer_loglik=peer_loglik, peer_gap=peer_gap, peer_seconds=peer_seconds)
    return row


def summarise(family: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A family's medians over its seeds (the criterion: the median gap at least ``-TOLERANCE``)."""
    gap = statistics.median(r["gap"] for r in rows)
    summary: dict[str, Any] = {
        "median_gap": gap,
        "worst_gap": min(r["gap"] for r in rows),
        "fraction_converged": sum(r["converged"] for r in rows) / len(rows),
        "median_n_iter": statistics.median(r["n_iter"] for r in rows),
        "median_seconds": statistics.median(r["seconds"] for r in rows),
        "passes": gap >= -TOLERANCE and all(r["converged"] for r in rows),
        "pomegranate_median_gap": None,
        "pomegranate_failures": None,
        "median_time_ratio_ppmix_over_pomegranate": None,
    }
    if "peer_gap" in rows[0]:
        finite = [r["peer_gap"] for r in rows if r["peer_gap"] is not None]
        summary["pomegranate_failures"] = len(rows) - len(finite)
        summary["pomegranate_median_gap"] = statistics.median(finite) if finite else None
        summary["median_time_ratio_ppmix_over_pomegranate"] = statistics.median(
            r["seconds"] / r["peer_seconds"] for r in rows
        )
    return {"family": family, **summary, "per_seed": rows}


def run(quick: bool = False, families: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Measure the default start of every family (or of ``families``); the report as a JSON-able dict.

    ``quick``: ``N = 600``, 2 seeds and 3 random starts (a smoke run); otherwise ``N = 2000``, 10 seeds and 10
    random starts. ``K = 3`` throughout.
    """
    n, seeds, starts = (600, 2, 3) if quick else (2000, 10, 10)
    k = 3
    results = []
    for family in families or MIXTURE_FAMILIES:
        rows = []
        for seed in range(seeds):
            rows.append(measure_seed(family, n, k, seed, starts))
            logger.debug("%s seed %d: %s", family, seed, rows[-1])
        results.append(summarise(family, rows))
        logger.info("%s", _table_row(results[-1]))
    return {
        "benchmark": "defaults_starts",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "settings": {
            "n": n,
            "k": k,
            "seeds": seeds,
            "random_starts": starts,
            "tolerance": TOLERANCE,
            "random_max_iter": RANDOM_MAX_ITER,
            "default_max_iter": Mixture().max_iter,
        },  # fmt: skip
        "threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "pomegranate": version("pomegranate")},
        "load": machine_load(),
        "results": results,
    }


HEADER = (
    f"{'family':<12} {'median gap':>11} {'worst gap':>11} {'converged':>9} {'n_iter':>7} {'pass':>5} "
    f"{'pomegranate gap':>15} {'failed':>8} {'time ratio':>10}"
)


def _table_row(result: dict[str, Any]) -> str:
    peer_gap, ratio = result["pomegranate_median_gap"], result["median_time_ratio_ppmix_over_pomegranate"]
    fails = result["pomegranate_failures"]
    return (
        f"{result['family']:<12} {result['median_gap']:>11.2e} {result['worst_gap']:>11.2e} "
        f"{result['fraction_converged']:>9.0%} {result['median_n_iter']:>7.0f} {str(result['passes']):>5} "
        f"{'-' if peer_gap is None else f'{peer_gap:.2e}':>15} {'-' if fails is None else fails:>8} "
        f"{'-' if ratio is None else f'{ratio:.2f}':>10}"
    )


def table(report: dict[str, Any]) -> str:
    """The report as a text table, one family a line."""
    return "\n".join([HEADER, *(_table_row(result) for result in report["results"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: N = 600, 2 seeds, 3 random starts")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--families", nargs="+", choices=MIXTURE_FAMILIES, help="default: every registered family of rows"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT}; --quick: {QUICK_OUT})"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    logger.setLevel(logging.INFO)
    set_torch_threads(args.threads, uses_pomegranate=True)
    report = run(args.quick, tuple(args.families) if args.families else None)
    print(table(report))
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
