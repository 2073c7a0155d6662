"""PRESTO.guarantee_: Theorem 2's constants and Theorem 4's factor against brute force on tiny data."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as opt
import scipy.special as sp

from ppmix.optimizers.presto.estimator import PRESTO


def standardised(X):
    return (X - X.mean(0)) / X.std(0, ddof=1)


def brute_singleton(a, label, c, lam):
    """``min_Theta -log softmax_label([Theta a, 0]) + lam ||Theta||^2`` over all ``(C-1) x M`` parameters."""
    m = a.shape[0]

    def f(theta):
        logits = np.append(theta.reshape(c - 1, m) @ a, 0.0)
        return -sp.log_softmax(logits)[label] + lam * np.sum(theta**2)

    return opt.minimize(f, np.zeros((c - 1) * m), method="BFGS", options={"gtol": 1e-10}).fun


def brute_constants(X, y, c, ridge):
    lam = ridge / 2
    a = np.column_stack([standardised(X), np.ones(len(X))])
    singles = np.array([brute_singleton(a[i], y[i], c, lam) for i in range(len(X))])
    l_min, l_max = singles.min(), singles.max()
    # sup of the gradient norm ||(p - t)[:C-1]|| ||a_i|| over the simplex: at a vertex of p
    sup = max(
        np.sum((np.eye(c)[v] - np.eye(c)[yi])[:-1] ** 2) * np.sum(ai**2) for ai, yi in zip(a, y) for v in range(c)
    )
    lipschitz = np.sqrt(sup)
    alpha = l_min / (l_min + 2 * lipschitz**2 / lam + lam * lipschitz**2 / lam**2)
    kappa = 1 - l_min / l_max
    n = len(X)
    return {
        "lambda": lam,
        "lipschitz": lipschitz,
        "l_min_min": l_min,
        "l_min_max": l_max,
        "alpha_G": alpha,
        "kappa_G": kappa,
        "factor": 1 / ((1 - kappa) * alpha**2),
        "factor_tight": n / (alpha * (1 + (n - 1) * (1 - kappa) * alpha)),
    }


@pytest.mark.parametrize("c", [2, 3], ids=["logistic", "softmax3"])
def test_guarantee_matches_brute_force(c):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(9, 2)) * [1.0, 3.0]
    y = np.arange(9) % c
    model = PRESTO(2, "logistic" if c == 2 else "softmax", ridge=0.4, seed=0, progress=False).fit(X, y)
    got = model.guarantee_(X, y)
    expected = brute_constants(X, y, c, 0.4)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6), name
    assert got["eps_min"] == 0.0


def test_eps_min_is_zero_at_the_fitted_components():
    """Every point's loss Hessian at every fitted component is singular (rank C - 1 < (C - 1) M)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(12, 2))
    y = np.arange(12) % 3
    model = PRESTO(2, "softmax", ridge=0.4, seed=0, progress=False).fit(X, y)
    a = np.column_stack([standardised(X), np.ones(12)])
    proba = model.components_.predict_proba(standardised(X)).numpy()  # (N, K, C)
    least = min(
        np.linalg.eigvalsh(np.kron(np.diag(p[:-1]) - np.outer(p[:-1], p[:-1]), np.outer(ai, ai))).min()
        for ai, pk in zip(a, proba)
        for p in pk
    )
    assert abs(least) < 1e-12
    assert model.guarantee_(X, y)["eps_min"] == 0.0


def test_guarantee_is_for_classifiers_with_a_ridge():
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(TypeError, match="logistic and softmax"):
        PRESTO(2, "linear", progress=False).fit(X, X[:, 0]).guarantee_(X, X[:, 0])
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="ridge > 0"):
        PRESTO(2, "logistic", ridge=0.0, progress=False).fit(X, y).guarantee_(X, y)
