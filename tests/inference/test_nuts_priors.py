"""The closed-form prior log-densities of NUTS's potential (:mod:`ppmix.engines.nuts_priors`) equal the
distributions' own ``log_prob`` at random parameters and values (with a leading chain dimension), and cover every
prior of the programs that have a potential of their own."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.engines.nuts_priors import closed_form, closed_form_derivative
from ppmix.engines.potential import likelihood_potential
from tests.inference.test_potential import CASES, _fitted


def _positive(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float64) * 3 + 0.2


PRIORS = {
    "normal": lambda g: dist.Normal(torch.randn(3, generator=g, dtype=torch.float64), _positive(g, 3)).to_event(1),
    "gamma": lambda g: dist.Gamma(_positive(g, 2, 3), _positive(g, 2, 3)),
    "beta": lambda g: dist.Beta(_positive(g, 3), _positive(g, 3)),
    "dirichlet": lambda g: dist.Dirichlet(_positive(g, 2, 4)),
    "inverse_gamma": lambda g: dist.InverseGamma(_positive(g, 3), _positive(g, 3)),
    "sqrt_inverse_gamma": lambda g: dist.TransformedDistribution(
        dist.InverseGamma(_positive(g, 3), _positive(g, 3)), [dist.transforms.PowerTransform(0.5)]
    ).to_event(1),
    "lognormal": lambda g: dist.LogNormal(torch.randn(3, generator=g, dtype=torch.float64), _positive(g, 3)),
    "lkj_cholesky": lambda g: dist.LKJCholesky(3, _positive(g, 2)),
}


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(sorted(PRIORS)), seed=st.integers(0, 2**16))
def test_the_closed_form_is_the_distributions_log_prob(name, seed):
    """At random parameters, on values drawn from the prior for four chains at once."""
    gen = torch.Generator().manual_seed(seed)
    prior = PRIORS[name](gen)
    torch.manual_seed(seed)
    value = prior.sample((4,))
    expected = prior.log_prob(value)
    density = closed_form(prior)
    assert density is not None
    got = density(value)
    if isinstance(prior, dist.Independent):
        got = got.reshape(*expected.shape, -1).sum(-1)
    # a pushforward's log_prob (Pyro's chain of power and exp transforms and their log-Jacobians) rounds at ~1e-7
    # relative in the tails; the closed forms of the plain families are equal to 1e-10
    base = prior.base_dist if isinstance(prior, dist.Independent) else prior
    tolerance = 1e-6 if isinstance(base, dist.TransformedDistribution) else 1e-10
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(sorted(set(PRIORS) - {"dirichlet", "lkj_cholesky"})), seed=st.integers(0, 2**16))
def test_the_closed_form_derivative_is_autograds(name, seed):
    """The univariate families' value equals :func:`closed_form`'s and its derivative autograd's of it, at values
    drawn from the prior for four chains at once; a multivariate family has none."""
    gen = torch.Generator().manual_seed(seed)
    prior = PRIORS[name](gen)
    torch.manual_seed(seed)
    value = prior.sample((4,)).requires_grad_()
    expected = closed_form(prior)(value)
    (expected_derivative,) = torch.autograd.grad(expected.sum(), value)
    got, derivative = closed_form_derivative(prior)(value.detach())
    torch.testing.assert_close(got, expected.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(derivative, expected_derivative, rtol=1e-10, atol=1e-10)
    assert closed_form_derivative(PRIORS["dirichlet"](gen)) is None


def test_an_unknown_family_has_no_closed_form():
    assert closed_form(dist.Laplace(torch.zeros(2), torch.ones(2))) is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_prior_of_a_potential_has_its_closed_form(case):
    """No site of the models with a potential of their own falls back to ``log_prob``."""
    model, data = _fitted(case)
    with model.bayesian():
        potential = likelihood_potential(model, data)
    missing = [name for name, site in potential.sites.items() if closed_form(site.prior) is None]
    assert missing == []
