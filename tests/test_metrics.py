"""Tests for ppmix.metrics against brute-force / hand-written oracles."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch

from ppmix.metrics import (
    adjusted_rand_index,
    auroc,
    mean_log_px,
    mean_log_py_given_x,
    normalized_mutual_info,
    permutation_accuracy,
    relative_prediction_error,
)

SEEDS = list(range(8))


# ---------------------------------------------------------------------------
# brute-force oracles (deliberately naive, independent of sklearn/scipy)
# ---------------------------------------------------------------------------


def brute_permutation_accuracy(t, p):
    classes = sorted(set(t))
    clusters = sorted(set(p))
    m = max(len(classes), len(clusters))
    best = 0
    # cluster j -> slot perm[j]; slots >= len(classes) are "unmatched"
    for perm in itertools.permutations(range(m), len(clusters)):
        mapping = {c: (classes[s] if s < len(classes) else None) for c, s in zip(clusters, perm)}
        hits = sum(mapping[pi] == ti for ti, pi in zip(t, p))
        best = max(best, hits)
    return best / len(t)


def brute_auroc_binary(y, s):
    pos = [si for yi, si in zip(y, s) if yi]
    neg = [si for yi, si in zip(y, s) if not yi]
    total = 0.0
    for a in pos:
        for b in neg:
            total += 1.0 if a > b else (0.5 if a == b else 0.0)
    return total / (len(pos) * len(neg))


def brute_ari(t, p):
    n = len(t)
    a = b = agree = 0
    for i, j in itertools.combinations(range(n), 2):
        st, sp = t[i] == t[j], p[i] == p[j]
        a += st
        b += sp
        agree += st and sp
    total = math.comb(n, 2)
    expected = a * b / total
    max_index = (a + b) / 2
    return (agree - expected) / (max_index - expected)


def brute_nmi(t, p):
    n = len(t)

    def entropy(lab):
        return -sum((c / n) * math.log(c / n) for c in (lab.count(v) for v in set(lab)))

    mi = 0.0
    for u in set(t):
        for v in set(p):
            nuv = sum(1 for ti, pi in zip(t, p) if ti == u and pi == v)
            if nuv:
                nu, nv = t.count(u), p.count(v)
                mi += (nuv / n) * math.log(n * nuv / (nu * nv))
    return mi / ((entropy(t) + entropy(p)) / 2)


def random_probs(rng, n, c):
    p = rng.random((n, c)) + 0.05
    return p / p.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------
# permutation_accuracy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_permutation_accuracy_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    k_true = int(rng.integers(1, 5))
    k_pred = int(rng.integers(1, 6))  # often != k_true
    t = rng.integers(0, k_true, n).tolist()
    p = rng.integers(0, k_pred, n).tolist()
    assert permutation_accuracy(t, p) == pytest.approx(brute_permutation_accuracy(t, p))


def test_permutation_accuracy_known_cases():
    assert permutation_accuracy([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    # more clusters than classes: cluster 2 is unmatched -> 1 error
    assert permutation_accuracy([0, 0, 1, 1, 1], [0, 0, 1, 1, 2]) == pytest.approx(0.8)
    # fewer clusters than classes: class 2 can never be hit
    assert permutation_accuracy([0, 1, 2, 2], [0, 1, 1, 1]) == pytest.approx(0.75)
    # string labels
    assert permutation_accuracy(["a", "a", "b"], ["x", "x", "y"]) == 1.0


# ---------------------------------------------------------------------------
# auroc
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_auroc_binary_matches_pair_counting(seed):
    rng = np.random.default_rng(seed)
    n = 25
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]  # both classes present
    s = rng.integers(0, 5, n).astype(float)  # coarse scores -> many ties
    expected = brute_auroc_binary(y, s)
    assert auroc(y, s) == pytest.approx(expected)
    # (N, 2) probability matrix: column 1 is the positive-class score
    p1 = s / 10.0
    assert auroc(y, np.column_stack([1 - p1, p1])) == pytest.approx(expected)
    # labels {-1, +1}: the larger label is the positive class
    assert auroc(2 * y - 1, s) == pytest.approx(expected)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_auroc_multiclass_is_macro_one_vs_rest(seed):
    rng = np.random.default_rng(seed)
    c, n = 4, 30
    y = np.concatenate([np.arange(c), rng.integers(0, c, n - c)])
    p = random_probs(rng, n, c)
    expected = np.mean([brute_auroc_binary(y == k, p[:, k]) for k in range(c)])
    assert auroc(y, p) == pytest.approx(expected)


def test_auroc_extremes():
    assert auroc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert auroc([0, 0, 1, 1], [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert auroc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5


# ---------------------------------------------------------------------------
# mean_log_py_given_x / mean_log_px
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_mean_log_py_given_x_matches_loop(seed):
    rng = np.random.default_rng(seed)
    n, c = 20, 3
    y = rng.integers(0, c, n)
    p = random_probs(rng, n, c)
    expected = sum(math.log(p[i, y[i]]) for i in range(n)) / n
    assert mean_log_py_given_x(y, p) == pytest.approx(expected)

    yb = rng.integers(0, 2, n)
    q = rng.random(n)
    expected_b = sum(math.log(q[i] if yb[i] == 1 else 1 - q[i]) for i in range(n)) / n
    assert mean_log_py_given_x(yb, q) == pytest.approx(expected_b)
    assert mean_log_py_given_x(yb, np.column_stack([1 - q, q])) == pytest.approx(expected_b)


def test_mean_log_py_given_x_clips_zero_probability():
    out = mean_log_py_given_x([1, 0], [0.0, 0.0])  # true label 1 gets p = 0
    assert math.isfinite(out)
    assert out == pytest.approx(math.log(1e-12) / 2)
    assert mean_log_py_given_x([0, 1], [[1.0, 0.0], [0.0, 1.0]]) == 0.0


def test_mean_log_px_is_mean():
    x = np.random.default_rng(0).normal(size=50)
    assert mean_log_px(x) == pytest.approx(float(np.mean(x)))
    assert isinstance(mean_log_px(x), float)


# ---------------------------------------------------------------------------
# clustering: ARI / NMI
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_ari_nmi_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 3, 25).tolist()
    p = rng.integers(0, 4, 25).tolist()
    assert adjusted_rand_index(t, p) == pytest.approx(brute_ari(t, p))
    assert normalized_mutual_info(t, p) == pytest.approx(brute_nmi(t, p))


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_identical_labelings_up_to_relabelling_score_one(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 4, 40)
    t[:4] = np.arange(4)
    relabel = rng.permutation(4) + 10
    p = relabel[t]
    assert adjusted_rand_index(t, p) == pytest.approx(1.0)
    assert normalized_mutual_info(t, p) == pytest.approx(1.0)
    assert permutation_accuracy(t, p) == 1.0


# ---------------------------------------------------------------------------
# relative_prediction_error
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_rpe_matches_formula(seed):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=40)
    yhat = y + rng.normal(scale=0.3, size=40)
    expected = np.sum((y - yhat) ** 2) / np.sum(y**2)
    assert relative_prediction_error(y, yhat) == pytest.approx(expected)
    assert relative_prediction_error(y, y) == 0.0


# ---------------------------------------------------------------------------
# input types: numpy / list / pandas / torch agree
# ---------------------------------------------------------------------------

_rng = np.random.default_rng(123)
_Y3 = np.concatenate([np.arange(3), _rng.integers(0, 3, 17)])
_P3 = random_probs(_rng, 20, 3)
_YB = np.concatenate([[0, 1], _rng.integers(0, 2, 18)])
_SB = _rng.random(20)
_YR = _rng.normal(size=20)
_YR_HAT = _YR + 0.1 * _rng.normal(size=20)
_LP = _rng.integers(0, 4, 20)

CASES = {
    "mean_log_px": (mean_log_px, (_YR,)),
    "mean_log_py_given_x": (mean_log_py_given_x, (_Y3, _P3)),
    "mean_log_py_given_x_binary": (mean_log_py_given_x, (_YB, _SB)),
    "auroc_binary": (auroc, (_YB, _SB)),
    "auroc_multiclass": (auroc, (_Y3, _P3)),
    "ari": (adjusted_rand_index, (_Y3, _LP)),
    "nmi": (normalized_mutual_info, (_Y3, _LP)),
    "perm_acc": (permutation_accuracy, (_Y3, _LP)),
    "rpe": (relative_prediction_error, (_YR, _YR_HAT)),
}


def _to_torch(a):
    t = torch.as_tensor(a)
    if t.is_floating_point():
        t = t.clone().requires_grad_(True)  # exercises .detach()
    return t


def _to_pandas(a):
    return pd.Series(a) if a.ndim == 1 else pd.DataFrame(a)


CONVERTERS = {"list": lambda a: a.tolist(), "pandas": _to_pandas, "torch": _to_torch}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("conv", list(CONVERTERS))
def test_input_types_agree_with_numpy(case, conv):
    func, args = CASES[case]
    expected = func(*args)
    got = func(*(CONVERTERS[conv](a) for a in args))
    assert isinstance(got, float)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("case", [c for c in CASES if len(CASES[c][1]) == 2])
@pytest.mark.parametrize("conv", list(CONVERTERS))
def test_mixed_input_types_agree_with_numpy(case, conv):
    func, (a, b) = CASES[case]
    expected = func(a, b)
    assert func(a, CONVERTERS[conv](b)) == pytest.approx(expected, rel=1e-12)
    assert func(CONVERTERS[conv](a), b) == pytest.approx(expected, rel=1e-12)


def test_torch_float32_input():
    y = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float32)
    yhat = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float32)
    assert relative_prediction_error(y, yhat) == pytest.approx(1.0 / 14.0)


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------

BAD = [
    # mean_log_px
    (mean_log_px, ([],), "log_px"),
    (mean_log_px, ([[0.0, 1.0]],), "log_px"),
    (mean_log_px, ([0.0, np.nan],), "log_px contains NaN"),
    (mean_log_px, ([0.0, -np.inf],), "log_px contains inf"),
    (mean_log_px, (None,), "log_px"),
    # mean_log_py_given_x
    (mean_log_py_given_x, ([0, 1, 1], [0.2, 0.7]), "y_true and y_prob"),
    (mean_log_py_given_x, ([0, 2], [0.2, 0.7]), "y_true"),
    (mean_log_py_given_x, ([0, 0.5], [0.2, 0.7]), "y_true"),
    (mean_log_py_given_x, ([0, -1], [[0.5, 0.5], [0.5, 0.5]]), "y_true"),
    (mean_log_py_given_x, ([0, 3], [[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]), "y_true"),
    (mean_log_py_given_x, ([0, 1], [[0.2, 0.3], [0.5, 0.5]]), "y_prob"),
    (mean_log_py_given_x, ([0, 1], [1.2, 0.5]), "y_prob"),
    (mean_log_py_given_x, ([0, 1], [0.2, np.nan]), "y_prob contains NaN"),
    (mean_log_py_given_x, ([0, np.nan], [0.2, 0.3]), "y_true contains NaN"),
    (mean_log_py_given_x, ([0, 1], [[0.2], [0.3]]), "y_prob"),
    (mean_log_py_given_x, ([0, 1], np.ones((2, 2, 1))), "y_prob"),
    (mean_log_py_given_x, ([], []), "y_true"),
    # auroc
    (auroc, ([1, 1, 1], [0.2, 0.3, 0.4]), "y_true"),
    (auroc, ([0, 1], [0.2, 0.3, 0.4]), "y_true and y_score"),
    (auroc, ([0, 1, 1], [0.2, np.inf, 0.4]), "y_score contains inf"),
    (auroc, ([0, 1, 1], [0.2, np.nan, 0.4]), "y_score contains NaN"),
    (auroc, ([0, 1, 2], [0.2, 0.3, 0.4]), "y_true"),
    (auroc, ([0, 1, 1], [[0.5, 0.3, 0.2]] * 3), "y_true"),  # class 2 absent
    (auroc, ([0, 1, 2], [[0.5, 0.3, 0.3]] * 3), "y_score"),  # rows don't sum to 1
    (auroc, ([0, 1, 5], [[0.5, 0.3, 0.2]] * 3), "y_true"),
    (auroc, ([0, 1], [[0.3], [0.4]]), "y_score"),
    (auroc, ([[0, 1]], [0.3, 0.4]), "y_true"),
    (auroc, ([0, 1], []), "y_score"),
    # clustering
    (adjusted_rand_index, ([0, 1], [0, 1, 1]), "labels_true and labels_pred"),
    (adjusted_rand_index, ([], []), "labels_true"),
    (normalized_mutual_info, ([0, np.nan], [0, 1]), "labels_true contains NaN"),
    (normalized_mutual_info, ([0, 1], [[0, 1]]), "labels_pred"),
    (permutation_accuracy, ([0, 1], [0, np.inf]), "labels_pred contains inf"),
    (permutation_accuracy, ([0, 1, 2], [0, 1]), "labels_true and labels_pred"),
    # rpe
    (relative_prediction_error, ([0.0, 0.0], [1.0, 1.0]), "y_true"),
    (relative_prediction_error, ([1.0, 2.0], [1.0]), "y_true and y_pred"),
    (relative_prediction_error, ([1.0, 2.0], [1.0, np.nan]), "y_pred contains NaN"),
    (relative_prediction_error, ([[1.0, 2.0]], [[1.0, 2.0]]), "y_true"),
    (relative_prediction_error, (["a", "b"], [1.0, 2.0]), "y_true"),
]


@pytest.mark.parametrize("func,args,match", BAD, ids=[f"{i}-{b[0].__name__}" for i, b in enumerate(BAD)])
def test_bad_input_raises(func, args, match):
    with pytest.raises(ValueError, match=match):
        func(*args)


def test_bad_torch_input_raises():
    with pytest.raises(ValueError, match="y_score contains NaN"):
        auroc(torch.tensor([0, 1]), torch.tensor([0.1, float("nan")]))
