#!/usr/bin/env python
"""Benchmark exact EM on shards (:func:`ppmix.distributed.fit_em`) against in-memory EM, up to N = 10^8 rows.

Model and data: ``GMM(8, covariance_type="diag", dtype=float32)``, D = 10, data planted from a
known 8-component diagonal mixture (weights ~ Dirichlet(5), means ~ N(0, (6/sqrt(2D))^2),
standard deviations ~ U(0.5, 1.5); seed ``--seed``), written as ``.npy`` shards of 10^6 float32
rows in ``--data-dir`` (default ``<tmp>/ppmix_bench_scale``). Shards already there with the right
shape and seed are reused, so a second run does not write the 4 GB again.

Every fit starts from the same parameters: a GMM fitted for one EM iteration on a 20 000-row
sample (the first rows of the first shards), copied with ``warm_start=True``; every fit runs a
fixed number of iterations with ``tol=0``, so the work per iteration is the same everywhere.
Each measurement runs in a fresh spawned process, so its peak resident memory (``ru_maxrss``)
is its own:

1. ``in_memory_1e7``: the first 10 shards (N = 10^7) loaded into one array in the process,
   ``GMM.fit``; seconds per iteration = one ``_m_step`` plus the following ``_e_step`` (both
   timed around the calls the fit makes; preparing the data and the initial E-step excluded),
   median over the iterations; also the fit's wall time over its iterations; peak RSS.
2. ``sharded_1e7``: the same 10 shards through ``fit_em`` on a Dask
   ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``; seconds per iteration
   = median of ``fit_report_["iteration_seconds"]`` after the first (the E-step and statistics on
   the workers plus the merge; the driver's M-step update is a few microseconds; the first E-step,
   which also prepares every shard's centred data, belongs to the start as in 1.); the ratio of its per-row
   cost to in-memory's (goal 1.3); peak RSS of every worker and of the driver, which never
   holds the data.
3. ``sharded_1e8``: 100 shards (N = 10^8, 4 GB of float32 on disk) on the same kind of cluster
   (goal: 10 s per iteration, driver memory independent of N). Before it runs, the memory of a
   worker holding 50 shards is estimated (measured per shard in 2., and counted: x and centred x
   = 80 bytes a row; the fused E-step's temporaries are one block of rows);
   if two workers would not fit in the memory then available, fewer shards are used and the
   JSON says so.
4. ``sklearn_1e7``: scikit-learn's ``GaussianMixture(8, covariance_type="diag")`` on the same
   10^7 rows in float64 (its working precision), from the same start: seconds per iteration of
   its private ``_e_step`` + ``_m_step`` (``--peer-api internal``, full run) or of
   ``fit(warm_start=True, max_iter=1)`` calls (``public``, ``--quick``; one extra E-step per
   call), median; peak RSS.
5. ``bound``: FLOPs and bytes of one iteration beside the measured times. FLOPs: the E-step
   product ``[N x 2D] [2D x K]`` and the statistics product ``[K x N] [N x 2D]`` (``8 N D K``),
   plus ``N K`` exponentials. Bytes: *as implemented* (the fused E-step reads the centred
   ``N x D`` float32 data once: ``[x, x^2]`` and the responsibilities of a block of rows stay in
   cache), which is also the *minimal* traffic. The rates are measured in the script
   with torch: a 2048^3 float32 GEMM and ``exp`` at one thread (times the 2 cores used), and
   memory read bandwidth (``sum`` of a large tensor) at the run's thread count; the bound is the
   roofline ``max(compute time, memory time)``, reported as measured / bound; beside it the same
   FLOPs at the rate torch reaches on the E-step's own shape ``[K, 2D] x [2D, N]`` (1 thread).

``--quick`` runs the same steps on tiny data (4 and 8 shards of 20 000 rows, the Dask cluster
in-process) and writes the same keys, each with ``N`` saying what was measured.

Usage::

    .venv/bin/python benchmarks/bench_scale.py            # full run, writes benchmarks/results/scale.json
    .venv/bin/python benchmarks/bench_scale.py --quick    # smoke run, writes <tmp>/ppmix_bench_scale_quick.json
"""

from __future__ import annotations

import argparse
import os
import sys

from _common import early_threads, machine_load

# Only in the script's own process: a spawned measurement inherits the environment, and the
# Dask worker processes get the nanny's OMP_NUM_THREADS=1 (importing this module there must not undo it).
if __name__ == "__main__":
    early_threads(default=2)

import copy  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import pickle  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

logger = logging.getLogger("bench_scale")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "scale.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_scale_quick.json"
DEFAULT_DATA = Path(tempfile.gettempdir()) / "ppmix_bench_scale"
QUICK_DATA = Path(tempfile.gettempdir()) / "ppmix_bench_scale_quick"
GB = 1024**3
D, K = 10, 8
FULL = {"rows": 1_000_000, "small": 10, "large": 100, "iters": 5, "iters_large": 4, "sk_iters": 3, "sample": 20_000}
QUICK = {"rows": 20_000, "small": 4, "large": 8, "iters": 3, "iters_large": 2, "sk_iters": 2, "sample": 4_000}
NOTE = (
    "a shared 2-core machine: timings are noisy; the load average and CPU pressure are recorded before and after "
    "every measurement; peak RSS is ru_maxrss of each process."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny smoke run (4 and 8 shards of 20 000 rows)")
    p.add_argument(
        "--out", type=Path, help=f"JSON path (default {DEFAULT_OUT.relative_to(ROOT)}; --quick: {QUICK_OUT})"
    )
    p.add_argument(
        "--data-dir", type=Path, help=f"where the shards are (default {DEFAULT_DATA}; --quick: {QUICK_DATA})"
    )
    p.add_argument("--threads", type=int, default=2, help="torch/BLAS threads of the in-memory fits (default 2)")
    p.add_argument("--workers", type=int, default=2, help="Dask workers, one thread each (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the planted mixture and of the fits")
    p.add_argument(
        "--peer-api",
        choices=("internal", "public"),
        default=None,
        help="scikit-learn stepped through private _e_step/_m_step (default of a full run) "
        "or public fit(warm_start=True, max_iter=1) calls (default of --quick)",
    )
    p.add_argument("--skip", default="", help="comma-separated measurements to skip (e.g. sklearn_1e7,sharded_1e8)")
    args = p.parse_args(argv)
    args.sizes = QUICK if args.quick else FULL
    args.peer_api = args.peer_api or ("public" if args.quick else "internal")
    args.out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    args.data_dir = args.data_dir or (QUICK_DATA if args.quick else DEFAULT_DATA)
    return args


# ======================================================================= data
def planted_mixture(seed: int) -> dict[str, np.ndarray]:
    """The known 8-component diagonal mixture the shards are drawn from."""
    rng = np.random.default_rng(seed)
    return {
        "weights": rng.dirichlet(np.full(K, 5.0)),
        "means": rng.normal(0.0, 6.0 / math.sqrt(2 * D), size=(K, D)),
        "stds": rng.uniform(0.5, 1.5, size=(K, D)),
    }


def ensure_shards(data_dir: Path, n_shards: int, rows: int, seed: int) -> list[str]:
    """Paths of ``n_shards`` shards of ``rows`` rows: reused when present with the right shape, else written."""
    data_dir.mkdir(parents=True, exist_ok=True)
    truth = planted_mixture(seed)
    means, stds = truth["means"].astype(np.float32), truth["stds"].astype(np.float32)
    paths, written = [], 0
    t0 = time.perf_counter()
    for i in range(n_shards):
        path = data_dir / f"seed{seed}-rows{rows}-d{D}-{i:04d}.npy"
        paths.append(str(path))
        try:
            existing = np.load(path, mmap_mode="r")
            if existing.shape == (rows, D) and existing.dtype == np.float32:
                continue
        except (OSError, ValueError):
            pass
        rng = np.random.default_rng([seed, i])
        z = rng.choice(K, size=rows, p=truth["weights"])
        x = rng.standard_normal((rows, D), dtype=np.float32)
        x *= stds[z]
        x += means[z]
        tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
        np.save(tmp, x)
        os.replace(tmp, path)  # atomic: a concurrent run never reads half a shard
        written += 1
    logger.info("%d shards in %s (%d written, %.1f s)", n_shards, data_dir, written, time.perf_counter() - t0)
    return paths


def load_rows(paths: list[str], dtype: Any) -> np.ndarray:
    """The shards stacked into one array of ``dtype`` (filled shard by shard: no second copy)."""
    first = np.load(paths[0], mmap_mode="r")
    out = np.empty((first.shape[0] * len(paths), first.shape[1]), dtype=dtype)
    at = 0
    for path in paths:
        part = np.load(path)
        out[at : at + len(part)] = part
        at += len(part)
    return out[:at]


# ============================================================ child processes
def peak_rss_gb() -> float:
    """This process's peak resident set (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / GB


def _quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter reached with tol=0: the ConvergenceWarning is expected
        return fn(*args, **kwargs)


def _load_start(cfg: dict[str, Any]) -> Any:
    with open(cfg["start_path"], "rb") as f:
        return pickle.load(f)


def part_start(cfg: dict[str, Any]) -> dict[str, Any]:
    """The common start: one EM iteration (k-means initialisation) on a sample of the first shards."""
    import torch

    from ppmix import GMM

    torch.set_num_threads(cfg["threads"])
    per = max(1, cfg["sample"] // len(cfg["paths"]))
    sample = np.concatenate([np.load(p, mmap_mode="r")[:per] for p in cfg["paths"]])
    gmm = GMM(K, covariance_type="diag", dtype=torch.float32, seed=cfg["seed"], progress=False)
    _quiet(gmm.fit, sample, max_iter=1, tol=0.0)
    gmm.warm_start = True
    with open(cfg["start_path"], "wb") as f:
        pickle.dump(gmm, f)
    # what a worker holds per shard: the prepared data (x and its centred copy), counted on the first shard
    held = gmm._em_data(gmm.prepare_data(np.load(cfg["paths"][0])))
    held_bytes = sum(t.untyped_storage().nbytes() for t in (held.rows.x, held.rows.centred))
    return {
        "sample_rows": int(len(sample)),
        "mean_loglik_on_sample": float(gmm.lower_bound_),
        "held_bytes_per_shard": held_bytes,
    }


def part_in_memory(cfg: dict[str, Any]) -> dict[str, Any]:
    """``GMM.fit`` on all rows in this process; every ``_e_step``/``_m_step`` call timed."""
    import torch

    from ppmix import GMM

    torch.set_num_threads(cfg["threads"])
    start = _load_start(cfg)
    t0 = time.perf_counter()
    x = load_rows(cfg["paths"], np.float32)
    load_s = time.perf_counter() - t0
    calls: dict[str, list[float]] = {"e_step": [], "m_step": []}
    originals = {name: getattr(GMM, f"_{name}") for name in calls}  # the engine hooks are private

    def timed(name: str) -> Callable[..., Any]:
        def call(self: Any, *args: Any) -> Any:
            t = time.perf_counter()
            out = originals[name](self, *args)
            if name == "e_step":
                float(out[1])  # the engine reads the objective at once too
            calls[name].append(time.perf_counter() - t)
            return out

        return call

    model = copy.deepcopy(start)
    try:
        for name in calls:
            setattr(GMM, f"_{name}", timed(name))
        t0 = time.perf_counter()
        _quiet(model.fit, x, max_iter=cfg["iters"], tol=0.0)
        fit_s = time.perf_counter() - t0
    finally:
        for name, fn in originals.items():
            setattr(GMM, f"_{name}", fn)
    e, m = calls["e_step"], calls["m_step"]
    per_iter = [m[i] + e[i + 1] for i in range(len(m))]  # the first E-step belongs to the start
    return {
        "N": int(x.shape[0]),
        "n_shards": len(cfg["paths"]),
        "threads": torch.get_num_threads(),
        "iterations": int(model.n_iter_),
        "s_per_iter": statistics.median(per_iter),
        "s_per_iter_samples": per_iter,
        "e_step_s": e,
        "m_step_s": m,
        "fit_wall_s": fit_s,
        "fit_wall_over_iters_s": fit_s / model.n_iter_,
        "load_s": load_s,
        "peak_rss_gb": peak_rss_gb(),
        "final_mean_loglik": float(model.lower_bound_),
        "history": [float(v) for v in model.history_],
    }


def _worker_state() -> dict[str, Any]:
    import psutil
    import torch

    return {
        "rss_gb": psutil.Process().memory_info().rss / GB,
        "peak_rss_gb": peak_rss_gb(),
        "threads": torch.get_num_threads(),
    }


def _worker_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def part_sharded(cfg: dict[str, Any]) -> dict[str, Any]:
    """``fit_em`` on a Dask LocalCluster; this process is the driver and never holds the data."""
    import dask
    import distributed
    import torch

    logging.getLogger("distributed").setLevel(logging.WARNING)  # not every connection the cluster opens and closes

    from ppmix.distributed import fit_em

    torch.set_num_threads(cfg["threads"])
    start = _load_start(cfg)
    driver_before = rss_gb()
    memory = {
        "distributed.worker.memory.target": False,  # the held shards are not spillable data: never spill or pause
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": 0.95 if cfg["memory_limit"] else False,  # the guard against swapping
    }
    options = {
        "n_workers": cfg["workers"],
        "threads_per_worker": 1,
        "processes": cfg["processes"],
        "dashboard_address": None,
        "memory_limit": cfg["memory_limit"] or 0,
    }
    t_cluster = time.perf_counter()
    with dask.config.set(memory), distributed.LocalCluster(**options) as cluster, distributed.Client(cluster) as client:
        cluster_s = time.perf_counter() - t_cluster
        client.run(_worker_threads, 1)
        before = client.run(_worker_state)
        driver_cluster = rss_gb()
        with distributed.get_task_stream(client) as stream:
            t0 = time.perf_counter()
            model = _quiet(fit_em, copy.deepcopy(start), cfg["paths"], executor=client, max_iter=cfg["iters"], tol=0.0)
            fit_s = time.perf_counter() - t0
        after = client.run(_worker_state)
        holds: dict[str, int] = {}
        for task in stream.data:
            if str(task.get("key", "")).startswith("('_dask_hold") or "_dask_hold" in str(task.get("key", "")):
                holds[task["worker"]] = holds.get(task["worker"], 0) + 1
    report = model.fit_report_
    it = report["iteration_seconds"]
    n = sum(s["n_observations"] for s in report["shards"])
    shard_ll = [s["e_step_seconds_mean"] for s in report["shards"]]
    return {
        "N": int(n),
        "n_shards": len(cfg["paths"]),
        "rows_per_shard": cfg["rows"],
        "cluster": {**options, "memory_limit_gb": (cfg["memory_limit"] or 0) / GB, "start_s": cluster_s},
        "worker_torch_threads": sorted({w["threads"] for w in before.values()}),
        "iterations": int(model.n_iter_),
        "s_per_iter": statistics.median(it[1:]),  # as in memory: the first E-step belongs to the start
        "iteration_seconds": it,
        "first_e_step_s": it[0],
        "fit_wall_s": fit_s,
        "read_seconds": report["read_seconds"],
        "shard_read_seconds_median": statistics.median(s["read_seconds"] for s in report["shards"]),
        "shard_e_step_seconds_median": statistics.median(shard_ll),
        "shards_per_worker": sorted(holds.values()),
        "peak_rss_worker_gb": max(w["peak_rss_gb"] for w in after.values()),
        "peak_rss_workers_gb": sorted(w["peak_rss_gb"] for w in after.values()),
        "rss_worker_before_fit_gb": max(w["rss_gb"] for w in before.values()),
        "peak_rss_driver_gb": peak_rss_gb(),
        "rss_driver_before_cluster_gb": driver_before,
        "rss_driver_with_cluster_gb": driver_cluster,
        "final_mean_loglik": float(model.lower_bound_),
        "history": [float(v) for v in model.history_],
    }


def part_sklearn(cfg: dict[str, Any]) -> dict[str, Any]:
    """scikit-learn's EM on all rows in float64, from the common start."""
    from _common import sklearn_private, sklearn_public_em
    from threadpoolctl import threadpool_limits

    start = _load_start(cfg)
    weights = start.weights_.double().numpy()
    weights /= weights.sum()  # exactly normalised in float64, as scikit-learn checks
    means = start.means_.double().numpy()
    variances = start.covariances_.double().numpy()
    x = load_rows(cfg["paths"], np.float64)
    samples: list[float] = []
    with threadpool_limits(limits=cfg["threads"]):
        if cfg["peer_api"] == "public":
            gm = sklearn_public_em(weights, means, variances, "diag", 1e-6, cfg["seed"])

            def step() -> float:
                _quiet(gm.fit, x)
                return float(gm.lower_bound_)

            method = "median over fit(warm_start=True, max_iter=1) calls (each also runs a final E-step)"
        else:
            from sklearn.mixture import GaussianMixture, _gaussian_mixture

            gm = GaussianMixture(K, covariance_type="diag", reg_covar=1e-6, random_state=cfg["seed"])
            gm.weights_, gm.means_, gm.covariances_ = weights, means, variances
            gm.precisions_cholesky_ = sklearn_private(_gaussian_mixture, "_compute_precision_cholesky")(
                variances, "diag"
            )
            e_step, m_step = sklearn_private(gm, "_e_step"), sklearn_private(gm, "_m_step")

            def step() -> float:
                log_prob_norm, log_resp = e_step(x)
                m_step(x, log_resp)
                return float(log_prob_norm)

            method = "median over private _e_step(X) + _m_step(X, log_resp) iterations, after one untimed"
            step()
        loglik = float("nan")
        for _ in range(cfg["iters"]):
            t0 = time.perf_counter()
            loglik = step()
            samples.append(time.perf_counter() - t0)
    return {
        "N": int(x.shape[0]),
        "dtype": "float64",
        "api": cfg["peer_api"],
        "method": method,
        "threads": cfg["threads"],
        "s_per_iter": statistics.median(samples),
        "s_per_iter_samples": samples,
        "peak_rss_gb": peak_rss_gb(),
        "mean_loglik_last_e_step": loglik,
    }


def part_rates(cfg: dict[str, Any]) -> dict[str, Any]:
    """Single-core GEMM and exp rates, and memory read bandwidth, measured with torch."""
    import torch

    def best(fn: Callable[[], Any], repeat: int) -> float:
        fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    torch.set_num_threads(1)
    n = 1024 if cfg["quick"] else 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    gemm = 2 * n**3 / best(lambda: a @ b, 3)
    rows = 200_000 if cfg["quick"] else 2_000_000
    moments, natural = torch.randn(rows, 2 * D), torch.randn(K, 2 * D)
    skinny = 2 * rows * 2 * D * K / best(lambda: natural @ moments.T, 3)  # the (K, rows) orientation of the E-step
    logits = torch.randn(rows, K)
    exp = rows * K / best(lambda: logits.exp(), 3)
    big = torch.ones((1 << 24) if cfg["quick"] else (1 << 27))  # 64 MiB / 512 MiB of float32, far beyond cache
    bandwidth = {}
    for threads in sorted({1, cfg["threads"], cfg["workers"]}):
        torch.set_num_threads(threads)
        bandwidth[threads] = big.numel() * 4 / best(lambda: big.sum(), 3)
    return {
        "gemm_flops_1thread": gemm,
        "gemm_size": n,
        "skinny_gemm_flops_1thread": skinny,
        "skinny_shape": [rows, 2 * D, K],
        "exp_per_s_1thread": exp,
        "read_bytes_per_s": {str(t): v for t, v in bandwidth.items()},
    }


PARTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "start": part_start,
    "in_memory": part_in_memory,
    "sharded": part_sharded,
    "sklearn": part_sklearn,
    "rates": part_rates,
}


def _child(part: str, cfg: dict[str, Any], out: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    result = PARTS[part](cfg)
    Path(out).write_text(json.dumps(result, default=float))


def run_child(part: str, cfg: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one measurement in a fresh spawned process (its ``ru_maxrss`` is then its own); its result or an error."""
    out = workdir / f"{part}-{time.monotonic_ns()}.json"
    process = multiprocessing.get_context("spawn").Process(target=_child, args=(part, cfg, str(out)))
    t0 = time.perf_counter()
    process.start()
    process.join()
    if process.exitcode != 0 or not out.exists():
        logger.error("%s failed (exit code %s)", part, process.exitcode)
        return {"error": f"the measurement process exited with code {process.exitcode}"}
    result = json.loads(out.read_text())
    logger.info("%s done in %.1f s", part, time.perf_counter() - t0)
    return result


# ===================================================================== bound
def bound(n: int, rates: dict[str, Any], cores: int, threads: int, measured_s: float) -> dict[str, Any]:
    """The FLOP and byte bound of one EM iteration on ``n`` rows, beside the measured seconds."""
    flops = 8 * n * D * K  # E: [N,2D][2D,K]; statistics: [K,N][N,2D]; 2 flops a multiply-add
    exps = n * K
    bytes_implemented = 4 * n * D  # the fused E-step reads the centred rows once; [x, x^2] and r_nk stay in cache
    bytes_minimal = 4 * n * D
    compute_s = flops / (cores * rates["gemm_flops_1thread"]) + exps / (cores * rates["exp_per_s_1thread"])
    bandwidth = rates["read_bytes_per_s"][str(threads)]
    skinny_s = flops / (cores * rates["skinny_gemm_flops_1thread"]) + exps / (cores * rates["exp_per_s_1thread"])
    implemented_s = max(compute_s, bytes_implemented / bandwidth)
    minimal_s = max(compute_s, bytes_minimal / bandwidth)
    return {
        "N": n,
        "flops": flops,
        "exps": exps,
        "bytes_as_implemented": bytes_implemented,
        "bytes_minimal": bytes_minimal,
        "compute_s": compute_s,
        "bound_as_implemented_s": implemented_s,
        "bound_minimal_s": minimal_s,
        "measured_s": measured_s,
        "measured_over_bound_as_implemented": measured_s / implemented_s,
        "measured_over_bound_minimal": measured_s / minimal_s,
        "compute_at_skinny_gemm_rate_s": skinny_s,
        "measured_over_compute_at_skinny_gemm_rate": measured_s / skinny_s,
    }


def memory_plan(small: dict[str, Any], held_bytes: int, n_large: int, workers: int) -> dict[str, Any]:
    """Memory of the large run: every shard held (counted on a real shard) plus, per worker, its base and the
    transient memory of reading and stepping (measured in the small run); the number of shards that fit."""
    import psutil

    per_worker_small = max(small["shards_per_worker"] or [math.ceil(small["n_shards"] / workers)])
    base = small["rss_worker_before_fit_gb"]
    measured = (small["peak_rss_worker_gb"] - base) / per_worker_small  # allocator slack included
    per_shard = max(held_bytes / GB, measured)
    transient = max(0.0, small["peak_rss_worker_gb"] - base - held_bytes / GB * per_worker_small)
    available = psutil.virtual_memory().available / GB
    budget = min(0.9 * available, available - 2.0)  # the driver, this process, and the other processes' growth
    needed = n_large * per_shard + workers * (base + transient)
    fits = needed <= budget
    n_used = n_large if fits else max(workers, int((budget - workers * (base + transient)) / per_shard))
    return {
        "available_gb": available,
        "budget_gb": budget,
        "held_per_shard_counted_gb": held_bytes / GB,
        "per_shard_measured_gb": measured,
        "per_shard_gb": per_shard,
        "worker_base_gb": base,
        "worker_transient_gb": transient,
        "needed_gb": needed,
        "per_worker_needed_gb": base + transient + per_shard * math.ceil(n_large / workers),
        "fits": fits,
        "n_shards_used": min(n_used, n_large),
        # the nanny ends a worker past 95% of this: room for an uneven split, never the whole machine
        "memory_limit_per_worker_gb": min(1.15 * budget / workers, budget - base),
    }


# ====================================================================== main
def _git_commit(where: Path) -> str | None:
    """The commit of the ppmix checkout measured (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def machine_info(threads: int) -> dict[str, Any]:
    import dask
    import sklearn
    import torch

    import ppmix

    cpu = "unknown"
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    import psutil

    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "memory_gb": psutil.virtual_memory().total / GB,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "sklearn": sklearn.__version__,
        "dask": dask.__version__,
        "ppmix": ppmix.__version__,
        "ppmix_file": ppmix.__file__,
        "ppmix_commit": _git_commit(Path(ppmix.__file__).parent),
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    sizes, skip = args.sizes, {s.strip() for s in args.skip.split(",") if s.strip()}
    t_start = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "gmm_scale",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "note": NOTE,
        "config": {
            "D": D,
            "K": K,
            "covariance_type": "diag",
            "dtype": "float32",
            "rows_per_shard": sizes["rows"],
            "shards_small": sizes["small"],
            "shards_large": sizes["large"],
            "iterations": sizes["iters"],
            "iterations_large": sizes["iters_large"],
            "sklearn_iterations": sizes["sk_iters"],
            "start_sample_rows": sizes["sample"],
            "seed": args.seed,
            "threads": args.threads,
            "workers": args.workers,
            "peer_api": args.peer_api,
            "data_dir": str(args.data_dir),
            "start": "GMM fitted 1 EM iteration (k-means init) on the sample, copied with warm_start=True; tol=0",
        },
        "machine": machine_info(args.threads),
        "load_start": machine_load(),
    }
    paths = ensure_shards(args.data_dir, sizes["large"], sizes["rows"], args.seed)
    small, large = paths[: sizes["small"]], paths
    failed = False
    with tempfile.TemporaryDirectory(prefix="ppmix_bench_scale_") as tmp:
        work = Path(tmp)
        base = {"threads": args.threads, "seed": args.seed, "quick": args.quick, "start_path": str(work / "start.pkl")}
        base.update(rows=sizes["rows"], workers=args.workers, processes=not args.quick, memory_limit=0)
        report["start"] = run_child("start", {**base, "paths": small, "sample": sizes["sample"]}, work)
        report["rates"] = run_child("rates", base, work)
        runs = [
            ("in_memory_1e7", "in_memory", {"paths": small, "iters": sizes["iters"]}),
            ("sharded_1e7", "sharded", {"paths": small, "iters": sizes["iters"]}),
            ("sklearn_1e7", "sklearn", {"paths": small, "iters": sizes["sk_iters"], "peer_api": args.peer_api}),
        ]
        for key, part, extra in runs:
            if key not in skip:
                report[key] = run_child(part, {**base, **extra}, work)
                report["load_after_" + key] = machine_load()
        if "sharded_1e8" not in skip:
            entry: dict[str, Any] = {"goal_s_per_iter": 10}
            use = large
            if "error" not in report.get("sharded_1e7", {"error": ""}):
                held = report["start"].get("held_bytes_per_shard", 4 * D * 4 * sizes["rows"])
                plan = memory_plan(report["sharded_1e7"], held, len(large), args.workers)
                report["memory_plan_1e8"] = plan
                logger.info("memory plan for %d shards: %s", len(large), plan)
                use = large[: plan["n_shards_used"]]
                mem = 0 if args.quick else int(plan["memory_limit_per_worker_gb"] * GB)
                if not plan["fits"]:
                    entry["reduced"] = (
                        f"{len(large)} shards need about {plan['needed_gb']:.1f} GB in all; "
                        f"measured on the {len(use)} that fit in {plan['budget_gb']:.1f} GB"
                    )
            else:
                mem = 0
            entry.update(
                run_child("sharded", {**base, "paths": use, "iters": sizes["iters_large"], "memory_limit": mem}, work)
            )
            report["sharded_1e8"] = entry
            report["load_after_sharded_1e8"] = machine_load()
    # ------------------------------------------------------------- derived
    mem, shard, big, skl = (report.get(k, {}) for k in ("in_memory_1e7", "sharded_1e7", "sharded_1e8", "sklearn_1e7"))
    for entry in (mem, shard, big, skl):
        failed |= "error" in entry
    if "s_per_iter" in mem:
        per_row = mem["s_per_iter"] / mem["N"]
        for entry in (shard, big, skl):
            if "s_per_iter" in entry:
                entry["ratio_to_in_memory_per_row"] = entry["s_per_iter"] / entry["N"] / per_row
        if "s_per_iter" in shard:
            shard["goal_ratio_to_in_memory_per_row"] = 1.3
            shard["final_mean_loglik_rel_diff_vs_in_memory"] = abs(
                shard["final_mean_loglik"] - mem["final_mean_loglik"]
            ) / abs(mem["final_mean_loglik"])
    if "s_per_iter" in big and "peak_rss_driver_gb" in shard:
        big["driver_memory_vs_N"] = {
            "goal": "driver memory independent of N",
            "peak_rss_driver_gb_at_N": {
                str(shard["N"]): shard["peak_rss_driver_gb"],
                str(big["N"]): big["peak_rss_driver_gb"],
            },
            "ratio": big["peak_rss_driver_gb"] / shard["peak_rss_driver_gb"],
        }
    rates = report.get("rates", {})
    if "gemm_flops_1thread" in rates:
        report["bound"] = {
            "cores": args.workers,
            "rates": rates,
            "model": "roofline max(compute, memory): compute = 8NDK GEMM flops / (cores x 1-thread GEMM rate) "
            "+ NK exps / (cores x 1-thread exp rate); memory = bytes / read bandwidth at the run's thread count; "
            "as implemented: the fused, row-blocked E-step reads the centred N x D float32 once ([x, x^2] and the "
            "responsibilities of a block stay in cache), the same as minimal: N x D float32 once; "
            "compute_at_skinny_gemm_rate: the same FLOPs at the rate torch reaches on the E-step's own shape "
            "[K, 2D] x [2D, N] (1 thread, times the cores)",
        }
        for key, entry, threads in (("in_memory_1e7", mem, args.threads), ("sharded_1e7", shard, args.workers)):
            if "s_per_iter" in entry:
                report["bound"][key] = bound(entry["N"], rates, args.workers, threads, entry["s_per_iter"])
        if "s_per_iter" in big:
            report["bound"]["sharded_1e8"] = bound(big["N"], rates, args.workers, args.workers, big["s_per_iter"])
    report["load_end"] = machine_load()
    report["total_wall_s"] = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(summary(report))
    print(f"\nwrote {args.out}  ({report['total_wall_s']:.1f} s)")
    return 1 if failed else 0


def summary(report: dict[str, Any]) -> str:
    lines = [f"{'measurement':<15} {'N':>11} {'s/iter':>9} {'/in-mem row':>11} {'peak RSS GB':>20} {'meas/bound':>11}"]
    for key in ("in_memory_1e7", "sharded_1e7", "sharded_1e8", "sklearn_1e7"):
        entry = report.get(key, {})
        if "s_per_iter" not in entry:
            lines.append(f"{key:<15} {entry.get('error', 'skipped')}")
            continue
        rss = (
            f"{entry['peak_rss_worker_gb']:.2f} w / {entry['peak_rss_driver_gb']:.2f} d"
            if "peak_rss_worker_gb" in entry
            else f"{entry['peak_rss_gb']:.2f}"
        )
        b = report.get("bound", {}).get(key)
        lines.append(
            f"{key:<15} {entry['N']:>11} {entry['s_per_iter']:9.3f} {entry.get('ratio_to_in_memory_per_row', 1.0):11.2f} "
            f"{rss:>20} {(b['measured_over_bound_as_implemented'] if b else float('nan')):11.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
