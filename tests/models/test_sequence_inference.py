"""What an HMM infers about the states of given sequences (issue 51, item 6): filtering equal to dynamax's
``hmm_filter``, posterior path draws whose frequencies are the smoothed marginals, and time steps with every value
missing kept and scored as density 1 (brute-force enumeration of the state paths)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from ppmix import GMM, HMM
from ppmix._validation import InvalidDataError
from ppmix.inference import ConvergenceWarning
from tests.common import assert_close


def _two_regimes(n_sequences: int = 4, length: int = 30, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        np.r_[rng.normal(0.0, 1.0, (length // 2, 2)), rng.normal(2.5, 1.0, (length - length // 2, 2))]
        for _ in range(n_sequences)
    ]


@pytest.fixture(scope="module")
def fitted() -> HMM:
    return HMM(2, covariance_type="diag", seed=0, progress=False).fit(_two_regimes())


def _log_emissions(hmm: HMM, seq: np.ndarray) -> np.ndarray:
    """``(T, K)`` log-densities of a diagonal Gaussian HMM, by scipy, a step with every value missing 0."""
    means, scales = hmm.components_.loc.numpy(), hmm.components_.scale.numpy()
    dens = norm.logpdf(seq[:, None, :], means[None], scales[None])  # (T, K, D)
    return np.where(np.isnan(seq)[:, None, :], 0.0, dens).sum(-1)


def test_filter_equals_dynamax_hmm_filter(fitted):
    jax = pytest.importorskip("jax")
    inference = pytest.importorskip("dynamax.hidden_markov_model.inference")
    jax.config.update("jax_enable_x64", True)
    seqs = _two_regimes(3, length=25, seed=1)
    ours = fitted.filter(seqs)
    for seq, filtered in zip(seqs, ours):
        theirs = inference.hmm_filter(
            jax.numpy.asarray(fitted.initial_.numpy()),
            jax.numpy.asarray(fitted.transition_.numpy()),
            jax.numpy.asarray(_log_emissions(fitted, seq)),
        ).filtered_probs
        assert filtered.shape == (25, 2)
        assert_close(filtered, np.asarray(theirs), rtol=0, atol=1e-10)
    # the last step's filtered marginal is its smoothed one (the whole sequence is in its past)
    assert_close(ours[0][-1], fitted.predict_proba(seqs)[0][-1], rtol=0, atol=1e-10)


def test_path_frequencies_are_the_smoothed_marginals(fitted):
    seqs = _two_regimes(2, length=20, seed=2)
    paths = fitted.sample_paths(seqs, 4000)
    marginals = fitted.predict_proba(seqs)
    for drawn, probs in zip(paths, marginals):
        assert drawn.shape == (4000, 20) and set(np.unique(drawn)) <= {0, 1}
        assert np.abs(drawn.mean(axis=0) - probs[:, 1]).max() < 0.035  # 4.4 standard errors at p = 1/2
    np.testing.assert_array_equal(fitted.sample_paths(seqs, 3)[0], fitted.sample_paths(seqs, 3)[0])  # the seed's


def test_sample_paths_never_take_a_forbidden_transition():
    """Left-to-right chain: a drawn path never goes back."""
    seqs = [
        np.r_[np.zeros((8, 1)), np.full((8, 1), 3.0), np.full((8, 1), 6.0)]
        + 0.3 * np.random.default_rng(3).normal(size=(24, 1))
    ]
    pattern = [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        hmm = HMM(3, seed=0, progress=False, transition_pattern=pattern).fit(seqs)
    (paths,) = hmm.sample_paths(seqs, 200)
    assert (np.diff(paths, axis=1) >= 0).all()


def _path_joints(hmm: HMM, seq: np.ndarray) -> dict[tuple[int, ...], float]:
    """``p(z, x)`` of every state path of a short sequence, by enumeration."""
    log_emit = _log_emissions(hmm, seq)
    init, trans = hmm.initial_.numpy(), hmm.transition_.numpy()
    joints = {}
    for path in itertools.product(range(hmm.n_components), repeat=len(seq)):
        p = init[path[0]] * np.prod([trans[i, j] for i, j in zip(path, path[1:])])
        joints[path] = p * np.exp(sum(log_emit[t, k] for t, k in enumerate(path)))
    return joints


def _brute_force_log_likelihood(hmm: HMM, seq: np.ndarray) -> float:
    return float(np.log(sum(_path_joints(hmm, seq).values())))


def test_drawn_paths_follow_the_exact_path_posterior(fitted):
    """Whole paths, not only their marginals: the empirical distribution of 4000 drawn paths of a 5-step sequence
    against ``p(z | x)`` of all 32 paths by enumeration (total variation; its Monte Carlo noise is about 0.03)."""
    seq = np.array([[0.0, 0.2], [1.3, 1.1], [1.2, 1.4], [2.6, 2.4], [0.4, 0.1]])
    joints = _path_joints(fitted, seq)
    total = sum(joints.values())
    (paths,) = fitted.sample_paths([seq], 4000)
    counts: dict[tuple[int, ...], int] = {}
    for path in map(tuple, paths.tolist()):
        counts[path] = counts.get(path, 0) + 1
    variation = 0.5 * sum(abs(counts.get(path, 0) / 4000 - joint / total) for path, joint in joints.items())
    assert variation < 0.06


@settings(max_examples=8, deadline=None)
@given(missing=st.lists(st.booleans(), min_size=5, max_size=5), partly=st.integers(0, 4))
def test_a_step_with_every_value_missing_is_scored_as_density_one(fitted, missing, partly):
    seq = np.random.default_rng(4).normal(1.0, 1.5, (5, 2))
    seq[np.array(missing)] = np.nan
    seq[partly, 0] = np.nan  # and one step only partly observed
    hmm = HMM(2, covariance_type="diag", seed=0, progress=False, missing="marginalize")
    hmm.fit(_two_regimes())
    (ours,) = hmm.score_samples([seq])
    assert ours == pytest.approx(_brute_force_log_likelihood(hmm, seq), rel=1e-10)
    _, (path,) = hmm.decode([seq])
    assert path.shape == (5,)


def test_a_fit_takes_steps_with_every_value_missing():
    seqs = _two_regimes(6, length=20, seed=5)
    seqs[0][3] = np.nan
    seqs[1][0] = np.nan
    seqs[2][-1] = np.nan
    hmm = HMM(2, covariance_type="full", seed=0, progress=False, missing="marginalize").fit(seqs)
    assert np.isfinite(hmm.history_).all() and (np.diff(hmm.history_) > -1e-9).all()  # EM's monotone objective
    filtered = hmm.filter(seqs)[0]
    transition = hmm.transition_.numpy()
    assert_close(filtered[3], filtered[2] @ transition, rtol=0, atol=1e-10)  # no evidence: the chain's prediction


def test_a_mixture_row_with_every_value_missing_is_still_refused():
    x = np.random.default_rng(6).normal(size=(30, 2))
    x[4] = np.nan
    with pytest.raises(InvalidDataError, match="X row 4 has every entry missing"):
        GMM(2, seed=0, progress=False, missing="marginalize").fit(x)


def test_bad_arguments_are_named(fitted):
    seqs = _two_regimes(1)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        fitted.decode(seqs, algorithm="posterior")
    with pytest.raises(ValueError, match="n must be"):
        fitted.sample_paths(seqs, 0)
    torch_seq = [torch.as_tensor(seqs[0])]
    assert isinstance(fitted.filter(torch_seq)[0], torch.Tensor)  # tensors in, tensors out
