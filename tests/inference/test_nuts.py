"""ppmix's NUTS vectorised over chains (:mod:`ppmix.engines.nuts`) against targets with known answers: Gaussians
(moments within Monte Carlo error, the learned diagonal metric), a truncated target (divergences flagged, the draws
inside the support), the conjugate Poisson mixture's exact posterior mean through ``engine="mcmc"``, chains that do
not share their randomness, and the choice between ppmix's and Pyro's samplers."""

from __future__ import annotations

import itertools
import math
import warnings

import arviz as az
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix import GMM, Mixture
from ppmix.engines.nuts import _subtree_checks, _turn_dots, adaptation_windows, sample_nuts
from tests.common import StudentTMixture
from tests.inference.test_conjugate_gibbs import check_poisson_mixture_draws

QUIET = {"seed": 0, "progress": False}


def _gaussian(scales: torch.Tensor):
    """The potential of independent centred normals with standard deviations ``scales``, batched over chains."""

    def fn(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 0.5 * ((z / scales) ** 2).sum(-1), z / scales**2

    return fn


def _run(fn, chains: int, dims: int, seed: int = 0, draws: int = 1000, warmup: int = 300, start: float = 0.0):
    initial = torch.full((chains, dims), start, dtype=torch.float64)
    return sample_nuts(
        fn, initial, num_samples=draws, warmup_steps=warmup, generator=torch.Generator().manual_seed(seed)
    )


def test_a_standard_normal_has_its_moments_and_an_effective_sample_size_near_the_draws():
    """1-D N(0, 1) from a start at 3: mean 0 and variance 1 within five standard errors, ESS above a quarter of the
    draws (Pyro's NUTS gets about 0.4 of the draws here), every statistic recorded for every draw."""
    result = _run(_gaussian(torch.ones(1, dtype=torch.float64)), chains=4, dims=1, start=3.0)
    draws = result.samples[..., 0].numpy()
    ess = float(az.ess(draws))
    assert ess > 0.25 * draws.size
    assert abs(draws.mean()) < 5 / math.sqrt(ess)
    assert abs(draws.var() - 1.0) < 5 * math.sqrt(2.0 / ess)
    assert set(result.stats) == {"lp", "energy", "diverging", "n_steps", "tree_depth", "step_size", "acceptance_rate"}
    assert all(value.shape == (4, 1000) for value in result.stats.values())
    np.testing.assert_allclose(result.stats["lp"], -0.5 * draws**2)
    assert not result.stats["diverging"].any()
    assert (result.stats["n_steps"] < 2 ** result.stats["tree_depth"]).all()
    assert 0.6 < result.stats["acceptance_rate"].mean() < 0.98


def test_scales_two_orders_apart_are_sampled_through_the_adapted_metric():
    """Standard deviations 0.1, 1, 10: every coordinate's mean and variance within Monte Carlo error; the adapted
    step size stays near the one a unit Gaussian takes (the diagonal metric absorbs the scales), so few steps."""
    scales = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)
    result = _run(_gaussian(scales), chains=4, dims=3, draws=400, warmup=150)
    draws = result.samples.numpy() / scales.numpy()  # standardised: N(0, 1) each
    for d in range(3):
        ess = float(az.ess(draws[..., d]))
        assert abs(draws[..., d].mean()) < 5 / math.sqrt(ess), d
        assert abs(draws[..., d].var() - 1.0) < 5 * math.sqrt(2.0 / ess), d
    assert np.median(result.stats["n_steps"]) <= 7


def test_a_wall_in_the_potential_is_a_divergence_and_no_draw_crosses_it():
    """A standard normal cut at z = 0.5 (infinite potential beyond, NaN gradient): the draws stay below the wall,
    and trajectories that reach it are flagged as divergent."""

    def cut(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inside = z[:, 0] < 0.5
        potential = torch.where(inside, 0.5 * z[:, 0] ** 2, torch.full_like(z[:, 0], math.inf))
        return potential, torch.where(inside[:, None], z, torch.full_like(z, math.nan))

    result = _run(cut, chains=2, dims=1, draws=500, warmup=200, start=-1.0)
    assert float(result.samples.max()) < 0.5
    assert result.stats["diverging"].any()


def test_chains_draw_their_own_randomness_and_a_seed_repeats_the_run():
    """Chains from one start share no random numbers (their draws are uncorrelated); the same generator seed gives
    the same draws, another seed others."""
    fn = _gaussian(torch.ones(2, dtype=torch.float64))
    first, again, other = (_run(fn, chains=3, dims=2, seed=s, draws=300, warmup=50) for s in (0, 0, 1))
    assert torch.equal(first.samples, again.samples)
    assert not torch.equal(first.samples, other.samples)
    for a, b in itertools.combinations(range(3), 2):
        corr = np.corrcoef(first.samples[a, :, 0].numpy(), first.samples[b, :, 0].numpy())[0, 1]
        assert abs(corr) < 0.2, (a, b, corr)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=3000))
def test_adaptation_windows_tile_the_middle_of_warmup(warmup):
    """The metric windows are contiguous, each at least as long as the one before (except a last one stretched to
    the end), and leave an initial and a final buffer of the warmup."""
    windows = adaptation_windows(warmup)
    if warmup < 20:
        assert windows == []
        return
    starts, ends = [s for s, _ in windows], [e for _, e in windows]
    assert starts[0] > 0 and ends[-1] < warmup
    assert starts[1:] == ends[:-1]
    sizes = [e - s for s, e in windows]
    assert all(b >= a for a, b in zip(sizes, sizes[1:]))


def test_poisson_mixture_nuts_draws_have_the_exact_posterior_predictive_mean():
    """K = 2 on five counts: E[sum_k w_k rate_k | x] (label-free) from the 2^5 assignments, each with its
    Dirichlet-multinomial and Poisson-Gamma marginals, equals the mean of ppmix's NUTS draws."""
    x = np.array([[0.0], [1.0], [4.0], [7.0], [2.0]])
    k = 2
    mix = Mixture(k, family="poisson", **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mix.fit(x, engine="mcmc", num_samples=300, warmup_steps=150, num_chains=4, relabel=False, sampler="ppmix")
    check_poisson_mixture_draws(mix, x)


def test_the_sampler_option_chooses_and_refuses():
    """``sampler="ppmix"`` and ``"pyro"`` both sample a GMM (the same sites and statistics); ppmix's NUTS is
    reproducible given the seed; an unknown sampler, and ``"ppmix"`` where the model has no potential of its own,
    are refused naming the option."""
    x = np.concatenate(
        [np.random.default_rng(0).normal(-3, 1, (40, 1)), np.random.default_rng(1).normal(3, 1, (40, 1))]
    )
    runs = {}
    for sampler in ("ppmix", "pyro", "ppmix"):
        gmm = GMM(2, **QUIET).fit(x, engine="mcmc", num_samples=20, warmup_steps=20, sampler=sampler)
        assert gmm.mcmc_samples_["locs"].shape == (2, 20, 2, 1)
        assert gmm.mcmc_sample_stats_["diverging"].shape == (2, 20)
        runs.setdefault(sampler, []).append(gmm.mcmc_samples_["locs"])
    assert torch.equal(*runs["ppmix"])
    with pytest.raises(ValueError, match="sampler must be one of"):
        GMM(2, **QUIET).fit(x, engine="mcmc", num_samples=5, warmup_steps=5, sampler="stan")
    with pytest.raises(ValueError, match="sampler='ppmix' needs the model's own potential"):
        StudentTMixture(2, **QUIET).fit(x, engine="mcmc", num_samples=5, warmup_steps=5, sampler="ppmix")


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=1, max_value=7),
    st.integers(min_value=0, max_value=2**31),
)
def test_batched_u_turn_sums_are_bit_for_bit_those_of_each_check(chains, dims, k, seed):
    """The U-turn checks of a step are summed in one ``(2, K, C, P)`` pass; every row equals the sum of its own
    ``(C, P)`` product ``rho * inv_mass * r`` exactly (the draws of a seed must not depend on the batching)."""
    g = torch.Generator().manual_seed(seed)

    def draw():
        return torch.randn(chains, dims, dtype=torch.float64, generator=g) * 10 ** torch.randint(
            -3, 4, (1,), generator=g
        )

    inv_mass = draw().abs()
    checks = [(draw(), draw(), draw()) for _ in range(k)]
    dots = _turn_dots(checks, inv_mass)
    for i, (rho, start, end) in enumerate(checks):
        assert torch.equal(dots[0, i], (rho * inv_mass * start).sum(-1))
        assert torch.equal(dots[1, i], (rho * inv_mass * end).sum(-1))


@pytest.mark.parametrize("depth", range(5))
def test_the_u_turn_checks_of_a_doubling_are_every_aligned_sub_trajectory_and_its_halves(depth):
    """Brute force on a doubling of ``2^depth`` steps whose momenta are the unit vectors (step ``i`` has ``e_{i+1}``,
    the point before the doubling ``e_0``, so a momentum sum shows which steps it holds): at step ``n`` the checks are,
    for every block ``[a, n]`` of size ``2^m >= 2`` aligned at a multiple of ``2^m``, the block whole (from ``a``
    to ``n``) and, for ``2^m >= 4``, across its halves ``[a, mid]`` and ``[mid + 1, n]``: ``[a, mid + 1]`` from ``a``
    to ``mid + 1`` and ``[mid, n]`` from ``mid`` to ``n`` (Stan's extra checks)."""
    size = 2**depth
    unit = torch.eye(size + 1, dtype=torch.float64)

    def span(lo, hi):  # the momentum sum of steps lo..hi
        return tuple(unit[lo + 1 : hi + 2].sum(0).tolist())

    marks: dict = {}
    prefix, previous = torch.zeros(size + 1, dtype=torch.float64), unit[0]
    for n in range(size):
        r = unit[n + 1]
        before, prefix = prefix, prefix + r
        got = {(tuple(rho.tolist()), int(s.argmax()) - 1, int(e.argmax()) - 1)
               for rho, s, e in _subtree_checks(n, depth, r, prefix, before, previous, marks)}  # fmt: skip
        previous = r
        expected = set()
        for m in range(1, depth + 1):
            a = n + 1 - 2**m
            if a % 2**m:
                continue
            expected.add((span(a, n), a, n))
            if m >= 2:
                mid = a + 2 ** (m - 1) - 1
                expected |= {(span(a, mid + 1), a, mid + 1), (span(mid, n), mid, n)}
        assert got == expected, n
