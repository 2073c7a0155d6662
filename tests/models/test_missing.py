"""Missing values (``missing="marginalize"``): marginal densities, exact EM, imputation, and bad input named."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.stats import multivariate_normal, norm

from ppmix import GMM, HMM, Mixture
from ppmix._validation import InvalidDataError
from ppmix.components.gaussian_missing import marginal_log_prob
from ppmix.inference import ConvergenceWarning
from ppmix.models._missing import fill_column_means
from ppmix.models.batch import Batch

COVARIANCES = ["diag", "full", "spherical", "tied"]
QUIET = {"seed": 0, "progress": False}


def planted(n: int = 1500, d: int = 4, seed: int = 0, fraction: float = 0.2):
    """Two correlated Gaussian clusters; ``(complete X, X with a fraction of entries NaN, mask)`` (no row empty)."""
    rng = np.random.default_rng(seed)
    cov = 0.6 * np.ones((d, d)) + 0.4 * np.eye(d)
    x = np.concatenate(
        [rng.multivariate_normal(np.zeros(d), cov, n // 2), rng.multivariate_normal(np.full(d, 4.0), cov, n - n // 2)]
    )
    mask = rng.random(x.shape) < fraction
    mask[mask.all(1), 0] = False
    holes = x.copy()
    holes[mask] = np.nan
    return x, holes, mask


def _fit(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(x)


@pytest.mark.parametrize("covariance_type", COVARIANCES)
def test_a_row_scores_by_the_marginal_of_its_observed_entries(covariance_type):
    """Known answer: ``score_samples`` of a row with missing entries is ``log sum_k w_k N(x_o; mu_k[o], S_k[o,o])``
    (scipy's densities), and a complete row's is the model's usual one."""
    x, holes, _ = planted()
    gmm = _fit(GMM(2, covariance_type=covariance_type, missing="marginalize", **QUIET), holes)
    rows = np.array([[0.5, np.nan, np.nan, -0.2], [np.nan, 3.0, np.nan, np.nan], x[0]])
    weights, means = gmm.weights_.numpy(), gmm.means_.numpy()
    covs = gmm.covariances_.numpy()
    covs = covs if covs.ndim == 3 else np.stack([np.diag(c) for c in covs])
    for row, got in zip(rows, gmm.score_samples(rows)):
        o = ~np.isnan(row)
        want = np.log(
            sum(w * multivariate_normal(m[o], c[np.ix_(o, o)]).pdf(row[o]) for w, m, c in zip(weights, means, covs))
        )
        assert got == pytest.approx(want, rel=1e-10)


def test_one_observed_coordinate_is_its_univariate_marginal():
    loc = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    cov = torch.tensor([[[2.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 0.5]]], dtype=torch.float64)
    x = torch.tensor([[np.nan, -1.0, np.nan]], dtype=torch.float64)
    assert float(marginal_log_prob(x, loc, cov)) == pytest.approx(norm(-2.0, 1.0).logpdf(-1.0), rel=1e-12)


def assert_nothing_missing_is_the_usual_fit(make, x) -> None:
    """``make(missing)`` fitted on complete rows: the same history and means with ``missing="marginalize"``."""
    plain, marginal = _fit(make("error"), x), _fit(make("marginalize"), x)
    assert marginal.history_ == plain.history_
    assert torch.equal(marginal.means_, plain.means_)


@pytest.mark.parametrize("covariance_type", COVARIANCES)
def test_with_nothing_missing_the_fit_is_the_usual_one(covariance_type):
    x, _, _ = planted(600)
    assert_nothing_missing_is_the_usual_fit(lambda m: GMM(2, covariance_type=covariance_type, missing=m, **QUIET), x)


@pytest.mark.parametrize("covariance_type", COVARIANCES)
def test_em_with_missing_entries_never_decreases_the_observed_log_likelihood(covariance_type):
    _, holes, _ = planted(800, fraction=0.3)
    gmm = _fit(GMM(2, covariance_type=covariance_type, missing="marginalize", max_iter=30, tol=0.0, **QUIET), holes)
    history = np.asarray(gmm.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()
    # the E-step's objective is the mean of score_samples: the marginal log-likelihood of the observed entries
    assert gmm.score(holes) == pytest.approx(float(np.mean(gmm.score_samples(holes))), rel=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_em_converges_to_a_stationary_point_of_the_observed_data_likelihood(covariance_type):
    """Exact EM: at convergence the gradient of the observed entries' log-likelihood (autograd through the marginal
    densities) in the mean and the covariance's Cholesky factor vanishes (one component, 30 % missing), where
    at the fit to column-mean-filled rows it does not."""
    _, holes, _ = planted(400, d=3, fraction=0.3)
    holes = holes[:200]  # one cluster
    x = torch.as_tensor(holes)

    def gradient(gmm):
        loc = gmm.means_.clone().requires_grad_(True)
        cov = gmm.covariances_ if covariance_type == "full" else torch.diag_embed(gmm.covariances_)
        chol = torch.linalg.cholesky(cov).clone().requires_grad_(True)
        covariance = chol @ chol.transpose(1, 2)
        if covariance_type == "diag":
            covariance = torch.diagonal(covariance, dim1=1, dim2=2)
        marginal_log_prob(x, loc, covariance).sum().backward()
        grad = chol.grad if covariance_type == "full" else torch.diagonal(chol.grad, dim1=1, dim2=2)
        return max(float(loc.grad.abs().max()), float(grad.abs().max()))

    options = {"covariance_type": covariance_type, "tol": 1e-13, "max_iter": 2000, **QUIET}
    assert gradient(_fit(GMM(1, missing="marginalize", **options), holes)) < 1e-3
    assert gradient(_fit(GMM(1, **options), fill_column_means(x).numpy())) > 1.0


def test_recovery_with_a_fifth_of_the_entries_missing_and_imputation_beats_column_means():
    """MCAR at 20 %: the means within 0.1 of the complete-data fit's, the complete held-out data's log-likelihood
    within 1 %, and ``impute``'s RMSE below column-mean imputation's."""
    x, holes, mask = planted(3000, d=5)
    held_out, _, _ = planted(1000, d=5, seed=1)
    complete = _fit(GMM(2, covariance_type="full", **QUIET), x)
    marginal = _fit(GMM(2, covariance_type="full", missing="marginalize", **QUIET), holes)
    order = lambda m: np.argsort(m.means_.numpy()[:, 0])  # noqa: E731
    assert np.abs(marginal.means_.numpy()[order(marginal)] - complete.means_.numpy()[order(complete)]).max() < 0.1
    assert marginal.score(held_out) == pytest.approx(complete.score(held_out), rel=0.01)
    imputed = marginal.impute(holes)
    assert not np.isnan(imputed).any() and np.array_equal(imputed[~mask], x[~mask])
    means_filled = fill_column_means(torch.as_tensor(holes)).numpy()
    rmse = lambda filled: np.sqrt(np.mean((filled[mask] - x[mask]) ** 2))  # noqa: E731
    assert rmse(imputed) < 0.7 * rmse(means_filled)


def test_impute_with_one_component_is_the_gaussian_conditional_mean():
    gmm = GMM(1, covariance_type="full", **QUIET)
    _fit(gmm, planted(400)[0][:200])
    mu, sigma = gmm.means_.numpy()[0], gmm.covariances_.numpy()[0]
    row = np.array([[1.0, np.nan, 0.5, np.nan]])
    o, m = ~np.isnan(row[0]), np.isnan(row[0])
    want = mu[m] + sigma[np.ix_(m, o)] @ np.linalg.solve(sigma[np.ix_(o, o)], row[0, o] - mu[o])
    np.testing.assert_allclose(gmm.impute(row)[0, m], want, rtol=1e-10)


def test_a_row_with_missing_entries_is_predicted_from_that_row_alone():
    _, holes, _ = planted(600)
    gmm = _fit(GMM(2, covariance_type="full", missing="marginalize", **QUIET), holes)
    batch = gmm.predict_proba(holes[:50])
    for i in (0, 7, 31):
        np.testing.assert_allclose(gmm.predict_proba(holes[i : i + 1])[0], batch[i], rtol=1e-12, atol=1e-15)


def test_unit_sample_weights_with_missing_entries_change_nothing():
    _, holes, _ = planted(600)
    plain = _fit(GMM(2, covariance_type="full", missing="marginalize", tol=1e-13, **QUIET), holes)
    weighted = GMM(2, covariance_type="full", missing="marginalize", tol=1e-13, **QUIET)  # both at the optimum
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        weighted.fit(holes, sample_weight=np.ones(len(holes)))
    order = lambda m: m.means_.numpy()[np.argsort(m.means_.numpy()[:, 0])]  # noqa: E731  (the starts differ)
    np.testing.assert_allclose(order(weighted), order(plain), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "make, x, error, match",
    [
        (lambda: GMM(2, **QUIET), [[1.0, np.nan], [2.0, 3.0], [1.0, 1.0]], ValueError, "X contains NaN"),
        (lambda: GMM(2, missing="marginalize", **QUIET), [[np.nan, np.nan], [2.0, 3.0]], ValueError, "row 0 has every"),
        (lambda: GMM(2, missing="impute", **QUIET), [[1.0, 2.0], [2.0, 3.0]], ValueError, "missing must be one of"),
        (
            lambda: Mixture(2, family={"name": "gmm", "covariance_type": "full"}, missing="marginalize", **QUIET),
            [[1.0, 2.0], [2.0, 3.0]],
            ValueError,
            "mixtures of diagonal Gaussians \\(gmm\\); got the 'gmm' family \\(covariance_type='full'\\)",
        ),
        (
            lambda: Mixture(2, family="poisson", missing="marginalize", **QUIET),
            [[1.0, np.nan], [2.5, 3.0], [1.0, 1.0]],
            InvalidDataError,
            "counts",
        ),
    ],
)
def test_bad_input_is_named(make, x, error, match):
    with pytest.raises(error, match=match):
        make().fit(np.asarray(x))


@pytest.mark.parametrize(
    "engine, options",
    [("svi", {"num_steps": 2}), ("mcmc", {"num_samples": 2, "warmup_steps": 2}), ("gibbs", {"num_samples": 2})],
)
@pytest.mark.parametrize("structure", ["GMM", "HMM"])
def test_the_pyro_engines_and_elbo_refuse_missing_entries_up_front(structure, engine, options, capsys):
    """Named before the program runs: no Pyro trace printed (only EM marginalises missing entries)."""
    _, holes, _ = planted(200)
    if structure == "GMM":
        model, data, complete = GMM(2, missing="marginalize", **QUIET), holes, np.nan_to_num(holes)
    else:
        model, data = HMM(2, missing="marginalize", **QUIET), [holes[:100], holes[100:]]
        complete = [np.nan_to_num(part) for part in data]
    with pytest.raises(ValueError, match=f"missing entries.*fit\\(engine='{engine}'\\)"):
        model.fit(data, engine=engine, **options)
    fitted = model.fit(complete)
    with pytest.raises(ValueError, match="missing entries.*elbo"):
        fitted.elbo(data)
    assert "Trace Shapes" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- HMM frames
def _chains(n_sequences: int = 12, fraction: float = 0.2, seed: int = 0):
    """Sticky two-state chains of correlated 3-D Gaussian frames: ``(complete, holed)`` lists of sequences."""
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, 0.7, 0.3], [0.7, 1.0, 0.5], [0.3, 0.5, 1.0]])
    complete, holed = [], []
    for _ in range(n_sequences):
        z = np.cumsum(rng.random(40) < 0.1) % 2
        x = np.where(z[:, None] == 1, 4.0, 0.0) + rng.multivariate_normal(np.zeros(3), cov, 40)
        mask = rng.random(x.shape) < fraction
        mask[mask.all(1), 0] = False
        h = x.copy()
        h[mask] = np.nan
        complete.append(x)
        holed.append(h)
    return complete, holed


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_hmm_frames_with_missing_entries_are_scored_by_their_marginal(covariance_type):
    """Known answer: the HMM's log-likelihood of one sequence of one frame with missing entries is the mixture
    of the initial distribution over the states' marginal densities (scipy's)."""
    _, holed = _chains()
    hmm = _fit(HMM(2, covariance_type=covariance_type, missing="marginalize", **QUIET), holed)
    frame = np.array([[0.5, np.nan, 1.0]])
    covs = hmm.covariances_.numpy()
    covs = covs if covs.ndim == 3 else np.stack([np.diag(c) for c in covs])
    o = ~np.isnan(frame[0])
    want = np.log(
        sum(
            p * multivariate_normal(m[o], c[np.ix_(o, o)]).pdf(frame[0, o])
            for p, m, c in zip(hmm.initial_.numpy(), hmm.means_.numpy(), covs)
        )
    )
    assert float(hmm.score_samples([frame])[0]) == pytest.approx(want, rel=1e-10)


def test_hmm_with_missing_entries_climbs_and_recovers_the_complete_data_fit():
    complete, holed = _chains()
    plain = _fit(HMM(2, covariance_type="full", **QUIET), complete)
    marginal = _fit(HMM(2, covariance_type="full", missing="marginalize", max_iter=200, **QUIET), holed)
    history = np.asarray(marginal.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()
    order = lambda m: np.argsort(m.means_.numpy()[:, 0])  # noqa: E731
    np.testing.assert_allclose(marginal.means_.numpy()[order(marginal)], plain.means_.numpy()[order(plain)], atol=0.15)
    paths = [p for p in marginal.decode(holed)[1]]
    truth = [p for p in plain.decode(complete)[1]]
    agreement = np.mean(np.concatenate(paths) == np.concatenate(truth))
    assert max(agreement, 1 - agreement) > 0.95  # Viterbi paths through the holes agree with the complete data's


def test_hmm_with_nothing_missing_is_the_usual_fit():
    complete, _ = _chains(6)
    plain = _fit(HMM(2, **QUIET), complete)
    marginal = _fit(HMM(2, missing="marginalize", **QUIET), complete)
    assert marginal.history_ == plain.history_


def test_hmm_refuses_nan_without_the_option_by_name():
    _, holed = _chains(3)
    with pytest.raises(ValueError, match=r"X\[0\] contains NaN"):
        HMM(2, **QUIET).fit(holed)


# ------------------------------------------------------------------------------- independent features
INDEPENDENT = ["poisson", "bernoulli", "categorical", "exponential", "gamma", "lognormal"]
#: the families of independent features, the Student-t (whose features share the latent precision), diagonal
#: and full ("student_t-full"), and the mixtures of diagonal Gaussians ("gmm", two per component)
MARGINALIZING = [*INDEPENDENT, "student_t", "student_t-full", "gmm"]
#: the family argument of the families above (their name but for the full Student-t)
FAMILY_ARGS = {"student_t-full": {"name": "student_t", "covariance_type": "full"}}


def _mixture(k: int, family: str, **options) -> Mixture:
    return Mixture(k, family=FAMILY_ARGS.get(family, family), **QUIET, **options)


def _correlated_t(rng, n: int, d: int, df: float = 4.0) -> np.ndarray:
    """``n`` rows of a ``d``-variate t (``df``) about 0 with unit scales and correlations 0.6."""
    cov = 0.6 * np.ones((d, d)) + 0.4 * np.eye(d)
    return rng.multivariate_normal(np.zeros(d), cov, n) / np.sqrt(rng.gamma(df / 2, 2 / df, (n, 1)))


def planted_features(family: str, n: int = 600, d: int = 3, seed: int = 0, fraction: float = 0.2):
    """Two clusters of ``family``'s data: ``(complete X, X with a fraction of entries NaN, mask)`` (no row empty)."""
    rng = np.random.default_rng(seed)
    low = rng.random(n) < 0.5
    draw = {
        "poisson": lambda a: rng.poisson(2.0 if a else 12.0, (n, d)),
        "bernoulli": lambda a: rng.random((n, d)) < (0.85 if a else 0.15),
        "categorical": lambda a: rng.choice(3, (n, d), p=[0.8, 0.1, 0.1] if a else [0.1, 0.2, 0.7]),
        "exponential": lambda a: rng.exponential(1.0 if a else 15.0, (n, d)),
        "gamma": lambda a: rng.gamma(2.0 if a else 20.0, 1.0 if a else 2.0, (n, d)),
        "lognormal": lambda a: np.exp(rng.normal(1.0 if a else 4.0, 0.5, (n, d))),
        "student_t": lambda a: (0.0 if a else 8.0) + rng.standard_t(4, (n, d)),
        "student_t-full": lambda a: (0.0 if a else 8.0) + _correlated_t(rng, n, d),
        "gmm": lambda a: (0.0 if a else 10.0) + rng.choice([-2.0, 2.0], (n, 1)) + 0.5 * rng.normal(size=(n, d)),
    }[family]
    x = np.where(low[:, None], draw(True), draw(False)).astype(float)
    mask = rng.random(x.shape) < fraction
    mask[mask.all(1), 0] = False
    holes = x.copy()
    holes[mask] = np.nan
    return x, holes, mask


def _feature_log_density(family: str, components, value: float, d: int) -> np.ndarray:
    """scipy's log-density (mass) of ``value`` in feature ``d`` under every component ``(K,)``."""
    p = {name: t.numpy() for name, t in components.state_dict().items()}
    if family == "poisson":
        return stats.poisson(p["rate"][:, d]).logpmf(value)
    if family == "bernoulli":
        return stats.bernoulli(p["probs"][:, d]).logpmf(value)
    if family == "categorical":
        return np.log(p["probs"][:, d, int(value)])
    if family == "exponential":
        return stats.expon(scale=1 / p["rate"][:, d]).logpdf(value)
    if family == "gamma":
        return stats.gamma(p["concentration"][:, d], scale=1 / p["rate"][:, d]).logpdf(value)
    if family == "student_t":  # the t's marginal of one feature: a univariate t with the same df
        return stats.t(p["df"], loc=p["loc"][:, d], scale=p["scale"][:, d]).logpdf(value)
    if family == "student_t-full":  # the same, with the scale sqrt(Sigma_dd)
        scale = np.sqrt((p["scale_tril"][:, d] ** 2).sum(1))
        return stats.t(p["df"], loc=p["loc"][:, d], scale=scale).logpdf(value)
    if family == "gmm":  # one feature's marginal: the mixture of the Gaussians' univariate marginals
        gaussians = stats.norm(p["loc"][:, :, d], p["scale"][:, :, d]).pdf(value)
        return np.log((p["mix_weights"] * gaussians).sum(1))
    return stats.lognorm(p["scale"][:, d], scale=np.exp(p["loc"][:, d])).logpdf(value)


@pytest.mark.parametrize("family", MARGINALIZING)
def test_a_row_with_one_observed_feature_scores_that_features_marginal(family):
    """Known answer: a row with one observed entry scores ``log sum_k w_k p_kd(x_d)`` (scipy's densities); a
    complete row (independent features) the sum over its features."""
    x, holes, _ = planted_features(family)
    mix = _fit(_mixture(2, family, missing="marginalize"), holes)
    weights = mix.weights_.numpy()
    value = x[0, 1]
    row = np.array([[np.nan, value, np.nan]])
    want = np.log(np.sum(weights * np.exp(_feature_log_density(family, mix.components_, value, 1))))
    assert float(mix.score_samples(row)[0]) == pytest.approx(want, rel=1e-10)
    if family.startswith("student_t") or family == "gmm":  # features not independent given the component
        return
    complete = sum(_feature_log_density(family, mix.components_, x[0, d], d) for d in range(3))
    assert float(mix.score_samples(x[:1])[0]) == pytest.approx(np.log(np.sum(weights * np.exp(complete))), rel=1e-10)


@pytest.mark.parametrize("family", MARGINALIZING)
def test_independent_features_with_nothing_missing_fit_as_usual(family):
    x, _, _ = planted_features(family, 300)
    assert_nothing_missing_is_the_usual_fit(lambda m: _mixture(2, family, missing=m), x)


@pytest.mark.parametrize("family", MARGINALIZING)
def test_em_with_missing_features_climbs(family):
    """EM never decreases the observed entries' log-likelihood (30 % missing), and its objective is the mean of
    ``score_samples``."""
    _, holes, _ = planted_features(family, 400, fraction=0.3)
    mix = _fit(_mixture(2, family, missing="marginalize", max_iter=25, tol=0.0), holes)
    history = np.asarray(mix.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()
    assert mix.score(holes) == pytest.approx(float(np.mean(mix.score_samples(holes))), rel=1e-12)


@pytest.mark.parametrize("family", INDEPENDENT)
def test_one_component_is_each_features_mle_on_its_observed_entries(family):
    """Known answer: with one component the M-step weighs each entry by whether it is observed, so the fit is each
    feature's MLE from its observed entries alone (the mean of the observed entries; log-normal: of their
    logarithms), not of the column-mean-filled rows."""
    _, holes, mask = planted_features(family, 300, fraction=0.3)
    mix = _fit(Mixture(1, family=family, missing="marginalize", **QUIET), holes)
    if family == "lognormal":
        got, want = mix.components_.loc.numpy()[0], np.nanmean(np.log(holes), axis=0)
    else:
        got, want = mix.means_.numpy()[0], np.nanmean(holes, axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-6 if family == "categorical" else 1e-10)


@pytest.mark.parametrize("family", MARGINALIZING)
def test_recovery_of_independent_features_with_a_fifth_missing(family):
    """MCAR at 20 %: the component means within 5 % (of the data's scale) of the complete-data fit's, the held-out
    log-likelihood within 1 %, and ``impute`` keeps the observed entries and fills the others with a mixture of the
    components' means (categorical: a level)."""
    x, holes, mask = planted_features(family, 1500)
    held_out, _, _ = planted_features(family, 500, seed=1)
    # three starts each: the gmm family's two-level structure has a poor local optimum that one start can reach
    complete = _fit(_mixture(2, family, n_init=3), x)
    marginal = _fit(_mixture(2, family, missing="marginalize", n_init=3), holes)
    order = lambda m: m.means_.numpy()[np.argsort(m.means_.numpy()[:, 0])]  # noqa: E731
    assert np.abs(order(marginal) - order(complete)).max() < 0.05 * np.abs(order(complete)).max()
    assert marginal.score(held_out) == pytest.approx(complete.score(held_out), rel=0.01)
    imputed = marginal.impute(holes)
    assert np.array_equal(imputed[~mask], x[~mask]) and not np.isnan(imputed).any()
    means = marginal.means_.numpy() if family != "gmm" else marginal.components_.loc.numpy().reshape(-1, x.shape[1])
    filled = np.where(mask, imputed, np.nan)
    if family == "categorical":  # a level
        assert set(np.unique(imputed[mask])) <= {0.0, 1.0, 2.0}
    elif family == "student_t-full":  # correlated features: the conditional means beat the columns' means
        column_means = np.where(mask, np.nanmean(holes, axis=0), holes)
        assert np.abs(imputed - x)[mask].mean() < np.abs(column_means - x)[mask].mean()
    else:  # a mixture of the components' means (gmm: of their Gaussians' means)
        assert (np.nanmin(filled, 0) >= means.min(0) - 1e-9).all() and (
            np.nanmax(filled, 0) <= means.max(0) + 1e-9
        ).all()


def test_impute_of_independent_features_is_the_posterior_mixture_of_the_means():
    """Known answer: a missing count is imputed as ``sum_k p(k | observed) rate_kd``; a missing level as the most
    probable level of the posterior mixture of the level probabilities."""
    _, holes, _ = planted_features("poisson")
    mix = _fit(Mixture(2, family="poisson", missing="marginalize", **QUIET), holes)
    row = np.array([[1.0, np.nan, 3.0]])
    posterior = mix.predict_proba(row)[0]
    assert mix.impute(row)[0, 1] == pytest.approx(float(posterior @ mix.means_.numpy()[:, 1]), rel=1e-12)
    _, holes, _ = planted_features("categorical")
    mix = _fit(Mixture(2, family="categorical", missing="marginalize", **QUIET), holes)
    posterior = mix.predict_proba(row - 1)[0]
    want = int(np.argmax(posterior @ mix.components_.probs.numpy()[:, 1]))
    assert mix.impute(row - 1)[0, 1] == want


@pytest.mark.parametrize("family", ["poisson", "gamma"])
def test_rows_with_missing_features_are_predicted_from_that_row_alone(family):
    _, holes, _ = planted_features(family, 300)
    mix = _fit(Mixture(2, family=family, missing="marginalize", **QUIET), holes)
    batch = mix.predict_proba(holes[:40])
    for i in (0, 7, 31):
        np.testing.assert_allclose(mix.predict_proba(holes[i : i + 1])[0], batch[i], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("family", ["poisson", "categorical", "gmm"])
def test_hmm_emissions_of_independent_features_with_missing_entries(family):
    """HMM frames (independent features, and mixtures of diagonal Gaussians): a one-frame sequence with one
    observed entry scores ``log sum_k initial_k p_kd(x_d)``; with nothing missing the fit is the usual one; with
    20 % missing Baum-Welch climbs."""
    x, holes, _ = planted_features(family, 200)
    complete = [x[:100], x[100:]]
    plain = _fit(HMM(2, emission=family, **QUIET), complete)
    assert _fit(HMM(2, emission=family, missing="marginalize", **QUIET), complete).history_ == plain.history_
    hmm = _fit(
        HMM(2, emission=family, missing="marginalize", max_iter=15, tol=0.0, **QUIET), [holes[:100], holes[100:]]
    )
    history = np.asarray(hmm.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()
    value = x[0, 2]
    want = np.log(np.sum(hmm.initial_.numpy() * np.exp(_feature_log_density(family, hmm.components_, value, 2))))
    assert float(hmm.score_samples([np.array([[np.nan, np.nan, value]])])[0]) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("family", ["poisson", "lognormal"])
def test_online_em_takes_batches_with_and_without_missing_features(family):
    """partial_fit: the statistics of a batch with missing entries (per feature) and of one without (the
    family's own: weighted sums, or the log-normal's Gaussian statistics) merge in either order."""
    x, holes, _ = planted_features(family, 400)
    for batches in ([holes[:200], x[200:]], [x[:200], holes[200:]]):
        mix = Mixture(2, family=family, missing="marginalize", **QUIET)
        for batch in batches:
            mix.partial_fit(batch)
        assert np.isfinite(mix.score(holes))


@pytest.mark.parametrize("family", ["student_t", "student_t-full"])
def test_student_t_em_with_missing_entries_reaches_a_stationary_point(family):
    """Exact ECM for the t: at convergence (one component, 30 % missing) the gradient of the observed entries'
    log-likelihood (autograd through the marginal t densities) in ``loc``, the scale (``log scale``; full: the
    Cholesky factor, its diagonal in logs) and ``log df`` vanishes."""
    from ppmix.components.student_t import FullStudentTComponents, StudentTComponents

    _, holes, _ = planted_features(family, 600, fraction=0.3)
    holes = holes[np.nanmean(holes, axis=1) < 4][:200]  # one cluster
    mix = _fit(_mixture(1, family, missing="marginalize", tol=1e-14, max_iter=3000), holes)
    fitted = mix.components_
    if family == "student_t":
        scale = fitted.scale.log()
    else:  # the factor's strictly lower part and the logarithms of its diagonal
        scale = fitted.scale_tril.tril(-1) + torch.diag_embed(torch.diagonal(fitted.scale_tril, dim1=1, dim2=2).log())
    params = [p.detach().clone().requires_grad_(True) for p in (fitted.loc, scale, fitted.df.log())]
    loc, scale, log_df = params
    if family == "student_t":
        components = StudentTComponents(log_df.exp(), loc, scale.exp())
    else:
        tril = scale.tril(-1) + torch.diag_embed(torch.diagonal(scale, dim1=1, dim2=2).exp())
        components = FullStudentTComponents(log_df.exp(), loc, tril)
    components.observed().log_prob(torch.as_tensor(holes)).sum().backward()
    assert max(float(p.grad.abs().max()) for p in params) < 1e-4


@pytest.mark.parametrize("family", ["poisson", "student_t", "student_t-full"])
def test_sample_weights_with_missing_features_are_repeated_rows(family):
    """Known answer: the E-step under integer sample weights with missing entries is that of the repeated rows: the
    same objective, and the M-step from its statistics the same components and mixing weights."""
    _, holes, _ = planted_features(family, 200)
    weight = np.random.default_rng(1).integers(1, 4, len(holes))
    mix = _fit(_mixture(2, family, missing="marginalize", max_iter=3), holes)
    weighted = mix._em_data(Batch(mix.prepare_data(holes), torch.as_tensor(weight, dtype=torch.float64)))
    repeated = mix._em_data(mix.prepare_data(np.repeat(holes, weight, axis=0)))

    def m_step(data):
        stats, objective = mix._e_step(data)
        fitted = copy.deepcopy(mix)
        fitted._em_update(stats)
        return float(objective), {**fitted.components_.state_dict(), "weights": fitted.weights_}

    (got_objective, got), (want_objective, want) = m_step(weighted), m_step(repeated)
    assert got_objective == pytest.approx(want_objective, rel=1e-12)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["poisson", "student_t", "multinomial"])
def test_shards_with_and_without_missing_features_fit_as_in_memory(family):
    """fit_em on shards with and without missing entries (the first complete) equals the in-memory fit (the
    multinomial's per-pattern statistics merge with the complete rows' sums)."""
    from ppmix.distributed import fit_em

    x, holes, _ = planted_counts(300) if family == "multinomial" else planted_features(family, 300)
    shards = [x[:100], holes[100:200], holes[200:]]
    options = {"family": family, "missing": "marginalize", "max_iter": 10, **QUIET}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sharded = fit_em(Mixture(2, **options), shards, executor="inline")
        in_memory = Mixture(2, **options).fit(np.concatenate(shards))
    order = lambda m: m.means_.numpy()[np.argsort(m.means_.numpy()[:, 0])]  # noqa: E731
    np.testing.assert_allclose(order(sharded), order(in_memory), rtol=1e-8)


@pytest.mark.parametrize("family", ["gmm"])
def test_one_component_mixture_of_gaussians_reaches_a_stationary_point(family):
    """Exact EM for a mixture of diagonal Gaussians inside a component: at convergence (one component, 30 %
    missing) the gradient of the observed entries' log-likelihood (autograd through the view's marginal
    densities) in the mixing logits, the means and the log scales vanishes."""
    from ppmix.components.gaussian_mixture import DiagGaussianMixtures

    _, holes, _ = planted_features(family, 600, fraction=0.3)
    holes = holes[np.nanmean(holes, axis=1) < 5][:250]  # one cluster (two Gaussians)
    mix = _fit(Mixture(1, family=family, missing="marginalize", tol=1e-14, max_iter=3000, **QUIET), holes)
    fitted = mix.components_
    params = [
        p.detach().clone().requires_grad_(True) for p in (fitted.mix_weights.log(), fitted.loc, fitted.scale.log())
    ]
    logits, loc, log_scale = params
    components = DiagGaussianMixtures(torch.softmax(logits, -1), loc, log_scale.exp())
    components.observed().log_prob(torch.as_tensor(holes)).sum().backward()
    assert max(float(p.grad.abs().max()) for p in params) < 1e-4


# ------------------------------------------------------------------------------------------ multinomial
def planted_counts(n: int = 600, seed: int = 0, fraction: float = 0.2):
    """Two clusters of count vectors over 4 categories (totals 30 and 50): ``(complete, holed, mask)``, every row
    left with two observed categories at least."""
    rng = np.random.default_rng(seed)
    low = rng.random(n) < 0.5
    x = np.where(
        low[:, None], rng.multinomial(30, [0.6, 0.2, 0.1, 0.1], n), rng.multinomial(50, [0.1, 0.2, 0.3, 0.4], n)
    ).astype(float)
    mask = rng.random(x.shape) < fraction
    mask[mask.sum(1) > 2, :2] = False
    holes = x.copy()
    holes[mask] = np.nan
    return x, holes, mask


def test_a_count_row_with_two_observed_categories_scores_the_renormalised_binomial():
    """Known answer: a row observing categories 0 and 2 only scores ``log sum_k w_k Binom(x_0 | x_0 + x_2,
    p_k0 / (p_k0 + p_k2))`` (scipy's), the conditional likelihood of its observed counts given their total; a
    complete row its multinomial."""
    x, holes, _ = planted_counts()
    mix = _fit(Mixture(2, family="multinomial", missing="marginalize", **QUIET), holes)
    weights, probs = mix.weights_.numpy(), mix.components_.probs.numpy()
    row = np.array([[7.0, np.nan, 3.0, np.nan]])
    want = np.log(np.sum(weights * stats.binom(10, probs[:, 0] / (probs[:, 0] + probs[:, 2])).pmf(7)))
    assert float(mix.score_samples(row)[0]) == pytest.approx(want, rel=1e-10)
    complete = np.log(np.sum(weights * np.array([stats.multinomial(x[0].sum(), p).pmf(x[0]) for p in probs])))
    assert float(mix.score_samples(x[:1])[0]) == pytest.approx(complete, rel=1e-10)


def test_multinomial_with_nothing_missing_fits_as_usual():
    x, _, _ = planted_counts(300)
    assert_nothing_missing_is_the_usual_fit(lambda m: Mixture(2, family="multinomial", missing=m, **QUIET), x)


def test_multinomial_em_with_missing_counts_climbs_to_a_stationary_point():
    """EM never decreases the observed counts' conditional log-likelihood (30 % missing; its objective is the mean
    of ``score_samples``), and with one component its fixed point zeroes the gradient in the logits of ``probs``
    (autograd through the conditional likelihood): the M-step's minorisation-maximisation reaches the maximiser."""
    from ppmix.components.multinomial import MultinomialComponents

    _, holes, _ = planted_counts(400, fraction=0.3)
    mix = _fit(Mixture(2, family="multinomial", missing="marginalize", max_iter=25, tol=0.0, **QUIET), holes)
    history = np.asarray(mix.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()
    assert mix.score(holes) == pytest.approx(float(np.mean(mix.score_samples(holes))), rel=1e-12)
    one = holes[:200]
    fitted = _fit(Mixture(1, family="multinomial", missing="marginalize", tol=1e-14, max_iter=500, **QUIET), one)
    logits = fitted.components_.probs.log().detach().clone().requires_grad_(True)
    MultinomialComponents(torch.softmax(logits, -1)).observed().log_prob(torch.as_tensor(one)).sum().backward()
    assert float(logits.grad.abs().max()) < 1e-6


def test_multinomial_recovery_with_a_fifth_missing_and_impute_refused():
    """MCAR at 20 %: the probabilities within 0.02 of the complete-data fit's and the held-out log-likelihood within
    1 %; ``impute`` refuses the family by name (a missing count has no conditional expectation)."""
    x, holes, _ = planted_counts(1500)
    held_out, _, _ = planted_counts(500, seed=1)
    complete = _fit(Mixture(2, family="multinomial", **QUIET), x)
    marginal = _fit(Mixture(2, family="multinomial", missing="marginalize", **QUIET), holes)
    order = lambda m: m.means_.numpy()[np.argsort(m.means_.numpy()[:, 0])]  # noqa: E731
    np.testing.assert_allclose(order(marginal), order(complete), atol=0.02)
    assert marginal.score(held_out) == pytest.approx(complete.score(held_out), rel=0.01)
    with pytest.raises(ValueError, match="impute is not defined for the multinomial family"):
        marginal.impute(holes)


def test_multinomial_weights_with_missing_counts():
    """Integer sample weights on rows with missing counts give the repeated rows' E-step and M-step."""
    _, holes, _ = planted_counts(300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        in_memory = Mixture(2, family="multinomial", missing="marginalize", max_iter=10, **QUIET).fit(holes)
    weight = np.random.default_rng(1).integers(1, 4, len(holes))
    weighted = in_memory._em_data(Batch(in_memory.prepare_data(holes), torch.as_tensor(weight, dtype=torch.float64)))
    repeated = in_memory._em_data(in_memory.prepare_data(np.repeat(holes, weight, axis=0)))
    fitted = []
    for data in (weighted, repeated):
        stats_, objective = in_memory._e_step(data)
        model = copy.deepcopy(in_memory)
        model._em_update(stats_)
        fitted.append((float(objective), model.components_.probs))
    assert fitted[0][0] == pytest.approx(fitted[1][0], rel=1e-12)
    torch.testing.assert_close(fitted[0][1], fitted[1][1], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------- conditional draws
@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_conditional_draws_of_one_gaussian_match_the_closed_form(covariance_type):
    """Known answer: with one component, 4000 draws of one row's missing block have the conditional Gaussian's
    mean and covariance (``mu_m + S_mo S_oo^-1 (x_o - mu_o)``, ``S_mm - S_mo S_oo^-1 S_om``) within Monte-Carlo
    error; observed entries and complete rows come back unchanged."""
    x, _, _ = planted(400)
    gmm = _fit(GMM(1, covariance_type=covariance_type, **QUIET), x[:200])
    mu, sigma = gmm.means_.numpy()[0], gmm.covariances_.numpy()[0]
    sigma = sigma if sigma.ndim == 2 else np.diag(sigma)
    row = np.array([1.0, np.nan, 0.5, np.nan])
    o, m = ~np.isnan(row), np.isnan(row)
    gain = sigma[np.ix_(m, o)] @ np.linalg.inv(sigma[np.ix_(o, o)])
    want_mean = mu[m] + gain @ (row[o] - mu[o])
    want_cov = sigma[np.ix_(m, m)] - gain @ sigma[np.ix_(o, m)]
    batch = np.vstack([np.tile(row, (4000, 1)), x[:3]])
    draws = gmm.impute(batch, method="sample", seed=0)
    assert np.array_equal(draws[:4000, o], batch[:4000, o]) and np.array_equal(draws[4000:], x[:3])
    block = draws[:4000, m]
    standard_error = np.sqrt(np.diag(want_cov) / 4000)
    assert (np.abs(block.mean(0) - want_mean) < 4 * standard_error).all()
    np.testing.assert_allclose(np.cov(block.T), want_cov, atol=4 * np.sqrt(2 / 4000) * np.diag(want_cov).max())
    again = gmm.impute(batch, method="sample", seed=0)
    assert np.array_equal(draws, again) and not np.array_equal(draws, gmm.impute(batch, method="sample", seed=1))


@pytest.mark.parametrize("covariance_type", ["full", "tied", "spherical"])
def test_conditional_draws_pick_components_by_their_posterior(covariance_type):
    """Two components: the draws of a row between them pick each component (its conditional mean's side) as
    often as the row's posterior probabilities given its observed entries say."""
    x, holes, _ = planted(1500)
    gmm = _fit(GMM(2, covariance_type=covariance_type, missing="marginalize", **QUIET), holes)
    row = np.array([2.0, 2.3, np.nan, np.nan])  # between the clusters (0 and 4): both components probable
    posterior = gmm.predict_proba(row[None])[0]
    assert 0.05 < posterior.min()
    draws = gmm.impute(np.tile(row, (4000, 1)), method="sample", seed=0)[:, 2:]
    means = gmm.means_.numpy()
    high = int(np.argmax(means[:, 0]))
    share = np.mean(draws.mean(1) > 2.0)  # the high component's conditional mean is near 4, the low one's near 0
    assert share == pytest.approx(posterior[high], abs=4 * np.sqrt(posterior[high] * (1 - posterior[high]) / 4000))


def test_conditional_draws_of_a_mixture_of_gaussians_family():
    """A component that is a mixture of two diagonal Gaussians: draws of a missing entry given a far observed one
    split between that component's two Gaussians (at ±2 about its mean) as their posterior weights say, each near
    its own mean; other families refuse ``method="sample"`` by name."""
    _, holes, _ = planted_features("gmm", 800)
    mix = _fit(Mixture(2, family="gmm", missing="marginalize", **QUIET), holes)
    draws = mix.impute(np.tile([[11.5, np.nan, np.nan]], (3000, 1)), method="sample", seed=0)
    assert np.abs(draws[:, 1:] - 12.0).mean() < 1.0  # the observed 11.5 points at the Gaussian at 10 + 2
    poisson = _fit(Mixture(2, family="poisson", missing="marginalize", **QUIET), planted_features("poisson")[1])
    with pytest.raises(ValueError, match="method='sample' is for Gaussian components"):
        poisson.impute(np.array([[1.0, np.nan, 3.0]]), method="sample")
    with pytest.raises(ValueError, match="method must be"):
        poisson.impute(np.array([[1.0, np.nan, 3.0]]), method="mode")
