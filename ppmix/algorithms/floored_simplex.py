"""Frequencies with a floor that holds a bounded mass: the maximiser of ``sum_c n_c log p_c`` over the probability
simplex with every ``p_c`` at least a floor.

This is the M-step of a categorical or multinomial family whose probabilities are kept off zero (so a level or
category without counts keeps a finite log-density). The floor of one of ``C`` entries is ``floor`` for up to
``FLOOR_LEVELS`` entries and ``floor * FLOOR_LEVELS / C`` beyond (:func:`entry_floor`), so all the floors together
hold at most ``FLOOR_LEVELS * floor`` however many entries there are, and the entries with counts keep their
frequencies to within that. The maximiser is exact (water-filling): by the KKT conditions ``p_c = max(f, n_c /
lam)`` with ``f`` the entry floor and ``lam`` the root of ``sum_c max(f, n_c / lam) = 1``. For the ``j`` largest
counts ``s_1 >= ... >= s_j`` set free, ``lam_j = (s_1 + ... + s_j) / (1 - f (C - j))`` satisfies ``sum_c max(f,
n_c / lam_j) >= 1``, and the sum decreases in ``lam``, so the root is the largest ``lam_j``. Since the constrained
set holds every earlier iterate of EM, an EM step with this M-step never decreases the log-likelihood.
"""

from __future__ import annotations

import torch

__all__ = ["FLOOR_LEVELS", "entry_floor", "floored_frequencies"]

#: up to this many entries each keeps the whole floor; beyond, the floors share ``FLOOR_LEVELS * floor``
FLOOR_LEVELS = 10


def entry_floor(floor: float, n_entries: int) -> float:
    """The floor of each of ``n_entries`` probabilities: ``floor``, or ``floor * FLOOR_LEVELS / n_entries`` beyond
    ``FLOOR_LEVELS`` entries (the floors hold at most ``FLOOR_LEVELS * floor`` in all).

    Examples
    --------
    >>> entry_floor(1e-4, 3), entry_floor(1e-4, 20_000) * 20_000
    (0.0001, 0.001)
    """
    return floor * min(1.0, FLOOR_LEVELS / n_entries)


def floored_frequencies(counts: torch.Tensor, floor: float) -> torch.Tensor:
    """The probabilities ``p`` (along the last dimension of ``counts``) that maximise ``sum_c counts_c log p_c``
    subject to ``sum_c p_c = 1`` and ``p_c >= entry_floor(floor, C)``; uniform where every count is zero.

    Parameters
    ----------
    counts : Tensor (..., C)
        Non-negative (weighted) counts.
    floor : float
        In ``[0, 1 / FLOOR_LEVELS)``: the floor of a probability among at most ``FLOOR_LEVELS`` (:func:`entry_floor`).

    Returns
    -------
    Tensor (..., C)
        Each vector on the simplex: ``max(entry_floor(floor, C), counts / lam)``.

    Examples
    --------
    >>> counts = torch.tensor([58.0, 32.0, 9.0, 0.0, 0.0], dtype=torch.float64)
    >>> p = floored_frequencies(counts, 1e-4)
    >>> [round(v, 6) for v in p.tolist()]  # the frequencies 0.585859, 0.323232, 0.090909, less 2e-4 in all
    [0.585741, 0.323168, 0.090891, 0.0001, 0.0001]
    >>> floored_frequencies(torch.zeros(1, 4), 1e-4).tolist()
    [[0.25, 0.25, 0.25, 0.25]]
    """
    if not 0 <= floor < 1 / FLOOR_LEVELS:
        raise ValueError(f"floor must be in [0, {1 / FLOOR_LEVELS}); got {floor!r}")
    n_entries = counts.shape[-1]
    least = entry_floor(floor, n_entries)
    ordered = counts.sort(dim=-1, descending=True).values
    free = torch.arange(1, n_entries + 1, dtype=counts.dtype, device=counts.device)
    rate = (ordered.cumsum(-1) / (1 - least * (n_entries - free))).amax(-1, keepdim=True)
    some = rate > 0
    probs = torch.where(some, (counts / torch.where(some, rate, 1.0)).clamp_min(least), 1.0 / n_entries)
    return probs / probs.sum(-1, keepdim=True)
