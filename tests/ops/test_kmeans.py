"""k-means for EM starts: nearest-centre assignment, Lloyd, and the subsampled start."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from ppmix.algorithms.kmeans import kmeans, kmeans_plusplus, kmeans_start, nearest_centre


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    k=st.integers(1, 5),
    d=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    exponent=st.sampled_from([-150, 0, 150]),
)
def test_nearest_centre_is_the_brute_force_argmin_at_any_scale(n, k, d, seed, exponent):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * 2.0**exponent
    centres = torch.randn(k, d, generator=gen, dtype=torch.float64) * 2.0**exponent
    brute = ((x[:, None, :] / 2.0**exponent - centres[None] / 2.0**exponent) ** 2).sum(-1)
    labels = nearest_centre(x, centres)
    # ties aside, the chosen centre is at the smallest distance
    chosen = brute.gather(1, labels[:, None]).squeeze(1)
    assert torch.allclose(chosen, brute.min(1).values, rtol=1e-9, atol=1e-12)


def _blobs(n_per: int, k: int, d: int, seed: int, sizes=None) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = sizes or [n_per] * k
    centres = rng.normal(scale=40.0, size=(k, d))
    z = np.repeat(np.arange(k), sizes)
    return torch.as_tensor(centres[z] + rng.normal(size=(len(z), d))), z


@pytest.mark.parametrize("sample_size", [None, 300])
def test_kmeans_recovers_separated_clusters_and_assigns_every_row_to_its_nearest_centre(sample_size):
    x, z = _blobs(2000, 4, 3, seed=0, sizes=[4000, 2000, 1500, 500])
    centres, labels = kmeans(x, 4, torch.Generator().manual_seed(0), n_init=3, sample_size=sample_size)
    assert labels.shape == (x.shape[0],)
    assert adjusted_rand_score(z, labels.numpy()) == pytest.approx(1.0)
    assert torch.equal(labels, nearest_centre(x, centres))


def test_sampled_start_costs_one_pass_over_the_rows_beyond_the_sample(monkeypatch):
    """With a sample, Lloyd runs on ``sample_size`` rows only: every distance product but the final
    assignment has that many rows."""
    import ppmix.algorithms.kmeans as module

    x, _ = _blobs(5000, 3, 2, seed=1)
    seen: list[int] = []
    original = torch.addmm

    def counting(*args, **kwargs):
        seen.append(max(a.shape[0] if a.dim() == 2 else 0 for a in args[1:3]))
        seen[-1] = max(seen[-1], *(a.shape[1] for a in args[1:3] if a.dim() == 2))
        return original(*args, **kwargs)

    monkeypatch.setattr(module.torch, "addmm", counting)
    kmeans(x, 3, torch.Generator().manual_seed(0), n_init=2, sample_size=500)
    assert sum(rows >= x.shape[0] for rows in seen) == 1
    assert all(rows <= 500 for rows in seen if rows < x.shape[0])


def test_kmeans_is_deterministic_given_the_generator_and_keeps_the_better_run():
    x, _ = _blobs(300, 5, 2, seed=2)
    one = kmeans(x, 5, torch.Generator().manual_seed(4), n_init=3, sample_size=400)
    two = kmeans(x, 5, torch.Generator().manual_seed(4), n_init=3, sample_size=400)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    single = kmeans(x, 5, torch.Generator().manual_seed(4), n_init=1)
    best = kmeans(x, 5, torch.Generator().manual_seed(4), n_init=4)

    def inertia(result):
        return float((x - result[0][result[1]]).square().sum())

    assert inertia(best) <= inertia(single) + 1e-9


def test_weighted_seeding_and_start_never_use_a_row_of_weight_zero():
    """Rows of weight zero are never a centre; a cluster carried only by weight (few rows, large weights)
    gets a centre of its own."""
    gen = torch.Generator().manual_seed(0)
    heavy = torch.full((3, 2), 10.0)  # 3 rows of weight 100
    light = torch.randn(300, 2, generator=gen, dtype=torch.float64).float()
    ghost = torch.full((200, 2), -50.0)  # weight 0: as if absent
    x = torch.cat([heavy, light, ghost]).double()
    weight = torch.cat([torch.full((3,), 100.0), torch.ones(300), torch.zeros(200)]).double()
    for seed in range(5):
        centres = kmeans_plusplus(x, 2, torch.Generator().manual_seed(seed), weight=weight)
        assert (centres > -40).all(), centres
        centres, labels = kmeans_start(x, 2, torch.Generator().manual_seed(seed), weight=weight)
        assert sorted(torch.round(centres[:, 0]).tolist()) == [0.0, 10.0], centres
        assert labels[0] != labels[3]


@pytest.mark.parametrize("seed", range(6))
def test_restarts_ending_in_the_same_partition_keep_the_first_whatever_the_rounding(monkeypatch, seed):
    """k-means runs that end in one partition (its clusters in another order) differ in inertia by rounding
    alone, which differs between CPU and CUDA: the first run must be kept, or the start, and so the order of
    EM's components, changes with the device. Rounding noise of 1e-14 is planted in every run's inertia."""
    import ppmix.algorithms.kmeans as module

    x, _ = _blobs(300, 3, 2, seed=seed)
    clean = kmeans(x, 3, torch.Generator().manual_seed(seed), n_init=4)
    noise = np.random.default_rng(seed)
    lloyd = module._lloyd

    def rounded_differently(*args, **kwargs):
        centres, labels, inertia = lloyd(*args, **kwargs)
        return centres, labels, [value * (1.0 + noise.uniform(-1e-14, 1e-14)) for value in inertia]

    monkeypatch.setattr(module, "_lloyd", rounded_differently)
    noisy = kmeans(x, 3, torch.Generator().manual_seed(seed), n_init=4)
    assert torch.equal(noisy[0], clean[0]) and torch.equal(noisy[1], clean[1])


@settings(max_examples=25, deadline=None)
@given(exponent=st.floats(-300, 300), seed=st.integers(0, 1000))
def test_weighted_start_is_the_same_whatever_the_scale_of_the_weights(exponent, seed):
    """The start draws in proportion to the weights divided by the power of two at their largest (float64): a
    common scale of the weights, 1e-300 to 1e300, leaves the draws, and so the start, as they are."""
    x, _ = _blobs(40, 3, 2, seed=seed % 7)
    weight = torch.as_tensor(np.random.default_rng(seed).uniform(0.5, 2.0, len(x)))
    reference = kmeans_start(x, 3, torch.Generator().manual_seed(seed), weight=weight)
    scaled = kmeans_start(x, 3, torch.Generator().manual_seed(seed), weight=weight * 10.0**exponent)
    assert torch.equal(scaled[1], reference[1]) and torch.equal(scaled[0], reference[0])


@pytest.mark.parametrize("largest", [3e38, 1e-30])
def test_weighted_start_draws_from_float32_weights_whose_sum_overflows_or_whose_scale_is_tiny(largest):
    """float32 weights near the top of their range (their sum overflows) or all tiny (their squares underflow) gave
    torch's "invalid multinomial distribution"; the start now draws from them as from any other scale."""
    x, _ = _blobs(30, 2, 2, seed=3)
    weight = torch.full((len(x),), largest, dtype=torch.float32)
    centres, labels = kmeans_start(x.float(), 2, torch.Generator().manual_seed(0), weight=weight)
    reference = kmeans_start(x.float(), 2, torch.Generator().manual_seed(0), weight=torch.ones_like(weight))
    assert torch.isfinite(centres).all() and torch.equal(labels, reference[1])


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 0.0])
def test_weighted_start_refuses_weights_it_cannot_draw_from_naming_sample_weight(bad):
    x, _ = _blobs(10, 2, 2, seed=0)
    weight = torch.full((len(x),), bad if bad == 0.0 else 1.0, dtype=torch.float64)
    weight[0] = bad
    with pytest.raises(ValueError, match="sample_weight"):
        kmeans_start(x, 2, torch.Generator().manual_seed(0), weight=weight)
