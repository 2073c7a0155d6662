"""Segments read off labelled steps and drawn from a semi-Markov chain: the start of
:class:`~ppmix.models.hsmm.HSMM`'s EM (the runs of the k-means labels counted as segments) and its ``sample``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RunCounts", "chain_paths", "run_counts"]


@dataclass
class RunCounts:
    """Hard segment counts of labelled sequences: first states ``(K,)``, switches ``(K, K)``, durations ``(K, D)``
    (runs longer than ``D`` counted as ``D``)."""

    initial: torch.Tensor
    transitions: torch.Tensor
    durations: torch.Tensor


def run_counts(labels: torch.Tensor, mask: torch.Tensor, k: int, depth: int, weight: torch.Tensor) -> RunCounts:
    """The runs of equal labels ``(B, T)`` at the valid steps ``mask`` as segments, every sequence's counted
    ``weight (B,)`` times.

    Examples
    --------
    >>> labels = torch.tensor([[0, 0, 1, 1, 1, 0]])
    >>> counts = run_counts(labels, torch.ones(1, 6, dtype=torch.bool), 2, 2, torch.ones(1))
    >>> counts.transitions.tolist(), counts.durations.tolist()
    ([[0.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [0.0, 1.0]])
    """
    batch, steps = labels.shape
    new = mask.clone()
    new[:, 1:] &= labels[:, 1:] != labels[:, :-1]
    run = new.long().cumsum(1) - 1  # the run of every step
    flat = (torch.arange(batch, device=labels.device)[:, None] * steps + run)[mask]
    lengths = torch.bincount(flat, minlength=batch * steps).reshape(batch, steps)
    state = torch.zeros(batch, steps, dtype=torch.long, device=labels.device)
    state[torch.nonzero(new, as_tuple=True)[0], run[new]] = labels[new]
    present = lengths > 0
    run_weight = weight[:, None].expand(batch, steps).to(torch.float64)
    durations = torch.zeros(k, depth, dtype=torch.float64, device=labels.device)
    index = state[present] * depth + lengths[present].clamp_max(depth) - 1
    durations.view(-1).index_add_(0, index, run_weight[present])
    following = present[:, 1:]
    pairs = state[:, :-1][following] * k + state[:, 1:][following]
    transitions = torch.zeros(k * k, dtype=torch.float64, device=labels.device)
    transitions.index_add_(0, pairs, run_weight[:, 1:][following])
    initial = torch.zeros(k, dtype=torch.float64, device=labels.device).index_add_(0, labels[:, 0], run_weight[:, 0])
    return RunCounts(initial, transitions.reshape(k, k), durations)


def chain_paths(
    initial: torch.Tensor,
    transition: torch.Tensor,
    durations: torch.Tensor,
    n: int,
    steps: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """``n`` state paths ``(n, steps)`` of a semi-Markov chain (``initial (K,)``, ``transition (K, K)``, duration
    table ``(K, D)`` over ``1..D``), each cut at ``steps`` (so its last segment is right-censored), on the CPU.

    Examples
    --------
    >>> durations = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)  # every segment lasts two steps
    >>> flip = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> start = torch.tensor([1.0, 0.0], dtype=torch.float64)
    >>> chain_paths(start, flip, durations, 1, 5, torch.Generator().manual_seed(0)).tolist()
    [[0, 0, 1, 1, 0]]
    """
    initial, transition, durations = (p.detach().cpu().double() for p in (initial, transition, durations))
    marks = torch.full((n, steps), -1, dtype=torch.long)
    rows = torch.arange(n)
    state = torch.multinomial(initial.expand(n, -1), 1, generator=generator)[:, 0]
    start = torch.zeros(n, dtype=torch.long)
    while bool((start < steps).any()):
        live = start < steps
        marks[rows[live], start[live]] = state[live]
        start = start + torch.multinomial(durations[state], 1, generator=generator)[:, 0] + 1
        state = torch.multinomial(transition[state], 1, generator=generator)[:, 0]
    latest = torch.where(marks >= 0, torch.arange(steps).expand(n, steps), 0).cummax(1).values
    return marks.gather(1, latest)
