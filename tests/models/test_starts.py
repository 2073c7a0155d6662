"""The default start of every registered family reaches the optimum that random starts find, and converges.

Planted data with overlapping components (:func:`ppmix.datasets.families.make_family_mixture`), where k-means'
hard clusters give the discrete and positive families extreme starting parameters: the cases marked below are
data on which the hard start stopped 0.007-0.07 nats per row below the best random start, or unconverged at
100 iterations (``benchmarks/_defaults_starts.py`` measures 10 seeds at N = 2000).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppmix import GMM, Mixture
from ppmix.components.registry import FAMILIES, family_from
from ppmix.datasets.families import make_family_mixture
from ppmix.models._starts import spread, start_responsibilities
from tests.common import SEQUENCE_FAMILIES

#: a default fit may end at most this far below the best random start (nats per row)
TOLERANCE = 1e-3
#: (family, data seed): rows where the hard k-means start missed (gap, at N = 400: gamma 2: -1.8e-2 and not
#: converged; gamma 3: -6.7e-3; categorical 0: -6.9e-2; categorical 2: -1.8e-2 and not converged; Bernoulli 4:
#: -1.7e-2; Bernoulli 5: -2.1e-2)
MISSED_BY_THE_HARD_START = [
    ("gamma", 2),
    ("gamma", 3),
    ("categorical", 0),
    ("categorical", 2),
    ("bernoulli", 4),
    ("bernoulli", 5),
]


def _best_random(family: str, x: np.ndarray, starts: int) -> float:
    fits = (
        Mixture(3, family=family, init_params="random", seed=s, max_iter=1000, progress=False).fit(x)
        for s in range(starts)
    )
    return max(float(m.score(x)) for m in fits)


def _default_gap(family: str, n: int, seed: int, starts: int) -> tuple[float, Mixture]:
    x, _ = make_family_mixture(family, n, 3, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a random start may end at its max_iter; the default must not (asserted)
        model = Mixture(3, family=family, seed=0, progress=False).fit(x)
        return float(model.score(x)) - _best_random(family, x, starts), model


@pytest.mark.parametrize(("family", "seed"), MISSED_BY_THE_HARD_START)
def test_default_start_reaches_the_best_random_start(family, seed):
    gap, model = _default_gap(family, 400, seed, starts=4)
    assert model.converged_, f"{family}: not converged in {model.n_iter_} iterations"
    assert gap >= -TOLERANCE, f"{family} seed {seed}: {gap:.2e} nats per row below the best random start"


#: families whose random starts take 6-9 s here (their medians are in ``benchmarks/results/defaults_starts.json``)
SLOW_REFERENCE = ("gmm", "student_t")


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(SLOW_REFERENCE) - SEQUENCE_FAMILIES))
def test_every_family_default_start_converges_near_the_optimum(family):
    """Every registered family, three planted data sets of 2000 rows (the first three of the benchmark's ten): the
    default fit converges within the default ``max_iter`` and its median gap to the best of three random starts is
    within ``TOLERANCE`` (the criterion of issue 49; a single data set may hold a local optimum that no k-means
    start escapes: Poisson on 800 rows, seeds 0 and 2). The hard start with ``max_iter=100`` failed this for
    gamma (median -2.5e-3, seed 0 unconverged), categorical and exponential (unconverged)."""
    gaps = []
    for seed in range(3):
        gap, model = _default_gap(family, 2000, seed, starts=3)
        assert model.converged_, f"{family} seed {seed}: not converged in {model.n_iter_} iterations"
        gaps.append(gap)
    assert np.median(gaps) >= -TOLERANCE, f"{family}: gaps {gaps} nats per row below the best random start"


def test_softened_start_shares_each_row_and_leaves_the_gaussians_hard():
    hard = torch.nn.functional.one_hot(torch.tensor([0, 2, 1]), 3).to(torch.float64)
    for name in FAMILIES:
        family = family_from(name)
        resp = start_responsibilities(family, hard)
        share = spread(family)
        assert 0.0 <= share < 1.0
        torch.testing.assert_close(resp.sum(1), torch.ones(3, dtype=torch.float64))  # still a distribution
        torch.testing.assert_close(resp, hard * (1 - share) + share / 3)
        assert bool((resp.argmax(1) == hard.argmax(1)).all())  # every row still nearest its own cluster
    assert spread(family_from("gaussian")) == spread(family_from("gmm")) == 0.0
    assert {name for name in FAMILIES if spread(family_from(name)) > 0} == {
        "bernoulli",
        "categorical",
        "exponential",
        "gamma",
    }


def test_gmm_default_start_is_the_hard_kmeans_start():
    """The Gaussian mixture's start is unchanged: its first M-step takes k-means' one-hot clusters, so one
    iteration of GMM equals one of a Mixture whose start is the hard one."""
    x, _ = make_family_mixture("gaussian", 200, 3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gmm = GMM(3, covariance_type="diag", seed=0, max_iter=1, progress=False).fit(x)
        mix = Mixture(3, seed=0, max_iter=1, progress=False).fit(x)
    torch.testing.assert_close(gmm.means_, mix.means_)
    assert GMM(3).max_iter == 100  # the GMM's default, unchanged; Mixture's rose to 1000
    assert Mixture(3).max_iter == 1000
