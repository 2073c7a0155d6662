"""DiagGaussian against scipy.stats / numpy oracles."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
import torch

from ppmix.components import DiagGaussian
from ppmix.components.centred import CentredData
from ppmix.components.divergence import kl_divergence
from tests.common import assert_close
from tests.components._util import (
    TOL,
    assert_kl_matches_monte_carlo,
    assert_pyro_dist_matches_log_prob,
    fractional_weights,
    group_labels,
    n,
    one_hot,
    parametrize_d,
    parametrize_device,
    parametrize_dtype,
    parametrize_k,
    rng,
    rounded,
    t,
)


def make(k, d, dtype=torch.float64, device="cpu", seed=0, reg_covar=1e-6):
    r = rng(seed)
    loc = r.normal(scale=2.0, size=(k, d))
    scale = r.uniform(0.5, 1.5, size=(k, d))
    return DiagGaussian(t(loc, dtype, device), t(scale, dtype, device), reg_covar=reg_covar)


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_log_prob_matches_scipy_norm(k, d, dtype, device):
    comp = make(k, d, dtype, device)
    x = rounded(rng(1).normal(scale=2.5, size=(40, d)), dtype)
    lp = comp.log_prob(t(x, dtype, device))
    assert lp.shape == (40, k) and lp.dtype == dtype
    loc, scale = n(comp.loc), n(comp.scale)
    expected = np.stack([st.norm.logpdf(x, loc[j], scale[j]).sum(-1) for j in range(k)], axis=1)
    assert_close(lp, expected, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_log_prob_accepts_prepared_data(k, d, dtype, device):
    comp = make(k, d, dtype, device)
    x = t(rng(2).normal(size=(30, d)), dtype, device)
    # prepared data are centred at their column mean, a plain tensor at the fitted reference: the same
    # algebra, so equal to rounding; centred at the reference, exactly equal
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert_close(comp.log_prob(comp.prepare(x)), comp.log_prob(x), rtol=tol, atol=tol)
    assert_close(comp.log_prob(CentredData.from_tensor(x, comp.reference)), comp.log_prob(x), rtol=0, atol=0)


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
@pytest.mark.parametrize("reg_covar", [pytest.param(0.0, id="reg0"), pytest.param(1e-3, id="reg1e-3")])
def test_fit_one_hot_equals_group_mle(k, d, dtype, device, reg_covar):
    r = rng(3)
    z = group_labels(r, 120, k)
    centres = r.normal(scale=3.0, size=(k, d))
    x = rounded(centres[z] + r.uniform(0.3, 2.0, size=(k, d))[z] * r.normal(size=(120, d)), dtype)
    comp = make(k, d, dtype, device, reg_covar=reg_covar)
    out = comp.fit(t(x, dtype, device), t(one_hot(z, k), dtype, device))
    assert out is comp
    mean = np.stack([x[z == j].mean(0) for j in range(k)])
    # the floor is a constraint (issue 16): max(variance, reg_covar), not variance + reg_covar
    var = np.maximum(np.stack([x[z == j].var(0, ddof=0) for j in range(k)]), reg_covar)
    assert_close(comp.loc, mean, **TOL[dtype])
    assert_close(comp.scale, np.sqrt(var), **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_fit_fractional_weights_equals_weighted_moments(k, d, dtype, device):
    r = rng(4)
    x = rounded(r.normal(loc=1.0, scale=2.0, size=(150, d)), dtype)
    w = rounded(fractional_weights(r, 150, k), dtype)
    comp = make(k, d, dtype, device, reg_covar=1e-4).fit(t(x, dtype, device), t(w, dtype, device))
    mean = np.stack([np.average(x, axis=0, weights=w[:, j]) for j in range(k)])
    var = np.maximum(np.stack([np.average((x - mean[j]) ** 2, axis=0, weights=w[:, j]) for j in range(k)]), 1e-4)
    assert_close(comp.loc, mean, **TOL[dtype])
    assert_close(comp.scale, np.sqrt(var), **TOL[dtype])


@parametrize_device
@parametrize_d
@parametrize_k
def test_kl_matches_monte_carlo(k, d, device):
    p = make(k, d, device=device, seed=5)
    q = make(2, d, device=device, seed=6)
    assert_kl_matches_monte_carlo(p, q)


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_kl_with_itself_has_zero_diagonal(k, d, dtype, device):
    comp = make(k, d, dtype, device)
    kl = kl_divergence(comp, comp)
    assert kl.shape == (k, k)
    assert_close(torch.diagonal(kl), np.zeros(k), rtol=0, atol=TOL[dtype]["atol"])
    assert (kl >= -TOL[dtype]["atol"]).all()


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_pyro_dist_enumeration_index_broadcasts(k, d, dtype, device):
    comp = make(k, d, dtype, device)
    x = t(rng(8).normal(size=(25, d)), dtype, device)
    assert_pyro_dist_matches_log_prob(comp, x, TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_sample_shape_and_moments(k, d, dtype, device):
    comp = make(k, d, dtype, device)
    assert comp.sample(torch.zeros(3, 4, dtype=torch.long, device=device)).shape == (3, 4, d)
    m = 40_000
    index = torch.arange(k, device=device).repeat_interleave(m)
    xs = n(comp.sample(index, generator=torch.Generator(device=device).manual_seed(0))).reshape(k, m, d)
    loc, scale = n(comp.loc), n(comp.scale)
    assert np.all(np.abs(xs.mean(1) - loc) <= 5 * scale / np.sqrt(m))
    assert np.all(np.abs(xs.var(1) / scale**2 - 1) <= 5 * np.sqrt(2 / m))


@parametrize_device
@parametrize_dtype
def test_sample_same_seed_same_draws(dtype, device):
    comp = make(3, 2, dtype, device)
    index = torch.tensor([0, 2, 1, 1, 0], device=device)
    a = comp.sample(index, generator=torch.Generator(device=device).manual_seed(11))
    b = comp.sample(index, generator=torch.Generator(device=device).manual_seed(11))
    c = comp.sample(index, generator=torch.Generator(device=device).manual_seed(12))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_feature_weighted_log_prob_is_the_weighted_sum_of_feature_terms():
    g = torch.Generator().manual_seed(3)
    comp = DiagGaussian(
        torch.randn(3, 4, generator=g, dtype=torch.float64), torch.rand(3, 4, generator=g, dtype=torch.float64) + 0.5
    )
    x = torch.randn(7, 4, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, 0.0, 0.25, 0.7], dtype=torch.float64)
    per_feature = torch.distributions.Normal(comp.loc, comp.scale).log_prob(x[:, None, :])  # (N, K, D)
    torch.testing.assert_close(comp.log_prob(x, feature_weights=w), (per_feature * w).sum(-1))
    torch.testing.assert_close(comp.log_prob(x, feature_weights=torch.ones(4, dtype=torch.float64)), comp.log_prob(x))


def test_fitted_feature_log_likelihood_equals_the_direct_sum():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50, 3, generator=g, dtype=torch.float64) * 2 + 1
    weights = torch.rand(50, 2, generator=g, dtype=torch.float64)
    comp = DiagGaussian(torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64), reg_covar=1e-3)
    comp.fit(x, weights)
    per_feature = torch.distributions.Normal(comp.loc, comp.scale).log_prob(x[:, None, :])  # (N, K, D)
    direct = (weights[:, :, None] * per_feature).sum(0)
    torch.testing.assert_close(comp.fitted_feature_log_likelihood(weights.sum(0)), direct)
