"""NUTS's per-draw statistics (issue 40, item 3): what the recording kernel notes agrees with Pyro's own
records (divergences, mean acceptance probability) and with the potential it samples (lp, energy)."""

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model

from ppmix.engines.mcmc import SAMPLE_STATS, _RecordingNUTS, _sample_stats


def _funnel():
    """Neal's funnel: NUTS diverges in its neck, so the divergences have something to count."""
    y = pyro.sample("y", dist.Normal(0.0, 3.0))
    pyro.sample("x", dist.Normal(torch.zeros(2), torch.exp(y / 2)).to_event(1))


def test_recorded_divergences_and_acceptance_match_pyros_own_records():
    last_mean_accept = []

    def hook(kernel, params, stage, i):
        last_mean_accept.append(kernel._mean_accept_prob)  # Pyro's running mean over the kept transitions

    kernel = _RecordingNUTS(_funnel, max_tree_depth=5, target_accept_prob=0.6)
    mcmc = MCMC(kernel, num_samples=150, warmup_steps=30, hook_fn=hook, disable_progbar=True)
    mcmc.run()
    stats = _sample_stats(mcmc, 1)
    assert set(stats) == set(SAMPLE_STATS) and all(v.shape == (1, 150) for v in stats.values())
    diverging = stats["diverging"][0]
    assert diverging.any()  # the funnel's neck
    np.testing.assert_array_equal(np.flatnonzero(diverging), mcmc.diagnostics()["divergences"]["chain 0"])
    np.testing.assert_allclose(stats["acceptance_rate"][0].mean(), last_mean_accept[-1], rtol=1e-6)  # float32 sums
    # a NUTS tree of depth j has at most 2^j - 1 leapfrog steps; after warm-up the step size is fixed
    n_steps, depth = stats["n_steps"][0], stats["tree_depth"][0]
    assert (n_steps >= 1).all() and (n_steps <= 2**depth - 1).all() and (depth <= 5).all()
    assert np.unique(stats["step_size"]).size == 1


def test_lp_is_the_log_density_of_each_draw_and_energy_adds_a_chi2_kinetic_term():
    """``lp`` = minus the potential energy at the kept draw (recomputed here from the draws); each transition's
    energy is the previous draw's potential plus a kinetic energy drawn as chi2(d) / 2."""
    x = torch.tensor([-1.2, 0.3, 0.8, 2.1, 1.4, -0.5, 0.9, 1.7], dtype=torch.float64)
    zero = x.new_zeros(())

    def model():
        loc = pyro.sample("loc", dist.Normal(zero, 5.0))
        scale = pyro.sample("scale", dist.LogNormal(zero, 1.0))
        with pyro.plate("data", len(x)):
            pyro.sample("x", dist.Normal(loc, scale), obs=x)

    mcmc = MCMC(_RecordingNUTS(model), num_samples=200, warmup_steps=50, disable_progbar=True)
    mcmc.run()
    stats = _sample_stats(mcmc, 1)
    draws = mcmc.get_samples()
    _, potential, transforms, _ = initialize_model(model)
    with poutine.block():
        recomputed = [-float(potential({k: transforms[k](v[i]) for k, v in draws.items()})) for i in range(200)]
    np.testing.assert_allclose(stats["lp"][0], recomputed, rtol=1e-9)
    kinetic = stats["energy"][0, 1:] + stats["lp"][0, :-1]
    assert (kinetic >= 0).all()
    assert abs(kinetic.mean() - 1.0) < 0.25  # E[chi2(2) / 2] = 1; its sd over 199 draws is about 0.07


def test_recording_leaves_the_chain_as_pyros_nuts_draws_it():
    def run(kernel_class):
        pyro.set_rng_seed(3)
        mcmc = MCMC(kernel_class(_funnel, max_tree_depth=4), num_samples=20, warmup_steps=20, disable_progbar=True)
        mcmc.run()
        return mcmc.get_samples()

    plain, recorded = run(NUTS), run(_RecordingNUTS)
    for name in plain:
        assert torch.equal(plain[name], recorded[name])
