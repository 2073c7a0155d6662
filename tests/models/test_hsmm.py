"""Known answers of the explicit-duration HMM (:class:`ppmix.HSMM`) and its segment algorithms
(:mod:`ppmix.algorithms.segments`): brute-force enumeration of segmentations, the expanded-state HMM, EM's
monotone objective, planted parameters and save/load. The model contract (shapes, types, errors) is
tests/models/test_contract.py's."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix import HSMM
from ppmix.algorithms.forward_backward import forward_backward
from ppmix.algorithms.segments import sample_segmentations, segment_posterior, segment_viterbi
from ppmix.models._durations import completed_counts
from tests.common import make_family_sequences

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")
F64 = torch.float64
QUIET = {"seed": 0, "progress": False}


# ------------------------------------------------------------------------------------ brute force
def compositions(total: int, depth: int):
    """Every way to cut ``total`` steps into segments of ``1..depth`` steps."""
    if total == 0:
        yield ()
        return
    for d in range(1, min(depth, total) + 1):
        for rest in compositions(total - d, depth):
            yield (d, *rest)


def brute_force(log_init, log_trans, log_dur, log_emit) -> dict:
    """Enumerate every segmentation of one sequence ``log_emit (T, K)``: log-likelihood, best segmentation and the
    posterior expected counts, the last segment censored (probability ``P(duration >= d)``)."""
    steps, k = log_emit.shape
    depth = log_dur.shape[1]
    log_surv = torch.logcumsumexp(log_dur.flip(1), 1).flip(1)
    scores, paths = [], []
    for cut in compositions(steps, depth):
        for states in itertools.product(range(k), repeat=len(cut)):
            score, t = log_init[states[0]], 0
            for i, (d, s) in enumerate(zip(cut, states)):
                score = score + (log_trans[states[i - 1], s] if i else 0.0) + log_emit[t : t + d, s].sum()
                score = score + (log_surv if i == len(cut) - 1 else log_dur)[s, d - 1]
                t += d
            scores.append(score)
            paths.append((cut, states))
    scores = torch.stack(scores)
    ll = torch.logsumexp(scores, 0)
    out = {
        name: torch.zeros(shape, dtype=F64)
        for name, shape in [
            ("posterior", (steps, k)),
            ("initial", (k,)),
            ("transitions", (k, k)),
            ("durations", (k, depth)),
            ("censored", (k, depth)),
        ]
    }
    for weight, (cut, states) in zip((scores - ll).exp(), paths):
        out["initial"][states[0]] += weight
        t = 0
        for i, (d, s) in enumerate(zip(cut, states)):
            out["posterior"][t : t + d, s] += weight
            if i:
                out["transitions"][states[i - 1], s] += weight
            out["censored" if i == len(cut) - 1 else "durations"][s, d - 1] += weight
            t += d
    best_cut, best_states = paths[int(scores.argmax())]
    out["best_path"] = [s for d, s in zip(best_cut, best_states) for _ in range(d)]
    out["best"], out["log_likelihood"] = scores.max(), ll
    return out


def random_chain(k: int, depth: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    log_init = torch.randn(k, generator=gen, dtype=F64).log_softmax(0)
    switch = torch.rand(k, k, generator=gen, dtype=F64).fill_diagonal_(0.0) if k > 1 else torch.ones(1, 1, dtype=F64)
    log_dur = (2 * torch.randn(k, depth, generator=gen, dtype=F64)).log_softmax(1)
    return log_init, (switch / switch.sum(1, keepdim=True)).log(), log_dur


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 3),
    depth=st.integers(1, 4),
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
    holes=st.booleans(),
)
def test_segment_posterior_and_viterbi_equal_brute_force_enumeration(k, depth, lengths, seed, holes):
    """Also with impossible emissions (``-inf``, ``holes``): a sequence no segmentation explains is an error."""
    log_init, log_trans, log_dur = random_chain(k, depth, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    log_emit = torch.randn(len(lengths), max(lengths), k, generator=gen, dtype=F64)
    if holes:
        log_emit = log_emit.masked_fill(torch.rand(log_emit.shape, generator=gen, dtype=F64) < 0.25, -math.inf)
    truths = [brute_force(log_init, log_trans, log_dur, log_emit[b, :steps]) for b, steps in enumerate(lengths)]
    lengths = torch.tensor(lengths)
    if any(math.isinf(float(truth["log_likelihood"])) for truth in truths):
        for algorithm in (segment_posterior, segment_viterbi):
            with pytest.raises(ValueError, match="probability zero"):
                algorithm(log_init, log_trans, log_dur, log_emit, lengths)
        return
    post = segment_posterior(log_init, log_trans, log_dur, log_emit, lengths)
    paths, best = segment_viterbi(log_init, log_trans, log_dur, log_emit, lengths)
    for b, (steps, truth) in enumerate(zip(lengths.tolist(), truths)):
        torch.testing.assert_close(post.log_likelihood[b], truth["log_likelihood"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(best[b], truth["best"], rtol=1e-12, atol=1e-12)
        for name in ("initial", "transitions", "durations", "censored"):
            torch.testing.assert_close(getattr(post, name)[b], truth[name], rtol=1e-10, atol=1e-12, msg=name)
        torch.testing.assert_close(post.posterior[b, :steps], truth["posterior"], rtol=1e-10, atol=1e-12)
        assert float(post.posterior[b, steps:].abs().sum()) == 0.0
        # the decoded path scores the best (on a tie, either best path); its runs are its segments where the
        # diagonal is zero (K >= 2), one state's path is all zeros
        if k == 1:
            assert paths[b, :steps].tolist() == [0] * steps
            continue
        assert _path_score(paths[b, :steps].tolist(), log_init, log_trans, log_dur, log_emit[b]) == pytest.approx(
            float(truth["best"]), abs=1e-10
        )


def _path_score(path: list[int], log_init, log_trans, log_dur, log_emit) -> float:
    """``log p(x, segmentation)`` of the segmentation whose segments are ``path``'s runs (none longer than D)."""
    runs = [(s, len(list(group))) for s, group in itertools.groupby(path)]
    log_surv = torch.logcumsumexp(log_dur.flip(1), 1).flip(1)
    score, t = float(log_init[runs[0][0]]), 0
    for i, (s, d) in enumerate(runs):
        if d > log_dur.shape[1]:
            return -math.inf
        score += float(log_trans[runs[i - 1][0], s]) if i else 0.0
        score += float(log_emit[t : t + d, s].sum() + (log_surv if i == len(runs) - 1 else log_dur)[s, d - 1])
        t += d
    return score


def expanded_hmm(log_init, log_trans, log_dur) -> tuple[torch.Tensor, torch.Tensor]:
    """The HMM over states ``(k, c)`` (``c`` steps left in the segment, index ``k D + c - 1``) of the same chain."""
    k, depth = log_dur.shape
    init = (log_init[:, None] + log_dur).reshape(-1)
    trans = torch.full((k * depth, k * depth), -math.inf, dtype=F64)
    for i in range(k):
        for c in range(2, depth + 1):
            trans[i * depth + c - 1, i * depth + c - 2] = 0.0
        trans[i * depth] = (log_trans[i][:, None] + log_dur).reshape(-1)
    return init, trans


@pytest.mark.parametrize("emission", ["gaussian", "poisson", "categorical"])
def test_fitted_log_likelihood_equals_brute_force_and_the_expanded_state_hmm(emission):
    """A fitted nonparametric-duration HSMM's ``score_samples`` and ``predict_proba`` on short sequences: equal to
    enumerating segmentations and to the forward-backward of the ``K D``-state HMM of the same chain."""
    seqs = make_family_sequences(emission, n_sequences=8, lengths=(20, 30))[0]
    model = HSMM(2, emission=emission, duration="nonparametric", max_duration=4, max_iter=5, **QUIET).fit(seqs)
    short = [s[:6] for s in seqs[:3]] + [seqs[3][:2]]
    batch = model.prepare_data(short)
    log_emit = model._log_emissions(model._prediction_data(batch))
    log_init, log_trans, log_dur = model._log_chain()
    scores, proba = model.score_samples(short), model.predict_proba(short)
    init, trans = expanded_hmm(log_init, log_trans, log_dur)
    expanded = forward_backward(init, trans, log_emit.repeat_interleave(4, -1), batch.lengths)
    for b, seq in enumerate(short):
        truth = brute_force(log_init, log_trans, log_dur, log_emit[b, : len(seq)])
        assert scores[b] == pytest.approx(float(truth["log_likelihood"]), rel=1e-12, abs=1e-10)
        np.testing.assert_allclose(proba[b], truth["posterior"].numpy(), rtol=1e-9, atol=1e-12)
        marginal = expanded.posterior[b, : len(seq)].reshape(len(seq), 2, 4).sum(-1)
        np.testing.assert_allclose(proba[b], marginal.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(scores, expanded.log_likelihood.numpy(), rtol=1e-12)


def test_drawn_segmentations_follow_the_smoothed_marginals():
    log_init, log_trans, log_dur = random_chain(3, 4, seed=3)
    log_emit = torch.randn(1, 6, 3, generator=torch.Generator().manual_seed(4), dtype=F64)
    post = segment_posterior(log_init, log_trans, log_dur, log_emit)
    many = log_emit.expand(4000, -1, -1)
    paths = sample_segmentations(log_init, log_trans, log_dur, many, generator=torch.Generator().manual_seed(0))
    frequencies = torch.nn.functional.one_hot(paths, 3).to(F64).mean(0)
    assert float((frequencies - post.posterior[0]).abs().max()) < 0.03  # 4 sd of a frequency of 4000 draws


def test_completed_counts_spread_a_censored_segment_over_its_possible_durations():
    table = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=F64)
    censored = torch.tensor([[0.0, 2.0, 0.0, 0.0]], dtype=F64)
    counts = completed_counts(torch.ones(1, 4, dtype=F64), censored, table.log())
    torch.testing.assert_close(
        counts, torch.tensor([[1.0, 1 + 2 * 0.2 / 0.9, 1 + 2 * 0.3 / 0.9, 1 + 2 * 0.4 / 0.9]], dtype=F64)
    )


# ------------------------------------------------------------------------------------ EM
def planted(duration: str, emission: str = "gaussian") -> HSMM:
    """A three-state chain (cyclic switches) with well-separated Gaussian emissions and mean durations 4, 8, 12."""
    x = np.random.default_rng(0).normal(size=(30, 1))
    model = HSMM(3, emission=emission, duration=duration, max_duration=25, max_iter=1, **QUIET).fit([x])
    table = torch.zeros(3, 25, dtype=F64)
    for k, mean in enumerate((4, 8, 12)):
        table[k, mean - 2 : mean + 1] = torch.tensor([0.25, 0.5, 0.25])
    durations = {
        "poisson": {"duration_rate": torch.tensor([3.0, 7.0, 11.0], dtype=F64)},
        "negative_binomial": {
            "duration_shape": torch.tensor([6.0, 14.0, 22.0], dtype=F64),
            "duration_prob": torch.tensor([1 / 3, 1 / 3, 1 / 3], dtype=F64),
        },
        "nonparametric": {"duration": table},
    }[duration]
    switch = torch.tensor([[0.0, 0.8, 0.2], [0.2, 0.0, 0.8], [0.8, 0.2, 0.0]], dtype=F64)
    model._set_globals(
        {
            "initial": torch.full((3,), 1 / 3, dtype=F64),
            "transition": switch,
            **durations,
            "locs": torch.tensor([[-4.0], [0.0], [4.0]], dtype=F64),
            "scales": torch.ones(3, 1, dtype=F64),
        }
    )
    return model


@pytest.mark.parametrize("duration", ["poisson", "negative_binomial", "nonparametric"])
def test_em_objective_never_decreases(duration):
    x = list(planted(duration).sample(20, 60)["x"])
    model = HSMM(3, duration=duration, max_duration=25, max_iter=15, tol=0.0, init_params="random", **QUIET).fit(x)
    history = np.array(model.history_)
    assert len(history) >= 10
    assert (np.diff(history) >= -1e-9 * np.abs(history[1:])).all(), np.diff(history).min()


@pytest.mark.parametrize("duration", ["poisson", "negative_binomial", "nonparametric"])
def test_sample_then_fit_recovers_the_planted_parameters(duration):
    truth = planted(duration)
    drawn = truth.sample(60, 120)
    model = HSMM(3, duration=duration, max_duration=25, **QUIET).fit(list(drawn["x"]))
    order = torch.argsort(model.components_.mean[:, 0])
    np.testing.assert_allclose(model.components_.mean[order, 0].numpy(), [-4.0, 0.0, 4.0], atol=0.1)
    np.testing.assert_allclose(model.mean_durations_[order].numpy(), truth.mean_durations_.numpy(), rtol=0.1)
    np.testing.assert_allclose(model.transition_[order][:, order].numpy(), truth.transition_.numpy(), atol=0.08)
    paths = model.predict(list(drawn["x"]))
    relabelled = np.argsort(order.numpy())
    accuracy = np.mean([(relabelled[p] == z).mean() for p, z in zip(paths, drawn["z"])])
    assert accuracy > 0.98


def test_save_load_keeps_the_durations(tmp_path):
    model = planted("negative_binomial")
    x = list(model.sample(5, 40)["x"])
    loaded = HSMM.load(model.save(tmp_path / "hsmm"))
    for name, value in model.duration_params_.items():
        torch.testing.assert_close(loaded.duration_params_[name], value, rtol=0, atol=0)
    np.testing.assert_array_equal(loaded.score_samples(x), model.score_samples(x))
    assert loaded.decode(x)[1][0].tolist() == model.decode(x)[1][0].tolist()


def test_bic_counts_the_chain_durations_and_emissions():
    model = planted("poisson")
    # 2 initial + 3 (K - 2) switches + 3 rates + 3 means + 3 variances
    assert model.n_parameters == 2 + 3 + 3 + 6
    x = list(model.sample(4, 30)["x"])
    assert model.bic(x) == pytest.approx(-2 * sum(model.score_samples(x)) + 14 * math.log(120), rel=1e-12)


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "settings, data, error, match",
    [
        ({"max_duration": 0}, None, ValueError, "max_duration"),
        ({"max_duration": 2.5}, None, (ValueError, TypeError), "max_duration"),
        ({"duration": "gamma"}, None, ValueError, "duration must be one of"),
        ({"n_components": 50}, [np.zeros((5, 1)), np.ones((4, 1))], ValueError, "n_components"),
        ({}, [np.zeros(5)], ValueError, r"\bX\b"),
        ({}, [np.array([[0.0], [np.nan]])], ValueError, r"\bX\b"),
    ],
)
def test_bad_settings_and_data_are_errors_naming_them(settings, data, error, match):
    data = [np.random.default_rng(0).normal(size=(10, 1))] if data is None else data
    with pytest.raises(error, match=match):
        HSMM(**{"n_components": 2, **settings}, **QUIET).fit(data)


def test_engines_other_than_em_are_refused():
    with pytest.raises(ValueError, match="EM only"):
        HSMM(2, **QUIET).fit([np.zeros((5, 1))], engine="svi")


def test_one_array_is_one_sequence():
    x = planted("poisson").sample(1, 40)["x"][0]
    model = HSMM(3, max_duration=25, max_iter=5, **QUIET).fit(x)
    assert model.score_samples(x).tolist() == model.score_samples([x]).tolist()
    assert [p.tolist() for p in model.predict(x)] == [p.tolist() for p in model.predict([x])]


def test_map_decoding_and_path_draws_follow_the_smoothed_marginals():
    model = planted("negative_binomial")
    x = list(model.sample(3, 30)["x"])
    proba = model.predict_proba(x)
    scores, paths = model.decode(x, algorithm="map")
    for p, path, score in zip(proba, paths, scores):
        assert path.tolist() == p.argmax(1).tolist()
        assert score == pytest.approx(np.log(p.max(1)).sum(), rel=1e-12)
    drawn = model.sample_paths(x[:1], n=3000)[0]
    frequencies = np.stack([(drawn == k).mean(0) for k in range(3)], 1)
    assert np.abs(frequencies - proba[0]).max() < 0.04  # 4.4 sd of a frequency of 3000 draws
    with pytest.raises(ValueError, match="algorithm must be one of"):
        model.decode(x, algorithm="posterior")
