"""pf-GMM and sup-GMM: the EM ELBO against Pyro, monotone EM, the p = 1 reduction, labels, bad input."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from pyro.infer import TraceEnum_ELBO
from sklearn.base import clone

from ppmix import GMM
from ppmix.datasets import make_pf_synthetic, make_two_mixture
from ppmix.engines.params import local_params
from ppmix.metrics import auroc
from ppmix.models.pf.analysis import likelihood_gaps, snr_term, switch_prior_window
from ppmix.models.pf.pf_gmm import PFGMM, SupervisedGMM


def _overlapping(n=120, seed=0):
    """Small data whose components overlap, so responsibilities and switches stay soft."""
    data = make_pf_synthetic(n, n_relevant=2, n_features=5, seed=seed)
    x = data.X / 4.0  # components 1.5 apart in unit-variance noise
    y = data.y.astype(float)
    y[::7] = np.nan  # some labels missing
    return x, y


def _pf(**kwargs):
    options = {"n_components": 3, "switch_prior": 0.3, "seed": 0, "progress": False}
    options.update(kwargs)
    return PFGMM(**options)


def _trace_enum_elbo(model, x, y):
    data = model.prepare_data(x, y)
    with local_params(), torch.no_grad():
        return -float(TraceEnum_ELBO(max_plate_nesting=2).loss(model.model, model.guide, data))


@pytest.mark.parametrize("alpha", [1.0, 2.5])
@pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")
def test_em_elbo_equals_trace_enum_elbo_mid_fit(alpha):
    x, y = _overlapping()
    model = _pf(alpha=alpha, init_params="random").fit(x, y, max_iter=3, tol=0.0)
    resp, elbo = model._e_step(model._em_data(model.prepare_data(x, y)))
    assert 0.05 < float(resp.max(1).values.min()) < 0.999  # soft responsibilities: a real test
    assert float(model.switch_probs_.min()) > 1e-6 and float(model.switch_probs_.max()) < 1 - 1e-6
    assert _trace_enum_elbo(model, x, y) == pytest.approx(float(elbo), rel=1e-9)


@pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")
def test_supervised_em_elbo_equals_trace_enum_elbo():
    x, y = _overlapping()
    model = SupervisedGMM(3, init_params="random", seed=1, progress=False).fit(x, y, max_iter=2, tol=0.0)
    _, elbo = model._e_step(model._em_data(model.prepare_data(x, y)))
    assert _trace_enum_elbo(model, x, y) == pytest.approx(float(elbo), rel=1e-9)


@pytest.mark.parametrize("init", ["random", "kmeans", "relevance"])
def test_elbo_never_decreases(init):
    x, y = _overlapping(200, seed=3)
    model = _pf(init_params=init, switch_prior=0.4).fit(x, y, max_iter=60, tol=0.0)
    history = np.asarray(model.history_)
    assert len(history) > 10
    assert np.all(np.diff(history) >= -1e-10 * np.abs(history[1:]))


def test_switch_update_is_a_fixed_point_at_convergence():
    x, y = _overlapping(300, seed=4)
    model = _pf(max_iter=500, tol=1e-12).fit(x, y)
    data = model._em_data(model.prepare_data(x, y))
    before = model.switch_probs_.clone()
    resp, _ = model._e_step(data)
    model._m_step(data, resp)
    torch.testing.assert_close(model.switch_probs_, before, atol=1e-7, rtol=0)


def test_p_one_without_labels_equals_gmm():
    x, _ = _overlapping(150, seed=5)
    sup = SupervisedGMM(3, seed=2, progress=False).fit(x)
    gmm = GMM(3, seed=2, progress=False, max_iter=200, tol=1e-7).fit(x)
    order_s, order_g = sup.means_[:, 0].argsort(), gmm.means_[:, 0].argsort()
    torch.testing.assert_close(sup.means_[order_s], gmm.means_[order_g], rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(sup.covariances_[order_s], gmm.covariances_[order_g], rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(sup.weights_[order_s], gmm.weights_[order_g], rtol=1e-6, atol=1e-8)
    assert sup.lower_bound_ == pytest.approx(gmm.lower_bound_, rel=1e-9)
    assert sup.relevance_.tolist() == [1.0] * x.shape[1]


def test_missing_labels_contribute_only_their_features():
    x, y = _overlapping(150, seed=6)
    model = _pf().fit(x, y)
    data = model.prepare_data(x, y)
    missing = np.isnan(y)
    with_labels = model._posterior_marginals(data)["z"]
    features_only = model._responsibilities(data)
    torch.testing.assert_close(with_labels[missing], features_only[missing])
    assert not torch.allclose(with_labels[~missing], features_only[~missing])


def test_svi_reaches_the_em_optimum():
    x, y = _overlapping(80, seed=7)
    em = _pf(n_components=2, switch_prior=0.4).fit(x, y, max_iter=500, tol=1e-10)
    svi = _pf(n_components=2, switch_prior=0.4).fit(x, y, engine="svi", num_steps=400, lr=0.05)
    assert svi.elbo(x, y) == pytest.approx(em.elbo(x, y), rel=2e-3)
    torch.testing.assert_close(
        torch.as_tensor(np.sort(svi.relevance_)), torch.as_tensor(np.sort(em.relevance_)), atol=0.02, rtol=0
    )


def test_recovers_relevant_features_and_predicts_on_synthetic_complex():
    kwargs = {"kind": "complex", "n_relevant": 10, "n_features": 40, "label_probs": (0.01, 0.99, 0.01, 0.99)}
    train, test = make_pf_synthetic(800, seed=1, **kwargs), make_pf_synthetic(800, seed=2, **kwargs)
    mean, std = train.X.mean(0), train.X.std(0)
    model = _pf(n_components=4).fit((train.X - mean) / std, train.y)
    assert ((model.relevance_ > 0.5) == train.relevant).all()
    proba = model.predict_proba((test.X - mean) / std)[:, 1]
    assert auroc(test.y, proba) > 0.97
    sup = SupervisedGMM(4, seed=0, progress=False).fit((train.X - mean) / std, train.y)
    assert auroc(test.y, sup.predict_proba((test.X - mean) / std)[:, 1]) < 0.8  # follows the irrelevant mixture


def test_scores_are_proper_densities_and_marginals():
    x, y = _overlapping(100, seed=8)
    model = _pf().fit(x, y)
    mask = np.array([True, False, True, False, False])
    full = model.score_samples(x, switches="mean")
    marginal = model.log_likelihood_relevant(x, mask, switches="mean")
    assert full.shape == marginal.shape == (100,)
    # the marginal on all features is the full density
    np.testing.assert_allclose(model.log_likelihood_relevant(x, np.ones(5, bool)), model.score_samples(x))
    # 1-D density integrates to one: marginal on one feature over a grid
    grid = np.linspace(-12, 12, 4001)[:, None] * np.ones((1, 5))
    one = np.zeros(5, bool)
    one[0] = True
    density = np.exp(model.log_likelihood_relevant(grid, one, switches="mean"))
    assert np.trapezoid(density, grid[:, 0]) == pytest.approx(1.0, abs=1e-6)


def test_dataframe_names_relevance_and_save_load(tmp_path):
    x, y = _overlapping(100, seed=9)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(5)])
    model = _pf().fit(frame, pd.Series(y))
    assert list(model.relevance_.index) == list(frame.columns)
    model.save(tmp_path / "pf")
    loaded = PFGMM.load(tmp_path / "pf")
    np.testing.assert_allclose(loaded.predict_proba(frame), model.predict_proba(frame))
    np.testing.assert_allclose(loaded.relevance_.to_numpy(), model.relevance_.to_numpy())


def test_sample_shapes_and_switches():
    x, y = _overlapping(100, seed=10)
    draws = _pf().fit(x, y).sample(50)
    assert draws["x"].shape == (50, 5) and draws["s"].shape == (50, 5)
    assert set(np.unique(draws["y"])) <= {0, 1}


def test_to_arviz_has_switch_probs():
    x, y = _overlapping(60, seed=11)
    idata = _pf().fit(x, y).to_arviz()
    assert idata.posterior["switch_probs"].shape[-1] == 5
    assert idata.log_likelihood["x"].shape[-1] == 60


@pytest.mark.parametrize(
    ("y_bad", "message"),
    [
        (np.full(50, 2.0), "two classes"),
        (np.full(50, np.nan), "no observed label"),
        (np.zeros(49), "shape"),
        (np.array(["a"] * 50), "two classes"),
    ],
)
def test_bad_labels(y_bad, message):
    x = np.random.default_rng(0).normal(size=(50, 3))
    with pytest.raises((ValueError, TypeError), match=message):
        _pf(n_components=2).fit(x, y_bad)


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, float("nan"), True])
def test_bad_switch_prior(p):
    x = np.random.default_rng(0).normal(size=(50, 3))
    with pytest.raises(ValueError, match="switch_prior"):
        PFGMM(2, switch_prior=p, progress=False).fit(x, np.arange(50) % 2)


def test_bad_features():
    rng = np.random.default_rng(0)
    y = np.arange(50) % 2
    with pytest.raises(ValueError, match="at least 2 features"):
        _pf(n_components=2).fit(rng.normal(size=(50, 1)), y)
    x = rng.normal(size=(50, 3))
    x[:, 1] = 4.0
    with pytest.raises(ValueError, match=r"constant feature\(s\) \[1\]"):
        _pf(n_components=2).fit(x, y)
    x[0, 1] = 5.0  # constant on the rows that weigh: as the repeated rows, refused
    with pytest.raises(ValueError, match=r"constant feature\(s\) \[1\]"):
        _pf(n_components=2).fit(x, y, sample_weight=np.r_[0.0, np.ones(49)])
    with pytest.raises(ValueError, match="sample_weight is taken by engine='em' only"):
        _pf(n_components=2).fit(x, y, sample_weight=np.ones(50), engine="svi")
    with pytest.raises(ValueError, match="NaN"):
        _pf(n_components=2).fit(np.full((50, 3), np.nan), y)
    with pytest.raises(ValueError, match="n_components"):
        _pf(n_components=60).fit(rng.normal(size=(50, 3)), y)
    with pytest.raises(ValueError, match="mcmc"):
        _pf(n_components=2).fit(rng.normal(size=(50, 3)), y, engine="mcmc")


# ------------------------------------------------------------- the §6 analysis
def test_snr_term_and_gaps_by_hand():
    assert snr_term(1, 1.0) == pytest.approx(0.5 * math.log(2))  # 0 + log 2, halved
    assert snr_term(2, 0.0) == pytest.approx(1.0)  # 2 * 1 / 1, halved
    gaps = likelihood_gaps(1, 2, 1.0, 0.0, switch_prior=0.5)  # log(p/(1-p)) = 0
    assert gaps["gmm"] == pytest.approx(0.5 * math.log(2) - 1.0)
    assert gaps["sup_gmm"] == pytest.approx(1.5 * math.log(2) - 1.0)
    assert gaps["pf_gmm_vs_unaligned"] == pytest.approx(1.5 * math.log(2) - 1.0)
    assert gaps["pf_gmm_vs_single"] == pytest.approx(1.5 * math.log(2))
    p = 0.2  # log(p / (1 - p)) = -log 4
    gaps = likelihood_gaps(1, 2, 1.0, 0.0, switch_prior=p)
    assert gaps["pf_gmm_vs_unaligned"] == pytest.approx(math.log(4) + 1.5 * math.log(2) - 1.0)
    assert gaps["pf_gmm_vs_single"] == pytest.approx(-math.log(4) + 1.5 * math.log(2))


def test_window_by_hand():
    window = switch_prior_window(1, 2, 1.0, 0.0)  # Q_R = log(2)/2, Q_Ir = 1
    sigmoid = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert window.p_unaligned == pytest.approx(sigmoid(1.5 * math.log(2) - 1.0))
    assert window.p_single == pytest.approx(sigmoid(-1.5 * math.log(2)))
    assert (window.lower, window.upper) == (window.p_single, window.p_unaligned)
    # the gaps change sign exactly at the window's ends
    for edge, gap in ((window.p_unaligned, "pf_gmm_vs_unaligned"), (window.p_single, "pf_gmm_vs_single")):
        assert likelihood_gaps(1, 2, 1.0, 0.0, switch_prior=edge)[gap] == pytest.approx(0.0, abs=1e-12)
    more_relevant = switch_prior_window(3, 1, 2.0, 2.0)
    assert more_relevant.upper == 1.0 and more_relevant.lower >= more_relevant.p_single
    equal = switch_prior_window(2, 2, 3.0, 3.0)
    assert equal.p_unaligned is None and equal.feasible  # log 2 + Q_R - Q_Ir = log 2 > 0
    with pytest.raises(ValueError, match="n_relevant"):
        switch_prior_window(0, 2, 1.0, 1.0)


def test_fits_follow_the_window_on_section_6_data():
    """From the label-informed start: inside the window exactly the relevant features switch on
    (aligned components); below it none (the single Gaussian); above it the irrelevant ones too."""
    x, y = make_two_mixture(600, n_relevant=2, n_irrelevant=6, snr_relevant=5.0, snr_irrelevant=5.0, seed=0)
    window = switch_prior_window(2, 6, 5.0, 5.0)
    relevant = np.array([True, True] + [False] * 6)
    for p, expected in ((0.05, np.zeros(8, bool)), (0.4, relevant), (0.8, np.ones(8, bool))):
        model = PFGMM(2, switch_prior=p, seed=0, progress=False).fit(x, y)
        assert window.contains(p) == (expected == relevant).all()
        assert ((model.relevance_ > 0.5) == expected).all(), p
        if window.contains(p):
            assert auroc(y, model.predict_proba(x)[:, 1]) > 0.99


@pytest.mark.parametrize("routing", [False, True], ids=["fit-params", "metadata-routing"])
def test_grid_search_passes_sample_weight_to_every_fit(routing):
    """GridSearchCV(PFGMM).fit(X, y, sample_weight=w) fits every split and the refit with the weights (with or
    without scikit-learn's metadata routing): the refit is the weighted fit on all rows."""
    import sklearn
    from sklearn.model_selection import GridSearchCV

    data = make_pf_synthetic(120, n_relevant=2, n_features=4, seed=0)
    weight = np.where(data.y == 1, 3.0, 1.0)
    settings = {"switch_prior": 0.2, "n_restarts": 1, "seed": 0, "progress": False}
    with sklearn.config_context(enable_metadata_routing=routing):
        model = PFGMM(2, **settings)
        if routing:
            model = model.set_fit_request(sample_weight=True).set_score_request(sample_weight=True)
        search = GridSearchCV(model, {"alpha": [1.0]}, cv=3).fit(data.X, data.y, sample_weight=weight)
    direct = PFGMM(2, **settings).fit(data.X, data.y, sample_weight=weight)
    plain = PFGMM(2, **settings).fit(data.X, data.y)
    for site, value in direct._get_globals().items():
        np.testing.assert_allclose(search.best_estimator_._get_globals()[site], value, rtol=1e-10, err_msg=site)
    assert not torch.allclose(direct.weights_, plain.weights_, atol=1e-3)  # the weights changed the fit


def test_integer_weights_keep_the_restart_the_repeated_rows_keep():
    """A default fit (three relevance-guided starts) with integer weights scores its starts as the repeated rows'
    fit does (weighted means), keeps the same one and selects the same features."""
    data = make_pf_synthetic(150, n_relevant=2, n_features=5, seed=0)
    weight = np.random.default_rng(0).integers(0, 3, 150)
    weighted = PFGMM(3, switch_prior=0.2, seed=0, progress=False).fit(data.X, data.y, sample_weight=weight)
    repeated = PFGMM(3, switch_prior=0.2, seed=0, progress=False).fit(
        np.repeat(data.X, weight, 0), np.repeat(data.y, weight)
    )
    np.testing.assert_allclose(weighted.restart_scores_, repeated.restart_scores_, rtol=1e-8)
    np.testing.assert_allclose(weighted.relevance_gain_, repeated.relevance_gain_, rtol=1e-6)
    assert weighted.relevant_features_.tolist() == repeated.relevant_features_.tolist() == data.relevant.tolist()
    np.testing.assert_allclose(sorted(weighted.weights_.tolist()), sorted(repeated.weights_.tolist()), rtol=1e-6)


def test_a_warm_started_weighted_fit_refits_the_background_and_climbs():
    """The background is a statistic of each fit's data (fitted once per fit, not by EM): a warm start from an
    unweighted fit with sample weights equals the warm start on the repeated rows, and its objective never
    decreases (it fell by 0.47 nats per point when the unweighted background was kept)."""
    data = make_pf_synthetic(300, n_relevant=2, n_features=5, seed=0)
    y = data.y.astype(float)
    w = np.random.default_rng(3).integers(0, 4, 300)
    w[:2] = (1, 3)
    start = PFGMM(3, switch_prior=0.3, seed=0, progress=False)
    _quiet(start.fit, data.X, y, max_iter=2)
    start.warm_start = True
    weighted = _quiet(copy.deepcopy(start).fit, data.X, y, sample_weight=w.astype(float), max_iter=6, tol=0.0)
    repeated = _quiet(copy.deepcopy(start).fit, np.repeat(data.X, w, 0), np.repeat(y, w), max_iter=6, tol=0.0)
    np.testing.assert_allclose(weighted.history_, repeated.history_, rtol=1e-10)
    assert (np.diff(weighted.history_) >= -1e-12).all()


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# ------------------------------------------------------------------ priors= and MAP-EM
def test_map_em_means_are_the_phi_weighted_posterior_modes():
    """With ``priors``, each mean is the mode of ``phi_d`` times its data's likelihood and the prior (known answer:
    ``(m0 / s0^2 + phi_d sum_n r_nk x_nd / v_kd) / (1 / s0^2 + phi_d n_k / v_kd)`` at the fit), far from the sample
    means; the objective (ELBO + log prior) climbs."""
    x, y = _overlapping(150, seed=3)
    m0, s0 = 0.5, 0.2
    priors = {"locs_loc": m0, "locs_scale": s0, "variance_rate": 0.5}
    model = _pf(priors=priors, tol=1e-13, max_iter=3000, n_restarts=1).fit(x, y)
    resp = model._posterior_marginals(model.prepare_data(x, y))["z"].numpy()
    phi, variance, counts, sums = model.relevance_, model.covariances_.numpy(), resp.sum(0)[:, None], resp.T @ x
    expected = (m0 / s0**2 + phi * sums / variance) / (1 / s0**2 + phi * counts / variance)
    np.testing.assert_allclose(model.means_.numpy(), expected, atol=1e-5)
    assert np.abs(model.means_.numpy() - sums / counts).max() > 1.0
    assert np.diff(model.history_).min() >= -1e-9 * np.abs(model.history_).max()


@pytest.mark.parametrize("missing", [False, True], ids=["complete", "missing-entries"])
def test_a_strong_prior_pins_the_means_and_map_em_climbs(missing):
    x, y = _overlapping(120, seed=4)
    if missing:
        x = x.copy()
        x[::5, 1] = np.nan
    priors = {"locs_loc": [1.0, 2.0, 3.0, 4.0, 5.0], "locs_scale": 1e-6, "weights": 2.0}
    options = {"missing": "marginalize"} if missing else {}
    model = _pf(priors=priors, n_restarts=1, **options).fit(x, y)
    np.testing.assert_allclose(model.means_.numpy(), np.tile([1.0, 2.0, 3.0, 4.0, 5.0], (3, 1)), atol=1e-6)
    np.testing.assert_allclose(model.background_.loc[0].numpy(), [1.0, 2.0, 3.0, 4.0, 5.0], atol=1e-6)
    assert np.diff(model.history_).min() >= -1e-9 * np.abs(model.history_).max()


def test_laplace_draws_after_map_have_the_spread_the_prior_implies():
    """A mean's Laplace variance is ``1 / (1 / s0^2 + n_k / v_k)`` under ``N(m0, s0^2)`` (``n_k / v_k`` flat): with
    ``s0^2 = v / n`` and the prior centred on the clusters' means, the draws' spread shrinks by about ``1 / sqrt(2)``,
    as predicted from the two fits (the draws of both use the same normal noise)."""
    from ppmix.models._arviz import laplace_draws

    rng = np.random.default_rng(0)
    n = 200
    x = rng.normal(size=(2 * n, 2))
    x[n:, 0] += 10  # feature 1 centred on 0 in both clusters: its prior mean 0 is their sample means
    x[:n, 1] -= x[:n, 1].mean()
    x[n:, 1] -= x[n:, 1].mean()
    y = np.r_[np.zeros(n), np.ones(n)]
    s0 = np.sqrt(1.0 / n)
    spread, precision = {}, {}
    for priors in (None, {"locs_loc": 0.0, "locs_scale": [1e6, s0]}):
        model = SupervisedGMM(2, priors=priors, seed=0, progress=False).fit(x, y)
        draws, _ = laplace_draws(model, model.prepare_data(x, y), 30)
        counts = model.weights_.numpy() * 2 * n
        spread[priors is None] = draws["locs"].numpy()[0, :, :, 1].std(0)
        precision[priors is None] = counts / model.covariances_.numpy()[:, 1] + (0.0 if priors is None else s0**-2)
    np.testing.assert_allclose(spread[False] / spread[True], np.sqrt(precision[True] / precision[False]), rtol=1e-3)
    np.testing.assert_allclose(spread[False] / spread[True], np.sqrt(0.5), rtol=0.05)


def test_priors_keys_errors_clone_and_save_load(tmp_path):
    x, y = _overlapping(80, seed=5)
    assert list(_pf().prior_keys()) == ["weights", "locs_loc", "locs_scale", "variance_concentration", "variance_rate"]
    with pytest.raises(ValueError, match=r"priors has an unknown key 'rate_rate'"):
        _pf(priors={"rate_rate": 1.0}).fit(x, y)
    with pytest.raises(ValueError, match=r"priors\['weights'\] and alpha both set"):
        _pf(priors={"weights": 2.0}, alpha=3.0).fit(x, y)
    with pytest.raises(ValueError, match=r"priors\['weights'\] must be at least 1 for engine='em'"):
        _pf(priors={"weights": 0.5}, n_restarts=1).fit(x, y)
    np.testing.assert_array_equal(_pf(priors=None).fit(x, y).means_.numpy(), _pf().fit(x, y).means_.numpy())
    priors = {"locs_loc": np.arange(5.0), "variance_rate": 0.5, "weights": 2.0}
    model = _pf(priors=priors, n_restarts=1)
    assert clone(model).priors["variance_rate"] == 0.5
    model.fit(x, y)
    loaded = PFGMM.load(model.save(tmp_path / "pf_map"))
    assert loaded.priors == {"locs_loc": [0.0, 1.0, 2.0, 3.0, 4.0], "variance_rate": 0.5, "weights": 2.0}
    np.testing.assert_allclose(loaded.predict_proba(x), model.predict_proba(x))


def test_the_prior_group_draws_from_the_priors_as_set():
    """``to_arviz``'s ``prior`` group (:func:`~ppmix.models._arviz.prior_samples`): the weights' Dirichlet (mean
    ``alpha / sum(alpha)``) and the Gaussian family's keys for the components and the background."""
    from ppmix.models._arviz import prior_samples

    x, y = _overlapping(60, seed=11)
    priors = {"locs_loc": 3.0, "locs_scale": 0.01, "weights": [1.0, 50.0, 100.0]}
    model = _pf(priors=priors, n_restarts=1).fit(x, y)
    data = model.prepare_data(x, y)
    prior, _ = prior_samples(model, data, list(model._get_globals()), model._observed_data(data), 200)
    np.testing.assert_allclose(prior["weights"].mean((0, 1)), np.array([1.0, 50.0, 100.0]) / 151, atol=0.01)
    for site in ("locs", "background_loc"):
        assert abs(prior[site].mean() - 3.0) < 1e-3 and prior[site].std() == pytest.approx(0.01, rel=0.1)
