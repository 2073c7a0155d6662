"""Input-driven HMMs (issue 51, item 2): transitions from a softmax gate on each step's inputs. Known answers: with
inputs constant over the steps the fit is the plain HMM's from the same start; on short sequences the
log-likelihood, the Viterbi path and the filter equal brute-force enumeration of the state paths; planted gates are
recovered."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import norm

from ppmix import HMM
from tests.common import assert_close


def _planted(n_sequences: int, length: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two states, one input: a high input moves the chain to state 1, which is sticky (logits 3 u +- 1)."""
    rng = np.random.default_rng(seed)
    seqs, inputs = [], []
    for _ in range(n_sequences):
        u = rng.normal(size=(length, 1))
        z = [0]
        for t in range(1, length):
            logit = 3.0 * u[t, 0] + (1.0 if z[-1] == 1 else -1.0)
            z.append(int(rng.random() < 1.0 / (1.0 + np.exp(-logit))))
        seqs.append(3.0 * np.array(z)[:, None] + 0.7 * rng.normal(size=(length, 1)))
        inputs.append(u)
    return seqs, inputs


@pytest.fixture(scope="module")
def planted():
    seqs, inputs = _planted(40, 50)
    return seqs, inputs, HMM(2, transitions="input-driven", seed=0, progress=False).fit(seqs, inputs=inputs)


@pytest.mark.parametrize("level", [0.0, 2.5])
def test_constant_inputs_fit_the_plain_hmm_from_the_same_start(planted, level):
    seqs = planted[0]
    plain = HMM(2, seed=0, progress=False).fit(seqs)
    constant = [np.full((len(s), 2), level) for s in seqs]
    driven = HMM(2, transitions="input-driven", seed=0, progress=False).fit(seqs, inputs=constant)
    assert len(driven.history_) == len(plain.history_)
    assert_close(driven.history_, plain.history_, rtol=1e-10, atol=0)
    at_level = torch.softmax(
        torch.einsum("ijp,p->ij", driven.transition_coef_, torch.full((2,), level, dtype=torch.float64))
        + driven.transition_intercept_,
        dim=-1,
    )
    assert_close(at_level, plain.transition_, rtol=0, atol=1e-8)


def _enumerated(hmm: HMM, seq: np.ndarray, u: np.ndarray) -> dict[tuple[int, ...], float]:
    """``log p(z, x)`` of every path of a short sequence under the fitted gates (scipy's normal densities)."""
    means, scales = hmm.components_.loc.numpy()[:, 0], hmm.components_.scale.numpy()[:, 0]
    coef, intercept = hmm.transition_coef_.numpy(), hmm.transition_intercept_.numpy()
    init = np.log(hmm.initial_.numpy())
    out = {}
    for path in itertools.product(range(2), repeat=len(seq)):
        lp = init[path[0]] + norm.logpdf(seq[0, 0], means[path[0]], scales[path[0]])
        for t in range(1, len(seq)):
            logits = coef[path[t - 1]] @ u[t] + intercept[path[t - 1]]
            lp += logits[path[t]] - np.logaddexp.reduce(logits)
            lp += norm.logpdf(seq[t, 0], means[path[t]], scales[path[t]])
        out[path] = lp
    return out


def test_likelihood_paths_and_filter_equal_brute_force_enumeration(planted):
    _, _, hmm = planted
    seqs, inputs = _planted(3, 6, seed=1)
    scores = hmm.score_samples(seqs, inputs=inputs)
    _, paths = hmm.decode(seqs, inputs=inputs)
    filtered = hmm.filter(seqs, inputs=inputs)
    smoothed = hmm.predict_proba(seqs, inputs=inputs)
    for b, (seq, u) in enumerate(zip(seqs, inputs)):
        joint = _enumerated(hmm, seq, u)
        total = np.logaddexp.reduce(list(joint.values()))
        assert scores[b] == pytest.approx(total, rel=1e-10)
        assert tuple(paths[b]) == max(joint, key=joint.get)
        marginal = np.zeros((6, 2))
        for path, lp in joint.items():
            marginal[np.arange(6), path] += np.exp(lp - total)
        assert_close(smoothed[b], marginal, rtol=0, atol=1e-10)
        assert_close(filtered[b][-1], marginal[-1], rtol=0, atol=1e-10)


def test_planted_gates_are_recovered_and_em_is_monotone(planted):
    seqs, inputs, hmm = planted
    assert (np.diff(hmm.history_) > -1e-10).all()
    # the logit of "to state 0" against "to state 1" (the reference) is -(3 u +- 1): slope -3, intercept -+1
    slopes, intercepts = hmm.transition_coef_[:, 0, 0], hmm.transition_intercept_[:, 0]
    assert_close(slopes, torch.tensor([-3.0, -3.0], dtype=torch.float64), rtol=0, atol=0.5)
    assert_close(intercepts, torch.tensor([1.0, -1.0], dtype=torch.float64), rtol=0, atol=0.5)
    plain = HMM(2, seed=0, progress=False).fit(seqs)
    assert hmm.score(seqs, inputs=inputs) > plain.score(seqs) + 0.1  # the inputs explain the moves
    assert hmm.n_parameters == plain.n_parameters + 2  # one slope per source state


def test_sample_weights_count_sequences(planted):
    """A weight of 2 is the sequence twice: the same fitted chain (up to the states' order, which the k-means start
    of the repeated frames may swap) and the same log-likelihood."""
    seqs, inputs, _ = planted
    twice = HMM(2, transitions="input-driven", seed=0, progress=False, tol=1e-10, max_iter=500)
    twice.fit(seqs[:10] + seqs[:2], inputs=inputs[:10] + inputs[:2])
    weighted = HMM(2, transitions="input-driven", seed=0, progress=False, tol=1e-10, max_iter=500)
    weighted.fit(seqs[:10], inputs=inputs[:10], sample_weight=[2, 2] + [1] * 8)
    assert weighted.lower_bound_ == pytest.approx(twice.lower_bound_, rel=1e-8)
    u = torch.linspace(-2, 2, 5, dtype=torch.float64)[None, :, None]
    order = [torch.argsort(m.components_.loc[:, 0]) for m in (weighted, twice)]
    moves = [m._input_chain().log_transitions(u).exp()[0][:, o][:, :, o] for m, o in zip((weighted, twice), order)]
    assert_close(moves[0], moves[1], rtol=0, atol=1e-5)


def test_save_and_load_keep_the_gates(planted, tmp_path):
    seqs, inputs, hmm = planted
    loaded = HMM.load(hmm.save(tmp_path / "driven"))
    assert loaded.transitions == "input-driven" and loaded.n_inputs_ == 1
    assert_close(loaded.score_samples(seqs[:3], inputs=inputs[:3]), hmm.score_samples(seqs[:3], inputs=inputs[:3]))


def test_inputs_are_checked_and_other_engines_refused(planted):
    seqs, inputs, hmm = planted
    with pytest.raises(ValueError, match="needs inputs="):
        hmm.predict(seqs[:1])
    with pytest.raises(ValueError, match=r"inputs\[0\] has 49 steps but sequence 0 has 50"):
        hmm.predict(seqs[:1], inputs=[inputs[0][:-1]])
    with pytest.raises(ValueError, match=r"inputs\[0\] has 2 inputs per step, expected 1"):
        hmm.predict(seqs[:1], inputs=[np.c_[inputs[0], inputs[0]]])
    with pytest.raises(ValueError, match="inputs= is for an input-driven chain"):
        HMM(2, seed=0, progress=False).fit(seqs, inputs=inputs)
    with pytest.raises(ValueError, match="EM only"):
        HMM(2, transitions="input-driven", progress=False).fit(seqs, inputs=inputs, engine="svi")
    with pytest.raises(ValueError, match="takes no transition_pattern"):
        HMM(2, transitions="input-driven", transition_pattern="left-right").fit(seqs, inputs=inputs)
    with pytest.raises(ValueError, match="transitions must be one of"):
        HMM(2, transitions="gated").fit(seqs)
    assert not hasattr(hmm, "partial_fit")
    with pytest.raises(ValueError, match="sample_paths"):
        hmm.sample(2)
    nan_inputs = [inputs[0].copy()]
    nan_inputs[0][3] = np.nan
    with pytest.raises(ValueError, match=r"inputs\[0\]"):
        hmm.predict(seqs[:1], inputs=nan_inputs)
