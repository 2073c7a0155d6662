"""HMM EM (Baum–Welch) iteration: ppmix vs hmmlearn ``GaussianHMM`` (diagonal), same data, same start.

Run ``.venv/bin/python benchmarks/bench_hmm.py`` (``--quick`` for a smoke run). Each library
starts from the same parameters (ppmix's k-means initialisation) and runs one EM
iteration at a time through its public API (hmmlearn: ``fit`` with ``n_iter=1`` and
``init_params=""``; ppmix: ``e_step`` + ``m_step``), so both follow the same EM path; the
median seconds per iteration and the log-likelihood per step after the timed
iterations are reported. Results go to ``benchmarks/results/hmm.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import numpy as np


def make_sequences(n_sequences: int, d: int, k: int, seed: int) -> list[np.ndarray]:
    """Sticky K-state chains with lengths uniform in 10..50 and unit-variance Gaussian emissions."""
    rng = np.random.default_rng(seed)
    transition = np.full((k, k), 0.1 / (k - 1))
    np.fill_diagonal(transition, 0.9)
    means = rng.normal(0.0, 1.5, size=(k, d))
    seqs = []
    for _ in range(n_sequences):
        n = int(rng.integers(10, 51))
        z = np.empty(n, dtype=int)
        z[0] = rng.integers(k)
        for t in range(1, n):
            z[t] = rng.choice(k, p=transition[z[t - 1]])
        seqs.append(means[z] + rng.normal(size=(n, d)))
    return seqs


def time_iterations(step, n_iter: int) -> list[float]:
    times = []
    for _ in range(n_iter):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def run(n_sequences: int, d: int, k: int, n_iter: int, seed: int) -> dict:
    import torch
    from hmmlearn.hmm import GaussianHMM

    from ppmix.inference import ConvergenceWarning
    from ppmix.models.hmm import HMM

    seqs = make_sequences(n_sequences, d, k, seed)
    frames = np.concatenate(seqs)
    lengths = [len(s) for s in seqs]
    ours = HMM(k, seed=seed, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(seqs, max_iter=1)
    start = ours.get_globals()
    data = ours.em_data(ours.prepare_data(seqs))

    def ours_step() -> None:
        stats, _ = ours.e_step(data)
        ours.m_step(data, stats)

    ref = GaussianHMM(k, covariance_type="diag", n_iter=1, tol=0.0, init_params="", params="stmc", min_covar=1e-6)
    ref.startprob_ = start["initial"].numpy()
    ref.transmat_ = start["transition"].numpy()
    ref.means_ = start["locs"].numpy()
    ref.covars_ = start["scales"].numpy() ** 2
    ours.set_globals(start)
    ours_step(), ref.fit(frames, lengths)  # warm-up iteration for both
    ours_times = time_iterations(ours_step, n_iter)
    ref_times = time_iterations(lambda: ref.fit(frames, lengths), n_iter)
    n_frames = int(sum(lengths))
    ours_ll = ours.score(seqs)
    ref_ll = float(ref.score(frames, lengths)) / n_frames
    return {
        "n_sequences": n_sequences,
        "n_frames": n_frames,
        "d": d,
        "k": k,
        "iterations_timed": n_iter,
        "ppmix_s_per_iter": statistics.median(ours_times),
        "hmmlearn_s_per_iter": statistics.median(ref_times),
        "speedup_vs_hmmlearn": statistics.median(ref_times) / statistics.median(ours_times),
        "ppmix_loglik_per_step": ours_ll,
        "hmmlearn_loglik_per_step": ref_ll,
        "loglik_diff_per_step": ours_ll - ref_ll,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/hmm.json)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    sizes = [(50, 5)] if args.quick else [(2000, 10), (8000, 5)]
    results = [run(n, 20, 4, n_iter, seed=0) for n, n_iter in sizes]
    import hmmlearn

    report = {
        "benchmark": "hmm_em_iteration",
        "command": "python benchmarks/bench_hmm.py" + (" --quick" if args.quick else ""),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "hmmlearn": hmmlearn.__version__,
        "results": results,
    }
    out = Path(args.out or ("/tmp/ppmix_bench_hmm_quick.json" if args.quick else "benchmarks/results/hmm.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"{'sequences':>9} {'frames':>8} {'ppmix s/it':>11} {'hmmlearn s/it':>14} {'speed-up':>9} {'dLL/step':>10}")
    for r in results:
        print(
            f"{r['n_sequences']:9d} {r['n_frames']:8d} {r['ppmix_s_per_iter']:11.4f} {r['hmmlearn_s_per_iter']:14.4f} "
            f"{r['speedup_vs_hmmlearn']:9.2f} {r['loglik_diff_per_step']:10.2e}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
