"""What a fitted :class:`~ppmix.models.hsmm.HSMM` infers about the hidden states of given sequences, as functions of
the model: smoothed marginals, the decoded path (Viterbi over segments, or each step's most probable state) and
state paths drawn from ``p(z | x)`` (:mod:`ppmix.algorithms.segments`), with the same outputs as the HMM's
(:mod:`ppmix.models._sequence_inference`). Each reads the model's emission log-densities of the sequences and its
fitted chain and durations, and nothing of other sequences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ppmix._validation import check_positive_int, to_output
from ppmix.algorithms.segments import sample_segmentations, segment_posterior, segment_viterbi
from ppmix.models._sequence_inference import DECODERS

if TYPE_CHECKING:
    from ppmix.models._sequences import SequenceBatch
    from ppmix.models.hsmm import HSMM

__all__ = ["decode_segments", "sample_segment_paths", "smoothed_states"]


def _chain_inputs(model: HSMM, X: Any) -> tuple[SequenceBatch, tuple[torch.Tensor, ...]]:
    """The batch of ``X`` and the arguments of every segment algorithm: log initial, log transition, log duration
    table, log emission densities ``(B, T, K)`` and lengths."""
    model._check_fitted()
    batch = model.prepare_data(X)
    log_emit = model._log_emissions(model._prediction_data(batch))
    return batch, (*model._log_chain(), log_emit, batch.lengths)


def smoothed_states(model: HSMM, X: Any) -> list[Any]:
    """``p(z_t = k | x)``, one ``(length, K)`` array per sequence."""
    batch, inputs = _chain_inputs(model, X)
    like = model._output_like(X)
    return [to_output(p, like) for p in batch.unpad(segment_posterior(*inputs).posterior)]


def decode_segments(model: HSMM, X: Any, algorithm: str) -> tuple[Any, list[Any]]:
    """Each sequence's decoded states and score: under ``"viterbi"`` the most probable segmentation and ``log p(x,
    segmentation)``; under ``"map"`` each step's most probable state under the smoothed marginals and ``sum_t log
    max_k p(z_t = k | x)``."""
    if algorithm not in DECODERS:
        raise ValueError(f"algorithm must be one of {DECODERS}; got {algorithm!r}")
    batch, inputs = _chain_inputs(model, X)
    if algorithm == "viterbi":
        paths, best = segment_viterbi(*inputs)
    else:
        top, paths = segment_posterior(*inputs).posterior.max(dim=-1)
        best = torch.where(batch.mask, top.clamp_min(torch.finfo(top.dtype).tiny).log(), 0.0).sum(-1)
    like = model._output_like(X)
    return to_output(best, like), [to_output(p, like) for p in batch.unpad(paths)]


def sample_segment_paths(model: HSMM, X: Any, n: int, generator: torch.Generator) -> list[Any]:
    """``n`` state paths of each sequence drawn from ``p(z | x)`` (forward filtering, backward sampling over
    segments), one ``(n, length)`` integer array per sequence; all sequences and draws in one batch."""
    n = check_positive_int(n, "n")
    batch, (log_init, log_trans, log_dur, log_emit, lengths) = _chain_inputs(model, X)
    b, steps, _ = log_emit.shape
    paths = sample_segmentations(
        log_init, log_trans, log_dur, log_emit.repeat(n, 1, 1), lengths.repeat(n), generator=generator
    )
    per_sequence = paths.reshape(n, b, steps).transpose(0, 1)  # (B, n, T)
    like = model._output_like(X)
    return [to_output(p[:, : int(length)], like) for p, length in zip(per_sequence, lengths.tolist())]
