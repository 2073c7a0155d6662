"""Poisson-regression experts (``expert="poisson"``): known answers for the density, the weighted M-step, the
EM objective and a planted two-regime fit, and the refusals of data outside the family's support."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from ppmix import MixtureOfExperts
from ppmix.components import PoissonExpert
from tests.common import assert_em_objective_is_trace_enum_elbo, make_expert_data

QUIET = {"seed": 0, "progress": False, "n_init": 2, "max_iter": 50}


def _experts_and_data(n: int = 150, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    coef = torch.tensor([[0.7, -0.4], [-1.0, 0.3]], dtype=torch.float64)
    intercept = torch.tensor([1.5, 0.2], dtype=torch.float64)
    experts = PoissonExpert(coef, intercept, ridge=0.3)
    y = experts.sample(torch.arange(n) % 2, x, generator=gen)
    return experts, x, y


def test_log_prob_is_scipys_poisson_pmf():
    experts, x, y = _experts_and_data()
    rate = np.exp(x.numpy() @ experts.coef.numpy().T + experts.intercept.numpy())
    expected = stats.poisson.logpmf(y.numpy()[:, None], rate)
    np.testing.assert_allclose(experts.log_prob((x, y)).numpy(), expected, rtol=1e-12, atol=1e-12)


def test_weighted_newton_m_step_is_the_brute_force_optimum_of_the_penalised_likelihood():
    experts, x, y = _experts_and_data()
    weights = torch.rand(x.shape[0], 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    fitted = experts.clone().fit((x, y), weights)
    assert fitted.converged_
    a = np.column_stack([x.numpy(), np.ones(x.shape[0])])
    for k in range(2):
        w, counts = weights[:, k].numpy(), y.numpy()

        def negative(theta, w=w, counts=counts):  # minus the weighted log-likelihood plus ridge/2 |slopes|^2
            return -(w * stats.poisson.logpmf(counts, np.exp(a @ theta))).sum() + 0.15 * (theta[:-1] ** 2).sum()

        def gradient(theta, w=w, counts=counts):
            return a.T @ (w * (np.exp(a @ theta) - counts)) + 0.3 * np.append(theta[:-1], 0.0)

        best = optimize.minimize(negative, np.zeros(3), jac=gradient, method="BFGS", options={"gtol": 1e-11})
        theta = np.append(fitted.coef[k].numpy(), fitted.intercept[k].numpy())
        np.testing.assert_allclose(theta, best.x, rtol=0, atol=1e-8)
        assert negative(theta) <= best.fun + 1e-10


def test_em_objective_is_trace_enum_elbo_plus_the_ridge_penalty():
    x, y = make_expert_data(80, expert="poisson")
    moe = MixtureOfExperts(2, expert="poisson", ridge=0.5, split_merge=0, **QUIET).fit(x, y)
    assert float(moe.ridge_penalty()) > 0
    assert_em_objective_is_trace_enum_elbo(moe, x, y)


def test_two_planted_count_regimes_are_recovered():
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, size=(600, 1))
    left = x[:, 0] < 0
    y = rng.poisson(np.exp(np.where(left, 1.0 + 0.8 * x[:, 0], 2.5 - 0.7 * x[:, 0]))).astype(float)
    moe = MixtureOfExperts(2, expert="poisson", seed=0, progress=False).fit(x, y)
    order = np.argsort(moe.coef_[:, 0].numpy())  # the right regime has the negative slope
    np.testing.assert_allclose(moe.coef_[order, 0].numpy(), [-0.7, 0.8], atol=0.1)
    np.testing.assert_allclose(moe.intercept_[order].numpy(), [2.5, 1.0], atol=0.15)
    assert (moe.predict_components(x) == np.where(left, order[1], order[0])).mean() > 0.97
    rates = np.exp(np.where(left, 1.0 + 0.8 * x[:, 0], 2.5 - 0.7 * x[:, 0]))
    np.testing.assert_allclose(moe.predict(x), rates, rtol=0.15)
    assert moe.target_kind == "count" and 0.5 < moe.score(x, y) < 1.0


@pytest.mark.parametrize("bad", [-1.0, 2.5], ids=["negative", "not-an-integer"])
def test_targets_that_are_not_counts_are_refused_naming_y(bad):
    x, y = make_expert_data(60, expert="poisson")
    y[3] = bad
    with pytest.raises(ValueError, match=r"^y must hold counts"):
        MixtureOfExperts(2, expert="poisson", progress=False).fit(x, y)
