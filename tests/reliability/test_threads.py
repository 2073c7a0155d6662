"""Pyro-based calls from several threads at once (issue 39, item 6): Pyro keeps its handler stack in module
globals, so ppmix runs them one at a time (``ppmix.inference.engines.params.local_params``); each gives what it
gives alone."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ppmix import GMM
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
