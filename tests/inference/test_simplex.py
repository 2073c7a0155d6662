"""Euclidean projection onto the simplex against brute-force oracles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from ppmix.algorithms.simplex import project_simplex, project_simplex_warm
from tests.common import assert_close


def brute_force_projection(v: np.ndarray) -> np.ndarray:
    """Exact projection by enumerating every support set (the KKT solution on a support S is
    ``v_S - (sum v_S - 1)/|S|``); the feasible candidate closest to ``v`` is the projection."""
    n = len(v)
    best, best_dist = None, np.inf
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            s = list(support)
            w = np.zeros(n)
            w[s] = v[s] - (v[s].sum() - 1.0) / size
            if (w >= -1e-12).all():
                dist = ((w - v) ** 2).sum()
                if dist < best_dist:
                    best, best_dist = w, dist
    return best


def random_rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = [
        rng.normal(size=6),
        rng.normal(scale=10.0, size=6),
        rng.uniform(-1e-3, 1e-3, size=6),
        np.array([0.3, 0.3, 0.3, 0.3, -1.0, 0.3]),  # ties inside the support
        np.array([2.0, 2.0, 2.0, -5.0, -5.0, -5.0]),  # ties at the top and bottom
        np.full(6, 7.0),  # all equal
        rng.dirichlet(np.ones(6)),  # already feasible
        np.eye(6)[2],  # a vertex
    ]
    return np.stack(rows)


METHODS = ["sort", "pivot"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_support_enumeration(seed, method):
    rows = random_rows(seed)
    got = project_simplex(torch.as_tensor(rows, dtype=torch.float64), method=method)
    expected = np.stack([brute_force_projection(r) for r in rows])
    assert_close(got, expected, rtol=0, atol=1e-12)


def assert_kkt(v: np.ndarray, w: np.ndarray, atol: float) -> None:
    """KKT conditions of min ||w - v||^2 s.t. w >= 0, sum w = 1: with multiplier theta for the sum,
    w_i = v_i - theta where w_i > 0 and v_i <= theta where w_i = 0 (so w = max(v - theta, 0))."""
    assert (w >= 0).all() and abs(w.sum() - 1.0) <= atol
    support = w > atol
    assert support.any()
    theta = float(np.mean(v[support] - w[support]))
    assert_close(w[support], v[support] - theta, rtol=0, atol=atol)  # stationarity on the support
    assert (v[~support] <= theta + atol).all()  # dual feasibility off the support
    assert_close(w, np.maximum(v - theta, 0.0), rtol=0, atol=atol)


@pytest.mark.parametrize("method", METHODS)
def test_satisfies_kkt_conditions(method):
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(scale=2.0, size=(5, 7)), rng.standard_cauchy(size=(5, 40))[:, :7]])
    got = project_simplex(torch.as_tensor(rows), method=method).numpy()
    for row, w in zip(rows, got):
        assert_kkt(row, w, atol=1e-12)


def test_kkt_oracle_rejects_a_wrong_projection():
    v = np.array([0.9, 0.4, -1.0])
    assert_kkt(v, np.array([0.75, 0.25, 0.0]), atol=1e-12)  # the projection
    with pytest.raises(AssertionError):
        assert_kkt(v, np.array([0.6, 0.4, 0.0]), atol=1e-12)  # feasible, but not the closest point


@pytest.mark.parametrize("method", METHODS)
def test_feasible_rows_are_returned_unchanged_and_outputs_are_feasible(method):
    rng = np.random.default_rng(4)
    feasible = torch.as_tensor(rng.dirichlet(np.ones(1000), size=3))
    assert torch.equal(project_simplex(feasible, method=method), feasible)
    out = project_simplex(torch.as_tensor(rng.normal(size=(4, 3, 500))), method=method)
    assert out.shape == (4, 3, 500)
    assert (out >= 0).all()
    assert_close(out.sum(-1), torch.ones(4, 3, dtype=torch.float64), atol=1e-12)


def test_projection_is_idempotent_and_shift_invariant():
    v = torch.as_tensor(np.random.default_rng(5).normal(size=(10, 20)))
    p = project_simplex(v)
    assert_close(project_simplex(p), p, atol=1e-15)
    assert_close(project_simplex(v + 3.7), p, atol=1e-12)


def test_pivot_agrees_with_sort_including_fallback():
    rng = np.random.default_rng(6)
    # a geometric row makes the pivot iteration slow (one element leaves per pass): exercises the fallback
    rows = np.concatenate([rng.standard_cauchy(size=(3, 300)), 2.0 ** -np.arange(300)[None, :] * 50], axis=0)
    v = torch.as_tensor(rows)
    assert_close(project_simplex(v, method="pivot", max_pivots=3), project_simplex(v), atol=1e-13)
    assert_close(project_simplex(v, method="pivot"), project_simplex(v), atol=1e-13)


@pytest.mark.parametrize("shift", [-2.0, -1e-3, 0.0, 1e-3, 0.5, 1e3], ids=lambda s: f"shift{s:g}")
def test_warm_started_pivot_equals_sort_from_any_start(shift):
    """Newton/Michelot from a start left or right of the root (or above max v) reaches the same projection."""
    v = torch.randn(40, 300, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 2
    v[0, :5] = 3.0  # ties at the top
    exact = project_simplex(v, method="sort")
    _, theta = project_simplex_warm(v, None)
    warm, theta_warm = project_simplex_warm(v, theta + shift)
    assert_close(warm, exact, rtol=0, atol=1e-14)
    assert_close(theta_warm, theta, rtol=0, atol=1e-14)


def test_large_n_float64_and_single_entry():
    v = torch.full((1, 200_000), 1.0 / 200_000, dtype=torch.float64) + 1e-9 * torch.arange(200_000)
    p = project_simplex(v)
    assert abs(float(p.sum()) - 1.0) < 1e-10 and (p >= 0).all()
    assert project_simplex(torch.tensor([[-3.0]], dtype=torch.float64)).item() == 1.0


def test_float32_is_kept():
    p = project_simplex(torch.randn(3, 5))
    assert p.dtype == torch.float32
    assert torch.allclose(p.sum(-1), torch.ones(3), atol=1e-6)


@pytest.mark.parametrize(
    "bad, error",
    [
        (torch.tensor([1, 2]), TypeError),
        (np.ones(3), TypeError),
        (torch.tensor(1.0), ValueError),
        (torch.empty(2, 0), ValueError),
        (torch.tensor([0.5, float("nan")]), ValueError),
    ],
    ids=["int", "numpy", "scalar", "empty", "nan"],
)
def test_bad_input(bad, error):
    with pytest.raises(error, match="v"):
        project_simplex(bad)


def test_bad_method():
    with pytest.raises(ValueError, match="method"):
        project_simplex(torch.ones(3), method="bisect")
