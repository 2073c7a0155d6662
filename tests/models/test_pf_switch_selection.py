"""pf-GMM's ``switch_prior="auto"``, ``relevance_gain_`` and ``relevant_features_`` (issue 19)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator

from ppmix.datasets import make_pf_synthetic
from ppmix.models import PFGMM, PFHMM, SupervisedGMM
from ppmix.models.pf._pf_state import switch_p
from ppmix.models.pf.switch_selection import (
    FALLBACK_SWITCH_PRIOR,
    SWITCH_PRIOR_GRID,
    SwitchPriorSelection,
    _within_one_standard_error,
    relevant_feature_mask,
    select_switch_prior,
)
from ppmix.models.pf.switches import FrameLabels

QUIET = {"seed": 0, "progress": False}


class _PlantedOptimum(BaseEstimator):
    """A stand-in classifier whose held-out ``log P(y|x)`` peaks exactly at ``switch_prior = best``.

    It predicts the training fold's base rate shifted by ``log(switch_prior / best)`` on the logit scale.
    """

    def __init__(self, switch_prior=0.5, best=1e-2, seed=0, tol=1e-7, max_iter=200, progress=False):
        self.switch_prior, self.best, self.seed = switch_prior, best, seed
        self.tol, self.max_iter, self.progress = tol, max_iter, progress

    def fit(self, x, y, **options):
        rate = float(np.nanmean(y))
        self.logit_ = math.log(rate / (1 - rate)) + math.log(self.switch_prior / self.best)
        return self

    def predict_proba(self, x):
        q = 1 / (1 + math.exp(-self.logit_))
        return np.tile([1 - q, q], (len(x), 1))


def _planted_data(n=90):
    y = torch.as_tensor(np.arange(n) % 3 == 0, dtype=torch.float64)  # base rate 1/3 in every stratified fold
    return torch.zeros(n, 2, dtype=torch.float64), y, torch.ones(n, dtype=torch.bool)


@pytest.mark.parametrize("best", [3e-5, 0.04])
def test_selection_finds_a_planted_optimum_inside_or_below_the_grid(best):
    x, y, observed = _planted_data()
    selection = select_switch_prior(_PlantedOptimum(best=best), x, y, observed)
    assert abs(math.log(selection.p / best)) < 0.3  # grid ratio is log(2.8) = 1.04: the refinement worked
    assert selection.scores[selection.p] == max(selection.scores.values())
    assert set(SWITCH_PRIOR_GRID) <= set(selection.scores)
    assert (min(selection.scores) < SWITCH_PRIOR_GRID[0]) == (best < SWITCH_PRIOR_GRID[0])


def test_one_standard_error_rule():
    rng = np.random.default_rng(0)
    best = rng.normal(size=400)
    noise = rng.normal(size=400)  # standard error of the paired difference: 0.05
    assert _within_one_standard_error(best - 0.02 + noise, best)
    assert not _within_one_standard_error(best - 0.2 + noise, best)
    assert _within_one_standard_error(best, best)


def test_a_final_fit_below_its_validation_steps_down_to_smaller_priors():
    selection = SwitchPriorSelection(
        0.06,
        {0.001: -0.6, 0.02: -0.38, 0.04: -0.39, 0.06: -0.35, 0.1: -0.5},
        dict.fromkeys([0.001, 0.02, 0.04, 0.06, 0.1], 0.03),
    )
    assert selection.candidates() == [0.06, 0.02, 0.04, 0.001]
    assert selection.agrees(0.06, -0.30) and selection.agrees(0.06, -0.37)
    assert not selection.agrees(0.06, -0.62)  # the wine + distractors fold where the fit at 0.06 collapsed


def test_selection_falls_back_without_enough_labels():
    x, y, observed = _planted_data()
    observed[:] = False
    observed[:3] = True  # one positive, two negatives
    selection = select_switch_prior(_PlantedOptimum(), x, y, observed)
    assert selection.p == FALLBACK_SWITCH_PRIOR and selection.scores == {}


@pytest.fixture(scope="module")
def planted():
    data = make_pf_synthetic(400, n_relevant=4, n_features=12, seed=0)
    return data, PFGMM(4, **QUIET).fit(data.X, data.y)


def test_auto_recovers_the_relevant_block(planted):
    data, model = planted
    assert model.switch_prior == "auto" and 0 < model.p_ <= 0.5
    assert model.switch_prior_scores_[model.p_] == max(model.switch_prior_scores_.values())
    assert np.array_equal(model.relevant_features_, data.relevant)
    assert model.summary()["switch_prior"] == model.p_
    gain = model.relevance_gain_
    assert gain[data.relevant].min() > 1.0 and np.abs(gain[~data.relevant]).max() < 0.02


def test_gain_does_not_echo_the_prior(planted):
    data, _ = planted
    gains, relevance = [], []
    for p in (0.05, 0.4):
        model = PFGMM(4, switch_prior=p, **QUIET).fit(data.X, data.y)
        assert model.p_ == p and model.switch_prior_scores_ is None
        logit = math.log(p / (1 - p))
        np.testing.assert_allclose(model.relevance_, 1 / (1 + np.exp(-(logit + model.relevance_gain_))), rtol=1e-9)
        assert np.array_equal(model.relevant_features_, data.relevant)
        gains.append(model.relevance_gain_)
        relevance.append(model.relevance_)
    np.testing.assert_allclose(gains[0], gains[1], atol=0.02)  # the evidence stays ...
    assert relevance[1][~data.relevant].min() > 0.39 > 0.06 > relevance[0][~data.relevant].max()  # ... phi follows p


def test_features_the_components_follow_without_the_label_are_not_selected():
    """With K = 6 for two label-relevant features, the spare components follow the irrelevant features' own
    clusters: their gain is significant, their label association is not."""
    data = make_pf_synthetic(600, n_relevant=2, n_features=6, seed=3)
    model = PFGMM(6, switch_prior=0.3, **QUIET).fit(data.X, data.y)
    train = model._train_data
    gain_only = relevant_feature_mask(model.relevance_gain_, 6, train.x, FrameLabels.missing(600, train.x.dtype, "cpu"))
    assert gain_only[~data.relevant].any()
    assert np.array_equal(model.relevant_features_, data.relevant)


def test_label_test_keeps_its_level_on_null_features():
    gen = torch.Generator().manual_seed(0)
    n, d = 300, 400
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = (torch.rand(n, generator=gen) < 0.4).double()
    labels = FrameLabels(y, torch.ones(n, dtype=torch.bool))
    x[:, :5] += 2 * y[:, None]
    mask = relevant_feature_mask(np.ones(d), 3, x, labels)  # every gain significant: the label test decides
    assert mask[:5].all() and mask[5:].sum() <= 1


def test_choice_survives_save_and_load(planted, tmp_path):
    _, model = planted
    loaded = PFGMM.load(model.save(tmp_path / "pf"))
    assert loaded.p_ == model.p_ and loaded.switch_prior_scores_ == model.switch_prior_scores_
    np.testing.assert_array_equal(loaded.relevant_features_, model.relevant_features_)


def test_dataframe_input_names_the_outputs():
    pd = pytest.importorskip("pandas")
    data = make_pf_synthetic(200, n_relevant=2, n_features=5, seed=1)
    frame = pd.DataFrame(data.X, columns=[f"f{j}" for j in range(5)])
    model = PFGMM(2, switch_prior=0.2, **QUIET).fit(frame, data.y)
    assert list(model.relevant_features_.index) == list(frame.columns)
    assert model.relevant_features_.tolist() == data.relevant.tolist()
    assert list(model.relevance_gain_.index) == list(frame.columns)


def test_unlabelled_auto_falls_back_and_supervised_keeps_p_one():
    data = make_pf_synthetic(150, n_relevant=2, n_features=4, seed=2)
    assert PFGMM(2, **QUIET).fit(data.X).p_ == FALLBACK_SWITCH_PRIOR
    sup = SupervisedGMM(2, **QUIET).fit(data.X, data.y)
    assert sup.p_ == 1.0 and sup.relevant_features_.all() and np.isnan(sup.relevance_gain_).all()


def test_auto_is_resolved_only_by_fit_and_not_offered_by_pf_hmm():
    with pytest.raises(ValueError, match="chosen by PFGMM.fit"):
        switch_p(PFGMM(2))
    x = np.random.default_rng(0).normal(size=(3, 20, 2))
    with pytest.raises(ValueError, match="switch_prior"):
        PFHMM(2, switch_prior="auto", progress=False).fit(x, np.zeros((3, 20)))


# ------------------------------------------------------------------------------------ sample weights
class _WeightedBaseRate(_PlantedOptimum):
    """:class:`_PlantedOptimum` fitted on the training fold's weighted base rate (``sample_weight``)."""

    def fit(self, x, y, sample_weight=None, **options):
        weight = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        labelled = ~np.isnan(y)
        rate = float(weight[labelled] @ y[labelled] / weight[labelled].sum())
        self.logit_ = math.log(rate / (1 - rate)) + math.log(self.switch_prior / self.best)
        return self


def test_weighted_selection_is_the_grouped_cross_validation_of_the_repeated_rows():
    """Integer weights: every score (and its standard error) is that of the repeated rows cross-validated with
    all copies of a row in the row's fold; rows of weight zero take no part."""
    from ppmix.models.pf.switch_selection import _stratified_folds

    n = 60
    y = (np.arange(n) % 3 == 0).astype(float)
    x, observed = np.zeros((n, 2)), np.ones(n, dtype=bool)
    weight = np.random.default_rng(0).integers(0, 4, n).astype(float)
    model = _WeightedBaseRate(best=0.04, seed=0)
    selection = select_switch_prior(
        model, *map(torch.as_tensor, (x, y, observed)), grid=(0.01, 0.1), sample_weight=torch.as_tensor(weight)
    )
    kept = weight > 0
    folds = np.repeat(_stratified_folds(y[kept], observed[kept], 3, model.seed), weight[kept].astype(int))
    y_rep = np.repeat(y[kept], weight[kept].astype(int))
    for p, score in selection.scores.items():
        rows = []
        for fold in range(3):
            fitted = _WeightedBaseRate(switch_prior=p, best=0.04).fit(None, y_rep[folds != fold])
            q = fitted.predict_proba(y_rep[folds == fold])[:, 1]
            rows.append(np.where(y_rep[folds == fold] == 1, np.log(q), np.log1p(-q)))
        rows = np.concatenate(rows)
        assert score == pytest.approx(rows.mean(), rel=1e-12)
        assert selection.standard_errors[p] == pytest.approx(rows.std(ddof=1) / math.sqrt(rows.size), rel=1e-10)
    assert len(selection.scores) > 2 and abs(math.log(selection.p / 0.04)) < 0.6


def test_auto_with_zero_weights_equals_the_fit_without_those_rows():
    """PFGMM(switch_prior='auto').fit with weights 0/1 is the fit on the rows of weight one: the same folds,
    validation scores, chosen p and parameters (the weighted k-means starts draw other rows; with three starts
    every fit meets the unweighted one at its optimum on these data, where one start could miss it)."""
    data = make_pf_synthetic(150, n_relevant=2, n_features=5, seed=0)
    weight = (np.random.default_rng(0).random(150) < 0.8).astype(float)
    kept = weight > 0
    weighted = PFGMM(2, n_restarts=3, **QUIET).fit(data.X, data.y, sample_weight=weight)
    plain = PFGMM(2, n_restarts=3, **QUIET).fit(data.X[kept], data.y[kept])
    assert weighted.p_ == plain.p_
    assert list(weighted.switch_prior_scores_) == list(plain.switch_prior_scores_)
    scores = [list(model.switch_prior_scores_.values()) for model in (weighted, plain)]
    np.testing.assert_allclose(*scores, rtol=1e-8)
    orders = [model.label_probs_.argsort() for model in (weighted, plain)]  # the components in a common order
    for site, value in plain._get_globals().items():
        mine = weighted._get_globals()[site]
        if site in ("weights", "locs", "scales", "label_probs"):
            mine, value = mine[orders[0]], value[orders[1]]
        np.testing.assert_allclose(mine, value, rtol=1e-6, atol=1e-8, err_msg=site)
    assert weighted.relevant_features_.tolist() == plain.relevant_features_.tolist()
