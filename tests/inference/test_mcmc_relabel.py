"""Label switching: relabelling MCMC draws (known answers on hand-made chains), the r_hat warning, and a
two-chain NUTS fit of a 3-component GMM whose chains agree after relabelling."""

import warnings

import numpy as np
import pyro
import pytest
import torch

from ppmix import GMM, MixtureOfExperts
from ppmix.engines.draws import RHAT_THRESHOLD, ChainsDisagreeWarning, _warn_if_chains_disagree
from ppmix.engines.relabel import apply_permutations, component_axes, max_rhat, relabel_draws
from tests.common import StudentTMixture


def _draws(n_chains=2, n_draws=200, seed=0):
    """Draws of a well-identified 3-component 2-D mixture posterior in one labelling, ``{site: (C, S, ...)}``."""
    gen = torch.Generator().manual_seed(seed)
    locs = torch.tensor([[-5.0, 0.0], [0.0, 5.0], [5.0, 0.0]], dtype=torch.float64)
    weights = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    scales = torch.tensor([[0.5, 0.5], [1.0, 1.0], [2.0, 2.0]], dtype=torch.float64)
    shape = (n_chains, n_draws)
    return {
        "locs": locs + 0.1 * torch.randn(*shape, 3, 2, generator=gen, dtype=torch.float64),
        "scales": scales * torch.exp(0.05 * torch.randn(*shape, 3, 2, generator=gen, dtype=torch.float64)),
        "weights": torch.distributions.Dirichlet(400 * weights).sample(shape),
    }


GMM_AXES = {"locs": (0,), "scales": (0,), "weights": (0,)}


def _permute(samples, perms):
    """Relabel draws by hand: ``perms`` ``(C, S, K)``; label j of a draw shows component ``perms[c, s, j]``."""
    return apply_permutations(samples, GMM_AXES, np.asarray(perms))


def test_relabelling_fixes_two_chains_in_swapped_labellings():
    truth = _draws()
    swapped = _permute(truth, np.broadcast_to(np.array([[0, 1, 2], [2, 0, 1]])[:, None, :], (2, 200, 3)))
    before = max_rhat(swapped)
    assert all(value > 1.5 for value in before.values()), before  # chains in different labellings disagree
    relabelled, changed = relabel_draws(swapped, GMM_AXES)
    after = max_rhat(relabelled)
    assert all(value <= 1.05 for value in after.values()), after
    assert changed == pytest.approx(0.5)  # one chain changed labels: the reference is chain 0's labelling
    for name in truth:  # the exact draws, chain 0's labelling restored for chain 1
        torch.testing.assert_close(relabelled[name], truth[name], rtol=0, atol=0)


def test_relabelling_fixes_switches_inside_a_chain():
    truth = _draws(n_chains=2, n_draws=150, seed=1)
    rng = np.random.default_rng(0)
    perms = np.stack([[rng.permutation(3) for _ in range(150)] for _ in range(2)])  # a new labelling every draw
    relabelled, changed = relabel_draws(_permute(truth, perms), GMM_AXES)
    assert changed > 0.5
    # one global permutation separates the result from the truth (the reference is a random draw's labelling)
    order = np.argsort(relabelled["locs"][0, 0, :, 0].numpy())
    truth_order = np.argsort(truth["locs"][0, 0, :, 0].numpy())
    for name in truth:
        torch.testing.assert_close(relabelled[name][:, :, order], truth[name][:, :, truth_order], rtol=0, atol=0)
    assert max(max_rhat(relabelled).values()) <= 1.05


def test_features_that_do_not_tell_components_apart_do_not_scramble_the_labels():
    """Equal weights and scales, noisy from draw to draw, beside well-separated means (a regression: scaling
    every feature by its total spread let the noise of the weights and scales decide the labels)."""
    gen = torch.Generator().manual_seed(3)
    shape = (2, 150)
    clean = {
        "locs": torch.tensor([[-8.0], [0.0], [8.0]], dtype=torch.float64)
        + 0.2 * torch.randn(*shape, 3, 1, generator=gen, dtype=torch.float64),
        "scales": 1.0 + 0.1 * torch.randn(*shape, 3, 1, generator=gen, dtype=torch.float64).abs(),
        "weights": torch.distributions.Dirichlet(torch.full((3,), 100.0, dtype=torch.float64)).sample(shape),
    }
    relabelled, changed = relabel_draws(clean, GMM_AXES)
    assert changed == 0.0
    swapped = _permute(clean, np.broadcast_to(np.array([[0, 1, 2], [1, 2, 0]])[:, None, :], (2, 150, 3)))
    fixed, changed = relabel_draws(swapped, GMM_AXES)
    assert changed == pytest.approx(0.5)
    for name in clean:
        torch.testing.assert_close(fixed[name], clean[name], rtol=0, atol=0)


def test_permutation_acts_on_both_axes_of_a_transition_matrix():
    transition = torch.tensor([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]], dtype=torch.float64)
    samples = {"transition": transition[None, None]}
    perm = np.array([2, 0, 1])
    out = apply_permutations(samples, {"transition": (0, 1)}, perm[None, None])["transition"][0, 0]
    torch.testing.assert_close(out, transition[perm][:, perm])
    assert torch.allclose(out.sum(-1), torch.ones(3, dtype=torch.float64))


def test_chains_already_in_one_labelling_are_untouched():
    truth = _draws(seed=2)
    relabelled, changed = relabel_draws(truth, GMM_AXES)
    assert changed == 0.0
    for name in truth:
        torch.testing.assert_close(relabelled[name], truth[name], rtol=0, atol=0)


def test_component_axes_from_arviz_dims_and_from_the_program():
    x = torch.randn(30, 2, dtype=torch.float64)
    gmm = GMM(3, covariance_type="full", seed=0, progress=False).fit(x)
    samples = {k: v[None, None] for k, v in gmm._get_globals().items()}
    assert component_axes(gmm, x, samples) == {"weights": (0,), "locs": (0,), "scales": (0,), "corr_cholesky": (0,)}
    user = StudentTMixture(3, df=4.0, seed=0)
    values = {
        "weights": torch.full((3,), 1 / 3, dtype=torch.float64),
        "loc": torch.zeros(3, 2, dtype=torch.float64),
        "scale": torch.ones(3, 2, dtype=torch.float64),
    }
    assert component_axes(user, x, {k: v[None, None] for k, v in values.items()}) == {
        "weights": (0,),
        "loc": (0,),
        "scale": (0,),
    }


def test_experts_are_not_relabelled():
    """A mixture of experts' gates have a fixed reference expert, so permuting experts is not a symmetry."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 2))
    y = x[:, 0] + rng.normal(size=60)
    moe = MixtureOfExperts(2, seed=0, progress=False).fit(x, y)
    samples = {k: v[None, None] for k, v in moe._get_globals().items()}
    assert component_axes(moe, moe.prepare_data(x, y), samples) == {}


def test_warning_names_the_sites_whose_chains_disagree():
    with pytest.warns(ChainsDisagreeWarning, match=r"locs \(1\.84\), weights \(1\.20\)"):
        _warn_if_chains_disagree({"weights": 1.2, "locs": 1.84, "scales": 1.01}, relabelled=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_chains_disagree({"weights": RHAT_THRESHOLD, "locs": float("nan")}, relabelled=True)


def test_two_chain_nuts_on_a_planted_3_component_gmm_agrees_after_relabelling():
    """The bar of issue 21: two chains, r_hat <= 1.05 for every site after relabelling.

    150 draws after 150 warmup steps per chain: with 100 + 100 the scales' r_hat is about 1.05 by chance.
    """
    rng = np.random.default_rng(0)
    x = np.array([[-8.0], [0.0], [8.0]])[np.arange(90) % 3] + rng.normal(size=(90, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainsDisagreeWarning)
        warnings.filterwarnings("ignore", message="num_chains=2 is more than available_cpu")
        with pyro.validation_enabled(False):  # the conftest's validation checks cost a fifth of the run
            gmm = GMM(3, seed=0, progress=False).fit(
                x, engine="mcmc", num_samples=150, warmup_steps=150, num_chains=2, jit_compile=True
            )
    rhat = gmm.mcmc_diagnostics_["r_hat"]
    assert set(rhat) == {"weights", "locs", "scales"}
    assert max(rhat.values()) <= 1.05, rhat
    assert gmm.mcmc_samples_["locs"].shape == (2, 150, 3, 1)
    # the point estimates are the posterior means of the relabelled draws: three separate components
    np.testing.assert_allclose(np.sort(gmm.means_.numpy().ravel()), [-8, 0, 8], atol=0.6)
