"""pf-HMM and sup-HMM: the EM ELBO against Pyro, monotone EM, the pf-GMM reduction, labels, bad input; E.4 data."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pyro
import pytest
import torch
from pyro.infer import TraceEnum_ELBO
from scipy.stats import norm

from ppmix.datasets.pf_hmm import make_pf_hmm_synthetic
from ppmix.engines.params import local_params
from ppmix.inference import ConvergenceWarning
from ppmix.metrics import auroc
from ppmix.models import latent_posterior
from ppmix.models._arviz import PointEstimateWarning
from ppmix.models.pf.pf_gmm import PFGMM
from ppmix.models.pf.pf_hmm import PFHMM, SupervisedHMM
from tests.common import assert_close


def _tiny(seed=1, n_features=3):
    """Five sequences of lengths 1..4 (padding in every batch), scaled so that posteriors stay soft."""
    data = make_pf_hmm_synthetic(5, length=(1, 4), n_relevant=1, n_features=n_features, seed=seed)
    x = [s / 5.0 for s in data.X]
    y = [v.astype(float) for v in data.y]
    y[0][0] = np.nan  # a missing label
    return x, y


def _fit_quietly(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(*args, **kwargs)


def _small(n_sequences=60, seed=1, n_features=8, n_relevant=2):
    """Train and test halves of one E.4 draw (they share its transition matrices)."""
    data = make_pf_hmm_synthetic(2 * n_sequences, length=20, n_relevant=n_relevant, n_features=n_features, seed=seed)
    half = slice(0, n_sequences), slice(n_sequences, 2 * n_sequences)
    return data, half


@pytest.mark.parametrize("k", [2, 3], ids=["K2", "K3"])
@pytest.mark.parametrize("cls, options", [(PFHMM, {"switch_prior": 0.3}), (SupervisedHMM, {})], ids=["pf", "sup"])
def test_em_elbo_equals_trace_enum_elbo(cls, options, k):
    x, y = _tiny()
    model = _fit_quietly(cls(k, init_params="random", seed=0, progress=False, **options), x, y, max_iter=3, tol=0.0)
    batch = model.prepare_data(x, y)
    stats, elbo = model._e_step(model._em_data(batch))
    posterior = stats.posterior[batch.mask]
    assert 0.05 < float(posterior.max(1).values.min()) < 0.999  # soft state posteriors: a real test
    if cls is PFHMM:
        assert 0.01 < float(model.switch_probs_.min()) and float(model.switch_probs_.max()) < 0.99
    with local_params(), torch.no_grad(), warnings.catch_warnings(), pyro.validation_enabled(True):
        # the model and guide sample the chain before the per-feature switches, so Pyro's dependency check is quiet
        warnings.filterwarnings("error", message=".*possibly invalid dependency")
        pyro_elbo = -TraceEnum_ELBO(max_plate_nesting=2).loss(model.model, model.guide, batch)
    assert pyro_elbo == pytest.approx(float(elbo), rel=1e-10)


@pytest.mark.parametrize("init", ["random", "kmeans", "relevance"])
def test_elbo_never_decreases(init):
    data, (train, _) = _small(20, seed=2)
    x = [s / 4.0 for s in data.X[train]]  # overlapping states: many iterations
    model = PFHMM(3, switch_prior=0.4, init_params=init, seed=0, progress=False)
    _fit_quietly(model, x, data.y[train], max_iter=40, tol=0.0)
    history = np.asarray(model.history_)
    assert len(history) >= 4  # with tol=0 EM stops only at an exact fixed point (k-means: after 3 steps)
    assert np.all(np.diff(history) >= -1e-10 * np.abs(history[1:]))


def test_uniform_transitions_reduce_to_pf_gmm():
    data, (train, _) = _small(15, seed=3, n_features=5)
    x = [s / 4.0 for s in data.X[train]]
    y = [v.astype(float) for v in data.y[train]]
    y[0][:5] = np.nan
    hmm = _fit_quietly(PFHMM(3, switch_prior=0.4, seed=0, progress=False), x, y, max_iter=5)
    values = hmm._get_globals()
    values["transition"] = values["initial"].expand(3, 3).clone()
    hmm._set_globals(values)
    frames, labels = np.concatenate(x), np.concatenate(y)
    gmm = _fit_quietly(PFGMM(3, switch_prior=0.4, seed=0, progress=False), frames, labels, max_iter=1)
    gmm._set_globals({"weights": values.pop("initial"), **{k: v for k, v in values.items() if k != "transition"}})
    batch = hmm.prepare_data(x, y)
    stats, hmm_elbo = hmm._e_step(hmm._em_data(batch))
    resp, gmm_elbo = gmm._e_step(gmm._em_data(gmm.prepare_data(frames, labels)))
    assert 0.05 < float(resp.max(1).values.min()) < 0.999
    assert_close(stats.posterior[batch.mask], resp, atol=1e-10, rtol=0)
    assert float(hmm_elbo) == pytest.approx(float(gmm_elbo), rel=1e-12)
    assert_close(np.concatenate(hmm.predict_proba(x)), gmm.predict_proba(frames), atol=1e-10, rtol=0)


def test_score_is_the_exact_marginal_likelihood():
    x, y = _tiny(seed=4)
    model = _fit_quietly(PFHMM(2, switch_prior=0.5, seed=0, progress=False), x, y, max_iter=5)
    initial, transition = model.initial_.numpy(), model.transition_.numpy()
    loc, scale = model.components_.loc.numpy(), model.components_.scale.numpy()
    bg_loc, bg_scale = model.background_.loc[0].numpy(), model.background_.scale[0].numpy()
    on = model.switch_probs_.numpy() > 0.5
    expected = []
    for seq in x:  # every state path, every step's features from their switch's density
        emit = np.where(on, norm.logpdf(seq[:, None], loc, scale), norm.logpdf(seq, bg_loc, bg_scale)[:, None]).sum(-1)
        paths = []
        for path in itertools.product(range(2), repeat=len(seq)):
            log_p = np.log(initial[path[0]]) + sum(np.log(transition[a, b]) for a, b in itertools.pairwise(path))
            paths.append(log_p + emit[np.arange(len(seq)), path].sum())
        expected.append(np.logaddexp.reduce(paths))
    batch = model.prepare_data(x)
    assert_close(model._pointwise_log_likelihood(batch), np.array(expected), rtol=1e-10)
    assert model.log_likelihood(x) == pytest.approx(sum(expected), rel=1e-10)


def test_recovers_relevant_features_and_beats_supervised_hmm():
    data, (train, test) = _small(60, seed=1, n_features=12, n_relevant=2)
    y_test = np.concatenate(data.y[test])
    pf = PFHMM(4, switch_prior=0.3, seed=0, progress=False).fit(data.X[train], data.y[train])
    assert ((pf.relevance_ > 0.5) == data.relevant).all()
    pf_auc = auroc(y_test, np.concatenate(pf.predict_proba(data.X[test]))[:, 1])
    sup = SupervisedHMM(4, seed=0, progress=False).fit(data.X[train], data.y[train])
    sup_auc = auroc(y_test, np.concatenate(sup.predict_proba(data.X[test]))[:, 1])
    assert pf_auc > 0.9 and sup_auc < pf_auc - 0.15  # sup-HMM's states follow the ten irrelevant features
    labels = pf.predict(data.X[test][:3])
    assert [p.shape for p in labels] == [(20,)] * 3 and set(np.concatenate(labels)) <= {0, 1}
    best, paths = pf.decode(data.X[test][:3])
    assert best.shape == (3,) and [p.shape for p in paths] == [(20,)] * 3


def test_missing_labels_contribute_nothing():
    data, (train, _) = _small(20, seed=1, n_features=6)
    y = [v.astype(float) for v in data.y[train]]
    rng = np.random.default_rng(0)
    for v in y:
        v[rng.random(len(v)) < 0.3] = np.nan
    y[0][:] = np.nan  # one sequence without any label
    model = PFHMM(4, switch_prior=0.3, seed=0, progress=False).fit(data.X[train], y)
    assert ((model.relevance_ > 0.5) == data.relevant).all()
    batch = model.prepare_data(data.X[train], y)
    with_labels = model._log_emissions(model._em_data(batch))[batch.mask]
    features_only = model._log_emissions(model._frames_data(batch, use_labels=False))[batch.mask]
    missing = np.isnan(np.concatenate(y))
    assert_close(with_labels[missing], features_only[missing], rtol=0, atol=0)
    assert not torch.allclose(with_labels[~missing], features_only[~missing])
    posterior = latent_posterior(model, data.X[train], y)[
        "z"
    ]  # the unlabelled sequence: exactly the label-free posterior
    n0 = len(y[0])
    assert_close(posterior[:n0], model.predict_state_proba(data.X[train][:1])[0], atol=1e-12, rtol=0)


def test_dataframe_layout_save_load_and_arviz(tmp_path):
    data, (train, _) = _small(12, seed=1, n_features=4)
    frames = [
        pd.DataFrame(x, columns=[f"f{d}" for d in range(4)]).assign(seq=b, label=v)
        for b, (x, v) in enumerate(zip(data.X[train], data.y[train]))
    ]
    df = pd.concat(frames, ignore_index=True)
    model = PFHMM(4, switch_prior=0.3, sequence_column="seq", seed=0, progress=False).fit(df, "label")
    on_lists = PFHMM(4, switch_prior=0.3, seed=0, progress=False).fit(data.X[train], data.y[train])
    assert list(model.relevance_.index) == ["f0", "f1", "f2", "f3"]
    assert_close(model.relevance_.to_numpy(), on_lists.relevance_, rtol=1e-10)
    # the label column is not a feature at prediction time, and predictions do not read it
    assert_close(np.concatenate(model.predict_proba(df)), np.concatenate(on_lists.predict_proba(data.X[train])))
    loaded = PFHMM.load(model.save(tmp_path / "pf_hmm"))
    # the same computation on the loaded parameters: equal up to the order of multi-threaded sums (1e-14 seen
    # on 16 threads), which moves with where the arrays lie in memory
    assert_close(np.concatenate(loaded.predict_proba(df)), np.concatenate(model.predict_proba(df)), rtol=1e-12)
    assert_close(loaded.relevance_.to_numpy(), model.relevance_.to_numpy(), rtol=0, atol=0)
    # 12 short sequences leave a transition never taken (fitted at 3e-12) and a label probability at its clamp
    # (1 - 1e-6): the ELBO is flat there to rounding, so there is no Laplace approximation and the warning says why
    with pytest.warns(PointEstimateWarning, match="no Laplace approximation: the fitted objective is not strictly"):
        idata = on_lists.to_arviz(num_samples=5)
    assert idata.attrs["ppmix_draws"] == "point_estimate"
    assert idata.posterior["switch_probs"].shape == (1, 1, 4)
    assert idata.log_likelihood["x"].shape == (1, 1, 12)
    draws = on_lists.sample(3, length=7)
    assert draws["x"].shape == (3, 7, 4) and draws["y"].shape == draws["z"].shape == (3, 7)


@pytest.mark.parametrize(
    "X, y, match",
    [
        ([], None, "empty list"),
        ([np.zeros((3, 2)), np.zeros((0, 2))], None, "length 0"),
        ([np.ones((3, 2)), np.ones((3, 1))], None, "features"),
        ([np.full((3, 2), np.nan)], None, "NaN"),
        ([np.arange(8.0).reshape(4, 2)], [np.array([0, 1, 2, 0])], r"outside \{0, 1\}"),
        ([np.arange(8.0).reshape(4, 2)], [np.array([0, 1, 0])], "3 labels"),
        ([np.arange(8.0).reshape(4, 2)], [np.full(4, np.nan)], "no observed label"),
        ([np.arange(2.0).reshape(2, 1)], [np.array([0, 1])], "at least 2 features"),
        ([np.c_[np.arange(4.0), np.ones(4)]], [np.array([0, 1, 0, 1])], r"constant feature\(s\) \[1\]"),
    ],
    ids=[
        "empty",
        "zero-length",
        "features",
        "nan",
        "label-values",
        "label-length",
        "all-missing",
        "one-feature",
        "constant-feature",
    ],
)
def test_bad_input(X, y, match):
    with pytest.raises(ValueError, match=match):
        PFHMM(2, progress=False).fit(X, y)


@pytest.mark.parametrize("p", [0.0, 1.5, -0.1, True, "half"], ids=str)
def test_bad_switch_prior(p):
    x, y = _tiny()
    with pytest.raises(ValueError, match="switch_prior"):
        PFHMM(2, switch_prior=p, progress=False).fit(x, y)


def test_engines_and_unfitted_predictions():
    x, y = _tiny()
    with pytest.raises(ValueError, match="engine='em' only"):
        PFHMM(2, progress=False).fit(x, y, engine="svi")
    with pytest.raises(ValueError, match="init_params"):
        PFHMM(2, init_params="bogus", progress=False).fit(x, y)
    with pytest.raises(Exception, match="not fitted"):
        PFHMM(2, progress=False).predict_proba(x)


def test_synthetic_data_follows_e4():
    data = make_pf_hmm_synthetic(300, length=(20, 40), n_relevant=3, n_features=7, seed=5)
    assert all(20 <= len(x) <= 40 and x.shape[1] == 7 and len(x) == len(v) for x, v in zip(data.X, data.y))
    assert data.relevant.tolist() == [True] * 3 + [False] * 4
    for a, floor in ((data.transition_relevant, 0.1), (data.transition_irrelevant, 0.01)):
        extra = a / a.min(1, keepdims=True) * floor  # undo the row normalisation (every row has a bare floor)
        jumps = extra - floor - np.eye(4)  # one one-hot row each
        assert_close(np.sort(jumps, 1), np.tile([0.0, 0.0, 0.0, 1.0], (4, 1)), atol=1e-9, rtol=0)
    z, x, y = np.concatenate(data.relevant_states), np.concatenate(data.X), np.concatenate(data.y)
    counts = np.zeros((4, 4))
    for s in data.relevant_states:
        np.add.at(counts, (s[:-1], s[1:]), 1)
    assert_close(counts / counts.sum(1, keepdims=True), data.transition_relevant, atol=0.03, rtol=0)
    assert_close([x[z == k, :3].mean() for k in range(4)], [0.0, 6.0, 12.0, 18.0], atol=0.1, rtol=0)
    assert_close([y[z == k].mean() for k in range(4)], [0.05, 0.95, 0.05, 0.95], atol=0.03, rtol=0)
    first = np.array([s[0] for s in data.irrelevant_states])
    assert_close(np.bincount(first, minlength=4) / 300, [0.1, 0.2, 0.3, 0.4], atol=0.06, rtol=0)


def test_default_fit_with_sequence_weights_equals_the_repeated_sequences():
    """One weight per sequence (zeros drop sequences): the default fit (relevance start on the weighted frames)
    reaches the repeated sequences' fit: the same ELBO per step, relevance and weighted accuracy."""
    data = make_pf_hmm_synthetic(20, length=15, n_relevant=2, n_features=5, seed=0)
    weight = np.random.default_rng(0).integers(0, 3, 20)
    weight[:2] = 1
    x, y = list(data.X), list(data.y)

    def repeat(items):
        return [item for item, count in zip(items, weight) for _ in range(count)]

    weighted = PFHMM(3, switch_prior=0.3, seed=0, progress=False).fit(x, y, sample_weight=weight)
    repeated = PFHMM(3, switch_prior=0.3, seed=0, progress=False).fit(repeat(x), repeat(y))
    assert weighted.lower_bound_ == pytest.approx(repeated.lower_bound_, rel=1e-8)
    np.testing.assert_allclose(weighted.relevance_, repeated.relevance_, rtol=1e-6)
    assert weighted.score(x, y, sample_weight=weight) == pytest.approx(repeated.score(repeat(x), repeat(y)), rel=1e-12)


def _enumerated_in_model(model):
    return pyro.infer.config_enumerate(model.model, "parallel")


def test_program_enumerates_in_the_model_exactly():
    """Issue 40, item 5: ``config_enumerate(m.model)`` under ``TraceEnum_ELBO`` (globals at the fit, flat priors)
    sums every state path and switch: the marginal likelihood of features and labels, by brute force here; and
    ``infer_discrete`` at temperature 0 finds the most probable state path jointly with the switches."""
    x, y = _tiny(seed=4)
    model = _fit_quietly(PFHMM(2, switch_prior=0.3, seed=0, progress=False), x, y, max_iter=5)
    g = {k: v.numpy() for k, v in model._get_globals().items()}
    p = model.switch_prior
    on = np.log(p) + norm.logpdf(np.concatenate(x)[:, None], g["locs"], g["scales"])  # (frames, K, D)
    off = np.log1p(-p) + norm.logpdf(np.concatenate(x), g["background_loc"], g["background_scale"])[:, None]
    labels = np.concatenate(y)[:, None]  # NaN: missing
    label_ll = np.where(
        np.isnan(labels), 0.0, np.where(labels == 1, np.log(g["label_probs"]), np.log1p(-g["label_probs"]))
    )
    summed = np.logaddexp(on, off).sum(-1) + label_ll  # (frames, K): switches summed out
    maxed = np.maximum(on, off).sum(-1) + label_ll  # switches maximised
    starts = np.cumsum([0] + [len(s) for s in x])
    marginal, best_paths = 0.0, []
    for b, seq in enumerate(x):
        rows = np.arange(starts[b], starts[b + 1])
        log_paths, map_paths = {}, {}
        for path in itertools.product(range(2), repeat=len(seq)):
            prior = np.log(g["initial"][path[0]]) + sum(
                np.log(g["transition"][i, j]) for i, j in itertools.pairwise(path)
            )
            log_paths[path] = prior + summed[rows, path].sum()
            map_paths[path] = prior + maxed[rows, path].sum()
        marginal += np.logaddexp.reduce(list(log_paths.values()))
        best_paths.append(max(map_paths, key=map_paths.get))
    batch = model.prepare_data(x, y)
    with local_params(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Found vars in model but not guide": the globals sit at the fit
        loss = TraceEnum_ELBO(max_plate_nesting=2).loss(_enumerated_in_model(model), lambda batch: None, batch)
        trace = pyro.poutine.trace(
            pyro.infer.infer_discrete(_enumerated_in_model(model), first_available_dim=-3, temperature=0)
        ).get_trace(batch)
    assert -loss == pytest.approx(marginal, rel=1e-10)
    for b, path in enumerate(best_paths):
        assert [int(trace.nodes[f"z_{t}"]["value"][b, 0]) for t in range(len(path))] == list(path)


def test_enumerating_too_long_sequences_names_the_limit():
    x, y = _tiny(seed=4)
    model = _fit_quietly(PFHMM(2, switch_prior=0.3, seed=0, progress=False), x, y, max_iter=1)
    rng = np.random.default_rng(0)
    batch = model.prepare_data([rng.normal(size=(32, 3))])
    with local_params(), pytest.raises(NotImplementedError, match=r"66 in all.*at most 31 steps.*decode"):
        pyro.infer.infer_discrete(_enumerated_in_model(model), first_available_dim=-3)(batch)
    with local_params(), pytest.raises(NotImplementedError, match=r"at most 31 steps"):
        TraceEnum_ELBO(max_plate_nesting=2).loss(model.model, model.guide, batch)


def test_priors_pin_the_means_map_em_climbs_and_save_load_keeps_them(tmp_path):
    data, (train, _) = _small(20, seed=2)
    x = [s / 4.0 for s in data.X[train]]  # overlapping states: many iterations
    d = x[0].shape[1]
    assert list(PFHMM(3).prior_keys())[:2] == ["initial", "transition"]
    with pytest.raises(ValueError, match=r"priors has an unknown key 'weights'"):
        PFHMM(3, priors={"weights": 2.0}, progress=False).fit(x, data.y[train])
    pinned = _fit_quietly(
        SupervisedHMM(3, priors={"locs_loc": 2.0, "locs_scale": 1e-6}, seed=0, progress=False), x, data.y[train]
    )
    assert_close(pinned.means_.numpy(), np.full((3, d), 2.0), atol=1e-6, rtol=0)
    priors = {"locs_scale": 0.5, "variance_rate": 0.25, "initial": 2.0, "transition": 3.0}
    model = _fit_quietly(PFHMM(3, switch_prior=0.4, priors=priors, seed=0, progress=False), x, data.y[train], tol=0.0)
    history = np.asarray(model.history_)
    assert len(history) >= 4 and np.all(np.diff(history) >= -1e-10 * np.abs(history[1:]))
    assert float(model.transition_.min()) > 0.01  # the Dirichlet(3) mode keeps every transition away from zero
    loaded = PFHMM.load(model.save(tmp_path / "pf_hmm_map"))
    assert loaded.priors == priors
    assert_close(np.concatenate(loaded.predict_proba(x)), np.concatenate(model.predict_proba(x)), rtol=1e-12)
