"""PRESTO with softmax (multi-class) components, and PRESTO's router term (``router_weight``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from ppmix.components import LogisticExpert, SoftmaxExpert
from ppmix.experiments.presto_accuracy import make_region_rules
from ppmix.models._labels import decode_binary_labels, encode_multiclass_labels, multiclass_classes
from ppmix.optimizers.presto._mm import mm_sweep
from ppmix.optimizers.presto.adapters import make_adapter
from ppmix.optimizers.presto.assignment import initial_partition
from ppmix.optimizers.presto.estimator import PRESTO
from ppmix.optimizers.presto.loo import logistic_loo_gains, softmax_loo_gains
from tests.common import assert_close

D = torch.float64


def penalised_g(x, y, c, ridge):
    """``G(S) = min sum_i -log softmax + ridge/2 ||coef||^2`` by a tightly converged fit."""
    expert = SoftmaxExpert(torch.zeros(1, c, x.shape[1], dtype=D), ridge=ridge, tol=1e-14)
    expert.fit((x, y), torch.ones(x.shape[0], 1, dtype=D))
    return float(-expert.log_prob((x, y)).sum() + 0.5 * ridge * expert.coef.square().sum()), expert


def tiny_three_class(n=24, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.normal(size=(n, 2)), dtype=D)
    y = (x[:, 0] > 0).long() + (x[:, 1] + 0.5 * torch.as_tensor(rng.normal(size=n), dtype=D) > 0.5).long()
    return x, y


# ------------------------------------------------------------------ leave-one-out gains
def test_softmax_gains_with_two_classes_are_the_logistic_gains():
    x, y = tiny_three_class()
    y = (y > 0).to(D)
    onehot = torch.nn.functional.one_hot(torch.arange(24) % 2, 2).to(D)
    logistic = LogisticExpert(torch.zeros(2, 2, dtype=D), ridge=0.3).fit((x, y), onehot)
    softmax = SoftmaxExpert(torch.zeros(2, 2, 2, dtype=D), ridge=0.3).fit((x, y), onehot)
    targets = torch.nn.functional.one_hot(y.long(), 2).to(D)
    g_log, gains_log = logistic_loo_gains(x, y, onehot, logistic.coef, logistic.intercept, 0.3)
    g_soft, gains_soft = softmax_loo_gains(x, targets, onehot, softmax.coef, softmax.intercept, 0.3)
    assert_close(g_soft, g_log, rtol=1e-9)
    assert_close(gains_soft, gains_log, rtol=1e-8, atol=1e-10)


def test_softmax_gains_against_brute_force_refits():
    x, y = tiny_three_class()
    ridge = 0.3
    full, expert = penalised_g(x, y, 3, ridge)
    targets = torch.nn.functional.one_hot(y, 3).to(D)
    onehot = torch.ones(24, 1, dtype=D)
    objective, gains = softmax_loo_gains(x, targets, onehot, expert.coef, expert.intercept, ridge)
    assert_close(objective[0], full, rtol=1e-10)
    exact = np.array([full - penalised_g(x[np.arange(24) != i], y[np.arange(24) != i], 3, ridge)[0] for i in range(24)])
    own_loss = -expert.log_prob((x, y))[:, 0].numpy()
    approx = gains[:, 0].numpy()
    # one Newton step: far closer to retraining than the point's own loss (the fallback), and close in absolute terms
    assert np.abs(approx - exact).max() < 0.1
    assert np.abs(approx - exact).sum() < 0.25 * np.abs(own_loss - exact).sum()
    assert np.all(approx >= own_loss - 1e-12)  # the correction is a positive quadratic form


# ------------------------------------------------------------------ multi-class labels
def test_multiclass_labels_code_sorted_classes_and_decode_back():
    classes = multiclass_classes(np.array(["b", "c", "a", None, "b"], dtype=object))
    assert classes.tolist() == ["a", "b", "c"]
    codes = encode_multiclass_labels(["c", None, "a"], classes)
    assert codes[0] == 2.0 and np.isnan(codes[1]) and codes[2] == 0.0
    assert decode_binary_labels(torch.tensor([2, 0]), classes, None).tolist() == ["c", "a"]
    numeric = multiclass_classes([7.0, 0.0, 2.0])
    assert numeric.dtype == np.int64 and numeric.tolist() == [0, 2, 7]
    # classes 0..C-1: the codes are the labels (a tensor stays a tensor)
    assert torch.equal(decode_binary_labels(torch.tensor([2, 0]), np.arange(3), torch.zeros(2)), torch.tensor([2, 0]))


@pytest.mark.parametrize(
    "y, match",
    [
        pytest.param([0.5, 1.0, 2.0], "continuous", id="continuous"),
        pytest.param([1.0, float("inf"), 2.0], "infinite", id="infinite"),
        pytest.param(["a", "a"], "1 class", id="one-class"),
    ],
)
def test_multiclass_labels_refuse_what_is_not_classes(y, match):
    with pytest.raises(ValueError, match=match):
        multiclass_classes(y)


def test_multiclass_encoding_refuses_unseen_labels():
    with pytest.raises(ValueError, match="outside the classes"):
        encode_multiclass_labels([0, 3], np.array([0, 1, 2]))


# ------------------------------------------------------------------ PRESTO(component="softmax")
@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return X[order[:300]], y[order[:300]], X[order[300:700]], y[order[300:700]]


@pytest.fixture(scope="module")
def digits_presto(digits):
    X, y, _, _ = digits
    return PRESTO(3, "softmax", seed=0, progress=False, max_iter=5).fit(X, y)


def test_softmax_presto_fits_ten_digit_classes(digits, digits_presto):
    X, y, Xt, yt = digits
    model = digits_presto
    assert model.classes_.tolist() == list(range(10))
    assert isinstance(model.components_, SoftmaxExpert) and model.components_.coef.shape == (3, 10, 64)
    assert model.part_sizes_.sum() == 300
    proba = model.predict_proba(Xt)
    assert proba.shape == (400, 10)
    assert_close(proba.sum(1), np.ones(400), rtol=1e-12)
    pred = model.predict(Xt)
    assert np.array_equal(pred, model.classes_[proba.argmax(1)])
    assert model.score(Xt, yt) == pytest.approx(float((pred == yt).mean()))
    assert model.score(Xt, yt) > 0.85  # one softmax model of this family reaches ~0.93 on these rows


def test_softmax_presto_returns_the_users_labels(digits):
    X, y, Xt, _ = digits
    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
    model = PRESTO(2, "softmax", seed=0, progress=False, max_iter=2).fit(X, names[y])
    assert model.classes_.tolist() == sorted(names.tolist())
    assert set(model.predict(Xt).tolist()) <= set(names.tolist())
    with pytest.raises(ValueError, match="outside the classes"):
        model.objective(X, np.where(y == 0, "ten", names[y]), np.zeros(len(y), dtype=int))


def test_softmax_presto_save_load_round_trip(tmp_path, digits, digits_presto):
    _, _, Xt, _ = digits
    again = PRESTO.load(digits_presto.save(tmp_path / "presto"))
    assert again.classes_.tolist() == digits_presto.classes_.tolist()
    assert np.array_equal(again.predict(Xt), digits_presto.predict(Xt))
    assert_close(again.predict_proba(Xt), digits_presto.predict_proba(Xt), rtol=1e-12)
    assert again.routability_ == digits_presto.routability_


def test_softmax_presto_refuses_one_class():
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match="1 class"):
        PRESTO(2, "softmax", progress=False).fit(X, np.zeros(20))


def test_softmax_adapter_penalty_is_half_ridge_squared_norm():
    adapter = make_adapter("softmax", 0.4, 2, 3, torch.device("cpu"), n_classes=4)
    adapter.comp.coef = torch.ones(2, 4, 3, dtype=D)
    assert_close(adapter.penalty(), [0.2 * 12, 0.2 * 12], rtol=1e-12)


# ------------------------------------------------------------------ router_weight
def test_router_weight_zero_is_the_papers_sweep():
    X, y, _ = make_region_rules(200, seed=0)
    default = PRESTO(4, "logistic", seed=0, progress=False).fit(X, y)
    zero = PRESTO(4, "logistic", seed=0, progress=False, router_weight=0.0).fit(X, y)
    assert np.array_equal(default.partition_, zero.partition_) and default.history_ == zero.history_
    # and the sweep itself: no router term is the sweep without one
    x = torch.as_tensor((X - X.mean(0)) / X.std(0), dtype=D)
    yt = torch.as_tensor(y, dtype=D)
    start = initial_partition(x, 4, "kmeans", 55, torch.Generator().manual_seed(0))
    sweeps = [
        mm_sweep(
            make_adapter("logistic", 0.1, 4, 2, torch.device("cpu")),
            x,
            yt,
            start,
            55,
            scores=default._scores,
            objective=default._objective,
            eps=6e-3,
            max_iter=50,
            tol=1e-6,
            progress=False,
            **extra,
        )
        for extra in ({}, {"router_cost": None})
    ]
    assert torch.equal(sweeps[0].part, sweeps[1].part) and sweeps[0].history == sweeps[1].history


def test_router_weight_makes_the_partition_routable_and_predictive():
    X, y, _ = make_region_rules(400, seed=0)
    Xt, yt, _ = make_region_rules(2000, seed=1)
    plain = PRESTO(4, "logistic", seed=0, progress=False).fit(X, y)
    routed = PRESTO(4, "logistic", seed=0, progress=False, router_weight=1.0).fit(X, y)
    assert routed.routability_ > plain.routability_ + 0.2
    assert routed.routability_ > 0.95
    assert routed.score(Xt, yt) > plain.score(Xt, yt)
    # the paper's objective alone prefers the unroutable partition
    assert plain.loss_history_[-1] < routed.loss_history_[-1]


def test_router_term_keeps_the_loss_bound_sweep_monotone():
    X, y, _ = make_region_rules(200, seed=2)
    model = PRESTO(4, "logistic", seed=0, progress=False, scores="loss", router_weight=0.5, init="random").fit(X, y)
    assert model.n_iter_ > 1
    assert np.all(np.diff(model.history_) <= 1e-9 * np.abs(model.history_[:-1]))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1", True], ids=["negative", "nan", "string", "bool"])
def test_bad_router_weight_is_refused(bad):
    X, y, _ = make_region_rules(40, seed=0)
    with pytest.raises(ValueError, match="router_weight"):
        PRESTO(2, "logistic", router_weight=bad, progress=False).fit(X, y)
