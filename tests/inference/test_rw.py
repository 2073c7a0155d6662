"""Regularized Weighting: the weight step against a QP oracle and the paper's lemmas,
monotone alternation, recovery of planted models, robustness to far outliers, bad input."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.optimize import minimize

from ppmix._validation import NotFittedError
from ppmix.algorithms.simplex import project_simplex
from ppmix.components import DiagGaussian, FullGaussian
from ppmix.datasets.rw import make_outlier_clusters, make_quadratic_regressions, make_unbalanced_clusters
from ppmix.optimizers.rw.estimator import RegularizedWeighting
from ppmix.optimizers.rw.learners import (
    FamilyLearner,
    GaussianLearner,
    RegressionLearner,
    SquaredDistanceLearner,
    SubspaceLearner,
    WeightedLearner,
)
from ppmix.optimizers.rw.weights import joint_loss, project_weighted_simplex, solve_weights
from tests.common import assert_close


def random_losses(seed: int, k: int, n: int, far: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    losses = rng.exponential(size=(k, n))
    losses[:, :far] += 50.0  # a few points no model explains
    return torch.as_tensor(losses)


def qp_oracle(losses: torch.Tensor, alpha: float) -> tuple[np.ndarray, float]:
    """The weight step solved by SLSQP on the flattened ``k * n`` variables."""
    l = losses.numpy()
    k, n = l.shape

    def f(z):
        w = z.reshape(k, n)
        v = w.mean(0)
        return alpha * ((v - 1 / n) ** 2).sum() + (l * w).sum() / k

    def grad(z):
        w = z.reshape(k, n)
        v = w.mean(0)
        return ((l - 2 * alpha * (1 / n - v)[None, :]) / k).ravel()

    constraints = [
        {
            "type": "eq",
            "fun": lambda z, j=j: z.reshape(k, n)[j].sum() - 1.0,
            "jac": lambda z, j=j: np.eye(k)[j].repeat(n),
        }
        for j in range(k)
    ]
    res = minimize(
        f,
        np.full(k * n, 1 / n),
        jac=grad,
        bounds=[(0, 1)] * (k * n),
        constraints=constraints,
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert res.success, res.message
    return res.x.reshape(k, n), float(res.fun)


# ----------------------------------------------------------------- weight step
@pytest.mark.parametrize("k, n", [(1, 5), (2, 6), (3, 7)], ids=["k1", "k2", "k3"])
def test_lipschitz_constant_is_2_alpha_over_k(k, n):
    alpha = 3.7
    a = np.tile(np.eye(n), (1, k)) / k  # v = A vec(W)
    hessian = 2 * alpha * a.T @ a  # Hessian of alpha ||u - v||^2 in vec(W)
    assert np.linalg.eigvalsh(hessian).max() == pytest.approx(2 * alpha / k, rel=1e-12)


@pytest.mark.parametrize(
    "seed, k, n, alpha", [(0, 2, 6, 3.0), (1, 3, 5, 10.0), (2, 2, 8, 0.5), (3, 3, 6, 40.0)], ids=str
)
def test_weight_step_matches_qp_oracle_and_certifies_its_gap(seed, k, n, alpha):
    losses = random_losses(seed, k, n, far=1)
    w_qp, f_qp = qp_oracle(losses, alpha)
    result = solve_weights(losses, alpha, tol=1e-12, max_iter=20000)
    assert result.converged
    assert result.objective == pytest.approx(f_qp, rel=1e-7, abs=1e-10)
    assert result.objective <= f_qp + 1e-9  # never worse than the oracle
    # the optimal average weight v is unique (strict convexity in v)
    assert_close(result.weights.mean(0), w_qp.mean(0), atol=1e-5)
    # the reported gap bounds the suboptimality
    rough = solve_weights(losses, alpha, tol=1e-2, max_iter=20000)
    assert rough.objective - f_qp <= rough.gap + 1e-12
    assert (result.weights >= 0).all()
    assert_close(result.weights.sum(1), torch.ones(k, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("seed, alpha", [(0, 0.3), (1, 5.0), (2, 60.0)], ids=str)
def test_weight_step_kkt_and_lemmas(seed, alpha):
    k, n = 3, 40
    losses = random_losses(seed, k, n, far=3)
    w = solve_weights(losses, alpha, tol=1e-13, max_iter=50000).weights
    u, v = 1.0 / n, w.mean(0)
    grad = k * ((losses - 2 * alpha * (u - v)) / k)  # k times the gradient: l_ji - 2 alpha (u - v_i)
    support = w > 1e-9
    t = torch.stack([grad[j][support[j]].mean() for j in range(k)])
    # KKT: the scaled gradient equals t_j on the support of w_j and is >= t_j elsewhere
    for j in range(k):
        assert_close(grad[j][support[j]], t[j].expand(int(support[j].sum())), atol=1e-6)
        assert (grad[j] >= t[j] - 1e-6).all()
    # Lemma 2: v = P_simplex(u - min_j (l_j - t_j) / (2 alpha)), and w_ji > 0 only where j is a minimiser
    m = (losses - t[:, None]).min(0).values
    assert_close(project_simplex(u - m / (2 * alpha)), v, atol=2e-6)
    for j in range(k):
        assert ((losses[j] - t[j])[support[j]] <= m[support[j]] + 1e-6).all()
    # Lemma 1: ||v - u||_inf <= B / (2 alpha)
    bound = float(losses.max()) / (2 * alpha)
    assert float((v - u).abs().max()) <= bound + 1e-9


def test_lemma1_forces_uniform_weights_for_large_alpha():
    losses = random_losses(4, 2, 30, far=2)
    alpha = 1e4
    v = solve_weights(losses, alpha, tol=1e-12, max_iter=20000).weights.mean(0)
    assert float((v - 1 / 30).abs().max()) <= float(losses.max()) / (2 * alpha)


def test_weight_step_warm_start_never_increases_the_objective():
    losses = random_losses(5, 3, 50, far=2)
    start = project_simplex(torch.rand(3, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    before = joint_loss(losses, start, 2.0)
    for max_iter in (1, 2, 5, 50):
        result = solve_weights(losses, 2.0, start=start, max_iter=max_iter, tol=0.0)
        assert result.objective <= before + 1e-15
        assert result.objective == pytest.approx(joint_loss(losses, result.weights, 2.0), rel=1e-12)


def test_far_points_get_zero_weight():
    losses = random_losses(6, 2, 30, far=3)
    w = solve_weights(losses, alpha=3.0 * 30 * 0.5, tol=1e-10).weights
    assert (w[:, :3] == 0).all()


def test_solve_weights_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        solve_weights(torch.ones(2, 3), 0.0)
    with pytest.raises(ValueError, match="non-negative"):
        solve_weights(-torch.ones(2, 3), 1.0)
    with pytest.raises(ValueError, match="start"):
        solve_weights(torch.ones(2, 3), 1.0, start=torch.ones(3, 2))


# ----------------------------------------------------------------- alternation
def two_blobs(n=120, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(0, 1, (n // 2, 2)), rng.normal((8, 3), 1, (n // 2, 2))])


@pytest.mark.parametrize(
    "learner, data",
    [
        ("kmeans", "blobs"),
        ("regression", "lines"),
        (SubspaceLearner(dim=1), "blobs"),
        (SubspaceLearner(dim=1, affine=False), "blobs"),
    ],
    ids=["kmeans", "regression", "subspace-affine", "subspace-linear"],
)
def test_joint_loss_never_increases(learner, data):
    if data == "blobs":
        X, y = two_blobs(), None
    else:
        reg = make_quadratic_regressions(80, noise_scale=0.1, seed=1)
        X, y = reg.X, reg.y
    rw = RegularizedWeighting(2, learner, alpha_per_point=2.0, n_init=2, max_iter=30, tol=0.0, seed=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tol=0 may end at max_iter with a ConvergenceWarning
        rw.fit(X, y)
    history = np.asarray(rw.history_)
    assert len(history) >= 3
    assert (np.diff(history) <= 1e-10 * history[:-1]).all(), np.diff(history).max()
    assert rw.loss_ == pytest.approx(history[-1])


def match_centres(found: np.ndarray, truth: np.ndarray) -> float:
    """Largest distance between truth and found centres under the best matching."""
    k = len(truth)
    return min(max(np.linalg.norm(found[p[j]] - truth[j]) for j in range(k)) for p in itertools.permutations(range(k)))


def test_recovers_planted_centres():
    rng = np.random.default_rng(1)
    truth = np.array([[0.0, 0.0], [10.0, 0.0], [5.0, 8.0]])
    X = np.concatenate([c + rng.normal(size=(100, 2)) for c in truth])
    rw = RegularizedWeighting(3, alpha_per_point=3.0, n_init=3, weight_tol=1e-7, seed=0, progress=False).fit(X)
    assert rw.converged_
    assert match_centres(rw.models_.centres_.numpy(), truth) < 0.3
    labels = np.repeat(np.arange(3), 100)
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(labels, rw.predict(X)) > 0.97
    assert rw.weights_.dtype == torch.float64 and rw.weights_.shape == (3, 300)
    assert_close(rw.weights_.sum(1), torch.ones(3, dtype=torch.float64), atol=1e-12)


def test_outliers_far_away_do_not_break_rw_but_break_kmeans():
    from sklearn.cluster import KMeans

    data = make_outlier_clusters(400, 2, 2, eta=0.01, outlier_distance=1e6, separation=10.0, spread=1.0, seed=0)
    k = 2
    assert data.outlier_mask.mean() < 1 / (22 * k**2)  # below Theorem 2's bound
    inliers = data.X[~data.outlier_mask]
    R = data.radius
    # Theorem 2's range: r^2 <= alpha/n <= 13 R^2 (r = spread = 1, R ~ 6)
    rw = RegularizedWeighting(k, alpha_per_point=4.0, seed=0, progress=False).fit(data.X)
    centres = rw.models_.centres_.numpy()
    dist = np.linalg.norm(centres[:, None, :] - inliers[None, :, :], axis=-1)
    assert dist.max() <= 6 * R
    assert match_centres(centres, data.centres) < 0.5
    assert rw.outliers_[data.outlier_mask].all() and not rw.outliers_[~data.outlier_mask].any()
    assert (rw.labels_[data.outlier_mask] == -1).all()
    km = KMeans(k, n_init=10, random_state=0).fit(data.X)
    assert np.linalg.norm(km.cluster_centers_, axis=1).max() > 1e5  # one k-means centre sits on the outliers


def test_regression_learner_recovers_two_lines():
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, 200)
    labels = np.arange(200) % 2
    slopes, intercepts = np.array([2.0, -1.0]), np.array([0.5, -0.5])
    y = slopes[labels] * x + intercepts[labels] + 0.05 * rng.normal(size=200)
    rw = RegularizedWeighting(2, "regression", alpha_per_point=0.05, seed=0, progress=False)
    rw.fit(x[:, None], y)
    coef = rw.models_.coef_[:, 0].numpy()
    order = np.argsort(-coef)
    assert_close(coef[order], slopes, atol=0.05)
    assert_close(rw.models_.intercept_.numpy()[order], intercepts, atol=0.05)
    pred = rw.predict(x[:, None], y)
    assert max((pred == labels).mean(), (pred != labels).mean()) > 0.9


def test_quadratic_regressions_with_fat_tails_fit_bulk():
    data = make_quadratic_regressions(60, noise_scale=0.02, seed=3)
    rw = RegularizedWeighting(2, "regression", alpha_per_point=0.2, seed=0, progress=False).fit(data.X, data.y)
    pred = rw.predict(data.X, data.y)
    assert max((pred == data.labels).mean(), (pred != data.labels).mean()) > 0.95
    order = np.argsort(-rw.models_.intercept_.numpy())
    assert_close(rw.models_.intercept_.numpy()[order], data.intercept, atol=0.1)


def test_subspace_learner_recovers_two_lines_through_the_origin():
    rng = np.random.default_rng(4)
    directions = np.array([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
    X = np.concatenate([rng.normal(size=(80, 1)) * 3 * d + 0.02 * rng.normal(size=(80, 3)) for d in directions])
    learner = SubspaceLearner(dim=1, affine=False)
    rw = RegularizedWeighting(2, learner, alpha_per_point=0.01, n_init=3, weight_tol=1e-7, seed=0, progress=False).fit(
        X
    )
    bases = rw.models_.bases_[:, :, 0].numpy()
    cos = np.abs(bases @ directions.T)
    assert max(min(cos[0, 0], cos[1, 1]), min(cos[0, 1], cos[1, 0])) > 0.999
    assert not hasattr(learner, "bases_")  # the template is copied, never modified


def test_gaussian_learner_and_unbalanced_clusters():
    data = make_unbalanced_clusters(60, (0.35, 0.65), seed=0)
    rw = RegularizedWeighting(2, "gaussian", alpha_per_point=2.0, seed=0, progress=False).fit(data.X)
    pred = rw.predict(data.X)
    assert max((pred == data.labels).mean(), (pred != data.labels).mean()) > 0.9
    assert (rw.models_.loss(torch.as_tensor(data.X)) >= 0).all()


def test_custom_learner_and_determinism():
    class Medians(SquaredDistanceLearner):
        pass

    X = two_blobs()
    assert isinstance(Medians(), WeightedLearner)
    a = RegularizedWeighting(2, Medians(), alpha_per_point=2.0, seed=3, progress=False).fit(X)
    b = RegularizedWeighting(2, "kmeans", alpha_per_point=2.0, seed=3, progress=False).fit(X)
    assert torch.equal(a.weights_, b.weights_) and a.history_ == b.history_
    auto = RegularizedWeighting(2, seed=3, progress=False).fit(X)
    assert auto.alpha_per_point_ > 0 and auto.alpha_ == pytest.approx(auto.alpha_per_point_ * len(X))
    labels = auto.fit_predict(X)
    assert set(labels.tolist()) <= {-1, 0, 1}
    assert isinstance(auto.predict(torch.as_tensor(X)), torch.Tensor)


def test_learners_fit_each_model_with_its_own_weights():
    X = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]], dtype=torch.float64)
    learner = SquaredDistanceLearner().init(X, 3, torch.Generator().manual_seed(0)).fit(X, w.T)
    assert_close(learner.centres_, w @ X)
    assert_close(learner.loss(X).T, torch.cdist(w @ X, X).square(), atol=1e-12)
    gauss = GaussianLearner().init(X, 3, torch.Generator().manual_seed(0)).fit(X, w.T)
    assert_close(gauss.components_.loc, w @ X, atol=1e-12)
    # the loss is half the squared Mahalanobis distance to each model's mean (zero at the mean)
    comp = gauss.components_
    maha = ((X[None] - comp.loc[:, None]).square() / comp.variance[:, None]).sum(-1)
    assert_close(gauss.loss(X).T, 0.5 * maha, atol=1e-9)
    assert_close(gauss.loss(comp.loc).diagonal(), torch.zeros(3, dtype=torch.float64), atol=1e-9)
    reg = RegressionLearner().init((X[:, :1], X[:, 1]), 3, torch.Generator().manual_seed(0))
    assert reg.loss((X[:, :1], X[:, 1])).shape == (3, 3)


def test_a_plain_diag_gaussian_family_is_the_gaussian_learner():
    X = two_blobs()
    family = DiagGaussian(torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64))
    a = RegularizedWeighting(2, family, alpha_per_point=2.0, seed=1, progress=False).fit(X)
    b = RegularizedWeighting(2, "gaussian", alpha_per_point=2.0, seed=1, progress=False).fit(X)
    assert torch.equal(a.weights_, b.weights_) and a.history_ == b.history_
    assert_close(a.models_.components_.loc, b.models_.components_.loc)


def test_any_component_family_is_a_learner():
    X = two_blobs()
    diag = DiagGaussian(torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64))
    rw = RegularizedWeighting(2, FamilyLearner(diag), alpha_per_point=20.0, n_init=5, seed=0, progress=False).fit(X)
    truth = np.repeat([0, 1], len(X) // 2)
    pred = rw.predict(X)
    assert max((pred == truth).mean(), (pred != truth).mean()) == 1.0
    full = FullGaussian(torch.zeros(2, 2, dtype=torch.float64), torch.eye(2, dtype=torch.float64).expand(2, 2, 2))
    rw = RegularizedWeighting(2, full, alpha_per_point=20.0, n_init=2, seed=0, progress=False).fit(X)
    assert isinstance(rw.models_, FamilyLearner)
    losses = rw.models_.loss(torch.as_tensor(X))
    assert losses.shape == (len(X), 2) and (losses >= 0).all() and (losses.min(dim=0).values == 0).all()
    with pytest.raises(ValueError, match="2 components, but RW fits n_models=3"):
        RegularizedWeighting(3, full, seed=0, progress=False).fit(X)


def test_a_learner_of_the_old_signature_is_refused():
    class OldMedians:
        def init(self, X, y, k, generator):
            return self

        def fit(self, X, y, weights):
            return self

        def loss(self, X, y):
            return torch.zeros(2, len(X))

    with pytest.raises(TypeError, match="WeightedLearner protocol"):
        RegularizedWeighting(2, OldMedians(), seed=0, progress=False).fit(two_blobs())


def test_predict_reorders_dataframe_columns_and_refuses_other_names():
    X = pd.DataFrame(two_blobs(), columns=["a", "b"])
    rw = RegularizedWeighting(2, alpha_per_point=2.0, seed=0, progress=False).fit(X)
    assert np.array_equal(rw.predict(X[["b", "a"]]), rw.predict(X))
    with pytest.raises(ValueError, match="c"):
        rw.predict(X.rename(columns={"a": "c"}))


# ------------------------------------------------------------------- bad input
X_OK = two_blobs(20)


@pytest.mark.parametrize(
    "kwargs, X, y, error, match",
    [
        ({"n_models": 30}, X_OK, None, ValueError, "n_models"),
        ({"n_models": 0}, X_OK, None, ValueError, "n_models"),
        ({"n_models": 2.0}, X_OK, None, TypeError, "n_models"),
        ({"n_models": 2, "alpha_per_point": 0.0}, X_OK, None, ValueError, "alpha_per_point"),
        ({"n_models": 2, "alpha_per_point": -1.0}, X_OK, None, ValueError, "alpha_per_point"),
        ({"n_models": 2, "alpha_per_point": "big"}, X_OK, None, ValueError, "alpha_per_point"),
        ({"n_models": 2, "alpha_per_point": float("nan")}, X_OK, None, ValueError, "alpha_per_point"),
        ({"n_models": 2}, np.where(np.arange(20)[:, None] == 3, np.nan, X_OK), None, ValueError, "X"),
        ({"n_models": 2}, X_OK[:, 0], None, ValueError, "X"),
        ({"n_models": 2}, X_OK.astype(str), None, TypeError, "X"),
        ({"n_models": 2, "learner": "regression"}, X_OK, None, ValueError, "y"),
        ({"n_models": 2, "learner": "regression"}, X_OK, np.ones(5), ValueError, "y"),
        ({"n_models": 2, "learner": "regression"}, X_OK, np.full(20, np.inf), ValueError, "y"),
        ({"n_models": 2, "learner": "lasso"}, X_OK, None, ValueError, "learner"),
        ({"n_models": 2, "learner": 3}, X_OK, None, TypeError, "learner"),
        ({"n_models": 2, "n_init": 0}, X_OK, None, ValueError, "n_init"),
        ({"n_models": 2, "tol": -1.0}, X_OK, None, ValueError, "tol"),
        ({"n_models": 2, "learner": SubspaceLearner(dim=2)}, X_OK, None, ValueError, "dim"),
    ],
    ids=[
        "k>n",
        "k=0",
        "k-float",
        "alpha0",
        "alpha-neg",
        "alpha-str",
        "alpha-nan",
        "X-nan",
        "X-1d",
        "X-str",
        "y-missing",
        "y-shape",
        "y-inf",
        "learner-name",
        "learner-type",
        "n_init",
        "tol",
        "subspace-dim",
    ],
)
def test_bad_input(kwargs, X, y, error, match):
    with pytest.raises(error, match=match):
        RegularizedWeighting(progress=False, seed=0, **kwargs).fit(X, y)


def test_predict_errors():
    rw = RegularizedWeighting(2, alpha_per_point=1.0, seed=0, progress=False)
    with pytest.raises(NotFittedError):
        rw.predict(X_OK)
    rw.fit(X_OK)
    with pytest.raises(ValueError, match="features"):
        rw.predict(np.ones((3, 5)))
    reg = RegularizedWeighting(2, "regression", alpha_per_point=1.0, seed=0, progress=False).fit(X_OK, X_OK[:, 0])
    with pytest.raises(ValueError, match="y"):
        reg.predict(X_OK)


# ------------------------------------------------------------------ sample weights
class _FixedCentres(SquaredDistanceLearner):
    """k-means models started at given centres: the same start for the weighted and the repeated rows."""

    def init(self, data, k, generator):
        self.centres_ = torch.tensor([[0.0, 0.0], [5.0, 5.0]], dtype=torch.float64)
        return self


def _weighted_clusters(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(0, 1, (20, 2)), rng.normal(5, 1, (20, 2)), [[40.0, -30.0]]])
    return X, rng.integers(1, 4, size=len(X)).astype(float)


def test_sample_weight_equals_repeated_rows():
    X, w = _weighted_clusters()
    copies = np.repeat(np.arange(len(X)), w.astype(int))
    settings = dict(alpha_per_point=4.0, n_init=1, seed=0, progress=False, weight_tol=1e-12)
    weighted = RegularizedWeighting(2, _FixedCentres(), **settings).fit(X, sample_weight=w)
    repeated = RegularizedWeighting(2, _FixedCentres(), **settings).fit(X[copies])
    assert weighted.alpha_ == repeated.alpha_ == 4.0 * w.sum()
    assert len(weighted.history_) == len(repeated.history_)
    assert_close(weighted.history_, repeated.history_, rtol=1e-12, atol=0)
    assert_close(weighted.models_.centres_, repeated.models_.centres_, rtol=0, atol=1e-12)
    # the weight of a row is the total over its copies
    totals = torch.zeros_like(weighted.weights_).index_add(1, torch.as_tensor(copies), repeated.weights_)
    assert_close(weighted.weights_, totals, rtol=0, atol=1e-14)
    assert np.array_equal(weighted.labels_[copies], repeated.labels_)
    assert np.array_equal(weighted.outliers_[copies], repeated.outliers_) and weighted.outliers_[-1]


def test_sample_weight_zero_drops_the_row_and_ones_change_nothing():
    X, w = _weighted_clusters(1)
    w[[3, 30]] = 0.0
    keep = w > 0
    settings = dict(alpha_per_point=4.0, n_init=1, seed=0, progress=False)
    dropped = RegularizedWeighting(2, _FixedCentres(), **settings).fit(X, sample_weight=w)
    kept = RegularizedWeighting(2, _FixedCentres(), **settings).fit(X[keep], sample_weight=w[keep])
    assert dropped.history_ == kept.history_ and torch.equal(dropped.weights_[:, keep], kept.weights_)
    assert not dropped.weights_[:, ~keep].any() and not dropped.outliers_[~keep].any()
    assert np.array_equal(dropped.labels_[~keep], dropped.predict(X[~keep]))
    # weights all one: the unweighted fit, bit for bit (restarts and the start included)
    ones = RegularizedWeighting(2, alpha_per_point="auto", n_init=2, seed=0, progress=False)
    plain = RegularizedWeighting(2, alpha_per_point="auto", n_init=2, seed=0, progress=False).fit(X)
    ones.fit(X, sample_weight=np.ones(len(X)))
    assert ones.history_ == plain.history_ and torch.equal(ones.weights_, plain.weights_)


@pytest.mark.parametrize("seed", [0, 1])
def test_weight_step_with_sample_weight_is_the_repeated_weight_step(seed):
    losses = random_losses(seed, 3, 12, far=2)
    mass = torch.as_tensor(np.random.default_rng(seed).integers(1, 5, size=12), dtype=torch.float64)
    copies = torch.repeat_interleave(torch.arange(12), mass.long())
    repeated = solve_weights(losses[:, copies], alpha=8.0 * float(mass.sum()), tol=1e-13)
    weighted = solve_weights(losses, alpha=8.0 * float(mass.sum()), tol=1e-13, sample_weight=mass)
    assert weighted.n_iter == repeated.n_iter
    assert weighted.objective == pytest.approx(repeated.objective, rel=1e-12)
    # the optimal weights need not be unique (the objective is strictly convex in v only): rounding steers the
    # two runs apart along the flat directions by a little more than it moves the objective
    totals = torch.zeros_like(weighted.weights).index_add(1, copies, repeated.weights)
    assert_close(weighted.weights, totals, rtol=0, atol=1e-9)
    assert joint_loss(losses, weighted.weights, 8.0 * float(mass.sum()), mass) == pytest.approx(weighted.objective)


@pytest.mark.parametrize("max_pivots", [1, 64], ids=["sort", "pivot"])
def test_weighted_projection_is_the_projection_of_the_repeated_vector(max_pivots):
    v = torch.as_tensor(np.random.default_rng(0).normal(size=(4, 9)))
    mass = torch.tensor([1.0, 3.0, 2.0, 1.0, 1.0, 4.0, 2.0, 1.0, 5.0], dtype=torch.float64)
    copies = torch.repeat_interleave(torch.arange(9), mass.long())
    projected, _ = project_weighted_simplex(v, mass, max_pivots=max_pivots)
    assert_close(projected[:, copies], project_simplex(v[:, copies]), rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "weights, match",
    [
        ([1.0] * 5 + [-1.0], "non-negative"),
        ([0.0] * 6, "zero for every row"),
        ([1.0] * 5, "one entry per row"),
        ([0.0] * 5 + [1.0], "2 row"),
    ],
    ids=["negative", "all-zero", "length", "fewer-than-models"],
)
def test_bad_sample_weight(weights, match):
    with pytest.raises(ValueError, match=f"sample_weight.*{match}"):
        RegularizedWeighting(2, alpha_per_point=1.0, progress=False).fit(X_OK[:6], sample_weight=weights)
