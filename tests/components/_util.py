"""Parametrisations, tolerances and data generators shared by the component tests.

Oracles are always computed in numpy float64 from the very values (already rounded
to the tested dtype) that the component sees, so the tolerances only have to absorb
the component's own arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ppmix.components.divergence import kl_divergence
from tests.common import DEVICES

DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]
DEVICE_PARAMS = [pytest.param(d, id=d) for d in DEVICES]
K_PARAMS = [pytest.param(1, id="K1"), pytest.param(3, id="K3")]
D_PARAMS = [pytest.param(1, id="D1"), pytest.param(4, id="D4")]

#: tolerances for comparing a component computed in ``dtype`` with a float64 oracle
TOL = {
    torch.float32: {"rtol": 2e-4, "atol": 2e-4},
    torch.float64: {"rtol": 1e-9, "atol": 1e-9},
}

parametrize_dtype = pytest.mark.parametrize("dtype", DTYPES)
parametrize_device = pytest.mark.parametrize("device", DEVICE_PARAMS)
parametrize_k = pytest.mark.parametrize("k", K_PARAMS)
parametrize_d = pytest.mark.parametrize("d", D_PARAMS)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def t(array, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """numpy -> torch on ``device`` in ``dtype``."""
    return torch.as_tensor(np.asarray(array), dtype=dtype, device=device)


def n(tensor) -> np.ndarray:
    """torch -> numpy float64 (the exact values the component used)."""
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.double()
        return tensor.numpy()
    return np.asarray(tensor)


def rounded(array, dtype) -> np.ndarray:
    """``array`` rounded to ``dtype`` and back to float64 (what the component sees)."""
    return n(t(array, dtype))


def random_scale_tril(r: np.random.Generator, k: int, d: int) -> np.ndarray:
    """Well-conditioned lower-triangular factors with a positive diagonal, shape (K, D, D)."""
    tril = np.tril(r.normal(scale=0.4, size=(k, d, d)), -1)
    idx = np.arange(d)
    tril[:, idx, idx] = r.uniform(0.6, 1.6, size=(k, d))
    return tril


def group_labels(r: np.random.Generator, n_points: int, k: int, min_size: int = 5) -> np.ndarray:
    """Random group labels in 0..K-1 where every group has at least ``min_size`` members."""
    z = np.concatenate([np.repeat(np.arange(k), min_size), r.integers(0, k, size=n_points - k * min_size)])
    return r.permutation(z)


def one_hot(z: np.ndarray, k: int) -> np.ndarray:
    return np.eye(k)[z]


def fractional_weights(r: np.random.Generator, n_points: int, k: int) -> np.ndarray:
    """Strictly positive, unnormalised responsibilities (rows need not sum to one)."""
    return r.uniform(0.05, 1.0, size=(n_points, k))


def mc_check(kl: np.ndarray, samples_log_ratio_mean: np.ndarray, samples_log_ratio_se: np.ndarray, n_se: float = 5.0):
    """Assert ``|kl - mc_mean| <= n_se * se`` (plus a tiny floor) elementwise."""
    kl = np.asarray(kl)
    err = np.abs(kl - samples_log_ratio_mean)
    bound = n_se * samples_log_ratio_se + 1e-6
    assert np.all(err <= bound), (
        f"closed-form KL differs from Monte-Carlo estimate:\nkl=\n{kl}\nmc=\n{samples_log_ratio_mean}\n"
        f"|diff|/se=\n{err / np.maximum(samples_log_ratio_se, 1e-300)}"
    )


def assert_kl_matches_monte_carlo(p, q, n_draws: int = 200_000, seed: int = 7) -> None:
    """Closed-form pairwise ``kl_divergence(p, q)`` against ``E_p[log p - log q]`` from ``n_draws`` samples per
    component."""
    kl = kl_divergence(p, q)
    k, k2 = p.n_components, q.n_components
    assert kl.shape == (k, k2)
    gen = torch.Generator(device=p.device).manual_seed(seed)
    means, ses = np.zeros((k, k2)), np.zeros((k, k2))
    for j in range(k):
        draws = p.sample(torch.full((n_draws,), j, dtype=torch.long, device=p.device), generator=gen)
        ratio = n(p.log_prob(draws)[:, j : j + 1] - q.log_prob(draws))
        means[j], ses[j] = ratio.mean(0), ratio.std(0) / np.sqrt(n_draws)
    mc_check(n(kl), means, ses)


def assert_pyro_dist_matches_log_prob(comp, x: torch.Tensor, tol: dict) -> None:
    """``pyro_dist`` with an enumeration-style ``(K, 1)`` index, and with no index, agrees with ``log_prob``."""
    k, d = comp.n_components, x.shape[1]
    fn = comp.pyro_dist(torch.arange(k, device=x.device)[:, None])  # what parallel enumeration hands the model
    assert fn.batch_shape == (k, 1) and fn.event_shape == (d,)
    lp = fn.log_prob(x)
    assert lp.shape == (k, x.shape[0])
    np.testing.assert_allclose(n(lp), n(comp.log_prob(x).T), **tol)
    full = comp.pyro_dist()
    assert full.batch_shape == (k,)
    np.testing.assert_allclose(n(full.log_prob(x[:, None, :])), n(comp.log_prob(x)), **tol)
