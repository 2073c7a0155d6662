"""GMM: one objective, three engines; known answers from scikit-learn and planted data."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from pyro.infer import TraceEnum_ELBO
from sklearn.mixture import GaussianMixture

from ppmix import GMM
from ppmix.engines.params import local_params
from ppmix.inference import ConvergenceWarning
from tests.common import DEVICES, assert_close

COV_TYPES = ["diag", "full", "spherical", "tied"]


def planted(n=600, seed=0):
    """Three well-separated clusters with known weights, means and (diagonal) scales."""
    rng = np.random.default_rng(seed)
    weights = np.array([0.5, 0.3, 0.2])
    means = np.array([[-5.0, 0.0, 1.0], [4.0, 4.0, -2.0], [0.0, -6.0, 5.0]])
    scales = np.array([[1.0, 0.5, 0.8], [0.6, 1.2, 0.7], [0.9, 0.9, 0.4]])
    z = rng.choice(3, size=n, p=weights)
    x = means[z] + scales[z] * rng.normal(size=(n, 3))
    return x, z, weights, means, scales


def random_globals(gmm: GMM, k: int, d: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    values = {
        "weights": torch.distributions.Dirichlet(torch.ones(k, dtype=torch.float64)).sample(),
        "locs": torch.randn(k, d, generator=g, dtype=torch.float64) * 3,
        "scales": torch.rand(k, d, generator=g, dtype=torch.float64) + 0.5,
    }
    if gmm.covariance_type == "spherical":
        values["scales"] = values["scales"][:, 0]
    if gmm.covariance_type in ("full", "tied"):
        a = torch.randn(*(() if gmm.covariance_type == "tied" else (k,)), d, d, generator=g, dtype=torch.float64)
        cov = a @ a.mT + torch.eye(d, dtype=torch.float64)
        tril = torch.linalg.cholesky(cov)
        values["scales"] = tril.square().sum(-1).sqrt()
        values["corr_cholesky"] = tril / values["scales"][..., None]
    return values


@pytest.mark.parametrize("cov", COV_TYPES)
def test_em_objective_equals_pyro_trace_enum_elbo(cov):
    x, *_ = planted(200)
    gmm = GMM(3, covariance_type=cov, seed=0, progress=False, max_iter=3).fit(x)
    for values in (gmm._get_globals(), random_globals(gmm, 3, 3)):
        gmm._set_globals(values)
        data = gmm.prepare_data(x)
        _, em_objective = gmm._e_step(gmm._em_data(data))
        with local_params():
            pyro_elbo = -TraceEnum_ELBO(max_plate_nesting=1).loss(gmm.model, gmm.guide, data)
        assert_close(em_objective, pyro_elbo, rtol=1e-10)
        assert_close(gmm.elbo(x), pyro_elbo, rtol=1e-12)


@pytest.mark.parametrize("cov", COV_TYPES)
def test_em_never_decreases_log_likelihood(cov):
    x, *_ = planted(300, seed=3)
    gmm = GMM(3, covariance_type=cov, seed=1, init_params="random", warm_start=True, max_iter=1, progress=False)
    values = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(25):
            gmm.fit(x)
            values.append(gmm.score(x))
    assert np.all(np.diff(values) >= -1e-10), values
    assert values[-1] > values[0]
    assert np.all(np.diff(gmm.history_) >= -1e-10)


@pytest.mark.parametrize("cov", ["diag", "full"])  # the planted scales differ between features and components
def test_em_recovers_planted_parameters(cov):
    x, z, weights, means, scales = planted(4000, seed=2)
    gmm = GMM(3, covariance_type=cov, seed=0, progress=False).fit(x)
    est_means = gmm.means_.numpy()
    perm = min(itertools.permutations(range(3)), key=lambda p: np.abs(est_means[list(p)] - means).sum())
    perm = list(perm)
    assert_close(est_means[perm], means, atol=0.1, rtol=0)
    assert_close(gmm.weights_.numpy()[perm], weights, atol=0.03, rtol=0)
    variances = gmm.covariances_.numpy()
    if cov == "full":
        variances = np.diagonal(variances, axis1=1, axis2=2)
    assert_close(np.sqrt(variances[perm]), scales, atol=0.08, rtol=0)
    assert (gmm.predict(x) == np.array(perm)[z]).mean() > 0.99  # estimated perm[k] plays planted k


@pytest.mark.parametrize("cov", COV_TYPES)
def test_log_likelihood_matches_scikit_learn(cov):
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(-2, 1, (300, 4)), rng.normal(2, 0.7, (300, 4)), rng.normal(0, 2, (200, 4))])
    ours = GMM(3, covariance_type=cov, n_init=3, tol=1e-10, max_iter=500, seed=0, progress=False).fit(x)
    sk = GaussianMixture(3, covariance_type=cov, n_init=3, tol=1e-8, max_iter=500, random_state=0).fit(x)
    assert ours.score(x) >= sk.score(x) - 1e-3
    # at scikit-learn's parameters our log-density is scikit-learn's
    values = {"weights": torch.tensor(sk.weights_), "locs": torch.tensor(sk.means_)}
    if cov in ("diag", "spherical"):
        values["scales"] = torch.tensor(np.sqrt(sk.covariances_))
    else:
        tril = torch.linalg.cholesky(torch.tensor(sk.covariances_))
        values["scales"] = tril.square().sum(-1).sqrt()
        values["corr_cholesky"] = tril / values["scales"][..., None]
    ours._set_globals(values)
    assert_close(ours.score_samples(x), sk.score_samples(x), rtol=1e-9, atol=1e-9)
    assert_close(ours.predict_proba(x), sk.predict_proba(x), atol=1e-9, rtol=0)


def test_svi_reaches_em_log_likelihood():
    x, *_ = planted(400, seed=4)
    em = GMM(3, seed=0, progress=False).fit(x)
    svi = GMM(3, seed=0, progress=False).fit(x, engine="svi", num_steps=800, lr=0.05)
    assert svi.engine_ == "svi" and len(svi.history_) == svi.n_iter_
    assert abs(svi.score(x) - em.score(x)) <= 0.01 * abs(em.score(x))


def test_svi_with_minibatches_improves_the_elbo():
    x, *_ = planted(600, seed=6)
    gmm = GMM(3, seed=0, init_params="random", progress=False)
    gmm.fit(x, engine="svi", num_steps=300, batch_size=64, lr=0.05)
    history = np.array(gmm.history_)
    assert history[-50:].mean() > history[:10].mean()
    assert np.isfinite(gmm.score(x))


def test_mcmc_returns_inference_data_accepted_by_arviz():
    az = pytest.importorskip("arviz")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-3, 1, (25, 1)), rng.normal(3, 1, (25, 1))])
    gmm = GMM(2, seed=0, progress=False).fit(x, engine="mcmc", num_samples=20, warmup_steps=20)
    idata = gmm.to_arviz(groups=["log_likelihood", "observed_data", "discrete_posterior"])
    assert {"posterior", "log_likelihood", "observed_data", "discrete_posterior"} <= set(idata.groups())
    assert idata.posterior["locs"].shape == (2, 20, 2, 1)  # two chains by default
    assert idata.log_likelihood["x"].shape == (2, 20, 50)
    probs = idata.discrete_posterior["z_probs"].values
    assert_close(probs.sum(-1), np.ones((2, 20, 50)), atol=1e-9)
    summary = az.summary(idata, var_names=["weights", "locs"])
    assert len(summary) == 4 and np.isfinite(summary["mean"]).all()
    # point estimates are the posterior means and still separate the two groups
    assert sorted(np.round(gmm.means_.numpy().ravel())) == pytest.approx([-3, 3], abs=1.0)


def test_em_to_arviz_has_single_draw_and_pointwise_log_likelihood():
    x, *_ = planted(100)
    gmm = GMM(3, seed=0, progress=False).fit(x)
    idata = gmm.to_arviz(approximation=None)
    assert idata.posterior["weights"].shape == (1, 1, 3)
    assert_close(idata.log_likelihood["x"].values[0, 0], gmm.score_samples(x))


def test_svi_normal_guide_gives_posterior_spread():
    x, *_ = planted(200)
    gmm = GMM(3, seed=0, progress=False).fit(x, engine="svi", num_steps=200, guide="normal")
    idata = gmm.to_arviz(num_samples=8)
    assert idata.posterior["locs"].shape == (1, 8, 3, 3)
    assert float(idata.posterior["locs"].std(dim="draw").mean()) > 0


@pytest.mark.parametrize("cov", COV_TYPES)
def test_same_seed_same_result(cov):
    x, *_ = planted(300)
    a = GMM(3, covariance_type=cov, n_init=2, seed=7, progress=False).fit(x)
    b = GMM(3, covariance_type=cov, n_init=2, seed=7, progress=False).fit(x)
    assert a.history_ == b.history_
    assert_close(a.means_, b.means_, rtol=0, atol=0)
    s1 = GMM(3, seed=7, progress=False).fit(x, engine="svi", num_steps=30, batch_size=50)
    s2 = GMM(3, seed=7, progress=False).fit(x, engine="svi", num_steps=30, batch_size=50)
    assert s1.history_ == s2.history_


@pytest.mark.parametrize(("cov", "n_init"), [(cov, 1) for cov in COV_TYPES] + [("full", 3)])
def test_em_leaves_ordinary_tensors_that_autograd_and_in_place_updates_may_use(cov, n_init):
    """EM runs under ``torch.inference_mode`` (``GMM.em_inference_mode``); the parameters it leaves on the model, and
    the shared index tensors it caches, are ordinary tensors: no parameter is an inference tensor, in-place updates
    work, and so does a gradient through ``log_prob`` (which indexes with the cached upper triangle)."""
    x = np.random.default_rng(0).normal(size=(60, 3))
    gmm = GMM(2, covariance_type=cov, n_init=n_init, seed=0, progress=False).fit(x)
    components = gmm.components_
    params = {"weights": gmm.weights_, **{name: getattr(components, name) for name in components.param_names}}
    assert not [name for name, value in params.items() if value.is_inference()]
    gmm.weights_.mul_(1.0)
    components.loc.mul_(1.0)
    free = {name: params[name].detach().clone().requires_grad_(True) for name in components.param_names}
    for name, value in free.items():
        setattr(components, name, value)
    grads = torch.autograd.grad(components.log_prob(torch.as_tensor(x)).sum(), list(free.values()))
    assert all(torch.isfinite(grad).all() for grad in grads)


def test_an_error_mid_em_leaves_ordinary_tensors(monkeypatch):
    """An exception (or interrupt) inside EM's inference mode: the parameters left on the model are not inference
    tensors, so in-place updates and autograd still work on them."""
    x = np.random.default_rng(0).normal(size=(60, 3))
    gmm = GMM(2, seed=0, progress=False).fit(x)
    calls, e_step = [], GMM._e_step

    def failing_e_step(self, data):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return e_step(self, data)

    monkeypatch.setattr(GMM, "_e_step", failing_e_step)
    with pytest.raises(RuntimeError, match="interrupted"):
        gmm.fit(x)
    components = gmm.components_
    values = {"weights": gmm.weights_, **{name: getattr(components, name) for name in components.param_names}}
    assert not [name for name, value in values.items() if value.is_inference()]
    gmm.weights_.mul_(1.0)


def test_restarts_keep_the_best_objective():
    x, *_ = planted(300, seed=8)
    singles = [GMM(3, init_params="random", seed=s, progress=False, max_iter=5) for s in (0, 1, 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        best = GMM(3, init_params="random", n_init=3, seed=0, progress=False, max_iter=5).fit(x)
        scores = [m.fit(x).score(x) for m in singles]
    assert best.score(x) == pytest.approx(max(scores), rel=1e-12)


def test_convergence_warning_when_max_iter_is_hit():
    x, *_ = planted(200)
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        gmm = GMM(3, init_params="random", max_iter=2, tol=0.0, seed=0, progress=False).fit(x)
    assert not gmm.converged_ and gmm.n_iter_ == 2


def test_bic_prefers_the_planted_number_of_components():
    x, *_ = planted(600)
    bics = [GMM(k, seed=0, progress=False).fit(x).bic(x) for k in (1, 2, 3, 4, 5)]
    assert int(np.argmin(bics)) + 1 == 3
    sk = GaussianMixture(3, covariance_type="diag", random_state=0).fit(x)
    ours = GMM(3, seed=0, progress=False).fit(x)
    k, d = 3, x.shape[1]
    assert ours.n_parameters == (k - 1) + k * d + k * d  # weights, means, diagonal variances
    # scikit-learn's public bic = -2 N mean log-lik + p log N gives its parameter count p
    sk_count = (sk.bic(x) + 2 * len(x) * sk.score(x)) / np.log(len(x))
    assert ours.n_parameters == pytest.approx(sk_count, abs=1e-6)


def test_sample_draws_from_the_fitted_mixture():
    x, *_ = planted(2000)
    gmm = GMM(3, seed=0, progress=False).fit(x)
    draws = gmm.sample(20000)
    assert draws["x"].shape == (20000, 3) and draws["z"].shape == (20000,)
    counts = np.bincount(draws["z"], minlength=3) / 20000
    assert_close(counts, gmm.weights_.numpy(), atol=0.015, rtol=0)
    for k in range(3):
        assert_close(draws["x"][draws["z"] == k].mean(0), gmm.means_[k].numpy(), atol=0.1, rtol=0)


def test_dataframe_feature_names_are_kept_and_checked():
    pd = pytest.importorskip("pandas")
    x, *_ = planted(200)
    df = pd.DataFrame(x, columns=["a", "b", "c"])
    gmm = GMM(3, seed=0, progress=False).fit(df)
    assert gmm.feature_names_in_ == ["a", "b", "c"]
    assert gmm.predict(df).shape == (200,)
    with pytest.raises(ValueError, match="column names"):
        gmm.predict(df.rename(columns={"a": "z"}))


def test_tensor_in_tensor_out_numpy_in_numpy_out():
    x, *_ = planted(100)
    gmm = GMM(3, seed=0, progress=False).fit(x)
    assert isinstance(gmm.predict_proba(x), np.ndarray)
    out = gmm.predict_proba(torch.as_tensor(x))
    assert isinstance(out, torch.Tensor)
    assert_close(out, gmm.predict_proba(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_fit_on_device_and_dtype(device, dtype):
    x, *_ = planted(500)
    gmm = GMM(3, seed=0, device=device, dtype=dtype, progress=False).fit(x)
    assert gmm.means_.device.type == device and gmm.means_.dtype == dtype
    ref = GMM(3, seed=0, progress=False).fit(x)
    assert gmm.score(x) == pytest.approx(ref.score(x), abs=1e-3)


def test_to_arviz_leaves_the_fit_untouched():
    x, *_ = planted(150)
    gmm = GMM(3, covariance_type="full", seed=0, progress=False).fit(x, engine="svi", num_steps=50, guide="normal")
    guide, before = gmm.variational_guide_, gmm.score_samples(x)
    assert guide is not None
    gmm.to_arviz(num_samples=3)
    assert gmm.variational_guide_ is guide
    assert_close(gmm.score_samples(x), before, rtol=0, atol=0)


@pytest.mark.parametrize("cov", COV_TYPES)
def test_default_start_on_more_rows_than_its_sample_finds_the_planted_clusters(cov, monkeypatch):
    """Beyond START_SAMPLE_ROWS rows the k-means start runs on a subsample and assigns every row once;
    the fit still finds the planted partition and scikit-learn's optimum."""
    import ppmix.algorithms.kmeans as kmeans_module

    monkeypatch.setattr(kmeans_module, "START_SAMPLE_ROWS", 200)
    monkeypatch.setattr(kmeans_module, "START_ROWS_PER_COMPONENT", 10)
    x, z, *_ = planted(n=3000, seed=3)
    gmm = GMM(3, covariance_type=cov, seed=0, progress=False).fit(x)
    sk = GaussianMixture(3, covariance_type=cov, tol=1e-8, random_state=0).fit(x)
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(z, gmm.predict(x)) == pytest.approx(1.0)
    assert gmm.score(x) == pytest.approx(sk.score(x), abs=1e-4)


def test_variance_floor_on_many_rows_comes_from_a_fixed_sample_and_scales_with_the_data(monkeypatch):
    """The floor's robust spread uses SCALE_SAMPLE_ROWS rows drawn with a fixed seed: the same for every
    model seed, close to the exact spread, and multiplied by c^2 when the data are multiplied by c."""
    import ppmix.components.gaussian_family as gaussian_components

    x = np.random.default_rng(0).standard_t(3, size=(5000, 2)) * [1.0, 10.0]
    exact = gaussian_components.relative_floor(torch.as_tensor(x), 1e-2)
    monkeypatch.setattr(gaussian_components, "SCALE_SAMPLE_ROWS", 1000)
    floors = [GMM(2, seed=seed, reg_covar=1e-2, progress=False).fit(x)._data_scale["floor"] for seed in (0, 1)]
    assert torch.equal(floors[0], floors[1])
    assert_close(floors[0], exact, rtol=0.15, atol=0)
    scaled = GMM(2, seed=0, reg_covar=1e-2, progress=False).fit(x * 8.0)._data_scale["floor"]
    assert_close(scaled, floors[0] * 64.0, rtol=1e-12, atol=0)


@pytest.mark.parametrize("cov", COV_TYPES)
def test_every_em_iteration_equals_scikit_learns_from_the_same_start(cov):
    """From the same weights, means and covariances (no floor on either side), ppmix's EM and scikit-learn's
    ``GaussianMixture`` take the same steps: parameters after 1, 2 and 5 M-steps equal to 1e-8 relative."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(-2, 1, (150, 3)), rng.normal(2, 0.6, (150, 3)), rng.normal(0, 2.5, (100, 3))])
    start = GMM(3, covariance_type=cov, reg_covar=0.0, max_iter=1, seed=3, progress=False).fit(x)
    covariance = start.covariances_.numpy()
    precisions = 1 / covariance[:, 0] if cov == "spherical" else 1 / covariance if cov == "diag" else None
    precisions = np.linalg.inv(covariance) if cov == "full" else precisions
    precisions = np.linalg.inv(covariance[0]) if cov == "tied" else precisions
    for steps in (1, 2, 5):
        ours = GMM(3, covariance_type=cov, reg_covar=0.0, warm_start=True, tol=0.0, max_iter=steps, progress=False)
        ours.fit(x, max_iter=1)
        ours._set_globals(start._get_globals())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours.fit(x)
            sk = GaussianMixture(
                3,
                covariance_type=cov,
                reg_covar=0.0,
                tol=0.0,
                max_iter=steps,
                weights_init=start.weights_.numpy(),
                means_init=start.means_.numpy(),
                precisions_init=precisions,
            ).fit(x)
        sk_covariances = sk.covariances_[:, None].repeat(3, 1) if cov == "spherical" else sk.covariances_
        sk_covariances = np.broadcast_to(sk.covariances_, (3, 3, 3)) if cov == "tied" else sk_covariances
        assert_close(ours.weights_, sk.weights_, rtol=1e-8, atol=1e-12)
        assert_close(ours.means_, sk.means_, rtol=1e-8, atol=1e-12)
        assert_close(ours.covariances_, sk_covariances, rtol=1e-8, atol=1e-12)
        assert ours.score(x) == pytest.approx(sk.score(x), rel=1e-10)


# ------------------------------------------------------------------ priors= and MAP-EM
@pytest.mark.parametrize("cov", ["diag", "spherical"])
def test_map_em_of_one_gaussian_is_the_fixed_point_of_its_conditional_modes(cov):
    """K = 1: the fit satisfies ``loc = (m0 / s0^2 + n xbar / v) / (1 / s0^2 + n / v)`` and ``v = (2 b + S + n (xbar
    - loc)^2) / (2 a + 2 + n)`` (spherical: summed over the features, ``2 a + 2 + n D``), and its objective is the
    log-likelihood plus the log prior of the means and variances."""
    x = planted(60)[0]
    n, d = x.shape
    m0, s0, a, b = np.array([1.0, -2.0, 0.5]), 0.7, 4.0, 3.0
    priors = {"locs_loc": m0, "locs_scale": s0, "variance_concentration": a, "variance_rate": b}
    gmm = GMM(1, covariance_type=cov, priors=priors, tol=1e-14, max_iter=1000, seed=0, progress=False).fit(x)
    loc, var = gmm.means_[0].numpy(), gmm.covariances_[0].numpy()
    xbar, scatter = x.mean(0), ((x - x.mean(0)) ** 2).sum(0)
    np.testing.assert_allclose(loc, (m0 / s0**2 + n * xbar / var) / (1 / s0**2 + n / var), rtol=1e-7)
    squares = scatter + n * (xbar - loc) ** 2
    want = (2 * b + squares.sum()) / (2 * a + 2 + n * d) if cov == "spherical" else (2 * b + squares) / (2 * a + 2 + n)
    np.testing.assert_allclose(var, np.broadcast_to(want, (d,)), rtol=1e-7)
    v = var[:1] if cov == "spherical" else var
    log_prior = torch.distributions.Normal(torch.tensor(m0), s0).log_prob(torch.tensor(loc)).sum()
    inverse_gamma = torch.distributions.InverseGamma(
        torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    )
    log_prior += inverse_gamma.log_prob(torch.tensor(v)).sum()
    assert gmm.history_[-1] * n == pytest.approx(gmm.log_likelihood(x) + float(log_prior), rel=1e-10)
    assert np.all(np.diff(gmm.history_) >= -1e-12)


@pytest.mark.parametrize("cov", COV_TYPES)
def test_map_em_weights_are_the_dirichlet_mode_and_a_strong_prior_pins_the_means(cov):
    x = planted(300)[0]
    ml = GMM(3, covariance_type=cov, seed=0, progress=False).fit(x)
    gmm = GMM(3, covariance_type=cov, priors={"weights": 101.0}, seed=0, progress=False).fit(x)
    counts = gmm.predict_proba(x).sum(0)  # at convergence, the responsibilities' totals
    np.testing.assert_allclose(gmm.weights_.numpy(), (counts + 100) / (300 + 3 * 100), rtol=1e-4)
    assert gmm.weights_.numpy().std() < ml.weights_.numpy().std()  # pulled towards equal weights
    pinned = GMM(2, covariance_type=cov, priors={"locs_loc": 3.0, "locs_scale": 1e-4}, seed=0, progress=False).fit(x)
    np.testing.assert_allclose(pinned.means_.numpy(), 3.0, atol=1e-3)


def correlated(n=400, shift=3.0, seed=0):
    """Two clusters with correlated features (the full and tied covariances' MAP-EM tests)."""
    rng = np.random.default_rng(seed)
    z = rng.choice(2, size=n, p=[0.6, 0.4])
    means = np.array([[0.0, 0.0, 0.0], [1.0, 0.5, -0.5]]) * shift
    trils = np.array([[[1.0, 0, 0], [0.8, 0.6, 0], [-0.3, 0.2, 0.5]], [[0.7, 0, 0], [-0.5, 1.0, 0], [0.1, 0.4, 0.9]]])
    return means[z] + np.einsum("nij,nj->ni", trils[z], rng.normal(size=(n, 3))), z


def log_posterior_gradient(gmm, x):
    """The largest gradient entry of log-likelihood plus the components' log prior (``map_log_prior``) by autograd,
    over the unconstrained coordinates of the program's sites: the means, the log scales and
    ``biject_to(corr_cholesky).inv(corr_cholesky)`` (the weights held)."""
    family = gmm._prior_family()
    values = family.site_values(gmm.components_)
    corr = torch.distributions.biject_to(torch.distributions.constraints.corr_cholesky)
    free = [values["locs"], values["scales"].log(), corr.inv(values["corr_cholesky"])]
    free = [value.detach().clone().requires_grad_(True) for value in free]
    components = family.components(
        {"locs": free[0], "scales": free[1].exp(), "corr_cholesky": corr(free[2])}, gmm._scale
    )
    log_likelihood = torch.logsumexp(components.log_prob(torch.as_tensor(x)) + gmm.weights_.log(), 1).sum()
    log_posterior = log_likelihood + family.priors().map_log_prior(components, x.shape[1], gmm._scale)
    return max(float(g.abs().max()) for g in torch.autograd.grad(log_posterior, free))


@pytest.mark.parametrize("cov", ["full", "tied"])
def test_map_em_of_full_and_tied_covariances_is_monotone_and_converges_to_a_stationary_point(cov):
    """Generalised EM (the means in closed form, Newton steps on the covariances under the LKJ and inverse-gamma
    priors): the objective (log-likelihood plus log prior) never decreases, and where EM stops the gradient of the
    log posterior vanishes (at the maximum-likelihood fit it does not)."""
    x = correlated()[0]
    priors = {"locs_scale": 2.0, "variance_rate": 0.5, "corr_concentration": 3.0, "weights": 2.0}
    gmm = GMM(2, covariance_type=cov, priors=priors, tol=1e-12, max_iter=200, seed=0, progress=False).fit(x)
    assert gmm.converged_ and gmm.n_iter_ > 10
    assert np.all(np.diff(gmm.history_) >= -1e-12 * abs(gmm.history_[-1]))
    assert log_posterior_gradient(gmm, x) < 1e-3
    ml = GMM(2, covariance_type=cov, priors=priors, seed=0, progress=False)
    ml.components_, ml.weights_ = GMM(2, covariance_type=cov, seed=0, progress=False).fit(x).components_, gmm.weights_
    assert log_posterior_gradient(ml, x) > 1.0
    # the objective is the log posterior: the weights' Dirichlet(2) and the components' map_log_prior
    family = gmm._prior_family()
    log_prior = torch.distributions.Dirichlet(torch.full((2,), 2.0, dtype=torch.float64)).log_prob(gmm.weights_)
    log_prior = log_prior + family.priors().map_log_prior(gmm.components_, 3, gmm._scale)
    assert gmm.history_[-1] * len(x) == pytest.approx(gmm.log_likelihood(x) + float(log_prior), rel=1e-10)


@pytest.mark.parametrize("cov", ["full", "tied"])
def test_map_em_of_full_and_tied_covariances_between_a_weak_and_a_strong_prior(cov):
    """A prior worth almost nothing gives the maximum-likelihood fit (up to the ``O(1 / n)`` of the inverse-gamma's
    ``v^-1`` and the LKJ Cholesky density's Jacobian); a prior worth 1e5 rows pins the means at its ``m0 = 3`` and
    the covariances at its mode ``2 I`` (variances ``b / (a + 1) = 2``, correlations 0 under ``eta = 1e5``)."""
    x = correlated(2000)[0]
    ml = GMM(2, covariance_type=cov, tol=1e-10, seed=0, progress=False).fit(x)
    weak = {"locs_scale": 1e3, "variance_concentration": 1e-3, "variance_rate": 1e-8, "corr_concentration": 1.0}
    gmm = GMM(2, covariance_type=cov, priors=weak, tol=1e-10, seed=0, progress=False).fit(x)
    np.testing.assert_allclose(gmm.means_.numpy(), ml.means_.numpy(), atol=3e-3)
    np.testing.assert_allclose(gmm.covariances_.numpy(), ml.covariances_.numpy(), atol=1.5e-2)
    a = 1e5
    strong = {"locs_loc": 3.0, "locs_scale": 1e-4, "variance_concentration": a, "variance_rate": 2 * (a + 1)}
    gmm = GMM(2, covariance_type=cov, priors={**strong, "corr_concentration": a}, seed=0, progress=False).fit(x)
    np.testing.assert_allclose(gmm.means_.numpy(), 3.0, atol=1e-4)
    np.testing.assert_allclose(gmm.covariances_.numpy(), np.broadcast_to(2.0 * np.eye(3), (2, 3, 3)), atol=0.15)


def test_map_em_of_one_tied_component_is_map_em_of_one_full_component():
    x = correlated()[0]
    priors = {"locs_scale": 2.0, "variance_rate": 0.5, "corr_concentration": 3.0}
    full = GMM(1, covariance_type="full", priors=priors, tol=1e-12, seed=0, progress=False).fit(x)
    tied = GMM(1, covariance_type="tied", priors=priors, tol=1e-12, seed=0, progress=False).fit(x)
    np.testing.assert_allclose(tied.history_, full.history_, rtol=1e-12)
    np.testing.assert_allclose(tied.covariances_.numpy(), full.covariances_.numpy(), rtol=1e-12)


def test_default_priors_leave_em_maximum_likelihood_and_are_kept_by_clone_and_save(tmp_path):
    from sklearn.base import clone

    x = planted(200)[0]
    ml = GMM(2, seed=0, progress=False).fit(x)
    assert GMM(2, seed=0, progress=False).get_params()["priors"] is None
    np.testing.assert_array_equal(GMM(2, priors=None, seed=0, progress=False).fit(x).means_.numpy(), ml.means_.numpy())
    priors = {"locs_loc": np.array([0.0, 1.0, 2.0]), "variance_rate": 0.2, "weights": 3.0}  # 0.2: no float32 trip
    gmm = GMM(2, priors=priors, seed=0, progress=False)
    copied = clone(gmm)
    assert copied.priors is not priors and copied.priors["variance_rate"] == 0.2
    gmm.fit(x)
    np.testing.assert_allclose(copied.fit(x).means_.numpy(), gmm.means_.numpy(), rtol=1e-12)
    gmm.save(tmp_path / "m")
    loaded = GMM.load(tmp_path / "m")
    assert loaded.priors == {"locs_loc": [0.0, 1.0, 2.0], "variance_rate": 0.2, "weights": 3.0}
    np.testing.assert_allclose(loaded.fit(x).means_.numpy(), gmm.means_.numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "cov, priors, match",
    [
        ("diag", {"corr_concentration": 2.0}, r"unknown key 'corr_concentration'"),
        ("full", {"corr_concentration": -2.0}, r"priors\['corr_concentration'\] must be positive"),
        ("diag", {"locs_scale": 0.0}, r"priors\['locs_scale'\] must be positive"),
    ],
)
def test_bad_gaussian_priors_are_errors_naming_priors(cov, priors, match):
    with pytest.raises(ValueError, match=match):
        GMM(2, covariance_type=cov, priors=priors, seed=0, progress=False).fit(planted(60)[0])


def test_samplers_start_from_the_maximum_likelihood_em_start():
    """NUTS and Gibbs start at EM's maximum-likelihood start, whatever ``priors``."""
    priors = {"corr_concentration": 5.0}
    gmm = GMM(2, covariance_type="full", priors=priors, seed=0, progress=False)
    values = gmm._init_values(gmm.prepare_data(planted(60)[0], fitting=True), gmm._generator())
    assert sorted(values) == ["corr_cholesky", "locs", "scales", "weights"]
    assert gmm.priors is priors
