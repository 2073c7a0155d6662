"""HMM transition patterns (zeros that stay zero) and the Dirichlet prior on the rows (MAP-EM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ppmix.models._transitions import log_transition_prior, transition_mask, transition_update
from ppmix.models.hmm import HMM
from tests.common import assert_close

LEFT_RIGHT = np.array([[0.9, 0.1, 0.0], [0.0, 0.9, 0.1], [0.0, 0.0, 1.0]])
MEANS = np.array([[-4.0], [0.0], [4.0]])
QUIET = {"seed": 0, "progress": False}


def left_right_sequences(n_sequences: int = 30, length: int = 40, seed: int = 0) -> list[np.ndarray]:
    """Sequences of a 3-state left-right chain that starts in state 0, unit-variance Gaussian emissions."""
    rng = np.random.default_rng(seed)
    sequences = []
    for _ in range(n_sequences):
        z = [0]
        for _ in range(length - 1):
            z.append(int(rng.choice(3, p=LEFT_RIGHT[z[-1]])))
        sequences.append(MEANS[z] + rng.normal(size=(length, 1)))
    return sequences


PATTERNS = {"left-right": "left-right", "upper": "upper", "array": LEFT_RIGHT + np.eye(3)[::-1] * 0.2}


@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=PATTERNS.keys())
def test_disallowed_transitions_stay_exactly_zero_through_em_online_em_and_svi(pattern):
    sequences = left_right_sequences()
    mask = transition_mask(pattern, 3)
    em = HMM(3, transition_pattern=pattern, init_params="segments", **QUIET).fit(sequences)
    assert (em.transition_[~mask] == 0).all() and (em.transition_[mask] > 0).all(), em.transition_
    assert np.all(np.diff(em.history_) >= -1e-12), "EM decreased its objective"
    em.partial_fit(sequences[:5])
    assert (em.transition_[~mask] == 0).all()
    short = [s[:8] for s in sequences[:4]]
    svi = HMM(3, transition_pattern=pattern, **QUIET).fit(short, engine="svi", num_steps=5, lr=0.05)
    assert (svi.transition_[~mask] == 0).all() and torch.isfinite(svi.transition_).all()
    assert em.n_parameters == 2 + int(mask.sum()) - 3 + 3 * 2  # initial, free transitions, means and variances


def test_a_left_right_chain_is_recovered_from_the_segments_start():
    hmm = HMM(3, transition_pattern="left-right", init_params="segments", **QUIET).fit(left_right_sequences(60))
    np.testing.assert_allclose(hmm.transition_.numpy(), LEFT_RIGHT, atol=0.03)
    np.testing.assert_allclose(hmm.means_.numpy(), MEANS, atol=0.1)


def test_the_program_masks_disallowed_transitions_so_its_elbo_is_the_forward_backward_likelihood():
    """Values of the program's transition site with mass on disallowed entries (what SVI and NUTS move) are masked
    and renormalised: TraceEnum_ELBO equals the exact log-likelihood of the masked chain."""
    sequences = left_right_sequences(8, 15)
    hmm = HMM(3, transition_pattern="left-right", init_params="segments", **QUIET).fit(sequences)
    values = hmm._get_globals()
    values["transition"] = torch.full((3, 3), 1 / 3, dtype=torch.float64)
    hmm._set_globals(values)
    assert_close(
        hmm.transition_,
        transition_update(torch.ones(3, 3, dtype=torch.float64) - 1e-10, transition_mask("left-right", 3), 1.0),
    )
    assert_close(hmm.elbo(sequences), hmm.log_likelihood(sequences), rtol=1e-10)


def test_map_em_adds_the_prior_less_one_to_the_counts_and_reports_the_log_posterior():
    counts = torch.tensor([[5.0, 1.0, 0.0], [2.0, 2.0, 4.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    mask = transition_mask("upper", 3)
    update = transition_update(counts, mask, 3.0)
    assert_close(update[0, :2], torch.tensor([7.0, 3.0, 2.0], dtype=torch.float64)[:2] / 12.0, rtol=1e-9)
    assert_close(update[1], torch.tensor([0.0, 4.0, 6.0], dtype=torch.float64) / 10.0, rtol=1e-9)
    assert update[1, 0] == 0 and update[2, 2] == 1.0
    # the log density of a symmetric Dirichlet on each row's allowed entries, against torch's
    row = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    want = torch.distributions.Dirichlet(torch.full((3,), 3.0, dtype=torch.float64)).log_prob(row)
    want += torch.distributions.Dirichlet(torch.full((2,), 3.0, dtype=torch.float64)).log_prob(row[1:] / row[1:].sum())
    got = log_transition_prior(
        torch.stack(
            [
                row,
                torch.cat([row.new_zeros(1), row[1:] / row[1:].sum()]),
                torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64),
            ]
        ),
        mask,
        3.0,
    )
    assert_close(got, want, rtol=1e-12)

    sequences = left_right_sequences(10, 30)
    ml = HMM(3, transition_pattern="upper", init_params="segments", **QUIET).fit(sequences)
    hmm = HMM(3, transition_pattern="upper", transition_prior=20.0, init_params="segments", **QUIET).fit(sequences)
    assert np.all(np.diff(hmm.history_) >= -1e-12), "MAP-EM decreased the log posterior"
    n_steps = sum(len(s) for s in sequences)
    log_posterior = hmm.log_likelihood(sequences) + float(log_transition_prior(hmm.transition_, mask, 20.0))
    assert hmm.history_[-1] * n_steps == pytest.approx(log_posterior, rel=1e-10)
    # the prior pulls every row towards uniform over its allowed successors
    assert float(hmm.transition_[0, 2]) > float(ml.transition_[0, 2]) + 0.02


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"transition_pattern": "diagonal"}, "transition_pattern must be one of"),
        ({"transition_pattern": np.ones((2, 2))}, r"transition_pattern must be .*\(3, 3\) array"),
        ({"transition_pattern": [[1, 0, 0], [0, 0, 0], [0, 0, 1]]}, "row 1 allows none"),
        ({"transition_pattern": np.full((3, 3), np.nan)}, "transition_pattern must be .*finite"),
        ({"transition_prior": 0.5}, "transition_prior must be a finite number >= 1"),
        ({"transition_prior": float("inf")}, "transition_prior must be a finite number >= 1"),
        ({"init_params": "segment"}, "init_params must be one of"),
    ],
)
def test_bad_transition_settings_are_errors_naming_them(settings, match):
    with pytest.raises(ValueError, match=match):
        HMM(3, **settings, **QUIET).fit(left_right_sequences(4, 10))


def test_an_array_pattern_survives_save_and_load(tmp_path):
    sequences = left_right_sequences(6, 20)
    hmm = HMM(3, transition_pattern=PATTERNS["array"], init_params="segments", **QUIET).fit(sequences)
    hmm.save(tmp_path / "m")
    loaded = HMM.load(tmp_path / "m")
    assert_close(loaded.transition_, hmm.transition_, rtol=0, atol=0)
    loaded.fit(sequences)  # refits under the same pattern
    assert (loaded.transition_[~transition_mask(PATTERNS["array"], 3)] == 0).all()


def test_priors_set_the_transition_and_initial_concentrations_of_map_em():
    """``priors={"transition": a}`` sets what ``transition_prior`` does (one of the two, not both): MAP-EM's
    transitions are the Dirichlet modes of the expected counts; ``"initial"`` adds ``alpha - 1`` to the initial
    counts, so a strong prior pins the initial distribution."""
    sequences = left_right_sequences(10, 30)
    options = {"transition_pattern": "upper", "init_params": "segments", "tol": 1e-12, **QUIET}
    hmm = HMM(3, priors={"transition": 20.0}, **options).fit(sequences)
    counts = hmm._e_step(hmm._em_data(hmm.prepare_data(sequences)))[0]
    assert_close(hmm.transition_, transition_update(counts.transitions, transition_mask("upper", 3), 20.0), rtol=1e-6)
    pinned = HMM(3, priors={"initial": [1.0, 1.0, 1e6 + 1.0]}, **options).fit(sequences)
    assert float(pinned.initial_[2]) > 0.999  # every sequence starts in state 0; the prior says state 2
    assert np.all(np.diff(pinned.history_) >= -1e-12)
    with pytest.raises(ValueError, match=r"priors\['transition'\] and transition_prior both set"):
        HMM(3, transition_prior=2.0, priors={"transition": 3.0}, **options).fit(sequences)
    with pytest.raises(ValueError, match=r"priors\['initial'\] must be a number or broadcast to shape \(3,\)"):
        HMM(3, priors={"initial": [1.0, 2.0]}, **options).fit(sequences)
