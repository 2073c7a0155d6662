"""The fused E-step of the Gaussian families (``mixture_statistics``) against its definition,
``statistics(data, softmax(log_prob(data) + log_weights))``, for the diagonal, full and tied families, both dtypes,
data spanning several row blocks, and the collapsed components that take the direct formulas. A tied family's
statistics hold each component's share of the pooled scatter (all its M-step reads): its scatters are compared
summed over the components, against the full family's per-component definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ppmix.components.centred as centred
from ppmix.components import DiagGaussian, FullGaussian
from ppmix.components.base import ComponentFamily
from ppmix.components.centred import CentredData
from ppmix.components.family_tools import mixture_statistics
from ppmix.components.gaussian_full import TiedGaussian
from tests.common import assert_close
from tests.components._util import parametrize_device, parametrize_dtype, random_scale_tril, rng, rounded, t

TOL = {torch.float64: {"rtol": 1e-9, "atol": 1e-9}, torch.float32: {"rtol": 2e-4, "atol": 2e-4}}


def _family(kind: str, k: int, d: int, dtype, device, seed: int = 0):
    r = rng(seed)
    loc = t(r.normal(scale=3.0, size=(k, d)), dtype, device)
    if kind == "diag":
        return DiagGaussian(loc, t(r.uniform(0.5, 1.5, size=(k, d)), dtype, device))
    if kind == "tied":
        return TiedGaussian(loc, t(random_scale_tril(r, 1, d), dtype, device).expand(k, d, d))
    return FullGaussian(loc, t(random_scale_tril(r, k, d), dtype, device))


def _definition(family, data: CentredData, log_weights: torch.Tensor):
    """The two-pass E-step; a tied family's statistics by the full family's per-component formulas."""
    joint = family.log_prob(data) + log_weights
    statistics = FullGaussian.statistics if isinstance(family, TiedGaussian) else type(family).statistics
    return statistics(family, data, torch.softmax(joint, dim=1)), torch.logsumexp(joint, dim=1).sum()


def _scatters(stats, pooled: bool) -> torch.Tensor:
    return stats.scatter.sum(0) if pooled else stats.scatter


def _assert_same(fused, expected, dtype, pooled: bool = False) -> None:
    """The same counts, means, scatters (``pooled``: summed over the components) and log-likelihood."""
    (stats, log_lik), (want, want_log_lik) = fused, expected
    got_all = (stats.counts, stats.mean, _scatters(stats, pooled))
    for got, ref in zip(got_all, (want.counts, want.mean, _scatters(want, pooled))):
        assert_close(got, ref, **TOL[dtype])
    assert float(log_lik) == pytest.approx(float(want_log_lik), rel=TOL[dtype]["rtol"] * 10)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("kind", ["diag", "full", "tied"])
def test_fused_estep_equals_its_definition_over_several_row_blocks(kind, dtype, device, monkeypatch):
    monkeypatch.setattr(centred, "BLOCK_BYTES", 1)  # the smallest blocks (64 rows): 700 rows span 11 of them
    family = _family(kind, 3, 4, dtype, device)
    r = rng(1)
    x = t(r.normal(scale=3.0, size=(700, 4)) + 5.0, dtype, device)
    data = CentredData.from_tensor(x)
    log_weights = t([0.2, 0.5, 0.3], dtype, device).log()
    expected = _definition(family, data, log_weights)
    _assert_same(mixture_statistics(family, data, log_weights), expected, dtype, pooled=kind == "tied")


@pytest.mark.parametrize("kind", ["diag", "full"])
def test_fused_estep_falls_back_to_direct_formulas_for_a_collapsed_component(kind):
    """A component far from the centre with a tiny spread cancels its digits in the moment algebra:
    the fused pass must give the direct formulas' answer, not the cancelled one."""
    dtype = torch.float64
    r = rng(2)
    far = 1e6 + r.normal(scale=1e-4, size=(50, 2))
    x = t(list(r.normal(size=(200, 2))) + list(far), dtype)
    loc = t([[0.0, 0.0], [1e6, 1e6]], dtype)
    if kind == "diag":
        family = DiagGaussian(loc, t([[1.0, 1.0], [1e-4, 1e-4]], dtype), reg_covar=1e-12)
    else:
        family = FullGaussian(loc, torch.diag_embed(t([[1.0, 1.0], [1e-4, 1e-4]], dtype)), reg_covar=1e-12)
    data = CentredData.from_tensor(x)
    log_weights = t([0.8, 0.2], dtype).log()
    stats, _ = mixture_statistics(family, data, log_weights)
    direct = (far - far.mean(0)) ** 2
    scatter = stats.scatter[1] if kind == "diag" else torch.diagonal(stats.scatter[1])
    assert_close(scatter, t(direct.sum(0), dtype), rtol=1e-6, atol=0)
    _assert_same((stats, _), _definition(family, data, log_weights), dtype)


@pytest.mark.parametrize("kind", ["diag", "full"])
def test_log_prob_does_not_depend_on_the_block_size(kind, monkeypatch):
    family = _family(kind, 4, 3, torch.float64, "cpu", seed=3)
    x = t(rng(4).normal(scale=2.0, size=(300, 3)))
    whole = family.log_prob(x)
    monkeypatch.setattr(centred, "BLOCK_BYTES", 1)
    assert_close(family.log_prob(x), whole, rtol=1e-12, atol=1e-12)
    assert_close(whole[:7], family.log_prob(x[:7]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("collapsed", [False, True], ids=["fused", "direct-fallback"])
@pytest.mark.parametrize("kind", ["diag", "full", "tied"])
def test_row_weights_count_each_row_that_many_times(kind, collapsed, monkeypatch):
    """``mixture_statistics(..., row_weights=w)`` equals the E-step on the rows repeated ``w`` times (integer
    ``w``, zeros included), on the fused pass and on the direct formulas it falls back to."""
    monkeypatch.setattr(centred, "BLOCK_BYTES", 1)
    dtype = torch.float64
    r = rng(3)
    x = t(r.normal(scale=2.0, size=(300, 3)), dtype)
    family = _family(kind, 2, 3, dtype, torch.device("cpu"))
    if collapsed:  # a component at 1e6 with a tiny spread: the moment algebra would cancel, the direct path runs
        x[:40] = 1e6 + t(r.normal(scale=1e-4, size=(40, 3)), dtype)
        family.loc[1] = 1e6
    weight = torch.as_tensor(r.integers(0, 4, 300), dtype=dtype)
    repeated = x.repeat_interleave(weight.long(), dim=0)
    log_weights = t([0.6, 0.4], dtype).log()
    shift = x.mean(0)
    got = mixture_statistics(family, CentredData.from_tensor(x, shift), log_weights, row_weights=weight)
    want = mixture_statistics(family, CentredData.from_tensor(repeated, shift), log_weights)
    _assert_same(got, want, dtype, pooled=kind == "tied")


@pytest.mark.parametrize("kind", ["diag", "full"])
def test_float32_fused_estep_keeps_its_fast_path_with_many_features_and_far_rows(kind, monkeypatch):
    """50 features, components near the centre and a few rows 5 to 16 standard deviations out: the moment
    product loses no more than the direct formulas there, so float32 runs the fused pass (the two-pass
    fallback is never called; the check on the rows' per-feature maxima sent every such E-step to it)
    and gives the float64 definition's answer to float32 rounding."""
    r = rng(5)
    k, d = 3, 50
    x = r.normal(size=(4000, d))
    x[:5] = 8.0
    loc, sd = r.normal(scale=0.3, size=(k, d)), r.uniform(0.5, 1.5, size=(k, d))
    tril = np.tril(r.normal(scale=0.02, size=(k, d, d)), -1) + sd[:, :, None] * np.eye(d)

    def family(dtype):
        if kind == "diag":
            return DiagGaussian(t(loc, dtype), t(sd, dtype))
        return FullGaussian(t(loc, dtype), t(tril, dtype))

    fallbacks = []
    two_pass = ComponentFamily._expected_statistics
    monkeypatch.setattr(
        ComponentFamily, "_expected_statistics", lambda *args: fallbacks.append(args) or two_pass(*args)
    )
    log_weights = t([0.5, 0.3, 0.2]).log()
    fused = mixture_statistics(family(torch.float32), t(x, torch.float32), log_weights.float())
    assert not fallbacks
    data = CentredData.from_tensor(t(rounded(x, torch.float32)))
    _assert_same(fused, _definition(family(torch.float64), data, log_weights), torch.float32)


@pytest.mark.parametrize("far", [False, True], ids=["fused", "full-fallback"])
def test_tied_statistics_pool_the_full_familys_scatters(far):
    """``TiedGaussian.statistics`` (the rows' weighted sums and one second moment, no ``[x, x x^T]`` design) under
    soft weights that do not sum to one per row (sample weights times responsibilities): the full family's means,
    counts and scatters summed over the components; also where the rows sit 1e7 from their centre with unit spread
    (the subtraction ``S - sum_k n_k mu_k mu_k^T`` would cancel: the full path runs)."""
    dtype = torch.float64
    r = rng(7)
    x = t(r.normal(size=(400, 3)) @ r.normal(size=(3, 3)) + (1e7 if far else 2.0), dtype)
    family = _family("tied", 3, 3, dtype, torch.device("cpu"))
    weights = t(r.dirichlet(np.ones(3), size=400) * r.uniform(0.0, 3.0, size=(400, 1)), dtype)
    data = CentredData.from_tensor(x, torch.zeros(3, dtype=dtype) if far else None)
    got, want = family.statistics(data, weights), FullGaussian.statistics(family, data, weights)
    for value, ref in ((got.counts, want.counts), (got.mean, want.mean), (got.scatter.sum(0), want.scatter.sum(0))):
        assert_close(value, ref, rtol=1e-9, atol=1e-9)
