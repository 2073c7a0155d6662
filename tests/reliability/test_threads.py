"""Pyro-based calls from several threads at once (issue 39, item 6): Pyro keeps its handler stack in module
globals, so ppmix runs them one at a time (``ppmix.engines.params.local_params``); each gives what it
gives alone."""

from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ppmix import GMM, Mixture
from tests.common import make_blobs


def test_svi_fits_and_elbos_from_a_thread_pool_equal_the_same_calls_one_by_one():
    x, _ = make_blobs(60)
    fitted = GMM(2, seed=0, progress=False).fit(x)

    def job(i: int) -> float:
        if i % 2:
            return fitted.elbo(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return GMM(2, seed=i, progress=False).fit(x, engine="svi", num_steps=5).score(x)

    alone = [job(i) for i in range(12)]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(job, range(12)))
    np.testing.assert_array_equal(together, alone)


def test_gibbs_fits_from_two_threads_with_one_seed_draw_what_one_thread_draws():
    """The Gibbs engine draws from torch's global generator seeded from the model's seed (issue 49, item 5): two
    threads fitting with the same seed at once get the draws of a sequential run, not an interleaving."""
    x = np.r_[np.random.default_rng(0).poisson(2.0, (60, 1)), np.random.default_rng(1).poisson(12.0, (60, 1))]

    def draws(_: int) -> np.ndarray:
        model = Mixture(2, family="poisson", seed=3, progress=False)
        model.fit(x, engine="gibbs", num_samples=60, warmup_steps=20, num_chains=2)
        return model.mcmc_samples_["rate"].numpy()

    alone = draws(0)
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(draws, range(4)))
    for result in together:
        np.testing.assert_array_equal(result, alone)


def test_forked_rng_from_two_threads_with_one_seed_draws_what_one_thread_draws():
    """``_forked_rng`` (under which ``sample``, SVI's guide and the ArviZ draws run their Pyro programs) seeds
    torch's global generator from the model's seed: two threads drawing in it at once, in small steps that let the
    other run between them, get the draws of a sequential run, not an interleaving of reseeded streams."""
    model = Mixture(2, family="poisson", seed=3, progress=False)

    def draws(_: int) -> np.ndarray:
        with model._forked_rng():
            steps = []
            for _ in range(50):
                steps.append(torch.rand(20).numpy())
                time.sleep(0.0005)  # let another thread in, as a longer program would
            return np.concatenate(steps)

    alone = draws(0)
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(draws, range(4)))
    for result in together:
        np.testing.assert_array_equal(result, alone)
