"""engine="gibbs": blocked Gibbs sweeps against the exact posterior of tiny models (every assignment or state
path enumerated, the conjugate globals integrated in closed form), FFBS against brute force, and the refusals."""

from __future__ import annotations

import itertools
import math
import warnings

import arviz as az
import numpy as np
import pytest
import torch
from scipy.special import gammaln

from ppmix import GMM, HMM, Mixture
from ppmix.algorithms.ffbs import filtered_marginals, sample_paths
from ppmix.algorithms.forward_backward import forward_backward
from ppmix.algorithms.simplex import dirichlet_draw, log_dirichlet

QUIET = {"seed": 0, "progress": False}


def _log_dirichlet_multinomial(counts: np.ndarray, alpha: float) -> float:
    """log of the integral of prod_k p_k^{n_k} over p ~ Dirichlet(alpha) (the counts' order fixed)."""
    k = counts.shape[-1]
    return float(
        gammaln(k * alpha) - gammaln(k * alpha + counts.sum()) + (gammaln(alpha + counts) - gammaln(alpha)).sum()
    )


def _log_poisson_gamma(x: np.ndarray, shape: float, rate: float) -> float:
    """log of the integral of prod_n Poisson(x_n | r) over r ~ Gamma(shape, rate)."""
    total, n = x.sum(), len(x)
    return float(
        shape * math.log(rate)
        - gammaln(shape)
        + gammaln(shape + total)
        - (shape + total) * math.log(rate + n)
        - gammaln(x + 1).sum()
    )


def _posterior_mean(log_weights: list[float], values: list[float]) -> float:
    w = np.exp(np.array(log_weights) - max(log_weights))
    return float(w @ np.array(values) / w.sum())


def _check_against_exact(draws: np.ndarray, exact: float) -> None:
    """The draws' mean (chains, draws) equals ``exact`` within five Monte Carlo standard errors (ArviZ's ESS)."""
    ess = float(az.ess(draws))
    standard_error = draws.std() / math.sqrt(ess)
    assert abs(draws.mean() - exact) < 5 * standard_error + 1e-3, (draws.mean(), exact, standard_error)


def check_poisson_mixture_draws(mix: Mixture, x: np.ndarray) -> None:
    """The draws of ``mix`` (a Poisson mixture fitted to ``x`` under the family's default priors, unrelabelled) have
    the exact posterior mean of ``sum_k w_k rate_k`` (label-free): from every assignment of the rows, each with its
    Dirichlet-multinomial and Poisson-Gamma marginals."""
    k = int(mix.n_components)
    prior_shape, prior_rate = 1.0, 1.0 / x.mean()  # the Poisson family's prior: Gamma(1, 1 / mean)
    log_weights, values = [], []
    for z in itertools.product(range(k), repeat=len(x)):
        z = np.array(z)
        counts = np.bincount(z, minlength=k)
        log_p = _log_dirichlet_multinomial(counts, 1.0)
        mean = 0.0
        for j in range(k):
            rows = x[z == j, 0]
            log_p += _log_poisson_gamma(rows, prior_shape, prior_rate)
            mean += (1 + counts[j]) / (k + len(x)) * (prior_shape + rows.sum()) / (prior_rate + len(rows))
        log_weights.append(log_p)
        values.append(mean)
    draws = (mix.mcmc_samples_["weights"] * mix.mcmc_samples_["rate"][..., 0]).sum(-1).numpy()
    _check_against_exact(draws, _posterior_mean(log_weights, values))


def test_poisson_mixture_draws_have_the_exact_posterior_predictive_mean():
    """K = 2 on five counts: E[sum_k w_k rate_k | x] (label-free) from the 2^5 assignments, each with its
    Dirichlet-multinomial and Poisson-Gamma marginals, equals the Gibbs draws' mean."""
    x = np.array([[0.0], [1.0], [4.0], [7.0], [2.0]])
    k = 2
    mix = Mixture(k, family="poisson", seed=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mix.fit(x, engine="gibbs", num_samples=2500, warmup_steps=100, num_chains=4, relabel=False)
    check_poisson_mixture_draws(mix, x)


def test_poisson_hmm_draws_have_the_exact_posterior_mean_of_the_first_step():
    """Two sequences of three counts, K = 2, transition_prior 2: E[sum_k initial_k rate_k | x] from the 2^6
    state paths (Dirichlet-multinomial initial and transition rows, Poisson-Gamma emissions) equals the
    Gibbs draws' mean."""
    seqs = [np.array([[0.0], [5.0], [6.0]]), np.array([[1.0], [0.0], [7.0]])]
    k, alpha = 2, 2.0
    hmm = HMM(k, emission="poisson", transition_prior=alpha, seed=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm.fit(seqs, engine="gibbs", num_samples=2500, warmup_steps=100, num_chains=4, relabel=False)
    frames = np.concatenate(seqs)[:, 0]
    prior_shape, prior_rate = 1.0, 1.0 / frames.mean()
    log_weights, values = [], []
    for flat in itertools.product(range(k), repeat=6):
        paths = np.array(flat).reshape(2, 3)
        first = np.bincount(paths[:, 0], minlength=k)
        log_p = _log_dirichlet_multinomial(first, 1.0)
        pairs = np.zeros((k, k))
        for path in paths:
            for a, b in zip(path[:-1], path[1:]):
                pairs[a, b] += 1
        log_p += sum(_log_dirichlet_multinomial(row, alpha) for row in pairs)
        states = paths.ravel()
        mean = 0.0
        for j in range(k):
            rows = frames[states == j]
            log_p += _log_poisson_gamma(rows, prior_shape, prior_rate)
            mean += (1 + first[j]) / (k + 2) * (prior_shape + rows.sum()) / (prior_rate + len(rows))
        log_weights.append(log_p)
        values.append(mean)
    draws = (hmm.mcmc_samples_["initial"] * hmm.mcmc_samples_["rate"][..., 0]).sum(-1).numpy()
    _check_against_exact(draws, _posterior_mean(log_weights, values))


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_gaussian_draws_have_the_exact_posterior_means_of_one_component(covariance_type):
    """K = 1 on twelve points (D = 1): the posterior means of the mean and the variance under the family's prior
    (``N(m0, s0^2)`` times ``InverseGamma(a, b)``), by quadrature on a fine grid, equal the Gibbs draws' means."""
    x = np.random.default_rng(2).normal(1.0, 2.0, (12, 1))
    gmm = GMM(1, covariance_type=covariance_type, seed=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gmm.fit(x, engine="gibbs", num_samples=3000, warmup_steps=100, num_chains=4)
    family, scale = gmm._component_family(), gmm._scale
    opts = {"dtype": torch.float64}
    loc_prior = family.priors().prior("locs", 1, 1, scale, opts).base_dist
    shape, rate = (float(v.reshape(-1)[0]) for v in family.priors()._variance_prior(scale["std"].to(**opts)))
    m0, s0 = float(loc_prior.loc[0]), float(loc_prior.scale[0])
    mu = np.linspace(x.mean() - 5, x.mean() + 5, 801)[:, None]
    log_var = np.linspace(np.log(0.2), np.log(60.0), 801)[None, :]
    var = np.exp(log_var)
    log_post = (
        -0.5 * ((mu - m0) / s0) ** 2
        - (shape + 1) * log_var
        - rate / var
        + log_var  # the inverse gamma in log variance (its Jacobian)
        - 0.5 * len(x) * log_var
        - 0.5 * ((x[:, 0][:, None, None] - mu[None]) ** 2).sum(0) / var
    )
    weight = np.exp(log_post - log_post.max())
    weight /= weight.sum()
    _check_against_exact(gmm.mcmc_samples_["locs"][..., 0, 0].numpy(), float((weight * mu).sum()))
    variance = gmm.mcmc_samples_["scales"].reshape(4, 3000).square().numpy()
    _check_against_exact(variance, float((weight * var).sum()))


@pytest.mark.parametrize("varying", [False, True], ids=["shared", "time-varying"])
def test_ffbs_draws_paths_with_their_exact_posterior_probabilities(varying):
    """Every path of a 2-state, 3-step sequence (and a padded 2-step one) is drawn as often as its
    posterior probability p(z | x) says, and the log-likelihood is the sum over paths; with transitions that vary
    over the steps too (an input-driven chain's), and the filtered marginals of the last step are the smoothed
    ones."""
    torch.manual_seed(0)
    log_init = torch.tensor([0.3, 0.7], dtype=torch.float64).log()
    trans = torch.tensor([[0.8, 0.2], [0.4, 0.6]], dtype=torch.float64)
    steps = torch.stack([trans, trans.flip(1), trans.flip(0)]) if varying else trans.expand(3, 2, 2)  # into step t
    emit = torch.randn(2, 3, 2, dtype=torch.float64)
    lengths = torch.tensor([3, 2])
    n = 20000
    log_trans = steps.log().expand(2 * n, 3, 2, 2) if varying else trans.log().expand(2 * n, 2, 2)
    paths, log_lik = sample_paths(log_init.expand(2 * n, 2), log_trans, emit.repeat(n, 1, 1), lengths.repeat(n))
    filtered = filtered_marginals(log_init.expand(2, 2), log_trans[:2], emit, lengths)
    smoothed = forward_backward(log_init, log_trans[:2], emit, lengths).posterior
    for b, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(filtered[b, length - 1], smoothed[b, length - 1], rtol=1e-12, atol=1e-12)
    for b, length in enumerate(lengths.tolist()):
        joint = {}
        for z in itertools.product(range(2), repeat=length):
            lp = log_init[z[0]] + emit[b, 0, z[0]]
            for t in range(1, length):
                lp = lp + steps[t, z[t - 1], z[t]].log() + emit[b, t, z[t]]
            joint[z] = float(lp)
        total = float(torch.logsumexp(torch.tensor(list(joint.values()), dtype=torch.float64), 0))
        assert float(log_lik[b]) == pytest.approx(total, rel=1e-12)
        drawn = paths[b::2]
        assert bool((drawn[:, length - 1 :] == drawn[:, length - 1 : length]).all())  # padding repeats the end
        for z, lp in joint.items():
            share = float((drawn[:, :length] == torch.tensor(z)).all(1).double().mean())
            p = math.exp(lp - total)
            assert share == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n) + 1e-9), z


def test_ffbs_takes_the_log_space_path_where_scaled_products_underflow():
    """State 0 is the only one reachable (identity transitions from it), and step 1 emits 2000 nats less under it
    than under the unreachable state: the scaled filter's normaliser underflows; the log-space one gives the exact
    log-likelihood and the only possible path."""
    log_init = torch.tensor([0.0, -math.inf], dtype=torch.float64)[None]
    log_trans = torch.tensor([[0.0, -math.inf], [-math.inf, 0.0]], dtype=torch.float64)[None]
    emit = torch.tensor([[[-1.0, 0.0], [-2000.0, 0.0], [-0.5, 0.0]]], dtype=torch.float64)
    paths, log_lik = sample_paths(log_init, log_trans, emit, torch.tensor([3]))
    assert paths.tolist() == [[0, 0, 0]] and float(log_lik[0]) == pytest.approx(-2001.5, rel=1e-14)


def test_dirichlet_helpers_draw_and_score_on_the_allowed_entries():
    torch.manual_seed(0)
    allowed = torch.tensor([True, False, True])
    draws = dirichlet_draw(torch.tensor([2.0, 5.0, 1.0], dtype=torch.float64).expand(40000, 3), allowed)
    assert bool((draws[:, 1] == 0).all())
    assert draws[:, 0].mean().item() == pytest.approx(2 / 3, abs=0.01)  # Dirichlet(2, 1) on the allowed pair
    p = torch.tensor([0.25, 0.0, 0.75], dtype=torch.float64)
    expected = math.log(math.gamma(3) / (math.gamma(2) * math.gamma(1)) * 0.25)
    assert float(log_dirichlet(p, torch.tensor([2.0, 5.0, 1.0], dtype=torch.float64), allowed)) == pytest.approx(
        expected, rel=1e-12
    )


def test_gibbs_fit_is_reproducible_and_gives_arviz_its_draws_and_agreeing_chains():
    rng = np.random.default_rng(0)
    x = np.r_[rng.binomial(1, 0.1, (60, 4)), rng.binomial(1, 0.9, (60, 4))].astype(float)
    fits = [
        Mixture(2, family="bernoulli", seed=3, progress=False).fit(x, engine="gibbs", num_samples=300, warmup_steps=50)
        for _ in range(2)
    ]
    torch.testing.assert_close(fits[0].mcmc_samples_["probs"], fits[1].mcmc_samples_["probs"], rtol=0, atol=0)
    model = fits[0]
    assert model.engine_ == "gibbs" and model.gibbs_log_joint_.shape == (4, 300)
    assert max(model.mcmc_diagnostics_["r_hat"].values()) < 1.01
    em = Mixture(2, family="bernoulli", seed=3, progress=False).fit(x)  # the posterior means near the MLE
    np.testing.assert_allclose(np.sort(model.means_.numpy(), 0), np.sort(em.means_.numpy(), 0), atol=0.03)
    idata = model.to_arviz()
    assert idata.attrs["ppmix_draws"] == "gibbs"
    assert dict(idata.posterior.sizes)["chain"] == 4 and dict(idata.posterior.sizes)["draw"] == 300


def test_gibbs_refuses_families_without_a_conjugate_prior_and_replaced_programs():
    x = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match="'gaussian' family with covariance_type='full' has not.*engine='mcmc'"):
        GMM(2, covariance_type="full", seed=0, progress=False).fit(x, engine="gibbs", num_samples=2, warmup_steps=1)

    class Replaced(Mixture):
        def model(self, x):
            return super().model(x)

        def _e_step(self, data):
            return super()._e_step(data)

        def _get_globals(self):
            return super()._get_globals()

        def _set_globals(self, values):
            super()._set_globals(values)

        def _pointwise_log_likelihood(self, *args, **kwargs):
            return super()._pointwise_log_likelihood(*args, **kwargs)

    counts = np.random.default_rng(0).poisson(3.0, (20, 1)).astype(float)
    with pytest.raises(TypeError, match="Replaced replaces model\\(\\): engine='gibbs'"):
        Replaced(2, family="poisson", seed=0, progress=False).fit(counts, engine="gibbs", num_samples=2)
    with pytest.raises(ValueError, match="sample_weight is taken by engine='em' only"):
        Mixture(2, family="poisson", progress=False).fit(counts, engine="gibbs", sample_weight=np.ones(20))
    holed = np.c_[counts, counts]
    holed[3, 0] = np.nan
    with pytest.raises(ValueError, match="missing entries .*for EM"):
        Mixture(2, family="poisson", missing="marginalize", progress=False).fit(holed, engine="gibbs")
    with pytest.raises(ValueError, match="missing entries .*for EM"):
        HMM(2, emission="poisson", missing="marginalize", progress=False).fit([holed], engine="gibbs")


def test_a_strong_prior_pins_the_gibbs_draws_at_its_mean():
    """``priors=`` is the prior Gibbs draws under: Gamma(7e5, 1e5) on the rates, Dirichlet(1e5) on the weights
    and N(2, 1e-3) on the Gaussian means hold the draws at 7, 1/2 and 2 whatever the data say."""
    counts = np.random.default_rng(0).poisson(np.repeat([[2.0], [9.0]], 30, axis=0))
    priors = {"weights": 1e5, "rate_concentration": 7e5, "rate_rate": 1e5}
    rows = np.random.default_rng(1).normal(size=(60, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mix = Mixture(2, family="poisson", priors=priors, seed=0, progress=False)
        mix.fit(counts, engine="gibbs", num_samples=100, warmup_steps=20, num_chains=2)
        gmm = GMM(2, priors={"locs_loc": 2.0, "locs_scale": 1e-3}, seed=0, progress=False)
        gmm.fit(rows, engine="gibbs", num_samples=100, warmup_steps=20, num_chains=2)
    assert float(mix.mcmc_samples_["rate"].mean()) == pytest.approx(7.0, abs=0.02)
    assert float(mix.mcmc_samples_["weights"].mean()) == pytest.approx(0.5, abs=0.01)
    assert float(gmm.mcmc_samples_["locs"].mean()) == pytest.approx(2.0, abs=1e-3)
    # every default named (an HMM's too) is the prior of priors=None: the same draws, bit for bit
    seqs = [counts[i : i + 10] for i in range(0, 60, 10)]
    for model, data, defaults in [
        (Mixture(2, family="poisson"), counts, {"weights": 1.0, "rate_concentration": 1.0}),
        (HMM(2, emission="poisson"), seqs, {"initial": 1.0, "transition": 1.0, "rate_rate": 1 / counts.mean()}),
    ]:
        draws = []
        for priors in (None, defaults):
            model.set_params(priors=priors, seed=0, progress=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                draws.append(
                    model.fit(data, engine="gibbs", num_samples=10, warmup_steps=5, num_chains=2).mcmc_samples_
                )
        for site, values in draws[0].items():
            torch.testing.assert_close(draws[1][site], values, rtol=0, atol=0)


def test_lognormal_gibbs_draws_are_the_diagonal_gaussians_on_log_x():
    """The log-normal family's prior is the diagonal Gaussian's on ``log x``, conjugate there: its Gibbs draws (a
    Mixture's and an HMM's) are those of the Gaussian components fitted to the logarithms, from the same seed."""
    rng = np.random.default_rng(0)
    x = np.exp(np.concatenate([rng.normal(1.0, 0.5, (40, 2)), rng.normal(3.0, 0.5, (40, 2))]))
    sweeps = {"engine": "gibbs", "num_samples": 30, "warmup_steps": 10, "num_chains": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = [
            (Mixture(2, family="lognormal", **QUIET).fit(x, **sweeps), Mixture(2, **QUIET).fit(np.log(x), **sweeps)),
            (
                HMM(2, emission="lognormal", **QUIET).fit([x[:50], x[50:]], **sweeps),
                HMM(2, **QUIET).fit([np.log(x[:50]), np.log(x[50:])], **sweeps),
            ),
        ]
    for lognormal, gaussian in pairs:
        for site, twin in (("loc", "locs"), ("scale", "scales")):
            torch.testing.assert_close(lognormal.mcmc_samples_[site], gaussian.mcmc_samples_[twin], rtol=0, atol=1e-8)
