"""The transitions of an input-driven HMM: a softmax gate on each step's inputs for every state the chain leaves.

``p(z_t = j | z_{t-1} = i, u_t) = softmax_j(u_t^T coef[i, j] + intercept[i, j])``, the last state the reference
(its slopes and intercept zero), as dynamax's input-driven HMMs write it. :class:`InputDrivenChain` is the part an
:class:`~ppmix.models.hmm.HMM` with ``transitions="input-driven"`` holds (built from its fitted
``transition_coef_`` and ``transition_intercept_``): the per-step log transition matrices ``(B, T, K, K)`` the
forward-backward takes (:mod:`ppmix.algorithms.forward_backward`), and Baum-Welch's M-step of the chain, one softmax
regression per source state on the steps' inputs with the posterior pair marginals ``q(z_{t-1} = i, z_t = j)`` as
soft targets (:class:`~ppmix.components.SoftmaxGate`'s damped Newton). With inputs constant over the steps the gates
are constant too and the chain is the homogeneous one: its M-step then gives the normalised expected counts.

:func:`pad_inputs` validates the ``inputs=`` a user passes beside the sequences and pads them like the sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ppmix._validation import check_matrix
from ppmix.components.softmax_gate import SoftmaxGate

__all__ = ["TRANSITION_KINDS", "InputDrivenChain", "SequencesWithInputs", "pad_inputs"]

#: the kinds of transitions an HMM takes: one matrix for every step ("stationary", dynamax's name, is the same), or a
#: softmax gate on each step's inputs
TRANSITION_KINDS = ("homogeneous", "stationary", "input-driven")


@dataclass(frozen=True)
class SequencesWithInputs:
    """Sequences and their per-step inputs travelling together to ``prepare_data`` (what ``inputs=`` makes)."""

    sequences: Any
    inputs: Any


@dataclass
class InputDrivenChain:
    """Softmax-gated transitions: ``coef`` ``(K, K, P)`` (``[i, j]`` the slopes of the move ``i -> j``) and
    ``intercept`` ``(K, K)``, the last column zero.

    Examples
    --------
    >>> import torch
    >>> chain = InputDrivenChain.from_transition(torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64), 3)
    >>> log_trans = chain.log_transitions(torch.zeros(1, 4, 3, dtype=torch.float64))  # no inputs: the matrix
    >>> log_trans.shape, log_trans[0, 2].exp().round(decimals=6).tolist()
    (torch.Size([1, 4, 2, 2]), [[0.9, 0.1], [0.2, 0.8]])
    """

    coef: torch.Tensor
    intercept: torch.Tensor

    @classmethod
    def from_transition(cls, transition: torch.Tensor, n_inputs: int) -> InputDrivenChain:
        """The chain whose every step moves by ``transition`` ``(K, K)`` whatever the inputs (zero slopes)."""
        log_trans = transition.clamp_min(torch.finfo(transition.dtype).tiny).log()
        k = transition.shape[0]
        return cls(transition.new_zeros(k, k, n_inputs), log_trans - log_trans[:, -1:])

    @property
    def n_inputs(self) -> int:
        return int(self.coef.shape[-1])

    def log_transitions(self, inputs: torch.Tensor) -> torch.Tensor:
        """``log p(z_t = j | z_{t-1} = i, u_t)`` at ``[b, t, i, j]`` for inputs ``(B, T, P)``."""
        logits = torch.einsum("btp,ijp->btij", inputs.to(self.coef), self.coef) + self.intercept
        return logits.log_softmax(dim=-1)

    def at_zero_inputs(self) -> torch.Tensor:
        """The transition matrix ``(K, K)`` of a step whose inputs are all zero."""
        return self.intercept.softmax(dim=-1)

    def update(self, inputs: torch.Tensor, step_pairs: torch.Tensor, mask: torch.Tensor) -> InputDrivenChain:
        """The M-step: for every source state ``i``, the softmax regression of the moves out of it on the inputs
        of the steps ``t >= 1`` of every sequence (``mask`` ``(B, T)`` the valid ones), with soft targets
        ``step_pairs[b, t, i, :]`` (each step weighted by ``q(z_{t-1} = i)``), started at the current gates."""
        moves = mask[:, 1:] & mask[:, :-1]
        rows = inputs[:, 1:][moves].to(self.coef)  # (N, P)
        targets = step_pairs[:, 1:][moves]  # (N, K, K)
        coef, intercept = self.coef.clone(), self.intercept.clone()
        for i in range(coef.shape[0]):
            gate = SoftmaxGate(self.coef[i], self.intercept[i]).fit(rows, targets[:, i])
            coef[i], intercept[i] = gate.coef, gate.intercept
        return InputDrivenChain(coef, intercept)


def pad_inputs(
    inputs: Any, lengths: list[int], *, dtype: torch.dtype, device: Any, n_inputs: int | None = None
) -> torch.Tensor:
    """The per-step inputs of every sequence, ``(B, T, P)`` padded like the sequences (a padded step repeats its
    sequence's last inputs), from one ``(T_b, P)`` array per sequence (a 1-D array: one input per step).

    Raises
    ------
    ValueError
        ``inputs`` not one array per sequence, an array whose length is not its sequence's, inputs of another
        width than ``n_inputs`` (the fitted one) or than the first sequence's, or non-finite inputs.

    Examples
    --------
    >>> import numpy as np
    >>> pad_inputs([np.ones(3), np.zeros(2)], [3, 2], dtype=torch.float64, device="cpu").shape
    torch.Size([2, 3, 1])
    """
    if not isinstance(inputs, (list, tuple)) or len(inputs) != len(lengths):
        raise ValueError(f"inputs must be one (length, n_inputs) array per sequence: {len(lengths)} of them")
    padded = []
    for b, (values, length) in enumerate(zip(inputs, lengths)):
        values = values if isinstance(values, torch.Tensor) else np.asarray(values, dtype=np.float64)
        values = values.reshape(-1, 1) if values.ndim == 1 else values
        tensor, _ = check_matrix(values, f"inputs[{b}]", dtype=dtype, device=device)
        if tensor.shape[0] != length:
            raise ValueError(f"inputs[{b}] has {tensor.shape[0]} steps but sequence {b} has {length}")
        width = n_inputs if n_inputs is not None else (padded[0].shape[1] if padded else tensor.shape[1])
        if tensor.shape[1] != width:
            fitted = " (the fitted model's)" if n_inputs is not None else " (inputs[0]'s)"
            raise ValueError(f"inputs[{b}] has {tensor.shape[1]} inputs per step, expected {width}{fitted}")
        padded.append(tensor)
    out = torch.nn.utils.rnn.pad_sequence(padded, batch_first=True)
    for b, length in enumerate(lengths):
        out[b, length:] = out[b, length - 1]
    return out
