"""FullGaussian against scipy.stats / numpy oracles."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
import torch

from ppmix.components import FullGaussian
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
    random_scale_tril,
    rng,
    rounded,
    t,
)


def floor_eigenvalues(covs: np.ndarray, floor: float) -> np.ndarray:
    """The covariances with their eigenvalues raised to ``floor`` (the constrained MLE)."""
    values, vectors = np.linalg.eigh(covs)
    return (vectors * np.maximum(values, floor)[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def make(k, d, dtype=torch.float64, device="cpu", seed=0, reg_covar=1e-6):
    r = rng(seed)
    loc = r.normal(scale=2.0, size=(k, d))
    return FullGaussian(t(loc, dtype, device), t(random_scale_tril(r, k, d), dtype, device), reg_covar=reg_covar)


def covariances(comp) -> np.ndarray:
    tril = n(comp.scale_tril)
    return tril @ np.swapaxes(tril, -1, -2)


def correlated_data(r, n_points, d, z=None, k=1):
    """Points with correlated features (one affine map per group when ``z`` is given)."""
    z = np.zeros(n_points, dtype=int) if z is None else z
    maps = random_scale_tril(r, k, d) * 1.5
    centres = r.normal(scale=3.0, size=(k, d))
    eps = r.normal(size=(n_points, d))
    return centres[z] + np.einsum("nij,nj->ni", maps[z], eps)


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_log_prob_matches_scipy_multivariate_normal(k, d, dtype, device):
    comp = make(k, d, dtype, device)
    x = rounded(rng(1).normal(scale=2.5, size=(40, d)), dtype)
    lp = comp.log_prob(t(x, dtype, device))
    assert lp.shape == (40, k) and lp.dtype == dtype
    loc, cov = n(comp.loc), covariances(comp)
    expected = np.stack([np.atleast_1d(st.multivariate_normal(loc[j], cov[j]).logpdf(x)) for j in range(k)], axis=1)
    assert_close(lp, expected, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_log_prob_matches_torch_multivariate_normal(k, d, dtype, device):
    comp = make(k, d, dtype, device, seed=9)
    x = rng(2).normal(scale=2.0, size=(30, d))
    expected = np.stack(
        [
            n(
                torch.distributions.MultivariateNormal(t(n(comp.loc[j])), scale_tril=t(n(comp.scale_tril[j]))).log_prob(
                    t(rounded(x, dtype))
                )
            )
            for j in range(k)
        ],
        axis=1,
    )
    assert_close(comp.log_prob(t(x, dtype, device)), expected, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
@pytest.mark.parametrize("reg_covar", [pytest.param(0.0, id="reg0"), pytest.param(1e-3, id="reg1e-3")])
def test_fit_one_hot_equals_group_mle(k, d, dtype, device, reg_covar):
    r = rng(3)
    z = group_labels(r, 150, k, min_size=2 * d + 2)
    x = rounded(correlated_data(r, 150, d, z, k), dtype)
    comp = make(k, d, dtype, device, reg_covar=reg_covar)
    out = comp.fit(t(x, dtype, device), t(one_hot(z, k), dtype, device))
    assert out is comp
    mean = np.stack([x[z == j].mean(0) for j in range(k)])
    # the floor is a constraint (issue 16): eigenvalues clamped at reg_covar, not reg_covar added
    cov = floor_eigenvalues(np.stack([np.atleast_2d(np.cov(x[z == j].T, ddof=0)) for j in range(k)]), reg_covar)
    assert_close(comp.loc, mean, **TOL[dtype])
    assert_close(covariances(comp), cov, **TOL[dtype])
    # the stored factor is a genuine Cholesky factor
    assert_close(comp.scale_tril, np.linalg.cholesky(cov), **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_d
@parametrize_k
def test_fit_fractional_weights_equals_weighted_covariance(k, d, dtype, device):
    r = rng(4)
    x = rounded(correlated_data(r, 160, d), dtype)
    w = rounded(fractional_weights(r, 160, k), dtype)
    comp = make(k, d, dtype, device, reg_covar=1e-4).fit(t(x, dtype, device), t(w, dtype, device))
    mean = np.stack([np.average(x, axis=0, weights=w[:, j]) for j in range(k)])
    cov = floor_eigenvalues(np.stack([np.atleast_2d(np.cov(x.T, aweights=w[:, j], ddof=0)) for j in range(k)]), 1e-4)
    assert_close(comp.loc, mean, **TOL[dtype])
    assert_close(covariances(comp), cov, **TOL[dtype])


@parametrize_device
@parametrize_dtype
@parametrize_k
@pytest.mark.parametrize("constant", [pytest.param(0.0, id="const0"), pytest.param(3.7, id="const3.7")])
def test_fit_zero_variance_feature_needs_reg_covar(k, dtype, device, constant):
    """A constant feature makes the MLE covariance singular: reg_covar=0 must be refused.

    The constant 3.7 is not reproduced exactly by the column mean, so the centred
    column is a tiny non-zero constant; the covariance is still numerically singular.
    """
    r = rng(5)
    x = r.normal(size=(100, 3))
    x[:, 1] = constant
    w = fractional_weights(r, 100, k)
    comp = make(k, 3, dtype, device, reg_covar=0.0)
    with pytest.raises(ValueError, match="reg_covar"):
        comp.fit(t(x, dtype, device), t(w, dtype, device))

    comp = make(k, 3, dtype, device, reg_covar=1e-6).fit(t(x, dtype, device), t(w, dtype, device))
    cov = covariances(comp)
    assert_close(cov[:, 1, 1], np.full(k, 1e-6), rtol=1e-3, atol=0)
    assert torch.isfinite(comp.log_prob(t(x, dtype, device))).all()


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
    assert_close(torch.diagonal(kl), np.zeros(k), rtol=0, atol=10 * TOL[dtype]["atol"])
    assert (kl >= -10 * TOL[dtype]["atol"]).all()


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
    loc, cov = n(comp.loc), covariances(comp)
    sd = np.sqrt(np.diagonal(cov, axis1=-2, axis2=-1))
    assert np.all(np.abs(xs.mean(1) - loc) <= 5 * sd / np.sqrt(m))
    emp_cov = np.stack([np.atleast_2d(np.cov(xs[j].T, ddof=0)) for j in range(k)])
    # sd of a sample covariance entry is at most sqrt(2 / m) * sd_i * sd_j
    assert np.all(np.abs(emp_cov - cov) <= 5 * np.sqrt(2 / m) * sd[:, :, None] * sd[:, None, :])


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_natural_parameter_and_whitening_paths_agree(dtype, monkeypatch):
    """The natural-parameter path (row blocks of [x, x x^T]) and the whitening fallback (large D) agree."""
    import ppmix.components.gaussian_full as module

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(400, 4, generator=gen) * 2 + 7).to(dtype)
    weights = torch.softmax(torch.randn(400, 3, generator=gen), 1).to(dtype)
    comp = module.FullGaussian(torch.zeros(3, 4, dtype=dtype), torch.eye(4, dtype=dtype).expand(3, 4, 4))
    comp.fit(x, weights)
    moments = (comp.log_prob(x), comp.clone().fit(x, weights).scale_tril)
    monkeypatch.setattr(module, "MOMENTS_BUDGET_BYTES", 0)
    whitened = (comp.log_prob(x), comp.clone().fit(x, weights).scale_tril)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    for a, b in zip(moments, whitened):
        assert_close(a, b, **tol)
