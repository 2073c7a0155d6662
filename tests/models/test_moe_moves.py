"""Split-and-merge moves of MixtureOfExperts: the proposal and screened searches, the moves' responsibilities,
the candidates, and rejected moves."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch

from ppmix.datasets.moe import make_moe
from ppmix.models import moe_moves
from ppmix.models.moe import MixtureOfExperts
from ppmix.models.moe_moves import (
    _DUPLICATE_KL,
    _SCREEN_KEEP,
    _SCREEN_MOST,
    SPLITS,
    WORST_FIT,
    candidate_moves,
    move_responsibilities,
    screened_moves,
)

QUIET = {"n_init": 1, "progress": False}
#: two EM runs that end at the same optimum stop within a few times EM's tol (1e-6 nats per point) of it
_SAME_OPTIMUM = 1e-5


def _monotone(history, rtol: float = 1e-9) -> bool:
    return bool((np.diff(history) >= -rtol * np.abs(np.asarray(history)[1:])).all())


def test_split_and_merge_repairs_the_duplicated_expert_optimum():
    """From restarts where plain EM splits one expert in two and merges two others, the moves reach the best optimum."""
    data = make_moe(2000, n_experts=4, n_features=5, seed=0)
    best = MixtureOfExperts(4, seed=1, split_merge=0, **QUIET).fit(data.X, data.y).lower_bound_
    for seed in (3, 4):  # plain EM from these random gates ends at a duplicated expert
        plain = MixtureOfExperts(4, seed=seed, split_merge=0, **QUIET).fit(data.X, data.y)
        moved = MixtureOfExperts(4, seed=seed, **QUIET).fit(data.X, data.y)
        assert plain.lower_bound_ < best - 0.05
        assert moved.lower_bound_ == pytest.approx(best, abs=_SAME_OPTIMUM)
        assert _monotone(moved.history_)
        assert moved.n_iter_ > plain.n_iter_
        # the default: ten short EM starts of which the best runs on ("small EM"), then the moves
        default = MixtureOfExperts(4, seed=seed, progress=False).fit(data.X, data.y)
        assert default.lower_bound_ == pytest.approx(best, abs=_SAME_OPTIMUM)
    # at the best optimum there is no duplicate pair: the moves leave the fit as it is
    again = MixtureOfExperts(4, seed=1, **QUIET).fit(data.X, data.y)
    assert again.lower_bound_ == best


def test_split_and_merge_frees_the_least_used_expert_when_no_pair_is_duplicated():
    """A local optimum without a duplicate pair: freeing the expert with the least mass and splitting the worst
    one reaches the best optimum."""
    data = make_moe(2000, n_experts=4, n_features=5, seed=0)
    best = MixtureOfExperts(4, seed=1, split_merge=0, **QUIET).fit(data.X, data.y).lower_bound_
    plain = MixtureOfExperts(4, seed=0, split_merge=0, **QUIET).fit(data.X, data.y)
    x = plain._em_data(plain._train_data)[0]
    kl = plain._experts.kl(plain._experts, x).mean(0)
    assert float((kl + kl.T).fill_diagonal_(float("inf")).min()) >= _DUPLICATE_KL
    assert plain.lower_bound_ < best - 0.05
    moved = MixtureOfExperts(4, seed=0, **QUIET).fit(data.X, data.y)
    assert moved.lower_bound_ == pytest.approx(best, abs=_SAME_OPTIMUM)
    assert _monotone(moved.history_)


@pytest.mark.parametrize("search", ["proposal", "screened"])
def test_split_and_merge_rejects_a_move_that_empties_an_expert(monkeypatch, search):
    """A move under which an expert's least squares becomes singular is rejected (not screened) and the fit kept."""
    data = make_moe(600, n_experts=3, n_features=3, seed=2)
    plain = MixtureOfExperts(3, seed=0, split_merge=0, **QUIET).fit(data.X, data.y)

    def emptying(model, x, y, move, weight=None):
        proposal = torch.zeros(x.shape[0], model.n_experts, dtype=x.dtype)
        proposal[:, 0] = 1.0
        return proposal

    monkeypatch.setattr(moe_moves, "move_responsibilities", emptying)
    moved = MixtureOfExperts(3, seed=0, split_merge_search=search, **QUIET).fit(data.X, data.y)
    assert moved.lower_bound_ == plain.lower_bound_
    np.testing.assert_array_equal(moved.coef_.numpy(), plain.coef_.numpy())


@pytest.fixture(scope="module")
def three_experts():
    data = make_moe(400, n_experts=3, n_features=2, seed=3)
    model = MixtureOfExperts(3, seed=0, split_merge=0, **QUIET).fit(data.X, data.y)
    return model, model._em_data(model._train_data)


def _freed(resp: torch.Tensor, freed: int, keep: int | None) -> torch.Tensor:
    """The responsibilities after ``freed``'s mass goes to ``keep`` (None: to the others in proportion, or evenly
    where they have none)."""
    if keep is None:
        # the others' mass summed (1 - resp[freed] rounds to 0 where resp[freed] is 1 - 1e-17)
        others = resp[:, [k for k in range(resp.shape[1]) if k != freed]].sum(1, keepdim=True)
        after = torch.where(others > 0, resp / others, 1 / (resp.shape[1] - 1))
    else:
        after = resp.clone()
        after[:, keep] += after[:, freed]
    after[:, freed] = 0.0
    return after


@pytest.mark.parametrize("keep", [1, None])
def test_move_responsibilities_free_one_expert_and_split_another(three_experts, keep):
    """Known answer: the freed expert's mass goes to ``keep`` (or to the others in proportion); the split expert's
    points above its median residual move to the freed expert; nothing else changes."""
    model, (x, y) = three_experts
    freed, split = 0, 2
    resp = model._responsibilities(model._train_data)
    proposal = move_responsibilities(model, x, y, (freed, keep, split, "residual"))
    members = resp.argmax(1) == split
    residual = y - model._expert_means(x)[:, split]
    upper = members & (residual > residual[members].median())
    assert int(upper.sum()) == int(members.sum()) // 2  # distinct residuals: half the points, rounded down
    after_free = _freed(resp, freed, keep)
    expected = after_free.clone()
    expected[upper, freed], expected[upper, split] = after_free[upper, split], 0.0
    torch.testing.assert_close(proposal, expected)
    torch.testing.assert_close(proposal.sum(1), torch.ones_like(y))


@pytest.mark.parametrize("split", [0, 1, 2])
def test_weighted_proposals_and_residual_splits_are_those_of_the_repeated_rows(three_experts, split):
    """With integer row weights (zeros among them) the proposal search picks the move it picks on the rows repeated,
    and a residual split (the weighted median, the weighted count) gives every row its copies' responsibilities."""
    model, (x, y) = three_experts
    counts = torch.as_tensor(np.random.default_rng(split).integers(0, 4, len(y)))
    weight, x_repeated, y_repeated = counts.to(x), x.repeat_interleave(counts, 0), y.repeat_interleave(counts)
    proposal = moe_moves.split_merge_proposal(model, x, y, weight)
    assert proposal == moe_moves.split_merge_proposal(model, x_repeated, y_repeated)
    move = ((split + 1) % 3, (split + 2) % 3, split, "residual")
    moved = move_responsibilities(model, x, y, move, weight)
    torch.testing.assert_close(
        moved.repeat_interleave(counts, 0), move_responsibilities(model, x_repeated, y_repeated, move), rtol=0, atol=0
    )
    with pytest.raises(ValueError, match="sample_weight is taken by residual splits only"):
        move_responsibilities(model, x, y, (*move[:3], "covariates"), weight)


def test_a_split_needs_two_points(three_experts):
    model, (x, y) = three_experts
    hard = model._responsibilities(model._train_data).argmax(1)
    lonely = torch.nonzero(hard == 0)[:1, 0]
    rows = torch.cat([lonely, torch.nonzero(hard != 0)[:, 0]])
    with pytest.raises(ValueError, match="expert 0 holds 1 points; a split needs at least 2"):
        move_responsibilities(model, x[rows], y[rows], (1, 2, 0, "covariates"))


def test_covariate_split_cuts_the_expert_region_across_its_main_axis(three_experts):
    """``by="covariates"``: the moved points are one half of the split expert's points, cut at the median of
    their projection on the first principal axis of their covariates (found here by an eigendecomposition)."""
    model, (x, y) = three_experts
    resp = model._responsibilities(model._train_data)
    proposal = move_responsibilities(model, x, y, (0, 1, 2, "covariates"))
    members = (resp.argmax(1) == 2).numpy()
    points = x.numpy()[members]
    _, vectors = np.linalg.eigh(np.cov(points.T))
    projection = (x.numpy() - points.mean(0)) @ vectors[:, -1]
    upper = members & (projection > np.median(projection[members]))
    lower = members & (projection < np.median(projection[members]))
    moved = (proposal[:, 2] == 0).numpy() & members
    assert moved.any() and (np.array_equal(moved, upper) or np.array_equal(moved, lower))  # the axis' sign is free
    assert torch.equal(proposal[moved, 0], resp[moved, 2])


def test_candidate_moves_are_every_triple_both_ways_or_the_closest_120_then_the_worst_fit_moves():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(300, 2)), rng.normal(size=300)
    fits = {k: MixtureOfExperts(k, seed=0, split_merge=0, max_iter=3, **QUIET).fit(X, y) for k in (2, 4, 6)}
    x = {k: m._em_data(m._train_data)[0] for k, m in fits.items()}

    def worst_fit(k):  # every expert freed into each other one, and (K > 2) into all in proportion
        keeps = lambda f: [o for o in range(k) if o != f] + ([None] if k > 2 else [])  # noqa: E731
        return [(f, keep, None, WORST_FIT) for f in range(k) for keep in keeps(f)]

    both = [(0, 1, 1, "residual"), (1, 0, 0, "residual"), (0, 1, 1, "covariates"), (1, 0, 0, "covariates")]
    assert candidate_moves(fits[2], x[2]) == both + [(0, 1, None, WORST_FIT), (1, 0, None, WORST_FIT)]
    triples = list(itertools.permutations(range(4), 3))
    moves = candidate_moves(fits[4], x[4])
    assert moves[-16:] == worst_fit(4)
    assert sorted(moves[:-16]) == sorted((*t, by) for t in triples for by in SPLITS)
    moves = candidate_moves(fits[6], x[6])
    assert moves[_SCREEN_MOST:] == worst_fit(6)
    splits = moves[:_SCREEN_MOST]
    assert _SCREEN_MOST < 2 * 6 * 5 * 4 and all(by in SPLITS for *_, by in splits)
    kl = fits[6]._experts.kl(fits[6]._experts, x[6]).mean(0)
    distance = kl + kl.T
    every = {(*t, by) for t in itertools.permutations(range(6), 3) for by in SPLITS}
    left_out = every - set(splits)
    assert max(float(distance[f, k]) for f, k, *_ in splits) <= min(float(distance[f, k]) for f, k, *_ in left_out)


@pytest.mark.parametrize("keep", [1, None])
def test_worst_fit_move_gives_the_freed_expert_the_points_the_mixture_fits_worst(three_experts, keep):
    """Known answer: the freed expert's mass goes to ``keep`` (or to the others in proportion); then the 5% of the
    points of lowest mixture log-likelihood (found here by sorting) belong to the freed expert alone."""
    model, (x, y) = three_experts
    freed = 0
    resp = model._responsibilities(model._train_data)
    proposal = move_responsibilities(model, x, y, (freed, keep, None, WORST_FIT))
    log_lik = model._pointwise_log_likelihood(model._train_data).reshape(-1)
    worst = np.argsort(log_lik.numpy())[: int(0.05 * len(y))]  # 400 points: the 20 worst
    assert len(worst) == 20
    expected = _freed(resp, freed, keep)
    expected[worst] = 0.0
    expected[worst, freed] = 1.0
    torch.testing.assert_close(proposal, expected)


def test_screened_search_reaches_an_optimum_the_single_proposal_misses(caplog):
    """From the same EM optimum, one round of the screened search climbs far higher than the proposal's move; no EM
    run of the search (screening runs included) lowers its objective (as one did when a saturated gate's final
    Newton step went uphill)."""
    data = make_moe(800, expert="gaussian", seed=1)
    options = {"seed": 1, "split_merge": 1, **QUIET}
    plain = MixtureOfExperts(4, **{**options, "split_merge": 0}).fit(data.X, data.y)
    proposal = MixtureOfExperts(4, **options).fit(data.X, data.y)
    with caplog.at_level(logging.WARNING, logger="ppmix.engines.em"):
        screened = MixtureOfExperts(4, split_merge_search="screened", **options).fit(data.X, data.y)
    assert not [r.message for r in caplog.records if "decreased" in r.message]
    assert plain.lower_bound_ <= proposal.lower_bound_ < screened.lower_bound_ - 0.1
    assert _monotone(screened.history_), screened.history_
    assert screened.lower_bound_ == pytest.approx(screened.history_[-1])
    assert screened.n_iter_ > plain.n_iter_


@pytest.mark.parametrize("search, screen_rows", [("proposal", None), ("screened", 500), ("screened", 10_000)])
def test_a_screened_round_that_keeps_nothing_is_followed_by_another_on_a_fresh_subsample(
    monkeypatch, search, screen_rows
):
    """A screened round ranks moves on its own subsample, so one round that keeps nothing (here: screens none) does
    not end the search; two in a row do. Where the rows are screened whole (800 <= 10 000), or in the proposal
    search, the next round would repeat the idle one, and one idle round ends the search."""
    data = make_moe(800, expert="gaussian", seed=1)
    options = {"seed": 1, "split_merge_search": search, **QUIET}
    if screen_rows is not None:
        monkeypatch.setattr(moe_moves, "_SCREEN_ROWS", screen_rows)
    plain = MixtureOfExperts(4, **options, split_merge=0).fit(data.X, data.y)
    name = "screened_moves" if search == "screened" else "split_merge_proposal"
    real, calls = getattr(moe_moves, name), []

    def first_rounds_find_nothing(idle_rounds):
        def search_round(model, *args):
            calls.append(len(calls))
            if len(calls) <= idle_rounds:
                return [] if search == "screened" else None
            return real(model, *args)

        return search_round

    subsampled = screen_rows is not None and len(data.y) > screen_rows
    monkeypatch.setattr(moe_moves, name, first_rounds_find_nothing(1))
    after_one_idle = MixtureOfExperts(4, **options, split_merge=2).fit(data.X, data.y)
    if subsampled:
        assert len(calls) == 2 and after_one_idle.lower_bound_ > plain.lower_bound_ + 0.1
    else:
        assert len(calls) == 1 and after_one_idle.lower_bound_ == pytest.approx(plain.lower_bound_, abs=1e-12)
    calls.clear()
    monkeypatch.setattr(moe_moves, name, first_rounds_find_nothing(2))
    after_two_idle = MixtureOfExperts(4, **options, split_merge=3).fit(data.X, data.y)
    assert len(calls) == (2 if subsampled else 1)
    assert after_two_idle.lower_bound_ == pytest.approx(plain.lower_bound_, abs=1e-12)


def test_worst_fit_move_climbs_where_no_split_of_one_expert_does(monkeypatch, caplog):
    """On this logistic fit the best screened move is a worst-fit one: the search with it ends higher than the
    search restricted to splits of one expert (by 4e-4 nats per row), and says which move it kept."""
    data = make_moe(2000, expert="logistic", n_features=5, seed=2)
    options = {
        **QUIET,
        "n_init": 10,
        "seed": 0,
        "split_merge": 1,
        "split_merge_search": "screened",
        "expert": "logistic",
    }
    with caplog.at_level(logging.INFO, logger="ppmix.models.moe_moves"):
        screened = MixtureOfExperts(4, **options).fit(data.X, data.y)
    kept = [r.getMessage() for r in caplog.records if "objective/point" in r.getMessage()]
    assert len(kept) == 1 and f"'{WORST_FIT}')" in kept[0], kept
    every = moe_moves.candidate_moves
    monkeypatch.setattr(
        moe_moves, "candidate_moves", lambda model, x: [m for m in every(model, x) if m[3] != WORST_FIT]
    )
    splits_only = MixtureOfExperts(4, **options).fit(data.X, data.y)
    assert screened.lower_bound_ > splits_only.lower_bound_ + 2e-4
    assert _monotone(screened.history_)


@pytest.mark.parametrize("screen_rows", [10_000, 150])
def test_screened_moves_rank_their_starts_and_restore_the_model(three_experts, monkeypatch, screen_rows):
    """The starts come best first by their screening objective (all rows when there are fewer than the subsample
    size), each at least as high as a fresh move; the model's parameters are left as they were."""
    monkeypatch.setattr(moe_moves, "_SCREEN_ROWS", screen_rows)
    model, data = three_experts
    before = model._get_globals()
    starts = screened_moves(model, data, torch.Generator().manual_seed(0), 1e-6)
    after = model._get_globals()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert 1 <= len(starts) <= _SCREEN_KEEP
    assert len({move for move, _ in starts}) == len(starts)
    if screen_rows > data[1].shape[0]:
        objectives = []
        for _, values in starts:
            model._set_globals(values)
            objectives.append(float(model._e_step(data)[1]))
        model._set_globals(before)
        assert objectives == sorted(objectives, reverse=True)
    again = screened_moves(model, data, torch.Generator().manual_seed(0), 1e-6)
    assert [move for move, _ in again] == [move for move, _ in starts]
