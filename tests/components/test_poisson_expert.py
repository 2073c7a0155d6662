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
    moe = MixtureOfExperts.from_parameters(
        gate_coef=[[-3.0, 0.5]],
        gate_intercept=[0.2],
        coef=[[0.5, 0.1], [-0.8, 0.2]],
        intercept=[1.0, 2.0],
        expert="poisson",
        ridge=0.5,
    )
    assert float(moe._ridge_penalty()) > 0
    assert_em_objective_is_trace_enum_elbo(moe, x, y)


def _two_regimes(n: int, seed: int = 1):
    """Counts of rate ``exp(1 + 0.8 x)`` left of 0 and ``exp(2.5 - 0.7 x)`` right of it, ``x`` uniform on (-2, 2)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 1))
    return x, rng.poisson(np.exp(np.where(x[:, 0] < 0, 1.0 + 0.8 * x[:, 0], 2.5 - 0.7 * x[:, 0]))).astype(float)


def test_two_planted_count_regimes_are_recovered():
    x, y = _two_regimes(600)
    left = x[:, 0] < 0
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


# ------------------------------------------------------------------ the OT reduction and distributed training
def test_kl_between_poisson_experts_is_the_sum_over_counts():
    experts, x, _ = _experts_and_data(20)
    other = PoissonExpert(experts.coef.flip(0) + 0.2, experts.intercept - 0.3)
    counts = np.arange(400)[:, None, None, None]
    p = stats.poisson.pmf(counts, experts.mean(x).numpy()[:, :, None])
    q = stats.poisson.pmf(counts, other.mean(x).numpy()[:, None, :])
    brute = (p * (np.log(p + 1e-300) - np.log(q + 1e-300))).sum(0)
    np.testing.assert_allclose(experts.kl(other, x).numpy(), brute, rtol=1e-10, atol=1e-12)


def test_ot_update_of_poisson_experts_is_the_brute_force_minimiser_of_the_plan_weighted_kl():
    from ppmix.optimizers.ot.reduction import LocalMixture, reduction_plan, update_experts

    local_experts, x, _ = _experts_and_data(60)
    local_experts = PoissonExpert(
        torch.cat([local_experts.coef, local_experts.coef + 0.3]), torch.tensor([1.5, 0.2, 1.2, 0.5]).double()
    )
    gate = torch.softmax(torch.randn(60, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64), 1)
    local = LocalMixture(x, gate, local_experts, 2)
    current = PoissonExpert(local_experts.coef[:2].clone(), local_experts.intercept[:2].clone(), ridge=0.0)
    plan, _ = reduction_plan(local, current)
    new = update_experts(local, plan, current)
    a = np.column_stack([x.numpy(), np.ones(60)])
    rate_l = local_experts.mean(x).numpy()  # (S, L)
    for k in range(2):
        w = plan[:, :, k].numpy()

        def cost(theta, w=w):  # sum_sl w KL(Poisson(rate_l) || Poisson(exp(a_s theta)))
            eta = (a @ theta)[:, None]
            return (w * (rate_l * (np.log(rate_l) - eta) - rate_l + np.exp(eta))).sum()

        best = optimize.minimize(cost, np.zeros(3), method="BFGS", options={"gtol": 1e-11})
        np.testing.assert_allclose(np.append(new.coef[k].numpy(), new.intercept[k].numpy()), best.x, atol=1e-7)


def test_ot_reduction_of_identical_poisson_models_is_that_model_and_s14_is_refused():
    from ppmix.optimizers.ot.reduction import ot_reduce

    x, _ = make_expert_data(80, expert="poisson")
    truth = MixtureOfExperts.from_parameters(
        gate_coef=[[-4.0, 0.0]],
        gate_intercept=[0.0],
        coef=[[0.5, 0.0], [-0.8, 0.0]],
        intercept=[1.0, 2.0],
        expert="poisson",
    )
    reduced = ot_reduce([truth, truth], x)
    assert reduced._expert_family().name == "poisson"
    np.testing.assert_allclose(np.sort(reduced.coef_[:, 0].numpy()), [-0.8, 0.5], atol=1e-8)
    np.testing.assert_allclose(reduced.predict(x), truth.predict(x), rtol=1e-3)
    with pytest.raises(ValueError, match="s14"):
        ot_reduce([truth, truth], x, logistic_update="s14")
    with pytest.raises(ValueError, match="expert= is required"):
        MixtureOfExperts._from_families(truth.gate_, truth.experts_)


def test_fit_distributed_fits_poisson_experts_on_shards():
    from ppmix.distributed import fit_distributed

    x, y = _two_regimes(400, seed=2)
    fit = fit_distributed([(x[:200], y[:200]), (x[200:], y[200:])], 2, expert="poisson", executor="inline", n_init=2)
    assert fit.model._expert_family().name == "poisson"
    assert all(m._expert_family().name == "poisson" for m in fit.local_models)
    order = np.argsort(fit.model.coef_[:, 0].numpy())
    np.testing.assert_allclose(fit.model.coef_[order, 0].numpy(), [-0.7, 0.8], atol=0.15)
    np.testing.assert_allclose(fit.model.intercept_[order].numpy(), [2.5, 1.0], atol=0.2)
