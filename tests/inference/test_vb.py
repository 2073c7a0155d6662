"""Variational-Bayes EM (``engine="vb"``): every iteration equals scikit-learn's ``BayesianGaussianMixture`` from
the same responsibilities; unsupported components lose their weight; priors are checked; fits save and load."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import betaln, gammaln
from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

from ppmix import GMM, HMM, Mixture, MixtureOfExperts
from ppmix.engines.result import ConvergenceWarning
from ppmix.engines.vb import expected_log_weights, mean_weights, weight_posterior

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
TOL = 1e-8


def _data(seed: int = 0, n: int = 300) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[-4.0, 0.0, 1.0], [3.0, 3.0, -1.0], [0.0, -4.0, 2.0]])
    x = centres[rng.integers(3, size=n)] + rng.normal(size=(n, 3)) @ np.array(
        [[1.0, 0.3, 0.0], [0.0, 0.8, 0.2], [0.0, 0.0, 0.5]]
    )
    return x * np.array([1.0, 10.0, 0.1])  # features of different scales


def _start(n: int, k: int, seed: int = 1) -> np.ndarray:
    """Soft responsibilities, the same for both fits."""
    return np.random.default_rng(seed).dirichlet(np.ones(k), size=n)


def _sklearn_fit(x, resp, covariance_type, prior_type, max_iter, **kwargs) -> BayesianGaussianMixture:
    """scikit-learn's fit of ``max_iter`` iterations from the responsibilities ``resp`` (its start replaced)."""
    bgm = BayesianGaussianMixture(
        n_components=resp.shape[1],
        covariance_type=covariance_type,
        weight_concentration_prior_type=prior_type,
        max_iter=max_iter,
        tol=0.0,
        reg_covar=0.0,
        **kwargs,
    )
    bgm._initialize_parameters = lambda X, random_state, xp=None: bgm._initialize(X, resp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SklearnConvergenceWarning)
        return bgm.fit(x)


def _ppmix_fit(x, resp, covariance_type, prior_type, max_iter, **kwargs) -> GMM:
    gmm = GMM(
        resp.shape[1],
        covariance_type=covariance_type,
        weight_concentration_prior_type=prior_type,
        reg_covar=0.0,
        tol=0.0,
        seed=0,
        progress=False,
        **{k: v for k, v in kwargs.items() if k == "weight_concentration_prior"},
    )
    gmm._vb_initial_responsibilities = lambda data, generator: torch.as_tensor(resp)
    component_prior = {k: v for k, v in kwargs.items() if k != "weight_concentration_prior"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gmm.fit(x, engine="vb", max_iter=max_iter, component_prior=component_prior or None)


def _close(actual, expected, name: str) -> None:
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(actual, expected, rtol=TOL, atol=TOL * np.abs(expected).max(), err_msg=name)


def _compare(gmm: GMM, bgm: BayesianGaussianMixture, covariance_type: str, n: int) -> None:
    posterior = gmm.variational_posterior_
    _close(np.asarray(gmm.history_) * n, np.ravel(bgm.lower_bounds_), "lower bounds")  # tied: (1,) each
    _close(gmm.weights_, bgm.weights_, "weights")
    _close(gmm.means_, bgm.means_, "means")
    _close(posterior["mean_precision"], bgm.mean_precision_, "mean precision")
    _close(posterior["degrees_of_freedom"], bgm.degrees_of_freedom_, "degrees of freedom")
    _close(posterior["covariances"], bgm.covariances_, "covariances")
    precisions = gmm.precisions_.numpy()
    if covariance_type == "tied":
        precisions = precisions[0]
    elif covariance_type == "spherical":
        precisions = precisions[:, 0]
    _close(precisions, bgm.precisions_, "precisions")
    concentration = posterior["weight_concentration"].numpy()
    expected = np.stack(bgm.weight_concentration_) if concentration.ndim == 2 else bgm.weight_concentration_
    _close(concentration, expected, "weight concentration")


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_every_iteration_equals_sklearn(covariance_type: str, prior_type: str) -> None:
    """Known answer: from the same responsibilities, the lower bound, weights, means and precisions after each of
    1..5 iterations equal scikit-learn's ``BayesianGaussianMixture`` (its default priors) to 1e-8."""
    x = _data()
    resp = _start(x.shape[0], 5)
    for max_iter in range(1, 6):
        bgm = _sklearn_fit(x, resp, covariance_type, prior_type, max_iter)
        gmm = _ppmix_fit(x, resp, covariance_type, prior_type, max_iter)
        assert gmm.n_iter_ == bgm.n_iter_ == max_iter
        _compare(gmm, bgm, covariance_type, x.shape[0])


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_given_priors_equal_sklearn(covariance_type: str) -> None:
    """Known answer with every prior given (not the defaults): 20 iterations equal scikit-learn's."""
    x = _data(seed=3)
    d = x.shape[1]
    covariance = {
        "full": np.diag([2.0, 50.0, 0.05]) + 0.01,
        "tied": np.diag([2.0, 50.0, 0.05]) + 0.01,
        "diag": np.array([2.0, 50.0, 0.05]),
        "spherical": 3.0,
    }[covariance_type]
    prior = {
        "weight_concentration_prior": 0.05,
        "mean_precision_prior": 0.3,
        "mean_prior": np.array([1.0, -2.0, 0.5]),
        "degrees_of_freedom_prior": d + 1.5,
        "covariance_prior": covariance,
    }
    resp = _start(x.shape[0], 6, seed=2)
    bgm = _sklearn_fit(x, resp, covariance_type, "dirichlet_process", 20, **prior)
    gmm = _ppmix_fit(x, resp, covariance_type, "dirichlet_process", 20, **prior)
    _compare(gmm, bgm, covariance_type, x.shape[0])


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_planted_three_components_keep_the_weight(covariance_type: str, prior_type: str) -> None:
    """Planted data with 3 well-separated components, K = 10: at most 3 components keep weight above 1 %, and
    the lower bound never decreases."""
    rng = np.random.default_rng(0)
    centres = np.array([[-8.0, 0.0], [8.0, 0.0], [0.0, 10.0]])
    x = centres[rng.integers(3, size=600)] + rng.normal(size=(600, 2))
    gmm = GMM(10, covariance_type=covariance_type, weight_concentration_prior_type=prior_type, seed=0, progress=False)
    gmm.fit(x, engine="vb", max_iter=1000, tol=1e-8)
    assert gmm.n_effective_components_ <= 3
    assert gmm.weights_.dtype == torch.float64 and gmm.means_.dtype == torch.float64
    assert np.all(np.diff(gmm.history_) >= -1e-9)
    assert gmm.predict(x).shape == (600,)


@settings(max_examples=10, deadline=None)
@given(counts=st.lists(st.floats(0.0, 50.0), min_size=2, max_size=6), alpha=st.floats(0.01, 5.0))
def test_weight_factors_are_distributions(counts: list[float], alpha: float) -> None:
    """Property: the posterior mean weights are a distribution, and ``E[log w_k] <= log E[w_k]`` (Jensen) for both
    factors; ``exp(E[log w])`` sums to at most 1."""
    counts_t = torch.tensor(counts, dtype=torch.float64)
    for prior_type in PRIOR_TYPES:
        concentration = weight_posterior(counts_t, prior_type, alpha)
        weights = mean_weights(concentration)
        assert torch.isclose(weights.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert float(expected_log_weights(concentration).exp().sum()) <= 1.0 + 1e-12


@pytest.mark.parametrize(
    ("kwargs", "options", "match"),
    [
        ({"weight_concentration_prior_type": "dirichlet"}, {}, "weight_concentration_prior_type"),
        ({"weight_concentration_prior": -1.0}, {}, "weight_concentration_prior"),
        ({}, {"component_prior": {"mean_precision_prior": 0.0}}, r"component_prior\['mean_precision_prior'\]"),
        ({}, {"component_prior": {"degrees_of_freedom_prior": 0.5}}, "degrees_of_freedom_prior"),
        ({}, {"component_prior": {"mean_prior": [0.0]}}, "mean_prior"),
        ({}, {"component_prior": {"covariance_prior": -np.eye(2)}}, "covariance_prior"),
        ({}, {"component_prior": {"means": 0.0}}, "unknown keys"),
    ],
)
def test_bad_priors_are_refused(kwargs: dict, options: dict, match: str) -> None:
    x = np.random.default_rng(0).normal(size=(50, 2))
    with pytest.raises(ValueError, match=match):
        GMM(2, covariance_type="full", progress=False, **kwargs).fit(x, engine="vb", **options)


def test_vb_fit_saves_and_loads(tmp_path) -> None:
    x = _data()
    gmm = GMM(4, covariance_type="full", seed=0, progress=False).fit(x, engine="vb", max_iter=200)
    loaded = GMM.load(gmm.save(tmp_path / "vb"))
    assert loaded.engine_ == "vb" and loaded.lower_bound_ == gmm.lower_bound_
    torch.testing.assert_close(loaded.weights_, gmm.weights_)
    torch.testing.assert_close(loaded.covariances_, gmm.covariances_)
    for name, value in gmm.variational_posterior_.items():
        torch.testing.assert_close(loaded.variational_posterior_[name], value)
    np.testing.assert_array_equal(loaded.predict(x), gmm.predict(x))


def test_vb_is_for_models_with_its_hooks() -> None:
    """A model without the hooks (a mixture of experts) and a family without a conjugate factor (gamma) are refused
    by name."""
    with pytest.raises(ValueError, match="no variational-Bayes updates"):
        MixtureOfExperts(2, progress=False).fit(np.ones((10, 1)), np.ones(10), engine="vb")
    with pytest.raises(ValueError, match="'gamma' family"):
        Mixture(2, family="gamma", progress=False).fit(np.ones((10, 1)) + np.arange(10)[:, None], engine="vb")
    with pytest.raises(ValueError, match="component_prior is for Gaussian components"):
        Mixture(2, family="poisson", progress=False).fit(np.ones((10, 1)), engine="vb", component_prior={})


def _log_evidence(family: str, x: np.ndarray) -> float:
    """The exact log marginal likelihood of ``x`` under one component and the family's default conjugate prior
    (Poisson: ``Gamma(1, 1 / mean)``; exponential: ``Gamma(1, mean)``; Bernoulli: ``Beta(1, 1)``; categorical and
    multinomial: ``Dirichlet(1)``), by the conjugate formulas feature by feature."""
    n = x.shape[0]
    if family == "bernoulli":
        ones = x.sum(0)
        return float(np.sum(betaln(1 + ones, 1 + n - ones) - betaln(1, 1)))
    if family == "categorical":
        levels = int(x.max()) + 1
        counts = np.stack([(x == c).sum(0) for c in range(levels)])  # (C, D)
        return float(np.sum(gammaln(levels) - gammaln(levels + n) + gammaln(1 + counts).sum(0)))
    if family == "multinomial":
        totals = x.sum(0)
        coefficients = gammaln(x.sum(1) + 1).sum() - gammaln(x + 1).sum()
        return float(
            coefficients + gammaln(x.shape[1]) - gammaln(x.shape[1] + totals.sum()) + gammaln(1 + totals).sum()
        )
    if family == "poisson":
        a, b, total = 1.0, 1.0 / x.mean(0), x.sum(0)
        terms = a * np.log(b) - gammaln(a) + gammaln(a + total) - (a + total) * np.log(b + n)
        return float(terms.sum() - gammaln(x + 1).sum())
    a, b, total = 1.0, x.mean(0), x.sum(0)  # exponential: rate ~ Gamma(1, mean)
    return float(np.sum(a * np.log(b) - gammaln(a) + gammaln(a + n) - (a + n) * np.log(b + total)))


def _family_rows(family: str, n: int, seed: int = 0) -> np.ndarray:
    """Planted rows of 3 components (2 to 6 features) of ``family``."""
    rng = np.random.default_rng(seed)
    z = rng.integers(3, size=n)
    if family == "poisson":
        return rng.poisson(np.array([1.0, 8.0, 25.0])[z][:, None], (n, 3)).astype(float)
    if family == "exponential":
        return rng.exponential(1 / np.array([0.05, 1.0, 20.0])[z][:, None], (n, 2))
    if family == "bernoulli":
        probs = np.array([[0.1] * 6, [0.9] * 6, [0.1, 0.1, 0.1, 0.9, 0.9, 0.9]])
        return (rng.random((n, 6)) < probs[z]).astype(float)
    if family == "multinomial":
        profiles = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
        return np.stack([rng.multinomial(20, profiles[c]) for c in z]).astype(float)
    noisy = [np.where(rng.random(n) < 0.8, z, rng.integers(3, size=n)) for _ in range(4)]
    return np.stack(noisy, 1).astype(float)


CONJUGATE_FAMILIES = ("poisson", "exponential", "bernoulli", "categorical", "multinomial")


@pytest.mark.parametrize("family", CONJUGATE_FAMILIES)
def test_one_component_bound_is_the_log_evidence(family: str) -> None:
    """Known answer: with one component the factor is the exact posterior, so the lower bound (Dirichlet weights,
    whose normaliser is 1 for K = 1) equals the exact log marginal likelihood, by the conjugate formulas (1e-10)."""
    x = _family_rows(family, 200)
    mix = Mixture(1, family=family, weight_concentration_prior_type="dirichlet_distribution", progress=False, seed=0)
    mix.fit(x, engine="vb", max_iter=2, tol=0.0)
    evidence = _log_evidence(family, x)
    assert mix.history_[-1] * x.shape[0] == pytest.approx(evidence, rel=1e-10)


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("family", CONJUGATE_FAMILIES)
def test_conjugate_families_prune_and_ascend(family: str, prior_type: str) -> None:
    """Planted data of 3 components, K = 8: at most 3 components keep weight above 1 % (the better of two starts: VB
    has local optima, e.g. an exponential component of mean 20 split in two), and every iteration raises the lower
    bound (up to rounding)."""
    x = _family_rows(family, 900)
    mix = Mixture(8, family=family, weight_concentration_prior_type=prior_type, n_init=2, seed=0, progress=False)
    mix.fit(x, engine="vb", max_iter=1000, tol=1e-8)
    assert mix.n_effective_components_ <= 3
    assert np.all(np.diff(mix.history_) >= -1e-9 * np.abs(mix.history_[1:]))
    assert set(mix.variational_posterior_) > {"weight_concentration"}


def test_conjugate_vb_fit_saves_and_loads(tmp_path) -> None:
    x = _family_rows("categorical", 300)
    mix = Mixture(5, family="categorical", seed=0, progress=False).fit(x, engine="vb", max_iter=300)
    loaded = Mixture.load(mix.save(tmp_path / "vb"))
    torch.testing.assert_close(loaded.weights_, mix.weights_)
    for name, value in mix.variational_posterior_.items():
        torch.testing.assert_close(loaded.variational_posterior_[name], value)
    np.testing.assert_array_equal(loaded.predict(x), mix.predict(x))


@pytest.mark.parametrize(
    ("emission", "covariance_type"), [("gaussian", "full"), ("gaussian", "tied"), ("poisson", "diag")]
)
def test_hmm_of_single_steps_is_the_mixture(emission: str, covariance_type: str) -> None:
    """Known answer: an HMM whose sequences are one step long is a mixture with the initial distribution as its
    weights, so from the same responsibilities every iteration of HMM VB equals the mixture's with Dirichlet weights
    (1e-10), the bounds apart by the transition rows' constant ``K (K lgamma(alpha) - lgamma(K alpha))``."""
    x = _data() if emission == "gaussian" else _family_rows("poisson", 300)
    k, alpha = 4, 0.3
    resp = torch.as_tensor(_start(x.shape[0], k, seed=4))
    options = {"covariance_type": covariance_type} if emission == "gaussian" else {}
    mix = Mixture(
        k,
        family={"name": emission, **options},
        weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=alpha,
        tol=0.0,
        progress=False,
    )
    hmm = HMM(k, emission=emission, weight_concentration_prior=alpha, tol=0.0, progress=False, **options)
    for model in (mix, hmm):
        model._vb_initial_responsibilities = lambda data, generator: resp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mix.fit(x, engine="vb", max_iter=8)
        hmm.fit([row[None] for row in x], engine="vb", max_iter=8)
    rows = k * (k * math.lgamma(alpha) - math.lgamma(k * alpha))
    np.testing.assert_allclose(
        np.asarray(hmm.history_) * x.shape[0], np.asarray(mix.history_) * x.shape[0] + rows, rtol=1e-10
    )
    torch.testing.assert_close(hmm.initial_, mix.weights_, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(hmm.means_, mix.means_, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(hmm.covariances_, mix.covariances_, rtol=1e-10, atol=1e-10)


def _planted_sequences(seed: int = 0) -> list[np.ndarray]:
    """30 sequences x 100 steps of a sticky 3-state Gaussian HMM (means -5, 0, 5, unit variance)."""
    rng = np.random.default_rng(seed)
    transition = np.full((3, 3), 0.05) + np.eye(3) * 0.85
    sequences = []
    for _ in range(30):
        states = [rng.integers(3)]
        for _ in range(99):
            states.append(rng.choice(3, p=transition[states[-1]]))
        sequences.append(np.array([-5.0, 0.0, 5.0])[np.array(states)][:, None] + rng.normal(size=(100, 1)))
    return sequences


def test_hmm_vb_empties_unneeded_states(tmp_path) -> None:
    """A planted 3-state HMM fitted with K = 8: the three largest states explain at least 95 % of the steps, the
    bound ascends, and the fit saves and loads."""
    hmm = HMM(8, seed=0, progress=False).fit(_planted_sequences(), engine="vb", max_iter=1000, tol=1e-8)
    occupancy = np.sort(hmm.state_occupancy_.numpy())[::-1]
    assert occupancy[:3].sum() >= 0.95 and hmm.n_effective_components_ <= 4
    assert np.all(np.diff(hmm.history_) >= -1e-9 * np.abs(hmm.history_[1:]))
    loaded = HMM.load(hmm.save(tmp_path / "hmm"))
    torch.testing.assert_close(loaded.transition_, hmm.transition_)
    for name, value in hmm.variational_posterior_.items():
        torch.testing.assert_close(loaded.variational_posterior_[name], value)


def test_hmm_vb_refuses_other_chain_settings() -> None:
    with pytest.raises(ValueError, match="transition_prior"):
        HMM(2, transition_prior=2.0, progress=False).fit(_planted_sequences()[:2], engine="vb")
