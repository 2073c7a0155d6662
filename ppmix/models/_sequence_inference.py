"""What a fitted HMM infers about the hidden states of given sequences, as functions of the model: the filtered
marginals ``p(z_t | x_{0:t})``, state paths drawn from ``p(z | x)`` (forward filtering, backward sampling) and the
decoded path (Viterbi's jointly most probable one, or each step's most probable state).

:class:`~ppmix.models.hmm.HMM`'s ``filter``, ``sample_paths`` and ``decode`` call these. Each reads the model's
emission log-densities of the sequences (a step whose every value is missing has density 1 under every state),
its fitted ``initial_`` and transitions (an input-driven chain's of every step), and nothing of other sequences:
a sequence's answer depends on that sequence and the model only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ppmix._validation import check_positive_int, to_output
from ppmix.algorithms.ffbs import filtered_marginals, sample_paths
from ppmix.algorithms.forward_backward import forward_backward, viterbi

if TYPE_CHECKING:
    from ppmix.models._sequences import SequenceBatch
    from ppmix.models.hmm import HMM

__all__ = ["DECODERS", "decode_states", "filter_states", "sample_state_paths"]

#: the decoding algorithms of ``HMM.decode``
DECODERS = ("viterbi", "map")


def _chain_inputs(model: HMM, X: Any) -> tuple[SequenceBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch of ``X`` and what every algorithm takes of the model: log initial, log transition ``(K, K)``
    and log emission densities ``(B, T, K)``."""
    model._check_fitted()
    batch = model.prepare_data(X)
    log_emit = model._log_emissions(model._prediction_data(batch))
    return batch, model.initial_.log(), model._log_transitions(batch), log_emit


def _per_sequence(log_trans: torch.Tensor, b: int) -> torch.Tensor:
    """The log transitions ``(B, K, K)``, or ``(B, T, K, K)`` where they vary over the steps."""
    return log_trans if log_trans.dim() == 4 else log_trans.expand(b, -1, -1)


def filter_states(model: HMM, X: Any) -> list[Any]:
    """``p(z_t = k | x_{0:t})``, one ``(length, K)`` array per sequence: what the model knows of each step's
    state from that step and the ones before it (the forward pass alone)."""
    batch, log_init, log_trans, log_emit = _chain_inputs(model, X)
    b = batch.n_sequences
    filtered = filtered_marginals(log_init.expand(b, -1), _per_sequence(log_trans, b), log_emit, batch.lengths)
    like = model._output_like(X)
    return [to_output(f, like) for f in batch.unpad(filtered)]


def sample_state_paths(model: HMM, X: Any, n: int, generator: torch.Generator) -> list[Any]:
    """``n`` state paths of each sequence drawn from ``p(z | x)``, one ``(n, length)`` integer array per
    sequence (forward filtering, backward sampling; all sequences and draws in one batch)."""
    n = check_positive_int(n, "n")
    batch, log_init, log_trans, log_emit = _chain_inputs(model, X)
    b, steps, k = log_emit.shape
    paths, _ = sample_paths(
        log_init.expand(n * b, -1),
        log_trans.repeat(n, 1, 1, 1) if log_trans.dim() == 4 else log_trans.expand(n * b, -1, -1),
        log_emit.repeat(n, 1, 1),
        batch.lengths.repeat(n),
        generator if log_emit.device.type == "cpu" else None,
    )
    per_sequence = paths.reshape(n, b, steps).transpose(0, 1)  # (B, n, T)
    like = model._output_like(X)
    return [to_output(p[:, : int(length)], like) for p, length in zip(per_sequence, batch.lengths.tolist())]


def decode_states(model: HMM, X: Any, algorithm: str) -> tuple[Any, list[Any]]:
    """Each sequence's decoded state path and its log-probability score: under ``"viterbi"`` the jointly most
    probable path and ``log p(z*, x)``; under ``"map"`` each step's most probable state under the smoothed
    marginals and ``sum_t log max_k p(z_t = k | x)``."""
    if algorithm not in DECODERS:
        raise ValueError(f"algorithm must be one of {DECODERS}; got {algorithm!r}")
    batch, log_init, log_trans, log_emit = _chain_inputs(model, X)
    if algorithm == "viterbi":
        paths, best = viterbi(log_init, log_trans, log_emit, batch.lengths)
    else:
        posterior = forward_backward(log_init, log_trans, log_emit, batch.lengths).posterior
        top, paths = posterior.max(dim=-1)
        best = torch.where(batch.mask, top.clamp_min(torch.finfo(top.dtype).tiny).log(), 0.0).sum(-1)
    like = model._output_like(X)
    return to_output(best, like), [to_output(p, like) for p in batch.unpad(paths)]
