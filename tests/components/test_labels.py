"""BernoulliLabel and CategoricalLabel against scipy.stats / numpy oracles."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
import torch

from ppmix.components import BernoulliLabel, CategoricalLabel
from ppmix.components.divergence import kl_divergence
from tests.common import assert_close
from tests.components._util import (
    TOL,
    assert_kl_matches_monte_carlo,
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

C_PARAMS = pytest.mark.parametrize("c", [pytest.param(2, id="C2"), pytest.param(4, id="C4")])


def make_bernoulli(k, dtype=torch.float64, device="cpu", seed=0):
    return BernoulliLabel(t(rng(seed).uniform(0.1, 0.9, size=k), dtype, device))


def make_categorical(k, c, dtype=torch.float64, device="cpu", seed=0):
    return CategoricalLabel(t(rng(seed).dirichlet(np.full(c, 2.0), size=k), dtype, device))


# ----------------------------------------------------------------- Bernoulli
@parametrize_device
@parametrize_dtype
@parametrize_k
def test_bernoulli_log_prob_matches_scipy(k, dtype, device):
    lab = make_bernoulli(k, dtype, device)
    y = rng(1).integers(0, 2, size=30)
    lp = lab.log_prob(t(y, dtype, device))
    assert lp.shape == (30, k) and lp.dtype == dtype
    p = n(lab.probs)
    assert_close(lp, np.stack([st.bernoulli.logpmf(y, p[j]) for j in range(k)], axis=1), **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
def test_bernoulli_log_prob_soft_labels(k, dtype, device):
    lab = make_bernoulli(k, dtype, device)
    y = rounded(rng(2).uniform(0.01, 0.99, size=30), dtype)
    p = n(lab.probs)
    expected = y[:, None] * np.log(p)[None] + (1 - y[:, None]) * np.log1p(-p)[None]
    assert_close(lab.log_prob(t(y, dtype, device)), expected, **TOL[dtype])


@parametrize_device
@parametrize_dtype
def test_bernoulli_boundary_probs(dtype, device):
    """probs 0 and 1 are accepted by the constructor, so they must give 0 / -inf, not NaN."""
    lab = BernoulliLabel(t([0.0, 1.0, 0.3], dtype, device))
    y = np.array([0.0, 1.0])
    expected = np.stack([st.bernoulli.logpmf(y, p) for p in (0.0, 1.0, 0.3)], axis=1)
    lp = n(lab.log_prob(t(y, dtype, device)))
    assert not np.isnan(lp).any(), lp
    assert_close(lp, expected, **TOL[dtype])
    kl = n(kl_divergence(lab, lab))
    assert not np.isnan(kl).any(), kl
    assert_close(np.diagonal(kl), np.zeros(3), rtol=0, atol=TOL[dtype]["atol"])


@parametrize_device
@parametrize_dtype
@parametrize_k
def test_bernoulli_fit_one_hot_equals_group_frequency(k, dtype, device):
    r = rng(3)
    z = group_labels(r, 100, k)
    y = r.integers(0, 2, size=100)
    y[:k], y[k : 2 * k] = 0, 1  # every group sees both labels (the eps clamp must not bite)
    z[:k], z[k : 2 * k] = np.arange(k), np.arange(k)
    lab = make_bernoulli(k, dtype, device).fit(t(y, dtype, device), t(one_hot(z, k), dtype, device))
    assert_close(lab.probs, [y[z == j].mean() for j in range(k)], **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
@pytest.mark.parametrize("soft", [pytest.param(False, id="hard"), pytest.param(True, id="soft")])
def test_bernoulli_fit_fractional_weights(k, dtype, device, soft):
    r = rng(4)
    y = rounded(r.uniform(0.0, 1.0, size=80) if soft else r.integers(0, 2, size=80), dtype)
    w = rounded(fractional_weights(r, 80, k), dtype)
    lab = make_bernoulli(k, dtype, device).fit(t(y, dtype, device), t(w, dtype, device))
    assert_close(lab.probs, [np.average(y, weights=w[:, j]) for j in range(k)], **TOL[dtype])


@parametrize_device
@parametrize_k
def test_bernoulli_kl_matches_monte_carlo(k, device):
    p, q = make_bernoulli(k, device=device, seed=5), make_bernoulli(2, device=device, seed=6)
    assert_kl_matches_monte_carlo(p, q)


@parametrize_device
@parametrize_dtype
@parametrize_k
def test_bernoulli_kl_with_itself_has_zero_diagonal(k, dtype, device):
    lab = make_bernoulli(k, dtype, device)
    assert_close(torch.diagonal(kl_divergence(lab, lab)), np.zeros(k), rtol=0, atol=TOL[dtype]["atol"])


@parametrize_device
@parametrize_dtype
@parametrize_k
def test_bernoulli_pyro_dist_enumeration_index_broadcasts(k, dtype, device):
    lab = make_bernoulli(k, dtype, device)
    y = t(rng(8).integers(0, 2, size=25), dtype, device)
    fn = lab.pyro_dist(torch.arange(k, device=device)[:, None])
    assert fn.batch_shape == (k, 1)
    lp = fn.log_prob(y)
    assert lp.shape == (k, 25)
    assert_close(lp, lab.log_prob(y).T, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
def test_bernoulli_sample_shape_and_mean(k, dtype, device):
    lab = make_bernoulli(k, dtype, device)
    assert lab.sample(torch.zeros(3, 4, dtype=torch.long, device=device)).shape == (3, 4)
    m = 40_000
    index = torch.arange(k, device=device).repeat_interleave(m)
    ys = n(lab.sample(index, generator=torch.Generator(device=device).manual_seed(0))).reshape(k, m)
    assert set(np.unique(ys)) <= {0.0, 1.0}
    p = n(lab.probs)
    assert np.all(np.abs(ys.mean(1) - p) <= 5 * np.sqrt(p * (1 - p) / m))
    again = lab.sample(index[:50], generator=torch.Generator(device=device).manual_seed(3))
    assert torch.equal(again, lab.sample(index[:50], generator=torch.Generator(device=device).manual_seed(3)))


# --------------------------------------------------------------- Categorical
@parametrize_device
@parametrize_dtype
@parametrize_k
@C_PARAMS
def test_categorical_log_prob_matches_torch(k, c, dtype, device):
    lab = make_categorical(k, c, dtype, device)
    y = rng(1).integers(0, c, size=30)
    lp = lab.log_prob(torch.as_tensor(y, device=device))
    assert lp.shape == (30, k) and lp.dtype == dtype
    expected = np.stack(
        [n(torch.distributions.Categorical(probs=t(n(lab.probs[j]))).log_prob(torch.as_tensor(y))) for j in range(k)],
        axis=1,
    )
    assert_close(lp, expected, **TOL[dtype])
    # one-hot rows are the same labels
    assert_close(lab.log_prob(t(one_hot(y, c), dtype, device)), expected, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
@C_PARAMS
def test_categorical_fit_one_hot_equals_group_frequency(k, c, dtype, device):
    r = rng(3)
    z = group_labels(r, 200, k, min_size=c)
    y = r.integers(0, c, size=200)
    # every class in every group so the eps floor does not bite
    head = np.arange(k * c)
    z[head], y[head] = head // c, head % c
    lab = make_categorical(k, c, dtype, device).fit(torch.as_tensor(y, device=device), t(one_hot(z, k), dtype, device))
    freq = np.stack([np.bincount(y[z == j], minlength=c) / np.sum(z == j) for j in range(k)])
    assert_close(lab.probs, freq, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
@C_PARAMS
def test_categorical_fit_fractional_weights_soft_labels(k, c, dtype, device):
    r = rng(4)
    y = rounded(r.dirichlet(np.ones(c), size=90), dtype)
    w = rounded(fractional_weights(r, 90, k), dtype)
    lab = make_categorical(k, c, dtype, device).fit(t(y, dtype, device), t(w, dtype, device))
    expected = np.stack([np.average(y, axis=0, weights=w[:, j]) for j in range(k)])
    expected /= expected.sum(1, keepdims=True)
    assert_close(lab.probs, expected, **TOL[dtype])


@parametrize_device
@parametrize_k
@C_PARAMS
def test_categorical_kl_matches_monte_carlo(k, c, device):
    p, q = make_categorical(k, c, device=device, seed=5), make_categorical(2, c, device=device, seed=6)
    assert_kl_matches_monte_carlo(p, q)


@parametrize_device
@parametrize_dtype
@parametrize_k
@C_PARAMS
def test_categorical_kl_with_itself_has_zero_diagonal(k, c, dtype, device):
    lab = make_categorical(k, c, dtype, device)
    assert_close(torch.diagonal(kl_divergence(lab, lab)), np.zeros(k), rtol=0, atol=TOL[dtype]["atol"])


@parametrize_device
@parametrize_dtype
@parametrize_k
@C_PARAMS
def test_categorical_pyro_dist_enumeration_index_broadcasts(k, c, dtype, device):
    lab = make_categorical(k, c, dtype, device)
    y = torch.as_tensor(rng(8).integers(0, c, size=25), device=device)
    fn = lab.pyro_dist(torch.arange(k, device=device)[:, None])
    assert fn.batch_shape == (k, 1)
    lp = fn.log_prob(y)
    assert lp.shape == (k, 25)
    assert_close(lp, lab.log_prob(y).T, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
@C_PARAMS
def test_categorical_sample_shape_and_frequencies(k, c, dtype, device):
    lab = make_categorical(k, c, dtype, device)
    assert lab.sample(torch.zeros(3, 4, dtype=torch.long, device=device)).shape == (3, 4)
    m = 40_000
    index = torch.arange(k, device=device).repeat_interleave(m)
    ys = n(lab.sample(index, generator=torch.Generator(device=device).manual_seed(0))).reshape(k, m)
    freq = np.stack([np.bincount(ys[j].astype(int), minlength=c) / m for j in range(k)])
    p = n(lab.probs)
    assert freq.shape == p.shape
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / m))
    again = lab.sample(index[:50], generator=torch.Generator(device=device).manual_seed(3))
    assert torch.equal(again, lab.sample(index[:50], generator=torch.Generator(device=device).manual_seed(3)))
