"""The Student-t family's own known answers (the structures and engines are tested for every family by
``tests/components/test_families.py`` and the contract suite, through ``FAMILY_DATA``; there EM's objective
equals Pyro's ``TraceEnum_ELBO`` of ``Mixture(2, family="student_t")`` and ``HMM``). The full-scale variant,
``StudentTFamily(covariance_type="full")``, has no ``FAMILY_DATA`` entry: its engine checks (the ELBO, sharded EM,
save/load) are here."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from scipy import optimize, special, stats

from ppmix import GMM, HMM, Mixture
from ppmix.components.student_t import FullStudentTComponents, StudentTComponents, StudentTFamily
from ppmix.distributed import fit_em
from tests.common import assert_close

RNG = np.random.default_rng(0)
F64 = torch.float64


VARIANTS = pytest.mark.parametrize("covariance_type", ["diag", "full"])


def _components(df, loc, scale) -> StudentTComponents:
    return StudentTComponents(*(torch.as_tensor(np.asarray(v, dtype=float)) for v in (df, loc, scale)))


def _random_tril(rng, k: int, d: int) -> np.ndarray:
    """``k`` lower Cholesky factors of correlated scale matrices (positive diagonal)."""
    tril = np.tril(rng.normal(scale=0.5, size=(k, d, d)), -1)
    return tril + np.stack([np.diag(rng.uniform(0.5, 2.0, size=d)) for _ in range(k)])


def _current(covariance_type: str = "diag"):
    """Three components on three features, rows around them with heavy tails, and soft responsibilities."""
    df, loc = np.array([1.5, 4.0, 30.0]), RNG.normal(size=(3, 3))
    if covariance_type == "diag":
        comp = _components(df, loc, RNG.uniform(0.5, 2.0, size=(3, 3)))
    else:
        comp = FullStudentTComponents(*(torch.as_tensor(v) for v in (df, loc, _random_tril(RNG, 3, 3))))
    x = RNG.standard_t(3.0, size=(80, 3)) + loc[np.arange(80) % 3]
    return comp, x, RNG.dirichlet(np.ones(3), size=80)


def _shape_matrices(comp) -> np.ndarray:
    """``Sigma_k`` ``(K, D, D)`` of either variant, from its own parameters."""
    if isinstance(comp, FullStudentTComponents):
        tril = comp.scale_tril.numpy()
        return tril @ np.swapaxes(tril, -1, -2)
    return np.stack([np.diag(s**2) for s in comp.scale.numpy()])


def _expected_precisions(df, loc, sigma, x):
    """``u_nk = (df + D) / (df + delta_nk)`` and ``E[log u_nk]``, written out in NumPy/SciPy (``sigma`` the
    ``(K, D, D)`` scale matrices)."""
    dev = x[:, None, :] - loc[None]
    delta = np.einsum("nkd,kde,nke->nk", dev, np.linalg.inv(sigma), dev)
    half = (df + x.shape[1]) / 2
    return half / ((df + delta) / 2), special.digamma(half) - np.log((df + delta) / 2)


@VARIANTS
def test_log_prob_is_scipys_multivariate_t(covariance_type):
    comp, x, _ = _current(covariance_type)
    df, loc, sigma = comp.df.numpy(), comp.loc.numpy(), _shape_matrices(comp)
    expected = np.stack([stats.multivariate_t(loc[k], sigma[k], df=df[k]).logpdf(x) for k in range(3)], axis=1)
    assert_close(comp.log_prob(torch.as_tensor(x)), expected, rtol=1e-12)
    # and Pyro's distribution, which SVI and MCMC use
    assert_close(comp.pyro_dist(torch.arange(3)[:, None]).log_prob(torch.as_tensor(x)).T, expected, rtol=1e-12)


def _unpack(theta, covariance_type: str, d: int = 3):
    """``loc`` and a lower Cholesky factor from free coordinates: ``loc``, then the log-diagonal and (full) the
    strictly lower entries."""
    loc, tril = theta[:d], np.diag(np.exp(theta[d : 2 * d]))
    if covariance_type == "full":
        tril[np.tril_indices(d, -1)] = theta[2 * d :]
    return loc, tril


@VARIANTS
def test_one_m_step_maximises_the_expected_complete_data_log_likelihood(covariance_type):
    """loc and Sigma equal scipy's maximiser of ``sum_n r_nk [-log |L| - u_nk / 2 |L^{-1} (x - loc)|^2]``
    (x | u ~ N(loc, L L^T / u)) with the current parameters' ``u``, component by component, over ``loc`` and a
    Cholesky factor ``L`` (diagonal for ``"diag"``)."""
    comp, x, r = _current(covariance_type)
    df, loc, sigma = comp.df.numpy().copy(), comp.loc.numpy().copy(), _shape_matrices(comp)
    u, _ = _expected_precisions(df, loc, sigma, x)
    comp.fit(torch.as_tensor(x), torch.as_tensor(r))
    fitted_sigma = _shape_matrices(comp)
    for k in range(3):

        def negative_q(theta, k=k):
            mu, tril = _unpack(theta, covariance_type)
            z = np.linalg.solve(tril, (x - mu).T)
            return -(r[:, k] * (-np.log(np.diag(tril)).sum() - u[:, k] / 2 * (z**2).sum(0))).sum()

        chol = np.linalg.cholesky(sigma[k])
        start = [loc[k], np.log(np.diag(chol))] + ([chol[np.tril_indices(3, -1)]] if covariance_type == "full" else [])
        best = optimize.minimize(negative_q, np.concatenate(start), method="BFGS", tol=1e-12)
        best_loc, best_tril = _unpack(best.x, covariance_type)
        assert_close(comp.loc[k], best_loc, rtol=1e-6, atol=1e-7)
        assert_close(fitted_sigma[k], best_tril @ best_tril.T, rtol=1e-6, atol=1e-7)


@VARIANTS
def test_the_df_update_is_brentqs_root_of_peel_and_mclachlans_equation(covariance_type):
    comp, x, r = _current(covariance_type)
    df, loc, sigma = comp.df.numpy().copy(), comp.loc.numpy().copy(), _shape_matrices(comp)
    u, log_u = _expected_precisions(df, loc, sigma, x)
    comp.fit(torch.as_tensor(x), torch.as_tensor(r))
    for k in range(3):
        mean = (r[:, k] * (log_u[:, k] - u[:, k])).sum() / r[:, k].sum()

        def equation(nu, mean=mean):
            return -special.digamma(nu / 2) + np.log(nu / 2) + 1 + mean

        assert float(comp.df[k]) == pytest.approx(optimize.brentq(equation, 0.5, 200.0, xtol=1e-14), rel=1e-10)


def test_df_beyond_the_range_is_the_nearest_end():
    """Gaussian rows: Peel & McLachlan's equation is still positive at 200 (its root lies beyond), and the M-step
    gives 200, the maximiser over the range (the expected complete-data log-likelihood is concave in df)."""
    x = RNG.normal(size=(5000, 2))
    comp = _components([200.0], [[0.0, 0.0]], [[1.0, 1.0]])
    u, log_u = _expected_precisions(np.array([200.0]), np.zeros((1, 2)), np.eye(2)[None], x)
    assert -special.digamma(100.0) + np.log(100.0) + 1 + (log_u - u).mean() > 0
    comp.fit(torch.as_tensor(x), torch.ones(5000, 1, dtype=F64))
    assert float(comp.df[0]) == 200.0


@pytest.mark.parametrize("structure, covariance_type", [("Mixture", "diag"), ("HMM", "diag"), ("Mixture", "full")])
def test_em_never_decreases_the_log_likelihood(structure, covariance_type):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_t(2.0, size=(150, 2)), 5.0 + rng.standard_t(2.0, size=(150, 2))])
    x[:, 1] += 0.8 * x[:, 0]  # correlated features, for the full scale matrices
    options = {"max_iter": 60, "tol": 0.0, "seed": 1, "progress": False}
    family = StudentTFamily(covariance_type)
    if structure == "Mixture":
        model = Mixture(3, family=family, **options)
    else:  # 10 sequences of 30 steps
        model, x = HMM(3, emission=family, **options), np.split(rng.permutation(x), 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed number of iterations, not convergence
        model.fit(x)
    history = np.asarray(model.history_)
    assert len(history) > 50
    assert (np.diff(history) >= -1e-12 * np.abs(history[1:])).all()


def test_planted_t_components_are_found_where_a_gaussian_mixture_is_pulled_by_outliers():
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 0.0], [6.0, 6.0]])
    x = centres[np.arange(600) % 2] + rng.standard_t(3.0, size=(600, 2))
    x[:30] = rng.uniform(-40, 40, size=(30, 2))  # 5 % of the rows: outliers scattered far and wide
    t_mix = Mixture(2, family="student_t", seed=0, progress=False, max_iter=300).fit(x)
    gmm = GMM(2, covariance_type="diag", seed=0, progress=False).fit(x)

    def error(means):
        means = means.numpy()
        return min(np.abs(means - centres).max(), np.abs(means[::-1] - centres).max())

    assert error(t_mix.means_) < 0.25
    assert error(gmm.means_) > 1.0  # the outliers hold one Gaussian (or pull a mean) away from its cluster
    assert (t_mix.components_.df < 6).all()  # heavy tails found (df 3 planted, the outliers make them heavier)


def test_samples_follow_the_t_distribution():
    comp = _components([3.0, 10.0], [[1.0, -2.0], [0.0, 0.0]], [[2.0, 0.5], [1.0, 1.0]])
    draws = comp.sample(torch.zeros(4000, dtype=torch.long), generator=torch.Generator().manual_seed(0)).numpy()
    for d in range(2):
        standard = (draws[:, d] - comp.loc[0, d].item()) / comp.scale[0, d].item()
        assert stats.kstest(standard, stats.t(3.0).cdf).pvalue > 0.01


def test_a_bad_df_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match="min_df must be below max_df"):
        Mixture(2, family=StudentTFamily(min_df=5.0, max_df=2.0), progress=False).fit(RNG.normal(size=(20, 2)))


def _correlated_t_clusters(rng, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """Two clusters of strongly correlated t(3) rows (correlation 0.9 and -0.9), centres (0, 0) and (6, -6)."""
    centres = np.array([[0.0, 0.0], [6.0, -6.0]])
    trils = np.linalg.cholesky(np.array([[[1.0, 0.9], [0.9, 1.0]], [[1.0, -0.9], [-0.9, 1.0]]]))
    z = np.arange(n) % 2
    t = rng.normal(size=(n, 2)) / np.sqrt(rng.chisquare(3.0, (n, 1)) / 3)  # multivariate t(3): one precision a row
    return centres[z] + np.einsum("nde,ne->nd", trils[z], t), centres


def test_full_t_mixture_em_objective_equals_pyro_trace_enum_elbo_at_the_fit_and_a_perturbed_point():
    x, _ = _correlated_t_clusters(np.random.default_rng(5), 200)
    model = Mixture(2, family=StudentTFamily("full"), seed=0, progress=False, max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x)
    data = model.prepare_data(x)
    em_objective = float(model._e_step(model._em_data(data))[1])
    np.testing.assert_allclose(em_objective, model._elbo_tensor(data), rtol=1e-10)
    values = model._get_globals()  # df, loc, scales, corr_cholesky, the mixing weights
    values["df"], values["loc"], values["scales"] = values["df"] * 1.7, values["loc"] + 0.3, values["scales"] * 1.3
    values["corr_cholesky"] = torch.eye(2, dtype=F64).expand(2, 2, 2)
    model._set_globals(values)
    perturbed = float(model._e_step(model._em_data(data))[1])
    assert perturbed < em_objective - 1.0
    np.testing.assert_allclose(perturbed, model._elbo_tensor(data), rtol=1e-10)


def test_planted_correlated_t_clusters_are_found_where_a_full_gaussian_mixture_is_pulled_by_outliers():
    rng = np.random.default_rng(3)
    x, centres = _correlated_t_clusters(rng)
    x[:30] = rng.uniform(-40, 40, size=(30, 2))  # 5 % of the rows: outliers scattered far and wide
    t_mix = Mixture(2, family=StudentTFamily("full"), seed=0, progress=False, max_iter=300).fit(x)
    gmm = GMM(2, covariance_type="full", seed=0, progress=False).fit(x)

    def error(means):
        means = means.numpy()
        return min(np.abs(means - centres).max(), np.abs(means[::-1] - centres).max())

    assert error(t_mix.means_) < 0.25
    assert error(gmm.means_) > 1.0
    order = np.argsort(t_mix.means_[:, 0].numpy())
    sigma = _shape_matrices(t_mix.components_)[order]
    correlation = sigma[:, 0, 1] / np.sqrt(sigma[:, 0, 0] * sigma[:, 1, 1])
    np.testing.assert_allclose(correlation, [0.9, -0.9], atol=0.05)
    assert (t_mix.components_.df < 6).all()


def test_full_t_em_on_three_shards_equals_em_in_memory(tmp_path):
    x, _ = _correlated_t_clusters(np.random.default_rng(6), 300)
    start = Mixture(2, family=StudentTFamily("full"), seed=0, progress=False, max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start.fit(x)
        start.warm_start = True
        in_memory = copy.deepcopy(start).fit(x, max_iter=5, tol=0.0)
        paths = []
        for i, part in enumerate(np.array_split(np.arange(len(x)), 3)):
            paths.append(tmp_path / f"part{i}.npy")
            np.save(paths[-1], x[part])
        sharded = fit_em(copy.deepcopy(start), paths, executor="inline", max_iter=5, tol=0.0)
    np.testing.assert_allclose(sharded.history_, in_memory.history_, rtol=1e-10)
    for key, value in in_memory._state_tensors().items():
        np.testing.assert_allclose(sharded._state_tensors()[key].numpy(), value.numpy(), rtol=1e-9, atol=1e-12)


def test_a_saved_full_t_mixture_loads_with_its_scale_matrices(tmp_path):
    x, _ = _correlated_t_clusters(np.random.default_rng(7), 200)
    model = Mixture(2, family=StudentTFamily("full", max_df=50.0), seed=0, progress=False, max_iter=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x)
    loaded = Mixture.load(model.save(tmp_path / "model"))
    assert isinstance(loaded.components_, FullStudentTComponents) and loaded._component_family().max_df == 50.0
    assert_close(loaded.components_.scale_tril, model.components_.scale_tril, rtol=0.0)
    assert_close(loaded.score_samples(x), model.score_samples(x), rtol=1e-12)


def test_full_samples_follow_the_t_distribution():
    tril = torch.tensor([[[2.0, 0.0], [1.5, 0.5]]], dtype=F64)
    comp = FullStudentTComponents(torch.tensor([3.0], dtype=F64), torch.tensor([[1.0, -2.0]], dtype=F64), tril)
    draws = comp.sample(torch.zeros(4000, dtype=torch.long), generator=torch.Generator().manual_seed(0))
    standard = torch.linalg.solve_triangular(tril[0], (draws - comp.loc[0]).T, upper=False).T.numpy()
    for d in range(2):
        assert stats.kstest(standard[:, d], stats.t(3.0).cdf).pvalue > 0.01
    assert abs(np.corrcoef(standard.T)[0, 1]) < 0.05  # whitened by the right factor


def test_a_bad_covariance_type_is_an_error_naming_it():
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        Mixture(2, family=StudentTFamily("tied"), progress=False).fit(RNG.normal(size=(20, 2)))
