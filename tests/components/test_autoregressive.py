"""The autoregressive HMM (``HMM(emission="autoregressive")``, :mod:`ppmix.components.autoregressive`), by known
answers: dynamax's ``LinearAutoregressiveHMM.marginal_log_prob``, brute-force path enumeration, the Gaussian HMM
when every lag weight is zero, numpy's weighted least squares for the M-step, planted parameters, and the exact
recurrence for sampling."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import multivariate_normal

from ppmix import HMM, Mixture
from ppmix.components import AutoRegressiveComponents, AutoRegressiveFamily, FullGaussian
from ppmix.components.autoregressive import lagged_sequences
from ppmix.components.family_tools import placeholder
from ppmix.distributed import fit_em

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")
QUIET = {"seed": 0, "progress": False}
F64 = torch.float64


def _params(rng: np.random.Generator, k: int, d: int, p: int) -> dict[str, np.ndarray]:
    """Random parameters of a ``k``-state AR(``p``) HMM on ``d`` features (stable lag weights)."""
    noise = rng.normal(size=(k, d, d))
    return {
        "initial": rng.dirichlet(np.ones(k)),
        "transition": rng.dirichlet(np.ones(k), size=k),
        "weights": 0.3 / p * rng.normal(size=(k, d, d * p)),
        "bias": rng.normal(size=(k, d)),
        "tril": np.linalg.cholesky(noise @ noise.transpose(0, 2, 1) / d + 0.5 * np.eye(d)),
    }


def _simulate(rng: np.random.Generator, params: dict, lengths: list[int]) -> list[np.ndarray]:
    """Sequences of the AR-HMM of ``params``, frames before a start zero (independent of ppmix's sampler)."""
    k, d, dp = params["weights"].shape
    seqs = []
    for length in lengths:
        x, lags = np.zeros((length, d)), np.zeros(dp)
        z = rng.choice(k, p=params["initial"])
        for t in range(length):
            z = z if t == 0 else rng.choice(k, p=params["transition"][z])
            x[t] = params["weights"][z] @ lags + params["bias"][z] + params["tril"][z] @ rng.normal(size=d)
            lags = np.concatenate([x[t], lags[:-d]])
        seqs.append(x)
    return seqs


def _hmm_at(params: dict, seqs: list[np.ndarray], covariance_type: str = "full") -> HMM:
    """An AR-HMM with the lags of ``params``, fitted for one step on ``seqs`` and then set to ``params``."""
    k, d, dp = params["weights"].shape
    emission = {"name": "autoregressive", "lags": dp // d}
    hmm = HMM(k, emission=emission, covariance_type=covariance_type, max_iter=1, **QUIET).fit(seqs)
    hmm.initial_, hmm.transition_ = torch.tensor(params["initial"]), torch.tensor(params["transition"])
    hmm.components_ = AutoRegressiveComponents(
        torch.tensor(params["weights"]), torch.tensor(params["bias"]), torch.tensor(params["tril"])
    )
    return hmm


def _log_likelihoods(hmm: HMM, seqs: list[np.ndarray]) -> np.ndarray:
    return hmm._pointwise_log_likelihood(hmm.prepare_data(seqs)).numpy()


def _brute_force(params: dict, x: np.ndarray) -> tuple[float, np.ndarray, tuple[int, ...]]:
    """``log p(x)``, the state marginals and the best path of one short sequence, by enumerating every path."""
    k, d, dp = params["weights"].shape
    lagged = lagged_sequences(torch.tensor(x)[None], dp // d)[0, :, d:].numpy()
    emission = np.array(
        [
            [
                multivariate_normal(
                    params["weights"][j] @ lags + params["bias"][j], params["tril"][j] @ params["tril"][j].T
                ).pdf(frame)
                for j in range(k)
            ]
            for frame, lags in zip(x, lagged)
        ]
    )
    joint = {}
    for path in itertools.product(range(k), repeat=len(x)):
        prob = params["initial"][path[0]] * emission[0, path[0]]
        for t in range(1, len(x)):
            prob *= params["transition"][path[t - 1], path[t]] * emission[t, path[t]]
        joint[path] = prob
    total = sum(joint.values())
    marginals = np.zeros((len(x), k))
    for path, prob in joint.items():
        marginals[np.arange(len(x)), path] += prob / total
    return float(np.log(total)), marginals, max(joint, key=joint.get)


def test_log_likelihood_equals_dynamax_linear_autoregressive_hmm():
    jax = pytest.importorskip("jax")
    dynamax = pytest.importorskip("dynamax.hidden_markov_model")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    k, d, p = 3, 2, 2
    params = _params(rng, k, d, p)
    seqs = _simulate(rng, params, [30, 30])  # one length: dynamax compiles its filter once
    ours = _log_likelihoods(_hmm_at(params, seqs), seqs)
    model = dynamax.LinearAutoregressiveHMM(k, d, num_lags=p)
    theirs, _ = model.initialize(
        initial_probs=jax.numpy.asarray(params["initial"]),
        transition_matrix=jax.numpy.asarray(params["transition"]),
        emission_weights=jax.numpy.asarray(params["weights"]),
        emission_biases=jax.numpy.asarray(params["bias"]),
        emission_covariances=jax.numpy.asarray(params["tril"] @ params["tril"].transpose(0, 2, 1)),
    )
    for x, log_lik in zip(seqs, ours):
        emissions = jax.numpy.asarray(x)
        expected = float(model.marginal_log_prob(theirs, emissions, inputs=model.compute_inputs(emissions)))
        np.testing.assert_allclose(log_lik, expected, rtol=1e-8)


def test_a_tiny_case_equals_brute_force_path_enumeration():
    rng = np.random.default_rng(1)
    params = _params(rng, 2, 2, 2)
    seqs = _simulate(rng, params, [5, 3])
    hmm = _hmm_at(params, seqs)
    posteriors, (_, paths) = hmm.predict_proba(seqs), hmm.decode(seqs)
    for x, log_lik, posterior, path in zip(seqs, _log_likelihoods(hmm, seqs), posteriors, paths):
        expected, marginals, best = _brute_force(params, x)
        np.testing.assert_allclose(log_lik, expected, rtol=1e-12)
        np.testing.assert_allclose(posterior, marginals, rtol=1e-10, atol=1e-14)
        assert tuple(path.tolist()) == best


@pytest.mark.parametrize("lags", [1, 3])
def test_zero_lag_weights_give_the_full_covariance_gaussian_hmm(lags):
    rng = np.random.default_rng(2)
    params = _params(rng, 3, 2, lags)
    params["weights"] = np.zeros_like(params["weights"])
    seqs = _simulate(rng, params, [20, 9])
    gaussian = HMM(3, covariance_type="full", max_iter=1, **QUIET).fit(seqs)
    gaussian.initial_, gaussian.transition_ = torch.tensor(params["initial"]), torch.tensor(params["transition"])
    gaussian.components_ = FullGaussian(torch.tensor(params["bias"]), torch.tensor(params["tril"]))
    np.testing.assert_allclose(
        _log_likelihoods(_hmm_at(params, seqs), seqs), _log_likelihoods(gaussian, seqs), rtol=1e-12
    )


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    k=st.integers(1, 3),
    d=st.integers(1, 3),
    p=st.integers(1, 3),
    covariance_type=st.sampled_from(["full", "diag"]),
)
def test_the_m_step_is_weighted_least_squares(seed, k, d, p, covariance_type):
    """Per state: ``[W_k, b_k]`` is numpy's least squares of the frames on ``[lags, 1]`` weighted by the
    responsibilities, ``Sigma_k`` the weighted residual covariance (its diagonal for ``diag``)."""
    rng = np.random.default_rng(seed)
    n = 40 + d * p * 5
    rows = rng.normal(size=(n, d * (p + 1))) + rng.normal(size=d * (p + 1))
    resp = rng.dirichlet(np.ones(k), size=n)
    family = AutoRegressiveFamily(lags=p, covariance_type=covariance_type, reg_covar=1e-12)
    comps = placeholder(family, k, d, {}, {"dtype": F64})
    prepared = family.prepare(torch.tensor(rows))
    comps.fit_statistics(comps.statistics(prepared, torch.tensor(resp)))
    design = np.hstack([rows[:, d:], np.ones((n, 1))])
    for j in range(k):
        root = np.sqrt(resp[:, j])[:, None]
        coef = np.linalg.lstsq(root * design, root * rows[:, :d], rcond=None)[0]
        residual = rows[:, :d] - design @ coef
        cov = (resp[:, j, None] * residual).T @ residual / resp[:, j].sum()
        cov = np.diag(np.diag(cov)) if covariance_type == "diag" else cov
        np.testing.assert_allclose(comps.weights[j].numpy(), coef[:-1].T, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(comps.bias[j].numpy(), coef[-1], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(comps.covariance[j].numpy(), cov, rtol=1e-8, atol=1e-10)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), covariance_type=st.sampled_from(["full", "diag"]))
def test_em_never_decreases_the_log_likelihood(seed, covariance_type):
    rng = np.random.default_rng(seed)
    seqs = _simulate(rng, _params(rng, 2, 2, 2), [40, 25, 10])
    emission = {"name": "autoregressive", "lags": 2}
    hmm = HMM(3, emission=emission, covariance_type=covariance_type, max_iter=30, tol=0.0, **QUIET)
    history = np.asarray(hmm.fit(seqs).history_)
    assert np.all(np.diff(history) >= -1e-10 * np.abs(history[1:]))


def test_planted_parameters_are_recovered_on_long_sequences():
    rng = np.random.default_rng(3)
    params = _params(rng, 2, 2, 2)
    params["bias"] = np.array([[2.0, -2.0], [-2.0, 2.0]])
    params["transition"] = np.array([[0.95, 0.05], [0.1, 0.9]])
    seqs = _simulate(rng, params, [500] * 10)
    hmm = HMM(2, emission={"name": "autoregressive", "lags": 2}, covariance_type="full", **QUIET).fit(seqs)
    order = np.argsort(-hmm.components_.bias[:, 0].numpy())  # the planted state 0 has the larger bias
    comps = hmm.components_
    np.testing.assert_allclose(comps.weights[order].numpy(), params["weights"], atol=0.05)
    np.testing.assert_allclose(comps.bias[order].numpy(), params["bias"], atol=0.1)
    covariance = params["tril"] @ params["tril"].transpose(0, 2, 1)
    np.testing.assert_allclose(comps.covariance[order].numpy(), covariance, rtol=0.1, atol=0.05)
    np.testing.assert_allclose(hmm.transition_[order][:, order].numpy(), params["transition"], atol=0.02)


def test_sample_generates_autoregressively():
    """Without noise a sample is the recurrence ``x_t = W_z [x_{t-1}; x_{t-2}] + b_z`` from zeros, along its states."""
    rng = np.random.default_rng(4)
    params = _params(rng, 2, 2, 2)
    params["tril"] = np.broadcast_to(1e-12 * np.eye(2), (2, 2, 2)).copy()
    hmm = _hmm_at(params, _simulate(rng, params, [10, 10]))
    drawn = hmm.sample(3, 12)
    for x, z in zip(drawn["x"], drawn["z"]):
        lags = np.zeros(4)
        for t in range(12):
            expected = params["weights"][z[t]] @ lags + params["bias"][z[t]]
            np.testing.assert_allclose(x[t], expected, atol=1e-9)
            lags = np.concatenate([expected, lags[:2]])


def test_sampled_sequences_have_the_planted_autocorrelation():
    """One state, ``x_t = 0.8 x_{t-1} + e_t``: the lag-1 autocorrelation of long draws is 0.8 (sd about 0.006)."""
    params = {
        "initial": np.ones(1),
        "transition": np.ones((1, 1)),
        "weights": np.full((1, 1, 1), 0.8),
        "bias": np.zeros((1, 1)),
        "tril": np.ones((1, 1, 1)),
    }
    hmm = _hmm_at(params, _simulate(np.random.default_rng(5), params, [50]), covariance_type="diag")
    x = hmm.sample(4, 5000)["x"][:, 100:, 0]
    autocorrelation = np.mean([np.corrcoef(row[1:], row[:-1])[0, 1] for row in x])
    assert abs(autocorrelation - 0.8) < 0.02


def _fitted(max_iter: int = 20) -> tuple[HMM, list[np.ndarray]]:
    rng = np.random.default_rng(6)
    seqs = _simulate(rng, _params(rng, 2, 2, 2), [30, 20, 12])
    emission = {"name": "autoregressive", "lags": 2}
    return HMM(2, emission=emission, covariance_type="full", max_iter=max_iter, **QUIET).fit(seqs), seqs


def test_pyro_program_equals_the_em_objective_and_svi_runs():
    """The program's ``TraceEnum_ELBO`` (each step scored on its row with its lags) is EM's log-likelihood."""
    hmm, seqs = _fitted(max_iter=3)
    data = hmm.prepare_data(seqs)
    np.testing.assert_allclose(float(hmm._e_step(hmm._em_data(data))[1]), hmm._elbo_tensor(data), rtol=1e-10)
    svi = HMM(2, emission={"name": "autoregressive", "lags": 2}, **QUIET).fit(seqs, engine="svi", num_steps=20)
    assert svi.components_.weights.shape == (2, 2, 4) and np.isfinite(svi.score(seqs))


def test_mcmc_draws_every_site():
    rng = np.random.default_rng(8)
    seqs = _simulate(rng, _params(rng, 2, 2, 1), [10, 6])
    hmm = HMM(2, emission={"name": "autoregressive", "lags": 1}, **QUIET)
    # shallow trees: the test is that every site is drawn and reaches ArviZ, not that the chain mixes
    hmm.fit(seqs, engine="mcmc", num_samples=4, warmup_steps=4, max_tree_depth=3)
    posterior = hmm.to_arviz(num_samples=4).posterior
    assert posterior["weights"].dims == ("chain", "draw", "component", "feature", "lagged_feature")
    assert posterior["weights"].shape[-3:] == (2, 2, 2)
    assert all(np.isfinite(posterior[site].values).all() for site in ("weights", "bias", "scales", "corr_cholesky"))


def test_the_emission_options_reach_the_family():
    family = HMM(2, emission={"name": "autoregressive", "lags": 3, "covariance_type": "diag"})._component_family()
    assert (family.lags, family.covariance_type) == (3, "diag")
    assert HMM(2, emission="autoregressive", covariance_type="full")._component_family().covariance_type == "full"


@pytest.mark.parametrize(
    "emission, message",
    [
        ({"name": "autoregressive", "lags": 0}, "lags must be >= 1"),
        ({"name": "autoregressive", "covariance_type": "tied"}, "covariance_type must be one of"),
    ],
)
def test_bad_settings_are_named(emission, message):
    seqs = [np.random.default_rng(0).normal(size=(10, 2))]
    with pytest.raises(ValueError, match=message):
        HMM(2, emission=emission, **QUIET).fit(seqs)


def test_a_mixture_is_refused_for_want_of_sequences():
    x = np.random.default_rng(0).normal(size=(40, 2))
    with pytest.raises(ValueError, match=r"previous frame.*HMM\(emission='autoregressive'\)"):
        Mixture(2, family="autoregressive", **QUIET).fit(x)


def test_the_mean_is_where_a_state_settles():
    """A noiseless sequence that stays in one stable state converges to its ``mean``, ``(I - W_1 - W_2)^{-1} b``."""
    rng = np.random.default_rng(9)
    params = _params(rng, 1, 2, 2)
    params["tril"] = 1e-12 * np.eye(2)[None]
    hmm = _hmm_at(params, _simulate(rng, params, [10]))
    settled = hmm.sample(1, 400)["x"][0, -1]
    np.testing.assert_allclose(hmm.means_[0].numpy(), settled, rtol=1e-8)


def test_the_cli_passes_lags_as_an_emission_option(tmp_path):
    from ppmix.cli import main

    rng = np.random.default_rng(10)
    seqs = _simulate(rng, _params(rng, 2, 2, 2), [60, 60])
    frame = pd.DataFrame(np.concatenate(seqs), columns=["a", "b"]).assign(run=np.repeat([0, 1], 60))
    frame.to_csv(tmp_path / "steps.csv", index=False)
    argv = ["fit", "hmm", str(tmp_path / "steps.csv"), "--k", "2", "--sequence-column", "run", "--quiet"]
    options = ["--emission", "autoregressive", "--emission-option", "lags=2", "--covariance", "full"]
    assert main([*argv, *options, "--max-iter", "5", "--out", str(tmp_path / "out")]) == 0
    model = HMM.load(tmp_path / "out" / "model")
    assert (model._component_family().lags, model.components_.weights.shape) == (2, (2, 2, 4))


def test_em_on_shards_equals_em_in_memory(tmp_path):
    """Sequences split over ``.npz`` shards (frames and lengths): each shard's lags restart at its sequences'
    starts, as in memory."""
    start, seqs = _fitted(max_iter=2)
    start.warm_start = True
    in_memory = copy.deepcopy(start).fit(seqs, max_iter=5, tol=0.0)
    paths = [tmp_path / "part0.npz", tmp_path / "part1.npz"]
    for path, part in zip(paths, (seqs[:1], seqs[1:])):
        np.savez(path, X=np.concatenate(part), lengths=np.array([len(s) for s in part]))
    sharded = fit_em(copy.deepcopy(start), paths, executor="inline", max_iter=5, tol=0.0)
    np.testing.assert_allclose(sharded.history_, in_memory.history_, rtol=1e-10)
    for key, value in in_memory._state_tensors().items():
        np.testing.assert_allclose(sharded._state_tensors()[key].numpy(), value.numpy(), rtol=1e-9, atol=1e-12)


def test_partial_fit_on_chunks_approaches_the_batch_fit():
    rng = np.random.default_rng(11)
    params = _params(rng, 2, 2, 1)
    params["bias"], params["transition"] = np.array([[2.0, -2.0], [-2.0, 2.0]]), np.array([[0.9, 0.1], [0.1, 0.9]])
    seqs = _simulate(rng, params, [40] * 8)
    emission = {"name": "autoregressive", "lags": 1}
    batch = HMM(2, emission=emission, **QUIET).fit(seqs)
    online = HMM(2, emission=emission, **QUIET)
    for _ in range(5):
        for part in (seqs[:4], seqs[4:]):
            online.partial_fit(part)
    assert online.score(seqs) >= batch.score(seqs) - 0.02


def test_the_variance_floor_is_on_the_scale_of_the_steps_not_the_frames(tmp_path):
    """A random walk with drift: the frames spread over the whole walk, the noise (variance 1e-4) does not; the floor
    is measured on the first differences, so the fitted noise variance is the noise's, and it survives a save."""
    rng = np.random.default_rng(0)
    x = np.cumsum(1 + 0.01 * rng.normal(size=5000))[:, None]
    hmm = HMM(1, emission=AutoRegressiveFamily(lags=1), **QUIET).fit([x])
    np.testing.assert_allclose(hmm.components_.covariance[0, 0, 0].item(), 1e-4, rtol=0.05)
    loaded = HMM.load(hmm.save(tmp_path / "model"))
    np.testing.assert_allclose(loaded._scale["floor"].numpy(), hmm._scale["floor"].numpy(), rtol=1e-12)
    np.testing.assert_allclose(loaded.components_.reg_covar, hmm.components_.reg_covar, rtol=1e-12)
    np.testing.assert_allclose(loaded.score([x]), hmm.score([x]), rtol=1e-12)


def test_float32_far_from_the_origin_equals_float64_and_least_squares():
    """The normal equations are centred: at an offset of 1000, float32's fit is float64's (and numpy's least squares
    of each frame on ``[x_{t-1}, 1]``, the first frame's lag zero) to float32's precision."""
    rng = np.random.default_rng(1)
    x = 1000.0 + 1.6 * rng.normal(size=(3000, 1))
    fits = [
        HMM(1, emission=AutoRegressiveFamily(lags=1), dtype=dtype, **QUIET).fit([x]) for dtype in (torch.float32, F64)
    ]
    design = np.hstack([np.vstack([[0.0], x[:-1]]), np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(design, x, rcond=None)
    variance = np.mean((x - design @ coef) ** 2)
    for hmm in fits:
        comps = hmm.components_
        np.testing.assert_allclose(comps.weights[0, 0, 0].item(), coef[0, 0], atol=1e-4)
        np.testing.assert_allclose(comps.bias[0, 0].item(), coef[1, 0], rtol=1e-5)
        np.testing.assert_allclose(comps.covariance[0, 0, 0].item(), variance, rtol=1e-3)


def _fitted_on_rows(rows: np.ndarray, resp: np.ndarray, d: int, p: int) -> AutoRegressiveComponents:
    """Components fitted on step rows ``[x_t, lags]`` with responsibilities ``resp`` (one M-step)."""
    family = AutoRegressiveFamily(lags=p, reg_covar=1e-12)
    comps = placeholder(family, resp.shape[1], d, {}, {"dtype": F64})
    return comps.fit_statistics(comps.statistics(family.prepare(torch.tensor(rows)), torch.tensor(resp)))


def test_collinear_lags_take_the_minimum_norm_weights_and_a_dead_state_its_floor():
    """Two lags equal up to a constant (``z`` and ``z + 5``) split the regression on ``z`` evenly, whatever the
    constant (the intercept is not shrunk); a state without weight gets zero weights and the floored covariance."""
    rng = np.random.default_rng(2)
    z = rng.normal(size=200)
    x = 0.6 * z + 3.0 + 0.1 * rng.normal(size=200)
    rows = np.column_stack([x, z, z + 5.0])
    comps = _fitted_on_rows(rows, np.column_stack([np.ones(200), np.zeros(200)]), 1, 2)
    (slope, intercept), *_ = np.linalg.lstsq(np.column_stack([z, np.ones(200)]), x, rcond=None)
    np.testing.assert_allclose(comps.weights[0, 0].numpy(), [slope / 2, slope / 2], rtol=1e-8)
    np.testing.assert_allclose(comps.bias[0, 0].item(), intercept - 5.0 * slope / 2, rtol=1e-8)
    assert torch.isfinite(comps.scale_tril).all() and torch.isfinite(comps.bias).all()
    np.testing.assert_array_equal(comps.weights[1].numpy(), 0.0)
    np.testing.assert_allclose(comps.covariance[1].numpy(), [[1e-12]])


def test_sequences_shorter_than_the_lags_get_zero_weights_on_the_lags_they_never_see():
    rng = np.random.default_rng(3)
    seqs = [1.0 + rng.normal(size=(2, 1)) for _ in range(50)]
    comps = HMM(1, emission=AutoRegressiveFamily(lags=3), **QUIET).fit(seqs).components_
    first = np.concatenate([s[:1] for s in seqs])
    second = np.concatenate([s[1:] for s in seqs])
    design = np.column_stack([np.vstack([np.zeros((50, 1)), first]), np.ones(100)])
    coef, *_ = np.linalg.lstsq(design, np.vstack([first, second]), rcond=None)
    np.testing.assert_allclose(comps.weights[0, 0].numpy(), [coef[0, 0], 0.0, 0.0], atol=1e-10)
    np.testing.assert_allclose(comps.bias[0, 0].item(), coef[1, 0], rtol=1e-8)
