"""Forward filtering, backward sampling: draws of the state paths of a batch of HMM sequences given the
parameters (Frühwirth-Schnatter 1994; Carter & Kohn 1994), the path step of a blocked Gibbs sampler.

The forward pass keeps the filtered log-probabilities ``log p(z_t = k, x_{0:t})`` of every sequence
(padded steps carry the last valid step's, so the final step of the batch holds every sequence's
end); the backward pass draws ``z_{T-1}`` from the end and each earlier ``z_t`` from
``p(z_t | z_{t+1}, x_{0:t})``, proportional to the filtered probability times the transition into the
next state. Categorical draws use the Gumbel-max rule (torch's global random state).
"""

from __future__ import annotations

import torch

__all__ = ["gumbel_argmax", "sample_paths"]


def gumbel_argmax(logits: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row of unnormalised log-probabilities ``(..., K)`` (``-inf`` never drawn).

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> gumbel_argmax(torch.tensor([[0.0, -float("inf")], [-float("inf"), 0.0]])).tolist()
    [0, 1]
    """
    uniform = torch.rand(logits.shape, dtype=logits.dtype, device=logits.device)
    tiny = torch.finfo(logits.dtype).tiny
    return (logits - (-uniform.clamp_min(tiny).log()).log()).argmax(-1)


def sample_paths(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """State paths ``(B, T)`` drawn from ``p(z | x)`` and the log-likelihoods ``log p(x_b)`` ``(B,)``.

    Parameters
    ----------
    log_init : Tensor (B, K)
        Log initial-state probabilities of every sequence.
    log_trans : Tensor (B, K, K)
        Log transition probabilities ``[i, j] = log p(z_t = j | z_{t-1} = i)`` of every sequence.
    log_emit : Tensor (B, T, K)
        Log emission densities; padded steps (``t >= lengths[b]``) are ignored.
    lengths : LongTensor (B,)
        Valid steps of every sequence (at least one).

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
    batch, steps, _ = log_emit.shape
    valid = torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
    filtered = [log_init + log_emit[:, 0]]
    for t in range(1, steps):
        step = torch.logsumexp(filtered[-1][:, :, None] + log_trans, dim=1) + log_emit[:, t]
        filtered.append(torch.where(valid[:, t, None], step, filtered[-1]))
    log_likelihood = torch.logsumexp(filtered[-1], dim=-1)
    paths = torch.empty(batch, steps, dtype=torch.long, device=log_emit.device)
    paths[:, -1] = gumbel_argmax(filtered[-1])
    for t in range(steps - 2, -1, -1):
        into_next = log_trans.gather(2, paths[:, t + 1, None, None].expand(batch, log_trans.shape[1], 1))[..., 0]
        drawn = gumbel_argmax(filtered[t] + into_next)
        paths[:, t] = torch.where(valid[:, t + 1], drawn, paths[:, t + 1])
    return paths, log_likelihood
