"""Default fits on real and small data, side by side with the peers a user would otherwise pick.

Three sections, each its own module with a ``run(quick)`` that returns its part of the report:

* ``small`` (:mod:`_defaults_small`): a default ``GMM`` on standardised iris, wine and breast cancer
  (K = 2, 3, 5; the four covariance types) against scikit-learn's default ``GaussianMixture``: time
  ratios (median of interleaved repetitions) and mean log-likelihoods, and the ratio at N = 200 000;
* ``starts`` (:mod:`_defaults_starts`): the default start of every family against the best of ten random
  starts on planted data (ten seeds), and pomegranate's default fit of the same mixtures;
* ``digits`` (:mod:`_defaults_digits`): raw ``load_digits`` (near-constant pixels), the default
  ``GMM(10)`` and scikit-learn's default scored on held-out rows.

Usage::

    python benchmarks/bench_defaults.py                       # all sections, writes benchmarks/results/defaults.json
    python benchmarks/bench_defaults.py --sections small      # one section
    python benchmarks/bench_defaults.py --quick               # smoke run, writes to the temp directory

Every section runs at ``--threads`` threads (default 1), set before numpy and torch load.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import early_threads  # noqa: E402

THREADS = early_threads(1)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import _defaults_digits  # noqa: E402
import _defaults_small  # noqa: E402
import _defaults_starts  # noqa: E402
from _common import machine_load, set_torch_threads  # noqa: E402

SECTIONS = {"small": _defaults_small, "starts": _defaults_starts, "digits": _defaults_digits}
RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run of every section (seconds, not minutes)")
    parser.add_argument("--threads", type=int, default=1, help="threads for torch, BLAS and OpenMP (default 1)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default results/defaults.json; temp with --quick)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    set_torch_threads(THREADS, uses_pomegranate=True)
    out = args.out or (
        Path(tempfile.gettempdir()) / "ppmix_bench_defaults_quick.json" if args.quick else RESULTS / "defaults.json"
    )
    report = {"benchmark": "defaults", "quick": args.quick, "threads": THREADS, "date": time.strftime("%Y-%m-%d %H:%M")}
    for name in names:
        started = time.perf_counter()
        report[name] = SECTIONS[name].run(quick=args.quick)
        report[name]["section_wall_s"] = round(time.perf_counter() - started, 2)
        logging.info("%s: %.1f s", name, report[name]["section_wall_s"])
    report["machine_load"] = machine_load()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    for name in names:
        print(f"\n== {name}\n{SECTIONS[name].table(report[name])}")
    logging.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
