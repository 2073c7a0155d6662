"""MixtureOfExperts: planted recovery, one objective for EM and Pyro, monotone EM, bad input, I/O."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from ppmix._validation import NotFittedError
from ppmix.datasets.moe import make_moe
from ppmix.models import latent_posterior
from ppmix.models._weights import Weighted
from ppmix.models.moe import MixtureOfExperts
from tests.common import assert_em_objective_is_trace_enum_elbo, make_expert_data

EXPERTS = ["gaussian", "logistic"]


def planted(expert: str, n: int = 3000, seed: int = 0):
    """Two experts split by a soft gate on x0, with distinct slopes; parameters known."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)) * np.array([2.0, 1.0]) + np.array([1.0, -1.0])
    gate_coef, gate_intercept = np.array([[3.0, 0.0], [0.0, 0.0]]), np.array([-3.0, 0.0])
    coef, intercept = np.array([[2.0, -1.0], [-2.0, 1.5]]), np.array([1.0, -0.5])
    scale = np.array([0.3, 0.6])
    if expert == "logistic":
        coef, intercept = 2 * coef, intercept
    truth = MixtureOfExperts.from_parameters(
        gate_coef=gate_coef,
        gate_intercept=gate_intercept,
        coef=coef,
        intercept=intercept,
        scale=scale if expert == "gaussian" else None,
        seed=seed,
    )
    y = truth.sample(x)["y"]
    return x, y, truth


def matched(fitted: torch.Tensor, true: torch.Tensor) -> np.ndarray:
    """Rows of ``fitted`` permuted to best match ``true`` (least squares)."""
    f, t = np.asarray(fitted), np.asarray(true)
    cost = ((f[:, None, :] - t[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    out = np.empty_like(f)
    out[cols] = f[rows]
    return out


def test_em_recovers_planted_gaussian_experts():
    x, y, truth = planted("gaussian", n=4000)
    moe = MixtureOfExperts(2, n_init=3, seed=0, progress=False, max_iter=300).fit(x, y)
    np.testing.assert_allclose(matched(moe.coef_, truth.coef_), truth.coef_.numpy(), atol=0.1)
    np.testing.assert_allclose(np.sort(moe.scale_.numpy()), [0.3, 0.6], atol=0.03)
    # the gate: compare decisions (its parameters are identified only up to the label order)
    agree = (moe.predict_components(x) == truth.predict_components(x)).mean()
    assert max(agree, 1 - agree) > 0.97
    assert (
        moe.log_likelihood(x, y) / len(y) >= truth.log_likelihood(x, y) / len(y) - 0.01
    )  # the MLE is at least as likely as the truth


def test_em_recovers_planted_logistic_moe():
    """Mixtures of logistic regressions are weakly identified: check the fitted function and the likelihood."""
    x, y, truth = planted("logistic", n=6000)
    moe = MixtureOfExperts(2, expert="logistic", n_init=2, seed=0, progress=False, max_iter=300).fit(x, y)
    assert moe.log_likelihood(x, y) / len(y) >= truth.log_likelihood(x, y) / len(y)
    assert np.abs(moe.predict_proba(x)[:, 1] - truth.predict_proba(x)[:, 1]).mean() < 0.05


@pytest.mark.filterwarnings("ignore:EM did not converge")
@pytest.mark.parametrize("priors", [None, {}])
@pytest.mark.parametrize("expert", EXPERTS)
def test_em_objective_equals_pyro_trace_enum_elbo(expert, priors):
    """With ``priors`` (MAP-EM) the objective less its log prior is the log-likelihood the same way."""
    x, y, _ = planted(expert, n=300)
    moe = MixtureOfExperts(3, expert=expert, priors=priors, seed=0, progress=False, max_iter=5).fit(x, y)
    assert_em_objective_is_trace_enum_elbo(moe, x, y)


#: a prior strong enough to bite on the data of the monotonicity test (MAP-EM)
STRONG_PRIOR = {"gate_slope_scale": 0.5, "gate_intercept_scale": 0.5, "slope_scale": 0.5, "intercept_scale": 0.5}


@pytest.mark.filterwarnings("ignore:EM did not converge")
@pytest.mark.parametrize(
    "expert, priors", [(e, None) for e in EXPERTS] + [(e, STRONG_PRIOR) for e in EXPERTS], ids=lambda v: str(v)
)
def test_em_log_likelihood_never_decreases(expert, priors):
    """Maximum likelihood, and MAP-EM's log-likelihood plus log prior (Gaussian experts' ECM update included)."""
    data = make_moe(1500 if priors is None else 500, expert=expert, n_experts=3, n_features=4, seed=2)
    moe = MixtureOfExperts(3, expert=expert, priors=priors, seed=1, progress=False, max_iter=60, tol=0.0)
    moe.fit(data.X, data.y)
    steps = np.diff(moe.history_)
    assert (steps >= -1e-9 * np.abs(moe.history_[1:])).all(), steps.min()
    assert moe.history_[-1] > moe.history_[0]


def test_standardisation_is_invisible_to_the_user():
    """Rescaling and shifting the covariates leaves predictions unchanged (Newton is affine invariant)."""
    x, y, _ = planted("gaussian", n=800)
    a = MixtureOfExperts(2, seed=3, progress=False, ridge=0.0).fit(x, y)
    shifted = x * np.array([1000.0, 0.01]) + np.array([5e3, -2.0])
    b = MixtureOfExperts(2, seed=3, progress=False, ridge=0.0).fit(shifted, y)
    np.testing.assert_allclose(a.predict(x), b.predict(shifted), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a.coef_.numpy(), b.coef_.numpy() * np.array([1000.0, 0.01]), rtol=1e-5, atol=1e-6)
    # without standardisation the random start differs, but EM reaches the same optimum
    c = MixtureOfExperts(2, seed=3, progress=False, ridge=0.0, standardize=False, tol=1e-10).fit(x, y)
    np.testing.assert_allclose(a.predict(x), c.predict(x), atol=1e-3)


@pytest.mark.parametrize("expert", ["gaussian", "logistic"])
def test_a_warm_start_continues_from_the_model_it_holds_whatever_its_scales(expert):
    """A model built on the user's scale (no standardisation) continues from exactly itself on new data."""
    x, y, _ = planted(expert, n=600)
    x = x * np.array([50.0, 0.1]) + np.array([7.0, -3.0])  # far from standardised
    fitted = MixtureOfExperts(2, expert=expert, seed=0, progress=False).fit(x, y)
    names = ("gate_coef", "gate_intercept", "coef", "intercept")
    params = {name: getattr(fitted, f"{name}_").numpy() for name in names}
    if expert == "gaussian":
        params["scale"] = fitted.scale_.numpy()
    given = MixtureOfExperts.from_parameters(**params, engine="em", ridge=0.0)  # the objective is the log-likelihood
    start = float(given._pointwise_log_likelihood(given.prepare_data(x, y)).mean())
    given.fit(x, y, warm_start=True, n_init=1, max_iter=2)
    assert given.history_[0] == pytest.approx(start, rel=1e-9)
    assert given.history_[-1] >= given.history_[0]  # EM from the fitted optimum stays at or near it
    np.testing.assert_allclose(given.predict(x), fitted.predict(x), atol=1e-2)


def test_canonical_order_and_identifiable_gate():
    x, y, _ = planted("gaussian", n=1000)
    moe = MixtureOfExperts(3, seed=0, progress=False).fit(x, y)
    mean_gate = moe.gate_probabilities(x).mean(0)
    assert (np.diff(mean_gate) <= 0).all()
    assert np.all(moe.gate_coef_[-1].numpy() == 0.0) and float(moe.gate_intercept_[-1]) == 0.0


def test_predictions_gaussian_and_logistic():
    x, y, truth = planted("gaussian", n=500)
    mean = truth.predict(x)
    probs = truth.gate_probabilities(x)
    np.testing.assert_allclose(mean, (probs * (x @ truth.coef_.numpy().T + truth.intercept_.numpy())).sum(1))
    assert not hasattr(truth, "predict_proba")  # a regression: predict gives E[y | x]
    xl, yl, logistic = planted("logistic", n=500)
    proba = logistic.predict_proba(xl)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    assert set(np.unique(logistic.predict(xl))) <= {0.0, 1.0}
    assert (logistic.predict(xl) == yl).mean() > 0.8
    post = latent_posterior(logistic, xl, yl)["z"]
    np.testing.assert_allclose(post.sum(1), 1.0)


def test_logistic_predict_proba_is_a_valid_probability_and_the_gate_weighted_mean():
    """Saturated experts (sigmoid = 1) under a three-way gate: summing gate-weighted sigmoids gave 1 + 2e-16."""
    rng = np.random.default_rng(0)
    gate_coef, gate_intercept = np.array([[0.126], [-0.132], [0.640]]), np.array([0.105, -0.536, 0.362])
    x = rng.uniform(-1, 1, size=(200, 1))
    saturated_up, saturated_down, moderate = [50.0] * 3, [-50.0] * 3, [0.7, 0.35, -0.7]
    for slopes, shift in [(saturated_up, 40.0), (saturated_down, -40.0), (moderate, -0.2)]:
        moe = MixtureOfExperts.from_parameters(
            gate_coef=gate_coef, gate_intercept=gate_intercept, coef=np.array(slopes)[:, None], intercept=[shift] * 3
        )
        proba = moe.predict_proba(x)
        assert proba.min() >= 0.0 and proba.max() <= 1.0, (proba.min(), proba.max())
        np.testing.assert_allclose(proba.sum(1), 1.0, rtol=0, atol=1e-15)
        expected = (moe.gate_probabilities(x) * moe.experts_.predict_proba(torch.as_tensor(x)).numpy()).sum(1)
        np.testing.assert_allclose(proba[:, 1], np.clip(expected, 0, 1), rtol=1e-12, atol=1e-15)


def test_from_parameters_takes_constructor_keywords_including_progress():
    params = {"gate_coef": [[1.0], [0.0]], "gate_intercept": [0.0, 0.0], "coef": [[1.0], [-1.0]], "intercept": [0, 0]}
    assert MixtureOfExperts.from_parameters(**params).progress is False  # the default of a model built here
    moe = MixtureOfExperts.from_parameters(**params, progress=True, seed=3, ridge=0.5)
    assert (moe.progress, moe.seed, moe.ridge, moe.expert) == (True, 3, 0.5, "logistic")
    assert MixtureOfExperts.from_parameters(**params, progress=False).progress is False


def test_sample_follows_the_model():
    x, _, truth = planted("gaussian", n=20000)
    draws = truth.sample(x)
    assert draws["y"].shape == (20000,) and set(np.unique(draws["z"])) <= {0, 1}
    resid = draws["y"] - truth.predict(x)
    assert abs(resid.mean()) < 0.05


def test_svi_reaches_the_em_optimum():
    x, y, _ = planted("gaussian", n=600)
    em = MixtureOfExperts(2, seed=0, progress=False).fit(x, y)
    svi = MixtureOfExperts(2, seed=0, progress=False).fit(x, y, engine="svi", num_steps=250, lr=0.1)
    assert svi.log_likelihood(x, y) / len(y) > em.log_likelihood(x, y) / len(y) - 0.05


def test_to_arviz_and_save_load(tmp_path):
    x, y, _ = planted("logistic", n=300)
    moe = MixtureOfExperts(2, expert="logistic", seed=0, progress=False).fit(x, y)
    idata = moe.to_arviz(x, y, approximation=None, groups=["log_likelihood", "discrete_posterior"])
    assert idata.posterior["coef"].shape == (1, 1, 2, 2)
    # at the polished optimum the objective is strictly concave: "auto" draws from its Laplace approximation
    assert moe.to_arviz(x, y).posterior["coef"].shape == (1, 100, 2, 2)
    assert idata.log_likelihood["y"].shape == (1, 1, 300)
    assert idata.discrete_posterior["z_probs"].shape == (1, 1, 300, 2)
    moe.save(tmp_path / "moe")
    loaded = MixtureOfExperts.load(tmp_path / "moe")
    np.testing.assert_allclose(loaded.predict_proba(x), moe.predict_proba(x), rtol=1e-12)
    assert loaded.log_likelihood(x, y) / len(y) == pytest.approx(moe.log_likelihood(x, y) / len(y), rel=1e-12)


@pytest.mark.parametrize("priors", [None, {}])
def test_mcmc_runs_with_proper_priors(priors):
    """The default priors, or those of ``priors`` (the gate's free rows one correlated site each)."""
    x, y, _ = planted("gaussian", n=120)
    moe = MixtureOfExperts(2, priors=priors, seed=0, progress=False)
    moe.fit(x, y, engine="mcmc", num_samples=10, warmup_steps=10)
    assert np.isfinite(moe.log_likelihood(x, y) / len(y))
    assert moe.mcmc_samples_["gate_coef"].shape == (2, 10, 1, 2)  # two chains by default


@pytest.mark.parametrize(
    "kwargs, fit_args, error, match",
    [
        ({}, "no_y", ValueError, "y is required"),
        ({}, "short_y", ValueError, r"y must have shape \(200,\)"),
        ({}, "nan_x", ValueError, "X contains NaN"),
        ({}, "nan_y", ValueError, "y contains NaN"),
        ({"expert": "logistic"}, "nonbinary", ValueError, "binary"),
        ({"n_experts": 30}, "ok", ValueError, "not more than the"),
        ({"n_experts": 1}, "ok", ValueError, "n_experts must be >= 2"),
        ({"expert": "gamma"}, "ok", ValueError, "expert must be one of"),
        ({"init_params": "magic"}, "ok", ValueError, "init_params"),
        ({"split_merge": -1}, "ok", ValueError, "split_merge must be a non-negative integer"),
        ({"split_merge_search": "all"}, "ok", ValueError, "split_merge_search must be one of"),
        ({}, "strings", TypeError, "y must be numeric"),
        ({"priors": {"variance_rat": 1.0}}, "ok", ValueError, "priors has an unknown key 'variance_rat'"),
        ({"priors": {"slope_scale": -1.0}}, "ok", ValueError, r"priors\['slope_scale'\] must be positive"),
        (
            {"priors": {"gate_slope_scale": [1.0, 2.0]}},
            "ok",
            ValueError,
            r"priors\['gate_slope_scale'\] must be a number, not an array",
        ),
        ({"priors": {}, "ridge": 1.0}, "ok", ValueError, "ridge and priors cannot both be set"),
        ({"priors": 1.0}, "ok", TypeError, "priors must be None or a dict"),
    ],
    ids=[
        "no-y",
        "short-y",
        "nan-x",
        "nan-y",
        "non-binary-logistic",
        "too-few-rows",
        "one-expert",
        "bad-expert",
        "bad-init",
        "negative-split-merge",
        "bad-split-merge-search",
        "string-y",
        "unknown-prior-key",
        "negative-prior-scale",
        "prior-array",
        "ridge-and-priors",
        "priors-not-a-dict",
    ],
)
def test_bad_input_is_named(kwargs, fit_args, error, match):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 3)), rng.normal(size=200)
    if kwargs.get("expert") == "logistic":
        y = np.round(rng.random(200) * 2)  # 0, 1 and 2
    args = {
        "no_y": (x, None),
        "short_y": (x, y[:-1]),
        "nan_x": (np.where(np.eye(200, 3) > 0, np.nan, x), y),
        "nan_y": (x, np.r_[np.nan, y[1:]]),
        "nonbinary": (x, y),
        "ok": (x, y),
        "strings": (x, np.array(["a"] * 200)),
    }[fit_args]
    with pytest.raises(error, match=match):
        MixtureOfExperts(**{"n_experts": 2, **kwargs}, progress=False).fit(*args)


def test_unfitted_and_wrong_width_are_clear_errors():
    moe = MixtureOfExperts(2, progress=False)
    with pytest.raises(NotFittedError):
        moe.predict(np.zeros((2, 2)))
    x, y, truth = planted("gaussian", n=50)
    with pytest.raises(ValueError, match="features"):
        truth.predict(np.zeros((3, 5)))


def test_dataset_follows_the_paper_setting():
    data = make_moe(4000, seed=5)
    assert data.X.shape == (4000, 20) and np.isin(data.labels, range(4)).all()
    for values in (data.gate_coef[:-1], data.coef, data.intercept, data.centres):
        assert np.all(values == np.round(values)) and np.abs(values).max() <= 5
    assert np.all(data.gate_coef[-1] == 0)
    # covariates: Sigma_uv = 0.25^|u-v| around the nearest centre
    centre = data.centres[np.argmin(((data.X[:, None] - data.centres[None]) ** 2).sum(-1), 1)]
    cov = np.cov((data.X - centre).T)
    lags = np.abs(np.subtract.outer(np.arange(20), np.arange(20)))
    np.testing.assert_allclose(cov, 0.25**lags, atol=0.08)
    # responses: residuals against the true expert have the planted variances
    resid = data.y - (np.einsum("nd,nd->n", data.X, data.coef[data.labels]) + data.intercept[data.labels])
    for k in range(4):
        if (data.labels == k).sum() > 200:
            assert np.var(resid[data.labels == k]) == pytest.approx(data.scale[k] ** 2, rel=0.2)
    again = make_moe(4000, seed=5)
    np.testing.assert_array_equal(again.y, data.y)


@pytest.mark.filterwarnings("ignore:EM did not converge")
@pytest.mark.parametrize("expert", ["logistic", "softmax"])
def test_with_a_large_ridge_the_objective_is_the_penalised_log_likelihood_and_never_falls(expert):
    """Known answer: for classifying experts ``lower_bound_`` is the log-likelihood less ``ridge / 2`` times the
    squared standardised slopes (the experts', and the gate's about their mean over the gates), which every M-step
    raises."""
    data = make_moe(1500, expert="logistic", n_experts=3, n_features=4, seed=2)
    moe = MixtureOfExperts(3, expert=expert, seed=1, progress=False, max_iter=40, tol=0.0, ridge=0.5)
    moe.fit(data.X, data.y)
    steps = np.diff(moe.history_)
    assert (steps >= -1e-9 * np.abs(moe.history_[1:])).all(), steps.min()
    gate = moe._gate.coef
    slopes = (gate - gate.mean(0)).square().sum() + moe._experts.coef.square().sum()
    assert float(moe._ridge_penalty()) == pytest.approx(0.25 * float(slopes), rel=1e-12) and float(slopes) > 1.0
    n = len(data.y)
    expected = (moe.log_likelihood(data.X, data.y) - float(moe._ridge_penalty())) / n
    assert moe.lower_bound_ == pytest.approx(expected, rel=1e-10)


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_gaussian_experts_objective_is_the_penalised_log_likelihood_and_never_falls():
    """Known answer: for Gaussian experts ``lower_bound_`` is the log-likelihood less ``ridge / 2`` times the gate's
    squared standardised slopes about their mean and ``ridge ||coef_k||^2 / (2 scale_k^2)`` per expert, which every
    M-step raises."""
    x, y, _ = planted("gaussian", n=400)
    moe = MixtureOfExperts(2, seed=0, progress=False, ridge=0.5, max_iter=40, tol=0.0).fit(x, y)
    steps = np.diff(moe.history_)
    assert (steps >= -1e-9 * np.abs(moe.history_[1:])).all(), steps.min()
    gate = 0.25 * float((moe._gate.coef - moe._gate.coef.mean(0)).square().sum())
    experts = 0.5 * moe._experts.coef.square().sum(-1) / (2 * moe._experts.scale.square())
    assert float(moe._ridge_penalty()) == pytest.approx(gate + float(experts.sum()), rel=1e-12) and gate > 0.1
    expected = (moe.log_likelihood(x, y) - float(moe._ridge_penalty())) / len(y)
    assert moe.lower_bound_ == pytest.approx(expected, rel=1e-10)


# ------------------------------------------------------------------------------------------ sample weights
QUIET = {"seed": 0, "progress": False}


def _weighted_data(expert: str, n: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, integer weights 0..3)``; softmax experts get three classes."""
    x, y = make_expert_data(n, expert="logistic" if expert == "softmax" else expert)
    if expert == "softmax":
        y = y + (x[:, 1] > 1.5)
    weight = np.random.default_rng(1).integers(0, 4, n)
    weight[:2] = (1, 3)
    return x, y, weight


def _relative_gap(a: MixtureOfExperts, b: MixtureOfExperts) -> float:
    ga, gb = a._get_globals(), b._get_globals()
    return max(float(((ga[name] - gb[name]).abs() / (1 + gb[name].abs())).max()) for name in gb)


@pytest.mark.parametrize("expert", ["gaussian", "logistic", "poisson", "softmax"])
def test_weighted_em_hooks_equal_the_repeated_rows(expert):
    """The EM hooks on weighted rows and on the rows repeated, from the same generator: the random start (its
    draws do not depend on the rows) and its M-step, the E-step's objective and each row's responsibilities (its
    copies'), the next M-step (responsibilities times the weights) and the number of observations."""
    x, y, weight = _weighted_data(expert)
    weighted = MixtureOfExperts(2, expert=expert, n_init=1, split_merge=0, polish=False, **QUIET)
    weighted.fit(x, y, sample_weight=weight, max_iter=1)  # the scales (and classes) of the weighted rows
    repeated = copy.deepcopy(weighted)
    rows = weighted.prepare_data(x, y)
    counts = torch.as_tensor(weight)
    rows_w, rows_r = Weighted(rows, counts.to(rows[0])), tuple(v.repeat_interleave(counts, 0) for v in rows)
    weighted._em_initialize(rows_w, weighted._generator(1))
    repeated._em_initialize(rows_r, repeated._generator(1))
    assert _relative_gap(weighted, repeated) < 1e-10
    (resp_w, objective_w), (resp_r, objective_r) = weighted._e_step(rows_w), repeated._e_step(rows_r)
    torch.testing.assert_close(objective_w, objective_r, rtol=1e-12, atol=0)
    torch.testing.assert_close(resp_w.repeat_interleave(counts, 0), resp_r, rtol=1e-12, atol=1e-14)
    weighted._m_step(rows_w, resp_w)
    repeated._m_step(rows_r, resp_r)
    assert _relative_gap(weighted, repeated) < 1e-10
    assert weighted._n_observations(rows_w) == repeated._n_observations(rows_r) == weight.sum()


@pytest.mark.parametrize("expert", ["gaussian", "logistic", "poisson"])
def test_a_default_fit_with_integer_weights_is_the_fit_of_the_repeated_rows(expert):
    """Everything the default fit does is weighted (scales, random start, restarts, EM, split-and-merge, polish):
    integer weights, zeros among them, give the fit of the rows repeated and the zero-weight rows dropped, and
    the weighted score is the repeated rows' score. From the same start (tests/models/test_contract.py) the
    parameters agree to 1e-10; over a whole fit the Newton M-steps and the polish stop on comparisons of
    objective values that differ by rounding, so the parameters agree to about the square root of that."""
    x, y, weight = _weighted_data(expert, n=80)
    weighted = MixtureOfExperts(2, expert=expert, n_init=2, **QUIET).fit(x, y, sample_weight=weight)
    repeated = MixtureOfExperts(2, expert=expert, n_init=2, **QUIET).fit(x.repeat(weight, 0), y.repeat(weight))
    assert weighted.lower_bound_ == pytest.approx(repeated.lower_bound_, rel=1e-10)
    assert _relative_gap(weighted, repeated) < 1e-6
    assert weighted.score(x, y, sample_weight=weight) == pytest.approx(
        repeated.score(x.repeat(weight, 0), y.repeat(weight)), rel=1e-9
    )


@pytest.mark.parametrize("expert", ["gaussian", "logistic", "poisson"])
def test_weights_of_one_give_the_unweighted_fit_bit_for_bit(expert):
    x, y, _ = _weighted_data(expert)
    ones = MixtureOfExperts(2, expert=expert, n_init=2, **QUIET).fit(x, y, sample_weight=np.ones(len(y)))
    plain = MixtureOfExperts(2, expert=expert, n_init=2, **QUIET).fit(x, y)
    assert ones.history_ == plain.history_
    for name, value in plain._get_globals().items():
        assert torch.equal(ones._get_globals()[name], value), name


@pytest.mark.parametrize(
    "options, weight, match",
    [
        ({"split_merge_search": "screened"}, np.ones(60), "sample_weight with split_merge_search='screened'"),
        ({"engine": "svi"}, np.ones(60), "sample_weight is taken by engine='em' only"),
        ({}, np.r_[np.ones(6), np.zeros(54)], "6 rows of positive sample_weight"),
        ({}, np.r_[-1.0, np.ones(59)], "sample_weight must be finite and non-negative"),
    ],
    ids=["screened-search", "svi", "too-few-positive-rows", "negative"],
)
def test_sample_weight_refusals_name_it(options, weight, match):
    x, y, _ = _weighted_data("gaussian")
    engine = {"engine": options.pop("engine")} if "engine" in options else {}
    with pytest.raises(ValueError, match=match):
        MixtureOfExperts(2, **options, **QUIET).fit(x, y, sample_weight=weight, **engine)


# ----------------------------------------------------------------------------------------- priors=
PRIOR_EXPERTS = ["gaussian", "logistic", "poisson", "softmax"]


@pytest.mark.parametrize("expert", PRIOR_EXPERTS)
def test_a_strong_prior_pulls_the_map_fit_to_the_prior_mean(expert):
    """Prior sds of 1e-3 on every slope and intercept: MAP-EM ends at the prior means (slopes and gate intercepts
    0; the experts' intercepts 0, log mean(y) for Poisson, mean(y) for Gaussian experts), where the maximum-likelihood
    fit's slopes are far from 0."""
    x, y = make_expert_data(60, expert=expert)
    tight = {"gate_slope_scale": 1e-3, "gate_intercept_scale": 1e-3, "slope_scale": 1e-3, "intercept_scale": 1e-3}
    ml = MixtureOfExperts(2, expert=expert, seed=0, progress=False).fit(x, y)
    assert np.abs(ml._experts.coef.numpy()).max() > 0.5
    moe = MixtureOfExperts(2, expert=expert, priors=tight, seed=0, progress=False).fit(x, y)
    centre = {"gaussian": y.mean(), "poisson": np.log(max(y.mean(), 1e-3))}.get(expert, 0.0)
    for name in ("coef", "intercept"):
        gate = getattr(moe._gate, name).numpy()
        np.testing.assert_allclose(gate, 0.0, atol=1e-4)
    np.testing.assert_allclose(moe._experts.coef.numpy(), 0.0, atol=1e-4 * (y.std() if expert == "gaussian" else 1))
    intercept = moe._experts.intercept.numpy()
    expected = np.zeros_like(intercept) if expert == "softmax" else np.full_like(intercept, centre)
    np.testing.assert_allclose(intercept, expected, atol=1e-4 * (y.std() if expert == "gaussian" else 1))


@pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")
@pytest.mark.parametrize("expert", PRIOR_EXPERTS)
def test_one_prior_for_mcmc_map_em_and_svi(expert):
    """At the same parameters (the MAP fit and a perturbation of it): the log prior density of the program's global
    sites under ``bayesian()`` (what MCMC samples and ``to_arviz``'s prior group draws) is :meth:`_log_prior`, EM's
    penalty is minus it, the gate's and experts' ``penalty()`` (what the M-steps maximise against) differ from
    that penalty by one constant, and SVI's objective (point-mass guide, the priors of ``_fitting_priors``) is EM's."""
    from pyro import poutine
    from pyro.infer import TraceEnum_ELBO

    from ppmix.engines.params import local_params

    x, y = make_expert_data(60, expert=expert)
    moe = MixtureOfExperts(2, expert=expert, priors={"slope_scale": 2.0, "gate_slope_scale": 3.0}, seed=0)
    moe.set_params(progress=False, max_iter=10).fit(x, y)
    data = moe.prepare_data(x, y)
    fitted = moe._get_globals()
    gen = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in fitted.items()}
    if "scale" in perturbed:
        perturbed["scale"] = perturbed["scale"].abs() + 0.1
    constants = []
    for point in (fitted, perturbed):
        moe._set_globals(point)
        values = moe._get_globals()  # softmax experts: the reference class shifted to zero
        with local_params(), moe.bayesian():
            trace = poutine.trace(poutine.condition(moe.model, values)).get_trace(data)
        program = sum(trace.nodes[name]["fn"].log_prob(trace.nodes[name]["value"]).sum() for name in values)
        assert float(program) == pytest.approx(float(moe._log_prior()), rel=1e-12)
        assert float(moe._ridge_penalty()) == pytest.approx(-float(moe._log_prior()), rel=1e-12)
        constants.append(float(moe._gate.penalty().sum() + moe._experts.penalty().sum() - moe._ridge_penalty()))
        _, em_objective = moe._e_step(data)
        with local_params(), moe._fitting_priors():
            svi_objective = -TraceEnum_ELBO(max_plate_nesting=1).loss(moe.model, moe.guide, data)
        assert svi_objective == pytest.approx(float(em_objective), rel=1e-10)
    assert constants[0] == pytest.approx(constants[1], rel=1e-10)


def test_priors_survive_clone_and_save_load(tmp_path):
    """``priors`` is a constructor argument (``clone`` keeps it); a loaded model keeps it and the response's scale
    that the Gaussian experts' priors are set in, so its log prior is the saved model's."""
    from sklearn.base import clone

    x, y = make_expert_data(60)
    priors = {"slope_scale": 3.0, "variance_rate": 0.1}
    moe = MixtureOfExperts(2, priors=priors, seed=0, progress=False, max_iter=10).fit(x, y)
    assert clone(moe).priors == priors
    moe.save(tmp_path / "moe")
    loaded = MixtureOfExperts.load(tmp_path / "moe")
    assert loaded.priors == priors
    assert float(loaded._log_prior()) == pytest.approx(float(moe._log_prior()), rel=1e-12)
    np.testing.assert_allclose(loaded.predict(x), moe.predict(x), rtol=1e-12)
