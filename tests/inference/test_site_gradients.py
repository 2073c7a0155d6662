"""A site's prior plus log-Jacobian and its gradient without autograd (:mod:`ppmix.engines.site_gradients`) equal the
autograd path's, at random points of the unconstrained space, for the priors ppmix's programs use under the maps
``biject_to`` builds; the sites it does not cover get None."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro import distributions as dist
from torch.distributions import biject_to, constraints
from torch.distributions.transforms import PowerTransform

from ppmix.engines.nuts_priors import closed_form
from ppmix.engines.site_gradients import site_gradient

F64 = torch.float64
OPTS = {"dtype": F64}


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def _sqrt_inverse_gamma(a: torch.Tensor, b: torch.Tensor) -> dist.Distribution:
    return dist.TransformedDistribution(dist.InverseGamma(a, b), [PowerTransform(_t(0.5))])


#: (prior, support): the priors of ``bayesian()`` (weights, locations, scales, degrees of freedom, rates), on
#: ``positive`` and ``greater_than`` supports
SITES = {
    "dirichlet": (dist.Dirichlet(_t(1.0, 2.0, 0.5)), None),
    "dirichlet-rows": (dist.Dirichlet(torch.ones(2, 3, dtype=F64)), None),
    "normal": (dist.Normal(_t(0.0, 1.0), _t(3.0, 0.5)).to_event(1), None),
    "gamma": (dist.Gamma(_t(2.0, 1.5), _t(0.1, 2.0)), None),
    "gamma-floor": (dist.Gamma(_t(2.0), _t(0.1)), constraints.greater_than(0.5)),
    "sqrt-inverse-gamma": (_sqrt_inverse_gamma(_t(1.0, 1.0), _t(0.04, 0.3)).to_event(1), None),
    "sqrt-inverse-gamma-floor": (_sqrt_inverse_gamma(_t(1.0), _t(0.04)), constraints.greater_than(1e-3)),
    "inverse-gamma": (dist.InverseGamma(_t(3.0), _t(2.0)), None),
    "log-normal": (dist.LogNormal(_t(0.0), _t(1.0)), None),
}


def _transform(prior, support):
    return biject_to(prior.support if support is None else support)


def _autograd(prior, transform, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = u.clone().requires_grad_()
    value = transform(leaf)
    density = closed_form(prior) or prior.log_prob
    chains = u.shape[0]
    h = density(value).reshape(chains, -1).sum(-1) + transform.log_abs_det_jacobian(leaf, value).reshape(
        chains, -1
    ).sum(-1)
    (grad,) = torch.autograd.grad(h.sum(), leaf)
    return h.detach(), grad


@pytest.mark.parametrize("name", sorted(SITES))
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), spread=st.floats(0.1, 4.0))
def test_the_site_gradient_equals_autograd(name, seed, spread):
    prior, support = SITES[name]
    transform = _transform(prior, support)
    fn = site_gradient(prior, transform, OPTS)
    assert fn is not None
    shape = (3, *transform.inverse_shape(prior.batch_shape + prior.event_shape))
    u = spread * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    h, grad, value, derivative = fn(u)
    expected_h, expected_grad = _autograd(prior, transform, u)
    torch.testing.assert_close(h, expected_h, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(value, transform(u), rtol=1e-12, atol=1e-12)
    if derivative is not None:  # an element-wise map's derivative
        leaf = u.clone().requires_grad_()
        (expected,) = torch.autograd.grad(transform(leaf).sum(), leaf)
        torch.testing.assert_close(derivative, expected, rtol=1e-12, atol=1e-12)
    else:
        assert isinstance(transform, torch.distributions.transforms.StickBreakingTransform)


@pytest.mark.parametrize(
    "prior, support",
    [
        (dist.LKJCholesky(3, _t(2.0)), None),  # the map mixes coordinates
        (dist.HalfCauchy(_t(1.0)), None),  # no closed form
        (dist.Normal(_t(0.0), _t(1.0)), constraints.interval(-1.0, 1.0)),  # a sigmoid map: not covered
    ],
)
def test_other_sites_get_none(prior, support):
    assert site_gradient(prior, _transform(prior, support), OPTS) is None
