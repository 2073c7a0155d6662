"""SoftmaxGate against scipy oracles (log_softmax and an independent penalised fit)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as opt
import scipy.special as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.components import SoftmaxGate, _linear, softmax_gate
from tests.common import assert_close
from tests.components._util import (
    TOL,
    n,
    parametrize_device,
    parametrize_dtype,
    parametrize_k,
    rng,
    rounded,
    t,
)

parametrize_p = pytest.mark.parametrize("p", [pytest.param(1, id="P1"), pytest.param(4, id="P4")])


def raw_params(k, p, seed=0):
    r = rng(seed)
    return r.normal(size=(k, p)), r.normal(size=k)


def make(k, p, dtype=torch.float64, device="cpu", seed=0, ridge=1e-3, centred_penalty=True):
    coef, intercept = raw_params(k, p, seed)
    return SoftmaxGate(
        t(coef, dtype, device), t(intercept, dtype, device), ridge=ridge, centred_penalty=centred_penalty
    )


def assert_last_row_zero(gate):
    assert torch.all(gate.coef[-1] == 0) and gate.intercept[-1] == 0, (gate.coef, gate.intercept)


@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
def test_log_prob_is_log_softmax_and_last_row_is_zero(k, p, dtype, device):
    coef, intercept = raw_params(k, p)
    gate = make(k, p, dtype, device)
    assert_last_row_zero(gate)
    x = rounded(rng(1).normal(size=(30, p)), dtype)
    lp = gate.log_prob(t(x, dtype, device))
    assert lp.shape == (30, k) and lp.dtype == dtype
    # pinning the last row is a reparametrisation: the probabilities of the raw parameters are kept
    coef, intercept = rounded(coef, dtype), rounded(intercept, dtype)
    assert_close(lp, sp.log_softmax(x @ coef.T + intercept, axis=1), **TOL[dtype])
    assert_close(lp.exp().sum(1), np.ones(30), **TOL[dtype])


def scipy_gate_fit(x, targets, ridge, centred=True):
    """Minimise -sum_nk R_nk log softmax_k + ridge/2 sum_k ||coef_k - centre||^2, last row fixed at 0 (L-BFGS-B);
    the centre is the mean of the K slope rows (``centred``) or 0."""
    n_points, p = x.shape
    k = targets.shape[1]
    a = np.column_stack([x, np.ones(n_points)])
    pen = np.append(np.full(p, ridge), 0.0)

    def full(theta):
        return np.vstack([theta.reshape(k - 1, p + 1), np.zeros((1, p + 1))])

    def f(theta):
        params = full(theta)
        log_p = sp.log_softmax(a @ params.T, axis=1)
        shrunk = params - params.mean(0) if centred else params  # its gradient is the same expression
        value = -np.sum(targets * log_p) + 0.5 * np.sum(pen * shrunk**2)
        grad = (np.exp(log_p) * targets.sum(1, keepdims=True) - targets).T @ a + pen * shrunk
        return value, grad[:-1].ravel()

    res = opt.minimize(
        f,
        np.zeros((k - 1) * (p + 1)),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-10, "ftol": 0.0, "maxiter": 10_000},
    )
    assert np.abs(res.jac).max() < 1e-5 * (1 + np.abs(res.fun)), res
    return full(res.x)


def soft_targets(r, x, k, row_weights=False):
    """Random non-separable soft responsibilities; optionally rows scaled as sample weights."""
    logits = x @ r.normal(size=(x.shape[1], k)) + r.normal(scale=0.5, size=(x.shape[0], k))
    targets = sp.softmax(logits, axis=1)
    if row_weights:
        targets = targets * r.uniform(0.2, 2.0, size=(x.shape[0], 1))
    return targets


@parametrize_device
@parametrize_p
@pytest.mark.parametrize("k", [pytest.param(2, id="K2"), pytest.param(3, id="K3"), pytest.param(5, id="K5")])
@pytest.mark.parametrize("row_weights", [pytest.param(False, id="rows1"), pytest.param(True, id="rowsw")])
@pytest.mark.parametrize("centred", [pytest.param(True, id="centred"), pytest.param(False, id="reference")])
def test_fit_matches_scipy_optimum(k, p, device, row_weights, centred):
    r = rng(2)
    x = r.normal(size=(200, p))
    targets = soft_targets(r, x, k, row_weights)
    gate = make(k, p, device=device, ridge=0.3, centred_penalty=centred)
    out = gate.fit(t(x, device=device), t(targets, device=device))
    assert out is gate and gate.converged_
    assert_last_row_zero(gate)
    expected = scipy_gate_fit(x, targets, 0.3, centred)
    assert_close(gate.coef, expected[:, :-1], rtol=1e-5, atol=1e-5)
    assert_close(gate.intercept, expected[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [pytest.param(2, id="K2"), pytest.param(3, id="K3"), pytest.param(5, id="K5")])
@pytest.mark.parametrize("chunk_rows", [pytest.param(1, id="rows1"), pytest.param(7, id="rows7"), None])
@pytest.mark.parametrize("centred", [pytest.param(True, id="centred"), pytest.param(False, id="reference")])
def test_newton_objective_matches_autograd(k, chunk_rows, centred, monkeypatch):
    """Value, gradient and Hessian that fit hands to Newton against autograd of -sum R log softmax + ridge.

    Non-normalised targets (row sums are sample weights), a ridge, and Hessians assembled in
    chunks of one row, of 7 rows (a ragged last chunk) and in one chunk.
    """
    p, ridge = 3, 0.3
    r = rng(7)
    x = r.normal(size=(40, p))
    targets = soft_targets(r, x, k, row_weights=True)
    if chunk_rows is not None:
        pairs = k * (k - 1) // 2
        monkeypatch.setattr(_linear, "_CHUNK_ELEMENTS", chunk_rows * pairs * (p + 1))
    captured = []

    def capture(objective, start, **options):
        captured.append(objective)
        return start, 0, False

    monkeypatch.setattr(softmax_gate, "damped_newton", capture)
    make(k, p, ridge=ridge, centred_penalty=centred).fit(t(x), t(targets))

    a, target = t(np.column_stack([x, np.ones(len(x))])), t(targets)
    penalty = t(np.append(np.full(p, ridge), 0.0))

    def reference(theta):
        params = torch.cat([theta.view(k - 1, p + 1), theta.new_zeros(1, p + 1)])
        shrunk = params - params.mean(0) if centred else params
        return -(target * torch.log_softmax(a @ params.T, dim=1)).sum() + 0.5 * (penalty * shrunk.square()).sum()

    theta = t(r.normal(size=(k - 1) * (p + 1)))
    value, derivatives = captured[0](theta[None])
    grad, hess = derivatives()
    assert_close(value, reference(theta)[None], rtol=1e-12, atol=1e-12)
    assert_close(grad[0], torch.func.grad(reference)(theta), rtol=1e-10, atol=1e-10)
    assert_close(hess[0], torch.autograd.functional.hessian(reference, theta), rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 6), reference=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_centred_penalty_and_fit_do_not_depend_on_which_component_is_the_reference(k, reference, seed):
    """Relabelling the components (here: making component ``reference`` the one fixed at 0) leaves the centred
    penalty unchanged, and a fit from the relabelled start ends at the same gate probabilities; with three or more
    components the penalty towards the reference changes."""
    reference = reference % k
    r = rng(seed)
    x = r.normal(size=(60, 2))
    targets = soft_targets(r, x, k)
    coef, intercept = t(r.normal(scale=3.0, size=(k, 2))), t(r.normal(size=k))
    order = [j for j in range(k) if j != reference] + [reference]
    gate = SoftmaxGate(coef, intercept, ridge=0.7)
    moved = SoftmaxGate(coef[order], intercept[order], ridge=0.7)
    assert float(moved.penalty().sum()) == pytest.approx(float(gate.penalty().sum()), rel=1e-12)
    gate.fit(t(x), t(targets))
    moved.fit(t(x), t(targets[:, order]))
    assert_close(moved.log_prob(t(x)), gate.log_prob(t(x))[:, order], rtol=1e-7, atol=1e-7)
    if k > 2 and reference != k - 1:  # (with two components both penalties are |coef_0 - coef_1|^2 / 2 or /4)
        plain = SoftmaxGate(coef, intercept, ridge=0.7, centred_penalty=False).penalty().sum()
        moved_plain = SoftmaxGate(coef[order], intercept[order], ridge=0.7, centred_penalty=False).penalty().sum()
        assert abs(float(plain) - float(moved_plain)) > 1e-6


def test_fit_restores_the_thread_count():
    """The Hessian runs its chunks on one thread; the caller's thread count comes back."""
    r = rng(8)
    x = r.normal(size=(50, 2))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        make(3, 2).fit(t(x), t(soft_targets(r, x, 3)))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


@parametrize_device
@parametrize_dtype
def test_fit_float32_close_to_optimum_and_last_row_zero(dtype, device):
    r = rng(3)
    x = rounded(r.normal(size=(200, 2)), dtype)
    targets = rounded(soft_targets(r, x, 3), dtype)
    gate = make(3, 2, dtype, device).fit(t(x, dtype, device), t(targets, dtype, device))
    assert gate.coef.dtype == dtype
    assert_last_row_zero(gate)
    expected = scipy_gate_fit(x, targets, 1e-3)
    tol = 1e-3 if dtype == torch.float32 else 1e-5
    assert_close(gate.coef, expected[:, :-1], rtol=tol, atol=tol)
    assert_close(gate.intercept, expected[:, -1], rtol=tol, atol=tol)


@parametrize_device
@parametrize_dtype
def test_fit_single_component_is_trivial(dtype, device):
    gate = make(1, 2, dtype, device)
    assert_last_row_zero(gate)
    x = t(rng(4).normal(size=(10, 2)), dtype, device)
    gate.fit(x, torch.ones(10, 1, dtype=dtype, device=device))
    assert_last_row_zero(gate)
    assert_close(gate.log_prob(x), np.zeros((10, 1)), rtol=0, atol=0)


@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
def test_pyro_dist_enumerated_values_match_log_prob(k, p, dtype, device):
    gate = make(k, p, dtype, device)
    x = t(rng(5).normal(size=(25, p)), dtype, device)
    fn = gate.pyro_dist(x=x)
    assert fn.batch_shape == (25,)
    values = torch.arange(k, device=device)[:, None]  # enumerated component index, shape (K, 1)
    lp = fn.log_prob(values)
    assert lp.shape == (k, 25)
    assert_close(lp, gate.log_prob(x).T, **TOL[dtype])
    assert fn.enumerate_support().shape == (k, 25)


@parametrize_device
@parametrize_dtype
@parametrize_k
def test_sample_shape_and_frequencies(k, dtype, device):
    gate = make(k, 2, dtype, device)
    x_row = rng(6).normal(size=(1, 2))
    m = 40_000
    xs = t(np.repeat(x_row, m, axis=0), dtype, device)
    z = gate.sample(xs, generator=torch.Generator(device=device).manual_seed(0))
    assert z.shape == (m,)
    freq = np.bincount(n(z).astype(int), minlength=k) / m
    prob = np.exp(n(gate.log_prob(t(x_row, dtype, device)))[0])
    assert freq.shape == (k,)
    assert np.all(np.abs(freq - prob) <= 5 * np.sqrt(prob * (1 - prob) / m) + 1e-12)
    a = gate.sample(xs[:30], generator=torch.Generator(device=device).manual_seed(1))
    b = gate.sample(xs[:30], generator=torch.Generator(device=device).manual_seed(1))
    assert torch.equal(a, b)
