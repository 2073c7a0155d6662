"""An :class:`~ppmix.models.hmm.HMM` at many draws of its globals at once, for ``to_arviz``: every draw's chain,
the forward-backward over every draw's sequences in one batch, and every draw's state paths drawn together."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from ppmix.algorithms.ffbs import filter_log_likelihood
from ppmix.algorithms.forward_backward import forward_backward
from ppmix.models._sequences import SequenceBatch

if TYPE_CHECKING:
    from ppmix.models.hmm import HMM

__all__ = ["DRAW_BLOCK_CELLS", "chain_per_draw", "forward_backward_per_draw", "state_paths_per_draw"]

#: :func:`forward_backward_per_draw` runs over blocks of draws of at most this many cells (draw, sequence, step,
#: state): a few hundred MB of float64 working memory
DRAW_BLOCK_CELLS = 1 << 22


def chain_per_draw(
    hmm: "HMM", draws: dict[str, torch.Tensor], each: Callable[[], Any]
) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """Every draw's ``initial_`` ``(S, K)`` and ``transition_`` ``(S, K, K)`` as ``hmm._set_globals`` sets them
    (masked, normalised), and ``each()`` with the draw's globals set; the fitted state is restored after."""
    initial, transition, out = [], [], []
    with hmm._parameters_restored():
        for i in range(len(next(iter(draws.values())))):
            hmm._set_globals({name: value[i] for name, value in draws.items()})
            initial.append(hmm.initial_)
            transition.append(hmm.transition_)
            out.append(each())
    return torch.stack(initial), torch.stack(transition), out


def forward_backward_per_draw(
    initial: torch.Tensor,
    transition: torch.Tensor,
    log_emit: list[torch.Tensor],
    data: SequenceBatch,
    per_step: bool,
    marginals: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Every draw's log-likelihood of every sequence ``(S, B)`` (``per_step``: of every valid step given the ones
    before, ``(S, sum(lengths))``) and state marginals ``{"z": (S, sum(lengths), K)}``, from its chain
    (``initial`` ``(S, K)``, ``transition`` ``(S, K, K)``) and emission log-densities (``log_emit``: ``S`` of
    ``(B, T, K)``): one forward-backward over every draw's sequences, in blocks of :data:`DRAW_BLOCK_CELLS`; without
    ``marginals`` (and not ``per_step``) the forward filter alone (:func:`~ppmix.algorithms.ffbs.filter_log_likelihood`,
    half the work) and no marginals."""
    n_sequences, steps, k = log_emit[0].shape
    block = max(1, DRAW_BLOCK_CELLS // (n_sequences * steps * k))
    log_lik, probs = [], []
    for start in range(0, len(log_emit), block):
        chains = slice(start, start + block)
        n = len(log_emit[chains])
        chain = (
            initial[chains].log().repeat_interleave(n_sequences, 0),
            transition[chains].log().repeat_interleave(n_sequences, 0),
            torch.cat(log_emit[chains]),
            data.lengths.repeat(n).to(initial.device),
        )
        if not (marginals or per_step):
            log_lik.append(filter_log_likelihood(*chain).reshape(n, n_sequences))
            continue
        result = forward_backward(*chain)
        if per_step:
            log_lik.append(result.step_log_likelihood.reshape(n, n_sequences, steps)[:, data.mask])
        else:
            log_lik.append(result.log_likelihood.reshape(n, n_sequences))
        probs.append(result.posterior.reshape(n, n_sequences, steps, k)[:, data.mask])
    return torch.cat(log_lik), ({"z": torch.cat(probs)} if probs else {})


def state_paths_per_draw(
    initial: torch.Tensor,
    transition: torch.Tensor,
    n_sequences: int,
    length: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``n_sequences`` state paths of ``length`` steps ``(S, n_sequences, length)`` for every one of ``S`` chains
    (``initial`` ``(S, K)``, ``transition`` ``(S, K, K)``), drawn for all chains at once, step by step (torch's
    global generator unless ``generator``)."""
    n_draws = initial.shape[0]
    which = torch.arange(n_draws, device=initial.device)[:, None]
    paths = initial.new_empty(n_draws, n_sequences, length, dtype=torch.long)
    paths[..., 0] = torch.multinomial(initial, n_sequences, replacement=True, generator=generator)
    for t in range(1, length):
        rows = transition[which, paths[..., t - 1]].reshape(n_draws * n_sequences, -1)
        paths[..., t] = torch.multinomial(rows, 1, generator=generator).reshape(n_draws, n_sequences)
    return paths
