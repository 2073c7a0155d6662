"""The forward and backward recursions of every NUTS chain's HMM as compiled loops (numba), on the CPU.

:mod:`ppmix.engines.hmm_chains` runs the recursions as batched torch operations, one a step for all chains: with
``K = 3`` states each operation handles a few hundred numbers, and the ~2 000 operations of a 200-step pass cost
their dispatch, not their arithmetic. Here the recursions of every (chain, sequence) pair, a *lane*, run in compiled
loops, in float64, single-threaded (the order of every sum fixed: the same inputs give the same bits), ``LANES``
lanes side by side: each loop's innermost dimension is the lane, so the processor overlaps eight independent
recursions (a lone recursion waits on its previous step at every operation). The lanes are ordered by sequence
length (longest first), so the lanes of a block end at about the same step; a lane past its length holds zero
emissions (its forward values zero, its backward values one) and adds nothing.

The passes:

1. :func:`gather`: every step's emission log-densities shifted to a maximum of zero (``log_emit_t - m_t``), written
   block by block in lane-minor order ``(T_block, K, LANES)``, ``-inf`` past a lane's length; the shifts summed by
   chain;
2. the caller exponentiates the buffer in one vectorised ``numpy.exp`` (a scalar ``exp`` in the loops costs four
   times more);
3. :func:`forward_backward`: by block, the forward recursion ``p_t = (alpha_{t-1} A) * e_t``, rescaled lazily: a
   lane's ``alpha_t = p_t / c_t`` with ``c_t = sum_k p_t[k]`` only where that sum leaves ``[LOW, HIGH]`` or at the
   lane's last step (``c_t = 1`` elsewhere; the division is off the recursion's path on most steps), ``e_t`` divided
   by the same ``c_t``, and ``log p(x) = sum_t log c_t + sum_t m_t`` (``alpha`` sums to one at the last step); then
   where asked the backward recursion ``beta_{t-1} = A (e_t * beta_t) / c_t``, which gives the state posteriors
   ``alpha_t * beta_t`` (the gradient with respect to the emission log-densities, written over the buffer), their
   first step (with respect to the log initial distribution) and ``sum_t alpha_{t-1, i} A_ij e_{t, j} beta_{t, j} /
   c_t`` (the expected transitions, with respect to the log transitions);
4. :func:`scatter` (in the backward pass of autograd): the posteriors, times the incoming gradient of their chain,
   back to the caller's rows.

The caller's emissions are rows ``(R, C, K)``: sequence ``b``'s step ``t`` is row ``offsets[b] + t`` (a padded batch
``(C, B, T, K)`` arranged as ``(B T, C, K)`` has ``offsets = b T``; the packed frames of a batch, ``offsets`` the
cumulated lengths); rows past a sequence's length are neither read nor written. A rescaling normaliser outside
``[tiny / eps, max]`` of float64 (an impossible or nearly impossible step; NaN or infinite inputs) makes
:func:`forward_backward` return False at once: the caller then computes the function in log space.

For diagonal Gaussian emissions (the NUTS potential's path without autograd:
:func:`~ppmix.engines.hmm_chains.gaussian_chains_log_likelihood`) the rows are laid out once per data set as the lanes
read them (:func:`block_rows`, ``(T_block, D, LANES)``), :func:`gaussian_gather` computes the emission log-densities
from them (no ``(R, C, K)`` array, no scatter), and :func:`forward_backward` adds each block's weighted score sums
``sum_t gamma_t``, ``sum_t gamma_t (x_t - mu)``, ``sum_t gamma_t (x_t - mu)^2`` right after its backward pass, while
the block is in cache.

numba is imported with this module: import it only where the kernel runs (``import ppmix`` does not load numba).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "LANES",
    "forward_backward",
    "gather",
    "block_rows",
    "gaussian_gather",
    "lane_blocks",
    "scatter",
]

#: recursions advanced side by side (independent: their operations overlap)
LANES = 8
_FINFO = np.finfo(np.float64)
#: a rescaling normaliser below this may have lost relative precision (as :mod:`~ppmix.engines.hmm_chains`'s check)
_SMALLEST = float(_FINFO.tiny / _FINFO.eps)
_LARGEST = float(_FINFO.max)
#: the range a lane's forward sums may drift in before they are rescaled
_LOW, _HIGH = 1e-30, 1e30


def lane_blocks(lengths: np.ndarray, chains: int) -> tuple[np.ndarray, ...]:
    """The lanes: ``(chain, sequence, length)`` of every (chain, sequence) pair, longest sequences first (ties by
    sequence, then chain), padded to whole blocks of :data:`LANES` with empty lanes; and each block's number of steps
    (at least one) and start in the blocked buffer of ``K = 1`` (times ``K`` for ``K`` states)."""
    batch = lengths.shape[0]
    order = np.argsort(-lengths, kind="stable")
    lane_seq = np.repeat(order, chains)
    lane_chain = np.tile(np.arange(chains), batch)
    pad = -len(lane_seq) % LANES
    lane_seq = np.concatenate([lane_seq, np.zeros(pad, dtype=np.int64)]).astype(np.int64)
    lane_chain = np.concatenate([lane_chain, np.zeros(pad, dtype=np.int64)]).astype(np.int64)
    lane_len = np.concatenate([lengths[lane_seq[: len(lane_seq) - pad]], np.zeros(pad, dtype=np.int64)])
    block_steps = np.maximum(lane_len.reshape(-1, LANES).max(1), 1).astype(np.int64)
    block_start = np.concatenate([[0], np.cumsum(block_steps * LANES)[:-1]]).astype(np.int64)
    return lane_chain, lane_seq, lane_len.astype(np.int64), block_steps, block_start


@njit(cache=True, nogil=True)
def _shift_into(frame, buffer, t, v):  # pragma: no cover - compiled
    """``frame - max(frame)`` into lane ``v``'s step ``t`` of ``buffer`` ``(T, K, LANES)``; the maximum returned."""
    top = -np.inf
    for j in range(frame.shape[0]):
        if frame[j] > top:  # NaN ignored here: it stays NaN and fails the forward pass
            top = frame[j]
    for j in range(frame.shape[0]):
        buffer[t, j, v] = frame[j] - top
    return top


@njit(cache=True, nogil=True)
def _lanes_of(block, offsets, lane_chain, lane_seq, lane_len, chains, lengths, offset):  # pragma: no cover - compiled
    """The chain, length and first row of each lane of ``block`` into ``chains``, ``lengths`` and ``offset``."""
    for v in range(LANES):
        lane = block * LANES + v
        chains[v], lengths[v], offset[v] = lane_chain[lane], lane_len[lane], offsets[lane_seq[lane]]


@njit(cache=True, nogil=True)
def gather(frames, offsets, lane_chain, lane_seq, lane_len, block_steps, block_start, emit, shifts):  # pragma: no cover
    """``emit`` (flat; block ``n`` at ``K block_start[n]``, ``(T_n, K, LANES)``): the rows of ``frames`` ``(R, C, K)``
    shifted to a maximum of zero, ``-inf`` past a lane's length; ``shifts[c]``: the sum of chain ``c``'s shifts."""
    k = frames.shape[2]
    chains, lengths, offset = np.empty(LANES, np.int64), np.empty(LANES, np.int64), np.empty(LANES, np.int64)
    for block in range(block_steps.shape[0]):
        steps = block_steps[block]
        buffer = emit[k * block_start[block] : k * (block_start[block] + steps * LANES)].reshape((steps, k, LANES))
        _lanes_of(block, offsets, lane_chain, lane_seq, lane_len, chains, lengths, offset)
        for t in range(steps):
            for v in range(LANES):
                if t >= lengths[v]:
                    buffer[t, :, v] = -np.inf
                else:
                    shifts[chains[v]] += _shift_into(frames[offset[v] + t, chains[v]], buffer, t, v)


@njit(cache=True, nogil=True)
def block_rows(x, offsets, lane_seq, lane_len, block_steps, block_start, out):  # pragma: no cover - compiled
    """The rows ``x`` ``(R, D)`` laid out as the lanes read them: ``out`` (flat; block ``n`` at ``D block_start[n]``,
    ``(T_n, D, LANES)``), zero past a lane's length."""
    d = x.shape[1]
    for block in range(block_steps.shape[0]):
        steps = block_steps[block]
        buffer = out[d * block_start[block] : d * (block_start[block] + steps * LANES)].reshape((steps, d, LANES))
        for v in range(LANES):
            lane = block * LANES + v
            offset, length = offsets[lane_seq[lane]], lane_len[lane]
            for t in range(steps):
                for i in range(d):
                    buffer[t, i, v] = x[offset + t, i] if t < length else 0.0


@njit(cache=True, nogil=True)
def _lane_parameters(block, lane_chain, loc, precision, lane_loc, lane_precision):  # pragma: no cover - compiled
    """The emission means and precisions of each lane of ``block`` (its chain's), ``(D, K, LANES)``."""
    for v in range(LANES):
        c = lane_chain[block * LANES + v]
        for j in range(loc.shape[1]):
            for i in range(loc.shape[2]):
                lane_loc[i, j, v] = loc[c, j, i]
                lane_precision[i, j, v] = precision[c, j, i]


@njit(cache=True, nogil=True)
def gaussian_gather(
    rows, lane_chain, lane_len, block_steps, block_start, loc, precision, const, emit, shifts
):  # pragma: no cover - compiled
    """:func:`gather` of the diagonal Gaussian emission log-densities ``const[c, k] - sum_d (x_d - loc[c, k, d])^2
    precision[c, k, d] / 2`` of the blocked rows ``rows`` (:func:`block_rows`), computed here (no ``(R, C, K)``
    array), the lanes side by side."""
    k, d = loc.shape[1], loc.shape[2]
    lane_loc, lane_precision = np.empty((d, k, LANES)), np.empty((d, k, LANES))
    lane_const, lane_shift, top = np.empty((k, LANES)), np.empty(LANES), np.empty(LANES)
    for block in range(block_steps.shape[0]):
        steps, lanes = block_steps[block], block * LANES
        xs = rows[d * block_start[block] : d * (block_start[block] + steps * LANES)].reshape((steps, d, LANES))
        buffer = emit[k * block_start[block] : k * (block_start[block] + steps * LANES)].reshape((steps, k, LANES))
        _lane_parameters(block, lane_chain, loc, precision, lane_loc, lane_precision)
        for v in range(LANES):
            for j in range(k):
                lane_const[j, v] = const[lane_chain[lanes + v], j]
            lane_shift[v] = 0.0
        shortest = steps
        for v in range(LANES):
            shortest = min(shortest, lane_len[lanes + v])
        for t in range(steps):
            x_t, out = xs[t], buffer[t]
            for j in range(k):
                row, mean, weight = out[j], lane_loc[0, j], lane_precision[0, j]
                for v in range(LANES):
                    dev = x_t[0, v] - mean[v]
                    row[v] = dev * dev * weight[v]
                for i in range(1, d):
                    x, mean, weight = x_t[i], lane_loc[i, j], lane_precision[i, j]
                    for v in range(LANES):
                        dev = x[v] - mean[v]
                        row[v] += dev * dev * weight[v]
                for v in range(LANES):
                    row[v] = lane_const[j, v] - 0.5 * row[v]
            for v in range(LANES):
                top[v] = out[0, v]
            for j in range(1, k):
                row = out[j]
                for v in range(LANES):
                    top[v] = max(top[v], row[v])  # NaN: NaN emissions, which fail the forward pass
            for j in range(k):
                row = out[j]
                for v in range(LANES):
                    row[v] -= top[v]
            if t < shortest:
                for v in range(LANES):
                    lane_shift[v] += top[v]
            else:
                for v in range(LANES):
                    if t < lane_len[lanes + v]:
                        lane_shift[v] += top[v]
                    else:
                        out[:, v] = -np.inf
        for v in range(LANES):
            shifts[lane_chain[lanes + v]] += lane_shift[v]


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz", "arcp"}, error_model="numpy")
def _forward_block(init, trans, lane_chain, lanes, lengths, e, alpha, log_scales):  # pragma: no cover - compiled
    """The lazily rescaled forward recursion of one block's lanes (``e`` ``(T, K, LANES)`` divided by the scales in
    place, ``alpha`` ``(T, K, LANES)``, ``log_scales`` ``(LANES,)``: the sum of each lane's ``log c_t``); False where
    a rescaling normaliser leaves the safe range."""
    steps, k = e.shape[0], e.shape[1]
    sums = np.empty(LANES)
    for t in range(steps):
        for v in range(LANES):
            sums[v] = 1.0 if t >= lengths[v] else 0.0  # a lane past its length: in range
        for j in range(k):
            out, emitted = alpha[t, j], e[t, j]  # one-dimensional views: the loops over the lanes stay simple
            if t == 0:
                for v in range(LANES):
                    out[v] = init[lane_chain[lanes + v], j]
            else:
                previous, moves = alpha[t - 1, 0], trans[0, j]
                for v in range(LANES):
                    out[v] = previous[v] * moves[v]
                for i in range(1, k):
                    previous, moves = alpha[t - 1, i], trans[i, j]
                    for v in range(LANES):
                        out[v] += previous[v] * moves[v]
            for v in range(LANES):
                out[v] *= emitted[v]
                sums[v] += out[v]
        drifted = False
        for v in range(LANES):
            drifted |= (sums[v] < _LOW) | (sums[v] > _HIGH) | (sums[v] != sums[v])
        if drifted:
            for v in range(LANES):
                if not (sums[v] >= _LOW and sums[v] <= _HIGH) and not _rescale(alpha, e, t, v, sums[v], log_scales):
                    return False
    for v in range(LANES):  # the last step normalised: log p(x) is the sum of the log scales
        last = lengths[v] - 1
        if last >= 0:
            total = 0.0
            for j in range(k):
                total += alpha[last, j, v]
            if not _rescale(alpha, e, last, v, total, log_scales):
                return False
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _rescale(alpha, e, t, v, total, log_scales):  # pragma: no cover - compiled
    """Lane ``v``'s ``alpha_t`` and ``e_t`` divided by ``total`` (its log added to ``log_scales[v]``); False where
    ``total`` is outside ``[tiny / eps, max]`` (NaN included)."""
    if not (total >= _SMALLEST and total <= _LARGEST):
        return False
    log_scales[v] += np.log(total)
    inverse = 1.0 / total
    for j in range(alpha.shape[1]):
        alpha[t, j, v] *= inverse
        e[t, j, v] *= inverse
    return True


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz", "arcp"}, error_model="numpy")
def _backward_block(trans, lengths, e, alpha, beta, pairs):  # pragma: no cover - compiled
    """The backward recursion of one block's lanes: the state posteriors ``alpha_t beta_t`` written over ``e`` (whose
    step ``t`` is read before), ``sum_t alpha_{t-1, i} v_{t, j}`` (``v_t = e_t beta_t / c_t``) added to ``pairs``
    ``(K, K, LANES)``; ``beta`` ``(2, K, LANES)``: the step's and the one before, by the step's parity. A lane keeps
    ``beta = 1`` at and past its last step."""
    steps, k = e.shape[0], e.shape[1]
    shortest = steps
    for v in range(LANES):
        shortest = min(shortest, lengths[v])
    beta[(steps - 1) & 1] = 1.0
    for t in range(steps - 1, 0, -1):
        now, before = beta[t & 1], beta[(t - 1) & 1]
        for j in range(k):
            step, forward, emitted = now[j], alpha[t, j], e[t, j]
            for v in range(LANES):
                b = step[v]
                step[v] = b * emitted[v]
                emitted[v] = forward[v] * b
        for i in range(k):
            back, forward, moves = before[i], alpha[t - 1, i], trans[i]
            for j in range(k):
                step, pair = now[j], pairs[i, j]
                for v in range(LANES):
                    pair[v] += forward[v] * step[v]
            step, move = now[0], moves[0]
            for v in range(LANES):
                back[v] = move[v] * step[v]
            for j in range(1, k):
                step, move = now[j], moves[j]
                for v in range(LANES):
                    back[v] += move[v] * step[v]
            if t >= shortest:
                for v in range(LANES):
                    if t >= lengths[v]:
                        back[v] = 1.0
    for j in range(k):
        for v in range(LANES):
            e[0, j, v] = alpha[0, j, v] * beta[0, j, v]


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc", "nsz", "arcp"})
def _gaussian_block_scores(block, e, xs, lengths, lane_chain, loc, total, first, second):  # pragma: no cover
    """The sums of the diagonal Gaussian emissions' gradient over one block's posteriors ``e`` ``(T, K, LANES)`` and
    blocked rows ``xs`` ``(T, D, LANES)``: ``total[c, k] += sum_t p``, ``first[c, k] += sum_t p (x_t - loc[c, k])``,
    ``second[c, k] += sum_t p (x_t - loc[c, k])^2`` over each lane's valid steps, ``c`` its chain (each sum a loop
    over the steps with its own accumulator: no store in the loop)."""
    k, d = loc.shape[1], loc.shape[2]
    for v in range(LANES):
        c, steps = lane_chain[block * LANES + v], lengths[v]
        for j in range(k):
            mass = 0.0
            for t in range(steps):
                mass += e[t, j, v]
            total[c, j] += mass
            for i in range(d):
                mean, linear, square = loc[c, j, i], 0.0, 0.0
                for t in range(steps):
                    dev = xs[t, i, v] - mean
                    weighted = e[t, j, v] * dev
                    linear += weighted
                    square += weighted * dev
                first[c, j, i] += linear
                second[c, j, i] += square


@njit(cache=True, nogil=True)
def forward_backward(
    log_init, log_trans, lane_chain, lane_len, block_steps, block_start, want_grad, emit, value, g_init, g_trans, scores
):  # pragma: no cover - compiled
    """Over the exponentiated blocked emissions ``emit`` (:func:`gather`): ``value[c] += sum of chain c's log c_t``
    and, where ``want_grad``, the posteriors written over ``emit``, the gradients with respect to the log initial
    distributions and log transitions in ``g_init`` ``(C, K)`` and ``g_trans`` ``(C, K, K)`` (zeroed first); False
    (the outputs unspecified) where a rescaling normaliser leaves the safe range (module notes)."""
    chains, k = log_init.shape
    init, transitions = np.exp(log_init), np.exp(log_trans)
    alpha = np.empty((max(block_steps.max(), 1), k, LANES))
    beta = np.empty((2, k, LANES))
    trans = np.empty((k, k, LANES))
    pairs = np.empty((k, k, LANES))
    log_scales = np.empty(LANES)
    g_init[:] = 0.0
    g_trans[:] = 0.0
    for block in range(block_steps.shape[0]):
        steps, lanes = block_steps[block], block * LANES
        e = emit[k * block_start[block] : k * (block_start[block] + steps * LANES)].reshape((steps, k, LANES))
        lengths = lane_len[lanes : lanes + LANES]
        for v in range(LANES):
            trans[:, :, v] = transitions[lane_chain[lanes + v]]
        log_scales[:] = 0.0
        if not _forward_block(init, trans, lane_chain, lanes, lengths, e, alpha, log_scales):
            return False
        for v in range(LANES):
            if lengths[v] > 0:
                value[lane_chain[lanes + v]] += log_scales[v]
        if not want_grad:
            continue
        pairs[:] = 0.0
        _backward_block(trans, lengths, e, alpha, beta, pairs)
        if scores is not None:
            rows, loc, total, first, second = scores
            d = loc.shape[2]
            xs = rows[d * block_start[block] : d * (block_start[block] + steps * LANES)].reshape((steps, d, LANES))
            _gaussian_block_scores(block, e, xs, lengths, lane_chain, loc, total, first, second)
        for v in range(LANES):
            if lengths[v] > 0:
                c = lane_chain[lanes + v]
                g_init[c] += e[0, :, v]
                g_trans[c] += pairs[:, :, v]
    g_trans *= transitions
    return True


@njit(cache=True, nogil=True)
def scatter(emit, offsets, lane_chain, lane_seq, lane_len, block_steps, block_start, weights, rows):  # pragma: no cover
    """The blocked posteriors of :func:`forward_backward` times ``weights[c]`` (the incoming gradient of chain
    ``c``) into ``rows`` ``(R, C, K)`` (the inverse of :func:`gather` at every lane's valid steps)."""
    k = rows.shape[2]
    for block in range(block_steps.shape[0]):
        steps, lanes = block_steps[block], block * LANES
        buffer = emit[k * block_start[block] : k * (block_start[block] + steps * LANES)].reshape((steps, k, LANES))
        for v in range(LANES):
            c, offset, weight = lane_chain[lanes + v], offsets[lane_seq[lanes + v]], weights[lane_chain[lanes + v]]
            for t in range(lane_len[lanes + v]):
                row = rows[offset + t, c]
                for j in range(k):
                    row[j] = buffer[t, j, v] * weight
