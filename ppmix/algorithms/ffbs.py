"""Forward filtering, backward sampling: draws of the state paths of a batch of HMM sequences given the
parameters (Frühwirth-Schnatter 1994; Carter & Kohn 1994), the path step of a blocked Gibbs sampler.

The forward pass keeps the filtered log-probabilities ``log p(z_t = k, x_{0:t})`` of every sequence
(padded steps carry the last valid step's, so the final step of the batch holds every sequence's
end); the backward pass draws ``z_{T-1}`` from the end and each earlier ``z_t`` from
``p(z_t | z_{t+1}, x_{0:t})``, proportional to the filtered probability times the transition into the
next state. Categorical draws use the Gumbel-max rule (torch's global random state, or a generator).
Transitions may vary over time: ``log_trans`` ``(B, T, K, K)`` holds at ``[b, t]`` the transition into step ``t``.
"""

from __future__ import annotations

import torch

__all__ = ["filter_log_likelihood", "filtered_marginals", "gumbel_argmax", "sample_paths"]


def gumbel_noise(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel draws of ``shape`` in ``like``'s dtype and device: ``argmax(logits + noise)`` over the
    last axis is a categorical draw (from ``generator``, or torch's global random state)."""
    uniform = torch.rand(shape, dtype=like.dtype, device=like.device, generator=generator)
    return -(-uniform.clamp_min(torch.finfo(like.dtype).tiny).log()).log()


def gumbel_argmax(logits: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row of unnormalised log-probabilities ``(..., K)`` (``-inf`` never drawn).

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> gumbel_argmax(torch.tensor([[0.0, -float("inf")], [-float("inf"), 0.0]])).tolist()
    [0, 1]
    """
    return (logits + gumbel_noise(logits.shape, logits)).argmax(-1)


def sample_paths(
    log_init: torch.Tensor,
    log_trans: torch.Tensor,
    log_emit: torch.Tensor,
    lengths: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """State paths ``(B, T)`` drawn from ``p(z | x)`` and the log-likelihoods ``log p(x_b)`` ``(B,)``.

    Parameters
    ----------
    log_init : Tensor (B, K)
        Log initial-state probabilities of every sequence.
    log_trans : Tensor (B, K, K) or (B, T, K, K)
        Log transition probabilities ``[i, j] = log p(z_t = j | z_{t-1} = i)`` of every sequence (or of every
        sequence and step ``t``, the transition into it).
    log_emit : Tensor (B, T, K)
        Log emission densities; padded steps (``t >= lengths[b]``) are ignored.
    lengths : LongTensor (B,)
        Valid steps of every sequence (at least one).
    generator : torch.Generator, optional
        The random stream of the draws (torch's global one by default).

    Returns
    -------
    paths : LongTensor (B, T)
        The drawn states; at padded steps, the sequence's last state repeated.
    log_likelihood : Tensor (B,)

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> log_trans = torch.tensor([[0.9, 0.1], [0.1, 0.9]]).log().expand(1, 2, 2)
    >>> emit = torch.tensor([[[0.0, -50.0], [0.0, -50.0], [-50.0, 0.0]]])  # states 0, 0, 1 all but certain
    >>> paths, ll = sample_paths(torch.tensor([[0.5, 0.5]]).log(), log_trans, emit, torch.tensor([3]))
    >>> paths.tolist()
    [[0, 0, 1]]
    """
    batch, steps, k = log_emit.shape
    valid = torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
    padded = not bool(valid.all())
    scaled = _filter_scaled(log_init, log_trans, log_emit, valid, padded)
    filtered, log_likelihood = (
        scaled if scaled is not None else _filter_logspace(log_init, log_trans, log_emit, valid, padded)
    )
    noise = gumbel_noise((steps, batch, k), log_emit, generator)  # every draw's noise at once
    from_state = log_trans.transpose(-1, -2)  # [b, (t,) j, i] = log p(z_t = j | z_{t-1} = i): a row per next state
    paths = torch.empty(batch, steps, dtype=torch.long, device=log_emit.device)
    paths[:, -1] = (filtered[-1] + noise[-1]).argmax(-1)
    rows = torch.arange(batch, device=log_emit.device)
    for t in range(steps - 2, -1, -1):
        into_next = from_state[:, t + 1] if from_state.dim() == 4 else from_state
        drawn = (filtered[t] + into_next[rows, paths[:, t + 1]] + noise[t]).argmax(-1)
        paths[:, t] = torch.where(valid[:, t + 1], drawn, paths[:, t + 1]) if padded else drawn
    return paths, log_likelihood


def filter_log_likelihood(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """``log p(x_b)`` of every sequence ``(B,)`` by the forward filter alone (no backward pass, no marginals):
    the arguments as :func:`sample_paths`'.

    Examples
    --------
    >>> log_trans = torch.tensor([[0.9, 0.1], [0.1, 0.9]], dtype=torch.float64).log().expand(1, 2, 2)
    >>> emit = torch.zeros(1, 4, 2, dtype=torch.float64)  # every emission density 1
    >>> filter_log_likelihood(torch.tensor([[0.5, 0.5]], dtype=torch.float64).log(), log_trans, emit, torch.tensor([3]))
    tensor([0.], dtype=torch.float64)
    """
    valid = torch.arange(log_emit.shape[1], device=lengths.device)[None, :] < lengths[:, None]
    padded = not bool(valid.all())
    scaled = _filter_scaled(log_init, log_trans, log_emit, valid, padded)
    return (scaled if scaled is not None else _filter_logspace(log_init, log_trans, log_emit, valid, padded))[1]


def filtered_marginals(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """The filtered state probabilities ``p(z_t = k | x_{0:t})`` of every step ``(B, T, K)`` (the forward pass
    alone, each step normalised): the arguments as :func:`sample_paths`'. At padded steps, the last valid step's.

    Examples
    --------
    >>> log_trans = torch.tensor([[0.9, 0.1], [0.1, 0.9]], dtype=torch.float64).log().expand(1, 2, 2)
    >>> emit = torch.tensor([[[0.0, -50.0], [0.0, 0.0]]], dtype=torch.float64)  # state 0, then no evidence
    >>> init = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    >>> filtered_marginals(init, log_trans, emit, torch.tensor([2])).round(decimals=4).tolist()
    [[[1.0, 0.0], [0.9, 0.1]]]
    """
    valid = torch.arange(log_emit.shape[1], device=lengths.device)[None, :] < lengths[:, None]
    padded = not bool(valid.all())
    scaled = _filter_scaled(log_init, log_trans, log_emit, valid, padded)
    filtered = (scaled if scaled is not None else _filter_logspace(log_init, log_trans, log_emit, valid, padded))[0]
    return torch.stack(filtered, dim=1).softmax(dim=-1)


def _filter_logspace(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, valid: torch.Tensor, padded: bool
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The filtered log-probabilities ``log p(z_t, x_{0:t})`` of every step (log-sum-exp: any magnitudes)."""
    filtered = [log_init + log_emit[:, 0]]
    for t in range(1, log_emit.shape[1]):
        trans = log_trans[:, t] if log_trans.dim() == 4 else log_trans
        step = torch.logsumexp(filtered[-1][:, :, None] + trans, dim=1) + log_emit[:, t]
        filtered.append(torch.where(valid[:, t, None], step, filtered[-1]) if padded else step)
    return filtered, torch.logsumexp(filtered[-1], dim=-1)


def _filter_scaled(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, valid: torch.Tensor, padded: bool
) -> tuple[list[torch.Tensor], torch.Tensor] | None:
    """The filtered log-probabilities as :func:`_filter_logspace`, up to a constant per step and sequence (which
    the backward draws do not see), by normalised products in probability space: about half the operations per
    step. ``None`` where a step's normaliser underflows (a row of tiny emissions under every reachable state)."""
    peak = log_emit.amax(dim=-1, keepdim=True)
    emit = (log_emit - peak).exp()  # the largest emission of every step is 1
    trans = log_trans.exp()
    current = (log_init.exp() * emit[:, 0])[:, None, :]
    first_total = current.sum(-1, keepdim=True)
    current = current / first_total
    normalisers, filtered = [first_total[:, 0, 0]], [current[:, 0]]
    for t in range(1, log_emit.shape[1]):
        step = torch.bmm(current, trans[:, t] if trans.dim() == 4 else trans) * emit[:, t, None]
        total = step.sum(-1, keepdim=True)
        step = step / total
        if padded:
            step = torch.where(valid[:, t, None, None], step, current)
            total = torch.where(valid[:, t, None, None], total, 1.0)
        normalisers.append(total[:, 0, 0])
        filtered.append(step[:, 0])
        current = step
    log_filtered = torch.stack(filtered).log()
    totals = torch.stack(normalisers)
    if not bool((totals > 0).all() and torch.isfinite(log_filtered).any(-1).all()):
        return None
    used_peak = torch.where(valid, peak[..., 0], 0.0).sum(-1)
    return list(log_filtered), totals.log().sum(0) + used_peak
