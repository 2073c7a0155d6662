#!/usr/bin/env python
"""GPU benchmark: ppmix EM iterations on CUDA vs the CPU (float32 and float64), pomegranate on CUDA as a peer.

One process, one data set per setting, every run started from the same parameters:

* ``gmm-diag``: GMM, N = 1 000 000, D = 50, K = 8, diagonal covariances;
* ``gmm-full``: GMM, N = 200 000, D = 20, K = 8, full covariances;
* ``hmm``: HMM (Baum–Welch), 2 000 sticky 8-state chains, lengths uniform in 50..150
  (about 100), D = 10, diagonal Gaussian emissions.

The common start is ppmix's own ``init_params="k-means++"`` initialisation (one greedy
k-means++ seeding, one M-step), computed once on the CPU in float64 and given to every run
through ``_set_globals`` (pomegranate: the same weights, means and covariances). A timed
iteration is one E-step and one M-step through the model's EM hooks on data prepared once
(``prepare_data`` -> ``_em_data`` -> ``_e_step`` / ``_m_step``, as the EM engine runs them;
pomegranate: ``summarize`` / ``from_summaries``). The E-step's objective is read back to the
host every iteration (the engine converts it to a float for its stopping rule), and
``torch.cuda.synchronize()`` brackets every timed block, so the time is the work done, not
the launch. Every run does ``--warmup`` untimed iterations first (CUDA context, cuBLAS
handles, the caching allocator), then ``--timed`` timed ones; the median is reported. All
runs do the same number of iterations from the same start, so the log-likelihood per point
each reaches (one more E-step after the last iteration) shows that they did the same work:
ppmix float64 on CUDA must equal ppmix float64 on the CPU to rounding.

The CPU runs use ``--threads`` threads (default: all cores) for torch, BLAS and OpenMP.
Without a CUDA device only the CPU runs are made (the JSON then says so), so ``--quick``
works as a smoke test anywhere.

Usage::

    python benchmarks/bench_gpu.py                  # full run, writes benchmarks/results/gpu.json
    python benchmarks/bench_gpu.py --quick          # tiny smoke run, writes to the temp directory
    python benchmarks/bench_gpu.py --out PATH --settings gmm-diag,hmm --no-pomegranate
"""

from __future__ import annotations

import argparse
import os
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def _early_threads() -> int:
    """``--threads`` (default: all cores) into the environment before numpy and torch start their pools."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ns, _ = pre.parse_known_args()
    for var in THREAD_VARS:
        os.environ[var] = str(ns.threads)
    return ns.threads


_early_threads()

import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib.metadata import PackageNotFoundError, version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_gpu_quick.json"


@dataclass(frozen=True)
class Setting:
    name: str
    model: str  # "gmm" or "hmm"
    n: int  # points (GMM) or sequences (HMM)
    d: int
    k: int
    covariance_type: str
    min_length: int = 0
    max_length: int = 0


FULL_SETTINGS = (
    Setting("gmm-diag", "gmm", 1_000_000, 50, 8, "diag"),
    Setting("gmm-full", "gmm", 200_000, 20, 8, "full"),
    Setting("hmm", "hmm", 2_000, 10, 8, "diag", 50, 150),
)
QUICK_SETTINGS = (
    Setting("gmm-diag", "gmm", 2_000, 10, 4, "diag"),
    Setting("gmm-full", "gmm", 1_000, 5, 4, "full"),
    Setting("hmm", "hmm", 40, 4, 3, "diag", 5, 20),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny smoke run (small data, 2 timed iterations)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/gpu.json)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: all cores)")
    p.add_argument("--timed", type=int, default=None, help="timed iterations per run (default 20; quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations before timing (default 3; quick 1)")
    p.add_argument("--settings", default="gmm-diag,gmm-full,hmm", help="comma-separated subset of the settings")
    p.add_argument("--no-pomegranate", action="store_true", help="skip pomegranate")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU runs (CUDA only)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.timed = args.timed or (2 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    return args


# ======================================================================= data
def make_gmm_data(s: Setting, seed: int) -> np.ndarray:
    """Planted mixture: pairwise mean distances ~6 component scales, random (diag or full) covariances."""
    rng = np.random.default_rng(seed)
    k, d, n = s.k, s.d, s.n
    weights = rng.dirichlet(np.full(k, 5.0))
    means = rng.normal(0.0, 6.0 / np.sqrt(2 * d), size=(k, d))
    z = rng.choice(k, size=n, p=weights)
    x = rng.standard_normal((n, d))
    for j in range(k):
        idx = np.flatnonzero(z == j)
        if s.covariance_type == "diag":
            x[idx] = means[j] + x[idx] * rng.uniform(0.5, 1.5, size=d)
        else:
            q, _ = np.linalg.qr(rng.normal(size=(d, d)))
            chol = np.linalg.cholesky((q * rng.uniform(0.25, 2.0, size=d)) @ q.T)
            x[idx] = means[j] + x[idx] @ chol.T
    return x


def make_hmm_data(s: Setting, seed: int) -> list[np.ndarray]:
    """Sticky chains (stay with probability 0.9), unit-variance emissions; all sequences simulated at once."""
    rng = np.random.default_rng(seed)
    k, d, b = s.k, s.d, s.n
    transition = np.full((k, k), 0.1 / (k - 1))
    np.fill_diagonal(transition, 0.9)
    cumulative = transition.cumsum(1)
    means = rng.normal(0.0, 1.5, size=(k, d))
    lengths = rng.integers(s.min_length, s.max_length + 1, size=b)
    z = np.empty((b, s.max_length), dtype=int)
    z[:, 0] = rng.integers(k, size=b)
    for t in range(1, s.max_length):
        u = rng.random(b)[:, None]
        z[:, t] = np.minimum((u > cumulative[z[:, t - 1]]).sum(1), k - 1)
    x = means[z] + rng.standard_normal((b, s.max_length, d))
    return [x[i, : lengths[i]] for i in range(b)]


# ================================================================== the runs
def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PpmixRun:
    """ppmix GMM/HMM on one device and dtype: EM hooks on data prepared once."""

    library = "ppmix"

    def __init__(self, s: Setting, data: Any, init: dict[str, torch.Tensor], device: str, dtype: torch.dtype) -> None:
        from ppmix import GMM, HMM

        cls = GMM if s.model == "gmm" else HMM
        self.device, self.dtype = device, str(dtype).removeprefix("torch.")
        self.key = f"ppmix-{device}-{self.dtype}"
        self.model = cls(
            s.k,
            covariance_type=s.covariance_type,
            init_params="k-means++",
            seed=0,
            device=device,
            dtype=dtype,
            progress=False,
        )
        t0 = time.perf_counter()
        prepared = self.model.prepare_data(data, fitting=True)
        self.data = self.model._em_data(prepared)
        _sync()
        self.prepare_s = time.perf_counter() - t0
        self.n_obs = self.model._n_observations(self.data)
        self.model._set_globals(init)
        self.objective = float("nan")

    def e(self) -> None:
        self._stats, objective = self.model._e_step(self.data)
        self.objective = float(objective) / self.n_obs  # read back every iteration, as the EM engine does

    def m(self) -> None:
        self.model._m_step(self.data, self._stats)

    def e_breakdown(self, reps: int) -> dict[str, float] | None:
        """HMM only: median seconds of the E-step's two parts, emission log-densities and forward-backward."""
        from ppmix.inference import forward_backward

        if not hasattr(self.model, "transition_"):
            return None
        emit_s, fb_s = [], []
        for _ in range(reps):
            _sync()
            t0 = time.perf_counter()
            log_emit = self.model._log_emissions(self.data)
            _sync()
            t1 = time.perf_counter()
            result = forward_backward(
                self.model.initial_.log(), self.model.transition_.log(), log_emit, self.data.lengths
            )
            float(result.log_likelihood.sum())
            _sync()
            t2 = time.perf_counter()
            emit_s.append(t1 - t0)
            fb_s.append(t2 - t1)
        return {"emissions_median_s": statistics.median(emit_s), "forward_backward_median_s": statistics.median(fb_s)}


class PomegranateRun:
    """pomegranate ``GeneralMixtureModel`` of ``Normal`` components: ``summarize`` / ``from_summaries``."""

    library = "pomegranate"

    def __init__(self, s: Setting, x: np.ndarray, init: dict[str, torch.Tensor], device: str, dtype: torch.dtype):
        from pomegranate.distributions import Normal
        from pomegranate.gmm import GeneralMixtureModel

        self.device, self.dtype = device, str(dtype).removeprefix("torch.")
        self.key = f"pomegranate-{device}-{self.dtype}"
        weights, means, covs = moments_from_globals(init, s.covariance_type)
        t0 = time.perf_counter()
        dists = [
            Normal(means=torch.tensor(means[j]), covs=torch.tensor(covs[j]), covariance_type=s.covariance_type)
            for j in range(s.k)
        ]
        model = GeneralMixtureModel(dists, priors=torch.tensor(weights), max_iter=1, tol=0.0, random_state=0)
        self.model = model.to(dtype).to(device)  # parameters and buffers
        self.model._reset_cache()
        for dist in self.model.distributions:
            dist._reset_cache()
        self.x = torch.as_tensor(x, dtype=dtype).to(device)
        _sync()
        self.prepare_s = time.perf_counter() - t0
        self.n_obs = x.shape[0]
        self.objective = float("nan")

    def e(self) -> None:  # E-step and the accumulation of the sufficient statistics
        self.objective = float(self.model.summarize(self.x)) / self.n_obs

    def m(self) -> None:
        self.model.from_summaries()


def moments_from_globals(init: dict[str, torch.Tensor], covariance_type: str) -> tuple[np.ndarray, ...]:
    """ppmix's global sites -> (weights, means, covariances) as float64 arrays."""
    weights, locs, scales = (init[n].detach().cpu().double().numpy() for n in ("weights", "locs", "scales"))
    if covariance_type == "diag":
        return weights, locs, scales**2
    chol = scales[..., None] * init["corr_cholesky"].detach().cpu().double().numpy()
    return weights, locs, chol @ np.swapaxes(chol, -1, -2)


def time_run(run: Any, warmup: int, timed: int) -> dict[str, Any]:
    """Median seconds per E+M iteration after ``warmup`` untimed iterations; objective after one more E-step."""
    cuda = run.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        run.e()
        run.m()
    start_objective = run.objective
    total, e_times, m_times = [], [], []
    for _ in range(timed):
        _sync()
        t0 = time.perf_counter()
        run.e()
        _sync()
        t1 = time.perf_counter()
        run.m()
        _sync()
        t2 = time.perf_counter()
        total.append(t2 - t0)
        e_times.append(t1 - t0)
        m_times.append(t2 - t1)
    run.e()  # the objective at the parameters the last iteration left
    out = {
        "library": run.library,
        "device": run.device,
        "dtype": run.dtype,
        "median_s": statistics.median(total),
        "min_s": min(total),
        "max_s": max(total),
        "e_median_s": statistics.median(e_times),
        "m_median_s": statistics.median(m_times),
        "samples_s": [round(t, 6) for t in total],
        "n_timed": timed,
        "n_warmup": warmup,
        "iterations_done": warmup + timed,
        "prepare_s": run.prepare_s,
        "mean_loglik_after_warmup": start_objective,
        "mean_loglik_final": run.objective,
        "torch_threads": torch.get_num_threads(),
    }
    breakdown = getattr(run, "e_breakdown", None)
    parts = breakdown(max(2, timed // 4)) if breakdown else None
    if parts:
        out["e_step_parts"] = parts
    if cuda:
        out["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def common_start(s: Setting, data: Any) -> tuple[dict[str, torch.Tensor], float, float]:
    """ppmix's k-means++ initialisation on the CPU in float64: the start of every run."""
    from ppmix import GMM, HMM

    cls = GMM if s.model == "gmm" else HMM
    model = cls(s.k, covariance_type=s.covariance_type, init_params="k-means++", seed=0, progress=False)
    t0 = time.perf_counter()
    em_data = model._em_data(model.prepare_data(data, fitting=True))
    model._em_initialize(em_data, model._generator(0))
    objective = float(model._e_step(em_data)[1]) / model._n_observations(em_data)
    return {k: v.detach().cpu() for k, v in model._get_globals().items()}, objective, time.perf_counter() - t0


def run_setting(s: Setting, args: argparse.Namespace, devices: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    if s.model == "gmm":
        x = make_gmm_data(s, args.seed)
        data, n_obs = torch.from_numpy(x), x.shape[0]
    else:
        seqs = make_hmm_data(s, args.seed)
        x, data, n_obs = None, seqs, int(sum(len(q) for q in seqs))
    data_s = time.perf_counter() - t0
    init, init_objective, init_s = common_start(s, data)
    print(f"[{s.name}] data {data_s:.1f} s, common start {init_s:.1f} s (mean LL {init_objective:.5f})", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    plans = [("ppmix", dev, dt) for dev in devices for dt in (torch.float64, torch.float32)]
    if s.model == "gmm" and not args.no_pomegranate and "cuda" in devices:
        plans += [("pomegranate", "cuda", dt) for dt in (torch.float64, torch.float32)]
    for library, device, dtype in plans:
        key = f"{library}-{device}-{str(dtype).removeprefix('torch.')}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run = (
                    PpmixRun(s, data, init, device, dtype)
                    if library == "ppmix"
                    else PomegranateRun(s, x, init, device, dtype)
                )
                runs[key] = time_run(run, args.warmup, args.timed)
        except Exception as err:  # a peer failing on this machine is a result, not a crash of the benchmark
            runs[key] = {
                "library": library,
                "device": device,
                "dtype": str(dtype),
                "error": f"{type(err).__name__}: {err}",
            }
        finally:
            run = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        r = runs[key]
        if "error" in r:
            print(f"[{s.name}] {key:<28} ERROR {r['error']}", flush=True)
        else:
            print(
                f"[{s.name}] {key:<28} {r['median_s']:9.5f} s/iter (E {r['e_median_s']:.5f}, M {r['m_median_s']:.5f})"
                f"  mean LL {r['mean_loglik_final']:.8f}",
                flush=True,
            )
    ratios: dict[str, float] = {}
    ok = {k: r for k, r in runs.items() if "error" not in r}
    ref = ok.get("ppmix-cpu-float64")
    for dt in ("float64", "float32"):
        cpu, gpu, pom = ok.get(f"ppmix-cpu-{dt}"), ok.get(f"ppmix-cuda-{dt}"), ok.get(f"pomegranate-cuda-{dt}")
        if cpu and gpu:
            ratios[f"cpu_over_cuda_{dt}"] = cpu["median_s"] / gpu["median_s"]
        if gpu and pom:
            ratios[f"ppmix_over_pomegranate_cuda_{dt}"] = gpu["median_s"] / pom["median_s"]
    for r in ok.values():
        if ref:
            r["dloglik_vs_cpu_float64"] = r["mean_loglik_final"] - ref["mean_loglik_final"]
    return {
        "name": s.name,
        "model": s.model,
        "n": s.n,
        "n_observations": n_obs,
        "d": s.d,
        "k": s.k,
        "covariance_type": s.covariance_type,
        "sequence_lengths": [s.min_length, s.max_length] if s.model == "hmm" else None,
        "mean_loglik_at_start": init_objective,
        "data_s": data_s,
        "common_start_s": init_s,
        "runs": runs,
        "ratios": ratios,
    }


# ================================================================ reporting
def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info(threads: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": None,
        "torch_threads": torch.get_num_threads(),
        "threads_requested": threads,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "numpy": np.__version__,
        "pyro-ppl": _version("pyro-ppl"),
        "pomegranate": _version("pomegranate"),
        "cuda_available": torch.cuda.is_available(),
        "gpu": None,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {
            "name": props.name,
            "memory_gib": props.total_memory / 2**30,
            "multiprocessors": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
        }
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"]
            info["gpu"]["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def format_table(settings: list[dict[str, Any]]) -> str:
    head = f"{'setting':<9} {'run':<28} {'s/iter':>10} {'E s':>9} {'M s':>9} {'mean LL':>15} {'dLL vs cpu64':>12}"
    lines = [head, "-" * len(head)]
    for st in settings:
        for key, r in st["runs"].items():
            if "error" in r:
                lines.append(f"{st['name']:<9} {key:<28} ERROR {r['error'][:80]}")
                continue
            lines.append(
                f"{st['name']:<9} {key:<28} {r['median_s']:10.5f} {r['e_median_s']:9.5f} {r['m_median_s']:9.5f} "
                f"{r['mean_loglik_final']:15.8f} {r.get('dloglik_vs_cpu_float64', float('nan')):12.1e}"
            )
        if st["ratios"]:
            lines.append("          ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in st["ratios"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_pomegranate:
        try:  # its import resets the OpenMP thread count: import it before setting ours
            import pomegranate.distributions  # noqa: F401
        except ImportError as err:
            print(f"pomegranate not importable ({err}); skipping it", flush=True)
            args.no_pomegranate = True
    torch.set_num_threads(args.threads)
    devices = ([] if args.no_cpu else ["cpu"]) + (["cuda"] if torch.cuda.is_available() else [])
    wanted = {n.strip() for n in args.settings.split(",") if n.strip()}
    settings = [s for s in (QUICK_SETTINGS if args.quick else FULL_SETTINGS) if s.name in wanted]
    info = machine_info(args.threads)
    print(json.dumps(info), flush=True)
    started = time.perf_counter()
    results = [run_setting(s, args, devices) for s in settings]
    report = {
        "benchmark": "gpu_em_iteration",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/bench_gpu.py", *(sys.argv[1:] if argv is None else argv)]),
        "quick": args.quick,
        "config": {
            "threads": args.threads,
            "timed": args.timed,
            "warmup": args.warmup,
            "seed": args.seed,
            "start": "ppmix init_params='k-means++' on the CPU in float64, shared by every run",
            "devices": devices,
            "pomegranate": not args.no_pomegranate,
        },
        "machine": info,
        "settings": results,
        "total_wall_s": time.perf_counter() - started,
    }
    if torch.get_num_threads() != args.threads:
        report["warning"] = f"torch ran with {torch.get_num_threads()} threads, not {args.threads}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(format_table(results))
    print(f"wrote {args.out} ({report['total_wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
