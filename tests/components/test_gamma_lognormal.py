"""The gamma and log-normal families' own known answers (the structures and engines are tested for every
family by ``tests/components/test_families.py`` and the contract suite, through ``FAMILY_DATA``)."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from scipy import optimize, stats

from ppmix import HMM, Mixture
from ppmix.components.divergence import kl_divergence
from ppmix.components.gamma import GammaComponents, gamma_shape, log_minus_digamma
from ppmix.components.lognormal import LogNormalComponents, LogNormalFamily
from tests.common import assert_close, make_family_sequences

RNG = np.random.default_rng(0)
F64 = torch.float64


def t(array) -> torch.Tensor:
    return torch.as_tensor(np.asarray(array, dtype=float))


def _log_minus_digamma_mp(a: float) -> float:
    """``log a - digamma(a)`` to 40 digits."""
    with mpmath.workdps(40):
        return float(mpmath.log(a) - mpmath.digamma(a))


def test_gamma_log_prob_is_scipys():
    a, b, x = RNG.uniform(0.3, 8.0, size=(3, 4)), RNG.uniform(0.2, 5.0, size=(3, 4)), RNG.gamma(2.0, 1.0, size=(10, 4))
    expected = np.stack([stats.gamma.logpdf(x, a[k], scale=1 / b[k]).sum(1) for k in range(3)], axis=1)
    assert_close(GammaComponents(t(a), t(b)).log_prob(t(x)), expected, rtol=1e-12)


def test_lognormal_log_prob_is_torchs_from_raw_and_prepared_rows():
    loc, scale, x = RNG.normal(size=(3, 4)), RNG.uniform(0.2, 2.0, size=(3, 4)), RNG.lognormal(0.0, 1.0, size=(10, 4))
    comps = LogNormalComponents(t(loc), t(scale))
    expected = torch.distributions.LogNormal(t(loc), t(scale)).log_prob(t(x)[:, None, :]).sum(-1)
    assert_close(comps.log_prob(t(x)), expected, rtol=1e-12)
    # the training rows' preparation (logarithms centred at their own mean) gives the same densities
    assert_close(comps.log_prob(LogNormalFamily().prepare(t(x))), expected, rtol=1e-12)


def _brute_force_mle(logpdf, x, w, start):
    """The maximiser of ``sum_n w_n logpdf(x_n, *exp(theta))`` by BFGS on the log-parameters (numerical gradients)."""

    def loss(theta):
        return -(w * logpdf(x, *np.exp(theta))).sum() / w.sum()

    return np.exp(optimize.minimize(loss, np.log(start), method="BFGS", jac="3-point", options={"gtol": 1e-12}).x)


def test_the_gamma_m_step_is_the_weighted_mle_of_a_brute_force_optimiser():
    x, w = RNG.gamma(3.0, 2.0, size=(80, 2)), RNG.dirichlet(np.ones(3), size=80)
    fitted = GammaComponents(torch.ones(3, 2, dtype=F64), torch.ones(3, 2, dtype=F64)).fit(t(x), t(w))
    for k in range(3):
        for d in range(2):
            a, b = _brute_force_mle(lambda v, a, b: stats.gamma.logpdf(v, a, scale=1 / b), x[:, d], w[:, k], (1, 1))
            assert_close([fitted.concentration[k, d], fitted.rate[k, d]], [a, b], rtol=1e-8)


def test_the_lognormal_m_step_is_the_weighted_mle_of_a_brute_force_optimiser():
    x, w = RNG.lognormal(1.0, 0.7, size=(80, 2)), RNG.dirichlet(np.ones(3), size=80)
    fitted = LogNormalComponents(torch.zeros(3, 2, dtype=F64), torch.ones(3, 2, dtype=F64)).fit(t(x), t(w))
    for k in range(3):
        for d in range(2):
            loc_exp, scale = _brute_force_mle(
                lambda v, e, s: stats.lognorm.logpdf(v, s, scale=e), x[:, d], w[:, k], (1, 1)
            )
            assert_close([fitted.loc[k, d], fitted.scale[k, d]], [np.log(loc_exp), scale], rtol=1e-8, atol=1e-10)


def test_the_lognormal_variance_floor_is_relative_to_the_spread_of_log_x():
    # a constant cluster far from the other (61 rows: numpy's and torch's medians agree)
    x = np.exp(np.concatenate([np.full((21, 1), 5.0), RNG.normal(0.0, 1.0, size=(40, 1))]))
    mix = Mixture(2, family=LogNormalFamily(reg_covar=1e-4), seed=0, progress=False).fit(x)
    spread = 1.4826 * np.median(np.abs(np.log(x) - np.median(np.log(x))))
    assert float(mix.components_.scale.min()) ** 2 == pytest.approx(1e-4 * spread**2, rel=1e-12)


@pytest.mark.parametrize("shape", [0.05, 1.0, 9.999, 10.0, 250.0, 1e4, 1e6])
def test_log_minus_digamma_is_mpmaths_on_both_sides_of_the_series(shape):
    value, derivative = log_minus_digamma(torch.tensor([shape], dtype=F64))
    assert float(value) == pytest.approx(_log_minus_digamma_mp(shape), rel=1e-13)
    with mpmath.workdps(40):  # below a = 10 the derivative is torch's trigamma's, good to about 1e-9 (it steers only)
        assert float(derivative) == pytest.approx(float(1 / mpmath.mpf(shape) - mpmath.psi(1, shape)), rel=1e-8)


def test_the_newton_shape_solve_reaches_the_exact_root_from_tiny_to_huge_shapes():
    shapes = [0.05, 0.3, 1.0, 7.5, 10.5, 300.0, 1e4]
    ratios = torch.tensor([_log_minus_digamma_mp(a) for a in shapes], dtype=F64)
    assert_close(gamma_shape(ratios), shapes, rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [0.05, 1e4])
def test_gamma_fits_on_data_of_tiny_and_huge_shape_solve_the_profile_equation(shape):
    x, ones = t(RNG.gamma(shape, 1.0, size=(400, 1))), torch.ones(400, 1, dtype=F64)
    start = GammaComponents(torch.ones(1, 1, dtype=F64), torch.ones(1, 1, dtype=F64))
    sums = start.statistics(x, ones)
    ratio = float((sums.totals / sums.counts).log() - sums.log_totals / sums.counts)  # the data's, as the fit sums them
    root = optimize.brentq(lambda a: _log_minus_digamma_mp(a) - ratio, shape / 10, shape * 10, xtol=1e-300)
    fitted = start.fit(x, ones)
    assert float(fitted.concentration) == pytest.approx(root, rel=1e-12)
    assert float(fitted.moments().mean) == pytest.approx(float(x.mean()), rel=1e-12)


def test_constant_data_get_the_documented_largest_shape():
    x, ones = torch.full((5, 2), 3.0, dtype=F64), torch.ones(5, 1, dtype=F64)
    fitted = GammaComponents(torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=F64), max_concentration=1e5).fit(
        x, ones
    )
    assert_close(fitted.concentration, [[1e5, 1e5]], rtol=0)
    assert_close(fitted.moments().mean, [[3.0, 3.0]], rtol=1e-15)


def test_a_component_without_weight_keeps_its_parameters():
    start = GammaComponents(torch.tensor([[2.0], [5.0]], dtype=F64), torch.tensor([[1.0], [3.0]], dtype=F64))
    fitted = start.fit(t(RNG.gamma(2.0, 1.0, size=(6, 1))), torch.tensor([[1.0, 0.0]] * 6, dtype=F64))
    assert_close([fitted.concentration[1, 0], fitted.rate[1, 0]], [5.0, 3.0], rtol=0)


@pytest.mark.parametrize(
    "components, torch_distribution",
    [(GammaComponents, torch.distributions.Gamma), (LogNormalComponents, torch.distributions.LogNormal)],
)
def test_kl_divergences_are_torchs_closed_forms(components, torch_distribution):
    first, second = RNG.uniform(0.5, 5.0, size=(2, 1, 3)), RNG.uniform(0.5, 5.0, size=(2, 1, 3))
    kl = kl_divergence(components(t(first[0]), t(second[0])), components(t(first[1]), t(second[1])))
    p, q = torch_distribution(t(first[0]), t(second[0])), torch_distribution(t(first[1]), t(second[1]))
    assert float(kl) == pytest.approx(float(torch.distributions.kl_divergence(p, q).sum()), rel=1e-12)


@pytest.mark.parametrize("family", ["gamma", "lognormal"])
@pytest.mark.parametrize("bad", [0.0, -1e-300, -1.0])
def test_data_outside_the_support_are_an_error_naming_x(family, bad):
    x = RNG.gamma(2.0, 1.0, size=(30, 2))
    x[4, 1] = bad
    with pytest.raises(ValueError, match=rf"X must be positive .*for the {family} family"):
        Mixture(2, family=family, progress=False).fit(x)


@pytest.mark.parametrize("family", ["gamma", "lognormal"])
def test_predictions_refuse_data_outside_the_support_too(family):
    sequences, _ = make_family_sequences(family)
    hmm = HMM(2, emission=family, seed=0, progress=False).fit(sequences)
    with pytest.raises(ValueError, match="X must be positive"):
        hmm.predict([np.vstack([sequences[0], [[1.0, 0.0]]])])
