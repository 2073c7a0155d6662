"""Partly labelled fits (``known_labels``, ``known_states``): the supervised closed form when every latent is
known, the unsupervised fit when none is, brute-force enumeration of the unknown latents, EM's ascent, the
Pyro program's ``TraceEnum_ELBO`` and the refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from pyro.infer import TraceEnum_ELBO
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ppmix import GMM, HMM, Mixture
from ppmix.components.registry import family_from
from ppmix.engines.params import local_params
from ppmix.models import PFHMM
from ppmix.models.known_latents import Clamp, KnownLabels, KnownStates, clamping

COVARIANCE_TYPES = ("diag", "full", "spherical", "tied")
MEANS = np.array([[-3.0, 0.0], [3.0, 1.0], [0.0, 4.0]])


def labelled_rows(n=90, seed=0):
    """Three Gaussian classes in 2-D (their labels returned too), the classes of unequal sizes."""
    rng = np.random.default_rng(seed)
    z = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    scales = np.array([[1.0, 0.5], [0.7, 1.2], [0.6, 0.6]])
    return MEANS[z] + scales[z] * rng.normal(size=(n, 2)) @ np.array([[1.0, 0.4], [0.0, 1.0]]), z


def corners(n=400, seed=0):
    """Four clusters in the corners of a wide rectangle, and whether each row is in the top half: EM with two
    components splits them left and right, the labels ask for bottom and top."""
    rng = np.random.default_rng(seed)
    centres = np.array([[-4.0, -2.5], [4.0, -2.5], [-4.0, 2.5], [4.0, 2.5]])
    X = np.repeat(centres, n // 4, axis=0) + rng.normal(size=(n, 2))
    return X, (X[:, 1] > 0).astype(np.int64)


def labelled_sequences(n_sequences=12, seed=0):
    """Sequences of a sticky 2-state chain with 2-D Gaussian emissions (means in the corners' layout: the state
    moves the top/bottom coordinate, the left/right one is drawn anew every step) and their state paths."""
    rng = np.random.default_rng(seed)
    seqs, paths = [], []
    for _ in range(n_sequences):
        n = int(rng.integers(15, 30))
        path = [int(rng.integers(2))]
        for _ in range(n - 1):
            path.append(path[-1] if rng.random() < 0.85 else 1 - path[-1])
        path = np.array(path)
        side = rng.choice([-4.0, 4.0], size=n)
        seqs.append(np.c_[side, 5.0 * path - 2.5] + rng.normal(size=(n, 2)))
        paths.append(path)
    return seqs, paths


def assert_same_fit(a, b):
    """Every saved tensor and the history of two fits equal, bit for bit."""
    sa, sb = a._state_tensors(), b._state_tensors()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert a.history_ == b.history_


def supervised_gaussian(X, z, k, covariance_type):
    """The closed form of a labelled Gaussian mixture: class frequencies, means and (biased) covariances."""
    weights = np.bincount(z, minlength=k) / len(z)
    means = np.stack([X[z == c].mean(0) for c in range(k)])
    scatter = np.stack([(X[z == c] - means[c]).T @ (X[z == c] - means[c]) for c in range(k)])
    counts = np.bincount(z, minlength=k)
    if covariance_type == "full":
        covariances = scatter / counts[:, None, None]
    elif covariance_type == "tied":
        covariances = np.broadcast_to(scatter.sum(0) / len(z), scatter.shape)
    elif covariance_type == "diag":
        covariances = np.diagonal(scatter, axis1=1, axis2=2) / counts[:, None]
    else:  # spherical: one variance per class, the mean of its features'
        per_class = np.trace(scatter, axis1=1, axis2=2) / (counts * X.shape[1])
        covariances = np.repeat(per_class[:, None], X.shape[1], axis=1)
    return weights, means, covariances


# ------------------------------------------------------------------------------------------- known answers
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_every_label_known_gives_the_supervised_closed_form(covariance_type):
    X, z = labelled_rows()
    gmm = GMM(3, covariance_type=covariance_type, tol=0.0, max_iter=3, seed=0, progress=False)
    gmm.fit(X, known_labels=z)
    weights, means, covariances = supervised_gaussian(X, z, 3, covariance_type)
    np.testing.assert_allclose(gmm.weights_.numpy(), weights, rtol=0, atol=1e-10)
    np.testing.assert_allclose(gmm.means_.numpy(), means, rtol=0, atol=1e-10)
    np.testing.assert_allclose(gmm.covariances_.numpy(), covariances, rtol=0, atol=1e-10)
    # the labelled start is the closed form already: EM does not move
    assert max(gmm.history_) - min(gmm.history_) < 1e-12


def test_every_label_known_gives_the_supervised_poisson_rates():
    rng = np.random.default_rng(1)
    z = rng.choice(2, size=60)
    X = rng.poisson(np.array([[2.0, 9.0], [12.0, 1.0]])[z])
    mix = Mixture(2, family="poisson", seed=0, progress=False).fit(X, known_labels=z)
    np.testing.assert_allclose(mix.means_.numpy(), np.stack([X[z == c].mean(0) for c in range(2)]), atol=1e-10)
    np.testing.assert_allclose(mix.weights_.numpy(), np.bincount(z) / 60, atol=1e-10)


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_every_state_known_gives_the_counted_chain_and_the_per_state_emissions(covariance_type):
    seqs, paths = labelled_sequences()
    hmm = HMM(2, covariance_type=covariance_type, tol=0.0, max_iter=3, seed=0, progress=False)
    hmm.fit(seqs, known_states=paths)
    first = np.array([p[0] for p in paths])
    pairs = np.zeros((2, 2))
    for p in paths:
        np.add.at(pairs, (p[:-1], p[1:]), 1.0)
    np.testing.assert_allclose(hmm.initial_.numpy(), np.bincount(first, minlength=2) / len(paths), atol=1e-10)
    np.testing.assert_allclose(hmm.transition_.numpy(), pairs / pairs.sum(1, keepdims=True), atol=1e-10)
    frames, states = np.concatenate(seqs), np.concatenate(paths)
    _, means, covariances = supervised_gaussian(frames, states, 2, covariance_type)
    np.testing.assert_allclose(hmm.components_.mean.numpy(), means, atol=1e-10)
    np.testing.assert_allclose(hmm.components_.covariance.numpy(), covariances, atol=1e-10)


@pytest.mark.parametrize(
    "make, counts, fit_options",
    [
        (lambda: GMM(3, covariance_type="full", seed=0, progress=False), False, {}),
        (lambda: GMM(3, covariance_type="spherical", n_init=2, seed=0, progress=False), False, {}),
        (lambda: Mixture(3, family="poisson", seed=0, progress=False), True, {}),
        (lambda: GMM(3, seed=0, progress=False), False, {"engine": "svi", "num_steps": 3}),
    ],
)
def test_no_label_known_is_the_unsupervised_fit_bit_for_bit(make, counts, fit_options):
    X, _ = labelled_rows()
    X = np.abs(np.round(X * 3)) if counts else X
    unknown = np.full(len(X), -1)
    assert_same_fit(make().fit(X, **fit_options), make().fit(X, known_labels=unknown, **fit_options))


def test_no_state_known_is_the_unsupervised_hmm_fit_bit_for_bit():
    seqs, paths = labelled_sequences()
    unknown = [np.full(len(p), -1) for p in paths]
    make = lambda: HMM(2, covariance_type="full", seed=0, progress=False)  # noqa: E731
    assert_same_fit(make().fit(seqs), make().fit(seqs, known_states=unknown))


def test_clamped_e_step_without_a_known_row_is_the_e_step():
    """The clamped E-step's machinery (log-mask, two passes), run with nothing known, equals the fused E-step to
    rounding: the same objective, the same statistics."""
    X, _ = labelled_rows()
    gmm = GMM(3, covariance_type="full", seed=0, progress=False).fit(X)
    data = gmm._em_data(gmm.prepare_data(X))
    stats, objective = gmm._e_step(data)
    nothing = Clamp.of("known_labels", torch.full((len(X),), -1), 3, torch.float64)
    clamped_stats, clamped_objective = nothing.mixture_e_step(gmm, data)
    assert float(clamped_objective) == pytest.approx(float(objective), rel=1e-13)
    for name in ("counts", "mean", "scatter"):
        torch.testing.assert_close(getattr(clamped_stats, name), getattr(stats, name), rtol=1e-11, atol=1e-11)


def test_labels_move_the_fit_where_unsupervised_em_goes_elsewhere():
    X, top = corners()
    free = GMM(2, seed=0, progress=False).fit(X)
    assert np.allclose(np.sort(np.abs(free.means_.numpy()[:, 0])), 4.0, atol=0.3)  # left and right
    z = np.where(np.arange(len(X)) % 10 == 0, top, -1)  # one row in ten labelled: bottom 0, top 1
    gmm = GMM(2, seed=0, progress=False).fit(X, known_labels=z)
    np.testing.assert_allclose(gmm.means_.numpy(), [[0.0, -2.5], [0.0, 2.5]], atol=0.3)
    assert (gmm.predict(X) == top).mean() > 0.99
    # and the clamped optimum is no optimum of the unlabelled likelihood: the labels did move it
    assert gmm.score(X) < free.score(X) - 0.1


def test_states_move_the_hmm_fit_where_unsupervised_em_goes_elsewhere():
    seqs, paths = labelled_sequences()
    free = HMM(2, seed=0, progress=False).fit(seqs)
    assert np.allclose(np.sort(np.abs(free.components_.mean.numpy()[:, 0])), 4.0, atol=0.5)  # left and right
    known = [np.where(np.arange(len(p)) % 8 == 0, p, -1) for p in paths]
    hmm = HMM(2, seed=0, progress=False).fit(seqs, known_states=known)
    np.testing.assert_allclose(hmm.components_.mean.numpy(), [[0.0, -2.5], [0.0, 2.5]], atol=0.5)
    decoded = hmm.predict(seqs)
    assert (np.concatenate(decoded) == np.concatenate(paths)).mean() > 0.97
    assert hmm.transition_.diagonal().min() > 0.7


def test_a_label_for_one_component_only_renumbers_the_default_start():
    """Only component 1 is ever labelled: the default start (k-means) is renumbered so that its cluster holding the
    labelled rows is component 1."""
    X, top = corners()
    z = np.where((np.arange(len(X)) % 10 == 0) & (X[:, 0] < 0), 1, -1)  # a few left rows: component 1
    gmm = GMM(2, seed=0, progress=False).fit(X, known_labels=z)
    assert gmm.means_[1, 0] < -3 and gmm.means_[0, 0] > 3


def three_clusters(per_class=1000, seed=0):
    """Three well-separated 2-D clusters (sd 1) at (0, 0), (8, 0) and (0, 8), and their classes."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    z = np.repeat(np.arange(3), per_class)
    return centres[z] + rng.normal(size=(3 * per_class, 2)), z


@pytest.mark.parametrize("per_class", [1, 10])
def test_few_labels_reach_the_unsupervised_optimum_under_the_labels_names(per_class):
    """A handful of labels (one or ten per class of 1000 rows) start a seeded k-means: EM reaches the unsupervised
    optimum (the labelled rows sit deep in their clusters, so clamping them costs nothing measurable), and component
    k is the labelled class k; a start at the labels' statistics pulled to the global mean stalled 1.6 nats/row
    below."""
    X, z = three_clusters()
    known = np.full(len(X), -1)
    rows = np.concatenate([np.flatnonzero(z == c)[:: 1000 // per_class] for c in range(3)])
    known[rows] = z[rows]
    free = GMM(3, seed=0, progress=False).fit(X)
    gmm = GMM(3, seed=0, progress=False).fit(X, known_labels=known)
    assert gmm.lower_bound_ == pytest.approx(free.lower_bound_, abs=1e-3)
    class_means = np.stack([X[known == c].mean(0) for c in range(3)])
    nearest = np.linalg.norm(gmm.means_.numpy()[:, None] - class_means[None], axis=2).argmin(1)
    np.testing.assert_array_equal(nearest, np.arange(3))


def test_few_known_states_reach_the_unsupervised_hmm_optimum():
    """Eight known steps of 120 per sequence: the seeded start is in the optimum's basin already (a start at the
    labels' statistics pulled to the global mean began 2.7 nats/step below, and took 8 iterations to climb out)."""
    X, z = three_clusters(per_class=200)
    seqs, paths = [X[i::5] for i in range(5)], [z[i::5] for i in range(5)]
    known = [np.where(np.arange(len(p)) % 15 == 0, p, -1) for p in paths]  # 8 known steps of 120
    free = HMM(3, seed=0, progress=False).fit(seqs)
    hmm = HMM(3, seed=0, progress=False).fit(seqs, known_states=known)
    assert hmm.lower_bound_ == pytest.approx(free.lower_bound_, abs=1e-3)
    assert hmm.history_[0] > free.lower_bound_ - 0.01
    frames, states = np.concatenate(seqs), np.concatenate(known)
    class_means = np.stack([frames[states == c].mean(0) for c in range(3)])
    nearest = np.linalg.norm(hmm.components_.mean.numpy()[:, None] - class_means[None], axis=2).argmin(1)
    np.testing.assert_array_equal(nearest, np.arange(3))


def test_seeded_start_softens_the_unlabelled_rows_as_the_family_asks():
    """The seeded start's unlabelled rows are one-hot at their nearest class (softened by the family's
    ``start_spread``), the labelled ones one-hot at their label, whatever the points say."""
    points = torch.tensor([[0.0], [0.2], [5.0], [4.0], [9.0]], dtype=torch.float64)
    clamp = Clamp.of("known_labels", torch.tensor([0, -1, 1, -1, 1]), 2, torch.float64)
    hard = clamp.start(torch.zeros(5, 2, dtype=torch.float64), points)
    assert hard.tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]
    soft = clamp.start(torch.zeros(5, 2, dtype=torch.float64), points, family=family_from("bernoulli"))
    assert soft.tolist() == [[1.0, 0.0], [0.75, 0.25], [0.0, 1.0], [0.25, 0.75], [0.0, 1.0]]


# ------------------------------------------------------------------------------------------- objective
def test_clamped_mixture_objective_is_brute_force_enumeration_and_the_programs_elbo():
    X = np.array([[0.1, 0.3], [2.0, 1.1], [-1.2, 0.4], [0.7, -0.8], [3.1, 2.2]])
    z = np.array([2, -1, 0, -1, -1])
    gmm = GMM(3, covariance_type="full", max_iter=2, seed=0, progress=False).fit(X[[0, 1, 2, 3, 4, 0, 1, 4]])
    data = gmm.prepare_data(X)
    weights, means, covs = gmm.weights_.numpy(), gmm.means_.numpy(), gmm.covariances_.numpy()
    log_joint = np.stack([np.log(weights[k]) + multivariate_normal(means[k], covs[k]).logpdf(X) for k in range(3)], 1)
    unknown = np.flatnonzero(z < 0)
    totals = []
    for assignment in itertools.product(range(3), repeat=len(unknown)):  # every completion of the labels
        full = z.copy()
        full[unknown] = assignment
        totals.append(log_joint[np.arange(len(X)), full].sum())
    with clamping(gmm, KnownLabels(z), data, "em", {}):
        objective = float(gmm._e_step(gmm._em_data(data))[1])
        with local_params():
            elbo = -float(TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(gmm.model, gmm.guide, data))
    assert objective == pytest.approx(logsumexp(totals), rel=1e-12)
    assert elbo == pytest.approx(objective, rel=1e-12)


def test_clamped_hmm_objective_enumerates_the_paths_consistent_with_the_known_states():
    rng = np.random.default_rng(3)
    seqs = [rng.normal(size=(5, 1)) * 2, rng.normal(size=(3, 1)) * 2]
    states = [np.array([-1, 2, -1, -1, 0]), np.array([1, -1, -1])]
    hmm = HMM(3, max_iter=2, seed=0, progress=False).fit(seqs + seqs)
    batch = hmm.prepare_data(seqs)
    initial, transition = hmm.initial_.numpy(), hmm.transition_.numpy()
    loc, var = hmm.components_.mean.numpy()[:, 0], hmm.components_.covariance.numpy()[:, 0]
    expected = 0.0
    for x, known in zip(seqs, states):
        emit = -0.5 * ((x - loc) ** 2 / var + np.log(2 * np.pi * var))  # (T, K)
        paths = [
            p for p in itertools.product(range(3), repeat=len(x)) if all(k < 0 or k == s for k, s in zip(known, p))
        ]
        scores = [
            np.log(initial[p[0]])
            + sum(np.log(transition[a, b]) for a, b in zip(p[:-1], p[1:]))
            + emit[np.arange(len(x)), list(p)].sum()
            for p in paths
        ]
        expected += logsumexp(scores)
    with clamping(hmm, KnownStates(states), batch, "em", {}):
        objective = float(hmm._e_step(hmm._em_data(batch))[1])
        with local_params():
            elbo = -float(TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(hmm.model, hmm.guide, batch))
    assert objective == pytest.approx(expected, rel=1e-12)
    assert elbo == pytest.approx(objective, rel=1e-12)


@pytest.mark.parametrize(
    "covariance_type, missing",
    [*((covariance_type, "error") for covariance_type in COVARIANCE_TYPES), ("diag", "marginalize")],
)
def test_clamped_em_never_decreases_its_objective(covariance_type, missing):
    X, z = labelled_rows(seed=2)
    if missing == "marginalize":
        X[::7, 1] = np.nan
    known = np.where(np.arange(len(X)) % 4 == 0, z, -1)
    gmm = GMM(3, covariance_type=covariance_type, missing=missing, tol=0.0, max_iter=25, seed=0, progress=False)
    history = np.array(gmm.fit(X, known_labels=known).history_)
    assert len(history) > 5
    assert (np.diff(history) >= -1e-10 * np.abs(history[1:])).all()


def test_clamped_baum_welch_never_decreases_its_objective():
    seqs, paths = labelled_sequences(seed=4)
    known = [np.where(np.arange(len(p)) % 5 == 0, p, -1) for p in paths]
    hmm = HMM(2, covariance_type="full", tol=0.0, max_iter=25, seed=0, progress=False)
    history = np.array(hmm.fit(seqs, known_states=known).history_)
    assert (np.diff(history) >= -1e-10 * np.abs(history[1:])).all()


def test_integer_sample_weights_are_labelled_rows_repeated():
    X, z = labelled_rows()
    known = np.where(np.arange(len(X)) % 3 == 1, z, -1)  # rows of weight 1
    weight = np.arange(len(X)) % 3
    repeated = np.repeat(np.arange(len(X)), weight)
    make = lambda: GMM(3, tol=0.0, max_iter=10, seed=0, progress=False)  # noqa: E731
    weighted = make().fit(X, known_labels=known, sample_weight=weight)
    counted = make().fit(X[repeated], known_labels=known[repeated])
    np.testing.assert_allclose(weighted.history_[1:], counted.history_[1:], rtol=1e-9)
    np.testing.assert_allclose(weighted.means_.numpy(), counted.means_.numpy(), rtol=1e-8, atol=1e-10)
    # labels on rows of weight zero only are no labels for the start: the default start, renumbered
    dropped = make().fit(X, known_labels=np.where(weight == 0, z, -1), sample_weight=weight)
    assert torch.cdist(dropped.means_, dropped.means_).fill_diagonal_(np.inf).min() > 1.0


# ------------------------------------------------------------------------------------------- SVI and MCMC
def test_svi_and_mcmc_follow_the_labels():
    """A smoke test (the programs' objective is tested above): SVI climbs the clamped ELBO from the labelled
    start, and MCMC's draws keep the labels' components, not relabelled."""
    X, top = corners(n=120)
    z = np.where(np.arange(len(X)) % 5 == 0, top, -1)
    svi = GMM(2, seed=0, progress=False).fit(X, known_labels=z, engine="svi", num_steps=30, lr=0.05)
    assert svi.history_[-1] > svi.history_[0]
    assert svi.means_[0, 1] < -0.5 and svi.means_[1, 1] > 0.5
    mcmc = GMM(2, seed=0, progress=False).fit(X, known_labels=z, engine="mcmc", num_samples=10, warmup_steps=10)
    assert mcmc.means_[0, 1] < -2 and mcmc.means_[1, 1] > 2
    assert mcmc.mcmc_diagnostics_["relabelled_fraction"] == 0.0


def test_hmm_svi_follows_the_known_states():
    seqs, paths = labelled_sequences(n_sequences=6)
    known = [np.where(np.arange(len(p)) % 4 == 0, p, -1) for p in paths]
    hmm = HMM(2, seed=0, progress=False).fit(seqs, known_states=known, engine="svi", num_steps=10)
    assert hmm.history_[-1] > hmm.history_[0]
    assert hmm.components_.mean[0, 1] < 0 < hmm.components_.mean[1, 1]


# ------------------------------------------------------------------------------------------- y is ignored
def test_y_stays_ignored_in_fit_and_in_a_pipeline():
    X, z = labelled_rows()
    make = lambda: GMM(3, seed=0, progress=False)  # noqa: E731
    assert_same_fit(make().fit(X), make().fit(X, z))
    plain = make_pipeline(StandardScaler(), make()).fit(X)
    with_y = make_pipeline(StandardScaler(), make()).fit(X, z)
    assert_same_fit(plain[-1], with_y[-1])
    # labels reach the mixture through their own argument only
    routed = make_pipeline(StandardScaler(), make()).fit(X, gmm__known_labels=z)
    direct = make().fit(StandardScaler().fit_transform(X), known_labels=z)
    assert_same_fit(routed[-1], direct)
    seqs, paths = labelled_sequences()
    assert_same_fit(HMM(2, seed=0, progress=False).fit(seqs), HMM(2, seed=0, progress=False).fit(seqs, paths))


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "labels, message",
    [
        (np.zeros(5, dtype=int), "known_labels has 5 labels but X has 90 rows"),
        (np.r_[3, np.full(89, -1)], r"known_labels must hold labels in 0..2 .* got 3 at position 0"),
        (np.r_[np.full(89, -1), -2], r"got -2 at position 89"),
        (np.r_[0.5, np.full(89, -1.0)], "known_labels must hold integer labels"),
        (np.r_[np.nan, np.zeros(89)], "NaN or inf: mark an unknown label with -1"),
        (np.array(["a"] * 90), "known_labels must hold integer labels"),
        (np.zeros(90, dtype=bool), "known_labels must hold integer labels"),
        (np.zeros((90, 1), dtype=int), "known_labels must be 1-D"),
    ],
)
def test_bad_known_labels_are_refused(labels, message):
    X, _ = labelled_rows()
    with pytest.raises(ValueError, match=message):
        GMM(3, seed=0, progress=False).fit(X, known_labels=labels)


def test_integral_floats_are_labels():
    X, z = labelled_rows()
    as_floats = np.where(np.arange(len(X)) % 2 == 0, z, -1).astype(float)
    make = lambda: GMM(3, seed=0, progress=False)  # noqa: E731
    assert_same_fit(make().fit(X, known_labels=as_floats), make().fit(X, known_labels=as_floats.astype(int)))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s[:-1], "known_states has 11 sequences but X has 12"),
        (lambda s: [s[0][:-1], *s[1:]], r"known_states\[0\] has \d+ states but sequence 0 has \d+ steps"),
        (lambda s: [np.where(s[0] == 1, 2, s[0]), *s[1:]], r"known_states\[0\] must hold labels in 0..1"),
        (lambda s: [s[0] + 0.5, *s[1:]], r"known_states\[0\] must hold integer labels"),
        (lambda s: "01", "known_states must be a list of integer arrays"),
        (lambda s: 3, "known_states must be a list of integer arrays"),
    ],
)
def test_bad_known_states_are_refused(change, message):
    seqs, paths = labelled_sequences()
    with pytest.raises(ValueError, match=message):
        HMM(2, seed=0, progress=False).fit(seqs, known_states=change(paths))


def test_known_states_a_transition_pattern_forbids_are_refused():
    seqs = [np.arange(6.0)[:, None]]
    with pytest.raises(ValueError, match=r"known_states\[0\] moves from state 1 to 0 at step 3"):
        HMM(2, transition_pattern="left-right", seed=0, progress=False).fit(seqs, known_states=[[0, -1, 1, 0, -1, -1]])


@pytest.mark.parametrize(
    "states, message",
    [
        ([[2, -1, 0, -1, -1, -1]], r"known_states\[0\] has state 2 at step 0 and state 0 at step 2"),
        (
            [[0, -1, -1, -1, -1, 2], [0, -1, -1, 2, -1, 1]],
            r"known_states\[1\] has state 2 at step 3 and state 1 at step 5",
        ),
        ([[0, -1, -1, -1, -1, -1], [0, 2, -1, -1, -1, -1]], r"known_states\[1\] moves from state 0 to 2 at step 1"),
    ],
)
def test_known_states_that_no_allowed_path_connects_are_refused(states, message):
    """Known states separated by unknown steps must be connected by a path of allowed moves of that many steps."""
    seqs = [np.arange(6.0)[:, None] for _ in states]
    with pytest.raises(ValueError, match=message):
        HMM(3, transition_pattern="left-right", seed=0, progress=False).fit(seqs, known_states=states)


def test_known_states_an_allowed_path_connects_are_taken():
    """Two moves of a left-right chain reach two states on; a cycle of period 2 reaches a state only in even steps."""
    seqs = [np.arange(6.0)[:, None]]
    left_right = HMM(3, transition_pattern="left-right")
    assert (
        KnownStates([[0, -1, 2, -1, -1, 2]]).resolve(left_right, left_right.prepare_data(seqs, fitting=True))
        is not None
    )
    cycle = HMM(3, transition_pattern=np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]]))  # 0 <-> 1 <-> 2: parity alternates
    batch = cycle.prepare_data(seqs, fitting=True)
    assert KnownStates([[0, -1, 2, -1, 0, 1]]).resolve(cycle, batch) is not None
    with pytest.raises(ValueError, match=r"known_states\[0\] has state 0 at step 0 and state 2 at step 3"):
        KnownStates([[0, -1, -1, 2, -1, -1]]).resolve(cycle, batch)


def test_engines_and_paths_that_do_not_clamp_refuse_known_latents():
    X = np.random.default_rng(0).poisson(3.0, size=(40, 2))
    z = np.r_[0, 1, np.full(38, -1)]
    with pytest.raises(ValueError, match="known_labels is taken by engine in"):
        Mixture(2, family="poisson", seed=0, progress=False).fit(X, known_labels=z, engine="gibbs", num_samples=5)
    with pytest.raises(TypeError, match="known_labels"):
        GMM(2, seed=0, progress=False).partial_fit(X, known_labels=z)
    with pytest.raises(TypeError, match="GMM takes known_labels, not known_states"):  # a mixture's latents: labels
        GMM(2, seed=0, progress=False).fit(X, known_states=[z])
    with pytest.raises(TypeError, match="HMM takes known_states, not known_labels"):
        HMM(2, seed=0, progress=False).fit([X[:20].astype(float)], known_labels=z[:20])
    seqs = [np.random.default_rng(1).normal(size=(8, 2)) for _ in range(3)]
    with pytest.raises(TypeError, match="PFHMM takes no known_states"):  # the prediction-focused HMM's labels are y
        PFHMM(2, seed=0, progress=False).fit(seqs, [np.zeros(8)] * 3, known_states=[np.zeros(8, int)] * 3)


def test_fitted_model_predicts_without_the_labels():
    """The labels clamp the fit only: afterwards a row's prediction depends on the row and the model."""
    X, top = corners()
    z = np.where(np.arange(len(X)) % 10 == 0, top, -1)
    gmm = GMM(2, seed=0, progress=False).fit(X, known_labels=z)
    assert gmm._known_latents is None
    np.testing.assert_array_equal(gmm.predict_proba(X[:5]), gmm.predict_proba(X)[:5])
    np.testing.assert_array_equal(gmm.predict(X[z == 1]), gmm.predict(X)[z == 1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_partly_labelled_fits_on_cuda_equal_cpu():
    X, z = labelled_rows()
    known = np.where(np.arange(len(X)) % 3 == 0, z, -1)
    cpu = GMM(3, covariance_type="full", seed=0, progress=False).fit(X, known_labels=known)
    gpu = GMM(3, covariance_type="full", seed=0, progress=False, device="cuda").fit(X, known_labels=known)
    np.testing.assert_allclose(gpu.means_.cpu().numpy(), cpu.means_.numpy(), rtol=1e-8, atol=1e-10)
    seqs, paths = labelled_sequences()
    states = [np.where(np.arange(len(p)) % 4 == 0, p, -1) for p in paths]
    cpu_hmm = HMM(2, seed=0, progress=False).fit(seqs, known_states=states)
    gpu_hmm = HMM(2, seed=0, progress=False, device="cuda").fit(seqs, known_states=states)
    np.testing.assert_allclose(gpu_hmm.transition_.cpu().numpy(), cpu_hmm.transition_.numpy(), rtol=1e-8, atol=1e-10)
