"""The categorical and multinomial families' own known answers (the structures and engines are tested for every
family by ``tests/components/test_families.py`` and the contract suite, through ``FAMILY_DATA``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import optimize, special, stats
from sklearn.metrics import adjusted_rand_score

from ppmix import HMM, Mixture, MixtureModel
from ppmix.components.categorical import CategoricalComponents, CategoricalFamily
from ppmix.components.multinomial import MultinomialComponents, RowTotalMultinomial
from tests.common import assert_close

RNG = np.random.default_rng(0)


def _t(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=float))


def test_multinomial_log_prob_is_scipys_with_each_rows_own_total():
    probs = RNG.dirichlet(np.ones(4), size=3)
    x = np.stack([RNG.multinomial(n, [0.1, 0.2, 0.3, 0.4]) for n in (0, 1, 7, 30, 12)])  # totals differ by row
    expected = np.stack([stats.multinomial.logpmf(x, x.sum(1), probs[k]) for k in range(3)], axis=1)
    components = MultinomialComponents(_t(probs))
    assert_close(components.log_prob(_t(x)), expected, rtol=1e-12)
    prepared = Mixture(3, family="multinomial")._component_family().prepare(_t(x))  # coefficient cached once
    assert_close(components.log_prob(prepared), expected, rtol=1e-12)
    assert_close(RowTotalMultinomial(_t(probs[0])).log_prob(_t(x)), expected[:, 0], rtol=1e-12)


def test_categorical_log_prob_is_the_sum_of_the_levels_log_probabilities():
    probs = RNG.dirichlet(np.ones(4), size=(3, 5))  # (K, D, C)
    x = RNG.integers(0, 4, size=(20, 5))
    expected = np.stack([np.log(probs[k, np.arange(5), x]).sum(1) for k in range(3)], axis=1)
    components = CategoricalComponents(_t(probs))
    assert_close(components.log_prob(_t(x)), expected, rtol=1e-12)
    assert_close(components.log_prob(CategoricalFamily(4).prepare(_t(x))), expected, rtol=1e-12)
    pyro_dist = components.pyro_dist(torch.tensor([1]))
    assert_close(pyro_dist.log_prob(_t(x)), expected[:, 1], rtol=1e-12)


def _brute_force_simplex_mle(weighted_log_lik, n_categories: int) -> np.ndarray:
    """The maximiser over the simplex, in softmax coordinates, by BFGS."""
    result = optimize.minimize(
        lambda free: -weighted_log_lik(special.softmax(np.r_[0.0, free])),
        np.zeros(n_categories - 1),
        method="BFGS",
        options={"gtol": 1e-10},
    )
    return special.softmax(np.r_[0.0, result.x])


def test_the_weighted_mles_are_the_brute_force_maxima():
    weights = RNG.dirichlet(np.ones(2), size=60)  # (N, K)
    counts = np.stack([RNG.multinomial(n, [0.5, 0.3, 0.2]) for n in RNG.integers(0, 20, 60)])
    multinomial = MultinomialComponents(torch.full((2, 3), 1 / 3, dtype=torch.float64)).fit(_t(counts), _t(weights))
    codes = RNG.integers(0, 3, size=(60, 2))
    categorical = CategoricalComponents(torch.full((2, 2, 3), 1 / 3, dtype=torch.float64))
    categorical.fit(_t(codes), _t(weights))
    for k in range(2):
        w = weights[:, k]
        brute = _brute_force_simplex_mle(lambda p, w=w: w @ (counts @ np.log(p)), 3)
        assert_close(multinomial.probs[k], brute, rtol=1e-6)
        for d in range(2):
            brute = _brute_force_simplex_mle(lambda p, w=w, d=d: w @ np.log(p[codes[:, d]]), 3)
            assert_close(categorical.probs[k, d], brute, rtol=1e-6)


def test_unseen_levels_and_categories_keep_the_floor():
    """A level no row of a component takes gets the floor, not 0 (its log-density stays finite), and the levels
    that occur share the rest in proportion to their counts (the constrained MLE)."""
    categorical = CategoricalComponents(torch.full((1, 1, 3), 1 / 3, dtype=torch.float64), floor=1e-6)
    categorical.fit(_t([[0], [1], [1]]), torch.ones(3, 1, dtype=torch.float64))
    rest = 1 - 1e-6
    assert_close(categorical.probs[0, 0], [rest / 3, 2 * rest / 3, 1e-6], rtol=1e-12)
    multinomial = MultinomialComponents(torch.full((2, 2), 0.5, dtype=torch.float64), floor=1e-6)
    multinomial.fit(_t([[4, 0]]), _t([[1.0, 0.0]]))  # the second component has no weight: uniform
    assert_close(multinomial.probs, [[1 - 1e-6, 1e-6], [0.5, 0.5]], rtol=1e-12)


@pytest.mark.parametrize(
    "family, bad, message",
    [
        ("multinomial", -1.0, "X must hold counts"),
        ("multinomial", 0.5, "X must hold counts"),
        ("categorical", -1.0, "X must hold level codes"),
        ("categorical", 1.5, "X must hold level codes"),
    ],
)
def test_data_outside_the_support_are_an_error_naming_x(family, bad, message):
    x = RNG.integers(0, 3, size=(30, 2)).astype(float)
    x[4, 1] = bad
    with pytest.raises(ValueError, match=message):
        Mixture(2, family=family, progress=False).fit(x)


def test_a_level_beyond_the_measured_or_given_ones_is_an_error_naming_x(tmp_path):
    x = RNG.integers(0, 3, size=(40, 2)).astype(float)
    mixture = Mixture(2, family="categorical", seed=0, progress=False).fit(x)
    assert mixture.components_.probs.shape == (2, 2, 3)
    beyond = np.array([[0.0, 3.0]])
    with pytest.raises(ValueError, match=r"X holds the level code 3.*n_levels=3"):
        mixture.predict(beyond)
    loaded = MixtureModel.load(mixture.save(tmp_path / "m"))  # the measured levels are saved with the model
    assert loaded._component_family().n_levels == 3
    np.testing.assert_array_equal(loaded.predict_proba(x), mixture.predict_proba(x))
    with pytest.raises(ValueError, match=r"X holds the level code 3"):
        loaded.score(beyond)
    hmm = HMM(2, emission="categorical", seed=0, progress=False).fit([x[:20], x[20:]])
    with pytest.raises(ValueError, match=r"X holds the level code 3"):
        hmm.predict([beyond])
    with pytest.raises(ValueError, match=r"X holds the level code 3.*n_levels=3"):
        Mixture(2, family=CategoricalFamily(n_levels=3), progress=False).fit(np.r_[x, beyond])
    five = Mixture(2, family=CategoricalFamily(n_levels=5), seed=0, progress=False).fit(x)  # unseen levels allowed
    assert five.components_.probs.shape == (2, 2, 5) and five.n_parameters == 1 + 2 * 2 * 4


def test_latent_class_analysis_recovers_planted_classes_of_survey_answers():
    """Three classes of respondents answer 10 questions on a 4-point scale; each class has its own answer profile."""
    profiles = RNG.dirichlet(np.full(4, 0.5), size=(3, 10))  # (classes, questions, levels)
    classes = RNG.choice(3, size=600, p=[0.5, 0.3, 0.2])
    cumulative = profiles[classes].cumsum(-1)
    answers = (RNG.random((600, 10, 1)) > cumulative).sum(-1).clip(max=3).astype(float)
    mixture = Mixture(3, family="categorical", n_init=3, seed=0, progress=False).fit(answers)
    assert adjusted_rand_score(classes, mixture.predict(answers)) > 0.9
    order = [int(np.argmax(np.bincount(mixture.predict(answers)[classes == c], minlength=3))) for c in range(3)]
    assert_close(mixture.components_.probs[order], profiles, atol=0.1)
    assert_close(np.sort(mixture.weights_.numpy()), [0.2, 0.3, 0.5], atol=0.05)


def test_multinomial_mixture_recovers_planted_topics_from_documents_of_any_length():
    topics = RNG.dirichlet(np.full(12, 0.3), size=2)
    z = RNG.integers(0, 2, 300)
    documents = np.stack([RNG.multinomial(RNG.integers(5, 60), topics[k]) for k in z]).astype(float)
    mixture = Mixture(2, family="multinomial", seed=0, progress=False).fit(documents)
    assert adjusted_rand_score(z, mixture.predict(documents)) > 0.95
    order = [int(np.argmax(np.bincount(mixture.predict(documents)[z == k], minlength=2))) for k in range(2)]
    assert_close(mixture.components_.probs[order], topics, atol=0.03)


def _sticky_chains(n_sequences: int, length: int, emit) -> list[np.ndarray]:
    """Sequences of a three-state chain that keeps its state with probability 0.8, each step emitted by ``emit``."""
    transition = np.full((3, 3), 0.1) + 0.7 * np.eye(3)
    sequences = []
    for _ in range(n_sequences):
        z = [int(RNG.integers(3))]
        for _ in range(length - 1):
            z.append(int(RNG.choice(3, p=transition[z[-1]])))
        sequences.append(np.stack([emit(state) for state in z]).astype(float))
    return sequences


def _hmmlearn_score(peer, model, sequences, emissionprob) -> float:
    peer.startprob_, peer.transmat_ = model.initial_.numpy(), model.transition_.numpy()
    peer.emissionprob_ = emissionprob
    return peer.score(np.concatenate(sequences).astype(int), lengths=[len(s) for s in sequences])


def test_hmm_log_likelihoods_equal_hmmlearns_categorical_and_multinomial_hmms_at_the_fitted_parameters():
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    levels = RNG.dirichlet(np.ones(4), size=3)
    codes = _sticky_chains(10, 30, lambda k: [RNG.choice(4, p=levels[k])])
    model = HMM(3, emission="categorical", seed=0, progress=False).fit(codes)
    peer = hmmlearn.CategoricalHMM(n_components=3, n_features=4)
    expected = _hmmlearn_score(peer, model, codes, model.components_.probs[:, 0].numpy())
    assert model.log_likelihood(codes) == pytest.approx(expected, rel=1e-10)

    counts = _sticky_chains(10, 30, lambda k: RNG.multinomial(12, levels[k]))  # hmmlearn takes one total
    model = HMM(3, emission="multinomial", seed=0, progress=False).fit(counts)
    peer = hmmlearn.MultinomialHMM(n_components=3, n_trials=12)
    expected = _hmmlearn_score(peer, model, counts, model.components_.probs.numpy())
    assert model.log_likelihood(counts) == pytest.approx(expected, rel=1e-10)
