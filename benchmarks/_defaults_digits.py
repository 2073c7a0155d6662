#!/usr/bin/env python
"""Held-out log-likelihood of the default GMM on scikit-learn's raw ``load_digits``, against scikit-learn.

The 1 797 digit images (64 pixels, grey levels 0-16, unscaled; several pixels constant or nearly so) are split
75/25 by ``train_test_split(random_state=split)``. On each split ``GMM(10, covariance_type=ct, seed=0)`` and
``GaussianMixture(10, covariance_type=ct, random_state=0)``, both with every other setting at its default, fit
the training rows; each scores the held-out rows (mean log-likelihood per row, ``score``). A pixel that is blank
in the training rows of a cluster but not in a held-out row costs about ``x^2 / (2 floor)`` nats there, so the
variance floor of near-constant pixels decides most of the difference (scikit-learn adds ``reg_covar = 1e-6`` to
every variance; ppmix floors each feature at ``reg_covar`` times its squared robust spread).

Usage::

    .venv/bin/python benchmarks/_defaults_digits.py            # 5 splits, diag and full (about 10 s)
    .venv/bin/python benchmarks/_defaults_digits.py --quick    # 2 splits (smoke run)
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
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ppmix import GMM  # noqa: E402

logger = logging.getLogger("defaults_digits")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "defaults_digits.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_defaults_digits_quick.json"
COVARIANCE_TYPES = ("diag", "full")
N_COMPONENTS = 10


def held_out(x: np.ndarray, split: int, covariance_type: str) -> dict[str, float]:
    """Mean held-out log-likelihood per row of ppmix's and scikit-learn's default fits on one 75/25 split."""
    from sklearn.mixture import GaussianMixture
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(x, test_size=0.25, random_state=split)
    with warnings.catch_warnings():  # unconverged-fit warnings: the defaults are what is measured
        warnings.simplefilter("ignore")
        ours = GMM(N_COMPONENTS, covariance_type=covariance_type, seed=0, progress=False).fit(train)
        theirs = GaussianMixture(N_COMPONENTS, covariance_type=covariance_type, random_state=0).fit(train)
    return {
        "split": split,
        "ppmix": float(ours.score(test)),
        "sklearn": float(theirs.score(test)),
        "ppmix_train": float(ours.score(train)),
        "sklearn_train": float(theirs.score(train)),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """The digits held-out comparison: per covariance type, each split's mean held-out log-likelihood per row of
    ppmix and scikit-learn, their medians and the splits where ppmix scores at least as well.

    Parameters
    ----------
    quick : bool, default False
        Two splits instead of five.

    Returns
    -------
    dict
        ``{"n_components", "splits", "covariance_types": {ct: {"runs": [...], "median_ppmix",
        "median_sklearn", "ppmix_at_least_sklearn"}}}``.
    """
    from sklearn.datasets import load_digits

    x = load_digits().data.astype(np.float64)
    splits = list(range(2 if quick else 5))
    report: dict[str, Any] = {"n_components": N_COMPONENTS, "splits": splits, "covariance_types": {}}
    for covariance_type in COVARIANCE_TYPES:
        runs = []
        for split in splits:
            runs.append(held_out(x, split, covariance_type))
            logger.info(
                "%s split %d: ppmix %.1f, sklearn %.1f", covariance_type, split, runs[-1]["ppmix"], runs[-1]["sklearn"]
            )
        report["covariance_types"][covariance_type] = {
            "runs": runs,
            "median_ppmix": statistics.median(r["ppmix"] for r in runs),
            "median_sklearn": statistics.median(r["sklearn"] for r in runs),
            "ppmix_at_least_sklearn": sum(r["ppmix"] >= r["sklearn"] for r in runs),
        }
    return report


def table(report: dict[str, Any]) -> str:
    """The report as a text table: one line per covariance type and split, then the medians."""
    lines = [f"{'covariance':<10} {'split':>5} {'ppmix':>12} {'sklearn':>12}"]
    for covariance_type, entry in report["covariance_types"].items():
        for r in entry["runs"]:
            lines.append(f"{covariance_type:<10} {r['split']:>5} {r['ppmix']:12.1f} {r['sklearn']:12.1f}")
        lines.append(
            f"{covariance_type:<10} {'median':>5} {entry['median_ppmix']:12.1f} {entry['median_sklearn']:12.1f}"
            f"   (ppmix >= sklearn on {entry['ppmix_at_least_sklearn']} of {len(entry['runs'])} splits)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 splits (smoke run)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    report = {
        "benchmark": "defaults_digits",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "threads": args.threads,
        **run(args.quick),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"mean held-out log-likelihood per row (nats). Wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
