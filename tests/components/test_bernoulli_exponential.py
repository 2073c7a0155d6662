"""The Bernoulli and exponential families' own known answers (the structures and engines are tested for every
family by ``tests/components/test_families.py`` and the contract suite, through ``FAMILY_DATA``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from ppmix import Mixture
from ppmix.components.bernoulli import BernoulliComponents
from ppmix.components.divergence import kl_divergence
from ppmix.components.exponential import ExponentialComponents
from tests.common import assert_close

RNG = np.random.default_rng(0)


def test_bernoulli_log_prob_is_scipys():
    probs, x = RNG.uniform(0.05, 0.95, size=(3, 4)), (RNG.random((10, 4)) < 0.5).astype(float)
    expected = np.stack([stats.bernoulli.logpmf(x, probs[k]).sum(1) for k in range(3)], axis=1)
    assert_close(BernoulliComponents(torch.as_tensor(probs)).log_prob(torch.as_tensor(x)), expected, rtol=1e-12)


def test_exponential_log_prob_is_scipys():
    rate, x = RNG.uniform(0.2, 5.0, size=(3, 4)), RNG.exponential(1.0, size=(10, 4))
    expected = np.stack([stats.expon.logpdf(x, scale=1 / rate[k]).sum(1) for k in range(3)], axis=1)
    assert_close(ExponentialComponents(torch.as_tensor(rate)).log_prob(torch.as_tensor(x)), expected, rtol=1e-12)


def test_the_weighted_mles_are_the_closed_forms():
    w = RNG.dirichlet(np.ones(3), size=50)
    binary, positive = (RNG.random((50, 2)) < 0.3).astype(float), RNG.exponential(2.0, size=(50, 2))
    bern = BernoulliComponents(torch.full((3, 2), 0.5, dtype=torch.float64)).fit(
        torch.as_tensor(binary), torch.as_tensor(w)
    )
    assert_close(bern.probs, (w.T @ binary) / w.sum(0)[:, None], rtol=1e-12)
    expo = ExponentialComponents(torch.ones(3, 2, dtype=torch.float64)).fit(
        torch.as_tensor(positive), torch.as_tensor(w)
    )
    assert_close(expo.rate, w.sum(0)[:, None] / (w.T @ positive), rtol=1e-12)


def test_kl_divergences_are_the_sums_and_integrals_they_define():
    p, q = np.array([[0.2, 0.7]]), np.array([[0.5, 0.5], [0.2, 0.7]])
    brute = [sum(stats.entropy([p[0, d], 1 - p[0, d]], [q[j, d], 1 - q[j, d]]) for d in range(2)) for j in range(2)]
    kl = kl_divergence(BernoulliComponents(torch.as_tensor(p)), BernoulliComponents(torch.as_tensor(q)))
    assert_close(kl[0], brute, rtol=1e-12, atol=1e-15)
    a, b = 2.0, 0.5

    def integrand(t):
        return stats.expon.pdf(t, scale=1 / a) * (
            stats.expon.logpdf(t, scale=1 / a) - stats.expon.logpdf(t, scale=1 / b)
        )

    numeric = integrate.quad(integrand, 0, np.inf)[0]
    kl = kl_divergence(
        ExponentialComponents(torch.tensor([[a]], dtype=torch.float64)),
        ExponentialComponents(torch.tensor([[b]], dtype=torch.float64)),
    )
    assert float(kl) == pytest.approx(numeric, rel=1e-8)


@pytest.mark.parametrize(
    "family, bad, message",
    [("bernoulli", 2.0, "binary values"), ("bernoulli", 0.5, "binary values"), ("exponential", -1.0, "non-negative")],
)
def test_data_outside_the_support_are_an_error_naming_x(family, bad, message):
    x = (RNG.random((30, 2)) < 0.5).astype(float)
    x[4, 1] = bad
    with pytest.raises(ValueError, match=rf"X must .*{message}"):
        Mixture(2, family=family, progress=False).fit(x)
