"""Issue 40, items 2 and 3: ArviZ's workflow runs on the InferenceData of every model of the contract suite.

For each case of ``tests/models/test_contract.py`` (the same tiny fits): ``to_arviz()`` gives posterior draws (not
one point estimate), ``az.loo`` a finite ``elpd_loo``, ``az.plot_ppc`` draws the replicated data, and
``az.plot_energy`` runs where the draws come from NUTS; for draws without a Hamiltonian (Gibbs, the Laplace
approximation of a point fit) ``sample_stats`` holds the log joint density ``lp`` of every draw and its trace is
plotted instead (the issue's "Gibbs equivalent").

A few contract fits have no Laplace approximation, for a reason of the fit, not of the model (``NO_LAPLACE``): their
``to_arviz()`` warns (``PointEstimateWarning``) and names the fit that gives draws; the test checks that it names it
and then runs the same checks on that fit, so that every remedy the warning recommends here is exercised.

``PRESTO`` and ``RegularizedWeighting`` (``ppmix.inference``) are outside this test because they are outside the
contract suite: they are optimizers of a prediction loss, not generative models (no likelihood of the data, hence
no posterior, no pointwise log-likelihood for ``az.loo`` and nothing to replicate for ``az.plot_ppc``).
"""

from __future__ import annotations

import warnings

import matplotlib
import numpy as np
import pytest
import torch
from sklearn.base import clone

from ppmix import GMM, PFGMM, MixtureModel, MixtureOfExperts
from ppmix.datasets import make_pf_synthetic
from ppmix.models import PFGMMGibbs
from ppmix.models._arviz import PointEstimateWarning
from tests.models.test_contract import CASES

az = pytest.importorskip("arviz")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")

NUM_SAMPLES = 10
GIBBS = {"engine": "gibbs", "num_samples": 20, "warmup_steps": 10, "num_chains": 1}

#: contract case -> (why its fit has no Laplace approximation, the remedy the warning names, the refit's options)
NO_LAPLACE: dict[str, tuple[str, str, dict]] = {
    "HMM-bernoulli": ("a probability fitted at 0 or 1 (on the boundary)", "engine='gibbs'", GIBBS),
    "Mixture-categorical": ("a category's probability fitted at (nearly) 0", "engine='gibbs'", GIBBS),
    "HMM-categorical": ("a category's probability fitted at (nearly) 0", "engine='gibbs'", GIBBS),
    "HMM-left-right-MAP": ("the left-right transition's structural zero is on the boundary", "engine='gibbs'", GIBBS),
    "MoE-gaussian": (
        "the gate saturates (a flat direction: its Laplace draws ran off with log-likelihoods near -2e4)",
        "engine='svi' with guide='normal'",
        {"engine": "svi", "guide": "normal", "num_steps": 100, "lr": 0.05},
    ),
    "user-StudentT-svi": (
        "30 SVI steps end short of the optimum (the objective is not concave there)",
        "engine='svi' with guide='normal'",
        {"engine": "svi", "guide": "normal", "num_steps": 100, "lr": 0.05},
    ),
}


@pytest.fixture(scope="module")
def fitted():
    """``fitted(case_id, options) -> (model, X, y)``, each case fitted once per module and set of options."""
    cache: dict = {}

    def get(case_id: str, options: dict | None = None):
        key = (case_id, repr(options))
        if key not in cache:
            case = CASES[case_id]
            x, y = case.data()
            options = case.fit_options if options is None else options
            model = case.make()
            cache[key] = (model.fit(x, **options) if y is None else model.fit(x, y, **options), x, y)
        return cache[key]

    return get


def _inference_data(model):
    return model.to_arviz(num_samples=NUM_SAMPLES) if isinstance(model, MixtureModel) else model.to_arviz()


def check_arviz_workflow(idata) -> None:
    """``az.loo``, ``az.plot_ppc`` and ``az.plot_energy`` (NUTS) or the trace of ``lp`` run; ``lp`` is finite."""
    n_chains, n_draws = idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]
    assert n_chains * n_draws > 1, idata.attrs.get("ppmix_draws")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's Pareto-k warning on few draws
        loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo), loo
    try:
        assert az.plot_ppc(idata, num_pp_samples=5) is not None
        if "energy" in idata.sample_stats:
            assert az.plot_energy(idata) is not None
        else:
            lp = idata.sample_stats["lp"]
            assert lp.shape == (n_chains, n_draws) and np.isfinite(lp.values).all()
            assert az.plot_trace(idata.sample_stats, var_names=["lp"]) is not None
    finally:
        plt.close("all")


#: contract cases whose model has no Pyro program (EM only): no draws, no Laplace approximation, no replicated data;
#: their InferenceData holds the point estimate, and the warning says what to do instead
NO_PROGRAM = {"HSMM": "refit on bootstrap resamples", "HSMM-poisson-nonparametric": "refit on bootstrap resamples"}


@pytest.mark.parametrize("case_id", [c for c in CASES if c not in NO_LAPLACE and c not in NO_PROGRAM])
def test_loo_ppc_and_energy_or_lp_trace_run_on_the_inference_data(case_id, fitted):
    model, _, _ = fitted(case_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PointEstimateWarning)
        idata = _inference_data(model)
    check_arviz_workflow(idata)


@pytest.mark.parametrize("case_id", list(NO_LAPLACE))
def test_a_fit_without_laplace_names_a_remedy_that_works(case_id, fitted):
    reason, remedy, options = NO_LAPLACE[case_id]
    model, _, _ = fitted(case_id)
    with pytest.warns(PointEstimateWarning, match="no Laplace approximation") as record:
        model.to_arviz(num_samples=NUM_SAMPLES)
    assert remedy in str(record[0].message), (reason, str(record[0].message))
    refitted, _, _ = fitted(case_id, options)
    check_arviz_workflow(_inference_data(refitted))


def test_no_laplace_lists_contract_cases():
    assert set(NO_LAPLACE) <= set(CASES) and set(NO_PROGRAM) <= set(CASES)


@pytest.mark.parametrize("case_id", list(NO_PROGRAM))
def test_a_model_without_a_program_keeps_its_point_estimate_and_names_the_remedy(case_id, fitted):
    model, _, _ = fitted(case_id)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        idata = model.to_arviz(num_samples=NUM_SAMPLES)
    assert [w.category for w in record] == [PointEstimateWarning], [str(w.message) for w in record]
    assert "no Pyro program" in str(record[0].message) and NO_PROGRAM[case_id] in str(record[0].message)
    assert (idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]) == (1, 1)
    assert np.isfinite(idata.log_likelihood["x"].values).all()
    assert idata.posterior_predictive["x"].shape[:2] == (1, 1)  # the point estimate's replicated data


# ----------------------------------------------------------------------------------- item 2: the pf models
def test_pf_laplace_is_centred_on_the_fit_with_the_spread_of_the_data():
    """PFGMM's Laplace draws (its ELBO, the switches held at q(S)): centred on the fit; a component's mean of the
    relevant feature spread about scale / sqrt(phi N_k), the background's about its scale / sqrt(N) (fitted on every
    row); ``switch_probs`` the same in every draw."""
    rng = np.random.default_rng(0)
    z = np.arange(300) % 2  # two well-separated clusters on feature 0 (the label), noise on features 1 and 2
    x = np.c_[10.0 * z + rng.normal(size=300), 3.0 + 2.0 * rng.normal(size=(300, 2))]
    model = PFGMM(2, switch_prior=0.3, seed=0, progress=False).fit(x, z)
    assert model.relevant_features_.tolist() == [True, False, False]
    idata = model.to_arviz(num_samples=100)
    assert idata.attrs["ppmix_draws"] == "laplace"
    locs = idata.posterior["locs"].values[0, :, :, 0]  # (draw, component) on the relevant feature
    # the ELBO counts feature 0's component density phi_0 times (phi_0 = 0.69 here, not 1): its curvature too
    phi = float(model.switch_probs_[0])
    expected = model.components_.scale.numpy()[:, 0] / np.sqrt(phi * model.weights_.numpy() * 300)
    np.testing.assert_allclose(locs.std(0), expected, rtol=0.2)
    assert (np.abs(locs.mean(0) - model.components_.loc.numpy()[:, 0]) < 4 * expected / np.sqrt(100)).all()
    background = idata.posterior["background_loc"].values[0]
    np.testing.assert_allclose(background.std(0), model.background_.scale.numpy()[0] / np.sqrt(300), rtol=0.2)
    switch_probs = idata.posterior["switch_probs"].values[0]
    np.testing.assert_array_equal(switch_probs, np.broadcast_to(model.switch_probs_.numpy(), switch_probs.shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata)
    # elpd near the fit's log p(x); p_loo at most the number of parameters (1 + 2 x 3 x 2 + 2 + 3 x 2)
    assert loo.elpd_loo == pytest.approx(float(model.score_samples(x).sum()), abs=20)
    assert 2 < loo.p_loo < 21


def test_pf_gibbs_lp_is_the_log_joint_density_of_each_draw():
    from scipy import stats

    rng = np.random.default_rng(1)
    z = rng.integers(0, 2, 50)
    x = np.c_[4.0 * z + rng.normal(size=50), rng.normal(size=(50, 2))]
    model = PFGMMGibbs(2, switch_prior=0.4, alpha=2.0, num_samples=4, warmup_steps=10, seed=0).fit(x, z)
    idata = model.to_arviz()
    d, prior, i = model.draws_, model.prior_, 3
    on, assigned = d.switches[i], d.assignments[i]
    expected = on.sum() * np.log(0.4) + (~on).sum() * np.log(0.6) + stats.dirichlet.logpdf(d.weights[i], [2.0, 2.0])
    blocks = [(on, d.locs[i][k], d.covariances[i][k], assigned == k) for k in range(2)]
    blocks.append((~on, d.background_loc[i], d.background_covariance[i], np.ones(50, bool)))
    for coords, loc, cov, rows in blocks:
        block = cov[np.ix_(coords, coords)]
        iw = stats.invwishart.logpdf(block.squeeze(), df=coords.sum() + 2.0, scale=prior.psi * np.eye(coords.sum()))
        expected += iw + stats.multivariate_normal.logpdf(loc[coords], prior.mean[coords], block / prior.kappa)
        expected += stats.multivariate_normal.logpdf(x[rows][:, coords], loc[coords], block).sum()
    eta = d.label_probs[i][assigned]
    expected += np.log(d.weights[i])[assigned].sum() + np.where(z == 1, np.log(eta), np.log1p(-eta)).sum()
    assert idata.sample_stats["lp"].values[0, i] == pytest.approx(expected, rel=1e-10)
    assert idata.posterior_predictive["x"].shape == (1, 4, 50, 3)
    np.testing.assert_allclose(np.log(np.exp(idata.log_likelihood["x"].values[0]).mean(0)), model.score_samples(x))


# ------------------------------------------------------------------------------------ item 2: the MoE prior
@pytest.mark.parametrize("expert", ["logistic", "softmax"])
def test_moe_laplace_takes_the_ridge_as_a_gaussian_prior_and_stays_finite_on_near_separable_data(expert):
    """Near-separable classifying experts: the ridge (a N(0, 1 / ridge) prior on the standardised slopes, EM's
    objective) gives every slope curvature, so the Laplace draws are finite; the slopes' spread is at most the
    prior's sd (10 at the default ridge 1e-2). Softmax experts' reference class stays at zero in every draw (a
    shift of every class's coefficients would be a flat direction: spreads of 1e8 before)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, 2))
    y = (x[:, 0] > 0).astype(int)
    y[:2] = 1 - y[:2]
    moe = MixtureOfExperts(2, expert=expert, seed=0, progress=False).fit(x, y)
    target = moe._laplace_target(moe.prepare_data(x, y))
    assert float(target.log_density(target.values)) == pytest.approx(moe.lower_bound_ * 100, rel=1e-6)
    idata = moe.to_arviz(num_samples=50)
    assert idata.attrs["ppmix_draws"] == "laplace"
    slopes = np.concatenate([idata.posterior[v].values.reshape(50, -1) for v in ("gate_coef", "coef")], axis=1)
    assert np.isfinite(slopes).all() and (slopes.std(0) < 10.5).all()
    if expert == "softmax":
        assert (idata.posterior["coef"].values[..., -1, :] == 0).all()
        assert (idata.posterior["intercept"].values[..., -1] == 0).all()
        assert (idata.posterior["intercept"].std(("chain", "draw")).values[:, 0] < 50).all()


def test_moe_priors_give_the_laplace_approximation_the_warning_recommends(fitted):
    """The remedy the MoE's warning names first for a saturated gate: a proper prior (``priors={}``, MAP-EM) gives
    the contract case without a Laplace approximation one, on which the workflow runs; on near-separable logistic
    data, whose ridge-penalised fit's Laplace draws give ``az.loo`` a NaN elpd, it is finite."""
    model, x, y = fitted("MoE-gaussian")
    with pytest.warns(PointEstimateWarning, match=r"priors=\{\}"):
        model.to_arviz(num_samples=NUM_SAMPLES)
    refitted = clone(model).set_params(priors={}).fit(x, y)
    idata = _inference_data(refitted)
    assert idata.attrs["ppmix_draws"] == "laplace"
    check_arviz_workflow(idata)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, 2))
    y = (x[:, 0] > 0).astype(int)
    y[:2] = 1 - y[:2]
    moe = MixtureOfExperts(2, expert="logistic", priors={}, seed=0, progress=False).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's Pareto-k warning
        assert np.isfinite(az.loo(moe.to_arviz(num_samples=NUM_SAMPLES)).elpd_loo)


def test_point_estimate_warning_names_what_works_for_the_model():
    """The remedy is the model's: the pf models cannot be fitted by MCMC or a normal guide (not recommended); a
    conjugate mixture is pointed at engine='gibbs'."""
    data = make_pf_synthetic(60, n_relevant=1, n_features=2, seed=0)
    pf = PFGMM(2, switch_prior=0.5, seed=0, progress=False).fit(data.X, data.y)
    with pytest.warns(PointEstimateWarning) as record:
        pf.to_arviz(approximation=None)
    message = str(record[0].message)
    assert "approximation='laplace'" in message and "PFGMMGibbs" in message
    assert "fit with engine='mcmc'" not in message
    for engine in ("mcmc", "svi"):
        with pytest.raises(ValueError):
            PFGMM(2, switch_prior=0.5, progress=False).fit(data.X, data.y, engine=engine, guide="normal")
    gmm = GMM(2, seed=0, progress=False).fit(torch.randn(40, 2, generator=torch.Generator().manual_seed(0)))
    with pytest.warns(PointEstimateWarning, match="engine='gibbs'.*engine='mcmc'.*guide='normal'"):
        gmm.to_arviz(approximation=None)
