#!/usr/bin/env python
"""Benchmark ppmix's GMM EM engine against scikit-learn and pomegranate.

Two settings on planted, fairly well separated Gaussian mixtures (fixed seed):

* A: N=200 000, D=50, K=8, diagonal covariances;
* B: N=50 000,  D=20, K=8, full covariances.

For every library it measures

1. seconds per EM iteration: all libraries start from the *same* parameters
   (scikit-learn's k-means initialisation) and each timed iteration is one E-step
   plus one M-step through the library's own internal functions (sklearn
   ``_e_step``/``_m_step``, ppmix ``_e_step``/``_m_step``, pomegranate
   ``summarize``/``from_summaries``); ``--peer-api public`` (the default of
   ``--quick``, which the tests run) steps scikit-learn through public ``fit`` calls
   instead, so a change in its private API cannot break the test suite. The timed iterations run in blocks per
   library, the order rotating from block to block so that drifting load on a
   shared machine hits all libraries alike, with a short idle gap and one untimed
   iteration before each block; the median over the timed iterations is reported.
   A second timing at 1 thread (where wall time ~ CPU time) cross-checks it;
2. iterations to converge, wall time and the final mean log-likelihood per point
   when each library is run through its public ``fit`` from its own default
   initialisation, with convergence tolerances translated to the same criterion
   (relative change of the total log-likelihood <= ``--tol-rel``); ppmix is also
   run from scikit-learn's initial parameters so the two EM paths can be compared
   exactly. All final log-likelihoods are recomputed by one float64 evaluator.

Usage::

    .venv/bin/python benchmarks/bench_gmm.py            # full run (several minutes)
    .venv/bin/python benchmarks/bench_gmm.py --quick    # smoke run (< 20 s)
    make bench
"""

from __future__ import annotations

import argparse
import os
import sys

from _common import (
    add_peer_api_argument,
    early_threads,
    gaussian_mixture_mean_loglik,
    machine_load,
    require_torch_threads,
    set_torch_threads,
    sklearn_private,
    sklearn_public_em,
)

# Thread limits must be in the environment before numpy/torch load their pools.
early_threads(default=2)

import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

logger = logging.getLogger("bench_gmm")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gmm.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_gmm_quick.json"


# ============================================================== configuration
@dataclass(frozen=True)
class Setting:
    name: str
    n: int
    d: int
    k: int
    covariance_type: str


FULL_SETTINGS = (
    Setting("A", 200_000, 50, 8, "diag"),
    Setting("B", 50_000, 20, 8, "full"),
    Setting("C", 20_000, 5, 4, "full"),
)
# Small enough that most tensors stay under torch's parallel grain size (32768 elements): the smoke run
# then finishes quickly even on a loaded machine, where every OpenMP barrier can cost a scheduler slice.
QUICK_SETTINGS = (
    Setting("A", 600, 50, 8, "diag"),
    Setting("B", 1_000, 20, 8, "full"),
    Setting("C", 400, 5, 4, "full"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny smoke run (small N, few iterations)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON output path (default {DEFAULT_OUT.relative_to(ROOT)}; "
        f"--quick writes {QUICK_OUT} instead, so a smoke run never overwrites the recorded results)",
    )
    p.add_argument(
        "--threads", type=int, default=2, help="threads for torch, BLAS and OpenMP in every library (default 2)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of every library's initialisation")
    p.add_argument(
        "--timed-iters", type=int, default=None, help="timed EM iterations per library (default 20; quick 2)"
    )
    p.add_argument(
        "--warmup-iters",
        type=int,
        default=None,
        help="untimed warm-up iterations per library before the blocks (default 1; quick 0)",
    )
    p.add_argument(
        "--passes", type=int, default=None, help="timed blocks per library, order rotated (default 4; quick 1)"
    )
    p.add_argument(
        "--max-iter", type=int, default=None, help="max EM iterations of the convergence runs (default 500; quick 10)"
    )
    p.add_argument(
        "--tol-rel",
        type=float,
        default=1e-6,
        help="convergence: relative change of the total log-likelihood (default 1e-6)",
    )
    p.add_argument("--settings", default="A,B,C", help="comma-separated subset of settings to run (default A,B,C)")
    p.add_argument(
        "--e2e-repeats", type=int, default=None, help="end-to-end default fits per library (default 3; quick 1)"
    )
    p.add_argument("--no-pomegranate", action="store_true", help="skip pomegranate")
    p.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the torch.profiler breakdown of ppmix's E/M steps (off in --quick)",
    )
    p.add_argument(
        "--no-1thread-check",
        dest="one_thread_check",
        action="store_false",
        help="skip the second per-iteration timing at 1 thread (robust to a loaded machine; off in --quick)",
    )
    add_peer_api_argument(p)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    args.peer_api = args.peer_api or ("public" if args.quick else "internal")
    args.timed_iters = args.timed_iters or (2 if args.quick else 20)
    args.warmup_iters = args.warmup_iters if args.warmup_iters is not None else (0 if args.quick else 1)
    args.max_iter = args.max_iter or (10 if args.quick else 500)
    args.passes = args.passes or (1 if args.quick else 4)
    args.e2e_repeats = args.e2e_repeats or (1 if args.quick else 3)
    if args.quick:
        args.no_profile, args.one_thread_check = True, False
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    return args


# ======================================================================= data
def make_data(s: Setting, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Planted mixture: pairwise mean distances ~6 (in units of the component scale)."""
    rng = np.random.default_rng(seed)
    k, d, n = s.k, s.d, s.n
    weights = rng.dirichlet(np.full(k, 5.0))
    means = rng.normal(0.0, 6.0 / math.sqrt(2 * d), size=(k, d)) * 1.0
    if s.covariance_type == "diag":
        covs = rng.uniform(0.5, 1.5, size=(k, d)) ** 2
        chols = None
    else:
        covs = np.empty((k, d, d))
        for j in range(k):
            q, _ = np.linalg.qr(rng.normal(size=(d, d)))
            covs[j] = (q * rng.uniform(0.25, 2.0, size=d)) @ q.T
        chols = np.linalg.cholesky(covs)
    z = rng.choice(k, size=n, p=weights)
    x = np.empty((n, d))
    for j in range(k):
        idx = np.flatnonzero(z == j)
        eps = rng.standard_normal((idx.size, d))
        x[idx] = means[j] + (eps * np.sqrt(covs[j]) if chols is None else eps @ chols[j].T)
    return np.ascontiguousarray(x), {"weights": weights, "means": means, "covariances": covs}


def mean_loglik(x: np.ndarray, weights: Any, means: Any, covs: Any, covariance_type: str) -> float:
    """One float64 evaluator of ``mean_n log sum_k w_k N(x_n | mu_k, Sigma_k)`` for every library (``covs``
    ``(K, D)`` for ``covariance_type="diag"``, else ``(K, D, D)``)."""
    covs = np.asarray(covs, dtype=np.float64)
    if (covs.ndim == 2) != (covariance_type == "diag"):
        raise ValueError(f"covariances of shape {covs.shape} are not {covariance_type!r}")
    return gaussian_mixture_mean_loglik(x, weights, means, covs)


def _np(t: Any) -> np.ndarray:
    return t.detach().cpu().double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)


# ================================================================== libraries
class Runner:
    """One library/dtype: per-iteration stepping from given parameters, and a default fit."""

    key: str
    library: str
    dtype: str

    def start(self, init: dict[str, np.ndarray]) -> None: ...
    def e(self) -> None: ...
    def m(self) -> None: ...
    def params(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def fit_default(self) -> dict[str, Any]: ...


class SklearnRunner(Runner):
    library, dtype = "scikit-learn", "float64"

    def __init__(self, x: np.ndarray, s: Setting, tol_abs: float, max_iter: int, seed: int, public: bool) -> None:
        self.key = "sklearn"
        self.x, self.s, self.tol, self.max_iter, self.seed = x, s, tol_abs, max_iter, seed
        self.public = public  # step EM through public fit calls (E and M are not timed apart)

    def _make(self, **kw: Any):
        from sklearn.mixture import GaussianMixture

        opts = dict(
            n_components=self.s.k,
            covariance_type=self.s.covariance_type,
            reg_covar=1e-6,
            tol=self.tol,
            max_iter=self.max_iter,
            n_init=1,
            init_params="kmeans",
            random_state=self.seed,
        )
        opts.update(kw)
        return GaussianMixture(**opts)

    def initial_parameters(self) -> tuple[dict[str, np.ndarray], float]:
        """scikit-learn's default initialisation (KMeans(n_init=1) labels -> one M-step)."""
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm = self._make(max_iter=0).fit(self.x)
        wall = time.perf_counter() - t0
        return {"weights": gm.weights_.copy(), "means": gm.means_.copy(), "covariances": gm.covariances_.copy()}, wall

    def start(self, init: dict[str, np.ndarray]) -> None:
        weights, means, covs = (init[k].copy() for k in ("weights", "means", "covariances"))
        self._log_resp = None
        if self.public:  # every fit call is one EM iteration (and a final E-step)
            self.gm = sklearn_public_em(weights, means, covs, self.s.covariance_type, 1e-6, self.seed)
            return
        from sklearn.mixture import _gaussian_mixture

        precision_cholesky = sklearn_private(_gaussian_mixture, "_compute_precision_cholesky")
        gm = self._make()
        gm.weights_, gm.means_, gm.covariances_ = weights, means, covs
        gm.precisions_cholesky_ = precision_cholesky(gm.covariances_, self.s.covariance_type)
        self.gm, self._e_step, self._m_step = gm, sklearn_private(gm, "_e_step"), sklearn_private(gm, "_m_step")

    def e(self) -> None:
        if self.public:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.gm.fit(self.x)
            self.objective = float(self.gm.lower_bound_)
            return
        log_prob_norm, self._log_resp = self._e_step(self.x)
        self.objective = float(log_prob_norm)

    def m(self) -> None:
        if not self.public:  # the public fit call in e() did the M-step too
            self._m_step(self.x, self._log_resp)

    def params(self):
        return self.gm.weights_, self.gm.means_, self.gm.covariances_

    def fit_default(self) -> dict[str, Any]:
        gm = self._make()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm.fit(self.x)
        wall = time.perf_counter() - t0
        self.gm_fit = gm
        return {
            "n_iter": int(gm.n_iter_),
            "converged": bool(gm.converged_),
            "fit_wall_s": wall,
            "own_mean_loglik": float(gm.score(self.x)),
            "params": (gm.weights_, gm.means_, gm.covariances_),
        }


class PpmixRunner(Runner):
    library = "ppmix"

    def __init__(self, x: np.ndarray, s: Setting, tol_rel: float, max_iter: int, seed: int, dtype: torch.dtype) -> None:
        self.dtype = str(dtype).replace("torch.", "")
        self.key = f"ppmix-{self.dtype}"
        self.torch_dtype = dtype
        self.x = torch.from_numpy(x)  # float64, shared memory; prepare_data casts when needed
        self.s, self.tol, self.max_iter, self.seed = s, tol_rel, max_iter, seed

    def _make(self, **kw: Any):
        from ppmix import GMM

        opts = dict(
            n_components=self.s.k,
            covariance_type=self.s.covariance_type,
            n_init=1,
            max_iter=self.max_iter,
            tol=self.tol,
            reg_covar=1e-6,
            init_params="kmeans",
            seed=self.seed,
            progress=False,
            dtype=self.torch_dtype,
        )
        opts.update(kw)
        return GMM(**opts)

    def start(self, init: dict[str, np.ndarray]) -> None:
        gmm = self._make()
        xt = gmm.prepare_data(self.x, fitting=True)
        self.data = gmm._em_data(xt)  # cached statistics, built once per fit
        gmm._set_globals(globals_from_moments(init, self.s.covariance_type))
        self.gmm, self._stats = gmm, None

    def e(self) -> None:
        self._stats, obj = self.gmm._e_step(self.data)
        self.objective = float(obj) / self.data.n_rows  # the engine converts the objective every iteration too

    def m(self) -> None:
        self.gmm._m_step(self.data, self._stats)

    def params(self):  # means_/covariances_ need a completed fit; read the components directly
        comp = self.gmm.components_
        cov = comp.variance if self.s.covariance_type == "diag" else comp.covariance
        return self.gmm.weights_, comp.loc, cov

    def _summary(self, gmm, wall: float) -> dict[str, Any]:
        return {
            "n_iter": int(gmm.n_iter_),
            "converged": bool(gmm.converged_),
            "fit_wall_s": wall,
            "own_mean_loglik": float(gmm.score(self.x)),
            "params": (gmm.weights_, gmm.means_, gmm.covariances_),
        }

    def fit_default(self) -> dict[str, Any]:
        gmm = self._make()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gmm.fit(self.x)
        return self._summary(gmm, time.perf_counter() - t0)

    def fit_from(self, init: dict[str, np.ndarray]) -> dict[str, Any]:
        """EM through the public ``fit`` (``warm_start``) from the given parameters."""
        gmm = self._make(init_params="random")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gmm.fit(self.x, max_iter=1)  # marks the model fitted so that warm_start applies
            gmm._set_globals(globals_from_moments(init, self.s.covariance_type))
            t0 = time.perf_counter()
            gmm.fit(self.x, warm_start=True)
        return self._summary(gmm, time.perf_counter() - t0)


def globals_from_moments(init: dict[str, np.ndarray], covariance_type: str) -> dict[str, torch.Tensor]:
    """(weights, means, covariances) -> ppmix's global sites."""
    cov = torch.as_tensor(init["covariances"], dtype=torch.float64)
    out = {"weights": torch.as_tensor(init["weights"]), "locs": torch.as_tensor(init["means"])}
    if covariance_type == "diag":
        out["scales"] = cov.sqrt()
    else:
        chol = torch.linalg.cholesky(cov)
        scales = torch.diagonal(cov, dim1=-2, dim2=-1).sqrt()
        out["scales"], out["corr_cholesky"] = scales, chol / scales[:, :, None]
    return out


class PomegranateRunner(Runner):
    library = "pomegranate"

    def __init__(
        self, x: np.ndarray, s: Setting, tol_total: float, max_iter: int, seed: int, dtype: torch.dtype
    ) -> None:
        self.dtype = str(dtype).replace("torch.", "")
        self.key = f"pomegranate-{self.dtype}"
        self.torch_dtype = dtype
        self.x = torch.from_numpy(x).to(dtype)
        self.s, self.tol, self.max_iter, self.seed = s, tol_total, max_iter, seed

    def _model(self, distributions, **kw: Any):
        from pomegranate.gmm import GeneralMixtureModel

        class Counting(GeneralMixtureModel):  # counts M-steps (pomegranate keeps no n_iter)
            n_mstep = 0

            def from_summaries(self):
                self.n_mstep += 1
                return super().from_summaries()

        model = Counting(distributions, max_iter=self.max_iter, tol=self.tol, random_state=self.seed, **kw)
        return model.to(self.torch_dtype)  # parameters *and* buffers to the dtype (default is float32)

    def start(self, init: dict[str, np.ndarray]) -> None:
        from pomegranate.distributions import Normal

        dt = self.torch_dtype
        dists = [
            Normal(
                means=torch.tensor(init["means"][j], dtype=dt),
                covs=torch.tensor(init["covariances"][j], dtype=dt),
                covariance_type=self.s.covariance_type,
            )
            for j in range(self.s.k)
        ]
        # the distributions are built in the dtype, so pomegranate's cached inverses are too
        self.model = self._model(dists, priors=torch.tensor(init["weights"], dtype=dt))

    def e(self) -> None:  # E-step and accumulation of the sufficient statistics
        self.objective = float(self.model.summarize(self.x)) / self.x.shape[0]

    def m(self) -> None:
        self.model.from_summaries()

    def params(self):
        return _pomegranate_params(self.model, self.s.covariance_type)

    def fit_default(self) -> dict[str, Any]:
        from pomegranate.distributions import Normal

        model = self._model([Normal(covariance_type=self.s.covariance_type) for _ in range(self.s.k)])
        t0 = time.perf_counter()
        model.fit(self.x)
        wall = time.perf_counter() - t0
        own = float(model.log_probability(self.x).double().mean())
        n_iter = model.n_mstep - 0  # M-steps after the k-means initialisation
        return {
            "n_iter": n_iter,
            "converged": n_iter < self.max_iter,
            "fit_wall_s": wall,
            "own_mean_loglik": own,
            "params": _pomegranate_params(model, self.s.covariance_type),
        }


def _pomegranate_params(model, covariance_type: str):
    w = _np(model.priors)
    mu = np.stack([_np(d.means) for d in model.distributions])
    cov = np.stack([_np(d.covs) for d in model.distributions])
    return w, mu, cov


# ================================================================ end to end
def end_to_end(x: np.ndarray, s: Setting, seed: int, repeats: int) -> dict[str, Any]:
    """What a user times: each library's whole ``fit`` with every argument at its default, at 1 thread.

    ``GMM(K, covariance_type=..., seed=seed)`` against ``GaussianMixture(K, covariance_type=...,
    random_state=seed)``: each from its own default start, with its own default tolerance
    (both 1e-3 nats per point: GMM's default is scikit-learn's), validation and bookkeeping included. The
    libraries alternate, ``repeats`` fits each; the median wall time is reported with the final
    mean log-likelihood re-scored by :func:`mean_loglik`.
    """
    from sklearn.mixture import GaussianMixture

    from ppmix import GMM

    makers = {
        "ppmix": lambda: GMM(s.k, covariance_type=s.covariance_type, seed=seed, progress=False),
        "scikit-learn": lambda: GaussianMixture(s.k, covariance_type=s.covariance_type, random_state=seed),
    }
    walls: dict[str, list[float]] = {name: [] for name in makers}
    fitted: dict[str, Any] = {}
    torch.set_num_threads(1)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for repeat in range(repeats):
            for name in list(makers)[repeat % 2 :] + list(makers)[: repeat % 2]:
                model = makers[name]()
                time.sleep(0.2)
                start = time.perf_counter()
                model.fit(x)
                walls[name].append(time.perf_counter() - start)
                fitted[name] = model
    out: dict[str, Any] = {}
    for name, model in fitted.items():
        params = (model.weights_, model.means_, model.covariances_)
        out[name] = {
            "fit_wall_s": statistics.median(walls[name]),
            "fit_walls_s": walls[name],
            "n_iter": int(model.n_iter_),
            "mean_loglik": mean_loglik(x, *(_np(p) for p in params), s.covariance_type),
        }
    out["ratio_ppmix_vs_sklearn"] = out["ppmix"]["fit_wall_s"] / out["scikit-learn"]["fit_wall_s"]
    out["dloglik_ppmix_vs_sklearn"] = out["ppmix"]["mean_loglik"] - out["scikit-learn"]["mean_loglik"]
    return out


def gemm_rate(dtype: torch.dtype = torch.float64, size: int = 2048, repeats: int = 5) -> float:
    """The machine's GFLOP/s for one ``size x size`` matrix product at torch's current thread count (best of ``repeats``)."""
    a = torch.randn(size, size, dtype=dtype)
    a @ a
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def estep_rate(n: int, d: int = 50, k: int = 8, repeats: int = 5) -> dict[str, Any]:
    """GFLOP/s of ppmix's diagonal E-step at 1 thread, float64, counting ``3 N K D`` flops.

    ``_e_step`` is the fused pass (log-densities, responsibilities, log-likelihood and the M-step's
    weighted sums); ``log_prob + normalise`` is the E-step without the sums (what the
    responsibilities alone cost). Both beside the 1-thread float64 GEMM rate of :func:`gemm_rate`.
    """
    from ppmix import GMM
    from ppmix.ops.logspace import normalize_log_joint_

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    gmm = GMM(k, seed=0, progress=False)
    data = gmm._em_data(gmm.prepare_data(x, fitting=True))
    gmm.components_ = gmm._new_components(data.rows.x)
    gmm._m_step(data, torch.softmax(torch.randn(n, k, generator=gen, dtype=torch.float64), 1))

    def best_of(step) -> float:
        step()
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        return best

    with threadpool_limits(limits=1):
        fused = best_of(lambda: gmm._e_step(data))
        responsibilities = best_of(
            lambda: normalize_log_joint_(gmm.components_.log_prob(data.rows).add_(gmm.weights_.log()))
        )
        gemm = gemm_rate()
    flops = 3 * n * k * d
    return {
        "n": n,
        "d": d,
        "k": k,
        "dtype": "float64",
        "threads": 1,
        "flops_counted": "3 N K D",
        "e_step_s": fused,
        "e_step_gflops": flops / fused / 1e9,
        "log_prob_normalise_s": responsibilities,
        "log_prob_normalise_gflops": flops / responsibilities / 1e9,
        "gemm_gflops": gemm,
        "e_step_share_of_gemm": flops / fused / 1e9 / gemm,
        "log_prob_normalise_share_of_gemm": flops / responsibilities / 1e9 / gemm,
    }


# ================================================================== measuring
def time_iterations(
    runners: list[Runner],
    init: dict[str, np.ndarray],
    warmup: int,
    timed: int,
    threads: int,
    passes: int = 4,
    gap_s: float = 0.3,
) -> dict[str, dict]:
    """Seconds per E+M iteration at ``threads`` torch threads, every library started from ``init``.

    The timed iterations are split into ``passes`` blocks per library; the order of the
    libraries rotates from pass to pass (so slow drift of the machine load hits all of
    them alike). Before each block the process idles ``gap_s`` and runs one untimed
    iteration: the thread pools of the library that ran before (OpenBLAS workers
    busy-wait for up to ~0.1 s after a call, OpenMP workers spin too) must not steal
    the cores of the one being timed, which strict round-robin would let them do.
    After every block torch's thread count is checked against ``threads`` and recorded.
    """
    for r in runners:
        r.start(init)
        for _ in range(warmup):
            r.e()
            r.m()
    passes = max(1, min(passes, timed))
    blocks = [timed // passes + (1 if i < timed % passes else 0) for i in range(passes)]
    samples: dict[str, dict[str, list[float]]] = {r.key: {"e": [], "m": [], "total": [], "cpu": []} for r in runners}
    used_threads: dict[str, int] = {}
    for p, size in enumerate(blocks):
        order = runners[p % len(runners) :] + runners[: p % len(runners)]
        for r in order:
            time.sleep(gap_s)
            r.e()
            r.m()  # settle iteration after the switch, untimed
            for _ in range(size):
                c0 = time.process_time()
                t0 = time.perf_counter()
                r.e()
                t1 = time.perf_counter()
                r.m()
                t2 = time.perf_counter()
                c2 = time.process_time()
                samples[r.key]["e"].append(t1 - t0)
                samples[r.key]["m"].append(t2 - t1)
                samples[r.key]["total"].append(t2 - t0)
                samples[r.key]["cpu"].append(c2 - c0)
            logger.debug("pass %d %s: %s", p, r.key, [round(t, 4) for t in samples[r.key]["total"][-size:]])
            used_threads[r.key] = require_torch_threads(threads)
    out = {}
    for r in runners:
        tot = samples[r.key]["total"]
        q = statistics.quantiles(tot, n=4, method="inclusive") if len(tot) > 1 else [tot[0]] * 3
        out[r.key] = {
            "median_s": statistics.median(tot),
            "q25_s": q[0],
            "q75_s": q[2],
            "min_s": min(tot),
            "e_median_s": None if getattr(r, "public", False) else statistics.median(samples[r.key]["e"]),
            "m_median_s": None if getattr(r, "public", False) else statistics.median(samples[r.key]["m"]),
            "api": "public" if getattr(r, "public", False) else "internal",
            "cpu_median_s": statistics.median(samples[r.key]["cpu"]),
            "n_timed": len(tot),
            "torch_threads": used_threads[r.key],
            "samples_s": [round(t, 6) for t in tot],
            "objective_after": getattr(r, "objective", None),
        }
    return out


def profile_ppmix(
    x: np.ndarray, s: Setting, init: dict[str, np.ndarray], dtype: torch.dtype, iters: int
) -> dict[str, Any]:
    """torch.profiler breakdown (self CPU time by op) of ppmix's e_step and m_step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    r = PpmixRunner(x, s, 1e-6, 10, 0, dtype)
    r.start(init)
    r.e()
    r.m()  # warm-up (builds cached moments)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            with record_function("ppmix._e_step"):
                r.e()
            with record_function("ppmix._m_step"):
                r.m()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [
        {
            "op": e.key,
            "calls": int(e.count),
            "self_cpu_ms_per_iter": e.self_cpu_time_total / 1e3 / iters,
            "share": e.self_cpu_time_total / total,
        }
        for e in rows[:12]
    ]
    spans = {e.key: e.cpu_time_total / 1e3 / iters for e in events if e.key in ("ppmix._e_step", "ppmix._m_step")}
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "iters": iters,
        "threads": torch.get_num_threads(),
        "top_self_cpu": top,
        "span_ms_per_iter": spans,
    }


def machine_info(threads: int) -> dict[str, Any]:
    import sklearn

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        pg_version = version("pomegranate")
    except Exception:  # noqa: BLE001
        pg_version = None
    try:
        import ppmix

        ppmix_version = ppmix.__version__
    except Exception:  # noqa: BLE001
        ppmix_version = None
    pools = [
        {k: p.get(k) for k in ("user_api", "internal_api", "num_threads", "version", "filepath")}
        for p in threadpool_info()
    ]
    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "sklearn": sklearn.__version__,
        "pomegranate": pg_version,
        "ppmix": ppmix_version,
        "threads": threads,
        "torch_num_threads": torch.get_num_threads(),
        "threadpools": pools,
    }


# ====================================================================== main
def run_setting(s: Setting, args: argparse.Namespace) -> dict[str, Any]:
    logger.info("setting %s: N=%d D=%d K=%d %s -- generating data", s.name, s.n, s.d, s.k, s.covariance_type)
    x, truth = make_data(s, args.seed)
    true_ll = mean_loglik(x, truth["weights"], truth["means"], truth["covariances"], s.covariance_type)
    # Same stopping rule for everyone: |L_t - L_{t-1}| <= tol_rel * |L| with L the total log-likelihood,
    # i.e. an absolute tolerance on the mean log-likelihood (sklearn) or on the total (pomegranate).
    tol_mean = args.tol_rel * abs(true_ll)
    tol_total = tol_mean * s.n
    sk = SklearnRunner(x, s, tol_mean, args.max_iter, args.seed, public=args.peer_api == "public")
    ours = [PpmixRunner(x, s, args.tol_rel, args.max_iter, args.seed, dt) for dt in (torch.float64, torch.float32)]
    pg = (
        []
        if args.no_pomegranate
        else [PomegranateRunner(x, s, tol_total, args.max_iter, args.seed, dt) for dt in (torch.float64, torch.float32)]
    )
    runners: list[Runner] = [sk, *ours, *pg]

    logger.info("setting %s: scikit-learn initial parameters (shared starting point)", s.name)
    init, init_wall = sk.initial_parameters()
    init_ll = mean_loglik(x, init["weights"], init["means"], init["covariances"], s.covariance_type)

    logger.info(
        "setting %s: timing %d EM iterations per library in %d rotated blocks", s.name, args.timed_iters, args.passes
    )
    load = {"before_timing": machine_load()}
    timing = time_iterations(
        runners,
        init,
        args.warmup_iters,
        args.timed_iters,
        threads=args.threads,
        passes=args.passes,
        gap_s=0.05 if args.quick else 0.3,
    )
    load["after_timing"] = machine_load()
    logger.info("setting %s: machine load %s", s.name, load)
    results: dict[str, dict[str, Any]] = {}
    for r in runners:
        results[r.key] = {"library": r.library, "dtype": r.dtype, "per_iteration": timing[r.key]}
        # Evaluate the parameters after the timed iterations with the common evaluator (sanity: same EM path).
        results[r.key]["per_iteration"]["mean_loglik_after"] = mean_loglik(
            x, *(_np(p) for p in r.params()), s.covariance_type
        )
    if args.one_thread_check and args.threads != 1:
        n1 = max(5, args.timed_iters * 2 // 3)
        logger.info("setting %s: timing again at 1 thread (%d iterations; wall ~ CPU time, robust to load)", s.name, n1)
        torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            timing1 = time_iterations(runners, init, 1, n1, threads=1, passes=args.passes)
        load["after_1thread_timing"] = machine_load()
        torch.set_num_threads(args.threads)
        for r in runners:
            results[r.key]["per_iteration_1thread"] = timing1[r.key]
    for r in runners:
        for attr in (
            "data",
            "gmm",
            "gm",
            "model",
            "_stats",
            "_log_resp",
            "_e_step",
            "_m_step",
        ):  # free the stepping state
            r.__dict__.pop(attr, None)

    def record(key: str, label: str, fit: dict[str, Any]) -> None:
        params = fit.pop("params")
        fit["mean_loglik"] = mean_loglik(x, *(_np(p) for p in params), s.covariance_type)
        results[key][label] = fit
        logger.info(
            "  %-18s %-12s n_iter=%-4d converged=%-5s wall=%7.2fs mean loglik=%.6f",
            key,
            label,
            fit["n_iter"],
            fit["converged"],
            fit["fit_wall_s"],
            fit["mean_loglik"],
        )

    logger.info("setting %s: convergence runs (public fit, own default initialisation)", s.name)
    for r in runners:
        record(r.key, "fit_default_init", r.fit_default())
    for r in ours:
        record(r.key, "fit_sklearn_init", r.fit_from(init))

    sk_iter = results["sklearn"]["per_iteration"]["median_s"]
    sk_ll = results["sklearn"]["fit_default_init"]["mean_loglik"]
    for key, res in results.items():
        res["ratio_vs_sklearn"] = res["per_iteration"]["median_s"] / sk_iter
        res["ratio_vs_sklearn_min"] = res["per_iteration"]["min_s"] / results["sklearn"]["per_iteration"]["min_s"]
        if "per_iteration_1thread" in res:
            one, sk1 = res["per_iteration_1thread"], results["sklearn"]["per_iteration_1thread"]
            res["ratio_vs_sklearn_1thread"] = one["median_s"] / sk1["median_s"]
            res["ratio_vs_sklearn_1thread_cpu"] = one["cpu_median_s"] / sk1["cpu_median_s"]
        for label in ("fit_default_init", "fit_sklearn_init"):
            if label in res:
                res[label]["dloglik_vs_sklearn"] = res[label]["mean_loglik"] - sk_ll

    out = {
        "name": s.name,
        "n": s.n,
        "d": s.d,
        "k": s.k,
        "covariance_type": s.covariance_type,
        "true_mean_loglik": true_ll,
        "init_mean_loglik": init_ll,
        "sklearn_init_wall_s": init_wall,
        "tol_rel": args.tol_rel,
        "tol_sklearn_mean": tol_mean,
        "tol_pomegranate_total": tol_total,
        "results": results,
        "machine_load": load,
    }
    if not args.no_profile:
        logger.info("setting %s: profiling ppmix e_step/m_step", s.name)
        # At 1 thread: per-op times are then close to CPU time, not scheduler noise from a loaded machine.
        torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            out["profile_ppmix"] = [
                profile_ppmix(x, s, init, dt, 2 if args.quick else 5) for dt in (torch.float64, torch.float32)
            ]
        torch.set_num_threads(args.threads)
    return out


def _seconds(value: float | None) -> str:
    """A 7-wide seconds column; '-' where a library's E and M steps were not timed apart."""
    return f"{value:7.4f}" if value is not None else f"{'-':>7}"


def format_end_to_end(settings: list[dict[str, Any]], kernel: dict[str, Any] | None) -> str:
    """The whole default ``fit`` of each library (what users time), first; then the E-step's GFLOP/s."""
    lines = [
        "End to end: every library's default fit, 1 thread (median wall; mean LL re-scored by one evaluator)",
        f"{'set':<3} {'N':>8} {'D':>3} {'K':>3} {'cov':<5} {'ppmix s':>8} {'it':>4} {'sklearn s':>9} {'it':>4} "
        f"{'ppmix/skl':>9} {'dLL/pt':>10}",
    ]
    for st in settings:
        e = st["end_to_end"]
        lines.append(
            f"{st['name']:<3} {st['n']:>8} {st['d']:>3} {st['k']:>3} {st['covariance_type']:<5} "
            f"{e['ppmix']['fit_wall_s']:8.3f} {e['ppmix']['n_iter']:4d} {e['scikit-learn']['fit_wall_s']:9.3f} "
            f"{e['scikit-learn']['n_iter']:4d} {e['ratio_ppmix_vs_sklearn']:9.2f} {e['dloglik_ppmix_vs_sklearn']:+10.2e}"
        )
    if kernel:
        lines.append(
            f"Diag E-step, N={kernel['n']} D={kernel['d']} K={kernel['k']} float64, 1 thread, 3NKD flops: fused e_step "
            f"{kernel['e_step_gflops']:.1f} GFLOP/s ({100 * kernel['e_step_share_of_gemm']:.0f}% of GEMM), "
            f"log_prob+normalise {kernel['log_prob_normalise_gflops']:.1f} GFLOP/s "
            f"({100 * kernel['log_prob_normalise_share_of_gemm']:.0f}%); float64 GEMM {kernel['gemm_gflops']:.1f} GFLOP/s"
        )
    return "\n".join(lines)


def format_table(settings: list[dict[str, Any]]) -> str:
    head = (
        f"{'set':<3} {'library':<12} {'dtype':<7} {'s/iter':>8} {'IQR':>15} {'min':>7} {'E s':>7} {'M s':>7} {'ours/skl':>8} "
        f"{'n_iter':>6} {'conv':>5} {'fit s':>7} {'mean LL':>11} {'dLL/pt':>10} {'n_iter*':>7} {'dLL*/pt':>10}"
    )
    lines = [head, "-" * len(head)]
    for st in settings:
        for key, r in st["results"].items():
            p, f = r["per_iteration"], r["fit_default_init"]
            same = r.get("fit_sklearn_init")
            lines.append(
                f"{st['name']:<3} {r['library']:<12} {r['dtype']:<7} {p['median_s']:8.4f} "
                f"{'[' + format(p['q25_s'], '.4f') + ',' + format(p['q75_s'], '.4f') + ']':>15} {p['min_s']:7.4f} "
                f"{_seconds(p['e_median_s'])} {_seconds(p['m_median_s'])} {r['ratio_vs_sklearn']:8.2f} "
                f"{f['n_iter']:6d} {str(f['converged']):>5} {f['fit_wall_s']:7.2f} {f['mean_loglik']:11.5f} "
                f"{f['dloglik_vs_sklearn']:+10.2e} "
                + (f"{same['n_iter']:7d} {same['dloglik_vs_sklearn']:+10.2e}" if same else f"{'':>7} {'':>10}")
            )
    lines.append(
        "s/iter: median seconds per E+M iteration from sklearn's initial parameters; ours/skl: ratio of medians."
    )
    lines.append(
        "n_iter/fit s/mean LL: public fit from each library's own default init; dLL/pt: mean LL minus sklearn's."
    )
    lines.append("n_iter*/dLL*: ppmix fit started from sklearn's initial parameters (same EM path).")
    if any("per_iteration_1thread" in r for st in settings for r in st["results"].values()):
        lines += [
            "",
            "Cross-check at 1 thread (wall ~ CPU time; less sensitive to other load on the machine):",
            f"{'set':<3} {'library':<12} {'dtype':<7} {'s/iter':>8} {'cpu s':>8} {'E s':>7} {'M s':>7} {'ours/skl':>8} {'cpu ratio':>9}",
        ]
        for st in settings:
            for r in st["results"].values():
                p = r.get("per_iteration_1thread")
                if p:
                    lines.append(
                        f"{st['name']:<3} {r['library']:<12} {r['dtype']:<7} {p['median_s']:8.4f} {p['cpu_median_s']:8.4f} "
                        f"{_seconds(p['e_median_s'])} {_seconds(p['m_median_s'])} {r['ratio_vs_sklearn_1thread']:8.2f} "
                        f"{r['ratio_vs_sklearn_1thread_cpu']:9.2f}"
                    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)  # not the root: numba's debug output is huge
    set_torch_threads(args.threads, uses_pomegranate=not args.no_pomegranate)
    wanted = {n.strip().upper() for n in args.settings.split(",") if n.strip()}
    settings = [s for s in (QUICK_SETTINGS if args.quick else FULL_SETTINGS) if s.name in wanted]
    t_start = time.perf_counter()
    load_start = machine_load()
    with threadpool_limits(limits=args.threads):
        info = machine_info(args.threads)
        logger.info(
            "threads=%d  torch=%s sklearn=%s pomegranate=%s  cpu=%s  load average %s",
            args.threads,
            info["torch"],
            info["sklearn"],
            info["pomegranate"],
            info["cpu_model"],
            load_start,
        )
        results = [run_setting(s, args) for s in settings]
        # last, after every timing: their 1-thread limits and long peer fits must not touch the pools timed above
        for s, out in zip(settings, results, strict=True):
            logger.info("setting %s: end to end, every library at its defaults, 1 thread", s.name)
            out["end_to_end"] = end_to_end(make_data(s, args.seed)[0], s, args.seed, args.e2e_repeats)
        logger.info("E-step GFLOP/s at 1 thread")
        kernel = estep_rate(100_000 if args.quick else 1_000_000, repeats=2 if args.quick else 5)
        torch.set_num_threads(args.threads)
    report = {
        "benchmark": "gmm_em",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "config": {
            "seed": args.seed,
            "threads": args.threads,
            "timed_iters": args.timed_iters,
            "warmup_iters": args.warmup_iters,
            "max_iter": args.max_iter,
            "tol_rel": args.tol_rel,
            "reg_covar": 1e-6,
            "n_init": 1,
            "peer_api": args.peer_api,
        },
        "machine": info,
        "settings": results,
        "estep_kernel": kernel,
        "load_start": load_start,
        "load_end": machine_load(),
        "total_wall_s": time.perf_counter() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(format_end_to_end(results, kernel))
    print()
    table = format_table(results)
    print(table)
    if not args.no_profile:
        for st in results:
            for prof in st.get("profile_ppmix", []):
                spans = ", ".join(f"{k} {v:.1f} ms" for k, v in prof["span_ms_per_iter"].items())
                print(
                    f"\nppmix profile ({prof['threads']} thread), setting {st['name']}, {prof['dtype']} ({spans}); "
                    "top ops by self CPU per iteration:"
                )
                for row in prof["top_self_cpu"][:6]:
                    print(f"  {row['op']:<36} {row['self_cpu_ms_per_iter']:8.2f} ms  {100 * row['share']:5.1f}%")
    print(f"\nwrote {args.out}  ({report['total_wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
