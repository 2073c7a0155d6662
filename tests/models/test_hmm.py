"""HMM: Baum–Welch on the batched forward–backward against Pyro, planted parameters and the GMM."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from pyro.infer import TraceEnum_ELBO

from ppmix import GMM
from ppmix.engines.params import local_params
from ppmix.inference import ConvergenceWarning
from ppmix.models.hmm import HMM
from tests.common import assert_close

INITIAL = np.array([0.6, 0.3, 0.1])
TRANSITION = np.array([[0.90, 0.05, 0.05], [0.10, 0.80, 0.10], [0.05, 0.15, 0.80]])
MEANS = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, -1.0]])
SCALES = np.array([[1.0, 0.6], [0.7, 0.9], [0.8, 0.5]])


def planted(n_sequences=40, lengths=(10, 50), seed=0):
    rng = np.random.default_rng(seed)
    seqs, states = [], []
    for _ in range(n_sequences):
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        z = [rng.choice(3, p=INITIAL)]
        for _ in range(n - 1):
            z.append(rng.choice(3, p=TRANSITION[z[-1]]))
        z = np.array(z)
        seqs.append(MEANS[z] + SCALES[z] * rng.normal(size=(n, 2)))
        states.append(z)
    return seqs, states


def random_globals(hmm, seed=1):
    g = torch.Generator().manual_seed(seed)
    values = hmm._get_globals()
    k = hmm.n_components
    values["initial"] = torch.softmax(torch.randn(k, generator=g, dtype=torch.float64), 0)
    values["transition"] = torch.softmax(torch.randn(k, k, generator=g, dtype=torch.float64), 1)
    values["locs"] = values["locs"] + torch.randn(values["locs"].shape, generator=g, dtype=torch.float64)
    return values


@pytest.mark.parametrize("cov", ["diag", "full"])
def test_em_objective_equals_pyro_trace_enum_elbo_with_unequal_lengths(cov):
    seqs, _ = planted(6, lengths=(2, 6), seed=1)
    hmm = HMM(3, covariance_type=cov, seed=0, max_iter=3, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        hmm.fit(seqs)
    for values in (hmm._get_globals(), random_globals(hmm)):
        hmm._set_globals(values)
        batch = hmm.prepare_data(seqs)
        _, em_objective = hmm._e_step(hmm._em_data(batch))
        with local_params():
            pyro_elbo = -TraceEnum_ELBO(max_plate_nesting=1).loss(hmm.model, hmm.guide, batch)
        assert_close(em_objective, pyro_elbo, rtol=1e-10)


def test_em_never_decreases_log_likelihood():
    seqs, _ = planted(20, seed=2)
    hmm = HMM(3, init_params="random", warm_start=True, max_iter=1, seed=0, progress=False)
    values = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(20):
            values.append(hmm.fit(seqs).score(seqs))
    assert np.all(np.diff(values) >= -1e-10) and values[-1] > values[0]


def test_em_recovers_planted_parameters():
    seqs, states = planted(150, seed=3)
    hmm = HMM(3, n_init=2, seed=0, progress=False).fit(seqs)
    est = hmm.means_.numpy()
    perm = list(min(itertools.permutations(range(3)), key=lambda p: np.abs(est[list(p)] - MEANS).sum()))
    assert_close(est[perm], MEANS, atol=0.1, rtol=0)
    assert_close(hmm.transition_.numpy()[np.ix_(perm, perm)], TRANSITION, atol=0.03, rtol=0)
    assert_close(np.sqrt(hmm.covariances_.numpy()[perm]), SCALES, atol=0.06, rtol=0)
    decoded = np.concatenate(hmm.predict(seqs))  # estimated state perm[k] plays the planted state k
    assert (decoded == np.array(perm)[np.concatenate(states)]).mean() > 0.97


def test_uniform_transitions_reduce_to_the_mixture():
    seqs, _ = planted(10, seed=4)
    hmm = HMM(3, seed=0, progress=False).fit(seqs)
    values = hmm._get_globals()
    values["transition"] = values["initial"].expand(3, 3).clone()
    hmm._set_globals(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmm = GMM(3, progress=False).fit(np.concatenate(seqs), max_iter=1)
    gmm._set_globals({"weights": values["initial"], "locs": values["locs"], "scales": values["scales"]})
    frames = np.concatenate(seqs)
    assert_close(np.concatenate(hmm.predict_proba(seqs)), gmm.predict_proba(frames), atol=1e-10, rtol=0)
    assert hmm.log_likelihood(seqs) == pytest.approx(gmm.log_likelihood(frames), rel=1e-12)


def test_layouts_give_the_same_fit():
    seqs, _ = planted(8, seed=5)
    lengths = [len(s) for s in seqs]
    padded = np.zeros((8, max(lengths), 2))
    for b, s in enumerate(seqs):
        padded[b, : len(s)] = s
    a = HMM(3, seed=0, progress=False).fit(seqs)
    b = HMM(3, seed=0, progress=False).fit((torch.as_tensor(padded), torch.as_tensor(lengths)))
    assert a.history_ == pytest.approx(b.history_, rel=1e-12)
    assert isinstance(b.predict_proba((torch.as_tensor(padded), torch.as_tensor(lengths)))[0], torch.Tensor)


def test_svi_reaches_em_log_likelihood():
    seqs, _ = planted(12, lengths=(5, 12), seed=6)
    em = HMM(3, seed=0, progress=False).fit(seqs)
    svi = HMM(3, seed=0, progress=False).fit(seqs, engine="svi", num_steps=300, lr=0.05)
    assert abs(svi.score(seqs) - em.score(seqs)) <= 0.01 * abs(em.score(seqs))


def test_save_load_round_trip_and_arviz(tmp_path):
    seqs, _ = planted(10, seed=7)
    hmm = HMM(3, covariance_type="full", seed=0, progress=False).fit(seqs)
    loaded = HMM.load(hmm.save(tmp_path / "hmm"))
    assert_close(np.concatenate(loaded.predict_proba(seqs)), np.concatenate(hmm.predict_proba(seqs)), rtol=0, atol=0)
    idata = hmm.to_arviz(approximation=None)
    assert idata.log_likelihood["x"].shape == (1, 1, 10)
    assert idata.posterior["transition"].shape == (1, 1, 3, 3)


def test_sample_follows_the_chain():
    seqs, _ = planted(100, seed=8)
    hmm = HMM(3, seed=0, progress=False).fit(seqs)
    draws = hmm.sample(400, length=30)
    assert draws["x"].shape == (400, 30, 2) and draws["z"].shape == (400, 30)
    z = draws["z"]
    counts = np.zeros((3, 3))
    np.add.at(counts, (z[:, :-1].ravel(), z[:, 1:].ravel()), 1)
    assert_close(counts / counts.sum(1, keepdims=True), hmm.transition_.numpy(), atol=0.03, rtol=0)


@pytest.mark.parametrize(
    "X, match",
    [
        ([], "empty list"),
        ([np.zeros((3, 2)), np.zeros((0, 2))], "length 0"),
        ([np.zeros((3, 2)), np.zeros((3, 1))], "features"),
        ([np.full((3, 2), np.nan)], "NaN"),
        ([np.zeros((1, 2))], "n_components=3 is larger than the number of samples"),
    ],
    ids=["empty", "zero-length", "features", "nan", "k>frames"],
)
def test_bad_input(X, match):
    with pytest.raises(ValueError, match=match):
        HMM(3, progress=False).fit(X)


def test_labels_are_ignored_and_prediction_checks_features():
    seqs, _ = planted(5, seed=9)
    hmm = HMM(3, seed=0, progress=False).fit(seqs)
    labelled = HMM(3, seed=0, progress=False).fit(seqs, [np.zeros(len(s)) for s in seqs])
    assert labelled.lower_bound_ == hmm.lower_bound_
    with pytest.raises(ValueError, match="fitted with 2"):
        hmm.predict([np.zeros((4, 3))])


def test_agrees_with_hmmlearn_on_the_same_parameters():
    """Log-likelihood, smoothed posteriors and Viterbi paths against hmmlearn's ``GaussianHMM`` (diag)."""
    from hmmlearn.hmm import GaussianHMM

    seqs, _ = planted(12, lengths=(1, 30), seed=10)
    seqs.append(seqs[0][:1])  # unequal lengths, one of them 1
    lengths = [len(s) for s in seqs]
    assert len(set(lengths)) > 5
    hmm = HMM(3, seed=0, max_iter=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        hmm.fit(seqs)
    values = random_globals(hmm, seed=11)
    values["scales"] = values["scales"] * torch.linspace(0.5, 1.5, values["scales"].numel()).reshape(3, 2)
    hmm._set_globals(values)

    ref = GaussianHMM(3, covariance_type="diag", init_params="", params="")
    ref.n_features = 2
    ref.startprob_ = hmm.initial_.numpy()
    ref.transmat_ = hmm.transition_.numpy()
    ref.means_ = values["locs"].numpy()
    ref.covars_ = values["scales"].numpy() ** 2  # hmmlearn's diagonal covars_ are variances
    frames = np.concatenate(seqs)

    per_sequence = hmm._pointwise_log_likelihood(hmm.prepare_data(seqs)).numpy()
    assert_close(per_sequence, [ref.score(s) for s in seqs], rtol=1e-10, atol=0)
    assert hmm.log_likelihood(seqs) == pytest.approx(ref.score(frames, lengths), rel=1e-12)
    assert hmm.score(seqs) == pytest.approx(ref.score(frames, lengths) / len(frames), rel=1e-12)
    # the same criteria: parameters counted alike, N the number of time steps
    assert hmm.bic(seqs) == pytest.approx(ref.bic(frames, lengths), rel=1e-12)
    assert hmm.aic(seqs) == pytest.approx(ref.aic(frames, lengths), rel=1e-12)
    assert_close(np.concatenate(hmm.predict_proba(seqs)), ref.predict_proba(frames, lengths), rtol=0, atol=1e-9)

    best, paths = hmm.decode(seqs)
    ref_decoded = [ref.decode(s, algorithm="viterbi") for s in seqs]
    assert_close(best, [lp for lp, _ in ref_decoded], rtol=1e-10, atol=0)
    for ours, (_, theirs) in zip(paths, ref_decoded):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.concatenate(paths), ref.decode(frames, lengths)[1])

    map_scores, map_paths = hmm.decode(seqs, algorithm="map")  # each step's most probable state
    for ours, score, seq in zip(map_paths, map_scores, seqs):
        np.testing.assert_array_equal(ours, ref.decode(seq, algorithm="map")[1])
        assert score == pytest.approx(np.log(ref.predict_proba(seq).max(axis=1)).sum(), rel=1e-9)


@pytest.mark.parametrize("cov", ["diag", "full", "spherical", "tied"])
def test_every_baum_welch_iteration_equals_hmmlearns_from_the_same_start(cov):
    """hmmlearn's ``GaussianHMM`` with its covariance prior switched off (``covars_prior=0``, ``covars_weight=1``:
    the maximum-likelihood M-step) and ppmix without a floor take the same steps: every parameter after 1 and 3
    iterations to 1e-8, for each covariance type."""
    from hmmlearn.hmm import GaussianHMM

    seqs, _ = planted(15, lengths=(10, 40), seed=4)
    start = HMM(3, covariance_type=cov, reg_covar=0.0, max_iter=1, seed=2, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start.fit(seqs)
    covariance = start.covariances_.numpy()
    start_covars = {"spherical": covariance[:, 0], "tied": covariance[0]}.get(cov, covariance)
    frames, lengths = np.concatenate(seqs), [len(s) for s in seqs]
    for steps in (1, 3):
        ours = HMM(3, covariance_type=cov, reg_covar=0.0, warm_start=True, tol=0.0, max_iter=steps, progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours.fit(seqs, max_iter=1)
            ours._set_globals(start._get_globals())
            ours.fit(seqs)
            peer = GaussianHMM(
                3, covariance_type=cov, covars_prior=0.0, covars_weight=1.0, init_params="", n_iter=steps, tol=-np.inf
            )
            peer.startprob_, peer.transmat_ = start.initial_.numpy(), start.transition_.numpy()
            peer.means_, peer.covars_ = start.means_.numpy(), start_covars
            peer.fit(frames, lengths)
        assert_close(ours.means_, peer.means_, rtol=1e-8, atol=1e-12)
        # hmmlearn's covars_ are (K, D, D) matrices for every type; its stored _covars_ hold the diagonal types'
        # variances as ppmix does, (K, D) (spherical: each row constant; its covars_ getter misreads that layout)
        peer_covars = peer._covars_ if cov in ("diag", "spherical") else peer.covars_
        assert_close(ours.covariances_, peer_covars, rtol=1e-8, atol=1e-12)
        assert_close(ours.transition_, peer.transmat_, rtol=1e-8, atol=1e-9)  # ppmix pads counts by 1e-10
        assert ours.log_likelihood(seqs) == pytest.approx(peer.score(frames, lengths), rel=1e-10)
