"""``to_arviz`` computes what is asked (``groups=``, ``thin=``, ``log_likelihood_dtype=``, ``predictive_draws=``),
labels approximate draws where ArviZ users look, and works with ``az.plot_loo_pit``; ``az.bfmi`` refuses draws
without a Hamiltonian."""

import warnings

import matplotlib
import numpy as np
import pytest
import torch

from ppmix import GMM, Mixture
from ppmix.models._arviz import _flat, pointwise_draws
from ppmix.models._arviz_options import DEFAULT_GROUPS
from ppmix.viz import plot_energy

matplotlib.use("Agg")
az = pytest.importorskip("arviz")


@pytest.fixture(scope="module")
def gibbs_gmm():
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(-3, 1, (40, 2)), rng.normal(3, 1, (40, 2))]
    return GMM(2, covariance_type="diag", seed=0, progress=False).fit(
        x, engine="gibbs", num_samples=40, warmup_steps=20, num_chains=2
    )


@pytest.fixture(scope="module")
def em_poisson():
    x = np.r_[np.random.default_rng(1).poisson(2.0, (60, 1)), np.random.default_rng(2).poisson(12.0, (60, 1))]
    return Mixture(2, family="poisson", seed=0, progress=False).fit(x)


def test_default_groups_and_float32_log_likelihood(gibbs_gmm):
    idata = gibbs_gmm.to_arviz()
    assert set(idata.groups()) == set(DEFAULT_GROUPS)  # discrete_posterior only when asked
    assert idata.log_likelihood["x"].dtype == np.float32
    exact = gibbs_gmm.to_arviz(groups=["log_likelihood"], log_likelihood_dtype="float64").log_likelihood["x"]
    assert exact.dtype == np.float64
    np.testing.assert_allclose(idata.log_likelihood["x"].values, exact.values, rtol=1e-6)
    assert idata.log_likelihood["x"].dims == ("chain", "draw", "obs_id")
    assert idata.observed_data["x"].dims == ("obs_id", "feature")


def test_groups_and_thin_build_only_what_is_asked(gibbs_gmm):
    idata = gibbs_gmm.to_arviz(groups=["log_likelihood", "discrete_posterior"], thin=4)
    assert set(idata.groups()) == {"posterior", "log_likelihood", "discrete_posterior"}
    assert idata.posterior["locs"].shape == (2, 10, 2, 2)
    np.testing.assert_array_equal(idata.posterior["locs"].values, gibbs_gmm.mcmc_samples_["locs"][:, ::4].numpy())
    np.testing.assert_allclose(idata.discrete_posterior["z_probs"].values.sum(-1), 1.0, atol=1e-12)
    assert set(gibbs_gmm.to_arviz(groups=[]).groups()) == {"posterior"}


def test_batched_log_likelihood_equals_the_per_draw_one(gibbs_gmm):
    """The blocked scoring of every draw (one ``log_prob`` per block) against each draw's globals set in turn."""
    data = gibbs_gmm._train_data
    draws = _flat(gibbs_gmm.mcmc_samples_)
    loglik, marginals = pointwise_draws(gibbs_gmm, data, draws, marginals=True)
    with gibbs_gmm._parameters_restored():
        for i in (0, 17, len(loglik) - 1):
            gibbs_gmm._set_globals({k: v[i] for k, v in draws.items()})
            np.testing.assert_allclose(loglik[i], gibbs_gmm._pointwise_log_likelihood(data).numpy(), rtol=1e-12)
            np.testing.assert_allclose(marginals["z"][i], gibbs_gmm._posterior_marginals(data)["z"].numpy(), atol=1e-14)


def test_predictive_draws_subset_names_the_draws(gibbs_gmm):
    idata = gibbs_gmm.to_arviz(groups=["posterior_predictive"], predictive_draws=4)
    assert idata.posterior_predictive["x"].shape == (2, 4, 80, 2)
    np.testing.assert_array_equal(idata.posterior_predictive["draw"].values, [0, 10, 20, 30])
    assert "predictive_draws='all'" in idata.posterior_predictive.attrs["ppmix_note"]
    assert gibbs_gmm.to_arviz(groups=["posterior_predictive"]).posterior_predictive["x"].shape == (2, 40, 80, 2)


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"groups": "posterior"}, TypeError, "list of group names"),
        ({"groups": ["posterior", "energy"]}, ValueError, r"unknown \['energy'\]"),
        ({"thin": 0}, ValueError, "thin must be >= 1"),
        ({"log_likelihood_dtype": "float16"}, ValueError, "log_likelihood_dtype must be one of"),
        ({"predictive_draws": "some"}, TypeError, "predictive_draws"),
    ],
)
def test_bad_options_are_named(gibbs_gmm, options, error, match):
    with pytest.raises(error, match=match):
        gibbs_gmm.to_arviz(**options)


@pytest.mark.parametrize("feature", [0, 1])
def test_plot_loo_pit_works_on_a_feature(gibbs_gmm, feature):
    import matplotlib.pyplot as plt

    idata = gibbs_gmm.to_arviz()
    y = idata.observed_data["x"][:, feature]
    y_hat = idata.posterior_predictive["x"][..., feature].stack(__sample__=("chain", "draw"))
    pit = az.loo_pit(idata, y=y, y_hat=y_hat)
    assert pit.shape == (80,) and bool(((pit >= 0) & (pit <= 1)).all())
    assert az.plot_loo_pit(idata, y=y, y_hat=y_hat) is not None
    plt.close("all")


def test_plot_loo_pit_on_one_dimensional_data(em_poisson):
    import matplotlib.pyplot as plt

    idata = em_poisson.to_arviz(approximation="laplace", num_samples=50)
    y_hat = idata.posterior_predictive["x"][..., 0].stack(__sample__=("chain", "draw"))
    assert az.plot_loo_pit(idata, y=idata.observed_data["x"][:, 0], y_hat=y_hat) is not None
    plt.close("all")


def test_laplace_draws_are_labelled_and_have_no_flat_prior_group(em_poisson):
    idata = em_poisson.to_arviz(approximation="laplace", num_samples=30)
    for group in (idata.posterior, idata.sample_stats):
        assert group.attrs["approximation"] == "laplace"
        assert "not of the posterior" in group.attrs["ppmix_draws_are"]
    assert "Laplace approximation" in repr(idata.posterior)  # what printing the group shows
    assert "prior" not in idata.groups() and "prior_predictive" not in idata.groups()
    assert idata.attrs["ppmix_prior"].startswith("flat")
    with pytest.raises(ValueError, match="prior is flat"):
        em_poisson.to_arviz(approximation="laplace", num_samples=30, groups=["prior"])


def test_laplace_after_map_em_keeps_the_prior_it_is_taken_under():
    x = np.r_[np.random.default_rng(1).poisson(2.0, (60, 1)), np.random.default_rng(2).poisson(12.0, (60, 1))]
    mix = Mixture(2, family="poisson", priors={}, seed=0, progress=False).fit(x)
    idata = mix.to_arviz(approximation="laplace", num_samples=30)
    assert {"prior", "prior_predictive"} <= set(idata.groups())
    assert idata.posterior.attrs["approximation"] == "laplace"
    assert idata.attrs["ppmix_prior"].startswith("the priors set with priors=")


def test_posterior_draws_are_not_labelled_approximate(gibbs_gmm):
    idata = gibbs_gmm.to_arviz(groups=["sample_stats"])
    assert "approximation" not in idata.posterior.attrs
    assert idata.posterior.attrs["ppmix_draws"] == "gibbs"


@pytest.mark.parametrize("fit", ["gibbs", "laplace"])
def test_energy_diagnostics_refuse_draws_without_a_hamiltonian(gibbs_gmm, em_poisson, fit):
    idata = gibbs_gmm.to_arviz() if fit == "gibbs" else em_poisson.to_arviz(approximation="laplace", num_samples=20)
    assert "lp" in idata.sample_stats and "energy" not in idata.sample_stats
    assert "az.bfmi and az.plot_energy are for Hamiltonian samplers" in idata.sample_stats.attrs["ppmix_note"]
    with pytest.raises(TypeError, match="Energy variable was not found"):
        az.bfmi(idata)
    with pytest.raises(AttributeError, match="energy"):
        az.plot_energy(idata)
    with pytest.raises(ValueError, match=f"draws of '{fit}' have no Hamiltonian energy.*engine='mcmc'"):
        plot_energy(idata)  # ppmix's says why
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert az.plot_trace(idata.sample_stats, var_names=["lp"]) is not None  # the documented stand-in
    import matplotlib.pyplot as plt

    plt.close("all")


def test_mixture_replicates_from_each_draw():
    """The batched replicated data of a draw are that draw's mixture: a draw with all weight on one component
    replicates that component only."""
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(-5, 0.5, (50, 1)), rng.normal(5, 0.5, (50, 1))]
    gmm = GMM(2, covariance_type="diag", seed=0, progress=False).fit(x)
    draws = {k: torch.stack([v, v]) for k, v in gmm._get_globals().items()}
    draws["weights"] = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    replicated = gmm._draws_replicated(gmm._train_data, draws)["x"]
    locs = gmm._get_globals()["locs"][:, 0]
    for draw in range(2):
        assert abs(float(replicated[draw].mean()) - float(locs[draw])) < 0.3


@pytest.mark.parametrize("covariance_type", ["full", "tied", "spherical"])
def test_batched_log_likelihood_for_every_covariance(covariance_type):
    """Blocks of draws stack the components along their axis; a tied covariance (one for all) is scored a draw at
    a time: both equal each draw's own scoring."""
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(-3, 1, (30, 2)), rng.normal(3, 1, (30, 2))]
    gmm = GMM(2, covariance_type=covariance_type, seed=0, progress=False).fit(x)
    data = gmm._train_data
    draws = {k: torch.stack([v, v * 1.01 if k != "weights" else v]) for k, v in gmm._get_globals().items()}
    loglik, _ = pointwise_draws(gmm, data, draws, marginals=False)
    with gmm._parameters_restored():
        for i in range(2):
            gmm._set_globals({k: v[i] for k, v in draws.items()})
            np.testing.assert_allclose(loglik[i], gmm._pointwise_log_likelihood(data).numpy(), rtol=1e-12)
