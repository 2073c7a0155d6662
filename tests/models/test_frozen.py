"""Frozen parameters, ``fit(..., fixed={...})`` (:mod:`ppmix.models.frozen`): kept exactly by every engine, the
others fitted given them (EM's closed forms checked against the weighted scatter and a hand-written Baum-Welch),
EM still monotone, samplers' draws of frozen sites constant, bad input refused naming ``fixed`` and the key."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix import GMM, HMM, HSMM, Mixture

pytestmark = pytest.mark.filterwarnings(
    "ignore::ppmix.engines.result.ConvergenceWarning", "ignore::ppmix.engines.draws.ChainsDisagreeWarning"
)

QUIET = {"seed": 0, "progress": False}
F64 = torch.float64
SHORT = {
    "em": {},
    "svi": {"num_steps": 15},
    "mcmc": {"num_samples": 6, "warmup_steps": 6, "num_chains": 2},
    "gibbs": {"num_samples": 6, "warmup_steps": 3, "num_chains": 2},
}


def _blobs(n: int = 60, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 1, (n // 2, 2)), rng.normal(3, 0.6, (n - n // 2, 2))])


def _sequences(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(20, 1)) + 3 * (np.arange(20)[:, None] // 5 % 2) for _ in range(4)]


W = torch.tensor([0.25, 0.75], dtype=F64)
MU = torch.tensor([[-2.5, -2.5], [3.5, 3.5]], dtype=F64)
A = torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=F64)
PI = torch.tensor([0.5, 0.5], dtype=F64)
RATE = torch.tensor([[2.0], [9.0]], dtype=F64)

#: (model, data, fixed sites) per structure: Gaussian mixture, Poisson mixture, Gaussian HMM
CASES = {
    "GMM": (lambda: GMM(2, **QUIET), _blobs, {"weights": W, "locs": MU}),
    "Mixture-poisson": (
        lambda: Mixture(2, family="poisson", **QUIET),
        lambda: np.random.default_rng(0).poisson([[2.0]] * 30 + [[9.0]] * 30),
        {"rate": RATE},
    ),
    "HMM": (lambda: HMM(2, **QUIET), _sequences, {"transition": A, "initial": PI}),
}


@pytest.mark.parametrize("engine", list(SHORT))
@pytest.mark.parametrize("case", list(CASES))
def test_frozen_parameters_are_kept_exactly_by_every_engine(case, engine):
    make, data, fixed = CASES[case]
    model = make().fit(data(), engine=engine, fixed=fixed, **SHORT[engine])
    fitted = model._get_globals()
    for site, value in fixed.items():
        assert torch.equal(fitted[site], value), site
    if engine in ("mcmc", "gibbs"):  # the frozen sites' draws are their values; the free ones move
        draws = model.mcmc_samples_
        for site, value in fixed.items():
            assert torch.equal(draws[site], value.expand_as(draws[site])), site
        free = next(site for site in draws if site not in fixed)
        assert float(draws[free].std(dim=(0, 1)).max()) > 0


def test_aliases_name_the_sites_and_covariances_are_kept_to_rounding():
    covariances = torch.tensor([[[1.0, 0.3], [0.3, 0.5]], [[0.4, -0.1], [-0.1, 0.2]]], dtype=F64)
    fixed = {"weights_": W, "means_": MU, "covariances_": covariances}
    gmm = GMM(2, covariance_type="full", **QUIET).fit(_blobs(), fixed=fixed)
    assert torch.equal(gmm.weights_, W) and torch.equal(gmm.means_, MU)
    torch.testing.assert_close(gmm.covariances_, covariances, rtol=1e-12, atol=1e-14)
    hmm = HMM(2, **QUIET).fit(_sequences(), fixed={"startprob_": PI, "transmat_": A})
    assert torch.equal(hmm.initial_, PI) and torch.equal(hmm.transition_, A)


def _scatter_covariances(x: torch.Tensor, resp: torch.Tensor, locs: torch.Tensor, kind: str) -> torch.Tensor:
    """The covariances of the closed form: each component's weighted scatter around ``locs``, in ``covariances_``'s
    layout (tied: pooled over the components)."""
    centred = x[:, None, :] - locs[None]  # (N, K, D)
    counts = resp.sum(0)
    full = torch.einsum("nk,nkd,nke->kde", resp, centred, centred) / counts[:, None, None]
    if kind == "full":
        return full
    if kind == "tied":
        pooled = torch.einsum("k,kde->de", counts, full) / counts.sum()
        return pooled.expand_as(full)
    diagonal = torch.diagonal(full, dim1=-2, dim2=-1)
    return diagonal if kind == "diag" else diagonal.mean(-1, keepdim=True).expand_as(diagonal)


@pytest.mark.parametrize("kind", ["diag", "full", "spherical", "tied"])
def test_em_covariances_are_the_weighted_scatter_around_the_frozen_means(kind):
    x = _blobs()
    gmm = GMM(2, covariance_type=kind, **QUIET).fit(x, fixed={"locs": MU})
    resp = gmm.predict_proba(torch.as_tensor(x))  # the responsibilities the next M-step uses
    expected = _scatter_covariances(torch.as_tensor(x), resp, MU, kind)
    gmm.set_params(warm_start=True).fit(x, fixed={"locs": MU}, max_iter=1, tol=0.0)  # one more M-step
    assert torch.equal(gmm.means_, MU)
    torch.testing.assert_close(gmm.covariances_, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gmm.weights_, resp.mean(0), rtol=1e-10, atol=1e-12)


def _baum_welch_given_transition(seqs, initial, transition, means, variances, n_iter):
    """A hand-written Baum-Welch (numpy, scaled forward-backward) for a 1-D Gaussian HMM that updates the initial
    distribution and the emissions only, ``transition`` kept."""
    for _ in range(n_iter):
        first, weight, total, square = 0.0, 0.0, 0.0, 0.0
        for x in seqs:
            x = x[:, 0]
            emit = np.exp(-0.5 * (x[:, None] - means) ** 2 / variances) / np.sqrt(2 * np.pi * variances)
            alpha, beta, scale = np.zeros_like(emit), np.ones_like(emit), np.zeros(len(x))
            alpha[0] = initial * emit[0]
            scale[0] = alpha[0].sum()
            alpha[0] /= scale[0]
            for t in range(1, len(x)):
                alpha[t] = (alpha[t - 1] @ transition) * emit[t]
                scale[t] = alpha[t].sum()
                alpha[t] /= scale[t]
            for t in range(len(x) - 2, -1, -1):
                beta[t] = transition @ (emit[t + 1] * beta[t + 1]) / scale[t + 1]
            gamma = alpha * beta
            gamma /= gamma.sum(1, keepdims=True)
            first = first + gamma[0]
            weight = weight + gamma.sum(0)
            total = total + gamma.T @ x
            square = square + gamma.T @ x**2
        initial = first / len(seqs)
        means = total / weight
        variances = square / weight - means**2
    return initial, means, variances


def test_hmm_with_frozen_transitions_is_baum_welch_updating_the_initial_distribution_and_emissions_only():
    seqs = _sequences()
    hmm = HMM(2, **QUIET).fit(seqs, max_iter=2)  # a start away from any fixed point
    initial, means, variances = (v.numpy().copy() for v in (hmm.initial_, hmm.means_[:, 0], hmm.covariances_[:, 0]))
    hmm.set_params(warm_start=True).fit(seqs, fixed={"transition": A}, max_iter=3, tol=0.0)
    expected = _baum_welch_given_transition(seqs, initial, A.numpy(), means, variances, n_iter=3)
    assert torch.equal(hmm.transition_, A)
    for fitted, value in zip((hmm.initial_, hmm.means_[:, 0], hmm.covariances_[:, 0]), expected):
        np.testing.assert_allclose(fitted.numpy(), value, rtol=1e-9, atol=1e-10)


def test_freezing_every_parameter_at_an_em_fixed_point_leaves_the_fit_unchanged():
    seqs = _sequences()
    hmm = HMM(2, tol=1e-12, max_iter=500, **QUIET).fit(seqs)
    fixed = hmm._get_globals()
    frozen = HMM(2, **QUIET).fit(seqs, fixed=fixed)
    assert frozen.score(seqs) == pytest.approx(hmm.score(seqs), rel=1e-12)
    for site, value in frozen._get_globals().items():
        assert torch.equal(value, fixed[site]), site


SITES = ("weights", "locs", "scales")


@settings(max_examples=6, deadline=None)
@given(frozen=st.sets(st.sampled_from(SITES)), kind=st.sampled_from(["diag", "full"]))
def test_em_objective_never_decreases_with_frozen_parameters(frozen, kind):
    x = _blobs(40, seed=1)
    values = {"weights": W, "locs": MU, "scales": torch.full((2, 2), 0.8, dtype=F64)}
    if kind == "full" and "scales" in frozen:
        frozen = (frozen - {"scales"}) | {"covariances_"}
        values["covariances_"] = torch.eye(2, dtype=F64).expand(2, 2, 2) * 0.64
    gmm = GMM(2, covariance_type=kind, tol=0.0, max_iter=15, **QUIET)
    gmm.fit(x, fixed={name: values[name] for name in frozen})
    history = np.asarray(gmm.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()


HMM_SITES = ("initial", "transition", "locs", "scales")


@settings(max_examples=5, deadline=None)
@given(frozen=st.sets(st.sampled_from(HMM_SITES)))
def test_hmm_em_objective_never_decreases_with_frozen_parameters(frozen):
    values = {"initial": PI, "transition": A, "locs": torch.tensor([[0.5], [2.5]], dtype=F64)}
    values["scales"] = torch.ones(2, 1, dtype=F64)
    hmm = HMM(2, tol=0.0, max_iter=10, **QUIET).fit(_sequences(1), fixed={name: values[name] for name in frozen})
    history = np.asarray(hmm.history_)
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()
    assert set(hmm.fixed_) == frozen


@pytest.mark.parametrize("engine", ["em", "svi"])
def test_posterior_draws_hold_the_frozen_sites(engine):
    options = {"num_steps": 20, "guide": "normal"} if engine == "svi" else {}
    gmm = GMM(2, **QUIET).fit(_blobs(), engine=engine, fixed={"weights": W}, **options)
    posterior = gmm.to_arviz(groups=[], num_samples=20).posterior  # Laplace draws after EM, the guide's after SVI
    assert np.array_equal(posterior["weights"].values, np.broadcast_to(W.numpy(), posterior["weights"].shape))
    assert posterior["locs"].values.std(axis=(0, 1)).min() > 0


def test_frozen_sites_change_the_posterior_of_the_free_ones():
    x = _blobs()
    far = MU + 2.0  # means away from the clusters: the variances must widen to reach the rows
    free = GMM(2, **QUIET).fit(x, engine="mcmc", **SHORT["mcmc"])
    held = GMM(2, **QUIET).fit(x, engine="mcmc", fixed={"locs": far}, **SHORT["mcmc"])
    assert float(held.mcmc_samples_["scales"].mean()) > 1.5 * float(free.mcmc_samples_["scales"].mean())
    svi_free = GMM(2, **QUIET).fit(x, engine="svi", num_steps=30)
    svi_held = GMM(2, **QUIET).fit(x, engine="svi", num_steps=30, fixed={"locs": far})
    assert torch.equal(svi_held.means_, far)
    assert float(svi_held.covariances_.mean()) > 1.5 * float(svi_free.covariances_.mean())


BAD = {
    "unknown key": (GMM, {"mean": MU}, "fixed has an unknown key 'mean'"),
    "wrong shape": (GMM, {"locs": MU[:1]}, r"fixed\['locs'\] must have shape \(2, 2\)"),
    "off the simplex": (GMM, {"weights": [0.5, 0.6]}, r"fixed\['weights'\] must be on the simplex"),
    "negative scale": (GMM, {"scales": -torch.ones(2, 2)}, r"fixed\['scales'\] is outside the support"),
    "not finite": (GMM, {"locs": MU * float("nan")}, r"fixed\['locs'\] holds NaN"),
    "not positive definite": (
        lambda *a, **k: GMM(*a, covariance_type="full", **k),
        {"covariances_": torch.tensor([[1.0, 2.0], [2.0, 1.0]]).expand(2, 2, 2)},
        r"fixed\['covariances_'\] must hold positive-definite",
    ),
    "not a dict": (GMM, [("weights", W)], "fixed must be a dict"),
    "twice": (GMM, {"weights": W, "weights_": W}, r"fixed\['weights_'\] names the site 'weights' a second time"),
    "partly frozen gamma": (
        lambda *a, **k: Mixture(*a, family="gamma", **k),
        {"rate": torch.ones(2, 2)},
        r"fixed\['rate'\]: engine='em' fits the other parameters",
    ),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_fixed_is_a_value_error_naming_fixed_and_the_key(bad):
    make, fixed, message = BAD[bad]
    x = np.abs(_blobs()) + 0.1
    with pytest.raises(ValueError, match=message):
        make(2, **QUIET).fit(x, fixed=fixed)


def test_fixed_is_refused_where_it_is_not_taken():
    seqs = _sequences()
    with pytest.raises(ValueError, match=r"fixed\['transition'\] gives the move 1 -> 0"):
        HMM(2, transition_pattern="left-right", **QUIET).fit(seqs, fixed={"transition": A})
    with pytest.raises(ValueError, match="fixed is taken by engine in"):
        GMM(2, **QUIET).fit(_blobs(), engine="vb", fixed={"weights": W})
    with pytest.raises(ValueError, match="HSMM takes no fixed parameters"):
        HSMM(2, max_duration=3, **QUIET).fit(seqs, fixed={"initial": PI})


def test_an_empty_fixed_is_the_plain_fit():
    x = _blobs()
    plain, empty = GMM(2, **QUIET).fit(x), GMM(2, **QUIET).fit(x, fixed={})
    assert torch.equal(plain.means_, empty.means_) and plain.history_ == empty.history_


def test_information_criteria_do_not_count_frozen_parameters_and_saves_keep_them(tmp_path):
    x = _blobs()
    gmm = GMM(2, covariance_type="full", **QUIET).fit(x, fixed={"weights": W, "means_": MU})
    log_likelihood = float(gmm.score_samples(x).sum())
    free = gmm.n_parameters - 1 - 4  # the weights' one and the means' four held
    assert gmm.bic(x) == pytest.approx(-2 * log_likelihood + free * np.log(len(x)), rel=1e-12)
    seqs = _sequences()
    left_right = torch.tensor([[0.6, 0.4], [0.0, 1.0]], dtype=F64)
    hmm = HMM(2, transition_pattern="left-right", **QUIET).fit(seqs, fixed={"transition": left_right})
    log_likelihood = float(hmm.score_samples(seqs).sum())
    expected = -2 * log_likelihood + 2 * (hmm.n_parameters - 1)  # one free transition in a 2-state left-right chain
    assert hmm.aic(seqs) == pytest.approx(expected, rel=1e-12)
    assert hmm.load(hmm.save(tmp_path / "hmm")).fixed_ == ("transition",)


def test_regression_emissions_take_frozen_transitions_and_a_frozen_fit_is_its_fixed_point():
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(20, 1)) for _ in range(3)]
    seqs = [2 * u + 0.3 * rng.normal(size=(20, 1)) + 3 * (np.arange(20)[:, None] // 5 % 2) for u in inputs]
    hmm = HMM(2, emission="linear_regression", tol=1e-10, max_iter=300, **QUIET).fit(seqs, inputs=inputs)
    held = HMM(2, emission="linear_regression", **QUIET).fit(seqs, inputs=inputs, fixed={"transition": A})
    assert torch.equal(held.transition_, A)
    emissions = {k: v for k, v in hmm._get_globals().items() if k not in ("initial", "transition")}
    frozen = HMM(2, emission="linear_regression", **QUIET).fit(seqs, inputs=inputs, fixed=emissions)
    assert frozen.score(seqs, inputs=inputs) == pytest.approx(hmm.score(seqs, inputs=inputs), rel=1e-8)
