"""Choosing K: ``select_components`` over every criterion, and ``bic``/``aic`` for every model (counted from the
Pyro program where the model has no closed-form count)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from ppmix import GMM, HMM, PFGMM, MixtureOfExperts, select_components
from ppmix.models._criteria import program_parameter_count
from tests.common import StudentTMixture, make_expert_data, make_labelled_blobs, make_sequences

QUIET = {"seed": 0, "progress": False}


def _three_clusters(n: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 8.0]])
    return centres[rng.integers(0, 3, n)] + rng.normal(size=(n, 2))


@pytest.mark.parametrize("criterion", ["bic", "aic", "cv"])
def test_the_planted_number_of_clusters_is_chosen(criterion):
    x = _three_clusters()
    found = select_components(GMM(**QUIET), x, ks=[1, 2, 3, 4], criterion=criterion, cv=3)
    assert found.best_k == 3 if criterion == "bic" else found.best_k >= 3
    assert found.best_model.n_components == found.best_k and found.best_model.converged_
    assert len(found.scores) == 4 and found.parameter == "n_components"
    if criterion == "bic":
        assert found.scores == [pytest.approx(GMM(k, **QUIET).fit(x).bic(x)) for k in [1, 2, 3, 4]]
    assert found.plot().get_xlabel() == "n_components"


def test_mixture_of_experts_varies_n_experts_with_y():
    x, y = make_expert_data(300)
    found = select_components(MixtureOfExperts(n_init=3, **QUIET), x, y, ks=[2, 3, 4])
    assert found.parameter == "n_experts" and found.best_k == 2


def test_bad_arguments_are_named():
    x = _three_clusters(30)
    with pytest.raises(ValueError, match="criterion must be one of"):
        select_components(GMM(**QUIET), x, criterion="loo")
    with pytest.raises(ValueError, match="ks must be"):
        select_components(GMM(**QUIET), x, ks=[0, 1])


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_the_program_count_equals_the_closed_form(covariance_type):
    """The count read from the Pyro program agrees with each model's own formula."""
    x = _three_clusters(120)
    gmm = GMM(3, covariance_type=covariance_type, **QUIET).fit(x)
    assert program_parameter_count(gmm.model, gmm.prepare_data(x), gmm.data_plate_name) == gmm.n_parameters
    seqs = make_sequences(6, (4, 10), n_features=2)[0]
    hmm = HMM(2, covariance_type=covariance_type, **QUIET).fit(seqs)
    assert program_parameter_count(hmm.model, hmm.prepare_data(seqs), hmm.data_plate_name) == hmm.n_parameters
    xe, ye = make_expert_data(120)
    moe = MixtureOfExperts(2, **QUIET).fit(xe, ye)
    assert program_parameter_count(moe.model, moe.prepare_data(xe, ye), moe.data_plate_name) == moe.n_parameters


def test_models_without_a_formula_count_their_program():
    x = _three_clusters(150)
    student = StudentTMixture(3, seed=0).fit(x, engine="svi", num_steps=30)
    # the same sites as a diagonal GMM: K - 1 weights, K x D locations and scales
    assert student.bic(x) == pytest.approx(-2 * student.log_likelihood(x) + 14 * np.log(150))
    xl, yl = make_labelled_blobs(80, n_features=3)
    pf = PFGMM(2, max_iter=20, **QUIET).fit(xl, yl)
    # weights 1, component locations and scales 2 x 3 each, label probabilities 2, background 3 + 3
    assert pf.aic(xl) == pytest.approx(-2 * pf.log_likelihood(xl) + 2 * 21)
