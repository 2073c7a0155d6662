"""GaussianExpert and LogisticExpert against scipy / numpy oracles."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as opt
import scipy.special as sp
import scipy.stats as st
import torch

from ppmix.components import GaussianExpert, LogisticExpert, _linear
from tests.common import assert_close
from tests.components._util import (
    TOL,
    fractional_weights,
    group_labels,
    n,
    one_hot,
    parametrize_device,
    parametrize_dtype,
    parametrize_k,
    rng,
    rounded,
    t,
)

parametrize_p = pytest.mark.parametrize("p", [pytest.param(1, id="P1"), pytest.param(4, id="P4")])


def make_gaussian(k, p, dtype=torch.float64, device="cpu", seed=0, ridge=0.0):
    r = rng(seed)
    return GaussianExpert(
        t(r.normal(size=(k, p)), dtype, device),
        t(r.normal(size=k), dtype, device),
        t(r.uniform(0.5, 1.5, size=k), dtype, device),
        ridge=ridge,
    )


def make_logistic(k, p, dtype=torch.float64, device="cpu", seed=0, ridge=1e-3):
    r = rng(seed)
    return LogisticExpert(t(r.normal(size=(k, p)), dtype, device), t(r.normal(size=k), dtype, device), ridge=ridge)


def predictor(comp, x):
    """numpy ``x @ coef.T + intercept`` (N, K) from the component's own parameters."""
    return x @ n(comp.coef).T + n(comp.intercept)[None]


# ---------------------------------------------------------------- log_prob
@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
def test_gaussian_expert_log_prob_matches_scipy(k, p, dtype, device):
    comp = make_gaussian(k, p, dtype, device)
    r = rng(1)
    x, y = rounded(r.normal(size=(40, p)), dtype), rounded(r.normal(scale=2.0, size=40), dtype)
    lp = comp.log_prob((t(x, dtype, device), t(y, dtype, device)))
    assert lp.shape == (40, k) and lp.dtype == dtype
    mean, scale = predictor(comp, x), n(comp.scale)
    expected = np.stack([st.norm.logpdf(y, mean[:, j], scale[j]) for j in range(k)], axis=1)
    assert_close(lp, expected, **TOL[dtype])
    assert_close(comp.mean(t(x, dtype, device)), mean, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
@pytest.mark.parametrize("soft", [pytest.param(False, id="hard"), pytest.param(True, id="soft")])
def test_logistic_expert_log_prob_matches_torch_bernoulli(k, p, dtype, device, soft):
    comp = make_logistic(k, p, dtype, device)
    r = rng(2)
    x = rounded(r.normal(size=(40, p)), dtype)
    y = rounded(r.uniform(0.01, 0.99, size=40) if soft else r.integers(0, 2, size=40), dtype)
    lp = comp.log_prob((t(x, dtype, device), t(y, dtype, device)))
    assert lp.shape == (40, k) and lp.dtype == dtype
    eta = predictor(comp, x)
    if soft:  # torch's Bernoulli only takes hard labels (with validation): y log s + (1-y) log(1-s)
        expected = y[:, None] * -np.logaddexp(0, -eta) + (1 - y[:, None]) * -np.logaddexp(0, eta)
    else:
        expected = np.stack(
            [n(torch.distributions.Bernoulli(logits=t(eta[:, j])).log_prob(t(y))) for j in range(k)], axis=1
        )
    assert_close(lp, expected, **TOL[dtype])
    assert_close(comp.predict_proba(t(x, dtype, device)), sp.expit(eta), **TOL[dtype])


# --------------------------------------------------------------------- fit
def regression_data(r, n_points, p, k, z=None):
    z = np.zeros(n_points, dtype=int) if z is None else z
    x = r.normal(size=(n_points, p))
    coef, b = r.normal(scale=2.0, size=(k, p)), r.normal(size=k)
    y = np.einsum("np,np->n", x, coef[z]) + b[z] + r.uniform(0.2, 1.0, size=k)[z] * r.normal(size=n_points)
    return x, y


@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
def test_gaussian_expert_fit_one_hot_equals_group_lstsq(k, p, dtype, device):
    r = rng(3)
    z = group_labels(r, 150, k, min_size=p + 5)
    x, y = regression_data(r, 150, p, k, z)
    x, y = rounded(x, dtype), rounded(y, dtype)
    comp = make_gaussian(k, p, dtype, device)
    out = comp.fit((t(x, dtype, device), t(y, dtype, device)), t(one_hot(z, k), dtype, device))
    assert out is comp
    a = np.column_stack([x, np.ones(len(x))])
    for j in range(k):
        theta, *_ = np.linalg.lstsq(a[z == j], y[z == j], rcond=None)
        sigma2 = np.mean((y[z == j] - a[z == j] @ theta) ** 2)
        assert_close(comp.coef[j], theta[:-1], **TOL[dtype], msg=f"coef[{j}]")
        assert_close(comp.intercept[j], theta[-1], **TOL[dtype], msg=f"intercept[{j}]")
        assert_close(comp.scale[j], np.sqrt(sigma2), **TOL[dtype], msg=f"scale[{j}]")


@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
@pytest.mark.parametrize("ridge", [pytest.param(0.0, id="ridge0"), pytest.param(2.0, id="ridge2")])
@pytest.mark.parametrize(
    "chunk_rows, shift",
    [
        pytest.param(None, 0.0, id="one-chunk"),
        pytest.param(7, 0.0, id="rows7"),  # 120 rows: 17 chunks of 7 and a ragged one of 1
        pytest.param(None, 1e4, id="shift1e4"),  # y far from 0: the one-pass variance must not lose it
    ],
)
def test_gaussian_expert_fit_fractional_weights_equals_wls(k, p, dtype, device, ridge, chunk_rows, shift, monkeypatch):
    """fit against a per-expert numpy lstsq on sqrt(w)-scaled rows, and the two-pass weighted variance with the
    ridge term, ``(sum w r^2 + ridge ||coef||^2) / sum w``: the joint maximiser of the penalised likelihood."""
    r = rng(4)
    x, y = regression_data(r, 120, p, 1)
    x, y = rounded(x, dtype), rounded(y + shift, dtype)
    if chunk_rows is not None:
        monkeypatch.setattr(_linear, "_CHUNK_ELEMENTS", chunk_rows * k * (p + 2))
    w = rounded(fractional_weights(r, 120, k), dtype)
    comp = make_gaussian(k, p, dtype, device, ridge=ridge)
    comp.fit((t(x, dtype, device), t(y, dtype, device)), t(w, dtype, device))
    a = np.column_stack([x, np.ones(len(x))])
    # ridge * ||coef||^2 as extra least-squares rows (intercept not penalised)
    penalty = np.sqrt(ridge) * np.eye(p + 1)[:p]
    for j in range(k):
        sw = np.sqrt(w[:, j])
        theta, *_ = np.linalg.lstsq(
            np.vstack([sw[:, None] * a, penalty]), np.concatenate([sw * y, np.zeros(p)]), rcond=None
        )
        sigma2 = (np.sum(w[:, j] * (y - a @ theta) ** 2) + ridge * np.sum(theta[:-1] ** 2)) / np.sum(w[:, j])
        assert_close(comp.coef[j], theta[:-1], **TOL[dtype], msg=f"coef[{j}]")
        assert_close(comp.intercept[j], theta[-1], **TOL[dtype], msg=f"intercept[{j}]")
        assert_close(comp.scale[j], np.sqrt(sigma2), **TOL[dtype], msg=f"scale[{j}]")


def scipy_logistic_fit(x, y, w, ridge):
    """Minimise -sum w [y log s + (1-y) log(1-s)] + ridge/2 ||coef||^2 with L-BFGS-B."""
    a = np.column_stack([x, np.ones(len(x))])
    pen = np.append(np.full(x.shape[1], ridge), 0.0)

    def f(theta):
        eta = a @ theta
        value = np.sum(w * (y * np.logaddexp(0, -eta) + (1 - y) * np.logaddexp(0, eta))) + 0.5 * np.sum(pen * theta**2)
        grad = a.T @ (w * (sp.expit(eta) - y)) + pen * theta
        return value, grad

    # ftol=0: stop on the gradient only (|grad| ~ 1e-7 at worst, i.e. parameters to ~1e-8)
    res = opt.minimize(
        f, np.zeros(a.shape[1]), jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "ftol": 0.0, "maxiter": 10_000}
    )
    assert np.abs(res.jac).max() < 1e-5 * (1 + np.abs(res.fun)), res
    return res.x


def logistic_data(r, n_points, p, soft):
    x = r.normal(size=(n_points, p))
    eta = x @ r.normal(size=p) + 0.3
    y = sp.expit(eta + r.normal(size=n_points)) if soft else (r.uniform(size=n_points) < sp.expit(eta)).astype(float)
    return x, y


@parametrize_device
@parametrize_p
@parametrize_k
@pytest.mark.parametrize("soft", [pytest.param(False, id="hard"), pytest.param(True, id="soft")])
@pytest.mark.parametrize("weighting", ["onehot", "fractional"])
def test_logistic_expert_fit_matches_scipy_optimum(k, p, device, soft, weighting):
    r = rng(5)
    x, y = logistic_data(r, 200, p, soft)
    w = one_hot(group_labels(r, 200, k, min_size=40), k) if weighting == "onehot" else fractional_weights(r, 200, k)
    comp = make_logistic(k, p, device=device, ridge=1e-3)
    out = comp.fit((t(x, device=device), t(y, device=device)), t(w, device=device))
    assert out is comp and comp.converged_
    for j in range(k):
        theta = scipy_logistic_fit(x, y, w[:, j], 1e-3)
        assert_close(comp.coef[j], theta[:-1], rtol=1e-5, atol=1e-5, msg=f"coef[{j}]")
        assert_close(comp.intercept[j], theta[-1], rtol=1e-5, atol=1e-5, msg=f"intercept[{j}]")


@parametrize_device
@parametrize_k
def test_logistic_expert_fit_float32_close_to_optimum(k, device):
    r = rng(6)
    x, y = logistic_data(r, 200, 3, soft=False)
    x, y = rounded(x, torch.float32), rounded(y, torch.float32)
    w = rounded(fractional_weights(r, 200, k), torch.float32)
    comp = make_logistic(k, 3, torch.float32, device).fit(
        (t(x, torch.float32, device), t(y, torch.float32, device)), t(w, torch.float32, device)
    )
    assert comp.coef.dtype == torch.float32
    for j in range(k):
        theta = scipy_logistic_fit(x, y, w[:, j], 1e-3)
        assert_close(comp.coef[j], theta[:-1], rtol=1e-3, atol=1e-3)
        assert_close(comp.intercept[j], theta[-1], rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------- kl
@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
def test_gaussian_expert_kl_matches_torch_closed_form(k, p, dtype, device):
    a, b = make_gaussian(k, p, dtype, device, seed=7), make_gaussian(2, p, dtype, device, seed=8)
    x = rounded(rng(9).normal(size=(5, p)), dtype)
    kl = a.kl(b, t(x, dtype, device))
    assert kl.shape == (5, k, 2)
    ma, mb = predictor(a, x), predictor(b, x)
    expected = np.zeros((5, k, 2))
    for i in range(5):
        for j in range(k):
            for l in range(2):
                expected[i, j, l] = torch.distributions.kl_divergence(
                    torch.distributions.Normal(t(ma[i, j]), t(n(a.scale)[j])),
                    torch.distributions.Normal(t(mb[i, l]), t(n(b.scale)[l])),
                )
    assert_close(kl, expected, **TOL[dtype])
    self_kl = a.kl(a, t(x, dtype, device))
    assert_close(torch.diagonal(self_kl, dim1=1, dim2=2), np.zeros((5, k)), rtol=0, atol=TOL[dtype]["atol"])


@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
def test_logistic_expert_kl_matches_torch_closed_form(k, p, dtype, device):
    a, b = make_logistic(k, p, dtype, device, seed=7), make_logistic(2, p, dtype, device, seed=8)
    x = rounded(rng(9).normal(scale=2.0, size=(5, p)), dtype)
    kl = a.kl(b, t(x, dtype, device))
    assert kl.shape == (5, k, 2)
    ea, eb = predictor(a, x), predictor(b, x)
    expected = np.zeros((5, k, 2))
    for i in range(5):
        for j in range(k):
            for l in range(2):
                expected[i, j, l] = torch.distributions.kl_divergence(
                    torch.distributions.Bernoulli(logits=t(ea[i, j])), torch.distributions.Bernoulli(logits=t(eb[i, l]))
                )
    assert_close(kl, expected, **TOL[dtype])
    self_kl = a.kl(a, t(x, dtype, device))
    assert_close(torch.diagonal(self_kl, dim1=1, dim2=2), np.zeros((5, k)), rtol=0, atol=TOL[dtype]["atol"])


@parametrize_device
def test_expert_kl_matches_monte_carlo(device):
    """One extra, fully independent check of both expert KLs on a single covariate row."""
    x = t(rng(10).normal(size=(1, 2)), device=device)
    m = 200_000
    gen = torch.Generator(device=device).manual_seed(0)
    for make in (make_gaussian, make_logistic):
        a, b = make(2, 2, device=device, seed=11), make(2, 2, device=device, seed=12)
        kl = n(a.kl(b, x))[0]
        for j in range(2):
            xs = x.expand(m, 2)
            ys = a.sample(torch.full((m,), j, device=device), xs, generator=gen)
            ratio = n(a.log_prob((xs, ys))[:, j : j + 1] - b.log_prob((xs, ys)))
            mc, se = ratio.mean(0), ratio.std(0) / np.sqrt(m)
            assert np.all(np.abs(kl[j] - mc) <= 5 * se + 1e-6), (make.__name__, j, kl[j], mc, se)


# ----------------------------------------------------------- pyro / sample
@parametrize_device
@parametrize_dtype
@parametrize_p
@parametrize_k
@pytest.mark.parametrize("family", ["gaussian", "logistic"])
def test_pyro_dist_enumeration_index_broadcasts(k, p, dtype, device, family):
    comp = (make_gaussian if family == "gaussian" else make_logistic)(k, p, dtype, device)
    r = rng(11)
    x = t(r.normal(size=(25, p)), dtype, device)
    y = t(r.normal(size=25) if family == "gaussian" else r.integers(0, 2, size=25), dtype, device)
    fn = comp.pyro_dist(torch.arange(k, device=device)[:, None], x=x)
    assert fn.batch_shape == (k, 25)
    lp = fn.log_prob(y)
    assert lp.shape == (k, 25)
    assert_close(lp, comp.log_prob((x, y)).T, **TOL[dtype])
    full = comp.pyro_dist(x=x)
    assert full.batch_shape == (25, k)
    assert_close(full.log_prob(y[:, None]), comp.log_prob((x, y)), **TOL[dtype])
    with pytest.raises(ValueError, match="x"):
        comp.pyro_dist(torch.arange(k, device=device)[:, None])


@parametrize_device
@parametrize_dtype
@parametrize_k
@pytest.mark.parametrize("family", ["gaussian", "logistic"])
def test_sample_shape_and_moments(k, dtype, device, family):
    comp = (make_gaussian if family == "gaussian" else make_logistic)(k, 2, dtype, device)
    x_row = rng(12).normal(size=(1, 2))
    m = 40_000
    index = torch.arange(k, device=device).repeat_interleave(m)
    xs = t(np.repeat(x_row, k * m, axis=0), dtype, device)
    ys = comp.sample(index, xs, generator=torch.Generator(device=device).manual_seed(0))
    assert ys.shape == (k * m,)
    ys = n(ys).reshape(k, m)
    eta = predictor(comp, rounded(x_row, dtype))[0]
    if family == "gaussian":
        scale = n(comp.scale)
        assert np.all(np.abs(ys.mean(1) - eta) <= 5 * scale / np.sqrt(m))
        assert np.all(np.abs(ys.var(1) / scale**2 - 1) <= 5 * np.sqrt(2 / m))
    else:
        prob = sp.expit(eta)
        assert set(np.unique(ys)) <= {0.0, 1.0}
        assert np.all(np.abs(ys.mean(1) - prob) <= 5 * np.sqrt(prob * (1 - prob) / m))
    a = comp.sample(index[:30], xs[:30], generator=torch.Generator(device=device).manual_seed(5))
    b = comp.sample(index[:30], xs[:30], generator=torch.Generator(device=device).manual_seed(5))
    assert torch.equal(a, b)


@parametrize_device
@pytest.mark.parametrize("family", ["gaussian", "logistic"])
def test_default_parameters_follow_coef_device_and_dtype(device, family):
    cls = GaussianExpert if family == "gaussian" else LogisticExpert
    comp = cls(torch.ones(2, 3, dtype=torch.float64, device=device))
    for name in comp.param_names:
        value = getattr(comp, name)
        assert value.device == comp.coef.device and value.dtype == torch.float64, name
    x = torch.randn(4, 3, dtype=torch.float64, device=device)
    y = torch.ones(4, dtype=torch.float64, device=device)
    assert comp.log_prob((x, y)).shape == (4, 2)


@pytest.mark.parametrize("n_nodes", [1, 3, 8])
def test_gaussian_expert_response_quadrature_integrates_polynomials_exactly(n_nodes):
    """Gauss-Hermite with n nodes is exact for E[y^j], j < 2n: compare with the normal's raw moments."""
    scale = torch.tensor([0.5, 2.0], dtype=torch.float64)
    experts = GaussianExpert(torch.zeros(2, 1, dtype=torch.float64), scale=scale)
    eta, index = torch.tensor([1.5, -0.7, 0.3], dtype=torch.float64), torch.tensor([0, 1, 1])
    values, weights = experts.response_quadrature(eta, index, n_nodes)
    assert values.shape == weights.shape == (3, n_nodes)
    for row in range(3):
        law = st.norm(float(eta[row]), float(experts.scale[index[row]]))
        for power in range(2 * n_nodes):
            expected = law.moment(power)
            got = float((weights[row] * values[row] ** power).sum())
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_gaussian_expert_response_quadrature_rejects_no_nodes():
    with pytest.raises(ValueError, match="n_nodes"):
        GaussianExpert(torch.zeros(1, 1)).response_quadrature(torch.zeros(1), torch.tensor([0]), 0)


def test_logistic_expert_response_quadrature_is_the_bernoulli_law():
    experts = LogisticExpert(torch.zeros(1, 1, dtype=torch.float64))
    eta = torch.tensor([-3.0, 0.0, 40.0], dtype=torch.float64)
    values, weights = experts.response_quadrature(eta, torch.zeros(3, dtype=torch.long))
    assert values.tolist() == [0.0, 1.0]
    np.testing.assert_allclose(weights[:, 1].numpy(), sp.expit(eta.numpy()), rtol=1e-12)
    np.testing.assert_allclose(weights.sum(1).numpy(), 1.0, rtol=1e-12)
