"""The batched damped Newton method (ppmix/components/_newton.py)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp
import torch

from ppmix.algorithms.newton import damped_newton
from tests.common import assert_close
from tests.components._util import rng, t

parametrize_b = pytest.mark.parametrize("b", [pytest.param(1, id="B1"), pytest.param(5, id="B5")])
parametrize_m = pytest.mark.parametrize("m", [pytest.param(1, id="M1"), pytest.param(6, id="M6")])


def random_quadratics(r, b, m):
    """``f_b(theta) = 1/2 theta^T A_b theta - c_b^T theta + e_b`` with A_b positive definite."""
    q = r.normal(size=(b, m, m))
    a = q @ np.swapaxes(q, 1, 2) + m * np.eye(m) * r.uniform(0.1, 2.0, size=(b, 1, 1))
    return a, r.normal(scale=3.0, size=(b, m)), r.normal(size=b)


@parametrize_b
@parametrize_m
def test_quadratic_minimiser_in_one_or_two_iterations(b, m):
    r = rng(0)
    a_np, c_np, e_np = random_quadratics(r, b, m)
    a, c, e = t(a_np), t(c_np), t(e_np)
    calls = {"values": 0, "derivatives": 0}

    def objective(theta):
        calls["values"] += 1
        value = 0.5 * torch.einsum("bi,bij,bj->b", theta, a, theta) - (c * theta).sum(-1) + e

        def derivatives():
            calls["derivatives"] += 1
            return torch.einsum("bij,bj->bi", a, theta) - c, a

        return value, derivatives

    start = t(r.normal(scale=5.0, size=(b, m)))
    start_copy = start.clone()
    theta, n_iter, converged = damped_newton(objective, start)
    assert converged and n_iter <= 2 and calls["derivatives"] == n_iter
    # the start, one accepted trial per iteration but the last, and the last's final step, checked before it is
    # taken: every point is evaluated once
    assert calls["values"] == n_iter + 1
    assert torch.equal(start, start_copy), "the starting point must not be modified"
    assert_close(theta, np.linalg.solve(a_np, c_np[..., None])[..., 0], rtol=1e-10, atol=1e-10)


def logistic_objectives(r, b, n_points=60, m=3, ridge=1e-2):
    """``B`` weighted, ridge-penalised logistic regressions, nearly separable (strongly curved)."""
    x = r.normal(size=(n_points, m))
    y = (x @ r.normal(scale=4.0, size=m) + 0.3 * r.normal(size=n_points) > 0).astype(float)
    w = r.uniform(0.1, 1.0, size=(b, n_points))
    return x, y, w, ridge


@parametrize_b
def test_logistic_objective_never_increases(b):
    r = rng(1)
    x_np, y_np, w_np, ridge = logistic_objectives(r, b)
    x, y, w = t(x_np), t(y_np), t(w_np)
    m = x.shape[1]
    iterate_values, calls = [], [0]

    def objective(theta):
        calls[0] += 1
        eta = theta @ x.T  # (B, N)
        value = (w * (torch.nn.functional.softplus(eta) - y * eta)).sum(-1) + 0.5 * ridge * theta.square().sum(-1)

        def derivatives():
            iterate_values.append(value.clone())
            p = torch.sigmoid(eta)
            grad = (w * (p - y)) @ x + ridge * theta
            hess = torch.einsum("bn,ni,nj->bij", w * p * (1 - p), x, x) + ridge * torch.eye(m, dtype=x.dtype)
            return grad, hess

        return value, derivatives

    # far from the optimum, where undamped Newton on a logistic loss overshoots
    start = t(r.normal(scale=8.0, size=(b, m)))
    theta, n_iter, converged = damped_newton(objective, start)
    assert converged
    values = torch.stack(iterate_values)  # (iterations, B)
    assert values.shape[0] >= 3
    # one evaluation per trial point plus the start: more than one per iterate means some step was halved
    assert calls[0] > values.shape[0], "no backtracking happened; the test would not exercise damping"
    increases = values[1:] - values[:-1]
    # a converged problem takes its final full Newton step; allow float64 rounding only
    rounding = 1e-12 * values[:-1].abs().clamp_min(1.0)
    assert (increases <= rounding).all(), f"objective increased between iterations: {increases.max().item()}"

    # and the end point is (close to) the minimiser: the gradient, computed independently in numpy,
    # is small (the stopping rule bounds the Newton decrement g^T H^-1 g by tol * (1 + |f|), not g itself)
    th = theta.numpy()
    for i in range(b):
        grad = x_np.T @ (w_np[i] * (sp.expit(x_np @ th[i]) - y_np)) + ridge * th[i]
        assert np.abs(grad).max() < 1e-4, grad


def test_batch_members_are_independent():
    """Solving a batch gives the same answers as solving every member alone."""
    r = rng(2)
    a_np, c_np, e_np = random_quadratics(r, 4, 3)
    a, c, e = t(a_np), t(c_np), t(e_np)

    def make_objective(sl):
        def objective(theta):
            value = 0.5 * torch.einsum("bi,bij,bj->b", theta, a[sl], theta) - (c[sl] * theta).sum(-1) + e[sl]
            return value, lambda: (torch.einsum("bij,bj->bi", a[sl], theta) - c[sl], a[sl])

        return objective

    start = t(r.normal(size=(4, 3)))
    together, _, _ = damped_newton(make_objective(slice(None)), start)
    for i in range(4):
        alone, _, ok = damped_newton(make_objective(slice(i, i + 1)), start[i : i + 1])
        assert ok
        assert_close(together[i], alone[0], rtol=1e-12, atol=1e-12)


def test_finished_problems_do_not_hold_up_the_line_search():
    """A problem that meets the tolerance does not take a step that goes uphill, and the line search ignores it."""
    hess = t([0.5, 2.0])[:, None, None]  # problem 0: half its true curvature, so its step overshoots uphill
    offset = t([100.0, 0.0])
    calls = [0]

    def objective(theta):
        calls[0] += 1
        return (theta - 1).square().sum(-1) + offset, lambda: (2 * (theta - 1), hess)

    theta, n_iter, converged = damped_newton(objective, t([[0.0], [-3.0]]), tol=0.1)
    # iteration 1: problem 0 is done (decrement 8 <= 0.1 * (1 + 101)); its step to 4 would raise f from 101 to 109,
    # so it stays at 0. Problem 1 steps to its minimum and is done at iteration 2
    assert converged and n_iter == 2
    assert_close(theta, [[0.0], [1.0]], rtol=0, atol=1e-12)
    # the start, problem 0's final step, problem 1's trial, problem 1's final step: no backtracking
    assert calls[0] == 4, "the line search backtracked for a problem that had already finished"


def test_a_step_that_never_decreases_the_objective_is_not_taken():
    """Problem 0 is flat with a near-singular Hessian (a huge Newton step that no halving makes a descent);
    it must stay put and report no convergence, while problem 1 (a quadratic) converges as usual."""

    def objective(theta):
        flat = torch.zeros_like(theta[:1, 0])
        quad = (theta[1:] - 2.0).square().sum(-1)

        def derivatives():
            grad = torch.stack([torch.full_like(theta[0], 1e-3), 2 * (theta[1] - 2.0)])
            hess = torch.stack([1e-200 * torch.eye(2, dtype=theta.dtype), 2 * torch.eye(2, dtype=theta.dtype)])
            return grad, hess

        return torch.cat([flat, quad]), derivatives

    start = torch.zeros(2, 2, dtype=torch.float64)
    theta, _, converged = damped_newton(objective, start, max_iter=5)
    assert theta[0].tolist() == [0.0, 0.0]
    assert theta[1].tolist() == [2.0, 2.0]
    assert converged is False


def test_a_final_step_that_raises_the_objective_is_not_taken():
    """``f(t) = c t + h t^2 / 2 + t^4`` at 0 with tiny ``c`` and ``h``: the Newton decrement ``c^2 / h`` meets the
    tolerance, but the full step ``-c / h = -1`` leaves the quadratic model (``f(-1) ~ 1 > f(0) = 0``). The method
    stops at 0 instead of taking it; where the step does lower the objective (``f = c t + h t^2 / 2``) it is taken."""
    c, h = 1e-5, 1e-5

    def objective(quartic: float):
        def value_and_derivatives(theta):
            value = c * theta[:, 0] + 0.5 * h * theta[:, 0] ** 2 + quartic * theta[:, 0] ** 4
            grad = c + h * theta + 4 * quartic * theta**3
            hess = (h + 12 * quartic * theta**2)[:, :, None]
            return value, lambda: (grad, hess)

        return value_and_derivatives

    start = torch.zeros(1, 1, dtype=torch.float64)
    stopped, n_iter, _ = damped_newton(objective(1.0), start, tol=1e-4)
    assert n_iter == 1 and float(stopped) == 0.0
    stepped, _, _ = damped_newton(objective(0.0), start, tol=1e-4)
    assert float(stepped) == pytest.approx(-1.0, rel=1e-12)
