"""Dispersed chain starts (:mod:`ppmix.engines.chain_starts`): chains can disagree where the posterior has several
modes, agree where it has one, and one chain warns that r_hat is unavailable."""

import warnings

import numpy as np
import pytest
import torch
from pyro.distributions.transforms import biject_to

from ppmix import GMM
from ppmix.engines.chain_starts import chain_starts
from ppmix.engines.mcmc import _unconstrained_starts
from ppmix.inference import ChainsDisagreeWarning, SingleChainWarning

SWEEPS = {"num_samples": 60, "warmup_steps": 30, "num_chains": 4}


def square(seed: int, n: int = 50) -> np.ndarray:
    """Four planted clusters at the corners of a square: with K = 3 one component covers two of them, and which
    two is a separate mode of the posterior (four of them, beside the label permutations)."""
    corners = np.array([[0.0, 0.0], [0.0, 6.0], [6.0, 0.0], [6.0, 6.0]])
    return np.repeat(corners, n, axis=0) + np.random.default_rng(seed).normal(size=(4 * n, 2))


def separated(seed: int, n: int = 40) -> np.ndarray:
    """Three well-separated planted clusters: K = 3 has one mode up to the labels."""
    centres = np.array([[0.0, 0.0], [0.0, 8.0], [8.0, 0.0]])
    return np.repeat(centres, n, axis=0) + np.random.default_rng(seed).normal(size=(3 * n, 2))


@pytest.mark.parametrize("seed", range(5))
def test_chains_in_different_modes_disagree(seed):
    """The issue's case: every chain at the one EM start gave r_hat <= 1.005 on all five seeds."""
    gmm = GMM(3, covariance_type="diag", seed=seed, progress=False)
    with pytest.warns(ChainsDisagreeWarning, match=r"locs \(\d\.\d\d\)"):
        gmm.fit(square(seed), engine="gibbs", **SWEEPS)
    assert max(gmm.mcmc_diagnostics_["r_hat"].values()) > 1.1


@pytest.mark.parametrize("seed", range(3))
def test_chains_in_one_mode_agree_after_relabelling(seed):
    """Dispersed starts land in one mode under different labels; the relabelling aligns them, so r_hat stays
    near 1: the disagreement above is the modes', not the labels'."""
    gmm = GMM(3, covariance_type="diag", seed=seed, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainsDisagreeWarning)
        gmm.fit(separated(seed), engine="gibbs", num_samples=100, warmup_steps=30, num_chains=4)
    assert max(gmm.mcmc_diagnostics_["r_hat"].values()) < 1.05


def test_chain_starts_are_dispersed_and_chain_zero_is_the_em_start():
    gmm = GMM(3, covariance_type="diag", seed=0, progress=False)
    data = gmm.prepare_data(square(0), fitting=True)
    starts = chain_starts(gmm, data, 4, gmm._generator())
    em_start = gmm._init_values(data, gmm._generator())
    for name, value in em_start.items():
        torch.testing.assert_close(starts[0][name], value, rtol=0, atol=0)  # one chain: the start it always had
    means = [np.sort(start["locs"].numpy(), axis=0) for start in starts]
    assert all(not np.allclose(means[0], other) for other in means[1:])
    assert chain_starts(gmm, data, 4, gmm._generator())[2]["locs"].equal(starts[2]["locs"])  # reproducible


def test_nuts_initial_params_are_the_chain_starts_unconstrained():
    gmm = GMM(3, covariance_type="diag", seed=0, progress=False)
    data = gmm.prepare_data(square(0), fitting=True)
    starts = chain_starts(gmm, data, 3, gmm._generator())
    with gmm.bayesian():
        initial = _unconstrained_starts(gmm, data, starts)
    assert initial["locs"].shape == (3, 3, 2)
    for chain, start in enumerate(starts):
        torch.testing.assert_close(initial["locs"][chain], start["locs"])
        scales = biject_to(torch.distributions.constraints.positive)(initial["scales"][chain])
        torch.testing.assert_close(scales, start["scales"])


def test_one_chain_warns_that_rhat_is_unavailable():
    gmm = GMM(2, covariance_type="diag", seed=0, progress=False)
    with pytest.warns(SingleChainWarning, match=r"r_hat .* unavailable .* num_chains=4"):
        gmm.fit(separated(0)[:80], engine="gibbs", num_samples=10, warmup_steps=5, num_chains=1)
    assert np.isnan(gmm.mcmc_diagnostics_["r_hat"]["locs"])
    assert issubclass(SingleChainWarning, UserWarning) and issubclass(ChainsDisagreeWarning, UserWarning)
