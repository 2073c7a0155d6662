#!/usr/bin/env python
"""Benchmark pf-GMM's variational EM iteration against our GMM and scikit-learn, and EM against SVI.

1. Seconds per EM iteration (one E-step + one M-step) on Synthetic (complex), standardised,
   N=100 000, D=100, K=4: ``PFGMM`` (``_e_step``/``_m_step``), ``GMM`` (diag) and scikit-learn's
   ``GaussianMixture`` (``_e_step``/``_m_step``; with ``--peer-api public``, the default of
   ``--quick``, one public ``fit(warm_start=True)`` call per iteration, which adds scikit-learn's
   final E-step), all started from the same responsibilities.
   The timed iterations run in blocks, the library order rotating from block to block so
   drifting load hits all alike; the median is reported with the ratio to our GMM
   (target: pf-GMM <= 1.5x).
2. Time to reach the same ELBO: EM to convergence, then SVI (same model/guide, Adam,
   Pyro's ``TraceEnum_ELBO`` with the switches enumerated) until its ELBO per point is
   within ``--svi-gap`` of EM's final value, on overlapping data (N=2 000, D=20, D_R=5)
   where EM needs many iterations; SVI's enumerated ELBO is too slow for D=100 races.

Usage::

    .venv/bin/python benchmarks/bench_pf_gmm.py            # full run (about a minute), writes results/pf_gmm.json
    .venv/bin/python benchmarks/bench_pf_gmm.py --quick    # smoke run, writes to the temp directory
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from _common import add_peer_api_argument, early_threads, sklearn_private, sklearn_public_em

# Thread limits must be in the environment before numpy/torch load their pools.
early_threads(default=2)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ppmix import GMM  # noqa: E402
from ppmix.datasets import make_pf_synthetic  # noqa: E402
from ppmix.engines.result import ConvergenceWarning  # noqa: E402
from ppmix.models.pf.pf_gmm import PFGMM  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "pf_gmm.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_pf_gmm_quick.json"


def _data(n: int, seed: int, d: int = 100, d_r: int = 20, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Standardised Synthetic (complex); ``spread < 1`` pulls the components together (soft posteriors)."""
    data = make_pf_synthetic(n, n_relevant=d_r, n_features=d, label_probs=(0.01, 0.99, 0.01, 0.99), seed=seed)
    x = (data.X - data.X.mean(0)) / data.X.std(0)
    return x * spread + np.random.default_rng(seed).normal(size=x.shape) * (1 - spread), data.y


def _ours_iteration(model) -> tuple:
    data = model._em_data(model.prepare_data(model._bench_x, getattr(model, "_bench_y", None)))
    state = {"resp": model._e_step(data)[0]}

    def step() -> None:
        model._m_step(data, state["resp"])
        state["resp"] = model._e_step(data)[0]

    return step


def _sklearn_iteration(x: np.ndarray, resp: np.ndarray, seed: int, public: bool):
    """One scikit-learn EM iteration per call (diag, ``reg_covar=1e-6``), from the M-step of ``resp``."""
    from sklearn.mixture import GaussianMixture

    if public:
        nk = resp.sum(0)
        means = resp.T @ x / nk[:, None]
        variances = resp.T @ (x * x) / nk[:, None] - means**2 + 1e-6
        sk = sklearn_public_em(nk / nk.sum(), means, variances, "diag", 1e-6, seed)

        def public_step() -> None:  # M-step, then E-step (and scikit-learn's final E-step)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sk.fit(x)

        return public_step
    sk = GaussianMixture(resp.shape[1], covariance_type="diag", reg_covar=1e-6, max_iter=1, random_state=seed)
    sklearn_private(sk, "_initialize")(x, resp)
    e_step, m_step = sklearn_private(sk, "_e_step"), sklearn_private(sk, "_m_step")
    state = {"log_resp": e_step(x)[1]}

    def internal_step() -> None:
        m_step(x, state["log_resp"])
        state["log_resp"] = e_step(x)[1]

    return internal_step


def time_iterations(n: int, k: int, blocks: int, per_block: int, seed: int, peer_api: str) -> dict:
    x, y = _data(n, seed)
    with warnings.catch_warnings():  # one-iteration fits only set the models up
        warnings.simplefilter("ignore", ConvergenceWarning)
        pf = PFGMM(k, switch_prior=0.3, seed=seed, progress=False).fit(x[:2000], y[:2000], max_iter=1)
        gmm = GMM(k, seed=seed, progress=False).fit(x[:2000], max_iter=1)
    pf._bench_x, pf._bench_y, gmm._bench_x = x, y, x
    # the same starting responsibilities for everybody: pf-GMM's relevance start
    pf_data = pf._em_data(pf.prepare_data(x, y))
    pf._em_initialize(pf_data, torch.Generator().manual_seed(seed))
    resp = pf._e_step(pf_data)[0]
    gmm._m_step(gmm._em_data(gmm.prepare_data(x)), resp)
    sk_step = _sklearn_iteration(x, resp.numpy(), seed, public=peer_api == "public")
    steps = {"pf-GMM": _ours_iteration(pf), "GMM (ours)": _ours_iteration(gmm), "scikit-learn": sk_step}
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for block in range(blocks):
        order = names[block % len(names) :] + names[: block % len(names)]
        for name in order:
            steps[name]()  # untimed warm-up
            for _ in range(per_block):
                start, start_cpu = time.perf_counter(), time.process_time()
                steps[name]()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    median = {name: statistics.median(t) for name, t in times.items()}
    median_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    return {
        "n": n,
        "d": x.shape[1],
        "k": k,
        "seconds_per_iteration": median,
        "cpu_seconds_per_iteration": median_cpu,
        "ratio_to_our_gmm": {name: median[name] / median["GMM (ours)"] for name in median},
        "cpu_ratio_to_our_gmm": {name: median_cpu[name] / median_cpu["GMM (ours)"] for name in median_cpu},
        "scikit_learn_api": peer_api,
    }


def em_vs_svi(n: int, k: int, gap: float, max_svi_steps: int, seed: int) -> dict:
    x, y = _data(n, seed + 1, d=20, d_r=5, spread=0.6)
    start = time.perf_counter()
    em = PFGMM(k, switch_prior=0.3, seed=seed, progress=False).fit(x, y, tol=1e-8, max_iter=300)
    em_seconds = time.perf_counter() - start
    target = em.elbo(x, y) / n
    svi = PFGMM(k, switch_prior=0.3, seed=seed, progress=False)
    start = time.perf_counter()
    svi.fit(x, y, engine="svi", num_steps=max_svi_steps, lr=0.02)
    history = np.asarray(svi.history_)
    reached = np.nonzero(history >= target - gap * abs(target))[0]
    step = int(reached[0]) + 1 if reached.size else None
    svi_seconds = (time.perf_counter() - start) * (step or len(history)) / len(history)
    return {
        "n": n,
        "d": x.shape[1],
        "em_elbo_per_point": target,
        "em_seconds": em_seconds,
        "em_iterations": em.n_iter_,
        "svi_steps_to_reach": step,
        "svi_seconds_to_reach": svi_seconds if step else None,
        "svi_final_elbo_per_point": float(history[-1]),
        "relative_gap": gap,
    }


def end_to_end(n: int, k: int, repeats: int, seed: int = 0) -> dict:
    """What a user times: the whole default ``PFGMM(K, switch_prior=0.3, seed=0).fit(X, y)`` (its
    restarts included) and, as the reference for the same data, ``GMM(K, seed=0).fit(X)`` and
    scikit-learn's ``GaussianMixture(K, random_state=0).fit(X)`` (unsupervised: they see ``X`` only), at
    1 thread; median wall over ``repeats`` fits each."""
    from sklearn.mixture import GaussianMixture
    from threadpoolctl import threadpool_limits

    x, y = _data(n, seed)
    fits = {
        "pf-GMM": lambda: PFGMM(k, switch_prior=0.3, seed=seed, progress=False).fit(x, y),
        "our GMM": lambda: GMM(k, seed=seed, progress=False).fit(x),
        "scikit-learn GMM": lambda: GaussianMixture(k, random_state=seed).fit(x),
    }
    walls: dict[str, list[float]] = {name: [] for name in fits}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):
            for name, fit in fits.items():
                time.sleep(0.2)
                start = time.perf_counter()
                fit()
                walls[name].append(time.perf_counter() - start)
    torch.set_num_threads(previous)
    return {"n": n, "k": k, "threads": 1, "fit_wall_s": {name: statistics.median(w) for name, w in walls.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small smoke run (writes to the temp directory)")
    parser.add_argument("--svi-gap", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, default=None, help=f"JSON path (default {RESULTS}; --quick: {QUICK_OUT})")
    parser.add_argument("--threads", type=int, default=2, help="torch/BLAS threads (read before they start)")
    add_peer_api_argument(parser)
    args = parser.parse_args(argv)
    args.peer_api = args.peer_api or ("public" if args.quick else "internal")
    torch.set_num_threads(args.threads)
    if args.quick:
        per_iter = time_iterations(2000, 4, blocks=2, per_block=2, seed=0, peer_api=args.peer_api)
        race = em_vs_svi(300, 4, args.svi_gap, 5, seed=0)
    else:
        per_iter = time_iterations(100_000, 4, blocks=5, per_block=4, seed=0, peer_api=args.peer_api)
        race = em_vs_svi(2000, 4, args.svi_gap, 1500, seed=0)
    # last: its 1-thread limits must not touch the thread pools of the timings above
    e2e = [end_to_end(n, 4, 1 if args.quick else 3) for n in ((300,) if args.quick else (2000, 100_000))]
    result = {
        "end_to_end": e2e,
        "per_iteration": per_iter,
        "em_vs_svi": race,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "quick": args.quick,
    }
    for entry in e2e:
        walls = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in entry["fit_wall_s"].items())
        print(f"end to end, defaults, 1 thread, N={entry['n']}: {walls}")
    for name, seconds in per_iter["seconds_per_iteration"].items():
        ratio, cpu_ratio = per_iter["ratio_to_our_gmm"][name], per_iter["cpu_ratio_to_our_gmm"][name]
        print(f"{name:<14} {seconds * 1e3:9.1f} ms/iteration wall ({ratio:.2f}x our GMM; CPU time {cpu_ratio:.2f}x)")
    print(
        f"EM: {race['em_seconds']:.2f}s, {race['em_iterations']} iterations to ELBO/point {race['em_elbo_per_point']:.4f}; "
        f"SVI: {race['svi_steps_to_reach']} steps, {race['svi_seconds_to_reach']} s to within {args.svi_gap} of it"
    )
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
