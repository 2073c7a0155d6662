"""ArviZ beyond point estimates (issue 21, item 2): posterior_predictive and prior groups, ``az.plot_ppc``
after MCMC and after SVI with a normal guide, and what a point fit (EM) says about ``az.loo``."""

import warnings

import matplotlib
import numpy as np
import pytest
import torch

from ppmix import GMM, HMM, Mixture, MixtureOfExperts
from ppmix.models._arviz import PointEstimateWarning, build_inference_data
from ppmix.viz import plot_energy

az = pytest.importorskip("arviz")
matplotlib.use("Agg")


def _three_groups(n=90, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]])[np.arange(n) % 3] + rng.normal(size=(n, 2))


@pytest.fixture(scope="module")
def mcmc_gmm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GMM(3, seed=0, progress=False).fit(
            _three_groups(), engine="mcmc", num_samples=20, warmup_steps=20, num_chains=2
        )


def test_mcmc_inference_data_has_replicated_data_and_the_prior(mcmc_gmm):
    idata = mcmc_gmm.to_arviz()
    assert {"posterior_predictive", "prior", "prior_predictive"} <= set(idata.groups())
    assert idata.posterior_predictive["x"].shape == (2, 20, 90, 2)
    assert idata.prior["locs"].shape == (1, 100, 3, 2)
    assert idata.prior_predictive["x"].shape == (1, 100, 90, 2)
    assert idata.attrs["ppmix_draws"] == "mcmc"
    # each replicate comes from its own draw of the globals: the replicated means follow the posterior's
    replicated = idata.posterior_predictive["x"].values.reshape(40, 90, 2)
    assert np.isfinite(replicated).all()
    assert abs(replicated.mean() - _three_groups().mean()) < 0.5
    # the prior is the proper prior MCMC samples under: wider than the posterior
    assert float(idata.prior["locs"].std()) > 5 * float(idata.posterior["locs"].std(dim=("chain", "draw")).max())
    ax = az.plot_ppc(idata, num_pp_samples=10)
    assert ax is not None


def test_mcmc_inference_data_has_sample_stats_for_energy_plots_and_loo(mcmc_gmm):
    """Issue 40, item 3: ``az.bfmi``, ``az.plot_energy`` and ``az.loo`` on the InferenceData of ``engine="mcmc"``."""
    idata = mcmc_gmm.to_arviz(num_samples=5)
    stats = idata.sample_stats
    names = {"lp", "energy", "diverging", "n_steps", "tree_depth", "step_size", "acceptance_rate"}
    assert names <= set(stats.data_vars)
    assert all(stats[name].shape == (2, 20) for name in names)
    assert (
        stats["diverging"].dtype == bool and int(stats["diverging"].sum()) == mcmc_gmm.mcmc_diagnostics_["divergences"]
    )
    assert ((stats["acceptance_rate"] >= 0) & (stats["acceptance_rate"] <= 1)).all()
    bfmi = az.bfmi(idata)
    assert bfmi.shape == (2,) and np.isfinite(bfmi).all() and (bfmi > 0).all()
    assert az.plot_energy(idata) is not None
    assert plot_energy(idata) is not None  # ppmix's passes NUTS draws on to ArviZ
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's Pareto-k warning on 40 draws
        loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and loo.n_samples == 40
    assert (az.summary(idata, var_names=["weights"])["r_hat"] > 0).all()  # r_hat needs the two chains


def test_svi_normal_guide_supports_plot_ppc_and_loo():
    gmm = GMM(3, seed=0, progress=False).fit(_three_groups(), engine="svi", num_steps=150, guide="normal")
    idata = gmm.to_arviz(num_samples=30)
    assert idata.posterior_predictive["x"].shape == (1, 30, 90, 2)
    assert idata.attrs["ppmix_draws"] == "svi_normal_guide"
    az.plot_ppc(idata, num_pp_samples=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's Pareto-k warning on 30 draws
        loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo)


def test_az_loo_works_after_em_by_default():
    """What a user does after EM: ``az.loo(model.to_arviz())``; the default draws from the Laplace approximation."""
    gmm = GMM(3, seed=0, progress=False).fit(_three_groups())
    with warnings.catch_warnings():
        warnings.simplefilter("error", PointEstimateWarning)
        idata = gmm.to_arviz(num_samples=50)
    assert idata.attrs["ppmix_draws"] == "laplace"
    assert idata.posterior["locs"].shape == (1, 50, 3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isfinite(az.loo(idata).elpd_loo)


def test_point_estimate_says_az_loo_needs_draws_and_why_there_are_none(monkeypatch):
    gmm = GMM(3, seed=0, progress=False).fit(_three_groups())
    with pytest.warns(PointEstimateWarning, match=r"az\.loo.*need posterior draws.*engine='mcmc'.*guide='normal'"):
        idata = gmm.to_arviz(approximation=None)
    assert idata.attrs["ppmix_draws"] == "point_estimate"
    assert "az.loo" in idata.attrs["ppmix_note"]
    assert idata.posterior["locs"].shape == (1, 1, 3, 2)
    assert idata.posterior_predictive["x"].shape == (1, 1, 90, 2)
    # "auto" above the parameter budget (here 14 parameters > 10): the point estimate, with the reason
    monkeypatch.setattr("ppmix.models._arviz.AUTO_LAPLACE_MAX_PARAMETERS", 10)
    with pytest.warns(PointEstimateWarning, match=r"no Laplace approximation: GMM has 14 unconstrained parameters"):
        assert gmm.to_arviz().posterior["locs"].shape == (1, 1, 3, 2)
    assert gmm.to_arviz(approximation="laplace", num_samples=5).posterior["locs"].shape == (1, 5, 3, 2)


def test_laplace_approximation_gives_a_point_fit_draws_that_az_loo_accepts():
    x = _three_groups(150)
    gmm = GMM(3, seed=0, progress=False).fit(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PointEstimateWarning)
        idata = build_inference_data(gmm, gmm.prepare_data(x), num_samples=200, approximation="laplace")
    assert idata.attrs["ppmix_draws"] == "laplace"
    locs = idata.posterior["locs"]
    assert locs.shape == (1, 200, 3, 2)
    # centred on the maximum-likelihood means, spread about sigma / sqrt(N_k) = 1 / sqrt(50)
    np.testing.assert_allclose(locs.mean(dim="draw").values[0], gmm.means_.numpy(), atol=0.05)
    np.testing.assert_allclose(locs.std(dim="draw").values[0], 1 / np.sqrt(50), rtol=0.35)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata)
    # p_loo, the effective number of parameters, near the model's 14 (2 weights, 6 means, 6 scales)
    assert np.isfinite(loo.elpd_loo) and 8 < loo.p_loo < 20
    assert loo.elpd_loo == pytest.approx(gmm.score(x) * 150, abs=25)


def test_laplace_is_refused_clearly_where_it_does_not_exist():
    """A Bernoulli probability fitted at 1 (a feature always on in a component) is on the boundary: no Laplace
    approximation; the refusal names the fits that give draws for this model (engine='gibbs' first)."""
    x = np.repeat([[1.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0, 1.0]], 30, axis=0)
    x[::3, 1] = 1 - x[::3, 1]  # feature 1 noisy; the others separate the components exactly (EM reaches the clamp)
    mix = Mixture(2, family="bernoulli", seed=0, progress=False).fit(x)
    with pytest.raises(ValueError, match="not strictly concave.*for posterior draws, fit with engine='gibbs'"):
        build_inference_data(mix, mix.prepare_data(x), approximation="laplace")
    with pytest.warns(PointEstimateWarning, match="no Laplace approximation: the fitted objective is not strictly"):
        assert mix.to_arviz().attrs["ppmix_draws"] == "point_estimate"  # the default falls back, saying why
    with pytest.raises(ValueError, match="approximation must be one of"):
        build_inference_data(mix, mix.prepare_data(x), approximation="nuts")


def test_hmm_replicates_frames_and_moe_replicates_the_target():
    rng = np.random.default_rng(0)
    seqs = [rng.normal(size=(int(rng.integers(5, 9)), 2)) for _ in range(6)]
    hmm = HMM(2, seed=0, progress=False).fit(seqs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PointEstimateWarning)
        idata = hmm.to_arviz(approximation=None, log_likelihood_dtype="float64")
    frames = sum(len(s) for s in seqs)
    assert idata.log_likelihood["x"].dims == ("chain", "draw", "sequence")  # one log-likelihood per sequence
    np.testing.assert_allclose(idata.log_likelihood["x"].values[0, 0], hmm.score_samples(seqs), rtol=1e-10)
    assert idata.observed_data["x"].shape == (frames, 2)
    assert idata.posterior_predictive["x"].shape == (1, 1, frames, 2)
    assert idata.prior["transition"].shape == (1, 100, 2, 2)
    np.testing.assert_allclose(idata.prior["transition"].values.sum(-1), 1.0)
    x = rng.normal(size=(80, 2))
    y = 2 * x[:, 0] + 0.1 * rng.normal(size=80)
    moe = MixtureOfExperts(2, seed=0, progress=False).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PointEstimateWarning)
        idata = moe.to_arviz(x, y, approximation=None)
    replicated = idata.posterior_predictive["y"].values[0, 0]
    assert replicated.shape == (80,)
    assert np.corrcoef(replicated, y)[0, 1] > 0.9  # replicated given the same X


def test_to_arviz_is_reproducible_and_leaves_the_global_rng_alone(mcmc_gmm):
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    first = mcmc_gmm.to_arviz()
    assert torch.equal(torch.rand(1), expected)
    second = mcmc_gmm.to_arviz()
    np.testing.assert_array_equal(first.posterior_predictive["x"].values, second.posterior_predictive["x"].values)
    np.testing.assert_array_equal(first.prior["locs"].values, second.prior["locs"].values)


def test_gibbs_inference_data_has_the_log_joint_as_lp():
    counts = np.random.default_rng(0).poisson(np.repeat([[2.0], [9.0]], 30, axis=0))
    mix = Mixture(2, family="poisson", seed=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mix.fit(counts, engine="gibbs", num_samples=20, warmup_steps=10, num_chains=2)
        idata = mix.to_arviz(num_samples=5)
        loo = az.loo(idata)
    assert idata.attrs["ppmix_draws"] == "gibbs"
    np.testing.assert_array_equal(idata.sample_stats["lp"].values, mix.gibbs_log_joint_.numpy())
    assert idata.sample_stats["lp"].shape == (2, 20) and np.isfinite(loo.elpd_loo)


def test_the_prior_group_draws_from_the_priors_as_set():
    counts = np.random.default_rng(0).poisson(np.repeat([[2.0], [9.0]], 30, axis=0))
    priors = {"weights": [1.0, 50.0], "rate_concentration": 4e4, "rate_rate": 1e4}  # rates about 4 +- 0.02
    mix = Mixture(2, family="poisson", priors=priors, seed=0, progress=False).fit(counts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prior = mix.to_arviz(num_samples=200, approximation=None).prior
    assert float(prior["rate"].mean()) == pytest.approx(4.0, abs=0.01)
    assert float(prior["rate"].std()) == pytest.approx(0.02, rel=0.2)
    assert float(prior["weights"].mean(dim=("chain", "draw"))[1]) == pytest.approx(50 / 51, abs=0.01)


def test_laplace_after_map_em_is_of_the_posterior():
    """One Poisson rate: in ``u = log rate`` the log posterior under ``Gamma(a, b)`` is ``(a - 1 + S) u - (b + n)
    e^u`` (``S`` the sum of the counts), so at the MAP the Laplace precision of ``u`` is ``a - 1 + S``; without
    ``priors`` (maximum likelihood, flat) it is ``S``. The draws use the same normal noise for both fits (the
    model's seed), so their variances are in the ratio ``S / (a - 1 + S)`` exactly."""
    x = np.random.default_rng(0).poisson(4.0, size=(100, 1)).astype(float)
    priors = {"rate_concentration": 400.0, "rate_rate": 100.0}
    spread = []
    for setting in (None, priors):
        mix = Mixture(1, family="poisson", priors=setting, seed=0, progress=False).fit(x)
        idata = mix.to_arviz(num_samples=20, approximation="laplace")
        spread.append(np.log(idata.posterior["rate"].values.ravel()).var())
    assert spread[1] / spread[0] == pytest.approx(x.sum() / (x.sum() + 399.0), rel=1e-6)


def test_svi_with_priors_is_map_em():
    """With ``priors`` set, SVI's point-mass guide maximises the log posterior, as MAP-EM does: one Poisson rate at
    ``(S + a - 1) / (n + b)``."""
    x = np.random.default_rng(0).poisson(4.0, size=(100, 1)).astype(float)
    priors = {"rate_concentration": 400.0, "rate_rate": 100.0}
    em = Mixture(1, family="poisson", priors=priors, seed=0, progress=False).fit(x)
    svi = Mixture(1, family="poisson", priors=priors, seed=0, progress=False).fit(x, engine="svi", num_steps=300)
    want = (x.sum() + 399.0) / (100 + 100.0)
    assert float(em.components_.rate) == pytest.approx(want, rel=1e-10)
    assert float(svi.components_.rate) == pytest.approx(want, rel=1e-4)
