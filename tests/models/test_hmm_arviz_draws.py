"""The HMM's ``to_arviz`` groups at every draw at once (issue 40): the log-likelihood and state marginals of one
forward-backward over all draws equal those of each draw's globals set in turn; the replicated data follow each
draw's own chain and emissions."""

import numpy as np
import pytest
import torch

from ppmix import HMM
from ppmix.models import _hmm_draws as hmm_draws
from ppmix.models._arviz import own_hook, pointwise_draws
from ppmix.models.pf import PFHMM


def _sequences(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [np.repeat(rng.integers(0, 3, size=(n, 1)) * 4.0, 2, axis=1) + rng.normal(size=(n, 2)) for n in lengths]


def _draws(hmm, n_draws, seed=1):
    """Draws of the globals scattered about the fit (the left-right chain's disallowed transitions included: the
    model masks them out as it does MCMC's)."""
    g = torch.Generator().manual_seed(seed)
    fitted = hmm._get_globals()

    def noise(shape):
        return torch.randn(n_draws, *shape, generator=g, dtype=torch.float64)

    k = hmm.n_components
    return {
        "initial": torch.softmax(noise((k,)), -1),
        "transition": torch.softmax(noise((k, k)), -1),
        "locs": fitted["locs"] + noise(fitted["locs"].shape),
        "scales": fitted["scales"] * (0.3 * noise(fitted["scales"].shape)).exp(),
        "corr_cholesky": fitted["corr_cholesky"].expand(n_draws, *fitted["corr_cholesky"].shape),
    }


@pytest.mark.parametrize("pattern", [None, "left-right"])
def test_log_likelihood_and_marginals_of_all_draws_equal_each_draw_set_in_turn(pattern, monkeypatch):
    seqs = _sequences([7, 3, 12, 1, 9])
    hmm = HMM(3, covariance_type="full", transition_pattern=pattern, seed=0, progress=False).fit(seqs)
    data = hmm.prepare_data(seqs)
    draws = _draws(hmm, 6)
    fitted = hmm._get_globals()
    monkeypatch.setattr(hmm_draws, "DRAW_BLOCK_CELLS", 2 * 5 * 12 * 3)  # blocks of two draws: three blocks
    loglik, marginals = pointwise_draws(hmm, data, draws)
    assert loglik.shape == (6, 5) and marginals["z"].shape == (6, 32, 3)
    for name, value in hmm._get_globals().items():  # the fit is left as it was
        assert torch.equal(value, fitted[name])
    # the reference: each draw's globals set in turn, one forward-backward per draw
    with hmm._parameters_restored():
        for i in range(6):
            hmm._set_globals({name: value[i] for name, value in draws.items()})
            np.testing.assert_allclose(loglik[i], hmm._pointwise_log_likelihood(data).numpy(), rtol=1e-8, atol=1e-8)
            np.testing.assert_allclose(marginals["z"][i], hmm._posterior_marginals(data)["z"].numpy(), atol=1e-8)
    assert len(np.unique(loglik[:, 0])) == 6  # every draw scored with its own globals


def test_replicated_data_follow_each_draws_chain_and_emissions():
    """Emissions of scale 1e-3 at locations set apart per draw give away every replicated frame's state and draw:
    the first states and the transitions counted on 400 sequences match each draw's chain."""
    lengths = [6, 4] * 200
    hmm = HMM(2, seed=0, progress=False).fit([s[:, :1] for s in _sequences(lengths)])
    data = hmm.prepare_data([np.zeros((n, 1)) for n in lengths])
    initial = torch.tensor([[0.3, 0.7], [0.8, 0.2]], dtype=torch.float64)
    transition = torch.tensor([[[0.9, 0.1], [0.5, 0.5]], [[0.2, 0.8], [0.7, 0.3]]], dtype=torch.float64)
    locs = torch.tensor([[[0.0], [10.0]], [[100.0], [110.0]]], dtype=torch.float64)
    draws = {"initial": initial, "transition": transition, "locs": locs, "scales": torch.full_like(locs, 1e-3)}
    torch.manual_seed(0)
    x = hmm._draws_replicated(data, draws)["x"]
    assert x.shape == (2, sum(lengths), 1)
    padded = x.new_zeros(2, len(lengths), 6)
    padded[:, data.mask] = x[..., 0]
    for i in range(2):
        states = (padded[i] - 100.0 * i) / 10.0
        frames = states[data.mask]
        assert torch.allclose(frames, frames.round(), atol=1e-3) and set(frames.round().tolist()) == {0.0, 1.0}
        states = states.round().long()
        assert abs(float((states[:, 0] == 0).double().mean()) - float(initial[i, 0])) < 0.1  # SE 0.02 to 0.025
        valid = data.mask[:, 1:] & data.mask[:, :-1]
        before, after = states[:, :-1][valid], states[:, 1:][valid]
        for state in (0, 1):  # at least ~500 moves from each state
            stay = float((after[before == state] == state).double().mean())
            assert abs(stay - float(transition[i, state, state])) < 0.07


def test_a_subclass_with_its_own_program_or_likelihood_is_replayed():
    """PFHMM replaces HMM's program: to_arviz replays its program per draw, not HMM's batched forward-backward; a
    subclass with its own pointwise log-likelihood has it called per draw."""

    class OwnLikelihood(HMM):
        def _pointwise_log_likelihood(self, data):
            return super()._pointwise_log_likelihood(data)

    companions = ("_pointwise_log_likelihood", "_posterior_marginals")
    assert own_hook(HMM(2), "_draws_log_likelihood", *companions) is not None
    assert own_hook(OwnLikelihood(2), "_draws_log_likelihood", *companions) is None
    assert own_hook(OwnLikelihood(2), "_draws_replicated") is not None
    assert own_hook(PFHMM(2), "_draws_log_likelihood") is None and own_hook(PFHMM(2), "_draws_replicated") is None


def test_per_step_log_likelihood_sums_to_each_sequence_and_serves_loo():
    """``to_arviz(pointwise="step")``: every draw's one-step-ahead log-likelihoods add up, sequence by sequence, to
    the log-likelihood ``pointwise="sequence"`` gives at the same draws; ``az.loo`` runs on steps; a model scoring
    whole sequences only (PFHMM) and an unknown unit are errors naming ``pointwise``."""
    import arviz as az

    seqs = _sequences([7, 3, 12, 1, 9, 8, 10, 6])
    hmm = HMM(3, seed=0, progress=False).fit(seqs, engine="gibbs", num_chains=2, num_samples=30, warmup_steps=30)
    exact = {"num_samples": 5, "log_likelihood_dtype": "float64"}  # num_samples: the prior group's draws
    by_sequence = hmm.to_arviz(**exact).log_likelihood["x"].values
    per_step = hmm.to_arviz(**exact, pointwise="step")
    steps = per_step.log_likelihood["x"].values
    assert by_sequence.shape == (2, 30, 8) and steps.shape == (2, 30, sum([7, 3, 12, 1, 9, 8, 10, 6]))
    owner = np.repeat(np.arange(8), [7, 3, 12, 1, 9, 8, 10, 6])  # the frames' sequences, in order
    summed = np.stack([steps[..., owner == b].sum(-1) for b in range(8)], axis=-1)
    np.testing.assert_allclose(summed, by_sequence, rtol=1e-10, atol=1e-9)
    assert np.isfinite(az.loo(per_step).elpd_loo)
    with pytest.raises(ValueError, match="pointwise must be 'sequence' or 'step'"):
        hmm.to_arviz(pointwise="frame")
    labels = [np.zeros(len(s), dtype=int) for s in seqs]
    pf = PFHMM(2, max_iter=5, seed=0, progress=False).fit(seqs, labels)
    with pytest.raises(ValueError, match="pointwise='step' needs the HMM's own likelihood; PFHMM"):
        pf.to_arviz(pointwise="step")
