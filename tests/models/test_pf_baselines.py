"""Tests of the pf baselines: 2-step GMM/HMM, class-specific GMM, pc-GMM, sparse k-means, random forest."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import integrate, optimize
from scipy.stats import multivariate_normal
from sklearn.metrics import adjusted_rand_score, roc_auc_score

from ppmix import GMM
from ppmix._validation import NotFittedError
from ppmix.datasets import make_pf_synthetic, make_two_mixture
from ppmix.models.baselines import (
    PCGMM,
    ClassSpecificGMM,
    PredictionOnlyGMM,
    RandomForestBaseline,
    SparseKMeansClassifier,
    TwoStep,
    TwoStepGMM,
    TwoStepHMM,
    gaussian_mixture_marginal_log_prob,
)
from ppmix.models.baselines.sparse_kmeans import sparse_feature_weights, sparse_kmeans
from tests.common import assert_close


def _log_mixture(x, weights, means, covs):
    """``log sum_k w_k N(x | mu_k, Sigma_k)`` with scipy (diag covariances given as (K, D))."""
    dens = sum(
        w * multivariate_normal(m, np.diag(c) if np.ndim(c) == 1 else c).pdf(x) for w, m, c in zip(weights, means, covs)
    )
    return np.log(dens)


def _np(t):
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _auroc(model, X, y):
    return roc_auc_score(y, model.predict_proba(X)[:, 1])


# ------------------------------------------------------------------------ 2-step
def test_two_step_gmm_planted_clusters_determine_y():
    X, y = make_two_mixture(300, n_relevant=3, n_irrelevant=3, snr_relevant=6, snr_irrelevant=1, seed=1)
    Xt, yt = make_two_mixture(300, n_relevant=3, n_irrelevant=3, snr_relevant=6, snr_irrelevant=1, seed=2)
    model = TwoStepGMM(2, seed=0).fit(X, y)
    assert _auroc(model, Xt, yt) > 0.98
    assert model.predict(Xt).shape == (300,)


def test_two_step_gmm_follows_irrelevant_clusters():
    X, y = make_two_mixture(300, n_relevant=1, n_irrelevant=6, snr_relevant=1, snr_irrelevant=6, seed=1)
    Xt, yt = make_two_mixture(300, n_relevant=1, n_irrelevant=6, snr_relevant=1, snr_irrelevant=6, seed=2)
    model = TwoStepGMM(2, seed=0).fit(X, y)
    assert abs(_auroc(model, Xt, yt) - 0.5) < 0.1


def test_two_step_uses_unlabelled_rows_for_the_generative_model_only():
    X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, snr_irrelevant=1, seed=0)
    y_missing = y.astype(float)
    y_missing[::2] = np.nan
    model = TwoStep(GMM(2, seed=0, progress=False)).fit(X, y_missing)
    reference = GMM(2, seed=0, progress=False).fit(X)  # the generative model saw all rows
    assert_close(model.generative_model_.means_, reference.means_)
    assert model.classifier_.n_features_in_ == 2
    assert _auroc(model, X, y) > 0.98


def test_two_step_copies_the_generative_model_and_keeps_feature_names():
    X, y = make_two_mixture(100, n_relevant=2, n_irrelevant=1, seed=0)
    gmm = GMM(2, seed=0, progress=False)
    model = TwoStep(gmm).fit(pd.DataFrame(X, columns=["a", "b", "c"]), y)
    assert not gmm.is_fitted
    assert model.feature_names_in_ == ["a", "b", "c"]
    assert model.predict_proba(pd.DataFrame(X, columns=["a", "b", "c"])).shape == (100, 2)


def _planted_sequences(n_seq, rng):
    """Two sticky states 6 apart in 2-D; y = state with 5% label noise; lengths 15..30."""
    X, Y, Z = [], [], []
    for _ in range(n_seq):
        length = int(rng.integers(15, 31))
        z = np.empty(length, dtype=int)
        z[0] = rng.integers(2)
        for t in range(1, length):
            z[t] = z[t - 1] if rng.random() < 0.9 else 1 - z[t - 1]
        X.append(6.0 * z[:, None] + rng.normal(size=(length, 2)))
        Y.append(np.where(rng.random(length) < 0.05, 1 - z, z).astype(float))
        Z.append(z)
    return X, Y, Z


def test_two_step_hmm_per_step_shapes_and_planted_states():
    rng = np.random.default_rng(0)
    X, Y, _ = _planted_sequences(20, rng)
    Xt, Yt, Zt = _planted_sequences(10, rng)
    Y[0][:5] = np.nan  # missing per-step labels are allowed
    model = TwoStepHMM(2, seed=0).fit(X, Y)
    proba = model.predict_proba(Xt)
    assert isinstance(proba, list) and [p.shape for p in proba] == [(len(x), 2) for x in Xt]
    assert all(np.allclose(p.sum(1), 1.0) for p in proba)
    assert [p.shape for p in model.predict(Xt)] == [(len(x),) for x in Xt]
    scores = np.concatenate([p[:, 1] for p in proba])
    assert roc_auc_score(np.concatenate(Zt), scores) > 0.99
    assert model.score_samples(Xt).shape == (10,)  # log p(x_{1:T}) per sequence
    with pytest.raises(TypeError, match="log_likelihood_relevant"):
        model.log_likelihood_relevant(Xt[0], np.array([True, False]))


def test_two_step_hmm_label_errors():
    rng = np.random.default_rng(0)
    X, Y, _ = _planted_sequences(4, rng)
    with pytest.raises(ValueError, match=r"y\[1\] has"):
        TwoStepHMM(2, seed=0).fit(X, [Y[0], Y[1][:-1], Y[2], Y[3]])
    with pytest.raises(ValueError, match="y must be a list"):
        TwoStepHMM(2, seed=0).fit(X, Y[:3])
    with pytest.raises(ValueError, match="outside"):
        TwoStepHMM(2, seed=0).fit(X, [y * 2 for y in Y])
    with pytest.raises(TypeError, match="fitted on sequences"):
        TwoStepHMM(2, seed=0).fit(X, Y).predict_proba(X[0])


# ------------------------------------------------------------- class-specific GMM
def test_class_specific_gmm_equals_hand_computation():
    X, y = make_two_mixture(120, n_relevant=1, n_irrelevant=1, seed=3)
    model = ClassSpecificGMM(2, seed=0).fit(X, y)
    assert_close(model.class_prior_, [np.mean(y == 0), np.mean(y == 1)])
    joint = np.stack(
        [
            np.log(model.class_prior_[c]) + _log_mixture(X, _np(g.weights_), _np(g.means_), _np(g.covariances_))
            for c, g in enumerate(model.gmms_)
        ],
        axis=1,
    )
    log_px = np.logaddexp(joint[:, 0], joint[:, 1])
    assert_close(model.score_samples(X), log_px, rtol=1e-9)
    assert_close(model.predict_proba(X), np.exp(joint - log_px[:, None]), rtol=1e-8, atol=1e-12)
    # each class's GMM is an ordinary GMM fit on that class's rows
    assert_close(model.gmms_[1].means_, GMM(2, seed=1, progress=False).fit(X[y == 1]).means_)


def test_class_specific_gmm_ignores_unlabelled_rows():
    X, y = make_two_mixture(120, n_relevant=1, n_irrelevant=1, seed=3)
    extra = np.random.default_rng(0).normal(10.0, 1.0, size=(30, 2))
    with_unlabelled = ClassSpecificGMM(2, seed=0).fit(np.vstack([X, extra]), np.r_[y, np.full(30, np.nan)])
    reference = ClassSpecificGMM(2, seed=0).fit(X, y)
    assert_close(with_unlabelled.predict_proba(X), reference.predict_proba(X))
    assert_close(with_unlabelled.class_prior_, reference.class_prior_)


def test_class_specific_gmm_too_few_rows_in_a_class():
    X = np.random.default_rng(0).normal(size=(10, 2))
    y = np.array([0] * 8 + [1] * 2)
    with pytest.raises(ValueError, match="y=1"):
        ClassSpecificGMM(3).fit(X, y)


# ----------------------------------------------------------------------- pc-GMM
@pytest.fixture(scope="module")
def small_pf_data():
    return make_pf_synthetic(300, n_relevant=2, n_features=6, seed=0)


def test_pcgmm_objective_increases_from_its_initialisation(small_pf_data):
    d = small_pf_data
    model = PCGMM(3, lam=20.0, lr=0.05, num_steps=60, tol=0.0, n_init=2, seed=0).fit(d.X, d.y)
    assert model.initial_objective_ < model.objective_
    assert model.n_iter_ == len(model.history_) == 60 and not model.converged_
    assert model.history_[0] == pytest.approx(model.initial_objective_)
    assert model.objective(d.X, d.y) == pytest.approx(model.objective_)


def test_pcgmm_without_prediction_term_is_a_gmm_fit(small_pf_data):
    d = small_pf_data
    gmm = GMM(3, seed=0, tol=1e-6, progress=False).fit(d.X)  # converged: the optimum Adam starts at
    model = PCGMM(3, lam=0.0, lr=0.01, num_steps=400, n_init=1, seed=0).fit(d.X, d.y)
    assert model.converged_ and model.n_iter_ < 400  # nothing to gain from EM's optimum: stops early
    ours, reference = model.score_samples(d.X).mean(), float(gmm.score(d.X))
    assert ours == pytest.approx(reference, abs=1e-3 * abs(reference))
    assert model.objective_ == pytest.approx(ours)
    assert ours <= reference + 1e-6 * abs(reference)  # Adam started at EM's maximum-likelihood fit


def test_pcgmm_prediction_formula_by_hand(small_pf_data):
    d = small_pf_data
    model = PCGMM(2, lam=5.0, num_steps=20, n_init=1, seed=0).fit(d.X, d.y)
    w, mu, var, eta = model.weights_, model.means_, model.covariances_, model.label_probs_
    dens = np.stack([w[k] * multivariate_normal(mu[k], np.diag(var[k])).pdf(d.X) for k in range(2)], axis=1)
    p1 = (dens / dens.sum(1, keepdims=True)) @ eta
    assert_close(model.predict_proba(d.X), np.stack([1 - p1, p1], 1), rtol=1e-8, atol=1e-12)
    assert_close(model.score_samples(d.X), np.log(dens.sum(1)), rtol=1e-9)
    # the objective is generative_weight * mean log p(x) + lam * mean log p(y | x)
    log_pyx = np.log(np.where(d.y == 1, p1, 1 - p1))
    assert model.objective(d.X, d.y) == pytest.approx(np.log(dens.sum(1)).mean() + 5.0 * log_pyx.mean(), rel=1e-9)


def test_prediction_only_gmm_maximises_log_p_y_given_x(small_pf_data):
    d = small_pf_data
    y = d.y.astype(float)
    y[:50] = np.nan  # unlabelled rows do not enter a purely predictive objective
    model = PredictionOnlyGMM(3, num_steps=60, n_init=1, seed=0).fit(d.X, y)
    assert model.generative_weight == 0.0 and model.lam == 1.0
    proba = model.predict_proba(d.X[50:])
    mean_log_pyx = np.log(np.where(d.y[50:] == 1, proba[:, 1], proba[:, 0])).mean()
    assert model.objective_ == pytest.approx(mean_log_pyx, rel=1e-9)
    assert model.initial_objective_ <= model.objective_


def test_pcgmm_is_deterministic_given_seed(small_pf_data):
    d = small_pf_data
    a = PCGMM(2, num_steps=15, n_init=2, seed=4).fit(d.X, d.y)
    b = PCGMM(2, num_steps=15, n_init=2, seed=4).fit(d.X, d.y)
    assert_close(a.predict_proba(d.X), b.predict_proba(d.X), rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"lam": -1.0}, "lam"), ({"lr": 0.0}, "lr"), ({"lam": 0.0, "generative_weight": 0.0}, "empty")],
    ids=["negative-lam", "zero-lr", "empty-objective"],
)
def test_pcgmm_bad_parameters(small_pf_data, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PCGMM(2, **kwargs).fit(small_pf_data.X, small_pf_data.y)


# ------------------------------------------------------------ log p(x_R) marginals
def _generative_models():
    return {
        "two-step-full": TwoStep(GMM(2, covariance_type="full", seed=0, progress=False)),
        "class-specific": ClassSpecificGMM(2, seed=0),
        "pc-gmm": PCGMM(2, num_steps=10, n_init=1, seed=0),
    }


@pytest.mark.parametrize("name", list(_generative_models()))
def test_log_likelihood_relevant_integrates_out_the_other_dimension(name):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.multivariate_normal([0, 0], [[1, 0.6], [0.6, 1]], 60), rng.normal(4, 1, (60, 2))])
    y = np.r_[np.zeros(60), np.ones(60)]
    model = _generative_models()[name].fit(X, y)
    points = X[:4]
    relevant = np.array([True, False])
    ours = model.log_likelihood_relevant(points, relevant)
    for x1, value in zip(points[:, 0], ours):
        density = integrate.quad(lambda x2, x1=x1: np.exp(model.score_samples([[x1, x2]])[0]), -np.inf, np.inf)[0]
        assert value == pytest.approx(np.log(density), rel=1e-6)
    # the full mask gives log p(x)
    assert_close(model.log_likelihood_relevant(points, np.array([True, True])), model.score_samples(points), rtol=1e-9)


def test_gaussian_mixture_marginal_matches_scipy_in_3d():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(2, 3, 3))
    covs = a @ a.transpose(0, 2, 1) + np.eye(3)
    means, weights = rng.normal(size=(2, 3)), np.array([0.3, 0.7])
    X = rng.normal(size=(5, 3))
    mask = np.array([True, False, True])
    expected = _log_mixture(X[:, mask], weights, means[:, mask], covs[:, mask][:, :, mask])
    assert_close(gaussian_mixture_marginal_log_prob(weights, means, covs, X, mask), expected, rtol=1e-10)
    diag = np.abs(rng.normal(size=(2, 3))) + 0.5
    expected = _log_mixture(X[:, mask], weights, means[:, mask], diag[:, mask])
    assert_close(gaussian_mixture_marginal_log_prob(weights, means, diag, X, mask), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="relevant_mask"):
        gaussian_mixture_marginal_log_prob(weights, means, diag, X, np.array([1, 0, 1]))
    with pytest.raises(ValueError, match="selects no feature"):
        gaussian_mixture_marginal_log_prob(weights, means, diag, X, np.zeros(3, dtype=bool))


# ---------------------------------------------------------------- sparse k-means
@pytest.mark.parametrize("l1_bound", [1.0, 1.3, 2.0, 3.5, 10.0], ids=lambda s: f"s={s}")
def test_sparse_weight_step_solves_its_problem(l1_bound):
    a = np.abs(np.random.default_rng(0).normal(size=12)) ** 2
    w = sparse_feature_weights(a, l1_bound)
    assert np.linalg.norm(w) == pytest.approx(1.0, abs=1e-12)
    assert w.sum() <= l1_bound + 1e-9 and (w >= 0).all()
    # the optimum of max w.a s.t. ||w||_2 <= 1, ||w||_1 <= s, w >= 0, by a generic solver
    constraints = [
        {"type": "ineq", "fun": lambda v: 1.0 - v @ v},
        {"type": "ineq", "fun": lambda v: l1_bound - v.sum()},
    ]
    start = np.full(12, 1.0 / 12)
    ref = optimize.minimize(lambda v: -v @ a, start, bounds=[(0, None)] * 12, constraints=constraints, method="SLSQP")
    assert w @ a == pytest.approx(-ref.fun, rel=1e-6)
    if l1_bound >= np.linalg.norm(a, 1) / np.linalg.norm(a):  # bound inactive: w = a / ||a||
        assert_close(w, a / np.linalg.norm(a))


def test_sparse_weight_step_edge_cases():
    assert_close(sparse_feature_weights(np.zeros(4), 1.5), np.full(4, 0.5))
    # tied maxima: sqrt(2) > s = 1.2, so one of them alone; s = 1.42 keeps both (and a sliver of the third)
    assert_close(sparse_feature_weights(np.array([3.0, 3.0, 1.0]), 1.2), [1.0, 0.0, 0.0])
    w = sparse_feature_weights(np.array([3.0, 3.0, 1.0]), 1.42)
    assert w.sum() == pytest.approx(1.42) and w[0] == w[1] and 0 < w[2] < 0.01
    with pytest.raises(ValueError, match="l1_bound"):
        sparse_feature_weights(np.ones(3), 0.5)


def _informative_data(seed=0):
    """2 informative features (3 clusters) among 20 noise features."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 3, 150)
    X = rng.normal(size=(150, 22))
    X[:, :2] += 3.0 * z[:, None]
    return X, z


def test_sparse_kmeans_weights_concentrate_on_informative_features():
    X, z = _informative_data()
    y = (z == 1).astype(float)
    model = SparseKMeansClassifier(3, n_permutations=4, n_bounds=5, n_init=2, seed=0).fit(X, y)
    w = model.feature_weights_
    assert w[:2].min() > 0.6 and w[2:].max() < 0.05
    assert model.gaps_.shape == (5,) and model.l1_bound_ in model.l1_bounds_
    assert _auroc(model, X, y) > 0.95
    assert (model.predict_cluster(X) == model.labels_).mean() > 0.95
    again = SparseKMeansClassifier(3, n_permutations=4, n_bounds=5, n_init=2, seed=0).fit(X, y)
    assert_close(again.feature_weights_, w, rtol=0, atol=0)
    assert_close(again.gaps_, model.gaps_, rtol=0, atol=0)


def test_sparse_kmeans_with_fixed_bound_recovers_clusters():
    X, z = _informative_data(1)
    result = sparse_kmeans(X, 3, 1.5, torch.Generator().manual_seed(0))
    assert result.weights.sum() <= 1.5 + 1e-9
    assert np.argsort(result.weights)[-2:].tolist() in ([0, 1], [1, 0])
    assert adjusted_rand_score(z, result.labels) > 0.9


# ------------------------------------------------------------------ random forest
def test_random_forest_baseline():
    X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    y_missing = y.astype(float)
    y_missing[:20] = np.nan
    model = RandomForestBaseline(n_estimators=30, random_state=0).fit(X, y_missing)
    proba = model.predict_proba(X)
    assert proba.shape == (200, 2) and np.allclose(proba.sum(1), 1.0)
    assert model.classifier_.n_estimators == 30 and model.classifier_.n_features_in_ == 4
    assert _auroc(model, X, y) > 0.95
    assert repr(model) == "RandomForestBaseline(n_estimators=30, random_state=0)"


# ---------------------------------------------------------------------- bad input
BASELINES = {
    "two-step": lambda: TwoStepGMM(2, seed=0),
    "class-specific": lambda: ClassSpecificGMM(2, seed=0),
    "pc-gmm": lambda: PCGMM(2, num_steps=2, n_init=1, seed=0),
    "prediction-only": lambda: PredictionOnlyGMM(2, num_steps=2, n_init=1, seed=0),
    "sparse-kmeans": lambda: SparseKMeansClassifier(2, l1_bound=1.5, seed=0),
    "random-forest": lambda: RandomForestBaseline(n_estimators=5, random_state=0),
}


@pytest.fixture(scope="module")
def xy():
    return make_two_mixture(40, n_relevant=2, n_irrelevant=1, seed=0)


@pytest.mark.parametrize("name", list(BASELINES))
def test_bad_labels(name, xy):
    X, y = xy
    make = BASELINES[name]
    with pytest.raises(ValueError, match="Only binary classification is supported.*found 3 class"):
        make().fit(X, np.arange(len(y)) % 3)
    with pytest.raises(ValueError, match="y has no observed label"):
        make().fit(X, np.full(len(y), np.nan))
    with pytest.raises(ValueError, match="y has 39 labels but X has 40 rows"):
        make().fit(X, y[:-1])
    with pytest.raises(ValueError, match="y must contain both classes"):
        make().fit(X, np.zeros(len(y)))
    with pytest.raises(ValueError, match="y is required"):
        make().fit(X, None)


@pytest.mark.parametrize("seed", ["abc", 1.5, True])
@pytest.mark.parametrize("name", [name for name in BASELINES if name != "random-forest"])  # that one: random_state
def test_a_seed_that_is_not_an_integer_is_an_error_naming_seed(name, seed, xy):
    X, y = xy
    model = BASELINES[name]()
    if isinstance(model, TwoStep):
        model.generative_model.seed = seed
    else:
        model.seed = seed
    with pytest.raises(TypeError, match=r"\bseed\b must be an integer or None"):
        model.fit(X, y)


@pytest.mark.parametrize("name", list(BASELINES))
def test_bad_features_and_unfitted(name, xy):
    X, y = xy
    make = BASELINES[name]
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        make().fit(bad, y)
    with pytest.raises(NotFittedError):
        make().predict_proba(X)
    model = make().fit(X, y)
    with pytest.raises(ValueError, match="features"):
        model.predict_proba(X[:, :2])
    proba = model.predict_proba(X)
    assert proba.shape == (40, 2) and np.allclose(proba.sum(1), 1.0)
    assert set(np.unique(model.predict(X))) <= {0, 1}


@pytest.mark.parametrize(
    "make",
    [
        lambda: TwoStepGMM(50),
        lambda: PCGMM(50, num_steps=2),
        lambda: SparseKMeansClassifier(50, l1_bound=1.5),
        lambda: ClassSpecificGMM(30),
    ],
    ids=["two-step", "pc-gmm", "sparse-kmeans", "class-specific"],
)
def test_more_components_than_samples(make, xy):
    X, y = xy
    with pytest.raises(ValueError, match="larger than the number of samples"):
        make().fit(X, y)
