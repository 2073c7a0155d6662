"""Poor local fits of fit_distributed: found against the other shards' log-likelihoods, refitted, better kept."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ppmix.datasets.moe import make_moe
from ppmix.distributed import fit_distributed
from ppmix.distributed import moe as distributed_moe
from ppmix.distributed.local_screening import OUTLIER_GAP, poor_local_fits


def test_a_fit_far_below_the_others_is_flagged_and_sampling_noise_is_not():
    rng = np.random.default_rng(0)
    noise = -1.83 + 0.015 * rng.standard_normal(16)  # sixteen random shards' local optima
    assert poor_local_fits(noise) == []
    poor = noise.copy()
    poor[[0, 6, 8]] = -2.74  # seed 3 of S4.1 at M = 16
    assert poor_local_fits(poor) == [0, 6, 8]
    close = noise.copy()
    close[3] = np.median(noise) - 0.8 * OUTLIER_GAP  # below the robust band of identical values, but under the gap
    assert 3 not in poor_local_fits(np.r_[close[:3], [np.median(noise)] * 10, close[3:4]])


def test_fewer_than_three_fits_give_no_reference():
    assert poor_local_fits([-1.0]) == [] and poor_local_fits([-1.0, -5.0]) == []


@pytest.fixture
def one_poor_shard(monkeypatch):
    """Shard 2's first local fit is one EM iteration under a huge ridge (flat experts): poor. Its refit is normal."""
    real = distributed_moe._fit_shard_here

    def fit(task):
        if task.name == "shard-2" and task.model_options["n_init"] == 2:
            options = {**task.model_options, "n_init": 1, "max_iter": 1, "split_merge": 0, "ridge": 1e6}
            task = dataclasses.replace(task, model_options=options)
        return real(task)

    monkeypatch.setattr(distributed_moe, "_fit_shard_here", fit)


@pytest.mark.filterwarnings("ignore::ppmix.inference.ConvergenceWarning")
def test_a_poor_local_fit_is_refitted_and_the_better_fit_kept(one_poor_shard):
    data = make_moe(2400, n_experts=2, n_features=2, param_range=3, seed=4)
    parts = [(data.X[i::4], data.y[i::4]) for i in range(4)]
    test = make_moe(2000, n_experts=2, n_features=2, param_range=3, seed=5, param_seed=4)

    def mean_log_lik(model, x, y):
        return model.log_likelihood(x, y) / len(y)

    plain = fit_distributed(parts, 2, executor="inline", n_init=2, seed=0, refit_poor_fits=False)
    assert plain.refitted == []
    own = [mean_log_lik(m, *part) for m, part in zip(plain.local_models, parts)]
    assert own[2] < np.median(own) - OUTLIER_GAP  # the planted poor optimum
    fit = fit_distributed(parts, 2, executor="inline", n_init=2, seed=0)
    assert fit.refitted == ["shard-2"] and fit.summary()["refitted"] == ["shard-2"]
    own = [mean_log_lik(m, *part) for m, part in zip(fit.local_models, parts)]
    assert own[2] > np.median(own) - OUTLIER_GAP
    assert fit.local_seconds[2] > plain.local_seconds[2]  # the refit's time is counted
    assert mean_log_lik(fit.model, test.X, test.y) > mean_log_lik(plain.model, test.X, test.y)
