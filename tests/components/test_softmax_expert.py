"""SoftmaxExpert against scipy / brute-force torch oracles and against LogisticExpert at C = 2."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp
import torch

from ppmix.components import LogisticExpert, ParameterBatch, SoftmaxExpert
from tests.common import assert_close
from tests.components._util import fractional_weights, n, rng, t

parametrize_c = pytest.mark.parametrize("c", [pytest.param(2, id="C2"), pytest.param(4, id="C4")])


def make(k=2, c=3, p=2, seed=0, ridge=1e-2):
    r = rng(seed)
    return SoftmaxExpert(t(r.normal(size=(k, c, p))), t(r.normal(size=(k, c))), ridge=ridge)


def data(n_points=40, p=2, c=3, seed=1):
    r = rng(seed)
    x = r.normal(size=(n_points, p))
    return x, r.integers(0, c, size=n_points)


def test_is_a_family_and_pins_the_last_class_without_changing_probabilities():
    r = rng(0)
    coef, intercept = r.normal(size=(2, 3, 2)), r.normal(size=(2, 3))
    comp = SoftmaxExpert(t(coef), t(intercept))
    assert isinstance(comp, ParameterBatch) and comp.n_components == 2 and comp.n_classes == 3
    assert torch.all(comp.coef[:, -1] == 0) and torch.all(comp.intercept[:, -1] == 0)
    x, y = data()
    logits = np.einsum("np,kcp->nkc", x, coef) + intercept
    assert_close(comp.predict_proba(t(x)), sp.softmax(logits, -1), rtol=1e-12)
    expected = sp.log_softmax(logits, -1)[np.arange(len(y)), :, y]
    assert_close(comp.log_prob((t(x), t(y))), expected, rtol=1e-12)


def test_log_prob_of_soft_targets_is_the_cross_entropy():
    comp = make()
    x, _ = data()
    soft = rng(2).dirichlet(np.ones(3), size=len(x))
    lp = comp.log_prob((t(x), t(soft)))
    assert_close(lp, np.einsum("nkc,nc->nk", np.log(n(comp.predict_proba(t(x)))), soft), rtol=1e-12)


def brute_force_fit(x, targets, weights, ridge, c):
    """L-BFGS (torch.optim) on sum_nk w_nk sum_c T_nc -log softmax_c + ridge/2 ||coef_k||^2, last class 0."""
    k, p = weights.shape[1], x.shape[1]
    coef = torch.zeros(k, c - 1, p, dtype=torch.float64, requires_grad=True)
    intercept = torch.zeros(k, c - 1, dtype=torch.float64, requires_grad=True)
    x, targets, weights = t(x), t(targets), t(weights)
    opt = torch.optim.LBFGS([coef, intercept], max_iter=500, tolerance_grad=1e-12, tolerance_change=0.0)

    def closure():
        opt.zero_grad()
        logits = torch.nn.functional.pad(torch.einsum("np,kcp->nkc", x, coef) + intercept, (0, 1))
        nll = -(weights[:, :, None] * targets[:, None, :] * torch.log_softmax(logits, -1)).sum()
        loss = nll + 0.5 * ridge * coef.square().sum()
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    return coef.detach(), intercept.detach()


@parametrize_c
def test_weighted_fit_matches_a_brute_force_fit_of_the_same_objective(c):
    x, y = data(60, 3, c, seed=3)
    weights = fractional_weights(rng(4), 60, 2)
    ridge = 0.05
    comp = SoftmaxExpert(torch.zeros(2, c, 3, dtype=torch.float64), ridge=ridge, tol=1e-14)
    comp.fit((t(x), t(y)), t(weights))
    assert comp.converged_
    coef, intercept = brute_force_fit(x, np.eye(c)[y], weights, ridge, c)
    assert_close(comp.coef[:, :-1], coef, atol=1e-6)
    assert_close(comp.intercept[:, :-1], intercept, atol=1e-6)
    assert torch.all(comp.coef[:, -1] == 0) and torch.all(comp.intercept[:, -1] == 0)


def test_two_classes_agree_with_the_logistic_expert():
    x, y = data(50, 2, 2, seed=5)
    weights = t(fractional_weights(rng(6), 50, 3))
    soft = SoftmaxExpert(torch.zeros(3, 2, 2, dtype=torch.float64), ridge=0.1).fit((t(x), t(y)), weights)
    logistic = LogisticExpert(torch.zeros(3, 2, dtype=torch.float64), ridge=0.1).fit((t(x), t(y)), weights)
    # class 1 is the logistic expert's positive class; the softmax reference class is the last one (1)
    log_odds = soft.linear_predictor(t(x))[..., 1] - soft.linear_predictor(t(x))[..., 0]
    assert_close(log_odds, logistic.linear_predictor(t(x)), atol=1e-8)
    assert_close(soft.log_prob((t(x), t(y))), logistic.log_prob((t(x), t(y))), atol=1e-8)
    assert_close(soft.predict_proba(t(x))[..., 1], logistic.predict_proba(t(x)), atol=1e-8)


def test_pyro_dist_matches_log_prob():
    comp = make(k=3, c=4, p=2)
    x, y = data(30, 2, 4)
    enumerated = comp.pyro_dist(torch.arange(3)[:, None], t(x))  # what parallel enumeration hands a model
    assert enumerated.batch_shape == (3, 30)
    assert_close(enumerated.log_prob(t(y)).T, comp.log_prob((t(x), t(y))), rtol=1e-12)
    full = comp.pyro_dist(x=t(x))
    assert full.batch_shape == (30, 3)
    assert_close(full.log_prob(t(y)[:, None]), comp.log_prob((t(x), t(y))), rtol=1e-12)
    with pytest.raises(ValueError, match="covariates"):
        comp.pyro_dist(torch.tensor([0]))


def test_sample_follows_the_expert_probabilities():
    comp = make(k=2, c=3, p=1)
    x = torch.full((40_000, 1), 0.3, dtype=torch.float64)
    draws = comp.sample(torch.ones(40_000, dtype=torch.long), x, generator=torch.Generator().manual_seed(0))
    assert draws.dtype == torch.float64 and set(draws.unique().tolist()) <= {0.0, 1.0, 2.0}
    freq = np.bincount(n(draws).astype(int), minlength=3) / 40_000
    proba = n(comp.predict_proba(x[:1]))[0, 1]
    assert np.all(np.abs(freq - proba) <= 5 * np.sqrt(proba * (1 - proba) / 40_000))


def test_kl_is_the_categorical_kl_at_every_point():
    p, q = make(k=2, c=3, seed=0), make(k=3, c=3, seed=1)
    x, _ = data(10)
    kl = n(p.kl(q, t(x)))
    pp, qq = n(p.predict_proba(t(x))), n(q.predict_proba(t(x)))
    expected = (pp[:, :, None] * (np.log(pp[:, :, None]) - np.log(qq[:, None]))).sum(-1)
    assert kl.shape == (10, 2, 3)
    assert_close(kl, expected, rtol=1e-10)
    assert_close(p.kl(p, t(x)).diagonal(dim1=1, dim2=2), np.zeros((10, 2)), atol=1e-12)


def test_state_dict_round_trip_and_member_slicing():
    comp, other = make(seed=0), make(seed=1)
    x, y = data()
    other.load_state_dict(comp.state_dict())
    assert torch.equal(other.log_prob((t(x), t(y))), comp.log_prob((t(x), t(y))))


@pytest.mark.parametrize(
    "coef, intercept, match",
    [
        pytest.param(torch.zeros(2, 3), None, "shape \\(K, C, P\\)", id="2d-coef"),
        pytest.param(torch.zeros(2, 1, 3), None, "C >= 2", id="one-class"),
        pytest.param(torch.zeros(2, 3, 2), torch.zeros(2), "intercept", id="intercept-shape"),
    ],
)
def test_bad_parameters_are_refused(coef, intercept, match):
    with pytest.raises(ValueError, match=match):
        SoftmaxExpert(coef, intercept)


@pytest.mark.parametrize(
    "y",
    [
        pytest.param(np.full(40, 3), id="label-out-of-range"),
        pytest.param(np.full(40, 0.5), id="not-integer"),
        pytest.param(np.full((40, 3), 0.5), id="rows-not-summing-to-one"),
    ],
)
def test_bad_labels_are_refused(y):
    x, _ = data()
    with pytest.raises(ValueError, match="y "):
        make().log_prob((t(x), t(y)))
