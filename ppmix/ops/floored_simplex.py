"""Frequencies with a floor that holds a bounded mass: the maximiser of ``sum_c n_c log p_c`` over the probability
simplex with every ``p_c >= floor_mass / C``.

This is the M-step of a categorical or multinomial family whose probabilities are kept off zero (so a level or
category without counts keeps a finite log-density): the floor of one entry is ``floor_mass / C``, so all the
floors together hold at most ``floor_mass``, however many entries there are, and the entries with counts keep
their frequencies to within ``floor_mass``. The maximiser is exact (water-filling): by the KKT conditions
``p_c = max(floor, n_c / lam)`` with ``lam`` the root of ``sum_c max(floor, n_c / lam) = 1``. For the ``j`` largest
counts ``s_1 >= ... >= s_j`` set free, ``lam_j = (s_1 + ... + s_j) / (1 - floor (C - j))`` satisfies
``sum_c max(floor, n_c / lam_j) >= 1``, and the sum decreases in ``lam``, so the root is the largest ``lam_j``.
Since the constrained set holds every earlier iterate of EM, an EM step with this M-step never decreases the
log-likelihood.
"""

from __future__ import annotations

import torch

__all__ = ["floored_frequencies"]


def floored_frequencies(counts: torch.Tensor, floor_mass: float) -> torch.Tensor:
    """The probabilities ``p`` (along the last dimension of ``counts``) that maximise ``sum_c counts_c log p_c``
    subject to ``sum_c p_c = 1`` and ``p_c >= floor_mass / C``; uniform where every count is zero.

    Parameters
    ----------
    counts : Tensor (..., C)
        Non-negative (weighted) counts.
    floor_mass : float
        In ``[0, 1)``: the most probability that the floors hold together (each entry's floor is
        ``floor_mass / C``).

    Returns
    -------
    Tensor (..., C)
        Each vector on the simplex: ``max(floor_mass / C, counts / lam)``.

    Examples
    --------
    >>> counts = torch.tensor([58.0, 32.0, 9.0, 0.0, 0.0], dtype=torch.float64)
    >>> p = floored_frequencies(counts, 1e-4)
    >>> [round(v, 6) for v in p.tolist()]  # the frequencies 0.585859, 0.323232, 0.090909, less 4e-5 in all
    [0.585835, 0.323219, 0.090905, 2e-05, 2e-05]
    >>> floored_frequencies(torch.zeros(1, 4), 1e-4).tolist()
    [[0.25, 0.25, 0.25, 0.25]]
    """
    if not 0 <= floor_mass < 1:
        raise ValueError(f"floor_mass must be in [0, 1); got {floor_mass!r}")
    n_levels = counts.shape[-1]
    floor = floor_mass / n_levels
    ordered = counts.sort(dim=-1, descending=True).values
    free = torch.arange(1, n_levels + 1, dtype=counts.dtype, device=counts.device)
    rate = (ordered.cumsum(-1) / (1 - floor * (n_levels - free))).amax(-1, keepdim=True)
    some = rate > 0
    probs = torch.where(some, (counts / torch.where(some, rate, 1.0)).clamp_min(floor), 1.0 / n_levels)
    return probs / probs.sum(-1, keepdim=True)
