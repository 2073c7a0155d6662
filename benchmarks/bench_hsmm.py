#!/usr/bin/env python
"""HSMM EM iteration: ``ppmix.HSMM`` on 1 000 sequences of 200 steps, ``K = 4`` states, ``max_duration = 50``.

The data are simulated in numpy: a semi-Markov chain cycling through four states (switch probabilities 0.7 to
the next state, 0.15 to each other one), durations ``1 + Poisson(rate)`` with rates 5, 10, 15, 20 (truncated at
50), three-dimensional Gaussian emissions with means -3, -1, 1, 3 and unit variances.

Only the public API and the standard clocks (``time.perf_counter``, ``time.process_time``) are used. The model
is first fitted for a few iterations (untimed, from its k-means start); then, rotating through the settings
several times:

* ``fit(X, warm_start=True, max_iter=1)``: one EM iteration from the held parameters, as a user runs it: the data
  checked and prepared, the E-step at the start (its objective), the M-step and the E-step after it (the new
  objective); an upper bound of one iteration;
* ``fit(X, warm_start=True, max_iter=3)``: three; ``(t3 - t1) / 2`` is one more iteration (one M-step and one
  E-step, the segment forward–backward over every sequence and the emissions' update);
* ``score_samples(X)``: the forward pass alone (with the data's preparation).

The medians of wall (``time.perf_counter``) and process CPU seconds (``time.process_time``: close to the work
done on a loaded machine, at one thread) are reported, with torch at ``--threads`` threads (default 1). Results go to
``benchmarks/results/hsmm.json``.

Usage::

    .venv/bin/python benchmarks/bench_hsmm.py            # full run
    .venv/bin/python benchmarks/bench_hsmm.py --quick    # smoke run (60 sequences), writes to the temp directory
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _common import early_threads, machine_load, require_torch_threads, set_torch_threads

early_threads(default=1)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ppmix import HSMM  # noqa: E402

K, MAX_DURATION, N_FEATURES = 4, 50, 3
RATES = np.array([5.0, 10.0, 15.0, 20.0])
MEANS = np.array([-3.0, -1.0, 1.0, 3.0])


def simulate(n_sequences: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    """Sequences of the planted chain (see the module's docstring), each cut at ``steps``."""
    rng = np.random.default_rng(seed)
    switch = np.full((K, K), 0.15)
    np.fill_diagonal(switch, 0.0)
    switch[np.arange(K), (np.arange(K) + 1) % K] = 0.7
    sequences = []
    for _ in range(n_sequences):
        states, state = [], int(rng.integers(K))
        while len(states) < steps:
            duration = 1 + min(int(rng.poisson(RATES[state])), MAX_DURATION - 1)
            states.extend([state] * duration)
            state = int(rng.choice(K, p=switch[state]))
        z = np.array(states[:steps])
        sequences.append(MEANS[z][:, None] + rng.normal(size=(steps, N_FEATURES)))
    return sequences


def timed(call, cpu: list[float] | None = None) -> float:
    """Wall seconds of ``call()`` (``time.perf_counter``); its process CPU seconds appended to ``cpu``."""
    start, start_cpu = time.perf_counter(), time.process_time()
    call()
    if cpu is not None:
        cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="60 sequences, two repeats")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    set_torch_threads(args.threads, uses_pomegranate=False)
    n_sequences, steps = (60, 200) if args.quick else (1000, 200)
    repeats = 2 if args.quick else args.repeats
    out = args.out or (
        Path(tempfile.gettempdir()) / "hsmm.json" if args.quick else Path(__file__).parent / "results" / "hsmm.json"
    )
    x = simulate(n_sequences, steps)
    model = HSMM(K, duration="poisson", max_duration=MAX_DURATION, tol=0.0, seed=0, progress=False)
    load_before = machine_load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: the iteration counts are set
        start_fit = timed(lambda: model.fit(x, max_iter=5))
        calls = {
            "fit_1_iteration": lambda: model.fit(x, warm_start=True, max_iter=1),
            "fit_3_iterations": lambda: model.fit(x, warm_start=True, max_iter=3),
            "score_samples": lambda: model.score_samples(x),
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                samples[name].append(timed(call, cpu[name]))
    threads = require_torch_threads(args.threads)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    order = np.argsort(model.means_[:, 0].numpy())
    report = {
        "benchmark": "hsmm_em_iteration",
        "command": "python benchmarks/bench_hsmm.py" + (" --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d"),
        "quick": args.quick,
        "config": {
            "n_sequences": n_sequences,
            "steps": steps,
            "k": K,
            "max_duration": MAX_DURATION,
            "n_features": N_FEATURES,
            "duration": "poisson",
            "emission": "gaussian",
            "repeats": repeats,
        },
        "machine": {
            "cpu_count": __import__("os").cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "torch_num_threads": threads,
            "load_before": load_before,
            "load_after": machine_load(),
        },
        "untimed_start_fit_5_iterations_s": start_fit,
        "samples_s": samples,
        "median_s": medians,
        "cpu_samples_s": cpu,
        "cpu_median_s": cpu_medians,
        "one_more_iteration_s": (medians["fit_3_iterations"] - medians["fit_1_iteration"]) / 2,
        "one_more_iteration_cpu_s": (cpu_medians["fit_3_iterations"] - cpu_medians["fit_1_iteration"]) / 2,
        "goal_s": 5.0,
        "fit_1_iteration_under_goal": medians["fit_1_iteration"] < 5.0,
        "fit_1_iteration_cpu_under_goal": cpu_medians["fit_1_iteration"] < 5.0,
        "fitted": {
            "mean_durations": model.mean_durations_[order].tolist(),
            "true_mean_durations": (RATES + 1).tolist(),
            "means": model.means_[order, 0].tolist(),
            "score": model.score(x),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    shown = ("median_s", "cpu_median_s", "one_more_iteration_s", "one_more_iteration_cpu_s")
    json.dump({k: report[k] for k in shown}, sys.stdout, indent=2)
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
