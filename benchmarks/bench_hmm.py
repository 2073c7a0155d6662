#!/usr/bin/env python
"""HMM EM (Baum–Welch) iteration: ppmix vs hmmlearn ``GaussianHMM`` vs pomegranate ``DenseHMM``, diagonal emissions.

One run, the same data for every library: sticky ``K = 4``-state chains, ``D = 20``
unit-variance Gaussian emissions, sequence lengths uniform in 10..50 (N = 2 000
sequences, and a larger N to show how the cost scales).

Every library starts from the same parameters and runs one EM iteration at a time. The
start is ppmix's ``init_params="random"`` initialisation (random responsibilities, an
M-step, one EM iteration; ``--start kmeans`` for k-means), far enough from the optimum
that the log-likelihood per step climbs from about -37 to -28.85 over the first
iterations, so equal log-likelihoods show equal EM paths:

* ppmix: ``_e_step`` + ``_m_step`` on the batch prepared once by ``_em_data`` (float64
  and float32), with ``reg_covar=0`` (default 1e-6) so that every library computes the
  same maximum-likelihood variances;
* hmmlearn: ``GaussianHMM(covariance_type="diag", n_iter=1, init_params="",
  params="stmc", covars_prior=0).fit(X, lengths)`` (float64; its default
  ``covars_prior=1e-2`` would add ``1e-2 / N_k`` to every variance, a MAP update);
* pomegranate: ``DenseHMM.summarize`` on every equal-length group of sequences (it
  takes 3-D tensors, so the sequences are grouped by length once, untimed), then
  ``from_summaries`` (float32, its default, and float64). ``DenseHMM`` also models
  an explicit end state: its M-step re-estimates end probabilities and scales the
  transition rows by them. The benchmark starts it with end probabilities one (log
  0) and, inside every timed iteration, resets them to one and renormalises the
  transition rows, so pomegranate fits the same model as the other two (an
  ``O(K^2)`` step).

So all libraries follow the same EM path. Each runs one untimed warm-up iteration,
scored. The timed iterations then run in blocks; the
order of the libraries rotates from block to block, and each block starts with a
short idle gap and one untimed iteration. The median wall and CPU (process) seconds
per iteration are reported. After the timing every library has run the same number of
iterations, and its parameters are scored by one float64 evaluator (emission
log-densities in numpy, then ``ppmix.algorithms.forward_backward``): the log-likelihood
per step. Results go to ``benchmarks/results/hmm.json``.

Threads: ``--threads`` (default 1) limits torch, BLAS and OpenMP. On a shared, loaded
machine, multi-threaded torch loses most of its time in OpenMP barriers (the
forward–backward issues many small operations per time step), so the default is 1,
where CPU time is close to the work done. Importing pomegranate (apricot, then numba's
parallel layer) resets the OpenMP thread count that torch uses to the number of CPUs;
the script imports it before setting the count and checks the count after timing.

Usage::

    .venv/bin/python benchmarks/bench_hmm.py            # full run
    .venv/bin/python benchmarks/bench_hmm.py --quick    # smoke run, writes to the temp directory
"""

from __future__ import annotations

import argparse
import os
import sys

from _common import early_threads, require_torch_threads, set_torch_threads, sticky_paths

# Thread limits must be in the environment before numpy/torch load their pools.
early_threads(default=1)

import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "hmm.json"

# (initial, transition, means, variances) as float64 arrays
Params = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def make_sequences(n_sequences: int, d: int, k: int, seed: int) -> list[np.ndarray]:
    """Sticky K-state chains with lengths uniform in 10..50 and unit-variance Gaussian emissions."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.5, size=(k, d))
    return [means[z] + rng.normal(size=(len(z), d)) for z in sticky_paths(rng, n_sequences, k)]


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


# ===================================================================== runners
class PpmixRunner:
    """ppmix ``HMM``: ``_e_step`` + ``_m_step`` on the batch prepared once."""

    library = "ppmix"

    def __init__(self, seqs: list[np.ndarray], k: int, dtype: torch.dtype, init_params: str) -> None:
        from ppmix.inference import ConvergenceWarning
        from ppmix.models.hmm import HMM

        self.dtype = str(dtype).replace("torch.", "")
        self.key = f"ppmix-{self.dtype}"
        self.model = HMM(k, reg_covar=0.0, init_params=init_params, dtype=dtype, seed=0, progress=False)
        with warnings.catch_warnings():  # one iteration creates the fitted state; start() overwrites it
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.model.fit(seqs, max_iter=1)
        self.data = self.model._em_data(self.model.prepare_data(seqs))

    def start(self, init: dict[str, np.ndarray]) -> None:
        self.model._set_globals({name: torch.as_tensor(value) for name, value in init.items()})

    def step(self) -> None:
        stats, objective = self.model._e_step(self.data)
        float(objective)
        self.model._m_step(self.data, stats)

    def params(self) -> Params:
        m = self.model
        return _np(m.initial_), _np(m.transition_), _np(m.means_), _np(m.covariances_)


class HmmlearnRunner:
    """hmmlearn ``GaussianHMM`` (diag): ``fit`` with ``n_iter=1`` and no re-initialisation."""

    library = "hmmlearn"
    dtype = "float64"
    key = "hmmlearn-float64"

    def __init__(self, seqs: list[np.ndarray], k: int) -> None:
        from hmmlearn.hmm import GaussianHMM

        self.frames = np.concatenate(seqs)
        self.lengths = [len(s) for s in seqs]
        # covars_prior=0: the default 1e-2 adds 1e-2 / (expected state count) to every variance (a MAP update)
        self.model = GaussianHMM(
            k, covariance_type="diag", n_iter=1, tol=0.0, init_params="", params="stmc", covars_prior=0.0
        )

    def start(self, init: dict[str, np.ndarray]) -> None:
        self.model.startprob_ = init["initial"].copy()
        self.model.transmat_ = init["transition"].copy()
        self.model.means_ = init["locs"].copy()
        self.model.covars_ = init["scales"] ** 2  # diagonal covars_ are variances

    def step(self) -> None:
        self.model.fit(self.frames, self.lengths)

    def params(self) -> Params:
        m = self.model
        variances = np.stack([np.diag(c) for c in m.covars_])  # the getter returns full matrices
        return _np(m.startprob_), _np(m.transmat_), _np(m.means_), variances


class PomegranateRunner:
    """pomegranate ``DenseHMM``: ``summarize`` per equal-length group, ``from_summaries``, end state removed."""

    library = "pomegranate"

    def __init__(self, seqs: list[np.ndarray], k: int, dtype: torch.dtype) -> None:
        self.k = k
        self.torch_dtype = dtype
        self.dtype = str(dtype).replace("torch.", "")
        self.key = f"pomegranate-{self.dtype}"
        lengths = np.array([len(s) for s in seqs])
        self.groups = [
            torch.as_tensor(np.stack([seqs[i] for i in np.flatnonzero(lengths == n)]), dtype=dtype)
            for n in np.unique(lengths)
        ]

    def start(self, init: dict[str, np.ndarray]) -> None:
        from pomegranate.distributions import Normal
        from pomegranate.hmm import DenseHMM

        dt = self.torch_dtype
        dists = [
            Normal(
                means=torch.tensor(init["locs"][j], dtype=dt),
                covs=torch.tensor(init["scales"][j] ** 2, dtype=dt),
                covariance_type="diag",
            )
            for j in range(self.k)
        ]
        model = DenseHMM(
            dists,
            edges=torch.tensor(init["transition"], dtype=dt),
            starts=torch.tensor(init["initial"], dtype=dt),
            ends=torch.ones(self.k, dtype=dt),  # log 1 = 0: no end state
        )
        self.model = model.to(dt)  # parameters and buffers in the dtype (built in it, so their caches are too)

    def step(self) -> None:
        for group in self.groups:
            self.model.summarize(group)
        self.model.from_summaries()
        with torch.no_grad():  # drop the re-estimated end state: the same model as the other libraries
            self.model.ends.zero_()
            self.model.edges -= torch.logsumexp(self.model.edges, dim=1, keepdim=True)

    def params(self) -> Params:
        m = self.model
        means = np.stack([_np(d.means) for d in m.distributions])
        variances = np.stack([_np(d.covs) for d in m.distributions])
        return np.exp(_np(m.starts)), np.exp(_np(m.edges)), means, variances


# =================================================================== measuring
def loglik_per_step(params: Params, seqs: list[np.ndarray]) -> float:
    """The one evaluator: float64 diagonal-Gaussian emissions (numpy), then the batched forward–backward."""
    from ppmix.algorithms.forward_backward import forward_backward

    initial, transition, means, variances = params
    lengths = np.array([len(s) for s in seqs])
    padded = np.zeros((len(seqs), lengths.max(), means.shape[1]))
    for b, s in enumerate(seqs):
        padded[b, : len(s)] = s
    diff = padded[:, :, None, :] - means[None, None]  # (B, T, K, D)
    log_emit = -0.5 * ((diff**2 / variances).sum(-1) + np.log(2 * np.pi * variances).sum(-1))
    result = forward_backward(
        torch.as_tensor(np.log(initial)),
        torch.as_tensor(np.log(transition)),
        torch.as_tensor(log_emit),
        torch.as_tensor(lengths),
    )
    return float(result.log_likelihood.sum()) / int(lengths.sum())


def time_iterations(runners: list[Any], timed: int, passes: int, gap_s: float = 0.3) -> dict[str, dict[str, Any]]:
    """Median wall and CPU seconds per EM iteration, blocks of iterations in rotating library order.

    Before each block the process
    idles ``gap_s`` and runs one untimed iteration, so thread pools left spinning by the
    library timed before do not steal this one's cores. Every runner runs the same
    number of iterations in all.
    """
    passes = max(1, min(passes, timed))
    blocks = [timed // passes + (1 if i < timed % passes else 0) for i in range(passes)]
    wall: dict[str, list[float]] = {r.key: [] for r in runners}
    cpu: dict[str, list[float]] = {r.key: [] for r in runners}
    for p, size in enumerate(blocks):
        for r in runners[p % len(runners) :] + runners[: p % len(runners)]:
            time.sleep(gap_s)
            r.step()
            for _ in range(size):
                c0, t0 = time.process_time(), time.perf_counter()
                r.step()
                wall[r.key].append(time.perf_counter() - t0)
                cpu[r.key].append(time.process_time() - c0)
    return {
        key: {
            "median_s": statistics.median(wall[key]),
            "min_s": min(wall[key]),
            "max_s": max(wall[key]),
            "cpu_median_s": statistics.median(cpu[key]),
            "n_timed": len(wall[key]),
            "samples_s": [round(t, 5) for t in wall[key]],
        }
        for key in wall
    }


def end_to_end(seqs: list[np.ndarray], k: int, repeats: int) -> dict[str, Any]:
    """What a user times: ``HMM(K, seed=0).fit(seqs)`` against hmmlearn's
    ``GaussianHMM(K, random_state=0).fit(X, lengths)``, every other argument at its default (each
    library's own start and tolerance), at 1 thread; median wall over ``repeats`` alternating fits,
    the final log-likelihood per step from :func:`loglik_per_step`."""
    from hmmlearn.hmm import GaussianHMM

    from ppmix.models.hmm import HMM

    frames, lengths = np.concatenate(seqs), [len(s) for s in seqs]
    fits = {
        "ppmix": lambda: HMM(k, seed=0, progress=False).fit(seqs),
        "hmmlearn": lambda: GaussianHMM(k, random_state=0).fit(frames, lengths),
    }
    walls: dict[str, list[float]] = {name: [] for name in fits}
    models: dict[str, Any] = {}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for repeat in range(repeats):
            for name in list(fits)[repeat % 2 :] + list(fits)[: repeat % 2]:
                time.sleep(0.2)
                start = time.perf_counter()
                models[name] = fits[name]()
                walls[name].append(time.perf_counter() - start)
    torch.set_num_threads(previous)
    ours, theirs = models["ppmix"], models["hmmlearn"]
    params = {
        "ppmix": (_np(ours.initial_), _np(ours.transition_), _np(ours.means_), _np(ours.covariances_)),
        "hmmlearn": (
            theirs.startprob_,
            theirs.transmat_,
            theirs.means_,
            np.stack([np.diag(c) for c in theirs.covars_]),
        ),
    }
    out: dict[str, Any] = {
        name: {
            "fit_wall_s": statistics.median(walls[name]),
            "fit_walls_s": walls[name],
            "loglik_per_step": loglik_per_step(params[name], seqs),
        }
        for name in fits
    }
    out["ratio_ppmix_vs_hmmlearn"] = out["ppmix"]["fit_wall_s"] / out["hmmlearn"]["fit_wall_s"]
    return out


def run_size(n_sequences: int, args: argparse.Namespace) -> dict[str, Any]:
    """All libraries on one data set: the same start, timed iterations, final log-likelihood per step."""
    seqs = make_sequences(n_sequences, args.d, args.k, seed=0)
    runners: list[Any] = [PpmixRunner(seqs, args.k, dtype, args.start) for dtype in (torch.float64, torch.float32)]
    runners.append(HmmlearnRunner(seqs, args.k))
    if not args.no_pomegranate:
        runners += [PomegranateRunner(seqs, args.k, torch.float32), PomegranateRunner(seqs, args.k, torch.float64)]
    init = {name: _np(value) for name, value in runners[0].model._get_globals().items()}
    for r in runners:
        r.start(init)
    start_ll = loglik_per_step(runners[0].params(), seqs)
    after_one = {}
    for r in runners:  # one untimed warm-up iteration, scored: the first step of the EM path
        r.step()
        after_one[r.key] = loglik_per_step(r.params(), seqs)
    timing = time_iterations(runners, args.timed, args.passes)
    used_threads = require_torch_threads(args.threads)
    reference = timing["hmmlearn-float64"]
    libraries = []
    for r in runners:
        row = {"key": r.key, "library": r.library, "dtype": r.dtype, **timing[r.key]}
        row["ratio_to_hmmlearn"] = row["median_s"] / reference["median_s"]
        row["cpu_ratio_to_hmmlearn"] = row["cpu_median_s"] / reference["cpu_median_s"]
        row["loglik_per_step_after_1_iteration"] = after_one[r.key]
        row["loglik_per_step"] = loglik_per_step(r.params(), seqs)
        libraries.append(row)
    ref = next(row for row in libraries if row["key"] == "hmmlearn-float64")
    for row in libraries:
        row["loglik_diff_vs_hmmlearn_after_1_iteration"] = (
            row["loglik_per_step_after_1_iteration"] - ref["loglik_per_step_after_1_iteration"]
        )
        row["loglik_diff_vs_hmmlearn"] = row["loglik_per_step"] - ref["loglik_per_step"]
    return {
        "end_to_end": end_to_end(seqs, args.k, 1 if args.quick else 3),
        "n_sequences": n_sequences,
        "n_frames": int(sum(len(s) for s in seqs)),
        "n_pomegranate_groups": len(np.unique([len(s) for s in seqs])),
        "d": args.d,
        "k": args.k,
        "start": args.start,
        "torch_threads": used_threads,
        "iterations_run_per_library": 1 + args.passes + args.timed,
        "loglik_per_step_at_start": start_ll,
        "libraries": libraries,
    }


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (writes to the temp directory)")
    parser.add_argument("--threads", type=int, default=1, help="threads for torch, BLAS and OpenMP (default 1)")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="numbers of sequences (default 2000 8000)")
    parser.add_argument("--timed", type=int, default=None, help="timed iterations per library (default 8; quick 2)")
    parser.add_argument("--passes", type=int, default=None, help="blocks per library, order rotated (default 4)")
    parser.add_argument(
        "--start",
        default="random",
        choices=["random", "kmeans"],
        help="ppmix init_params giving the common start (default random: far from the optimum, so the EM path moves)",
    )
    parser.add_argument("--no-pomegranate", action="store_true", help="skip pomegranate")
    parser.add_argument("--out", default=None, help=f"JSON path (default {DEFAULT_OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    args.d, args.k = 20, 4
    args.sizes = args.sizes or ([60] if args.quick else [2000, 8000])
    args.timed = args.timed or (2 if args.quick else 8)
    args.passes = args.passes or (1 if args.quick else 4)
    set_torch_threads(args.threads, uses_pomegranate=not args.no_pomegranate)

    started = time.perf_counter()
    load_before = _load_average()
    with threadpool_limits(limits=args.threads):
        results = []
        for n in args.sizes:
            results.append(run_size(n, args))
            results[-1]["load_average_after"] = _load_average()
    report = {
        "benchmark": "hmm_em_iteration",
        "command": " ".join(["python", "benchmarks/bench_hmm.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.date.today().isoformat(),
        "seconds": time.perf_counter() - started,
        "threads": args.threads,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": load_before,
        },
        "versions": {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "hmmlearn": version("hmmlearn"),
            **({} if args.no_pomegranate else {"pomegranate": version("pomegranate")}),
        },
        "results": results,
    }
    quick_out = Path(tempfile.gettempdir()) / "ppmix_bench_hmm_quick.json"
    out = Path(args.out) if args.out else (quick_out if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    header = (
        f"{'N':>6} {'frames':>7} {'library':>20} {'s/iter':>9} {'cpu s':>8} {'/hmmlearn':>9} {'LL/step':>12} {'dLL':>9}"
    )
    for res in results:
        e2e = res["end_to_end"]
        print(
            f"end to end, defaults, 1 thread, {res['n_sequences']} sequences: ppmix {e2e['ppmix']['fit_wall_s']:.3f} s "
            f"(LL/step {e2e['ppmix']['loglik_per_step']:.6f}), hmmlearn {e2e['hmmlearn']['fit_wall_s']:.3f} s "
            f"(LL/step {e2e['hmmlearn']['loglik_per_step']:.6f}): ratio {e2e['ratio_ppmix_vs_hmmlearn']:.2f}"
        )
    print(header)
    for res in results:
        for row in res["libraries"]:
            print(
                f"{res['n_sequences']:6d} {res['n_frames']:7d} {row['key']:>20} {row['median_s']:9.4f} "
                f"{row['cpu_median_s']:8.4f} {row['ratio_to_hmmlearn']:9.3f} {row['loglik_per_step']:12.6f} "
                f"{row['loglik_diff_vs_hmmlearn']:9.1e}"
            )
    print(f"threads {args.threads}, load average before {load_before}, {report['seconds']:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
