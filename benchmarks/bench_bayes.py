#!/usr/bin/env python
"""Posterior sampling: effective samples per second of ppmix's blocked Gibbs (``engine="gibbs"``) against
NumPyro's NUTS on the same model, data and priors, side by side in one process.

The issue's two models and a count model, 4 chains each, 1 000 draws after 500 warmup iterations:

* **gmm**: a diagonal GMM, N = 2 000 rows, D = 2 features, K = 3 (means -3, 0, 3, standard deviations
  1, 0.7, 1.3, weights 0.3, 0.3, 0.4);
* **hmm**: a Gaussian HMM, 50 sequences x 100 steps, K = 3 states (the same emissions, stay probability 0.9);
* **poisson_mixture**: a Poisson mixture, N = 2 000, D = 2, K = 3 (rates 1, 6, 15).

Priors: ppmix's under ``bayesian()``, written out for NumPyro with the same numbers (ppmix's recorded data
scale): weights / initial distribution ``Dirichlet(1)``, every transition row ``Dirichlet(1)``, Gaussian
``locs ~ N(mean, 3 std)`` and variances ``InverseGamma(1, var / 100)``, Poisson rates ``Gamma(1, 1 / mean)``.
NumPyro's model has the discrete states summed out by hand (``logsumexp`` for the mixture, the forward algorithm
in a ``lax.scan`` for the HMM: what its HMM examples do; its generic enumeration needs ``funsor``), sampled by
NUTS with 4 vectorised chains; its compilation (timed as a run of one warmup step and one draw) is reported
apart and left out of its ESS/s. The draws of both are relabelled by ppmix's relabelling (the same
post-processing), then ArviZ's bulk ESS is taken for every coordinate: the reported ESS is the smallest (the
slowest-mixing parameter), ESS/s divides it by the sampling seconds (ppmix: the whole ``fit``, its start and
relabelling included). r_hat (rank-normalised, the largest coordinate) is reported beside it.

A last row times the issue's check: a Poisson HMM of 40 sequences x 40 steps, 4 chains x 1 000 draws
(500 warmup sweeps) by ppmix's Gibbs (the goal: under 2 minutes on 2 cores).

**NUTS** (section ``nuts``, issue 52): ppmix's ``engine="mcmc"`` (ppmix's NUTS, :mod:`ppmix.engines.nuts`, vectorised
over chains, on the potential built from the model's own likelihood, :mod:`ppmix.engines.potential`) against NumPyro's
NUTS, the two alternated model by model (``--pyro-nuts`` adds the former path, Pyro's NUTS kernel on the same
potential with the chains one after another, alternated with them), 2 chains x 300 draws after 300 warmup steps each
(both vectorised over the chains, one thread), on a
diagonal GMM (N = 2 000, D = 2, K = 3), a full GMM (N = 2 000, D = 3, K = 3), a Gaussian HMM (50 x 100, K = 3) and a
Student-t mixture (N = 2 000, D = 1, K = 2), the same priors written in NumPyro (full covariances: ``LKJCholesky(D,
2)`` correlations and ``sqrt(InverseGamma)`` scales; Student-t: ``df ~ Gamma(2, 0.1)``). NumPyro is reported cold (its
compilation included) and warm. Beside them, the cost of one gradient of the potential, ppmix's against Pyro's
traced program (``initialize_model``'s potential, discrete latents enumerated), and the share of ppmix's NUTS time
spent in the batched potential and its gradient (the rest is the sampler's tree building in Python).

Before the first row ppmix's NUTS runs once, untimed, on two tiny mixtures (a diagonal GMM and a Student t: 100 rows,
2 chains x (20 + 20)) and a tiny Gaussian HMM (3 x 15): the process's first-use costs (lazy imports, loading the
compiled kernels of :mod:`ppmix.engines.mixture_kernel` and :mod:`ppmix.engines.hmm_kernel` from numba's on-disk cache,
or compiling them where that cache is empty: once per installation, about 10 s) are paid there, as NumPyro's
``import jax`` is not timed either, so the first row does not carry them; NumPyro's cold figure still includes its
compilation of every model (JAX compiles per model and shape, in every process).

**Scale** (section ``nuts``, rows ``nuts_scale``): the issue's two "under 2 minutes" cases, a diagonal GMM with N = 20 000
(D = 2, K = 3) and a Gaussian HMM of 200 sequences x 200 steps (K = 3), 4 chains x (1 000 warmup + 1 000 draws), run
whole (``measured_s``, the whole ``fit``), beside an estimate: the seconds of one batched potential call at that size
(the HMM's: at 100 x 200, doubled) times the calls per iteration of the same model at the small size
(``estimated_s``).

Usage::

    .venv/bin/python benchmarks/bench_bayes.py            # writes benchmarks/results/bayes.json
    .venv/bin/python benchmarks/bench_bayes.py --quick    # small sizes, few draws (NumPyro: the GMM only)
    .venv/bin/python benchmarks/bench_bayes.py --only nuts  # the NUTS section only (the other kept in the JSON)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from _common import early_threads

THREADS = early_threads(default=1)
os.environ["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen={'true' if THREADS > 1 else 'false'}"

import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import machine_load, require_torch_threads, set_torch_threads  # noqa: E402

from ppmix import GMM, HMM, Mixture  # noqa: E402
from ppmix.engines.relabel import component_axes, relabel_draws  # noqa: E402

logger = logging.getLogger("bench_bayes")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bayes.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_bayes_quick.json"
RATES = np.array([1.0, 6.0, 15.0])
MEANS, SDS = np.array([-3.0, 0.0, 3.0]), np.array([1.0, 0.7, 1.3])
CHAINS = 4
NUTS_CHAINS = 2
SECTIONS = ("gibbs", "nuts")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small data and few draws (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="threads of torch and XLA (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON output path")
    p.add_argument("--only", choices=SECTIONS, default=None, help="run one section (the other's results are kept)")
    p.add_argument("--pyro-nuts", action="store_true", help="NUTS section: also run Pyro's NUTS kernel (slow)")
    return p.parse_args(argv)


def _states(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(3, size=n, p=[0.3, 0.3, 0.4])


def _paths(n_sequences: int, length: int, rng: np.random.Generator, stay: float = 0.9) -> list[np.ndarray]:
    """State paths of a sticky 3-state chain (self-transition ``stay``)."""
    transition = np.full((3, 3), (1.0 - stay) / 2)
    np.fill_diagonal(transition, stay)
    out = []
    for _ in range(n_sequences):
        z = [int(rng.integers(3))]
        for _ in range(length - 1):
            z.append(int(rng.choice(3, p=transition[z[-1]])))
        out.append(np.array(z))
    return out


def emitted(z: np.ndarray, emission: str, d: int, rng: np.random.Generator) -> np.ndarray:
    """Rows ``(len(z), d)`` emitted by states ``z``: Poisson counts (rates 1, 6, 15) or Gaussian (means -3, 0, 3
    in every feature, standard deviations 1, 0.7, 1.3)."""
    if emission == "poisson":
        return rng.poisson(RATES[z][:, None] * np.ones(d)).astype(np.float64)
    return MEANS[z][:, None] + SDS[z][:, None] * rng.normal(size=(len(z), d))


def mixture_data(n: int, d: int, emission: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return emitted(_states(n, rng), emission, d, rng)


def hmm_data(n_sequences: int, length: int, emission: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [emitted(z, emission, 1, rng) for z in _paths(n_sequences, length, rng)]


def smallest_ess(samples: dict[str, np.ndarray]) -> tuple[float, float]:
    """The smallest bulk ESS and the largest r_hat over every coordinate of ``{site: (chains, draws, ...)}``."""
    import arviz as az

    dataset = az.convert_to_dataset({k: np.asarray(v, dtype=np.float64) for k, v in samples.items()})
    ess = min(float(np.nanmin(az.ess(dataset)[name].values)) for name in samples)
    rhat = max(float(np.nanmax(az.rhat(dataset)[name].values)) for name in samples)
    return ess, rhat


def relabelled(model: Any, data: Any, samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Draws of any sampler relabelled as ppmix relabels its own (the same post-processing for both)."""
    tensors = {k: torch.as_tensor(np.asarray(v, dtype=np.float64)) for k, v in samples.items()}
    out, _ = relabel_draws(tensors, component_axes(model, data, tensors))
    return {k: v.numpy() for k, v in out.items()}


def run_ppmix(model: Any, data: Any, draws: int, warmup: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        model.fit(data, engine="gibbs", num_samples=draws, warmup_steps=warmup, num_chains=CHAINS)
        seconds = time.perf_counter() - start
    ess, rhat = smallest_ess({k: v.numpy() for k, v in model.mcmc_samples_.items()})
    return {"seconds": seconds, "min_ess": ess, "ess_per_s": ess / seconds, "max_rhat": rhat}


def _numpyro_components(k: int, scale: dict[str, np.ndarray], emission: str):
    """The components' priors as ppmix's program has them under ``bayesian()``, as NumPyro sample sites: Poisson
    ``rate ~ Gamma(1, 1 / mean)``; Gaussian ``locs ~ N(mean, 3 std)``, ``scales ~ sqrt(InverseGamma(1, var /
    100))`` (diagonal). Returns a function that samples them and returns ``log p_k(x)`` for ``x`` ``(..., D)``."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from numpyro.distributions.transforms import PowerTransform

    from ppmix.components.gaussian_family import VARIANCE_PRIOR_SHARE

    mean = jnp.asarray(scale["mean"])
    d = mean.shape[0]

    def sample_components():
        if emission == "poisson":
            prior_rate = jnp.broadcast_to(1.0 / mean, (k, d))
            rate = numpyro.sample("rate", nd.Gamma(jnp.ones_like(prior_rate), prior_rate).to_event(2))
            return lambda x: nd.Poisson(rate).log_prob(x[..., None, :]).sum(-1)
        std = jnp.broadcast_to(jnp.asarray(scale["std"]), (k, d))
        locs = numpyro.sample("locs", nd.Normal(jnp.broadcast_to(mean, (k, d)), 3.0 * std).to_event(2))
        variance = nd.InverseGamma(jnp.ones_like(std), VARIANCE_PRIOR_SHARE * std**2)
        scales = numpyro.sample("scales", nd.TransformedDistribution(variance, PowerTransform(0.5)).to_event(2))
        return lambda x: nd.Normal(locs, scales).log_prob(x[..., None, :]).sum(-1)

    return sample_components


def numpyro_mixture(x: np.ndarray, k: int, scale: dict[str, np.ndarray], emission: str):
    """The mixture with its assignments summed out (``logsumexp``)."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from jax.scipy.special import logsumexp

    sample_components = _numpyro_components(k, scale, emission)
    x = jnp.asarray(x)

    def model():
        weights = numpyro.sample("weights", nd.Dirichlet(jnp.ones(k)))
        log_p = sample_components()(x) + jnp.log(weights)
        numpyro.factor("x", logsumexp(log_p, axis=-1).sum())

    return model


def numpyro_hmm(seqs: list[np.ndarray], k: int, scale: dict[str, np.ndarray], emission: str):
    """The HMM with its states summed out by the forward algorithm in a ``lax.scan`` (equal lengths)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from jax.scipy.special import logsumexp

    sample_components = _numpyro_components(k, scale, emission)
    x = jnp.asarray(np.stack(seqs))  # (B, T, D)

    def model():
        initial = numpyro.sample("initial", nd.Dirichlet(jnp.ones(k)))
        transition = numpyro.sample("transition", nd.Dirichlet(jnp.ones((k, k))).to_event(1))  # rows
        emit = sample_components()(x)  # (B, T, K)
        log_trans = jnp.log(transition)

        def step(alpha, emit_t):
            return logsumexp(alpha[:, :, None] + log_trans, axis=1) + emit_t, None

        alpha, _ = jax.lax.scan(step, jnp.log(initial) + emit[:, 0], jnp.swapaxes(emit[:, 1:], 0, 1))
        numpyro.factor("x", logsumexp(alpha, axis=-1).sum())

    return model


def run_numpyro(
    model_fn: Any, draws: int, warmup: int, seed: int, quick: bool, chains: int = CHAINS
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """NUTS draws ``{site: (chains, draws, ...)}`` and the seconds of the run, less the compilation (measured
    as a run of one warmup step and one draw; ``quick``: not measured, the seconds include it)."""
    import jax
    from numpyro.infer import MCMC, NUTS

    def sample(n_warmup: int, n_draws: int) -> tuple[Any, float]:
        mcmc = MCMC(NUTS(model_fn), num_warmup=n_warmup, num_samples=n_draws, num_chains=chains,
                    chain_method="vectorized", progress_bar=False)  # fmt: skip
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed))
        jax.block_until_ready(mcmc.get_samples())
        return mcmc, time.perf_counter() - start

    mcmc, total = sample(warmup, draws)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    compile_s = float("nan") if quick else sample(1, 1)[1]
    seconds = total if quick else max(total - compile_s, 1e-9)
    return samples, {"seconds": seconds, "seconds_with_compile": total, "compile_s": compile_s}


# --------------------------------------------------------------------------------------------- NUTS (issue 52)
def numpyro_full_gmm(x: np.ndarray, k: int, scale: dict[str, np.ndarray]):
    """A full-covariance GMM as ppmix's program has it under ``bayesian()``: ``locs ~ N(mean, 3 std)``, every scale
    ``sqrt(InverseGamma(1, var / 100))``, correlations ``LKJCholesky(D, 2)``, the assignments summed out."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from jax.scipy.special import logsumexp
    from numpyro.distributions.transforms import PowerTransform

    from ppmix.components.gaussian_family import VARIANCE_PRIOR_SHARE

    x = jnp.asarray(x)
    mean, std = jnp.asarray(scale["mean"]), jnp.asarray(scale["std"])
    d = mean.shape[0]

    def model():
        weights = numpyro.sample("weights", nd.Dirichlet(jnp.ones(k)))
        with numpyro.plate("components", k):
            locs = numpyro.sample("locs", nd.Normal(mean, 3.0 * std).to_event(1))
            variance = nd.InverseGamma(jnp.ones(d), VARIANCE_PRIOR_SHARE * std**2)
            scales = numpyro.sample("scales", nd.TransformedDistribution(variance, PowerTransform(0.5)).to_event(1))
            corr = numpyro.sample("corr_cholesky", nd.LKJCholesky(d, 2.0))
        tril = scales[..., None] * corr
        log_p = nd.MultivariateNormal(locs, scale_tril=tril).log_prob(x[:, None, :]) + jnp.log(weights)
        numpyro.factor("x", logsumexp(log_p, axis=-1).sum())

    return model


def numpyro_student_t(x: np.ndarray, k: int, scale: dict[str, np.ndarray]):
    """A Student-t mixture (one feature) as ppmix's program has it: ``df ~ Gamma(2, 0.1)``, ``loc ~ N(mean, 3 std)``,
    ``scale ~ sqrt(InverseGamma(1, var / 100))``, the assignments summed out."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from jax.scipy.special import logsumexp
    from numpyro.distributions.transforms import PowerTransform

    from ppmix.components.gaussian_family import VARIANCE_PRIOR_SHARE

    x = jnp.asarray(x)
    mean, std = jnp.asarray(scale["mean"]), jnp.asarray(scale["std"])
    d = mean.shape[0]

    def model():
        weights = numpyro.sample("weights", nd.Dirichlet(jnp.ones(k)))
        with numpyro.plate("components", k):
            df = numpyro.sample("df", nd.Gamma(2.0, 0.1))
            loc = numpyro.sample("loc", nd.Normal(mean, 3.0 * std).to_event(1))
            variance = nd.InverseGamma(jnp.ones(d), VARIANCE_PRIOR_SHARE * std**2)
            sc = numpyro.sample("scale", nd.TransformedDistribution(variance, PowerTransform(0.5)).to_event(1))
        log_p = nd.StudentT(df[:, None], loc, sc).log_prob(x[:, None, :]).sum(-1) + jnp.log(weights)
        numpyro.factor("x", logsumexp(log_p, axis=-1).sum())

    return model


def gradient_seconds(potential: Any, point: dict[str, torch.Tensor], repeats: int) -> float:
    """The median seconds of one evaluation of ``potential`` and its gradient at ``point``."""
    times = []
    for _ in range(repeats):
        params = {k: v.detach().clone().requires_grad_() for k, v in point.items()}
        start = time.perf_counter()
        torch.autograd.grad(potential(params), list(params.values()))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def gradient_costs(model: Any, data: Any, repeats: int) -> dict[str, float]:
    """Seconds per gradient of the potential at the fitted point: ppmix's (from the model's likelihood) and Pyro's
    traced program (``initialize_model``, the discrete latents enumerated: what ``engine="mcmc"`` ran before)."""
    from pyro.infer.mcmc.util import initialize_model

    from ppmix.engines.potential import likelihood_potential

    prepared = model.prepare_data(data)
    with model.bayesian():
        ours = likelihood_potential(model, prepared)
        point = ours.unconstrained(model._get_globals())
        _, traced, _, _ = initialize_model(model.model, (prepared,), max_plate_nesting=model.max_plate_nesting)
        mine = gradient_seconds(ours, point, repeats)
        theirs = gradient_seconds(traced, point, max(2, repeats // 5))
    return {"ppmix_s": mine, "pyro_traced_s": theirs, "speedup": theirs / mine}


@contextlib.contextmanager
def counted_potential() -> Iterator[dict[str, float]]:
    """Count the batched evaluations of a NUTS potential and their seconds inside the context (ppmix's NUTS: one
    :class:`~ppmix.engines.potential.FlatPotential` call per leapfrog step, every chain; Pyro's: one
    ``LikelihoodPotential`` call per chain and step)."""
    from ppmix.engines.potential import FlatPotential, LikelihoodPotential

    counts = {"calls": 0, "seconds": 0.0}
    originals = {cls: cls.__call__ for cls in (FlatPotential, LikelihoodPotential)}

    def counting(call: Any) -> Any:
        def counted(self: Any, params: Any) -> Any:
            start = time.perf_counter()
            try:
                return call(self, params)
            finally:
                counts["calls"] += 1
                counts["seconds"] += time.perf_counter() - start

        return counted

    for cls, call in originals.items():
        cls.__call__ = counting(call)  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        for cls, call in originals.items():
            cls.__call__ = call  # type: ignore[method-assign]


def run_ppmix_nuts(model: Any, data: Any, draws: int, warmup: int, chains: int, sampler: str) -> dict[str, Any]:
    """``engine="mcmc"`` timed whole (its start, NUTS, relabelling), the smallest bulk ESS, and its gradients."""
    with warnings.catch_warnings(), counted_potential() as counts:
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        model.fit(data, engine="mcmc", num_samples=draws, warmup_steps=warmup, num_chains=chains, sampler=sampler)
        seconds = time.perf_counter() - start
    ess, rhat = smallest_ess({k: v.numpy() for k, v in model.mcmc_samples_.items()})
    stats = model.mcmc_sample_stats_
    return {"sampler": sampler, "seconds": seconds, "min_ess": ess, "ess_per_s": ess / seconds, "max_rhat": rhat,
            "potential_calls": counts["calls"], "gradient_share": counts["seconds"] / seconds,
            "mean_n_steps": float(stats["n_steps"].mean()),
            "divergences": int(stats["diverging"].sum())}  # fmt: skip


def nuts_row(
    name: str, model: Any, data: Any, peer: Any, draws: int, warmup: int, seed: int, quick: bool, pyro: bool
) -> dict:
    """ppmix NUTS, NumPyro NUTS (``peer(scale)``, or None) and (``pyro``) Pyro's NUTS kernel on ppmix's potential on
    one model, the order alternated from row to row."""
    row: dict[str, Any] = {"model": name, "draws": draws, "warmup": warmup, "chains": NUTS_CHAINS}

    def ours() -> None:
        logger.info("%s: ppmix nuts", name)
        row["ppmix_nuts"] = run_ppmix_nuts(model, data, draws, warmup, NUTS_CHAINS, "ppmix")

    def pyros() -> None:
        logger.info("%s: pyro nuts on ppmix's potential", name)
        row["pyro_nuts"] = run_ppmix_nuts(model, data, draws, warmup, NUTS_CHAINS, "pyro")

    def theirs() -> None:
        logger.info("%s: numpyro nuts", name)
        model.prepare_data(data, fitting=True)  # records the data scale of the priors, as the fit does
        scale = {key: value.cpu().numpy() for key, value in model._scale.items() if key in ("mean", "std")}
        samples, timing = run_numpyro(peer(scale), draws, warmup, seed, quick=False, chains=NUTS_CHAINS)
        ess, rhat = smallest_ess(relabelled(model, model.prepare_data(data), samples))
        warm, cold = timing["seconds"], timing["seconds_with_compile"]
        row["numpyro_nuts"] = {**timing, "min_ess": ess, "max_rhat": rhat, "ess_per_s_warm": ess / warm,
                               "ess_per_s_cold": ess / cold}  # fmt: skip

    steps = [ours] + ([] if peer is None else [theirs]) + ([pyros] if pyro else [])
    if len(ROWS_DONE) % 2:
        steps.reverse()
    for step in steps:
        step()
    ROWS_DONE.append(name)
    row["gradient"] = gradient_costs(model, data, repeats=5 if quick else 20)
    mine = row["ppmix_nuts"]
    if "pyro_nuts" in row:
        row["ess_per_s_ratio_vs_pyro_nuts"] = mine["ess_per_s"] / row["pyro_nuts"]["ess_per_s"]
    if "numpyro_nuts" in row:
        peer_row = row["numpyro_nuts"]
        row["ess_per_s_ratio_vs_numpyro_cold"] = mine["ess_per_s"] / peer_row["ess_per_s_cold"]
        row["ess_per_s_ratio_vs_numpyro_warm"] = mine["ess_per_s"] / peer_row["ess_per_s_warm"]
    return row


ROWS_DONE: list[str] = []


def warm_up_ppmix_nuts(seed: int) -> None:
    """ppmix's NUTS once, untimed, on a tiny diagonal GMM, a tiny Student-t mixture and a tiny Gaussian HMM: the
    process's first-use costs (module notes; the compiled kernels loaded from numba's on-disk cache, or compiled once
    per installation where the cache is empty) paid before the timed rows."""
    rng = np.random.default_rng(seed)
    rows = np.where(rng.random(100) < 0.5, -3.0, 3.0)[:, None] + rng.normal(size=(100, 2))
    models = (GMM(2, covariance_type="diag", seed=seed, progress=False), Mixture(2, family="student_t", seed=seed,
              progress=False), HMM(2, covariance_type="diag", seed=seed, progress=False))  # fmt: skip
    for model, data in zip(models, (rows, rows[:, :1], hmm_data(3, 15, "gaussian", seed))):
        run_ppmix_nuts(model, data, 20, 20, NUTS_CHAINS, "ppmix")


def nuts_section(seed: int, quick: bool, pyro: bool) -> list[dict[str, Any]]:
    """The issue's four NUTS models (quick: the diagonal GMM and the HMM, small, without NumPyro), after
    :func:`warm_up_ppmix_nuts`."""
    warm_up_ppmix_nuts(seed)
    draws, warmup = (20, 20) if quick else (300, 300)
    n = 100 if quick else 2000
    gmm2 = mixture_data(n, 2, "gaussian", seed)
    gmm3 = mixture_data(n, 3, "gaussian", seed + 1)
    seqs = hmm_data(4 if quick else 50, 15 if quick else 100, "gaussian", seed)
    rng = np.random.default_rng(seed + 2)
    t_rows = np.where(rng.random(n) < 0.4, -3.0, 3.0)[:, None] + rng.standard_t(3.0, size=(n, 1))
    peer = (lambda make: None) if quick else (lambda make: make)
    rows = [
        nuts_row("gmm_diag", GMM(3, covariance_type="diag", seed=seed, progress=False), gmm2,
                 peer(lambda scale: numpyro_mixture(gmm2, 3, scale, "gaussian")), draws, warmup, seed, quick, pyro),
        nuts_row("hmm", HMM(3, covariance_type="diag", seed=seed, progress=False), seqs,
                 peer(lambda scale: numpyro_hmm(seqs, 3, scale, "gaussian")), draws, warmup, seed, quick, pyro),
    ]  # fmt: skip
    if quick:
        return rows
    return rows + [
        nuts_row("gmm_full", GMM(3, covariance_type="full", seed=seed, progress=False), gmm3,
                 lambda scale: numpyro_full_gmm(gmm3, 3, scale), draws, warmup, seed, quick, pyro),
        nuts_row("student_t", Mixture(2, family="student_t", seed=seed, progress=False), t_rows,
                 lambda scale: numpyro_student_t(t_rows, 2, scale), draws, warmup, seed, quick, pyro),
    ]  # fmt: skip


def batched_gradient_seconds(model: Any, data: Any, chains: int, repeats: int) -> float:
    """The median seconds of one call of ppmix's batched potential and gradient (every chain at once) at the EM fit,
    each chain's point jittered."""
    from ppmix.engines.potential import FlatPotential, likelihood_potential

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(data)
    prepared = model.prepare_data(data)
    with model.bayesian():
        flat = FlatPotential(likelihood_potential(model, prepared))
        point = flat.potential.unconstrained(model._get_globals())
        z = flat.pack({k: torch.stack([v] * chains) for k, v in point.items()})
        z = z + 0.01 * torch.randn(z.shape, generator=torch.Generator().manual_seed(0), dtype=z.dtype)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            flat(z)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def scale_section(seed: int, quick: bool, nuts_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's two "4 chains x 1 000 draws under 2 minutes" cases (1 000 warmup + 1 000 draws), run whole, and
    estimated as 2 000 iterations x the batched potential calls per iteration of the same model at the small size (its
    row of the NUTS section) x the seconds of one batched call at the large size (4 chains) (quick: a tenth of each
    size, ``20 + 20`` iterations)."""
    cases = {
        "gmm_diag_20000": ("gmm_diag", GMM(3, covariance_type="diag", seed=seed, progress=False),
                           mixture_data(2000 if quick else 20_000, 2, "gaussian", seed)),
        # the call timed on half the sequences and doubled (linear in them); the run on all of them
        "hmm_200x200": ("hmm", HMM(3, covariance_type="diag", seed=seed, progress=False),
                        hmm_data(10 if quick else 100, 20 if quick else 200, "gaussian", seed)),
    }  # fmt: skip
    small = {row["model"]: row for row in nuts_rows}
    rows = []
    model_like = HMM(3, covariance_type="diag", seed=seed, progress=False)
    data_whole = hmm_data(20 if quick else 200, 20 if quick else 200, "gaussian", seed)
    for name, (like, model, data) in cases.items():
        calls = small[like]["ppmix_nuts"]["potential_calls"] / (small[like]["warmup"] + small[like]["draws"])
        call_s = batched_gradient_seconds(model, data, chains=4, repeats=3 if quick else 5)
        call_s *= 2 if name.startswith("hmm") else 1
        row = {"model": name, "chains": 4, "calls_per_iteration_at_small_size": calls, "batched_call_s": call_s,
               "estimated_s": 2000 * calls * call_s, "goal_s": 120.0}  # fmt: skip
        warmup, draws = (20, 20) if quick else (1000, 1000)
        if name.startswith("hmm"):
            model, data = model_like, data_whole
        logger.info("%s: ppmix nuts, 4 chains x (%d + %d) iterations", name, warmup, draws)
        run = run_ppmix_nuts(model, data, draws, warmup, 4, "ppmix")
        row.update(warmup=warmup, draws=draws, ppmix_nuts=run, measured_s=run["seconds"])
        rows.append(row)
        logger.info("%s: 4 x (%d + %d) run %.0f s (ESS %.0f, r_hat %.3f); estimated %.0f s (%.1f calls per iteration x "
                    "%.1f ms a call); goal 120 s", name, warmup, draws, run["seconds"], run["min_ess"], run["max_rhat"],
                    row["estimated_s"], calls, 1e3 * call_s)  # fmt: skip
    return rows


def compare(
    name: str, model: Any, data: Any, numpyro_model: Any, draws: int, warmup: int, seed: int, with_peer: bool
) -> dict[str, Any]:
    """ppmix's Gibbs, then (``with_peer``) NumPyro's NUTS on the same data and priors (``numpyro_model(scale)``
    builds the peer's model from ppmix's recorded data scale, so the priors are the same numbers)."""
    logger.info("%s: ppmix gibbs", name)
    ours = run_ppmix(model, data, draws, warmup)
    row = {"model": name, "draws": draws, "warmup": warmup, "chains": CHAINS, "ppmix_gibbs": ours}
    if not with_peer:
        return row
    logger.info("%s: numpyro nuts", name)
    scale = {key: value.cpu().numpy() for key, value in model._scale.items() if key in ("mean", "std")}
    samples, peer = run_numpyro(numpyro_model(scale), draws, warmup, seed, quick=draws < 200)
    samples = relabelled(model, model.prepare_data(data), samples)
    ess, rhat = smallest_ess(samples)
    peer.update(min_ess=ess, ess_per_s=ess / peer["seconds"], max_rhat=rhat)
    row.update(numpyro_nuts=peer, ess_per_s_ratio_ppmix_over_numpyro=ours["ess_per_s"] / peer["ess_per_s"])
    return row


def gibbs_section(seed: int, quick: bool) -> dict[str, Any]:
    """ppmix's Gibbs against NumPyro's NUTS on the three models, and the issue's Poisson HMM check."""
    draws, warmup = (100, 50) if quick else (1000, 500)
    gmm_x = mixture_data(200 if quick else 2000, 2, "gaussian", seed)
    hmm_seqs = hmm_data(10 if quick else 50, 20 if quick else 100, "gaussian", seed)
    counts = mixture_data(200 if quick else 2000, 2, "poisson", seed)
    rows = [  # the quick run compares with NumPyro on the GMM only (NumPyro compiles for 15-20 s a model)
        compare("gmm", GMM(3, covariance_type="diag", seed=seed, progress=False), gmm_x,
                lambda scale: numpyro_mixture(gmm_x, 3, scale, "gaussian"), draws, warmup, seed, True),
        compare("hmm", HMM(3, covariance_type="diag", seed=seed, progress=False), hmm_seqs,
                lambda scale: numpyro_hmm(hmm_seqs, 3, scale, "gaussian"), draws, warmup, seed, not quick),
        compare("poisson_mixture", Mixture(3, family="poisson", seed=seed, progress=False), counts,
                lambda scale: numpyro_mixture(counts, 3, scale, "poisson"), draws, warmup, seed, not quick),
    ]  # fmt: skip
    check_seqs = hmm_data(8 if quick else 40, 10 if quick else 40, "poisson", seed + 1)
    logger.info("the issue's check: Poisson HMM 40 x 40, 4 chains x 1000 draws")
    check = run_ppmix(HMM(3, emission="poisson", seed=seed, progress=False), check_seqs, draws, warmup)
    for row in (r for r in rows if "numpyro_nuts" in r):
        ours, peer = row["ppmix_gibbs"], row["numpyro_nuts"]
        logger.info(
            "%s: ESS/s ppmix gibbs %.1f (ESS %.0f in %.1f s, r_hat %.3f) | numpyro nuts %.1f (ESS %.0f in %.1f s "
            "+ %.1f s compile, r_hat %.3f) | ratio %.2f",
            row["model"], ours["ess_per_s"], ours["min_ess"], ours["seconds"], ours["max_rhat"], peer["ess_per_s"],
            peer["min_ess"], peer["seconds"], peer["compile_s"], peer["max_rhat"],
            row["ess_per_s_ratio_ppmix_over_numpyro"],
        )  # fmt: skip
    logger.info("Poisson HMM 40 x 40, 4 x 1000 draws: %.1f s (goal 120 s)", check["seconds"])
    return {"rows": rows, "hmm_40x40_4x1000": {**check, "goal_s": 120.0}}


def log_nuts(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        ours, grad = row["ppmix_nuts"], row["gradient"]
        peer = row.get("numpyro_nuts")
        versus = (
            ""
            if peer is None
            else (
                f" | numpyro {peer['ess_per_s_cold']:.1f} cold, {peer['ess_per_s_warm']:.1f} warm (ESS {peer['min_ess']:.0f},"
                f" {peer['seconds']:.1f} s + {peer['compile_s']:.1f} s compile) | ratio cold "
                f"{row['ess_per_s_ratio_vs_numpyro_cold']:.2f}, warm {row['ess_per_s_ratio_vs_numpyro_warm']:.2f}"
            )
        )
        if "pyro_nuts" in row:
            versus += f" | pyro kernel {row['pyro_nuts']['ess_per_s']:.2f} (x{row['ess_per_s_ratio_vs_pyro_nuts']:.1f})"
        logger.info(
            "%s: ppmix nuts ESS/s %.2f (ESS %.0f in %.1f s, r_hat %.3f, %.0f%% in the potential)%s | gradient %.2f ms "
            "against %.1f ms traced (x%.0f)",
            row["model"], ours["ess_per_s"], ours["min_ess"], ours["seconds"], ours["max_rhat"],
            100 * ours["gradient_share"], versus, 1e3 * grad["ppmix_s"], 1e3 * grad["pyro_traced_s"], grad["speedup"],
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads(args.threads, uses_pomegranate=False)
    require_torch_threads(args.threads)
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    report: dict[str, Any] = json.loads(out.read_text()) if args.only and out.exists() else {}
    if args.only in (None, "gibbs"):
        report.update(gibbs_section(args.seed, args.quick))
    if args.only in (None, "nuts"):
        report["nuts_rows"] = nuts_section(args.seed, args.quick, args.pyro_nuts)
        log_nuts(report["nuts_rows"])
        out.write_text(json.dumps(report, indent=2))  # kept if the scale section fails
        report["nuts_scale"] = scale_section(args.seed, args.quick, report["nuts_rows"])
    report.update(
        benchmark="bayes",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        threads=args.threads,
        quick=args.quick,
        machine_load=machine_load(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
