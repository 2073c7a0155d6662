"""pf-GMM's relevance-guided restarts (``n_restarts``, ``restart_scores_``; issue 19, item 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ppmix.components.centred import CentredData
from ppmix.metrics import auroc
from ppmix.models import PFGMM
from ppmix.models.pf.restarts import (
    RESTART_TIE,
    fit_restarts,
    in_sample_log_p_y,
    label_statistic,
    start_responsibilities,
)
from ppmix.models.pf.switch_selection import _held_out_log_p_y
from ppmix.models.pf.switches import FrameLabels

QUIET = {"progress": False}


def _trap(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Feature 0 carries the label; feature 1 barely does (it passes the label test) but holds two far-apart
    label-independent clusters, which k-means on the label-relevant features follows; four noise features."""
    rng = np.random.default_rng(seed)
    y, c = rng.integers(2, size=n), rng.integers(2, size=n)
    x = np.c_[2.5 * y + rng.normal(size=n), 8 * c + 1.5 * y + rng.normal(size=n), rng.normal(size=(n, 4))]
    return x, y


def _test_auroc(model: PFGMM, seed: int = 100) -> float:
    x, y = _trap(2000, seed)
    return auroc(y, np.asarray(model.predict_proba(x))[:, 1])


@pytest.fixture(scope="module")
def trapped():
    """The trap at p = 0.5, where the plain start (restart 0) follows the clusters of feature 1."""
    x, y = _trap(600, 0)
    one = PFGMM(2, switch_prior=0.5, n_restarts=1, seed=0, **QUIET).fit(x, y)
    three = PFGMM(2, switch_prior=0.5, n_restarts=3, seed=0, **QUIET).fit(x, y)
    return x, y, one, three


def test_restarts_leave_the_basin_of_the_plain_start(trapped):
    _, _, one, three = trapped
    # the plain start ends where q(z | x) ignores the label: log P(y|x) at the base rate's, AUROC near chance
    assert one.restart_scores_[0] < np.log(0.5) + 0.01 and _test_auroc(one) < 0.6
    # the restarts find the label-aligned fit, and keep it
    assert max(three.restart_scores_) > one.restart_scores_[0] + 0.3
    assert _test_auroc(three) > 0.95
    assert three.predict_proba(np.zeros((1, 6))).shape == (1, 2)


def test_the_kept_start_is_the_best_by_the_criterion(trapped):
    x, y, one, three = trapped
    assert len(three.restart_scores_) == 3
    assert three.restart_scores_[0] == pytest.approx(one.restart_scores_[0], abs=1e-12)  # start 0 is the plain one
    kept = in_sample_log_p_y(three, three.prepare_data(x, y))
    assert min(abs(kept - s) for s in three.restart_scores_) < 1e-12  # one start's fit ...
    assert kept >= max(three.restart_scores_) - RESTART_TIE  # ... the best, up to the tie tolerance
    # the fitted attributes are the kept start's: its ELBO history ends at lower_bound_
    assert three.history_[-1] == three.lower_bound_ and three.n_iter_ == len(three.history_) - 1


def test_restarts_are_deterministic_for_a_seed(trapped):
    x, y, _, three = trapped
    again = PFGMM(2, switch_prior=0.5, n_restarts=3, seed=0, **QUIET).fit(x, y)
    assert again.restart_scores_ == three.restart_scores_
    torch.testing.assert_close(again.components_.loc, three.components_.loc, rtol=0, atol=0)
    assert np.array_equal(again.predict_proba(x), three.predict_proba(x))


def test_auto_records_the_restarts_and_escapes_the_trap():
    x, y = _trap(300, 1)
    model = PFGMM(2, seed=0, **QUIET).fit(x, y)
    assert model.n_restarts == 3 and len(model.restart_scores_) == 3
    assert model.summary()["restart_scores"] == model.restart_scores_
    assert _test_auroc(model) > 0.95
    assert model.relevant_features_.tolist() == [True, True, False, False, False, False]


def test_validation_scores_average_over_the_starts():
    """A held-out row's score is the mean of its ``log P(y|x)`` over the starts, not the kept start's."""
    x, y = _trap(600, 0)  # the trapped fixture's data
    x_test, y_test = _trap(100, 7)
    per_start = []

    def collect(_: int) -> None:
        p1 = np.asarray(model.predict_proba(x_test))[:, 1]
        per_start.append(np.where(y_test == 1, np.log(p1), np.log1p(-p1)))

    model = PFGMM(2, switch_prior=0.5, n_restarts=3, seed=0, **QUIET)
    model.p_ = 0.5
    fit_restarts(model, lambda r: model._fit_start(x, y, r), 3, collect)
    fresh = PFGMM(2, switch_prior=0.5, n_restarts=3, seed=0, **QUIET)
    scores = _held_out_log_p_y(fresh, x, y, x_test, y_test, {})
    np.testing.assert_allclose(scores, np.mean(per_start, axis=0), rtol=1e-10)
    assert not np.allclose(per_start[0], per_start[1])  # the trap: the starts disagree at p = 0.5


def test_warm_start_continues_with_one_start(trapped):
    x, y, _, three = trapped
    model = PFGMM(2, switch_prior=0.5, n_restarts=3, warm_start=True, seed=0, **QUIET).fit(x, y)
    model.fit(x, y)
    assert len(model.restart_scores_) == 1


def test_save_and_load_keep_the_restart_scores(trapped, tmp_path):
    _, _, _, three = trapped
    three.save(tmp_path / "pf")
    loaded = PFGMM.load(tmp_path / "pf")
    assert loaded.restart_scores_ == three.restart_scores_ and loaded.n_restarts == 3


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError), ("3", TypeError)]
)
def test_bad_n_restarts_is_named(value, error):
    x, y = _trap(50, 0)
    with pytest.raises(error, match="n_restarts"):
        PFGMM(2, switch_prior=0.5, n_restarts=value, **QUIET).fit(x, y)


def test_starts_without_labels_are_kmeans_and_kept_by_the_elbo():
    x, _ = _trap(200, 3)
    model = PFGMM(2, switch_prior=0.5, n_restarts=3, seed=0, **QUIET).fit(x)
    assert len(model.restart_scores_) == 3
    assert model.lower_bound_ == pytest.approx(max(model.restart_scores_))


@pytest.mark.parametrize("restart", [1, 2, 3])
def test_start_responsibilities_are_hard_and_class_stratified_start_is_label_pure(restart):
    x, y = _trap(400, 4)
    xt = torch.as_tensor(x)
    labels = FrameLabels(torch.as_tensor(y, dtype=torch.float64), torch.ones(400, dtype=torch.bool))
    resp = start_responsibilities(
        PFGMM(4), CentredData.from_tensor(xt), labels, torch.Generator().manual_seed(0), restart
    )
    assert resp.shape == (400, 4) and bool((resp.sum(1) == 1).all())
    if restart == 1:  # each component holds one class only; the classes (about equal) get two components each
        purity = [set(y[resp[:, k].bool().numpy()].tolist()) for k in range(4)]
        assert all(len(p) == 1 for p in purity) and sorted(p.pop() for p in purity) == [0, 0, 1, 1]


def test_label_statistic_matches_the_gaussian_likelihood_ratio():
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    y = rng.integers(2, size=500)
    x = np.c_[rng.normal(size=500) * (1 + y) + 2 * y, rng.normal(size=500)]
    stat = label_statistic(torch.as_tensor(x), torch.as_tensor(y, dtype=torch.float64)).numpy()
    for d in range(2):  # the per-row log-likelihood ratio of the MLE fits, by scipy
        pooled = norm.logpdf(x[:, d], x[:, d].mean(), x[:, d].std()).sum()
        split = sum(norm.logpdf(x[y == c, d], x[y == c, d].mean(), x[y == c, d].std()).sum() for c in (0, 1))
        assert stat[d] == pytest.approx((split - pooled) / 500, rel=1e-9, abs=1e-12)


def test_fit_restarts_keeps_the_first_of_equal_starts():
    x, y = _trap(300, 5)
    model = PFGMM(2, switch_prior=0.05, seed=0, **QUIET)
    model.p_ = 0.05
    seen = []
    scores = fit_restarts(model, lambda r: model._fit_start(x, y, r), 3, lambda r: seen.append(model._get_globals()))
    assert len(scores) == 3 and max(scores) - min(scores) < RESTART_TIE  # at small p every start ends in one fit
    torch.testing.assert_close(model._get_globals()["locs"], seen[0]["locs"], rtol=0, atol=0)  # the first is kept


def test_a_start_that_memorises_one_mislabelled_row_is_not_kept():
    """Issue 39, item 7 (tutorial 02's data, smaller): the class-stratified start (1) gives a component to one
    mislabelled row and merges two clusters of a class; its in-sample ``log P(y|x)`` is higher by about one standard
    error (that row), its ELBO nats per point lower. The default fit must reach start 0's optimum, which EM
    warm-started there keeps."""
    from ppmix.datasets import make_pf_synthetic

    data = make_pf_synthetic(120, n_relevant=20, n_features=30, label_probs=(0.01, 0.99, 0.01, 0.99), seed=0)
    x, y = (data.X - data.X.mean(0)) / data.X.std(0), data.y
    stratified = PFGMM(4, switch_prior=0.3, n_restarts=1, seed=0, **QUIET)
    stratified._fit_start(x, y, 1)
    better = PFGMM(4, switch_prior=0.3, n_restarts=1, warm_start=True, seed=0, **QUIET).fit(x, y)
    reached = better.lower_bound_
    assert better.fit(x, y).lower_bound_ == pytest.approx(reached, abs=1e-6)  # an optimum of the objective
    assert stratified.lower_bound_ < reached - 1  # the trap: start 1 alone ends far below it
    model = PFGMM(4, switch_prior=0.3, seed=0, **QUIET).fit(x, y)
    assert model.restart_scores_[1] > model.restart_scores_[0]  # start 1 wins in-sample, by one row ...
    assert model.lower_bound_ > reached - 0.1  # ... and is not kept


@pytest.mark.parametrize("gain", [0.5, 5.0, 500.0])
def test_a_gain_that_one_row_carries_is_not_clearly_better(gain):
    """Its mean equals its standard error (gain / N) whatever its size; spread over many rows it counts."""
    from ppmix.models.pf.restarts import RESTART_MARGIN_SE, _clearly_better

    best = np.random.default_rng(0).normal(-0.1, 0.05, size=300)
    one_row = best.copy()
    one_row[7] += gain
    diff = one_row - best
    assert diff.mean() == pytest.approx(diff.std(ddof=1) / np.sqrt(diff.size))  # exactly one standard error
    assert RESTART_MARGIN_SE > 1 and not _clearly_better(one_row, best)
    assert _clearly_better(best + gain / 300 + np.random.default_rng(1).normal(0, 1e-3, size=300), best)
