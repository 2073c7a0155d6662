#!/usr/bin/env python
"""The non-Gaussian families against the peer that has them: one EM iteration, side by side.

**Mixtures** (``Mixture(family=...)``) against pomegranate's ``GeneralMixtureModel`` of the matching
distributions: ``poisson`` (``Poisson``), ``bernoulli`` (``Bernoulli``), ``exponential``
(``Exponential``), ``gamma`` (``Gamma``), ``lognormal`` (``LogNormal``, diagonal), ``student_t``
(``StudentT``, diagonal), ``categorical`` (``Categorical``) and ``multinomial`` (no peer: pomegranate
has no multinomial, ppmix is timed alone). Planted data from ``K`` components on ``D`` features, a
start made once (ppmix's k-means start and one M-step), the same start given to pomegranate, then
``ITERATIONS`` EM iterations of each, interleaved (ppmix: ``_e_step`` + ``_m_step``; pomegranate:
``summarize`` + ``from_summaries``).

**HMMs** (``HMM(emission=...)``) against hmmlearn: ``poisson`` (``PoissonHMM``), ``categorical``
(``CategoricalHMM``, one feature: hmmlearn's takes one) and ``gmm`` (``GMMHMM``, diagonal, two
Gaussians per state). Sticky ``K``-state chains with lengths uniform in 10..50; the start is ppmix's
(its initialisation and one Baum-Welch iteration), given to hmmlearn (``startprob_``, ``transmat_`` and
the emission parameters; ``init_params=""``, ``n_iter=1``, its default priors, which are flat); then
``ITERATIONS`` iterations of each, interleaved (ppmix: ``_e_step`` + ``_m_step``; hmmlearn: ``fit``).

Every iteration is timed, float64, 1 thread; the speed is the ratio of the median iteration times.
Where both run the same algorithm from the same start (``same_em``) their mean log-likelihoods at the
last iteration agree (reported, with their difference; pomegranate sums its statistics in float32 after
its first iteration, hence differences of about 1e-8 per point). Where the peer's maths differ the row's
``note`` says how, and the times are compared:

* ``gamma``: pomegranate's shape Newton starts from ``shapes = new_shapes + tol`` and stops once
  ``|shapes - new_shapes| < tol``, so where that sum rounds below ``tol`` it returns Minka's closed-form
  start, not the maximum-likelihood shape (here its first M-step, on float64 statistics: its
  log-likelihood then trails ppmix's by about 4e-5 per point); its later M-steps run the Newton on
  float32 statistics (pomegranate remakes them in the default dtype after each M-step, whatever the
  model's dtype), and the two log-likelihoods meet again. Both are shown, and the times compared.
* ``lognormal``: pomegranate's ``LogNormal`` scores ``log x`` by the normal density, without the
  Jacobian ``-sum_d log x_d``; its log-likelihood is reported with the Jacobian added. ppmix runs with
  ``reg_covar=0``, as pomegranate's variances are the maximum-likelihood ones.
* ``student_t``: pomegranate's ``StudentT`` keeps integer degrees of freedom fixed, multiplies
  univariate t densities (no shared latent precision) and fits means and variances as a normal does;
  ppmix fits the multivariate t by EM (weights ``u_nk``) and ``df`` by a root find. Time only.
* HMM ``categorical``: ppmix's level floor is set to 1e-12 (default 1e-4, which a state's fitted
  frequencies can meet; hmmlearn has none).
* HMM ``gmm``: hmmlearn's ``GMMHMM`` accumulates its variance statistics about the previous means, so
  its variances exceed the EM update by the squared step of the means; the same E-step (the first
  log-likelihoods agree), the log-likelihoods then differ slightly. Time compared.

Usage::

    .venv/bin/python benchmarks/bench_families.py            # N = 200 000, D = 20, K = 8; 2 000 chains
    .venv/bin/python benchmarks/bench_families.py --quick    # N = 5 000; 50 chains (smoke run)
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
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import machine_load, require_torch_threads, set_torch_threads, sticky_paths  # noqa: E402

from ppmix import HMM, Mixture  # noqa: E402
from ppmix.components.categorical import CategoricalFamily  # noqa: E402
from ppmix.components.family import DensityFamily  # noqa: E402
from ppmix.components.gaussian_mixture import GaussianMixtureFamily  # noqa: E402
from ppmix.components.lognormal import LogNormalFamily  # noqa: E402

logger = logging.getLogger("bench_families")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "families.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_families_quick.json"
FAMILIES = ("poisson", "bernoulli", "exponential", "gamma", "lognormal", "student_t", "categorical", "multinomial")
ITERATIONS = 10
#: levels of the categorical rows; trials of the multinomial rows; Gaussians per state of the GMM-HMM
LEVELS, TRIALS, N_MIX = 5, 20, 2


@dataclass(frozen=True)
class MixturePeer:
    """pomegranate's distribution for one ppmix family.

    ``make`` builds component ``j``'s distribution from ppmix's components; ``same_model``: pomegranate's
    density is ppmix's (their log-likelihoods are compared); ``same_em``: its EM update is ppmix's too (their
    log-likelihoods must agree); ``shift`` is added to pomegranate's mean log-likelihood (a constant its
    density leaves out); ``note`` says where the maths differ.
    """

    name: str
    make: Callable[[Any, int], Any]
    same_model: bool = True
    same_em: bool = True
    shift: Callable[[np.ndarray], float] | None = None
    note: str = ""


def _mixture_peers() -> dict[str, MixturePeer]:
    from pomegranate.distributions import Bernoulli, Categorical, Exponential, Gamma, LogNormal, Poisson, StudentT

    def variances(c: Any, j: int) -> torch.Tensor:
        return c.scale[j].square()

    return {
        "poisson": MixturePeer("Poisson", lambda c, j: Poisson(lambdas=c.rate[j])),
        "bernoulli": MixturePeer("Bernoulli", lambda c, j: Bernoulli(probs=c.probs[j])),
        "exponential": MixturePeer("Exponential", lambda c, j: Exponential(scales=c.moments().mean[j])),
        "gamma": MixturePeer(
            "Gamma",
            lambda c, j: Gamma(shapes=c.concentration[j], rates=c.rate[j]),
            same_em=False,
            note="pomegranate's shape Newton stops before its first step where shapes + tol rounds (its first "
            "M-step here: Minka's approximation, not the MLE), later ones run on float32 statistics; time compared",
        ),
        "lognormal": MixturePeer(
            "LogNormal",
            lambda c, j: LogNormal(means=c.loc[j], covs=variances(c, j), covariance_type="diag"),
            shift=lambda x: -float(np.log(x).sum(1).mean()),
            note="pomegranate's density leaves out the Jacobian -sum log x (added back)",
        ),
        "student_t": MixturePeer(
            "StudentT",
            lambda c, j: StudentT(
                dofs=max(1, round(float(c.df[j]))), means=c.loc[j], covs=variances(c, j), covariance_type="diag"
            ),
            same_model=False,
            same_em=False,
            note="other maths: pomegranate keeps integer dofs fixed, multiplies univariate t's and fits "
            "means and variances as a normal; time only",
        ),
        "categorical": MixturePeer("Categorical", lambda c, j: Categorical(probs=c.probs[j])),
    }


def make_data(family: str, n: int, d: int, k: int, seed: int) -> np.ndarray:
    """Rows from ``k`` planted components of ``family`` with random parameters."""
    rng = np.random.default_rng(seed)
    z = rng.integers(k, size=n)
    if family == "poisson":
        return rng.poisson(rng.uniform(0.5, 20.0, size=(k, d))[z]).astype(np.float64)
    if family == "bernoulli":
        return (rng.random((n, d)) < rng.uniform(0.05, 0.95, size=(k, d))[z]).astype(np.float64)
    if family == "exponential":
        return rng.exponential(rng.uniform(0.5, 20.0, size=(k, d))[z])
    if family == "gamma":
        return rng.gamma(rng.uniform(0.5, 10.0, size=(k, d))[z], rng.uniform(0.2, 5.0, size=(k, d))[z])
    if family == "lognormal":
        return np.exp(rng.normal(rng.uniform(-2.0, 2.0, size=(k, d))[z], rng.uniform(0.2, 1.0, size=(k, d))[z]))
    if family == "student_t":  # the multivariate t: one latent precision u ~ Gamma(df / 2, df / 2) per row
        df = rng.uniform(3.0, 10.0, size=k)[z, None]
        u = rng.gamma(df / 2, 2 / df)
        scale = rng.uniform(0.5, 2.0, size=(k, d))[z]
        return rng.uniform(-10.0, 10.0, size=(k, d))[z] + scale * rng.normal(size=(n, d)) / np.sqrt(u)
    if family == "categorical":  # every level at least 2 % likely, so no fitted frequency meets ppmix's floor
        probs = 0.1 / LEVELS + 0.9 * rng.dirichlet(np.ones(LEVELS), size=(k, d))
        cumulative = probs.cumsum(-1)[z]
        return (rng.random((n, d, 1)) > cumulative).sum(-1).clip(max=LEVELS - 1).astype(np.float64)
    return rng.multinomial(TRIALS, rng.dirichlet(np.ones(d), size=k)[z]).astype(np.float64)


def time_interleaved(steps: dict[str, Callable[[], None]], iterations: int) -> dict[str, list[float]]:
    """Seconds of every call of every step, the steps interleaved, their order alternating per iteration."""
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for _ in range(iterations):
        for name in order:
            start = time.perf_counter()
            steps[name]()
            seconds[name].append(time.perf_counter() - start)
        order.reverse()
    return seconds


def summarise(
    row: dict, seconds: dict[str, list[float]], loglik: dict[str, float], same_model: bool, same_em: bool
) -> dict:
    """``row`` with the median seconds, the ratio and the mean log-likelihoods (their difference where the peer
    scores the same model; ``same_em``: where it also runs the same EM update, so that they must agree)."""
    ppmix_median = statistics.median(seconds["ppmix"])
    peer_median = statistics.median(seconds["peer"]) if "peer" in seconds else None
    result = {
        **row,
        "iterations": len(seconds["ppmix"]),
        "ppmix_iteration_s": ppmix_median,
        "peer_iteration_s": peer_median,
        "ratio_ppmix_over_peer": ppmix_median / peer_median if peer_median else None,
        # the objective at the start of the last iteration
        "ppmix_mean_loglik": loglik["ppmix"],
        "peer_mean_loglik": loglik.get("peer"),
        "loglik_difference": loglik["ppmix"] - loglik["peer"] if same_model else None,
        "same_em": same_em,
    }
    logger.info(
        "%-7s %-12s ppmix %.4f s/iter, %s %s s/iter: ratio %s; mean log-lik %.6f vs %s%s",
        row["model"],
        row["family"],
        ppmix_median,
        row["peer"] or "no peer",
        "-" if peer_median is None else f"{peer_median:.4f}",
        "-" if peer_median is None else f"{result['ratio_ppmix_over_peer']:.2f}",
        loglik["ppmix"],
        "-" if loglik.get("peer") is None else f"{loglik['peer']:.6f}",
        f" ({row['note']})" if row["note"] else "",
    )
    return result


def run_mixture(family: str, n: int, d: int, k: int, seed: int, iterations: int) -> dict:
    x = make_data(family, n, d, k, seed)
    density = LogNormalFamily(reg_covar=0.0) if family == "lognormal" else family  # pomegranate's variances are MLEs
    model = Mixture(k, family=density, seed=seed, progress=False)
    data = model._em_data(model.prepare_data(x, fitting=True))
    model._em_initialize(data, model._generator())
    if family == "bernoulli":  # pomegranate refuses probabilities within 1.2e-7 of 0 (the k-means start has some)
        model.components_.probs = model.components_.probs.clamp(1e-6, 1 - 1e-6)
    loglik: dict[str, float] = {}

    def ppmix_step() -> None:
        stats, objective = model._e_step(data)
        model._m_step(data, stats)
        loglik["ppmix"] = float(objective) / n

    steps = {"ppmix": ppmix_step}
    peer = _mixture_peers().get(family)
    if peer is not None:
        from pomegranate.gmm import GeneralMixtureModel

        components = model.components_  # the start (the model is not fitted yet)
        dists = [peer.make(components, j) for j in range(k)]
        mixture = GeneralMixtureModel(dists, priors=model.weights_.detach().clone(), max_iter=1, tol=0.0)
        mixture = mixture.to(torch.float64)
        xt = torch.from_numpy(x.astype(np.int64) if family == "categorical" else x)
        shift = peer.shift(x) if peer.shift else 0.0

        def peer_step() -> None:
            loglik["peer"] = float(mixture.summarize(xt)) / n + shift
            mixture.from_summaries()

        steps["peer"] = peer_step
    row = {
        "model": "Mixture",
        "family": family,
        "peer": f"pomegranate GeneralMixtureModel({peer.name})" if peer else None,
        "note": peer.note if peer else "no peer: pomegranate has no multinomial",
        "n": n,
        "d": d,
        "k": k,
    }
    seconds = time_interleaved(steps, iterations)
    return summarise(row, seconds, loglik, peer is not None and peer.same_model, peer is not None and peer.same_em)


@dataclass(frozen=True)
class HmmPeer:
    """ppmix's emission family for one row, hmmlearn's class beside it, and where their maths differ."""

    density: str | DensityFamily
    name: str
    same_em: bool = True
    note: str = ""


HMM_PEERS = {
    "poisson": HmmPeer("poisson", "PoissonHMM"),
    "categorical": HmmPeer(
        CategoricalFamily(floor=1e-12),
        "CategoricalHMM",
        note="one feature (hmmlearn's CategoricalHMM takes one); ppmix's level floor 1e-12 (default 1e-4, "
        "which a state's frequencies can meet; hmmlearn has none)",
    ),
    "gmm": HmmPeer(
        GaussianMixtureFamily(n_mix=N_MIX, covariance_type="diag", reg_covar=0.0),
        f"GMMHMM(n_mix={N_MIX}, diag)",
        same_em=False,
        note="hmmlearn centres its variance statistics at the previous means, so its variances exceed the EM "
        "update by the squared mean step (hmmlearn PR #516 rewrites it); the same E-step, time comparable",
    ),
}


def make_chains(emission: str, n_sequences: int, d: int, k: int, seed: int) -> list[np.ndarray]:
    """Sticky ``k``-state chains (self-transition 0.9), lengths uniform in 10..50, planted emissions."""
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.5, 20.0, size=(k, d))
    levels = 0.1 / d + 0.9 * rng.dirichlet(np.ones(d), size=k)  # categorical: d levels of one feature
    locs = rng.normal(0.0, 3.0, size=(k, N_MIX, d))
    seqs = []
    for z in sticky_paths(rng, n_sequences, k):
        length = len(z)
        if emission == "poisson":
            seqs.append(rng.poisson(rates[z]).astype(np.float64))
        elif emission == "categorical":
            seqs.append(np.array([[rng.choice(d, p=levels[s])] for s in z], dtype=np.float64))
        else:
            seqs.append(locs[z, rng.integers(N_MIX, size=length)] + rng.normal(size=(length, d)))
    return seqs


def _hmmlearn_model(emission: str, model: HMM):
    """hmmlearn's HMM of the same emission at ppmix's current parameters: one iteration per ``fit``."""
    from hmmlearn.hmm import GMMHMM, CategoricalHMM, PoissonHMM

    k, c = model.n_components, model.components_
    options = {"n_iter": 1, "tol": -np.inf, "init_params": ""}
    if emission == "poisson":
        peer = PoissonHMM(k, params="stl", **options)
        peer.lambdas_ = c.rate.numpy().copy()
    elif emission == "categorical":
        peer = CategoricalHMM(k, n_features=c.n_levels, params="ste", **options)
        peer.emissionprob_ = c.probs[:, 0].numpy().copy()
    else:
        peer = GMMHMM(k, n_mix=N_MIX, covariance_type="diag", params="stmcw", **options)
        peer.weights_, peer.means_, peer.covars_ = (
            c.mix_weights.numpy().copy(),
            c.loc.numpy().copy(),
            c.scale.square().numpy().copy(),
        )
    peer.startprob_, peer.transmat_ = model.initial_.numpy().copy(), model.transition_.numpy().copy()
    return peer


def run_hmm(emission: str, n_sequences: int, d: int, k: int, seed: int, iterations: int) -> dict:
    from ppmix.inference import ConvergenceWarning

    seqs = make_chains(emission, n_sequences, d, k, seed)
    frames, lengths = np.concatenate(seqs), [len(s) for s in seqs]
    spec = HMM_PEERS[emission]
    model = HMM(k, emission=spec.density, seed=seed, progress=False)
    with warnings.catch_warnings():  # one iteration makes the start
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(seqs, max_iter=1)
    data = model._em_data(model.prepare_data(seqs))
    peer = _hmmlearn_model(emission, model)
    x = frames.astype(np.int64) if emission == "categorical" else frames
    loglik: dict[str, float] = {}

    def ppmix_step() -> None:
        stats, objective = model._e_step(data)
        model._m_step(data, stats)
        loglik["ppmix"] = float(objective) / len(frames)

    def peer_step() -> None:
        peer.fit(x, lengths)
        loglik["peer"] = float(peer.monitor_.history[-1]) / len(frames)

    row = {
        "model": "HMM",
        "family": emission,
        "peer": f"hmmlearn {spec.name}",
        "note": spec.note,
        "n": n_sequences,
        "frames": len(frames),
        "d": 1 if emission == "categorical" else d,
        "k": k,
    }
    seconds = time_interleaved({"ppmix": ppmix_step, "peer": peer_step}, iterations)
    return summarise(row, seconds, loglik, same_model=True, same_em=spec.same_em)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: N = 5 000, 50 chains, 3 iterations")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    set_torch_threads(args.threads, uses_pomegranate=True)
    n, d, k = (5_000, 5, 3) if args.quick else (200_000, 20, 8)
    n_sequences, hmm_k = (50, 3) if args.quick else (2_000, 4)
    iterations = 3 if args.quick else ITERATIONS
    results = [run_mixture(family, n, d, k, args.seed, iterations) for family in FAMILIES]
    results += [
        run_hmm(emission, n_sequences, 2 * LEVELS if emission == "categorical" else d, hmm_k, args.seed, iterations)
        for emission in HMM_PEERS
    ]
    report = {
        "benchmark": "families",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": require_torch_threads(args.threads),
        "quick": args.quick,
        "versions": {
            "torch": torch.__version__,
            "pomegranate": version("pomegranate"),
            "hmmlearn": version("hmmlearn"),
        },
        "load": machine_load(),
        "results": results,
    }
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
