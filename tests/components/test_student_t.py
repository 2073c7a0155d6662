"""The Student-t family's own known answers (the structures and engines are tested for every family by
``tests/components/test_families.py`` and the contract suite, through ``FAMILY_DATA``; there EM's objective
equals Pyro's ``TraceEnum_ELBO`` of ``Mixture(2, family="student_t")`` and ``HMM``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy import optimize, special, stats

from ppmix import GMM, HMM, Mixture
from ppmix.components.student_t import StudentTComponents, StudentTFamily
from tests.common import assert_close

RNG = np.random.default_rng(0)
F64 = torch.float64


def _components(df, loc, scale) -> StudentTComponents:
    return StudentTComponents(*(torch.as_tensor(np.asarray(v, dtype=float)) for v in (df, loc, scale)))


def _current():
    """Three components on three features, rows around them with heavy tails, and soft responsibilities."""
    df, loc, scale = np.array([1.5, 4.0, 30.0]), RNG.normal(size=(3, 3)), RNG.uniform(0.5, 2.0, size=(3, 3))
    x = RNG.standard_t(3.0, size=(80, 3)) + loc[np.arange(80) % 3]
    return _components(df, loc, scale), x, RNG.dirichlet(np.ones(3), size=80)


def _expected_precisions(df, loc, scale, x):
    """``u_nk = (df + D) / (df + delta_nk)`` and ``E[log u_nk]``, written out in NumPy/SciPy."""
    delta = (((x[:, None, :] - loc[None]) / scale[None]) ** 2).sum(-1)
    half = (df + x.shape[1]) / 2
    return half / ((df + delta) / 2), special.digamma(half) - np.log((df + delta) / 2)


def test_log_prob_is_scipys_multivariate_t_with_a_diagonal_shape():
    comp, x, _ = _current()
    df, loc, scale = (v.numpy() for v in (comp.df, comp.loc, comp.scale))
    expected = np.stack(
        [stats.multivariate_t(loc[k], np.diag(scale[k] ** 2), df=df[k]).logpdf(x) for k in range(3)], axis=1
    )
    assert_close(comp.log_prob(torch.as_tensor(x)), expected, rtol=1e-12)
    # and Pyro's distribution, which SVI and MCMC use
    assert_close(comp.pyro_dist(torch.arange(3)[:, None]).log_prob(torch.as_tensor(x)).T, expected, rtol=1e-12)


def test_one_m_step_maximises_the_expected_complete_data_log_likelihood():
    """loc and scale beat scipy's maximiser of ``sum_n r_nk [-sum_d log scale_d - u_nk / 2 sum_d ((x - loc) /
    scale)^2]`` (x | u ~ N(loc, scale^2 / u)) with the current parameters' ``u``, component by component."""
    comp, x, r = _current()
    df, loc, scale = (v.numpy().copy() for v in (comp.df, comp.loc, comp.scale))
    u, _ = _expected_precisions(df, loc, scale, x)
    comp.fit(torch.as_tensor(x), torch.as_tensor(r))
    for k in range(3):

        def negative_q(theta, k=k):
            mu, log_s = theta[:3], theta[3:]
            z2 = ((x - mu) / np.exp(log_s)) ** 2
            return -(r[:, k] * (-log_s.sum() - u[:, k] / 2 * z2.sum(1))).sum()

        best = optimize.minimize(negative_q, np.concatenate([loc[k], np.log(scale[k])]), method="BFGS", tol=1e-12)
        assert_close(comp.loc[k], best.x[:3], rtol=1e-6, atol=1e-7)
        assert_close(comp.scale[k], np.exp(best.x[3:]), rtol=1e-6)


def test_the_df_update_is_brentqs_root_of_peel_and_mclachlans_equation():
    comp, x, r = _current()
    df, loc, scale = (v.numpy().copy() for v in (comp.df, comp.loc, comp.scale))
    u, log_u = _expected_precisions(df, loc, scale, x)
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
    u, log_u = _expected_precisions(np.array([200.0]), np.zeros((1, 2)), np.ones((1, 2)), x)
    assert -special.digamma(100.0) + np.log(100.0) + 1 + (log_u - u).mean() > 0
    comp.fit(torch.as_tensor(x), torch.ones(5000, 1, dtype=F64))
    assert float(comp.df[0]) == 200.0


@pytest.mark.parametrize("structure", ["Mixture", "HMM"])
def test_em_never_decreases_the_log_likelihood(structure):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_t(2.0, size=(150, 2)), 5.0 + rng.standard_t(2.0, size=(150, 2))])
    options = {"max_iter": 60, "tol": 0.0, "seed": 1, "progress": False}
    if structure == "Mixture":
        model = Mixture(3, family="student_t", **options)
    else:  # 10 sequences of 30 steps
        model, x = HMM(3, emission="student_t", **options), np.split(rng.permutation(x), 10)
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
