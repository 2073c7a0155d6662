"""Mixture-of-Gaussians components (``"gmm"``): an HMM with them is hmmlearn's GMMHMM, iteration by iteration."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hmmlearn.hmm import GMMHMM
from scipy.stats import multivariate_normal

from ppmix import HMM
from ppmix.components.gaussian_mixture import DiagGaussianMixtures, FullGaussianMixtures, GaussianMixtureFamily
from tests.common import assert_close


def _sequences(seed: int = 0) -> list[np.ndarray]:
    """Two states, each emitting from two well-separated Gaussians on the first feature; noise on the second."""
    rng = np.random.default_rng(seed)
    sequences = []
    for _ in range(10):
        first = np.r_[rng.choice([-6.0, -2.0], 20), rng.choice([2.0, 6.0], 20)][:, None]
        sequences.append(np.hstack([first + 0.5 * rng.normal(size=(40, 1)), rng.normal(size=(40, 1))]))
    return sequences


def _covariances(components) -> np.ndarray:
    if isinstance(components, DiagGaussianMixtures):
        return components.scale.square().numpy()
    return (components.scale_tril @ components.scale_tril.mT).numpy()


@pytest.mark.parametrize("cov", ["diag", "full"])
def test_a_baum_welch_iteration_equals_hmmlearns_gmmhmm_up_to_its_centring(cov):
    """One iteration from the same start (its means moved off the optimum): weights, means, transitions
    and the log-likelihood equal hmmlearn's GMMHMM. Its covariances are its scatter about the *previous* means
    (hmmlearn accumulates ``X - means_`` in the E-step), which is EM's scatter about the new means plus the
    outer product of the means' step: ours plus that product must equal hmmlearn's."""
    sequences = _sequences()
    family = GaussianMixtureFamily(n_mix=2, covariance_type=cov, reg_covar=0.0)
    start = HMM(2, emission=family, max_iter=1, seed=0, progress=False)
    ours = HMM(2, emission=family, warm_start=True, tol=0.0, max_iter=1, progress=False)
    x, lengths = np.concatenate(sequences), [len(s) for s in sequences]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start.fit(sequences)
        moved = start._get_globals()
        moved["locs"] = moved["locs"] + 0.3  # away from the optimum, so that the means move in the iteration
        start._set_globals(moved)
        ours.fit(sequences, max_iter=1)
        ours._set_globals(start._get_globals())
        ours.fit(sequences)
        peer = GMMHMM(2, n_mix=2, covariance_type=cov, init_params="", params="stmcw", n_iter=1, tol=-np.inf)
        peer.startprob_, peer.transmat_ = start.initial_.numpy(), start.transition_.numpy()
        fitted = start.components_
        peer.weights_, peer.means_, peer.covars_ = fitted.mix_weights.numpy(), fitted.loc.numpy(), _covariances(fitted)
        peer.fit(x, lengths)
    got = ours.components_
    assert_close(got.mix_weights, peer.weights_, rtol=1e-8, atol=1e-12)
    assert_close(got.loc, peer.means_, rtol=1e-8, atol=1e-12)
    step = (got.loc - fitted.loc).numpy()
    assert np.abs(step).max() > 1e-3  # the means moved: the centring matters
    shift = step**2 if cov == "diag" else step[..., :, None] * step[..., None, :]
    assert_close(_covariances(got) + shift, peer.covars_, rtol=1e-8, atol=1e-12)
    assert_close(ours.transition_, peer.transmat_, rtol=1e-8, atol=1e-9)  # ppmix pads counts by 1e-10
    # both log-likelihoods are of the start (hmmlearn scores before its M-step): ours re-scored at the start
    assert start.log_likelihood(sequences) == pytest.approx(peer.monitor_.history[-1], rel=1e-10)


@pytest.mark.parametrize("components_class", [DiagGaussianMixtures, FullGaussianMixtures])
def test_log_prob_is_the_log_of_the_mixture_density_and_the_program_agrees(components_class):
    rng = np.random.default_rng(1)
    k, m, d = 2, 3, 2
    weights = torch.as_tensor(rng.dirichlet(np.ones(m), size=k))
    loc = torch.as_tensor(rng.normal(scale=3.0, size=(k, m, d)))
    tril = torch.as_tensor(np.tril(rng.normal(scale=0.3, size=(k, m, d, d)), -1)) + torch.diag_embed(
        torch.as_tensor(rng.uniform(0.5, 1.5, size=(k, m, d)))
    )
    spread = tril if components_class is FullGaussianMixtures else torch.diagonal(tril, dim1=-2, dim2=-1)
    components = components_class(weights, loc, spread, reg_covar=0.0)
    x = rng.normal(scale=3.0, size=(50, d))
    covs = _covariances(components)
    want = np.log(
        np.stack(
            [
                sum(
                    weights[j, i].item()
                    * multivariate_normal(loc[j, i].numpy(), covs[j, i] if covs.ndim == 4 else np.diag(covs[j, i])).pdf(
                        x
                    )
                    for i in range(m)
                )
                for j in range(k)
            ],
            axis=1,
        )
    )
    assert_close(components.log_prob(torch.as_tensor(x)), want, rtol=1e-10)
    assert_close(components.pyro_dist().log_prob(torch.as_tensor(x)[:, None, :]), want, rtol=1e-10)


def test_an_hmm_with_mixture_emissions_elbo_is_its_log_likelihood():
    sequences = _sequences(2)
    hmm = HMM(2, emission=GaussianMixtureFamily(n_mix=2, covariance_type="full"), seed=0, progress=False)
    hmm.fit(sequences)
    assert hmm.elbo(sequences) == pytest.approx(hmm.log_likelihood(sequences), rel=1e-10)
    assert np.all(np.diff(hmm.history_) >= -1e-12)
    assert hmm.n_parameters == 1 + 2 + 2 * (1 + 2 * (2 + 3))  # initial, transition, per state: weight + 2 x (mean, cov)


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"n_mix": 0}, "n_mix must be a positive integer"),
        ({"n_mix": 1.5}, "n_mix must be a positive integer"),
        ({"covariance_type": "tied"}, "covariance_type must be one of .* for a mixture emission"),
        ({"reg_covar": -1.0}, "reg_covar"),
    ],
)
def test_bad_settings_are_named(settings, match):
    with pytest.raises(ValueError, match=match):
        HMM(2, emission=GaussianMixtureFamily(**settings), progress=False).fit(_sequences()[:2])
