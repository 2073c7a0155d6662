"""MixtureModel: a model written only as a Pyro program gets SVI, predictions and ArviZ."""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
from pyro.distributions import constraints

from ppmix import GMM, MixtureModel
from ppmix.models import latent_posterior
from ppmix.models._flat import FlatPrior
from tests.common import StudentTMixture, assert_close


class PlainGMM(MixtureModel):
    """A diagonal GMM written as a user would: only ``model``, no EM."""

    def model(self, x):
        k, d = self.n_components, x.shape[1]
        w = pyro.sample("weights", FlatPrior(constraints.simplex, (), (k,)))
        with pyro.plate("components", k):
            loc = pyro.sample("locs", FlatPrior(constraints.real, (k,), (d,)))
            scale = pyro.sample("scales", FlatPrior(constraints.positive, (k,), (d,)))
        with self._data_plate(x.shape[0]) as idx:
            z = pyro.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
            pyro.sample("x", dist.Normal(loc[z], scale[z]).to_event(1), obs=x[idx])


def two_groups(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 1, (n, 2)), rng.normal(3, 0.7, (n, 2))])


@pytest.fixture
def fitted_pair():
    """A GMM fitted by EM and the user-written PlainGMM set to the same parameters."""
    x = two_groups()
    gmm = GMM(2, seed=0, progress=False).fit(x)
    plain = PlainGMM(2, seed=0, progress=False).fit(x, engine="svi", num_steps=2, init=gmm._get_globals())
    plain._set_globals(gmm._get_globals())
    return x, gmm, plain


def test_generic_pointwise_log_likelihood_equals_exact_mixture(fitted_pair):
    x, gmm, plain = fitted_pair
    assert_close(plain.score_samples(x), gmm.score_samples(x), rtol=1e-10)
    assert plain.log_likelihood(x) == pytest.approx(gmm.log_likelihood(x), rel=1e-12)


def test_generic_posterior_from_compute_marginals_equals_responsibilities(fitted_pair):
    x, gmm, plain = fitted_pair
    assert_close(plain.predict_proba(x), gmm.predict_proba(x), atol=1e-10, rtol=0)
    assert_close(latent_posterior(plain, x)["z"], latent_posterior(gmm, x)["z"], atol=1e-10, rtol=0)
    assert (plain.predict(x) == gmm.predict(x)).all()


def test_generic_elbo_is_log_likelihood_under_flat_priors(fitted_pair):
    x, gmm, plain = fitted_pair
    assert plain.elbo(x) == pytest.approx(gmm.log_likelihood(x), rel=1e-12)


def test_user_model_without_em_rejects_engine_em():
    with pytest.raises(ValueError, match="engine='svi'"):
        PlainGMM(2, progress=False).fit(two_groups(), engine="em")
    with pytest.raises(ValueError, match="engine must be one of"):
        PlainGMM(2, progress=False).fit(two_groups(), engine="hmc")
    with pytest.raises(ValueError, match="engine='gibbs' needs conjugate priors.*PlainGMM has none"):
        PlainGMM(2, progress=False).fit(two_groups(), engine="gibbs")


def test_subclass_with_proper_priors_fits_by_svi_and_exports_arviz():
    rng = np.random.default_rng(1)
    x = two_groups(80, seed=1)
    x[:5] = rng.normal(0, 25, (5, 2))  # outliers
    model = StudentTMixture(2, df=3.0, seed=0).fit(x, engine="svi", num_steps=400, lr=0.05)
    locs = np.sort(model._get_globals()["loc"].numpy()[:, 0])
    assert_close(locs, [-3, 3], atol=0.5, rtol=0)
    idata = model.to_arviz(approximation=None)
    assert set(idata.posterior.data_vars) == {"weights", "loc", "scale"}
    assert idata.log_likelihood["x"].shape == (1, 1, len(x))
    draws = model.sample(7)
    assert draws["x"].shape == (7, 2) and draws["z"].shape == (7,)
    assert set(draws) == {"x", "z"}


def test_subclass_save_load_round_trip(tmp_path):
    x = two_groups()
    model = StudentTMixture(2, df=5.0, seed=0).fit(x, engine="svi", num_steps=50)
    model.save(tmp_path / "m")
    loaded = MixtureModel.load(tmp_path / "m")
    assert isinstance(loaded, StudentTMixture) and loaded.df == 5.0
    assert_close(loaded.score_samples(x), model.score_samples(x), rtol=0, atol=0)
    assert_close(loaded.predict_proba(x), model.predict_proba(x), rtol=0, atol=0)


def test_mcmc_on_subclass_with_proper_priors():
    x = two_groups(20)
    model = StudentTMixture(2, seed=0).fit(x, engine="mcmc", num_samples=10, warmup_steps=10)
    assert model.mcmc_samples_["loc"].shape == (2, 10, 2, 2)  # two chains by default
    assert model.to_arviz().log_likelihood["x"].shape == (2, 10, 40)


def test_get_params_reads_constructor_arguments():
    model = StudentTMixture(3, df=7.0, seed=4)
    assert model.get_params() == {"n_components": 3, "df": 7.0, "seed": 4, "progress": False}
    assert "df=7.0" in repr(model)
