"""Input-driven HMMs (issue 51, item 2): transitions from a softmax gate on each step's inputs, and regression
emissions, ``x_t | z_t = k, u_t`` by the experts of the mixture of experts. Known answers: with inputs constant over
the steps the fit is the plain HMM's from the same start; a linear regression emission with zero slopes is the
Gaussian HMM; on short sequences the log-likelihood, the Viterbi path and the filter equal brute-force enumeration of
the state paths (every regression emission, either chain); planted gates and slopes are recovered, EM monotone."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.special import log_expit
from scipy.stats import norm, poisson

from ppmix import HMM
from ppmix.models.base import MixtureModel
from tests.common import assert_close

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")


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


def _gaussian_emission(hmm: HMM):
    """``log p(x_t | z_t = k)`` of the fitted Gaussian emissions (scipy's normal density)."""
    means, scales = hmm.components_.loc.numpy()[:, 0], hmm.components_.scale.numpy()[:, 0]
    return lambda x, u, k: norm.logpdf(x[0], means[k], scales[k])


def _enumerated(hmm: HMM, seq: np.ndarray, u: np.ndarray, log_emission) -> dict[tuple[int, ...], float]:
    """``log p(z, x)`` of every path of a short sequence, ``log_emission(x_t, u_t, k)`` the emission's log-density:
    the moves by the fitted gates (input-driven) or the transition matrix."""
    init, k = np.log(hmm.initial_.numpy()), hmm.n_components
    if hmm.transitions == "input-driven":
        coef, intercept = hmm.transition_coef_.numpy(), hmm.transition_intercept_.numpy()
        logits_of = lambda i, t: coef[i] @ u[t] + intercept[i]  # noqa: E731
    else:
        logits_of = lambda i, t: np.log(hmm.transition_.numpy()[i])  # noqa: E731
    out = {}
    for path in itertools.product(range(k), repeat=len(seq)):
        lp = init[path[0]] + log_emission(seq[0], u[0], path[0])
        for t in range(1, len(seq)):
            logits = logits_of(path[t - 1], t)
            lp += logits[path[t]] - np.logaddexp.reduce(logits)
            lp += log_emission(seq[t], u[t], path[t])
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
        joint = _enumerated(hmm, seq, u, _gaussian_emission(hmm))
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


# ------------------------------------------------------------------------------------- regression emissions
#: the planted regressions of two states on two inputs, per expert family: slopes ``(2, 2)`` and intercepts ``(2,)``
PLANTED_REGRESSIONS = {
    "linear_regression": (np.array([[2.0, -1.0], [-1.5, 0.5]]), np.array([1.0, -2.0])),
    "logistic_regression": (np.array([[3.0, 0.0], [-3.0, 1.0]]), np.array([1.0, -1.0])),
    "poisson_regression": (np.array([[0.8, 0.0], [-0.5, 0.3]]), np.array([1.0, 2.0])),
}
NOISE_SD = 0.3


def _respond(emission: str, eta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Responses at the linear predictors ``eta`` of the planted experts."""
    if emission == "linear_regression":
        return eta + NOISE_SD * rng.normal(size=eta.shape)
    if emission == "logistic_regression":
        return (rng.random(eta.shape) < 1.0 / (1.0 + np.exp(-eta))).astype(float)
    return rng.poisson(np.exp(eta)).astype(float)


def _planted_regression(emission: str, n_sequences: int, length: int, seed: int = 0):
    """Two sticky states (stay 0.9) emitting the planted regression of their state on two standard normal inputs."""
    rng = np.random.default_rng(seed)
    coef, intercept = PLANTED_REGRESSIONS[emission]
    seqs, inputs = [], []
    for _ in range(n_sequences):
        u = rng.normal(size=(length, 2))
        z = [int(rng.integers(2))]
        for _ in range(1, length):
            z.append(z[-1] if rng.random() < 0.9 else 1 - z[-1])
        eta = np.einsum("tp,tp->t", u, coef[z]) + intercept[z]
        seqs.append(_respond(emission, eta, rng)[:, None])
        inputs.append(u)
    return seqs, inputs


def _regression_emission(hmm: HMM):
    """``log p(x_t | u_t, z_t = k)`` of the fitted experts, by scipy (normal, Bernoulli by log-sigmoids, Poisson)."""
    coef, intercept = hmm.components_.coef.numpy(), hmm.components_.intercept.numpy()
    name = hmm.emission if isinstance(hmm.emission, str) else hmm.emission["expert"] + "_regression"

    def log_emission(x: np.ndarray, u: np.ndarray, k: int) -> float:
        eta = coef[k] @ u + intercept[k]
        if name == "linear_regression":
            return norm.logpdf(x[0], eta, hmm.components_.scale.numpy()[k])
        if name == "logistic_regression":
            return x[0] * log_expit(eta) + (1 - x[0]) * log_expit(-eta)
        return poisson.logpmf(x[0], np.exp(eta))

    return log_emission


@pytest.mark.parametrize("transitions", ["stationary", "input-driven"])
@pytest.mark.parametrize(
    "emission, k, length",
    [
        ("linear_regression", 2, 5),
        ("linear_regression", 3, 4),
        ("logistic_regression", 2, 5),
        ("poisson_regression", 3, 4),
        ({"name": "regression", "expert": "poisson"}, 2, 5),
    ],
    ids=["linear-K2", "linear-K3", "logistic-K2", "poisson-K3", "regression-poisson-K2"],
)
def test_regression_emissions_equal_brute_force_enumeration(emission, k, length, transitions):
    """log p(x | u), the Viterbi path, the smoothed and filtered marginals of short sequences equal the enumeration of
    every state path, the emissions' densities by scipy at the fitted slopes."""
    name = emission if isinstance(emission, str) else "poisson_regression"
    seqs, inputs = _planted_regression(name, 8, 20)
    hmm = HMM(k, emission=emission, transitions=transitions, max_iter=3, seed=0, progress=False)
    hmm.fit(seqs, inputs=inputs)
    short, short_inputs = _planted_regression(name, 3, length, seed=1)
    scores = hmm.score_samples(short, inputs=short_inputs)
    _, paths = hmm.decode(short, inputs=short_inputs)
    smoothed, filtered = hmm.predict_proba(short, inputs=short_inputs), hmm.filter(short, inputs=short_inputs)
    for b, (seq, u) in enumerate(zip(short, short_inputs)):
        joint = _enumerated(hmm, seq, u, _regression_emission(hmm))
        total = np.logaddexp.reduce(list(joint.values()))
        assert scores[b] == pytest.approx(total, rel=1e-10, abs=1e-10)
        assert tuple(paths[b]) == max(joint, key=joint.get)
        marginal = np.zeros((length, k))
        for path, lp in joint.items():
            marginal[np.arange(length), path] += np.exp(lp - total)
        assert_close(smoothed[b], marginal, rtol=0, atol=1e-10)
        assert_close(filtered[b][-1], marginal[-1], rtol=0, atol=1e-10)


def test_a_linear_regression_emission_with_zero_slopes_is_the_gaussian_hmm():
    """Inputs a constant column, slopes zero: each state's response is N(intercept_k, scale_k^2), the Gaussian HMM's
    emission at the same parameters, so every sequence's log-likelihood is the Gaussian HMM's (1e-10)."""
    seqs = _planted(6, 30)[0]
    plain = HMM(2, seed=0, progress=False).fit(seqs)
    ones = [np.ones((len(s), 1)) for s in seqs]
    regression = HMM(2, emission="linear_regression", max_iter=1, seed=0, progress=False).fit(seqs, inputs=ones)
    regression._set_globals(
        {
            "initial": plain.initial_,
            "transition": plain.transition_,
            "coef": torch.zeros(2, 1, dtype=torch.float64),
            "intercept": plain.components_.loc[:, 0],
            "scale": plain.components_.scale[:, 0],
        }
    )
    assert_close(regression.score_samples(seqs, inputs=ones), plain.score_samples(seqs), rtol=1e-10, atol=0)


@pytest.mark.parametrize(
    "emission, transitions, n_sequences, atol",
    [
        ("linear_regression", "stationary", 20, 0.1),
        ("linear_regression", "input-driven", 20, 0.1),
        ("logistic_regression", "stationary", 40, 0.4),
        ("poisson_regression", "stationary", 20, 0.15),
    ],
)
def test_planted_slopes_are_recovered_and_em_is_monotone(emission, transitions, n_sequences, atol):
    seqs, inputs = _planted_regression(emission, n_sequences, 50)
    hmm = HMM(2, emission=emission, transitions=transitions, seed=0, progress=False).fit(seqs, inputs=inputs)
    assert (np.diff(hmm.history_) >= -1e-10 * np.abs(hmm.history_[1:])).all(), np.diff(hmm.history_).min()
    coef, intercept = PLANTED_REGRESSIONS[emission]
    planted, fitted = np.argsort(intercept), np.argsort(hmm.components_.intercept.numpy())  # states by intercept
    assert_close(hmm.components_.coef.numpy()[fitted], coef[planted], rtol=0, atol=atol)
    assert_close(hmm.components_.intercept.numpy()[fitted], intercept[planted], rtol=0, atol=atol)
    if emission == "linear_regression":
        assert_close(hmm.components_.scale.numpy(), np.full(2, NOISE_SD), rtol=0.15, atol=0)
    assert hmm.n_parameters == 1 + (2 if transitions == "stationary" else 6) + 2 * (
        3 + (emission == "linear_regression")
    )


def test_regression_emissions_sample_save_load_and_the_pyro_program():
    """Sampling along given inputs, a saved model's scores, and the Pyro program of SVI and MCMC: its TraceEnum_ELBO
    equals EM's objective at the fitted parameters (the ridge penalty aside)."""
    seqs, inputs = _planted_regression("poisson_regression", 10, 30)
    hmm = HMM(2, emission="poisson_regression", seed=0, progress=False).fit(seqs, inputs=inputs)
    drawn = hmm.sample(inputs=[inputs[0], inputs[1][:7]])
    assert [x.shape for x in drawn["x"]] == [(30, 1), (7, 1)] and [z.shape for z in drawn["z"]] == [(30,), (7,)]
    assert all((x >= 0).all() and (x == np.round(x)).all() for x in drawn["x"])
    assert np.isfinite(hmm.score(drawn["x"], inputs=[inputs[0], inputs[1][:7]]))
    prepared = hmm.prepare_data(seqs, inputs=inputs)
    em_objective = float(hmm._e_step(hmm._em_data(prepared))[1]) + float(hmm.components_.penalty().sum())
    assert hmm._elbo_tensor(prepared) == pytest.approx(em_objective, rel=1e-10)
    svi = HMM(2, emission="poisson_regression", seed=0, progress=False)
    svi.fit(seqs, inputs=inputs, engine="svi", num_steps=5)
    assert svi.engine_ == "svi" and np.isfinite(svi.score(seqs, inputs=inputs))


@pytest.mark.parametrize("emission", ["linear_regression", "poisson_regression"])
def test_regression_sample_weights_count_sequences(emission):
    """A weight of 2 is the sequence twice: the experts' weighted fits take the posteriors times the weights (the
    same fit up to the states' order, which the k-means start of the repeated rows may swap)."""
    seqs, inputs = _planted_regression(emission, 8, 30)
    settings = {"emission": emission, "seed": 0, "progress": False, "tol": 1e-10, "max_iter": 300}
    twice = HMM(2, **settings).fit(seqs + seqs[:2], inputs=inputs + inputs[:2])
    weighted = HMM(2, **settings).fit(seqs, inputs=inputs, sample_weight=[2, 2] + [1] * 6)
    assert weighted.lower_bound_ == pytest.approx(twice.lower_bound_, rel=1e-10)
    coef = [m.components_.coef[torch.argsort(m.components_.intercept)] for m in (weighted, twice)]
    assert_close(coef[0], coef[1], rtol=0, atol=1e-6)


def test_regression_emissions_save_and_load(tmp_path):
    seqs, inputs = _planted_regression("linear_regression", 6, 20)
    hmm = HMM(2, emission="linear_regression", seed=0, progress=False).fit(seqs, inputs=inputs)
    loaded = MixtureModel.load(hmm.save(tmp_path / "regression"))
    assert loaded.n_inputs_ == 2 and loaded.get_params() == hmm.get_params()
    assert_close(loaded.score_samples(seqs, inputs=inputs), hmm.score_samples(seqs, inputs=inputs), rtol=0, atol=0)


def test_regression_emissions_check_inputs_responses_and_engines():
    seqs, inputs = _planted_regression("logistic_regression", 4, 10)
    with pytest.raises(ValueError, match=r"emission='logistic_regression' needs inputs="):
        HMM(2, emission="logistic_regression", progress=False).fit(seqs)
    hmm = HMM(2, emission="logistic_regression", seed=0, progress=False).fit(seqs, inputs=inputs)
    for call in (hmm.score_samples, hmm.predict, hmm.predict_proba, hmm.filter, hmm.decode, hmm.bic, hmm.aic):
        with pytest.raises(ValueError, match="needs inputs="):
            call(seqs)
    steps = sum(len(s) for s in seqs)
    log_lik = hmm.score(seqs, inputs=inputs) * steps
    assert hmm.bic(seqs, inputs=inputs) == pytest.approx(-2 * log_lik + hmm.n_parameters * np.log(steps), rel=1e-12)
    assert hmm.aic(seqs, inputs=inputs) == pytest.approx(-2 * log_lik + 2 * hmm.n_parameters, rel=1e-12)
    with pytest.raises(ValueError, match=r"sample\(inputs="):
        hmm.sample(2)
    with pytest.raises(ValueError, match=r"\bX\b must be binary"):
        hmm.score([2.0 * s for s in seqs], inputs=inputs)
    with pytest.raises(ValueError, match=r"\bX\b must hold one response per step"):
        HMM(2, emission="linear_regression", progress=False).fit([np.c_[s, s] for s in seqs], inputs=inputs)
    for engine in ("vb", "gibbs"):
        with pytest.raises(ValueError, match="engine='em', 'svi' or 'mcmc'"):
            HMM(2, emission="poisson_regression", progress=False).fit(seqs, inputs=inputs, engine=engine)
    with pytest.raises(ValueError, match="EM only"):
        HMM(2, emission="linear_regression", transitions="input-driven").fit(seqs, inputs=inputs, engine="svi")
    with pytest.raises(ValueError, match="gaussian, logistic or poisson experts"):
        HMM(2, emission={"name": "regression", "expert": "softmax"}).fit(seqs, inputs=inputs)
    assert not hasattr(hmm, "partial_fit")


@pytest.mark.parametrize("emission", ["linear_regression", "logistic_regression"])
def test_regression_emissions_equal_dynamax_marginal_log_prob(emission):
    """Every sequence's log-likelihood at the fitted parameters equals dynamax's ``LinearRegressionHMM`` /
    ``LogisticRegressionHMM`` ``marginal_log_prob`` at the same parameters (dynamax has no Poisson regression HMM)."""
    jax = pytest.importorskip("jax")
    dynamax = pytest.importorskip("dynamax.hidden_markov_model")
    jax.config.update("jax_enable_x64", True)
    seqs, inputs = _planted_regression(emission, 6, 25)  # one length: dynamax compiles its filter once
    hmm = HMM(2, emission=emission, max_iter=5, seed=0, progress=False).fit(seqs, inputs=inputs)
    comp = {name: jax.numpy.asarray(value.numpy()) for name, value in hmm.components_.state_dict().items()}
    chain = {
        "initial_probs": jax.numpy.asarray(hmm.initial_.numpy()),
        "transition_matrix": jax.numpy.asarray(hmm.transition_.numpy()),
    }
    if emission == "linear_regression":
        model = dynamax.LinearRegressionHMM(2, input_dim=2, emission_dim=1)
        params, _ = model.initialize(
            **chain,
            emission_weights=comp["coef"][:, None, :],
            emission_biases=comp["intercept"][:, None],
            emission_covariances=comp["scale"][:, None, None] ** 2,
        )
        as_emissions = lambda x: jax.numpy.asarray(x)  # noqa: E731
    else:
        model = dynamax.LogisticRegressionHMM(2, input_dim=2)
        params, _ = model.initialize(**chain, emission_weights=comp["coef"], emission_biases=comp["intercept"])
        as_emissions = lambda x: jax.numpy.asarray(x[:, 0])  # noqa: E731
    ours = hmm.score_samples(seqs, inputs=inputs)
    for x, u, log_lik in zip(seqs, inputs, ours):
        expected = float(model.marginal_log_prob(params, as_emissions(x), inputs=jax.numpy.asarray(u)))
        assert log_lik == pytest.approx(expected, rel=1e-10)
