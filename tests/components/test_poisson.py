"""The Poisson family's own known answers; the structures and engines are tested for every family in
``tests/components/test_families.py`` and ``tests/models/test_contract.py`` (``FAMILY_DATA``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from ppmix import HMM, Mixture
from ppmix.components.divergence import kl_divergence
from ppmix.components.poisson import PoissonComponents
from tests.common import assert_close


def test_log_prob_is_the_sum_of_scipy_poisson_log_pmfs():
    rng = np.random.default_rng(0)
    rate = rng.uniform(0.5, 8.0, size=(3, 4))
    x = rng.poisson(3.0, size=(10, 4)).astype(float)
    expected = np.stack([stats.poisson.logpmf(x, rate[k]).sum(1) for k in range(3)], axis=1)
    assert_close(PoissonComponents(torch.as_tensor(rate)).log_prob(torch.as_tensor(x)), expected, rtol=1e-12)


def test_the_weighted_mle_is_the_weighted_mean_count():
    rng = np.random.default_rng(1)
    x, w = rng.poisson(4.0, size=(50, 2)).astype(float), rng.dirichlet(np.ones(3), size=50)
    comp = PoissonComponents(torch.ones(3, 2, dtype=torch.float64)).fit(torch.as_tensor(x), torch.as_tensor(w))
    assert_close(comp.rate, (w.T @ x) / w.sum(0)[:, None], rtol=1e-12)


def test_kl_is_the_sum_over_the_counts():
    a, b = np.array([[2.0, 5.0]]), np.array([[3.0, 1.5], [2.0, 5.0]])
    counts = np.arange(200)[:, None]
    brute = [
        sum(
            (
                stats.poisson.pmf(counts, a[0, d])
                * (stats.poisson.logpmf(counts, a[0, d]) - stats.poisson.logpmf(counts, b[j, d]))
            ).sum()
            for d in range(2)
        )
        for j in range(2)
    ]
    kl = kl_divergence(PoissonComponents(torch.as_tensor(a)), PoissonComponents(torch.as_tensor(b)))
    assert_close(kl[0], brute, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bad", [-1.0, 0.5], ids=["negative", "fraction"])
def test_data_that_are_not_counts_are_an_error_naming_x(bad):
    x = np.random.default_rng(0).poisson(3.0, size=(20, 2)).astype(float)
    x[3, 1] = bad
    with pytest.raises(ValueError, match=r"X must hold counts"):
        Mixture(2, family="poisson", progress=False).fit(x)
    fitted = Mixture(2, family="poisson", seed=0, progress=False).fit(np.abs(np.round(x)))
    with pytest.raises(ValueError, match=r"X must hold counts"):
        fitted.predict(x)


def test_hmm_log_likelihood_equals_hmmlearn_poisson_hmm_at_the_fitted_parameters():
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    rng = np.random.default_rng(0)
    transition = np.array([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]])
    rates = np.array([[1.0, 8.0], [6.0, 2.0], [15.0, 12.0]])
    seqs = []
    for _ in range(20):
        z = [rng.integers(3)]
        for _ in range(39):
            z.append(rng.choice(3, p=transition[z[-1]]))
        seqs.append(rng.poisson(rates[z]).astype(float))
    model = HMM(3, emission="poisson", seed=0, progress=False).fit(seqs)
    peer = hmmlearn.PoissonHMM(n_components=3)
    peer.startprob_ = model.initial_.numpy()
    peer.transmat_ = model.transition_.numpy()
    peer.lambdas_ = model.components_.rate.numpy()
    expected = peer.score(np.concatenate(seqs), lengths=[len(s) for s in seqs])
    assert model.log_likelihood(seqs) == pytest.approx(expected, rel=1e-8)
    assert_close(np.sort(model.means_[:, 0].numpy()), np.sort(rates[:, 0]), rtol=0.15)
