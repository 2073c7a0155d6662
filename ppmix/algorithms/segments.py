"""Explicit-duration (semi-Markov) chains: the segment forward–backward, Viterbi over segments and draws of
segmentations, batched over sequences of different lengths, in log space, in ``O(T K D)`` per sequence.

A segmentation of a sequence of ``T`` steps is a run of segments ``(k_1, d_1), ..., (k_n, d_n)`` with
``d_1 + ... + d_n = T``: the first state drawn from the initial distribution, every next one from the transition
row of the state before it (a semi-Markov chain usually has a zero diagonal), every duration from its state's
distribution over ``1..D`` (``log_dur[k, d - 1] = log p_k(d)``); each step of a segment emits from the segment's
state. The last segment is *right-censored*: it runs at least to the sequence's end, which has the probability
``P_k(duration >= d)`` (a sequence cut from a longer run). That is the likelihood of the expanded-state HMM of the
same chain (states ``(k, steps left)``), and draws of a fixed length cut from the chain follow it.

Boundary ``t`` (``0..T``) lies before step ``t``. The forward pass keeps ``ends[t, k] = log p(x_{<t}, a segment of
state k ends at t)`` and ``starts[s, k] = log p(x_{<s}, a segment of state k starts at s)``; a segment's emissions
are differences of the cumulative emissions, so each boundary costs ``O(K D + K^2)``. With ``reduce="max"`` the
same pass gives the best segmentation's scores (Viterbi), and one backtrack serves Viterbi (argmax) and draws
from the posterior (argmax after Gumbel noise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ppmix.algorithms.forward_backward import _check_inputs

__all__ = [
    "SegmentForward",
    "SegmentPosterior",
    "sample_segmentations",
    "segment_forward",
    "segment_posterior",
    "segment_viterbi",
]

_NEG_INF = float("-inf")


@dataclass
class SegmentForward:
    """The forward pass over a batch: ``ends (B, T + 1, K)``, ``starts (B, T, K)`` (above), ``cumulative (B, T + 1,
    K)`` the emissions summed before every boundary, ``shifted (B, D + T, K)`` holding ``starts[s] - cumulative[s]``
    at ``[s + D]`` (``-inf`` before ``s = 0``), ``log_likelihood (B,)`` (the best segmentation's log probability for
    ``reduce="max"``), ``lengths (B,)``, the ``log_duration`` and ``log_survival`` tables ``(K, D)``, and where some
    emission is ``-inf``, ``blocked (B, T + 1, K)``: how many such steps come before every boundary (the emissions
    summed in ``cumulative`` are the finite ones, and a segment is impossible where its count rises)."""

    ends: torch.Tensor
    starts: torch.Tensor
    cumulative: torch.Tensor
    shifted: torch.Tensor
    log_likelihood: torch.Tensor
    lengths: torch.Tensor
    log_duration: torch.Tensor
    log_survival: torch.Tensor
    blocked: torch.Tensor | None = None

    def start_windows(self, boundary: torch.Tensor) -> torch.Tensor:
        """``starts[b, s, k] - cumulative[b, s, k]`` at ``s = boundary[b] - d`` for ``d = 1..D``, ``(B, D, K)``,
        ``-inf`` where ``s < 0`` or the segment from ``s`` to ``boundary`` holds an impossible step."""
        depth, k = self.log_duration.shape[1], self.shifted.shape[-1]
        index = boundary[:, None] + torch.arange(depth - 1, -1, -1, device=boundary.device)[None, :]  # s + D
        values = self.shifted.gather(1, index[..., None].expand(-1, -1, k))
        if self.blocked is None:
            return values
        before = self.blocked.gather(1, (index - depth).clamp_min(0)[..., None].expand(-1, -1, k))
        at = self.blocked.gather(1, boundary[:, None, None].expand(-1, 1, k))
        return values.masked_fill(at > before, _NEG_INF)


@dataclass
class SegmentPosterior:
    """The segment forward–backward's expected counts, per sequence.

    Attributes
    ----------
    log_likelihood : Tensor (B,)
    posterior : Tensor (B, T, K)
        ``p(z_t = k | x)``, zero at padded steps.
    initial : Tensor (B, K)
        The first segment's state.
    transitions : Tensor (B, K, K)
        Expected switches ``j -> k`` between segments.
    durations : Tensor (B, K, D)
        Expected complete segments of state ``k`` lasting ``d`` (``[..., d - 1]``).
    censored : Tensor (B, K, D)
        Expected last segments of state ``k`` seen for ``d`` steps (their duration ``>= d``).
    """

    log_likelihood: torch.Tensor
    posterior: torch.Tensor
    initial: torch.Tensor
    transitions: torch.Tensor
    durations: torch.Tensor
    censored: torch.Tensor


def _checked(log_init: Any, log_trans: Any, log_dur: Any, log_emit: Any, lengths: Any) -> tuple:
    """The inputs validated as :func:`~ppmix.algorithms.forward_backward.forward_backward` validates them (padded
    emissions zeroed, trimmed to the longest sequence), with ``log_dur`` a ``(K, D)`` table, and the padded length."""
    log_init, log_trans, emit, lengths, _, t_full = _check_inputs(log_init, log_trans, log_emit, lengths)
    if log_init.dim() != 1 or log_trans.dim() != 2:
        raise ValueError("log_init and log_trans must be shared by the batch: shapes (K,) and (K, K)")
    log_dur = torch.as_tensor(log_dur).to(emit)
    k = emit.shape[-1]
    if log_dur.dim() != 2 or log_dur.shape[0] != k or log_dur.shape[1] < 1:
        raise ValueError(
            f"log_dur must have shape ({k}, D) with D >= 1 (log p_k(d), d = 1..D); got {tuple(log_dur.shape)}"
        )
    if bool((torch.isnan(log_dur) | torch.isposinf(log_dur)).any()):
        raise ValueError("log_dur contains NaN or +inf (log-probabilities may be finite or -inf)")
    return log_init, log_trans, log_dur, emit, lengths, t_full


def _cumulative(emit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The emissions summed before every boundary ``(B, T + 1, K)``, the ``-inf`` ones left out and counted in the
    second tensor (None where there are none): differences of sums holding ``-inf`` would be NaN."""
    impossible = torch.isneginf(emit)
    zero = emit.new_zeros(emit.shape[0], 1, emit.shape[-1])
    if not bool(impossible.any()):
        return torch.cat([zero, emit.cumsum(1)], 1), None
    finite = emit.masked_fill(impossible, 0.0)
    counts = torch.cat([zero.long(), impossible.long().cumsum(1)], 1)
    return torch.cat([zero, finite.cumsum(1)], 1), counts


def _check_possible(score: torch.Tensor) -> None:
    """A ``ValueError`` naming the sequences that no segmentation explains."""
    if not bool(torch.isfinite(score).all()):
        bad = torch.nonzero(~torch.isfinite(score)).flatten().tolist()
        raise ValueError(f"sequence(s) {bad[:10]} have probability zero under the chain (no segmentation is possible)")


def _reduce(values: torch.Tensor, dim: int | tuple[int, ...], how: str) -> torch.Tensor:
    if how == "sum":
        return torch.logsumexp(values, dim)
    return values.amax(dim)


def segment_forward(
    log_init: Any, log_trans: Any, log_dur: Any, log_emit: Any, lengths: Any = None, *, reduce: str = "sum"
) -> SegmentForward:
    """The forward pass of an explicit-duration chain over a batch of sequences.

    Parameters
    ----------
    log_init : Tensor (K,)
        Log probabilities of the first segment's state.
    log_trans : Tensor (K, K)
        Log probabilities ``[j, k]`` of a segment of state ``k`` following one of state ``j``.
    log_dur : Tensor (K, D)
        ``log p_k(d)`` at ``[k, d - 1]``, ``d = 1..D``.
    log_emit : Tensor (B, T, K)
        Log emission densities; padded steps (``t >= lengths[b]``) are ignored.
    lengths : Tensor (B,) of integers, optional
        Valid steps of every sequence (all ``T`` when omitted).
    reduce : {"sum", "max"}
        Sum over segmentations (the likelihood) or take the best one (Viterbi).

    Returns
    -------
    SegmentForward

    Examples
    --------
    One state that lasts one step or two, each with probability 1/2, and flat emissions: the chain covers three
    steps with probability one (the cuts 1+1+1, 1+2, 2+1, each last segment censored, have 1/4, 1/4 and 1/2):

    >>> import math
    >>> log_dur = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    >>> fwd = segment_forward(torch.zeros(1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64), log_dur,
    ...                       torch.zeros(1, 3, 1, dtype=torch.float64))
    >>> round(math.exp(float(fwd.log_likelihood[0])), 6)
    1.0
    """
    if reduce not in ("sum", "max"):
        raise ValueError(f"reduce must be 'sum' or 'max'; got {reduce!r}")
    log_init, log_trans, log_dur, emit, lengths, _ = _checked(log_init, log_trans, log_dur, log_emit, lengths)
    batch, steps, k = emit.shape
    depth = log_dur.shape[1]
    cumulative, blocked = _cumulative(emit)
    padded_blocked = None if blocked is None else torch.cat([blocked[:, :1].expand(-1, depth, -1), blocked], 1)
    window = emit.new_full((batch, steps + depth, k), _NEG_INF)  # [s + D] = starts[s] - cumulative[s]
    ends = emit.new_full((batch, steps + 1, k), _NEG_INF)
    starts = emit.new_full((batch, steps, k), _NEG_INF)
    starts[:, 0] = log_init
    dur_rev = log_dur.flip(1).T  # row i: d = D - i, matching window rows s = t - D + i
    for t in range(1, steps + 1):
        window[:, t - 1 + depth] = starts[:, t - 1] - cumulative[:, t - 1]
        scores = window[:, t : t + depth] + dur_rev
        if padded_blocked is not None:  # segments over an impossible step
            scores = scores.masked_fill(blocked[:, t, None] > padded_blocked[:, t : t + depth], _NEG_INF)
        ends[:, t] = cumulative[:, t] + _reduce(scores, 1, reduce)
        if t < steps:
            starts[:, t] = _reduce(ends[:, t, :, None] + log_trans, 1, reduce)
    log_survival = torch.logcumsumexp(log_dur.flip(1), 1).flip(1)
    fwd = SegmentForward(
        ends, starts, cumulative, window, emit.new_zeros(batch), lengths, log_dur, log_survival, blocked
    )
    rows = torch.arange(batch, device=emit.device)
    last = fwd.start_windows(lengths) + log_survival.T + cumulative[rows, lengths][:, None]
    fwd.log_likelihood = _reduce(last.flatten(1), 1, reduce)
    return fwd


def segment_posterior(
    log_init: Any, log_trans: Any, log_dur: Any, log_emit: Any, lengths: Any = None
) -> SegmentPosterior:
    """The segment forward–backward: log-likelihoods and the expected counts of EM for a semi-Markov chain.

    The arguments are :func:`segment_forward`'s. A sequence of probability zero is a ``ValueError``.

    Examples
    --------
    >>> log_emit = torch.randn(2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> log_trans = torch.full((3, 3), 0.5, dtype=torch.float64).fill_diagonal_(0.0).log()
    >>> log_dur = torch.full((3, 4), 0.25, dtype=torch.float64).log()
    >>> log_init = torch.full((3,), 1 / 3, dtype=torch.float64).log()
    >>> post = segment_posterior(log_init, log_trans, log_dur, log_emit, torch.tensor([6, 4]))
    >>> post.posterior.sum(-1)[1].round(decimals=12).tolist()
    [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    >>> bool(torch.allclose(post.initial.sum(-1), torch.ones(2, dtype=torch.float64)))
    True
    """
    log_init, log_trans, log_dur, emit, lengths, t_full = _checked(log_init, log_trans, log_dur, log_emit, lengths)
    fwd = segment_forward(log_init, log_trans, log_dur, emit, lengths)
    ll = fwd.log_likelihood
    _check_possible(ll)
    batch, steps, k = emit.shape
    depth = log_dur.shape[1]
    rows = torch.arange(batch, device=emit.device)
    cumulative, lengths_col = fwd.cumulative, lengths[:, None]
    # tail[:, e] = cumulative[e] + beta[e] for boundaries e < length, -inf elsewhere (padded by D on the right)
    tail = emit.new_full((batch, steps + 1 + depth, k), _NEG_INF)
    beta_start = emit.new_full((batch, steps, k), _NEG_INF)
    beta_end = emit.new_full((batch, steps + 1, k), _NEG_INF)
    durations = emit.new_zeros(batch, depth, k)
    censored = emit.new_zeros(batch, depth, k)
    dur_t = log_dur.T  # (D, K), row d - 1
    end_total = cumulative[rows, lengths]  # (B, K)
    blocked = fwd.blocked
    if blocked is not None:  # padded on the right as far as the last segment reaches
        end_blocked = blocked[rows, lengths]
        blocked = torch.cat([blocked, blocked[:, -1:].expand(-1, depth, -1)], 1)
    for s in range(steps - 1, -1, -1):
        # log weights of the segments starting at s, by duration (complete) and censored at the end (final), each
        # short of -cumulative[s]; summed with their largest taken out, whose exp is reused for the counts
        complete = tail[:, s + 1 : s + 1 + depth] + dur_t  # (B, D, K)
        if blocked is not None:  # segments over an impossible step
            complete = complete.masked_fill(blocked[:, s + 1 : s + 1 + depth] > blocked[:, s, None], _NEG_INF)
        left = lengths - s  # the censored last segment's steps from s
        can_end = ((left >= 1) & (left <= depth))[:, None]
        if blocked is not None:
            can_end = can_end & (end_blocked <= blocked[:, s])
        final = (fwd.log_survival.T[(left - 1).clamp(0, depth - 1)] + end_total).masked_fill(~can_end, _NEG_INF)
        top = torch.maximum(complete.amax(1), final)  # -inf where no segment can start at s
        shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = (complete - shift[:, None]).exp_()
        beta_start[:, s] = shift + (weights.sum(1) + (final - shift).exp()).log() - cumulative[:, s]
        lead = fwd.starts[:, s] - ll[:, None] - cumulative[:, s]
        durations.addcmul_(weights, (top + lead).exp()[:, None])  # top + lead: the largest posterior, <= 0
        censored.scatter_add_(
            1, (left - 1).clamp(0, depth - 1)[:, None, None].expand(batch, 1, k), (final + lead).exp()[:, None]
        )
        if s > 0:
            beta_end[:, s] = torch.logsumexp(log_trans + beta_start[:, s, None, :], -1)
            tail[:, s] = torch.where(s < lengths_col, cumulative[:, s] + beta_end[:, s], _NEG_INF)
    start_prob = (fwd.starts + beta_start - ll[:, None, None]).exp()
    end_prob = (fwd.ends[:, 1:steps] + beta_end[:, 1:steps] - ll[:, None, None]).exp()
    occupancy = start_prob.cumsum(1)
    occupancy[:, 1:] -= end_prob.cumsum(1)
    mask = torch.arange(steps, device=emit.device)[None, :] < lengths_col
    occupancy = occupancy.clamp_min(0) * mask[..., None]
    occupancy = occupancy / occupancy.sum(-1, keepdim=True).clamp_min(torch.finfo(emit.dtype).tiny)
    switch = fwd.ends[:, 1:steps, :, None] + log_trans + beta_start[:, 1:steps, None, :] - ll[:, None, None, None]
    posterior = emit.new_zeros(batch, t_full, k)
    posterior[:, :steps] = occupancy
    return SegmentPosterior(
        log_likelihood=ll,
        posterior=posterior,
        initial=start_prob[:, 0],
        transitions=switch.exp().sum(1),
        durations=durations.transpose(1, 2),
        censored=censored.transpose(1, 2),
    )


def _backtrack(
    fwd: SegmentForward, log_trans: torch.Tensor, t_full: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Segmentations ``(B, T)`` traced back from every sequence's end through ``fwd``: each choice the argmax of its
    scores (Viterbi, on a ``"max"`` pass), or with a ``generator`` a draw (Gumbel-max, on a ``"sum"`` pass)."""
    batch, k = fwd.starts.shape[0], fwd.starts.shape[-1]
    device = fwd.starts.device

    def choose(scores: torch.Tensor) -> torch.Tensor:
        if generator is not None:
            uniform = torch.rand(scores.shape, generator=generator, dtype=scores.dtype).to(device)
            scores = scores - (-uniform.clamp_min(torch.finfo(scores.dtype).tiny).log()).log()
        return scores.argmax(-1)

    rows = torch.arange(batch, device=device)
    marks = torch.full((batch, t_full), -1, dtype=torch.long, device=device)
    last = fwd.start_windows(fwd.lengths) + fwd.log_survival.T + fwd.cumulative[rows, fwd.lengths][:, None]
    pick = choose(last.flatten(1))
    state, boundary = pick % k, fwd.lengths - (pick // k + 1)
    marks[rows, boundary] = state
    active = boundary > 0
    while bool(active.any()):
        at = boundary.clamp_min(1)
        previous = choose(fwd.ends[rows, at] + log_trans[:, state].T)  # (B,)
        windows = fwd.start_windows(at)[rows, :, previous] + fwd.log_duration[previous]  # (B, D)
        length = choose(windows) + 1
        state = torch.where(active, previous, state)
        boundary = torch.where(active, boundary - length, boundary)
        marks[rows[active], boundary[active]] = state[active]
        active = boundary > 0
    steps = torch.arange(t_full, device=device).expand(batch, t_full)
    latest = torch.where(marks >= 0, steps, torch.zeros_like(steps)).cummax(1).values
    return marks.gather(1, latest)


def segment_viterbi(
    log_init: Any, log_trans: Any, log_dur: Any, log_emit: Any, lengths: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The most probable segmentation of every sequence: its states ``(B, T)`` (at padded steps the last state
    repeated) and log probabilities ``log p(x, segmentation)`` ``(B,)``. Arguments as :func:`segment_forward`'s.

    Examples
    --------
    >>> log_emit = torch.tensor([[0.0, -5.0]] * 3 + [[-5.0, 0.0]] * 2, dtype=torch.float64)[None]
    >>> log_trans = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64).log()
    >>> log_dur = torch.full((2, 3), 1 / 3, dtype=torch.float64).log()
    >>> paths, _ = segment_viterbi(torch.full((2,), 0.5, dtype=torch.float64).log(), log_trans, log_dur, log_emit)
    >>> paths.tolist()
    [[0, 0, 0, 1, 1]]
    """
    log_init, log_trans, log_dur, emit, lengths, t_full = _checked(log_init, log_trans, log_dur, log_emit, lengths)
    fwd = segment_forward(log_init, log_trans, log_dur, emit, lengths, reduce="max")
    _check_possible(fwd.log_likelihood)
    return _backtrack(fwd, log_trans, t_full, None), fwd.log_likelihood


def sample_segmentations(
    log_init: Any, log_trans: Any, log_dur: Any, log_emit: Any, lengths: Any = None, *, generator: torch.Generator
) -> torch.Tensor:
    """One segmentation of every sequence drawn from ``p(segmentation | x)`` (forward filtering, backward sampling
    over segments), as its states ``(B, T)``. Arguments as :func:`segment_forward`'s; draws from ``generator``.

    Examples
    --------
    >>> log_emit = torch.zeros(4, 5, 2, dtype=torch.float64)
    >>> log_trans = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64).log()
    >>> log_dur = torch.full((2, 2), 0.5, dtype=torch.float64).log()
    >>> paths = sample_segmentations(torch.zeros(2).double().log_softmax(0), log_trans, log_dur, log_emit,
    ...                              generator=torch.Generator().manual_seed(0))
    >>> tuple(paths.shape)
    (4, 5)
    """
    log_init, log_trans, log_dur, emit, lengths, t_full = _checked(log_init, log_trans, log_dur, log_emit, lengths)
    fwd = segment_forward(log_init, log_trans, log_dur, emit, lengths)
    _check_possible(fwd.log_likelihood)
    return _backtrack(fwd, log_trans, t_full, generator)
