"""The log-likelihood of an HMM at every NUTS chain's parameters, with its gradient from one backward recursion.

NUTS evaluates ``sum_b log p(x_b | theta_c)`` and its gradient for every chain ``c`` at every leapfrog step. Each
chain has one transition matrix for all its sequences, so the forward recursion of all chains is one batched matrix
product per step, ``(C, B, K) @ (C, K, K)``, in probability space with each step normalised (Rabiner's scaling): the
emissions are shifted to a maximum of one per step (``e_t = exp(log_emit_t - m_t)``), and

    p_t = (alpha_{t-1} A) * e_t,   s_t = sum_k p_t[k],   alpha_t = p_t / s_t,   log p(x) = sum_t (log s_t + m_t)

(``alpha_0 = pi * e_0 / s_0``). The gradient needs no graph through the steps: the normalised backward recursion
``beta_{t-1} = A (e_t * beta_t) / s_t`` gives ``d log p / d log_emit_t = alpha_t * beta_t`` (the state posterior),
``d / d log A_ij = sum_t alpha_{t-1, i} A_ij e_{t, j} beta_{t, j} / s_t`` (the expected transitions) and
``d / d log pi = alpha_0 * beta_0``: about three small batched operations a step each way, against the dozen of a
log-space recursion per sequence.

Where a step's normaliser is not at least ``tiny / eps`` (its sum could have lost relative precision: an impossible
or nearly impossible step; or NaN: an input NaN or infinite), :func:`chains_log_likelihood` computes the same
function with :func:`~ppmix.algorithms.forward_backward.log_likelihood` instead (log-space, exact in any range).

On the CPU (float32 or float64) with numba installed, the recursions run in compiled loops
(:mod:`ppmix.engines.hmm_kernel`, in float64, rescaled lazily; about 5 ms for 4 chains of 200 sequences of 200 steps
with 3 states, value and gradients, against about 25 ms for the ~2 000 small batched operations, one thread);
elsewhere (CUDA, no numba) as batched torch operations. Both compute the same function and gradients (tested equal to
each other and to the log-space recursion's autograd, to 1e-10).
:func:`packed_chains_log_likelihood` takes the emissions of the valid steps only, ``(N, C, K)`` in the order of the
batch's mask (no padded tensor to fill: the kernel reads the packed rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np
import torch

from ppmix.algorithms.forward_backward import log_likelihood

#: ``log sqrt(2 pi)``
_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)

__all__ = ["chains_log_likelihood", "gaussian_chains_log_likelihood", "packed_chains_log_likelihood"]


@dataclass
class _Forward:
    """The scaled forward pass, state-major (``(T, C, K, B)``: a step's sums over the states add rows of ``B``
    numbers): normalised ``alpha``, normalisers ``s`` ``(T, C, 1, B)`` (one at padded steps), shifted emissions
    ``e``, the transitions ``A`` ``(C, K, K)`` and the valid steps ``(T, 1, 1, B)`` (None: every sequence full
    length)."""

    alpha: torch.Tensor
    scales: torch.Tensor
    emit: torch.Tensor
    trans: torch.Tensor
    valid: torch.Tensor | None


def _scaled_forward(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, _Forward] | None:
    """``sum_b log p(x_b)`` per chain ``(C,)`` and the pass's tensors, or None where its precision is not assured."""
    chains, batch, steps, k = log_emit.shape
    shift = log_emit.amax(-1, keepdim=True)
    emit = torch.empty(steps, chains, k, batch, dtype=log_emit.dtype, device=log_emit.device)
    torch.sub(log_emit.permute(2, 0, 3, 1), shift.permute(2, 0, 3, 1), out=emit).exp_()
    trans_t = log_trans.exp().transpose(-1, -2)
    valid = None
    if bool((lengths < steps).any()):
        valid = (torch.arange(steps, device=lengths.device)[:, None] < lengths[None, :]).reshape(steps, 1, 1, batch)
    alpha, scales = torch.empty_like(emit), torch.ones(steps, chains, 1, batch, dtype=emit.dtype, device=emit.device)
    emits, alphas, norms = emit.unbind(0), alpha.unbind(0), scales.unbind(0)  # views, indexed once
    first = log_init.exp()[:, :, None] * emits[0]
    torch.div(first, torch.sum(first, -2, keepdim=True, out=norms[0]), out=alphas[0])
    for t in range(1, steps):
        p = torch.bmm(trans_t, alphas[t - 1]).mul_(emits[t])
        if valid is None:
            torch.div(p, torch.sum(p, -2, keepdim=True, out=norms[t]), out=alphas[t])
        else:
            s = p.sum(-2, keepdim=True)
            norms[t].copy_(torch.where(valid[t], s, norms[t]))
            alphas[t].copy_(torch.where(valid[t], p / s, alphas[t - 1]))
    finfo = torch.finfo(emit.dtype)
    if not bool((scales >= finfo.tiny / finfo.eps).all()):
        return None
    shifts = shift[..., 0]  # (C, B, T)
    if valid is not None:
        shifts = shifts * valid.reshape(steps, batch).T
    value = scales.log().sum((0, 2, 3)) + shifts.sum((1, 2))
    return value, _Forward(alpha, scales, emit, trans_t.transpose(-1, -2), valid)


class _ChainsLogLikelihood(torch.autograd.Function):
    """The scaled forward's value with the normalised backward recursion's gradients (module notes)."""

    @staticmethod
    def forward(ctx: Any, log_init, log_trans, log_emit, value, fwd: _Forward):  # type: ignore[override]
        ctx.fwd = fwd
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        fwd = ctx.fwd
        steps, chains, k, batch = fwd.alpha.shape
        beta = torch.ones_like(fwd.alpha)
        pairs = torch.zeros_like(fwd.trans)  # sum_t alpha_{t-1} v_t^T, v_t = e_t beta_t / s_t
        betas, emits, norms, alphas = beta.unbind(0), fwd.emit.unbind(0), fwd.scales.unbind(0), fwd.alpha.unbind(0)
        for t in range(steps - 1, 0, -1):
            v = (emits[t] * betas[t]).div_(norms[t])
            if fwd.valid is None:
                torch.bmm(fwd.trans, v, out=betas[t - 1])
            else:
                v.masked_fill_(~fwd.valid[t], 0.0)
                betas[t - 1].copy_(torch.where(fwd.valid[t], torch.bmm(fwd.trans, v), betas[t]))
            pairs.baddbmm_(alphas[t - 1], v.transpose(-1, -2))
        posterior = fwd.alpha.mul_(beta)  # the forward pass is used once
        if fwd.valid is not None:
            posterior.masked_fill_(~fwd.valid, 0.0)
        g_emit = posterior.permute(1, 3, 0, 2) * grad[:, None, None, None]
        return posterior[0].sum(-1) * grad[:, None], pairs * fwd.trans * grad[:, None, None], g_emit, None, None


@dataclass
class _KernelPass:
    """What the kernel's backward pass scatters: the blocked posteriors and lanes (:mod:`~ppmix.engines.hmm_kernel`),
    the rows' offsets, the chain axis of the emissions (0: padded ``(C, B, T, K)``, 1: packed ``(N, C, K)``), their
    shape, the shape of their rows ``(R, C, K)``, their dtype, whether some of their rows are past every length, and the
    gradients of the chain's parameters."""

    buffer: np.ndarray
    lanes: tuple[np.ndarray, ...]
    offsets: np.ndarray
    chain_axis: int
    shape: tuple[int, ...]
    rows_shape: tuple[int, ...]
    dtype: torch.dtype
    gaps: bool
    g_init: torch.Tensor
    g_trans: torch.Tensor


class _KernelLogLikelihood(torch.autograd.Function):
    """The kernel's value; its backward pass the posteriors scattered to the emissions' rows, each scaled by the
    incoming gradient of its chain (one pass over them)."""

    @staticmethod
    def forward(ctx: Any, log_init, log_trans, log_emit, value: torch.Tensor, done: _KernelPass):  # type: ignore[override]
        ctx.done = done
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        done = ctx.done
        # numpy's allocations reuse freed memory (a fresh torch tensor of this size faults in its pages: ~0.5 ms)
        rows = (np.zeros if done.gaps else np.empty)(done.rows_shape)
        weights = grad.detach().to(torch.float64).numpy()
        _kernel().scatter(done.buffer, done.offsets, *done.lanes, weights, rows)
        g_emit = _from_rows(torch.from_numpy(rows), done.shape, done.chain_axis)
        return (
            done.g_init * grad[:, None],
            done.g_trans * grad[:, None, None],
            g_emit.to(done.dtype),
            None,
            None,
        )


def _as_rows(x: torch.Tensor, chain_axis: int) -> torch.Tensor:
    """Emissions as contiguous rows ``(R, C, K)`` (the kernel's layout): packed ``(N, C, K)`` ones as they are, padded
    ``(C, B, T, K)`` ones arranged (a copy)."""
    if chain_axis == 1:
        return x.contiguous()
    return x.permute(1, 2, 0, 3).reshape(-1, x.shape[0], x.shape[-1]).contiguous()


def _from_rows(rows: torch.Tensor, shape: tuple[int, ...], chain_axis: int) -> torch.Tensor:
    """The inverse of :func:`_as_rows` (a view): rows ``(R, C, K)`` as emissions of ``shape``."""
    if chain_axis == 1:
        return rows
    chains, batch, steps, k = shape
    return rows.reshape(batch, steps, chains, k).permute(2, 0, 1, 3)


@cache
def _kernel() -> Any:
    """The compiled passes (the module :mod:`ppmix.engines.hmm_kernel`), None without numba."""
    try:
        from ppmix.engines import hmm_kernel
    except ImportError:
        return None
    return hmm_kernel


@lru_cache(maxsize=8)
def _lanes(lengths: bytes, chains: int) -> tuple[np.ndarray, ...]:
    """:func:`~ppmix.engines.hmm_kernel.lane_blocks` of the lengths (int64 bytes), remembered: a NUTS run asks for
    the same ones at every leapfrog step."""
    return _kernel().lane_blocks(np.frombuffer(lengths, dtype=np.int64), chains)


def _runs_on_kernel(*tensors: torch.Tensor) -> bool:
    """Whether the compiled kernel takes these tensors: on the CPU, float32 or float64, numba installed."""
    return all(x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) for x in tensors) and (
        _kernel() is not None
    )


def _kernel_log_likelihood(
    log_init: torch.Tensor,
    log_trans: torch.Tensor,
    log_emit: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    chain_axis: int,
    gaps: bool,
) -> torch.Tensor | None:
    """``sum_b log p(x_b)`` per chain by the compiled kernel, differentiable in every input; None where a normaliser
    leaves the safe range. ``log_emit``'s chain axis is ``chain_axis`` (0: padded ``(C, B, T, K)``, 1: packed ``(N,
    C, K)``); as rows ``(R, C, K)`` (:func:`_as_rows`), sequence ``b``'s step ``t`` is row ``offsets[b] + t``; ``gaps``:
    some rows are past every sequence's length (their gradient zero)."""
    kernel = _kernel()
    inputs = (log_init, log_trans, log_emit)
    want_grad = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    init, trans, emit = (x.detach().to(torch.float64) for x in inputs)
    chains, k = init.shape
    offsets, lengths = offsets.to(torch.int64).numpy(), lengths.to(torch.int64).numpy()
    lanes = _lanes(lengths.tobytes(), chains)
    lane_chain, lane_seq, lane_len, block_steps, block_start = lanes
    buffer = np.empty(k * int(block_start[-1] + block_steps[-1] * kernel.LANES))
    value = np.zeros(chains)
    rows = _as_rows(emit, chain_axis)
    kernel.gather(rows.numpy(), offsets, *lanes, buffer, value)
    np.exp(buffer, out=buffer)
    g_init, g_trans = np.empty((chains, k)), np.empty((chains, k, k))
    blocks = (lane_chain, lane_len, block_steps, block_start)
    if not kernel.forward_backward(
        init.numpy(), trans.numpy(), *blocks, want_grad, buffer, value, g_init, g_trans, None
    ):
        return None
    dtype = log_emit.dtype
    if not want_grad:
        return torch.from_numpy(value).to(dtype)
    g_init_t, g_trans_t = torch.from_numpy(g_init).to(dtype), torch.from_numpy(g_trans).to(dtype)
    shapes = (tuple(emit.shape), tuple(rows.shape))
    done = _KernelPass(buffer, lanes, offsets, chain_axis, *shapes, dtype, gaps, g_init_t, g_trans_t)
    return _KernelLogLikelihood.apply(*inputs, torch.from_numpy(value).to(dtype), done)


def _torch_log_likelihood(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """:func:`chains_log_likelihood` by batched torch operations (any device), log space where the scaled pass's
    precision is not assured."""
    inputs = (log_init, log_trans, log_emit)
    forward = _scaled_forward(*(x.detach() for x in inputs), lengths)  # NaN or inf inputs: a normaliser fails
    if forward is not None:
        return _ChainsLogLikelihood.apply(*inputs, *forward)
    return _exact_log_likelihood(*inputs, lengths)


def _exact_log_likelihood(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """:func:`chains_log_likelihood` by the log-space forward recursion (exact in any range), differentiated by
    autograd."""
    chains, batch = log_emit.shape[:2]
    exact = log_likelihood(
        log_init.repeat_interleave(batch, 0),
        log_trans.repeat_interleave(batch, 0),
        log_emit.reshape(chains * batch, *log_emit.shape[2:]),
        lengths.repeat(chains),
    )
    return exact.reshape(chains, batch).sum(-1)


def chains_log_likelihood(
    log_init: torch.Tensor, log_trans: torch.Tensor, log_emit: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """``sum_b log p(x_b)`` of every chain, ``(C,)``, differentiable in every input (module notes).

    Parameters
    ----------
    log_init : Tensor
        ``(C, K)`` log initial distributions.
    log_trans : Tensor
        ``(C, K, K)`` log transition matrices (``[c, i, j]``: from ``i`` to ``j``; ``-inf`` where forbidden).
    log_emit : Tensor
        ``(C, B, T, K)`` emission log-densities (anything finite at padded steps).
    lengths : Tensor
        ``(B,)`` sequence lengths.

    Examples
    --------
    >>> import torch
    >>> log_init = torch.tensor([[0.6, 0.4]], dtype=torch.float64).log()
    >>> log_trans = torch.tensor([[[0.9, 0.1], [0.2, 0.8]]], dtype=torch.float64).log()
    >>> log_emit = torch.randn(1, 3, 5, 2, dtype=torch.float64)
    >>> lengths = torch.tensor([5, 2, 4])
    >>> exact = log_likelihood(log_init[0], log_trans[0], log_emit[0], lengths).sum()
    >>> bool(torch.isclose(chains_log_likelihood(log_init, log_trans, log_emit, lengths)[0], exact))
    True
    """
    if _runs_on_kernel(log_init, log_trans, log_emit) and lengths.numel():
        chains, batch, steps, k = log_emit.shape
        offsets = torch.arange(batch) * steps
        value = _kernel_log_likelihood(
            log_init,
            log_trans,
            log_emit,
            lengths.cpu(),
            offsets,
            0,
            bool((lengths < steps).any()),
        )
        return value if value is not None else _exact_log_likelihood(log_init, log_trans, log_emit, lengths)
    return _torch_log_likelihood(log_init, log_trans, log_emit, lengths)


def packed_chains_log_likelihood(
    log_init: torch.Tensor, log_trans: torch.Tensor, frames: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """:func:`chains_log_likelihood` of the emission log-densities of the valid steps only, ``frames`` ``(N, C, K)``
    with ``N = sum(lengths)``: sequence ``b``'s steps one after another, the sequences in order (a padded batch's
    ``log_emit[:, mask]`` transposed, ``mask[b, t] = t < lengths[b]``).

    Examples
    --------
    >>> import torch
    >>> log_init = torch.tensor([[0.6, 0.4]], dtype=torch.float64).log()
    >>> log_trans = torch.tensor([[[0.9, 0.1], [0.2, 0.8]]], dtype=torch.float64).log()
    >>> log_emit = torch.randn(1, 3, 5, 2, dtype=torch.float64)
    >>> lengths = torch.tensor([5, 2, 4])
    >>> mask = torch.arange(5) < lengths[:, None]
    >>> packed = packed_chains_log_likelihood(log_init, log_trans, log_emit[:, mask].transpose(0, 1), lengths)
    >>> bool(torch.isclose(packed, chains_log_likelihood(log_init, log_trans, log_emit, lengths)).all())
    True
    """
    lengths = lengths.to(frames.device)
    if _runs_on_kernel(log_init, log_trans, frames) and lengths.numel():
        lengths = lengths.cpu()
        offsets = lengths.cumsum(0) - lengths
        value = _kernel_log_likelihood(log_init, log_trans, frames, lengths, offsets, 1, False)
        if value is not None:
            return value
    steps = int(lengths.max()) if lengths.numel() else 0
    mask = torch.arange(steps, device=frames.device) < lengths[:, None]
    chains, k = log_init.shape
    log_emit = frames.new_zeros(chains, lengths.shape[0], steps, k)
    log_emit[:, mask] = frames.transpose(0, 1)
    return _torch_log_likelihood(log_init, log_trans, log_emit, lengths)


#: the last :func:`_blocked_rows`: the rows tensor, its lanes' key and the blocked rows
_last_blocked: list[tuple[torch.Tensor, tuple[Any, ...], np.ndarray]] = []


def _blocked_rows(x: torch.Tensor, rows: np.ndarray, offsets: np.ndarray, lanes: tuple[np.ndarray, ...]) -> np.ndarray:
    """:func:`~ppmix.engines.hmm_kernel.block_rows` of ``rows`` (``x`` as an array), remembered for the next call on
    the same tensor and lanes (every leapfrog step of a NUTS run)."""
    key = (offsets.tobytes(), *(lane.tobytes() for lane in lanes))
    if _last_blocked and _last_blocked[0][0] is x and _last_blocked[0][1] == key:
        return _last_blocked[0][2]
    lane_chain, lane_seq, lane_len, block_steps, block_start = lanes
    blocked = np.empty(rows.shape[1] * int(block_start[-1] + block_steps[-1] * _kernel().LANES))
    _kernel().block_rows(rows, offsets, lane_seq, lane_len, block_steps, block_start, blocked)
    _last_blocked[:] = [(x, key, blocked)]
    return blocked


@dataclass
class GaussianChainsGradient:
    """The value ``(C,)`` of :func:`gaussian_chains_log_likelihood` and its gradients with respect to every chain's
    log initial distribution ``(C, K)``, log transitions ``(C, K, K)``, emission means and standard deviations
    ``(C, K, D)``."""

    value: torch.Tensor
    log_init: torch.Tensor
    log_trans: torch.Tensor
    loc: torch.Tensor
    scale: torch.Tensor


def gaussian_chains_log_likelihood(
    log_init: torch.Tensor,
    log_trans: torch.Tensor,
    x: torch.Tensor,
    loc: torch.Tensor,
    scale: torch.Tensor,
    lengths: torch.Tensor,
) -> GaussianChainsGradient | None:
    """``sum_b log p(x_b)`` of every chain of an HMM with diagonal Gaussian emissions and its gradients, without
    autograd, from the compiled kernel (:mod:`~ppmix.engines.hmm_kernel`): the emission log-densities computed inside
    the kernel's gather, the emissions' gradient from the state posteriors ``gamma_t`` of its backward pass as the sums
    ``R = sum_t gamma_t``, ``S1 = sum_t gamma_t (x_t - mu)``, ``S2 = sum_t gamma_t (x_t - mu)^2``: ``d/d mu = S1 /
    sigma^2``, ``d/d sigma = (S2 / sigma^2 - R) / sigma``. None where the kernel does not run here (no numba, not on
    the CPU) or a rescaling normaliser leaves its safe range (the caller then differentiates the log-space recursion).

    Parameters
    ----------
    log_init, log_trans : Tensor
        ``(C, K)`` and ``(C, K, K)`` as in :func:`chains_log_likelihood`.
    x : Tensor
        ``(N, D)`` the valid steps' observations, sequence after sequence (as :func:`packed_chains_log_likelihood`'s
        rows); any fixed shift of ``x`` and ``loc`` together gives the same function (centre both near the data).
    loc, scale : Tensor
        ``(C, K, D)`` every chain's emission means and standard deviations.
    lengths : Tensor
        ``(B,)`` the sequence lengths (summing to ``N``).

    Examples
    --------
    >>> import torch
    >>> from torch.distributions import Normal
    >>> log_init = torch.tensor([[0.6, 0.4]], dtype=torch.float64).log()
    >>> log_trans = torch.tensor([[[0.9, 0.1], [0.2, 0.8]]], dtype=torch.float64).log()
    >>> x, scale = torch.randn(7, 1, dtype=torch.float64), torch.ones(1, 2, 1, dtype=torch.float64)
    >>> loc = torch.tensor([[[-1.0], [1.0]]], dtype=torch.float64)
    >>> frames = Normal(loc[0, :, 0], scale[0, :, 0]).log_prob(x)[:, None]  # (N, C, K)
    >>> lengths = torch.tensor([4, 3])
    >>> fast = gaussian_chains_log_likelihood(log_init, log_trans, x, loc, scale, lengths)
    >>> exact = packed_chains_log_likelihood(log_init, log_trans, frames, lengths)
    >>> bool(fast is None or torch.isclose(fast.value, exact))
    True
    """
    kernel = _kernel()
    if kernel is None or not _runs_on_kernel(log_init, log_trans, x, loc, scale) or not lengths.numel():
        return None
    init, trans, rows, mean, sd = (
        np.ascontiguousarray(t.detach().to(torch.float64).numpy()) for t in (log_init, log_trans, x, loc, scale)
    )
    chains, k = init.shape
    lengths = lengths.cpu().to(torch.int64)
    offsets = (lengths.cumsum(0) - lengths).numpy()
    lanes = _lanes(lengths.numpy().tobytes(), chains)
    lane_chain, lane_seq, lane_len, block_steps, block_start = lanes
    buffer = np.empty(k * int(block_start[-1] + block_steps[-1] * kernel.LANES))
    value = np.zeros(chains)
    blocked = _blocked_rows(x, rows, offsets, lanes)
    precision = 1.0 / (sd * sd)
    const = -np.log(sd).sum(-1) - rows.shape[1] * _HALF_LOG_TWO_PI
    kernel.gaussian_gather(
        blocked, lane_chain, lane_len, block_steps, block_start, mean, precision, const, buffer, value
    )
    np.exp(buffer, out=buffer)
    g_init, g_trans = np.empty((chains, k)), np.empty((chains, k, k))
    total, first, second = np.zeros((chains, k)), np.zeros(mean.shape), np.zeros(mean.shape)
    blocks = (lane_chain, lane_len, block_steps, block_start)
    scores = (blocked, mean, total, first, second)
    if not kernel.forward_backward(init, trans, *blocks, True, buffer, value, g_init, g_trans, scores):
        return None
    g_loc = first * precision
    g_scale = (second * precision - total[..., None]) / sd
    dtype = log_init.dtype
    return GaussianChainsGradient(*(torch.from_numpy(a).to(dtype) for a in (value, g_init, g_trans, g_loc, g_scale)))
