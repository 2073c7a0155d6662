"""KL gate refit of the OT reduction: monotone EM, its objective against brute force, a planted gate."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate as integrate
import scipy.stats as st
import torch

from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxGate
from ppmix.optimizers.ot.gate_refit import refit_gate
from ppmix.optimizers.ot.reduction import LocalMixture, ot_reduce
from tests.inference.test_ot_reduction import perturbed, small_truth


def reduced_families(expert: str, seed: int = 3):
    """``f^W`` of five perturbed models on the truth's sample, and the reduced experts of an S5 reduction."""
    truth, x = small_truth(expert, seed=seed)
    models = [perturbed(truth, s, size=0.5) for s in range(5)]
    s5 = ot_reduce(models, x, gate_refit="s5")
    local = LocalMixture.from_models(models, torch.as_tensor(x), mass_tol=1e-12)
    return local, s5.gate_, s5.experts_


@pytest.mark.parametrize("expert", ["gaussian", "logistic"])
def test_refit_objective_never_decreases(expert):
    local, gate, experts = reduced_families(expert)
    _, history = refit_gate(local, gate, experts, max_iter=25, tol=0.0)
    history = np.array(history)
    assert len(history) == 26
    assert (np.diff(history) >= -1e-12 * np.abs(history[:-1])).all(), np.diff(history).min()
    assert history[-1] > history[0]


def test_logistic_objective_is_the_exact_expected_log_likelihood():
    """``sum_s sum_y p^W(y|x_s) log g(y|x_s) / S`` minus the ridge term (on the slopes about their mean over the
    gates), computed directly."""
    local, gate, experts = reduced_families("logistic")
    _, history = refit_gate(local, gate, experts, max_iter=0)
    x = local.x
    p_w = (local.gate_probs * torch.sigmoid(local.experts.linear_predictor(x))).sum(1).numpy()
    p_g = (gate.log_prob(x).exp() * experts.predict_proba(x)).sum(1).numpy()
    expected = np.mean(p_w * np.log(p_g) + (1 - p_w) * np.log1p(-p_g))
    expected -= 0.5 * gate.ridge * float((gate.coef - gate.coef.mean(0)).square().sum()) / x.shape[0]
    np.testing.assert_allclose(history[0], expected, rtol=1e-10)


def test_gaussian_objective_matches_numerical_integration():
    """Gauss-Hermite pseudo-responses against adaptive quadrature of ``E_{f^W} log g`` on a few points."""
    local, gate, experts = reduced_families("gaussian")
    keep = torch.arange(6)
    small = LocalMixture(local.x[keep], local.gate_probs[keep], local.experts, local.n_experts)
    _, history = refit_gate(small, gate, experts, max_iter=0, n_nodes=60)
    x = small.x
    w_probs, w_means, w_sd = small.gate_probs.numpy(), small.experts.mean(x).numpy(), small.experts.scale.numpy()
    g_probs, g_means, g_sd = gate.log_prob(x).exp().numpy(), experts.mean(x).numpy(), experts.scale.numpy()
    total = 0.0
    for s in range(x.shape[0]):

        def integrand(y: float, s: int = s) -> float:
            f_w = (w_probs[s] * st.norm.pdf(y, w_means[s], w_sd)).sum()
            return f_w * np.log((g_probs[s] * st.norm.pdf(y, g_means[s], g_sd)).sum())

        centre, spread = w_means[s] @ w_probs[s], 12 * w_sd.max() + np.ptp(w_means[s])
        total += integrate.quad(integrand, centre - spread, centre + spread, limit=400, epsabs=1e-12)[0]
    expected = total / x.shape[0] - 0.5 * gate.ridge * float(gate.coef.square().sum()) / x.shape[0]
    np.testing.assert_allclose(history[0], expected, rtol=1e-6)


def planted(experts):
    """``f^W``: one MoE (a planted gate) whose experts are ``experts``, on a grid of 1-D covariates."""
    x = torch.linspace(-3, 3, 300, dtype=torch.float64)[:, None]
    truth = SoftmaxGate(torch.tensor([[2.5], [-1.5], [0.0]], dtype=torch.float64), torch.tensor([0.5, 1.0, 0.0]))
    start = SoftmaxGate(torch.zeros(3, 1, dtype=torch.float64), ridge=0.0)
    return x, truth, LocalMixture(x, truth.log_prob(x).exp(), experts, 3), start


def test_refit_recovers_the_planted_gate_of_gaussian_experts():
    """``f^W`` is one MoE whose experts are the reduced ones: its gate maximises the objective."""
    experts = GaussianExpert(torch.tensor([[2.0], [-2.0], [0.0]], dtype=torch.float64))
    x, truth, local, start = planted(experts)
    gate, history = refit_gate(local, start, experts, max_iter=500, tol=1e-13, n_nodes=24)
    assert history[-1] > history[0]
    np.testing.assert_allclose(gate.log_prob(x).exp().numpy(), truth.log_prob(x).exp().numpy(), atol=2e-3)


def test_refit_of_logistic_experts_reaches_the_conditional_of_f_w():
    """Binary responses identify only ``P(y = 1 | x)``, not the gate: the refit reaches ``f^W``'s conditional,
    where the objective is minus its conditional entropy (the KL divergence is zero)."""
    experts = LogisticExpert(torch.tensor([[2.0], [-2.0], [0.0]], dtype=torch.float64))
    x, truth, local, start = planted(experts)
    gate, history = refit_gate(local, start, experts, max_iter=2000, tol=1e-14)
    p_true = (truth.log_prob(x).exp() * experts.predict_proba(x)).sum(1).numpy()
    p_fit = (gate.log_prob(x).exp() * experts.predict_proba(x)).sum(1).numpy()
    np.testing.assert_allclose(p_fit, p_true, atol=2e-3)
    minus_entropy = np.mean(p_true * np.log(p_true) + (1 - p_true) * np.log1p(-p_true))
    assert history[0] < minus_entropy - 1e-2
    np.testing.assert_allclose(history[-1], minus_entropy, atol=1e-5)


def test_refit_does_not_modify_the_starting_gate():
    local, gate, experts = reduced_families("logistic")
    before = gate.coef.clone()
    refitted, _ = refit_gate(local, gate, experts, max_iter=5)
    torch.testing.assert_close(gate.coef, before)
    assert not torch.allclose(refitted.coef, before)


@pytest.mark.parametrize("expert", ["gaussian", "logistic"])
def test_blockwise_e_step_equals_one_block(expert, monkeypatch):
    from ppmix.optimizers.ot import gate_refit

    local, gate, experts = reduced_families(expert)
    whole_gate, whole = refit_gate(local, gate, experts, max_iter=4, tol=0.0)
    monkeypatch.setattr(gate_refit, "_BLOCK", 7)
    blocked_gate, blocked = refit_gate(local, gate, experts, max_iter=4, tol=0.0)
    np.testing.assert_allclose(blocked, whole, rtol=1e-12)
    torch.testing.assert_close(blocked_gate.coef, whole_gate.coef, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("expert", ["gaussian", "logistic"])
def test_uncached_expert_densities_give_the_same_refit(expert, monkeypatch):
    """Over the memory budget the experts' log-densities are recomputed per iteration, not kept."""
    from ppmix.optimizers.ot import gate_refit

    local, gate, experts = reduced_families(expert)
    cached_gate, cached = refit_gate(local, gate, experts, max_iter=4, tol=0.0)
    monkeypatch.setattr(gate_refit, "_CACHE_ELEMENTS", 0)
    monkeypatch.setattr(gate_refit, "_BLOCK", 11)
    calls = []
    log_prob = type(experts).log_prob
    monkeypatch.setattr(type(experts), "log_prob", lambda self, data: calls.append(1) or log_prob(self, data))
    fresh_gate, fresh = refit_gate(local, gate, experts, max_iter=4, tol=0.0)
    n_blocks = -(-int(gate_refit._pseudo_responses(local, gate_refit.QUADRATURE_NODES)[0].shape[0]) // 11)
    assert len(calls) == 5 * n_blocks  # the objective before the first and after each of 4 iterations
    np.testing.assert_allclose(fresh, cached, rtol=1e-12)
    torch.testing.assert_close(fresh_gate.coef, cached_gate.coef, rtol=1e-9, atol=1e-12)
