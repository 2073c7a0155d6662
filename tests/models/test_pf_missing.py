"""Missing values in the pf models (``missing="marginalize"``): marginal densities from the fitted parameters, the
usual fit when nothing is missing, monotone EM, recovery under MCAR, weights as repetition, and refusals."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import norm

from ppmix import PFGMM, PFHMM, SupervisedGMM
from ppmix._validation import InvalidDataError
from ppmix.datasets import make_pf_synthetic
from ppmix.datasets.pf_hmm import make_pf_hmm_synthetic
from ppmix.distributed import fit_em
from ppmix.inference import ConvergenceWarning
from ppmix.models.batch import Batch
from ppmix.models.pf._observed import ObservedStatistics, frame_statistics, frames_of
from ppmix.models.pf._pf_state import weighted_data_scale
from ppmix.models.pf.switch_selection import select_switch_prior

QUIET = {"seed": 0, "progress": False}


def _holed(x: np.ndarray, fraction: float = 0.2, seed: int = 1) -> np.ndarray:
    """``x`` with a ``fraction`` of its entries NaN at random (never a whole row)."""
    mask = np.random.default_rng(seed).random(x.shape) < fraction
    mask[mask.all(1), 0] = False
    return np.where(mask, np.nan, x)


def _quiet(fit):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fit()


@pytest.fixture(scope="module")
def pf_data():
    data = make_pf_synthetic(400, n_relevant=2, n_features=5, seed=0)
    return np.asarray(data.X, dtype=float), np.asarray(data.y, dtype=float), data.relevant


@pytest.fixture(scope="module")
def hmm_data():
    data = make_pf_hmm_synthetic(20, length=15, n_relevant=2, n_features=4, seed=1)
    holed = [_holed(np.asarray(x, dtype=float), seed=b) for b, x in enumerate(data.X)]
    return data, holed


def _pfgmm(**kwargs) -> PFGMM:
    return PFGMM(3, **{"switch_prior": 0.2, "n_restarts": 2, "missing": "marginalize", **QUIET, **kwargs})


@pytest.mark.parametrize("switches", ["map", "mean"])
def test_a_row_with_one_observed_feature_scores_its_marginal(pf_data, switches):
    """Known answer from the fitted parameters: ``score_samples`` is ``log sum_k w_k [s_d N(x_d | k) + (1 - s_d)
    N(x_d | background)]`` and ``predict_proba`` weighs ``label_probs`` by ``q(z = k) ∝ w_k N(x_d | k)^phi_d``."""
    x, y, _ = pf_data
    model = _quiet(lambda: _pfgmm().fit(_holed(x), y))
    w, probs, phi = (t.numpy() for t in (model.weights_, model.labels_.probs, model.switch_probs_))
    loc, scale = model.components_.loc.numpy(), model.components_.scale.numpy()
    bg_loc, bg_scale = model.background_.loc.numpy()[0], model.background_.scale.numpy()[0]
    for d, value in [(0, 5.0), (3, -1.0)]:
        row = np.full((1, x.shape[1]), np.nan)
        row[0, d] = value
        s = float(phi[d] > 0.5) if switches == "map" else phi[d]
        on, off = norm(loc[:, d], scale[:, d]).pdf(value), norm(bg_loc[d], bg_scale[d]).pdf(value)
        want = np.log(w @ (s * on + (1 - s) * off))
        assert model.score_samples(row, switches=switches)[0] == pytest.approx(want, rel=1e-10)
        q = w * np.exp(phi[d] * norm(loc[:, d], scale[:, d]).logpdf(value))
        assert model.predict_proba(row)[0, 1] == pytest.approx(q @ probs / q.sum(), rel=1e-9)


def test_a_step_with_one_observed_feature_emits_its_marginal(hmm_data):
    """PFHMM: a one-step sequence with one observed feature scores ``log sum_k initial_k [s_d N(x_d | k) + ...]``."""
    data, holed = hmm_data
    model = _quiet(lambda: PFHMM(3, switch_prior=0.3, missing="marginalize", **QUIET).fit(holed, data.y))
    init, phi = model.initial_.numpy(), model.switch_probs_.numpy()
    loc, scale = model.components_.loc.numpy(), model.components_.scale.numpy()
    bg_loc, bg_scale = model.background_.loc.numpy()[0], model.background_.scale.numpy()[0]
    step = np.array([[np.nan, 4.0, np.nan, np.nan]])
    s = float(phi[1] > 0.5)
    want = np.log(init @ (s * norm(loc[:, 1], scale[:, 1]).pdf(4.0) + (1 - s) * norm(bg_loc[1], bg_scale[1]).pdf(4.0)))
    assert model.score_samples([step])[0] == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("kind", ["PFGMM", "SupervisedGMM", "PFHMM"])
def test_with_nothing_missing_the_fit_is_the_usual_one(pf_data, hmm_data, kind):
    x, y, _ = pf_data
    data, _ = hmm_data
    make = {
        "PFGMM": lambda **kw: PFGMM(3, switch_prior=0.2, n_restarts=2, **QUIET, **kw),
        "SupervisedGMM": lambda **kw: SupervisedGMM(3, **QUIET, **kw),
        "PFHMM": lambda **kw: PFHMM(3, switch_prior=0.3, **QUIET, **kw),
    }[kind]
    args = (data.X, data.y) if kind == "PFHMM" else (x, y)
    plain = _quiet(lambda: make().fit(*args))
    marginal = _quiet(lambda: make(missing="marginalize").fit(*args))
    assert marginal.history_ == plain.history_
    for name, value in plain._get_globals().items():
        assert torch.equal(marginal._get_globals()[name], value), name


@pytest.mark.parametrize("kind", ["PFGMM", "PFHMM"])
def test_em_with_missing_entries_never_decreases_the_elbo(pf_data, hmm_data, kind):
    settings = {"tol": 0.0, "max_iter": 40, "missing": "marginalize", **QUIET}
    if kind == "PFGMM":
        x, y, _ = pf_data
        model = _quiet(lambda: PFGMM(3, switch_prior=0.2, n_restarts=1, **settings).fit(_holed(x), y))
    else:
        data, holed = hmm_data
        model = _quiet(lambda: PFHMM(3, switch_prior=0.3, **settings).fit(holed, data.y))
    history = np.asarray(model.history_)
    assert len(history) > 5
    assert np.all(np.diff(history) >= -1e-12 * np.abs(history[1:]))


def test_recovery_at_twenty_percent_missing_matches_the_complete_fit():
    """MCAR at 20 %: the same relevant features, the relevant features' means close to the complete-data fit's
    (components matched), and the accuracy on the complete rows close."""
    data = make_pf_synthetic(600, n_relevant=3, n_features=8, seed=2)
    x, y = np.asarray(data.X, dtype=float), np.asarray(data.y, dtype=float)
    settings = {"switch_prior": 0.1, **QUIET}
    complete = _quiet(lambda: PFGMM(4, **settings).fit(x, y))
    rows_with_holes = _holed(x, 0.2)
    holed = _quiet(lambda: PFGMM(4, missing="marginalize", **settings).fit(rows_with_holes, y))
    assert holed.relevant_features_.tolist() == complete.relevant_features_.tolist() == data.relevant.tolist()
    relevant = data.relevant
    a, b = complete.components_.loc.numpy()[:, relevant], holed.components_.loc.numpy()[:, relevant]
    rows, cols = linear_sum_assignment(np.abs(a[:, None] - b[None]).sum(-1))
    assert np.abs(a[rows] - b[cols]).max() < 0.3
    assert holed.score(x, y) > complete.score(x, y) - 0.03
    assert holed.score(rows_with_holes, y) > complete.score(x, y) - 0.05  # predicted from the observed entries


def test_integer_weights_are_repeated_rows_with_missing_entries(pf_data):
    """One EM step and the data scale on weighted rows with missing entries equal those on the repeated rows."""
    x, y, _ = pf_data
    holed = _holed(x)
    model = _quiet(lambda: _pfgmm(max_iter=3).fit(holed, y))
    weight = np.random.default_rng(0).integers(0, 3, len(x))
    repeated = np.repeat(np.arange(len(x)), weight)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    weighted = a._em_data(Batch(a.prepare_data(holed, y), torch.as_tensor(weight, dtype=torch.float64)))
    rows = b._em_data(b.prepare_data(holed[repeated], y[repeated]))
    (resp_a, elbo_a), (resp_b, elbo_b) = a._e_step(weighted), b._e_step(rows)
    assert float(elbo_a) == pytest.approx(float(elbo_b), rel=1e-12)
    a._em_update(a._em_statistics(weighted, resp_a))
    b._em_update(b._em_statistics(rows, resp_b))
    for name, value in b._get_globals().items():
        torch.testing.assert_close(a._get_globals()[name], value, rtol=1e-10, atol=1e-12)
    tensor = torch.as_tensor(holed)
    scale = weighted_data_scale(tensor, torch.as_tensor(weight, dtype=torch.float64), 1e-6)
    reference = weighted_data_scale(tensor[repeated], torch.ones(len(repeated), dtype=torch.float64), 1e-6)
    for key, value in reference.items():
        torch.testing.assert_close(scale[key], value, rtol=1e-12, atol=0.0)


def test_observed_statistics_of_shards_merge_to_those_of_all_rows(pf_data):
    """Statistics of rows with missing entries merge across shards (and with complete rows') exactly."""
    x, _, _ = pf_data
    holed = torch.as_tensor(_holed(x))
    model = _quiet(lambda: _pfgmm(max_iter=3).fit(holed.numpy(), pf_data[1]))
    resp = model._responsibilities(model.prepare_data(holed.numpy()))
    complete = torch.as_tensor(x[:50])
    whole = ObservedStatistics.of_complete(frame_statistics(model.components_, frames_of(complete), resp[:50]))
    whole = whole.merge(frame_statistics(model.components_, frames_of(holed[50:]), resp[50:]))
    mixed = torch.cat([complete, holed[50:]])
    direct = frame_statistics(model.components_, frames_of(mixed), resp)
    torch.testing.assert_close(whole.counts, direct.counts)
    for name in ("counts", "mean", "scatter"):
        torch.testing.assert_close(getattr(whole.cells, name), getattr(direct.cells, name), rtol=1e-10, atol=1e-9)


def test_missing_entries_are_refused_unless_asked_for_and_where_not_exact(pf_data):
    x, y, _ = pf_data
    holed = _holed(x)
    with pytest.raises(InvalidDataError, match="X contains NaN"):
        PFGMM(2, switch_prior=0.2, **QUIET).fit(holed, y)
    with pytest.raises(ValueError, match="missing='marginalize' is for engine='em'"):
        _pfgmm().fit(holed, y, engine="svi")
    with pytest.raises(ValueError, match="missing must be one of"):
        PFGMM(2, missing="impute").fit(x, y)
    model = _quiet(lambda: _pfgmm(max_iter=5).fit(holed, y))
    empty = holed[:3].copy()
    empty[1] = np.nan
    with pytest.raises(InvalidDataError, match="row 1 has every entry missing"):
        model.predict(empty)
    lonely = x.copy()
    lonely[1:, 4] = np.nan
    with pytest.raises(InvalidDataError, match=r"constant feature\(s\) \[4\] \(over their observed entries\)"):
        _pfgmm().fit(lonely, y)


def test_a_sequence_with_missing_entries_does_not_depend_on_the_rest_of_the_batch(hmm_data):
    data, holed = hmm_data
    model = _quiet(lambda: PFHMM(3, switch_prior=0.3, missing="marginalize", **QUIET).fit(holed, data.y))
    extreme = np.full((4, 4), 1e12)
    extreme[1, 2] = np.nan
    alone = model.predict_proba(holed[:1])[0]
    np.testing.assert_allclose(model.predict_proba([extreme, holed[0]])[1], alone, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        model.score_samples([holed[0], extreme])[0], model.score_samples(holed[:1])[0], rtol=1e-12
    )


def test_switch_prior_selection_scores_rows_with_missing_entries(pf_data):
    """``switch_prior="auto"``'s cross-validation fits and scores folds whose rows have missing entries."""
    x, y, _ = pf_data
    model = PFGMM(3, n_restarts=1, missing="marginalize", **QUIET)
    tensor, labels = torch.as_tensor(_holed(x)), torch.as_tensor(y)
    selection = select_switch_prior(model, tensor, labels, torch.ones(len(y), dtype=torch.bool), grid=(0.05, 0.5))
    assert selection.p in selection.scores
    assert all(-0.7 < score < 0 for score in selection.scores.values())


def test_pfhmm_on_shards_with_and_without_missing_entries_equals_in_memory_em():
    """fit_em merges the observed statistics of shards with missing entries with complete shards' exactly."""
    data = make_pf_hmm_synthetic(24, length=12, n_relevant=2, n_features=4, seed=1)
    x = [s / 4.0 for s in data.X]  # overlapping states: many iterations
    x[8:] = [_holed(s, seed=b) for b, s in enumerate(x[8:])]
    y = [v.astype(float) for v in data.y]
    start = PFHMM(3, switch_prior=0.3, init_params="kmeans", missing="marginalize", **QUIET)
    _quiet(lambda: start.fit(x, y, max_iter=1))
    start.warm_start = True
    in_memory = _quiet(lambda: copy.deepcopy(start).fit(x, y, max_iter=8, tol=0.0))
    shards = [([x[i] for i in part], [y[i] for i in part]) for part in np.array_split(np.arange(24), 3)[::-1]]
    sharded = _quiet(lambda: fit_em(copy.deepcopy(start), shards, executor="inline", target="y", max_iter=8, tol=0.0))
    np.testing.assert_allclose(sharded.history_, in_memory.history_, rtol=1e-10, atol=0)
    for name, value in in_memory._state_tensors().items():
        np.testing.assert_allclose(sharded._state_tensors()[name].numpy(), value.numpy(), rtol=1e-10, atol=1e-12)


def test_pfgmm_on_shards_with_missing_entries_equals_in_memory_em(pf_data):
    """The background and the class statistics behind ``relevant_features_`` merge from the observed entries of
    every shard (one without missing entries among them): the sharded fit is the in-memory one."""
    x, y, _ = pf_data
    holed = np.r_[_holed(x[:250]), x[250:]]
    start = _pfgmm(n_restarts=1)
    _quiet(lambda: start.fit(holed, y, max_iter=2))
    start.warm_start = True
    in_memory = _quiet(lambda: copy.deepcopy(start).fit(holed, y, max_iter=10, tol=0.0))
    shards = [(holed[part], y[part]) for part in np.array_split(np.arange(len(y)), 3)[::-1]]
    sharded = _quiet(lambda: fit_em(copy.deepcopy(start), shards, executor="inline", target="y", max_iter=10, tol=0.0))
    np.testing.assert_allclose(sharded.history_, in_memory.history_, rtol=1e-10, atol=0)
    for name, value in in_memory._get_globals().items():
        torch.testing.assert_close(sharded._get_globals()[name], value, rtol=1e-10, atol=1e-12)
    assert (
        sharded.relevant_features_.tolist()
        == in_memory.relevant_features_.tolist()
        == [True, True, False, False, False]
    )
