"""Which state transitions an HMM allows, and the Dirichlet prior on the rows of its transition matrix.

A pattern fixes the support of the transition matrix: disallowed entries are zero at the start and stay
zero through every EM step (Baum–Welch's expected counts of a zero-probability transition are zero, and the
update keeps them so), and the Pyro program masks them too. ``transition_prior`` is the concentration
``alpha >= 1`` of a symmetric Dirichlet on every row's allowed entries: MAP-EM adds ``alpha - 1`` to the
expected counts (``alpha = 1``: maximum likelihood).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyro.distributions as dist
import torch

from ppmix.algorithms.simplex import log_dirichlet
from ppmix.components.family import PriorKey

__all__ = [
    "PATTERNS",
    "MarkovChain",
    "check_transition_prior",
    "log_transition_prior",
    "transition_mask",
    "transition_update",
]

#: named patterns: ``"ergodic"`` every transition; ``"left-right"`` stay or move to the next state (the last
#: state absorbing); ``"upper"`` stay or jump forward to any later state (Bakis)
PATTERNS = ("ergodic", "left-right", "upper")

#: added to every allowed count, so a state never visited keeps a uniform row over its allowed successors
_EPS = 1e-10


def transition_mask(pattern: Any, k: int, device: torch.device | None = None) -> torch.Tensor:
    """The allowed transitions ``(K, K)`` (bool; row ``i`` the successors of state ``i``) of ``pattern``.

    ``pattern`` is None or one of :data:`PATTERNS`, or a ``(K, K)`` array whose non-zero entries are the
    allowed transitions (e.g. the zeros of a starting transition matrix); every row must allow one.

    Examples
    --------
    >>> transition_mask("left-right", 3).int().tolist()
    [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    >>> transition_mask([[1, 0], [0, 0]], 2)
    Traceback (most recent call last):
    ...
    ValueError: transition_pattern must allow every state a successor; row 1 allows none
    """
    rows = torch.arange(k, device=device)
    if pattern is None or (isinstance(pattern, str) and pattern == "ergodic"):
        return torch.ones(k, k, dtype=torch.bool, device=device)
    if isinstance(pattern, str):
        if pattern == "left-right":
            return (rows[None, :] == rows[:, None]) | (rows[None, :] == rows[:, None] + 1)
        if pattern == "upper":
            return rows[None, :] >= rows[:, None]
        raise ValueError(f"transition_pattern must be one of {PATTERNS} or a (K, K) array; got {pattern!r}")
    values = np.asarray(pattern.detach().cpu() if isinstance(pattern, torch.Tensor) else pattern)
    if values.shape != (k, k) or values.dtype.kind not in "biuf" or not np.isfinite(values).all():
        raise ValueError(
            f"transition_pattern must be one of {PATTERNS} or a finite ({k}, {k}) array (n_components "
            f"squared); got shape {values.shape}, dtype {values.dtype}"
        )
    mask = torch.as_tensor(values != 0, device=device)
    empty = torch.nonzero(~mask.any(1)).flatten().tolist()
    if empty:
        raise ValueError(f"transition_pattern must allow every state a successor; row {empty[0]} allows none")
    return mask


def check_transition_prior(prior: Any) -> float:
    """``transition_prior`` as a float ``>= 1``, or a ``ValueError`` naming it."""
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not (math.isfinite(prior) and prior >= 1):
        raise ValueError(
            f"transition_prior must be a finite number >= 1 (a Dirichlet concentration; 1: maximum likelihood); "
            f"got {prior!r}"
        )
    return float(prior)


def transition_update(counts: torch.Tensor, mask: torch.Tensor, prior: float | torch.Tensor) -> torch.Tensor:
    """The (MAP-)EM transition matrix from expected counts ``(K, K)``: ``counts + prior - 1`` on the allowed
    entries (``prior`` a number or ``(K, K)``), zero elsewhere, every row normalised.

    Examples
    --------
    >>> counts = torch.tensor([[3.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    >>> transition_update(counts, transition_mask("left-right", 2), 2.0).round(decimals=6).tolist()
    [[0.666667, 0.333333], [0.0, 1.0]]
    """
    allowed = mask.to(counts.device)
    padded = torch.where(allowed, counts + (prior - 1.0) + _EPS, torch.zeros_like(counts))
    return padded / padded.sum(-1, keepdim=True)


def log_transition_prior(transition: torch.Tensor, mask: torch.Tensor, prior: float | torch.Tensor) -> torch.Tensor:
    """``sum_i log Dirichlet(transition_i restricted to its allowed entries | prior)`` (``prior`` a number or
    ``(K, K)``): the term MAP-EM's objective adds to the log-likelihood (zero for ``prior = 1``, the flat prior of
    maximum likelihood).

    Examples
    --------
    >>> t = torch.tensor([[0.5, 0.5], [0.0, 1.0]], dtype=torch.float64)
    >>> round(float(log_transition_prior(t, transition_mask("left-right", 2), 2.0)), 6)  # log(6 * 0.25) + log 1
    0.405465
    """
    if not isinstance(prior, torch.Tensor) and prior == 1.0:
        return transition.new_zeros(())
    allowed = mask.to(transition.device)
    return log_dirichlet(transition, torch.as_tensor(prior).to(transition).expand_as(transition), allowed).sum()


@dataclass(frozen=True)
class MarkovChain:
    """The hidden chain of an :class:`~ppmix.models.hmm.HMM` as a part: the transitions its pattern allows and the
    priors of the initial distribution and of the transition rows, with MAP-EM's log prior and the chain's M-step.

    The HMM builds it from its settings (:meth:`~ppmix.models.hmm.HMM._markov_chain`) and keeps the fitted
    ``initial_`` and ``transition_``.

    Parameters
    ----------
    mask : Tensor (K, K)
        The allowed transitions (:func:`transition_mask`).
    transition_concentration : float or Tensor (K, K)
        The Dirichlet concentration of every transition row's allowed entries (1: maximum likelihood).
    initial_concentration : Tensor (K,), optional
        The Dirichlet concentration of the initial distribution; None: maximum likelihood (no ``priors``).

    Examples
    --------
    >>> chain = MarkovChain(transition_mask("left-right", 2), 2.0)
    >>> counts = torch.tensor([[3.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    >>> initial, transition = chain.update(torch.tensor([3.0, 1.0], dtype=torch.float64), counts)
    >>> transition.round(decimals=6).tolist()
    [[0.666667, 0.333333], [0.0, 1.0]]
    >>> round(float(chain.log_prior(initial, transition)), 6)  # log(6 * 2/3 * 1/3) + log 1
    0.287682
    """

    mask: torch.Tensor
    transition_concentration: float | torch.Tensor
    initial_concentration: torch.Tensor | None = None

    @staticmethod
    def prior_keys() -> dict[str, PriorKey]:
        """The hyperparameters of the chain that a structure's ``priors=`` may set."""
        return {
            "initial": PriorKey("the Dirichlet concentration of the initial distribution (default 1)", "concentration"),
            "transition": PriorKey(
                "the Dirichlet concentration of every transition row's allowed entries (default transition_prior): "
                "a number, or (K, K)",
                "concentration",
            ),
        }

    def log_prior(self, initial: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
        """MAP-EM's log prior of the chain: the transition rows' Dirichlet log density (0 under maximum likelihood)
        and, with an initial concentration, the initial distribution's."""
        log_prior = log_transition_prior(transition, self.mask, self.transition_concentration)
        if self.initial_concentration is None:
            return log_prior
        return log_prior + dist.Dirichlet(self.initial_concentration).log_prob(initial)

    def update(self, initial: torch.Tensor, transitions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (MAP-)EM initial distribution and transition matrix from expected counts (``(K,)`` and ``(K, K)``,
        lightly padded; the transitions zero where the pattern allows none), in the counts' dtype."""
        initial = initial + _EPS
        if self.initial_concentration is not None:
            initial = initial + self.initial_concentration - 1
        return initial / initial.sum(), transition_update(transitions, self.mask, self.transition_concentration)
