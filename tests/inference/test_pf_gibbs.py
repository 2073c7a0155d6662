"""Gibbs sampler of the full-covariance pf-GMM: NIW marginals, switch marginals by brute force, the estimator."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import betaln, gammaln
from scipy.stats import multivariate_t

from ppmix.engines.gibbs import (
    NIWPrior,
    collapsed_log_likelihood,
    log_marginal_niw,
    run_pf_gibbs,
    sufficient_stats,
)
from ppmix.models.pf.gibbs import PFGMMGibbs


@pytest.mark.parametrize("d", [1, 2])
def test_niw_marginal_equals_the_chain_of_student_t_predictives(d):
    rng = np.random.default_rng(d)
    x = rng.normal(size=(5, d)) * 2 + 1
    prior = NIWPrior(mean=np.zeros(d), kappa=0.5, psi=1.5, extra_dof=2.0)
    coords = np.ones(d, bool)
    total, m, kappa, nu, psi = 0.0, np.zeros(d), 0.5, d + 2.0, 1.5 * np.eye(d)
    for row in x:
        dof = nu - d + 1
        total += multivariate_t(loc=m, shape=psi * (kappa + 1) / (kappa * dof), df=dof).logpdf(row)
        diff = row - m
        psi = psi + (kappa / (kappa + 1)) * np.outer(diff, diff)
        m = (kappa * m + row) / (kappa + 1)
        kappa, nu = kappa + 1, nu + 1
    assert log_marginal_niw(sufficient_stats(x), coords, prior) == pytest.approx(total, rel=1e-10)


def _exact_switch_marginals(x, y, k, p, alpha, prior):
    """P(S_d = 1 | X, Y) by enumerating every assignment and switch vector (theta, eta, Gaussians integrated)."""
    n, d = x.shape
    all_stats = sufficient_stats(x)
    log_post = {}
    for z in itertools.product(range(k), repeat=n):
        z = np.array(z)
        counts = np.bincount(z, minlength=k)
        log_pz = gammaln(k * alpha) - gammaln(n + k * alpha) + (gammaln(alpha + counts) - gammaln(alpha)).sum()
        ones = np.bincount(z, weights=y, minlength=k)
        log_py = (betaln(1 + ones, 1 + counts - ones) - betaln(1, 1)).sum()
        stats = [sufficient_stats(x[z == j]) for j in range(k)]
        for s in itertools.product([False, True], repeat=d):
            s = np.array(s)
            log_ps = s.sum() * math.log(p) + (~s).sum() * math.log(1 - p)
            value = log_ps + log_pz + log_py + collapsed_log_likelihood(s, prior, stats, all_stats)
            log_post.setdefault(tuple(s), []).append(value)
    configs = np.array(list(log_post))
    weights = np.array([np.logaddexp.reduce(v) for v in log_post.values()])
    weights = np.exp(weights - weights.max())
    return (configs * weights[:, None]).sum(0) / weights.sum()


def test_switch_marginals_match_brute_force_enumeration():
    rng = np.random.default_rng(0)
    z = np.array([0, 0, 0, 1, 1, 1])
    x = np.c_[2.5 * z + rng.normal(size=6), rng.normal(size=6), 0.8 * z + rng.normal(size=6)]
    y = z.astype(float)
    prior = NIWPrior(mean=x.mean(0), kappa=0.1, psi=1.0)
    exact = _exact_switch_marginals(x, y, 2, 0.5, 1.0, prior)
    assert 0.05 < exact.min() and exact.max() < 0.999  # a non-trivial posterior
    draws = run_pf_gibbs(
        x, y, np.ones(6, bool), 2, switch_prior=0.5, num_samples=3000, warmup_steps=100, prior=prior, seed=1
    )
    np.testing.assert_allclose(draws.switches.mean(0), exact, atol=0.05)


def test_estimator_predicts_and_exports_to_arviz():
    rng = np.random.default_rng(1)
    z = rng.integers(0, 2, 120)
    x = np.c_[4.0 * z + rng.normal(size=120), 3.0 * rng.integers(0, 2, 120) + rng.normal(size=120)]
    model = PFGMMGibbs(2, switch_prior=0.4, num_samples=60, warmup_steps=30, seed=0).fit(x, z)
    assert model.relevance_[0] > 0.9 and model.relevance_[1] < 0.5
    proba = model.predict_proba(x)
    assert ((proba[:, 1] > 0.5) == z).mean() > 0.95
    assert model.score_samples(x).shape == (120,) and np.isfinite(model.score_samples(x)).all()
    idata = model.to_arviz()
    assert idata.posterior["switches"].shape == (1, 60, 2)
    assert idata.posterior["assignments"].shape == (1, 60, 120)


def test_estimator_bad_input():
    x = np.random.default_rng(0).normal(size=(30, 3))
    with pytest.raises(ValueError, match="switch_prior"):
        PFGMMGibbs(2, switch_prior=0.0).fit(x, np.arange(30) % 2)
    with pytest.raises(ValueError, match="binary labels"):
        PFGMMGibbs(2).fit(x, np.full(30, 3.0))
    with pytest.raises(ValueError, match="no observed label"):
        PFGMMGibbs(2).fit(x, np.full(30, np.nan))
    with pytest.raises(ValueError, match="n_components"):
        PFGMMGibbs(40).fit(x, np.arange(30) % 2)
    with pytest.raises(ValueError, match="not fitted"):
        PFGMMGibbs(2).predict_proba(x)


def test_estimator_priors_set_the_niw_and_weights_and_bad_keys_name_priors():
    rng = np.random.default_rng(1)
    z = rng.integers(0, 2, 80)
    x = np.c_[4.0 * z + rng.normal(size=80), rng.normal(size=80)]
    default = PFGMMGibbs(2, num_samples=5, warmup_steps=5, seed=0).fit(x, z).prior_
    np.testing.assert_array_equal(default.mean, x.mean(0))
    assert (default.kappa, default.psi, default.extra_dof) == (0.01, float(x.var(0).mean()), 2.0)
    priors = {"locs_loc": [7.0, -7.0], "locs_kappa": 1e8, "covariance_scale": 2.0, "weights": 3.0}
    model = PFGMMGibbs(2, switch_prior=0.5, num_samples=20, warmup_steps=10, priors=priors, seed=0).fit(x, z)
    assert (model.prior_.kappa, model.prior_.psi, model._alpha()) == (1e8, 2.0, 3.0)
    draws = model.draws_  # every Gaussian block's mean is pinned at locs_loc: the components' and the background's
    means = np.where(draws.switches[:, None, :], draws.locs, draws.background_loc[:, None, :])
    np.testing.assert_allclose(means, np.broadcast_to([7.0, -7.0], means.shape), atol=1e-2)
    prior = model.to_arviz().prior  # draws from the same priors: pinned means, Gaussians on their switches' blocks
    switches = prior["switches"].values[0].astype(bool)
    means = np.where(switches[:, None, :], prior["locs"].values[0], prior["background_loc"].values[0][:, None, :])
    np.testing.assert_allclose(means, np.broadcast_to([7.0, -7.0], means.shape), atol=1e-2)
    on = switches[:, None, :, None] & switches[:, None, None, :]
    assert np.array_equal(np.isfinite(prior["covariances"].values[0]), np.broadcast_to(on, (20, 2, 2, 2)))
    assert prior["weights"].shape == (1, 20, 2) and 0 < switches.mean() < 1
    unset = PFGMMGibbs(2, alpha=2.0, priors={"weights": None, "locs_kappa": None})  # None: the key's default
    unset._check_priors()
    assert unset._alpha() == 2.0 and unset._niw_prior(x).kappa == default.kappa
    with pytest.raises(ValueError, match=r"priors has an unknown key 'rate_rate'"):
        PFGMMGibbs(2, priors={"rate_rate": 1.0}).fit(x, z)
    with pytest.raises(ValueError, match=r"priors\['locs_kappa'\] must be a number"):
        PFGMMGibbs(2, priors={"locs_kappa": [1.0, 2.0]}).fit(x, z)
    with pytest.raises(ValueError, match=r"priors\['weights'\] and alpha both set"):
        PFGMMGibbs(2, alpha=2.0, priors={"weights": 3.0}).fit(x, z)
