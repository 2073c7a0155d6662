"""OT reduction of mixtures of experts: MM descent, fixed points, a numerical oracle for (19), LP oracle for (9)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog, minimize

from ppmix.components import GaussianExpert
from ppmix.datasets.moe import make_moe
from ppmix.models.moe import MixtureOfExperts
from ppmix.optimizers.ot.baselines import align_experts, middle_estimator, weighted_average_estimator
from ppmix.optimizers.ot.divergence import transport_divergence
from ppmix.optimizers.ot.reduction import LocalMixture, ot_reduce, reduction_plan, update_experts

EXPERTS = ["gaussian", "logistic"]


def perturbed(truth: MixtureOfExperts, seed: int, size: float = 0.3, perm=None) -> MixtureOfExperts:
    """``truth`` with noisy parameters (and its experts relabelled by ``perm``)."""
    rng = np.random.default_rng(seed)
    k = truth.n_experts
    perm = np.arange(k) if perm is None else np.asarray(perm)

    def noisy(t: torch.Tensor) -> np.ndarray:
        a = t.numpy()[perm]
        return a + size * rng.normal(size=a.shape)

    scale = None if truth.expert == "logistic" else truth.scale_.numpy()[perm] * np.exp(0.2 * size * rng.normal(size=k))
    return MixtureOfExperts.from_parameters(
        gate_coef=noisy(truth.gate_coef_),
        gate_intercept=noisy(truth.gate_intercept_),
        coef=noisy(truth.coef_),
        intercept=noisy(truth.intercept_),
        scale=scale,
    )


def small_truth(expert: str, seed: int = 0, k: int = 3, d: int = 3) -> tuple[MixtureOfExperts, np.ndarray]:
    data = make_moe(400, expert=expert, n_experts=k, n_features=d, param_range=2, seed=seed)
    return data.true_model(), data.X


@pytest.mark.parametrize(
    "expert, update", [("gaussian", "s14"), ("logistic", "newton")], ids=["gaussian-S8", "logistic-exact"]
)
def test_mm_objective_never_increases(expert, update):
    truth, x = small_truth(expert)
    models = [perturbed(truth, seed, size=0.8) for seed in range(6)]
    reduced = ot_reduce(models, x, n_init=3, tol=0.0, max_iter=30, logistic_update=update)
    history = np.array(reduced.history_)
    assert len(history) > 2
    assert (np.diff(history) <= 1e-12 * np.abs(history[:-1])).all(), np.diff(history).max()
    assert history[-1] < history[0]


@pytest.mark.parametrize(
    "expert, update, param_range, gate_refit, transport_tol",
    [
        ("gaussian", "s14", 2, "s5", 1e-6),
        # the KL refit integrates Gaussian responses by 8-node Gauss-Hermite: the fixed point
        # moves by the quadrature error (a gate-probability change of ~1e-3 here)
        ("gaussian", "s14", 2, "kl", 1e-3),
        ("logistic", "newton", 2, "s5", 1e-6),
        ("logistic", "newton", 2, "kl", 1e-6),  # logistic outcomes are enumerated: exact
        ("logistic", "s14", 1, "s5", 1e-6),
    ],
    ids=["gaussian-S8", "gaussian-S8-kl-gate", "logistic-exact", "logistic-exact-kl-gate", "logistic-S14-unclamped"],
)
def test_identical_local_models_reduce_to_themselves(expert, update, param_range, gate_refit, transport_tol):
    data = make_moe(400, expert=expert, n_experts=3, n_features=2, param_range=param_range, seed=1)
    truth, x = data.true_model(), data.X
    reduced = ot_reduce([truth] * 4, x, weights=[1, 2, 3, 4], logistic_update=update, gate_refit=gate_refit)
    assert reduced.history_[-1] == pytest.approx(0.0, abs=1e-9)
    perm = align_experts(reduced, truth, x)
    np.testing.assert_allclose(reduced.coef_.numpy()[perm], truth.coef_.numpy(), atol=1e-4)
    np.testing.assert_allclose(reduced.intercept_.numpy()[perm], truth.intercept_.numpy(), atol=1e-4)
    if expert == "gaussian":
        np.testing.assert_allclose(reduced.scale_.numpy()[perm], truth.scale_.numpy(), rtol=1e-10)
    np.testing.assert_allclose(reduced.gate_probabilities(x)[:, perm], truth.gate_probabilities(x), atol=2e-3)
    assert transport_divergence(truth, reduced, x) < transport_tol


def test_gaussian_update_equals_numerical_minimisation_of_eq19():
    rng = np.random.default_rng(0)
    s, p, k = 25, 2, 2
    x = torch.as_tensor(rng.normal(size=(s, p)))
    local = GaussianExpert(
        torch.as_tensor(rng.normal(size=(5, p))),
        torch.as_tensor(rng.normal(size=5)),
        torch.as_tensor(rng.uniform(0.5, 2.0, size=5)),
    )
    probs = torch.as_tensor(rng.dirichlet(np.ones(5), size=s))
    mixture = LocalMixture(x, probs, local, k)
    current = GaussianExpert(torch.as_tensor(rng.normal(size=(k, p))), torch.zeros(k, dtype=torch.float64))
    plan, _ = reduction_plan(mixture, current)
    updated = update_experts(mixture, plan, current)
    a = np.c_[x.numpy(), np.ones(s)]
    local_means, local_var = local.mean(x).numpy(), local.scale.numpy() ** 2
    w = plan.numpy()
    for j in range(k):

        def objective(theta, j=j):  # eq. (19) with KL cost: mean over s of sum_l w KL(phi_l || phi)
            beta, log_var = theta[:-1], theta[-1]
            var = np.exp(log_var)
            mean = a @ beta
            kl = 0.5 * (log_var - np.log(local_var) + (local_var + (local_means - mean[:, None]) ** 2) / var - 1)
            return (w[:, :, j] * kl).sum() / s

        best = minimize(objective, np.zeros(p + 2), method="BFGS", options={"gtol": 1e-10})
        np.testing.assert_allclose(updated._stacked()[j].numpy(), best.x[:-1], atol=1e-5)
        np.testing.assert_allclose(updated.scale[j].item() ** 2, np.exp(best.x[-1]), rtol=1e-5)


def brute_force_transport(a: MixtureOfExperts, b: MixtureOfExperts, x: np.ndarray) -> float:
    pa, pb = a.gate_probabilities(x), b.gate_probabilities(x)
    cost = a.experts_.kl(b.experts_, torch.as_tensor(x)).numpy()
    ka, kb = pa.shape[1], pb.shape[1]
    rows = np.kron(np.eye(ka), np.ones(kb))  # sum_l P[k, l] = pa[k]
    cols = np.kron(np.ones(ka), np.eye(kb))  # sum_k P[k, l] = pb[l]
    values = []
    for s in range(x.shape[0]):
        res = linprog(
            cost[s].ravel(),
            A_eq=np.vstack([rows, cols[:-1]]),
            b_eq=np.r_[pa[s], pb[s, :-1] / pb[s].sum() * pa[s].sum()],
            bounds=(0, None),
            method="highs",
        )
        values.append(res.fun)
    return float(np.mean(values))


@pytest.mark.parametrize("expert", EXPERTS)
def test_transport_divergence_equals_brute_force_lp_and_vanishes_on_itself(expert):
    truth, x = small_truth(expert, seed=2)
    other = perturbed(truth, 7, size=0.5, perm=[2, 0, 1])
    x = x[:40]
    assert transport_divergence(truth, other, x) == pytest.approx(brute_force_transport(truth, other, x), rel=1e-7)
    assert transport_divergence(truth, truth, x) == pytest.approx(0.0, abs=1e-12)
    # the reduced model of two experts against three: different K on each side
    two, _ = small_truth(expert, seed=3, k=2)
    assert transport_divergence(truth, two, x) == pytest.approx(brute_force_transport(truth, two, x), rel=1e-7)


def test_middle_estimator_minimises_the_weighted_transport():
    truth, x = small_truth("gaussian", seed=4)
    models = [perturbed(truth, seed, size=0.4) for seed in range(4)]
    weights = [0.1, 0.2, 0.3, 0.4]
    x = x[:30]
    chosen, index = middle_estimator(models, x, weights=weights)
    totals = [sum(w * transport_divergence(m, g, x) for w, m in zip(weights, models)) for g in models]
    assert index == int(np.argmin(totals)) and chosen is models[index]


def test_weighted_average_aligns_labels_before_averaging():
    truth, x = small_truth("gaussian", seed=5)
    relabelled = [perturbed(truth, 0, size=0.0, perm=perm) for perm in ([0, 1, 2], [2, 0, 1], [1, 2, 0])]
    average = weighted_average_estimator(relabelled, x, weights=[0.5, 0.3, 0.2])
    np.testing.assert_allclose(average.coef_.numpy(), truth.coef_.numpy(), atol=1e-10)
    np.testing.assert_allclose(average.gate_probabilities(x), truth.gate_probabilities(x), atol=1e-10)
    np.testing.assert_allclose(average.scale_.numpy(), truth.scale_.numpy(), rtol=1e-10)


def test_reduction_undoes_label_switching_that_defeats_naive_averaging():
    """Local models with rotated labels: the reduction recovers the truth; averaging raw parameters does not."""
    truth, x = small_truth("gaussian", seed=6)
    models = [perturbed(truth, s, size=0.05, perm=np.roll(np.arange(3), s)) for s in range(6)]
    reduced = ot_reduce(models, x)
    naive = MixtureOfExperts.from_parameters(
        **{
            name: np.mean([getattr(m, f"{name}_").numpy() for m in models], axis=0)
            for name in ("gate_coef", "gate_intercept", "coef", "intercept", "scale")
        }
    )
    perm = align_experts(reduced, truth, x)
    np.testing.assert_allclose(reduced.coef_.numpy()[perm], truth.coef_.numpy(), atol=0.05)
    assert transport_divergence(truth, naive, x) > 10 * transport_divergence(truth, reduced, x)


def test_matched_gate_targets_are_the_aligned_local_gate_mass():
    """``gate_targets="matched"``: every local expert's whole gate mass goes to the reduced expert it matches."""
    truth, x = small_truth("gaussian", seed=8)
    perms = [np.roll(np.arange(3), s) for s in range(4)]
    models = [perturbed(truth, s, size=0.1, perm=perm) for s, perm in enumerate(perms)]
    weights = np.array([1.0, 2.0, 3.0, 4.0]) / 10
    reduced = ot_reduce(models, x, weights=weights)
    expected = sum(w * m.gate_probabilities(x)[:, align_experts(m, reduced, x)] for w, m in zip(weights, models))
    np.testing.assert_allclose(reduced.gate_targets_.numpy(), expected, atol=1e-12)
    # S4 literally: the per-point plan's marginals; rows still sum to one, and the MM is the same
    literal = ot_reduce(models, x, weights=weights, gate_targets="plan")
    np.testing.assert_allclose(literal.gate_targets_.sum(1).numpy(), 1.0, atol=1e-12)
    np.testing.assert_allclose(literal.coef_.numpy(), reduced.coef_.numpy(), atol=1e-12)
    assert literal.history_ == reduced.history_


@pytest.mark.parametrize("expert, kind", [("gaussian", "matched"), ("logistic", "plan")])
def test_default_gate_targets_depend_on_the_expert_family(expert, kind):
    """``gate_targets="auto"``: matched local experts for Gaussian experts, the per-point plan for logistic ones."""
    truth, x = small_truth(expert, seed=8)
    models = [perturbed(truth, s, size=0.3) for s in range(4)]
    auto = ot_reduce(models, x)
    explicit = ot_reduce(models, x, gate_targets=kind)
    other = ot_reduce(models, x, gate_targets="plan" if kind == "matched" else "matched")
    np.testing.assert_array_equal(auto.gate_targets_.numpy(), explicit.gate_targets_.numpy())
    assert not np.allclose(auto.gate_targets_.numpy(), other.gate_targets_.numpy())


@pytest.mark.parametrize(
    "expert, update", [("gaussian", "s14"), ("logistic", "newton")], ids=["gaussian-S8", "logistic-exact"]
)
def test_dropping_massless_pairs_leaves_the_reduction_unchanged(expert, update):
    """Updates weighted by the plan barely move; (S14 is an unweighted least squares over the points that carry
    mass, so there dropping pairs does change which points enter it, as its docstring says.)"""
    data = make_moe(400, expert=expert, n_experts=3, n_features=3, param_range=5, seed=9)  # sharp gates
    truth, x = data.true_model(), data.X
    models = [perturbed(truth, seed, size=0.3) for seed in range(5)]
    exact = ot_reduce(models, x, mass_tol=0.0, logistic_update=update)
    pruned = ot_reduce(models, x, mass_tol=1e-12, logistic_update=update)
    local = LocalMixture.from_models(models, torch.as_tensor(x), mass_tol=1e-12)
    assert local.pairs.rows.numel() < local.gate_probs.numel()  # the gates are sharp: pairs were dropped
    np.testing.assert_allclose(pruned.coef_.numpy(), exact.coef_.numpy(), atol=1e-8)
    np.testing.assert_allclose(pruned.history_[-1], exact.history_[-1], rtol=1e-8)


def test_bad_input():
    truth, x = small_truth("gaussian")
    logistic, _ = small_truth("logistic")
    with pytest.raises(ValueError, match="models is empty"):
        ot_reduce([], x)
    with pytest.raises(ValueError, match="logistic experts"):
        ot_reduce([truth, logistic], x)
    with pytest.raises(ValueError, match="weights must be 2"):
        ot_reduce([truth, truth], x, weights=[1.0, -1.0])
    with pytest.raises(TypeError, match=r"models\[1\] must be a MixtureOfExperts"):
        ot_reduce([truth, "model"], x)
    with pytest.raises(ValueError, match="X_support has 2 features"):
        ot_reduce([truth], x[:, :2])
    with pytest.raises(ValueError, match="logistic_update"):
        ot_reduce([logistic], x, logistic_update="magic")
    with pytest.raises(ValueError, match="gate_targets"):
        ot_reduce([truth], x, gate_targets="soft")
    with pytest.raises(ValueError, match="gate_refit"):
        ot_reduce([truth], x, gate_refit="em")
    with pytest.raises(ValueError, match="mass_tol"):
        ot_reduce([truth], x, mass_tol=1.0)
    with pytest.raises(ValueError, match="X contains NaN"):
        transport_divergence(truth, truth, np.full((3, 3), np.nan))
