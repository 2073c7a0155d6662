"""MAP-EM's numerical M-step of full and tied Gaussian covariances (ppmix.components.gaussian_map)."""

from __future__ import annotations

import pytest
import torch

from ppmix.components.gaussian_map import _CovarianceObjective, covariance_log_prior, map_covariance
from tests.common import assert_close

F64 = torch.float64


def _problem(d: int, seed: int = 0) -> tuple[_CovarianceObjective, torch.Tensor]:
    """An objective on three components (one empty) and a random point with a positive Cholesky diagonal."""
    g = torch.Generator().manual_seed(seed)
    factor = torch.randn(3, d, d, generator=g, dtype=F64)
    scatter = 5 * factor @ factor.mT
    counts = torch.tensor([10.0, 8.0, 0.0], dtype=F64)
    shape, rate = torch.rand(d, generator=g, dtype=F64) + 0.5, torch.rand(d, generator=g, dtype=F64) + 0.1
    objective = _CovarianceObjective(scatter, counts, shape, rate, torch.tensor(1.7, dtype=F64))
    tril = torch.randn(3, d, d, generator=g, dtype=F64).tril()
    tril.diagonal(dim1=-2, dim2=-1).abs_().add_(0.5)
    return objective, tril[:, objective.rows, objective.cols]


@pytest.mark.parametrize("d", [1, 2, 4])
def test_covariance_objective_is_likelihood_plus_log_prior_with_exact_derivatives(d):
    objective, theta = _problem(d)
    tril = objective.tril(theta)
    covariance = tril @ tril.mT
    likelihood = -0.5 * objective.counts * torch.logdet(covariance)
    likelihood = likelihood - 0.5 * (torch.linalg.inv(covariance) * objective.scatter).sum((-2, -1))
    variance = covariance.diagonal(dim1=-2, dim2=-1)
    corr = tril / variance.sqrt()[..., None]
    prior = covariance_log_prior(variance, corr, objective.shape, objective.rate, objective.concentration)
    assert_close(objective.value(theta), likelihood + prior, rtol=1e-12)
    gradient, hessian = objective.derivatives(theta)
    point = theta.clone().requires_grad_(True)
    assert_close(gradient, torch.autograd.grad(objective.value(point).sum(), point)[0], rtol=1e-10, atol=1e-10)
    full = torch.autograd.functional.hessian(lambda t: objective.value(t).sum(), theta)
    assert_close(hessian, torch.stack([full[b, :, b] for b in range(3)]), rtol=1e-10, atol=1e-9)


def test_map_covariance_reaches_the_stationary_point_and_respects_the_floor():
    objective, theta = _problem(3)
    start = objective.tril(theta)
    args = (objective.scatter, objective.counts)
    prior = (objective.shape, objective.rate, objective.concentration)
    tril = map_covariance(*args, start, *prior, 1e-6, max_steps=50)
    found = tril[:, objective.rows, objective.cols]
    assert bool((objective.value(found) > objective.value(theta)).all())
    gradient, hessian = objective.derivatives(found)
    assert float(gradient.abs().max()) < 1e-8
    assert bool((torch.linalg.eigvalsh(hessian) < 0).all())  # a maximum
    # a floor above the unconstrained maximum's variances holds them there
    floor = 2 * tril.square().sum(-1).amax(0)
    floored = map_covariance(*args, start, *prior, floor, max_steps=50)
    assert bool((floored.square().sum(-1) >= floor * (1 - 1e-12)).all())
