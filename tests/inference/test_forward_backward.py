"""Batched forward–backward and Viterbi against brute-force enumeration, Pyro and known reductions."""

from __future__ import annotations

import itertools

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from ppmix.algorithms.forward_backward import (
    _check_inputs,
    _smooth_scaled,
    forward_backward,
    log_likelihood,
    viterbi,
)
from tests.common import DEVICES, assert_close

DTYPES = [pytest.param(torch.float64, id="float64"), pytest.param(torch.float32, id="float32")]
METHODS = ["auto", "logsumexp"]
TRANS = ["shared_trans", "per_seq_trans", "per_step_trans"]

#: tolerance per dtype (float32 results are compared with a float64 oracle)
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-6)}


def random_hmm(batch, steps, k, *, per_seq=False, per_step=False, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    log_init = torch.log_softmax(torch.randn(k, generator=g, dtype=torch.float64), -1)
    shape = (batch, steps, k, k) if per_step else (batch, k, k) if per_seq else (k, k)
    log_trans = torch.log_softmax(torch.randn(shape, generator=g, dtype=torch.float64), -1)
    log_emit = 2.0 * torch.randn(batch, steps, k, generator=g, dtype=torch.float64)
    return log_init.to(dtype), log_trans.to(dtype), log_emit.to(dtype)


def brute_force(log_init, log_trans, log_emit, lengths):
    """Enumerate all K^L state paths of every sequence (float64 numpy)."""
    log_init, log_trans, log_emit = (x.detach().double().numpy() for x in (log_init, log_trans, log_emit))
    batch, steps, k = log_emit.shape
    out = dict(
        ll=np.zeros(batch),
        post=np.zeros((batch, steps, k)),
        pairs=np.zeros((batch, k, k)),
        step_pairs=np.zeros((batch, steps, k, k)),
        path=np.full((batch, steps), -1),
        best=np.zeros(batch),
    )
    for b, length in enumerate(int(n) for n in lengths):
        trans = log_trans[b] if log_trans.ndim >= 3 else log_trans
        paths = np.array(list(itertools.product(range(k), repeat=length)))  # [K^L, L]
        score = log_init[paths[:, 0]] + log_emit[b, np.arange(length), paths].sum(1)
        if log_trans.ndim == 4:  # time-varying: step t's matrix into step t
            score = score + trans[np.arange(1, length), paths[:, :-1], paths[:, 1:]].sum(1)
        else:
            score = score + trans[paths[:, :-1], paths[:, 1:]].sum(1)
        top = score.max()
        ll = top + np.log(np.exp(score - top).sum())
        weight = np.exp(score - ll)
        out["ll"][b] = ll
        for t in range(length):
            np.add.at(out["post"][b, t], paths[:, t], weight)
            if t > 0:
                np.add.at(out["pairs"][b], (paths[:, t - 1], paths[:, t]), weight)
                np.add.at(out["step_pairs"][b, t], (paths[:, t - 1], paths[:, t]), weight)
        out["path"][b, :length] = paths[score.argmax()]
        out["best"][b] = top
    return out


LENGTHS = torch.tensor([4, 1, 3, 2, 4])


@pytest.mark.parametrize("trans", TRANS)
def test_step_log_likelihood_is_the_difference_of_brute_force_prefix_likelihoods(trans):
    log_init, log_trans, log_emit = random_hmm(
        5, 4, 3, per_seq=trans == "per_seq_trans", per_step=trans == "per_step_trans", dtype=torch.float64
    )
    log_emit[1, 1:] = float("nan")  # padding is ignored, whatever it holds
    steps = forward_backward(log_init, log_trans, log_emit, LENGTHS).step_log_likelihood
    expected = np.zeros((5, 4))
    for t in range(1, 5):  # log p(x_{1:t}) of every sequence at least t long, by enumerating its t-step paths
        prefix = brute_force(log_init, log_trans, log_emit[:, :t], torch.clamp(LENGTHS, max=t))["ll"]
        expected[:, t - 1] = prefix - (expected[:, : t - 1].sum(1) if t > 1 else 0.0)
    expected[np.arange(4)[None, :] >= LENGTHS.numpy()[:, None]] = 0.0
    assert_close(steps, expected, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match=r"sequence\(s\) \[0\] has probability zero"):
        impossible = log_emit.clone()
        impossible[0, 2] = -float("inf")
        forward_backward(log_init, log_trans, impossible, LENGTHS)


@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_backward_matches_brute_force(dtype, method, trans):
    log_init, log_trans, log_emit = random_hmm(
        5, 4, 3, per_seq=trans == "per_seq_trans", per_step=trans == "per_step_trans", dtype=dtype
    )
    log_emit[1, 1:] = float("nan")  # padding is ignored, whatever it holds
    res = forward_backward(log_init, log_trans, log_emit, LENGTHS, method=method)
    ref = brute_force(log_init, log_trans, log_emit, LENGTHS)
    for value in (res.log_likelihood, res.posterior, res.pair_counts, res.initial):
        assert value.dtype == dtype
    assert_close(res.log_likelihood, ref["ll"], **TOL[dtype])
    assert_close(res.posterior, ref["post"], **TOL[dtype])
    assert_close(res.pair_counts, ref["pairs"], **TOL[dtype])
    assert_close(res.initial, ref["post"][:, 0], **TOL[dtype])
    assert_close(res.expected_transitions, ref["pairs"].sum(0), **TOL[dtype])
    assert_close(res.expected_initial, ref["post"][:, 0].sum(0), **TOL[dtype])
    if trans == "per_step_trans":  # every step's pair marginals, what an input-driven chain's M-step reads
        assert_close(res.step_pairs, ref["step_pairs"], **TOL[dtype])
    else:
        assert res.step_pairs is None


def test_transitions_constant_over_time_are_the_shared_ones():
    log_init, log_trans, log_emit = random_hmm(5, 4, 3, per_seq=True, seed=2)
    steps = log_trans[:, None].expand(5, 4, 3, 3)
    varying, shared = (
        forward_backward(log_init, steps, log_emit, LENGTHS),
        forward_backward(log_init, log_trans, log_emit, LENGTHS),
    )
    for field in ("log_likelihood", "posterior", "pair_counts"):
        assert_close(getattr(varying, field), getattr(shared, field), rtol=1e-12, atol=1e-12)
    for a, b in zip(viterbi(log_init, steps, log_emit, LENGTHS), viterbi(log_init, log_trans, log_emit, LENGTHS)):
        assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_viterbi_matches_brute_force(dtype, trans):
    log_init, log_trans, log_emit = random_hmm(
        5, 4, 3, per_seq=trans == "per_seq_trans", per_step=trans == "per_step_trans", dtype=dtype, seed=1
    )
    paths, best = viterbi(log_init, log_trans, log_emit, LENGTHS)
    ref = brute_force(log_init, log_trans, log_emit, LENGTHS)
    assert paths.dtype == torch.long and best.dtype == dtype
    np.testing.assert_array_equal(paths.numpy(), ref["path"])
    assert_close(best, ref["best"], **TOL[dtype])


def test_per_sequence_init_matches_brute_force():
    log_init, log_trans, log_emit = random_hmm(5, 4, 3, per_seq=True)
    per_init = torch.log_softmax(torch.randn(5, 3, dtype=torch.float64), -1)
    res = forward_backward(per_init, log_trans, log_emit, LENGTHS)
    for b in range(5):
        ref = brute_force(per_init[b], log_trans[b], log_emit[b : b + 1], LENGTHS[b : b + 1])
        assert_close(res.log_likelihood[b], ref["ll"][0])
        assert_close(res.posterior[b], ref["post"][0])


@pytest.mark.parametrize("obs", ["categorical", "normal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_likelihood_matches_pyro_discrete_hmm(dtype, obs):
    batch, steps, k = 6, 7, 3
    g = torch.Generator().manual_seed(2)
    init_logits = torch.randn(k, generator=g, dtype=torch.float64).to(dtype)
    trans_logits = torch.randn(k, k, generator=g, dtype=torch.float64).to(dtype)
    if obs == "categorical":
        obs_dist = dist.Categorical(logits=torch.randn(k, 5, generator=g, dtype=torch.float64).to(dtype))
        data = torch.randint(0, 5, (batch, steps), generator=g)
    else:
        obs_dist = dist.Normal(torch.randn(k, generator=g, dtype=torch.float64).to(dtype), torch.ones(k, dtype=dtype))
        data = torch.randn(batch, steps, generator=g, dtype=torch.float64).to(dtype)
    expected = dist.DiscreteHMM(init_logits, trans_logits, obs_dist).log_prob(data)
    log_emit = obs_dist.log_prob(data.unsqueeze(-1))  # [B, T, K]
    log_trans = torch.log_softmax(trans_logits, -1)
    # Pyro's initial distribution is over a state *before* the first observation
    log_init = torch.logsumexp(torch.log_softmax(init_logits, -1).unsqueeze(-1) + log_trans, 0)
    res = forward_backward(log_init, log_trans, log_emit, torch.full((batch,), steps))
    assert_close(res.log_likelihood, expected, **TOL[dtype])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_posteriors_sum_to_one_at_valid_steps_and_zero_at_padding(dtype, method):
    lengths = torch.randint(1, 40, (64,), generator=torch.Generator().manual_seed(3))
    log_init, log_trans, log_emit = random_hmm(64, 45, 4, dtype=dtype, seed=3)
    res = forward_backward(log_init, log_trans, log_emit, lengths, method=method)
    mask = torch.arange(45) < lengths[:, None]
    total = res.posterior.sum(-1)
    assert_close(total[mask], torch.ones(int(mask.sum())), **TOL[dtype])
    assert (res.posterior[~mask] == 0).all()
    assert_close(res.pair_counts.sum((-2, -1)), (lengths - 1).to(torch.float64), **TOL[dtype])
    # pair counts marginalise to the smoothed posteriors of z_{t-1} and of z_t
    assert_close(
        res.pair_counts.sum(-1),
        (res.posterior * (torch.arange(45) < lengths[:, None] - 1)[..., None]).sum(1),  # all but the last step
        **TOL[dtype],
    )
    assert_close(res.pair_counts.sum(-2), res.posterior[:, 1:].sum(1), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_padding_and_order_invariance(dtype):
    lengths = torch.tensor([5, 2, 7, 1, 3])
    log_init, log_trans, log_emit = random_hmm(5, 7, 3, dtype=dtype, seed=4)
    res = forward_backward(log_init, log_trans, log_emit, lengths)
    paths, best = viterbi(log_init, log_trans, log_emit, lengths)

    order = torch.tensor([3, 0, 4, 2, 1])
    padded = torch.full((5, 11, 3), float("nan"), dtype=dtype)
    padded[:, :7] = log_emit[order]
    mask = torch.arange(11) < lengths[order, None]
    padded[~mask] = 123.0  # garbage beyond each sequence's end
    res2 = forward_backward(log_init, log_trans, padded, lengths[order])
    paths2, best2 = viterbi(log_init, log_trans, padded, lengths[order])
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    assert_close(res2.log_likelihood, res.log_likelihood[order], **tol)
    assert_close(res2.posterior[:, :7], res.posterior[order], **tol)
    assert (res2.posterior[:, 7:] == 0).all()
    assert_close(res2.pair_counts, res.pair_counts[order], **tol)
    assert torch.equal(paths2[:, :7], paths[order]) and (paths2[:, 7:] == -1).all()
    assert_close(best2, best[order], **tol)

    for b, length in enumerate(lengths.tolist()):  # each sequence on its own, unpadded
        alone = forward_backward(log_init, log_trans, log_emit[b : b + 1, :length])
        assert_close(alone.log_likelihood, res.log_likelihood[b : b + 1], **tol)
        assert_close(alone.posterior[0], res.posterior[b, :length], **tol)
        assert torch.equal(viterbi(log_init, log_trans, log_emit[b : b + 1, :length])[0][0], paths[b, :length])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_transitions_give_mixture_responsibilities(dtype, method):
    lengths = torch.tensor([6, 3, 1, 5])
    log_theta = torch.log_softmax(torch.randn(4, dtype=torch.float64), -1).to(dtype)
    log_emit = random_hmm(4, 6, 4, dtype=dtype, seed=5)[2]
    res = forward_backward(log_theta, log_theta.expand(4, 4), log_emit, lengths, method=method)
    mask = torch.arange(6) < lengths[:, None]
    resp = torch.softmax(log_theta + log_emit, -1) * mask[..., None]
    assert_close(res.posterior, resp, **TOL[dtype])
    per_step = torch.logsumexp(log_theta + log_emit, -1) * mask
    assert_close(res.log_likelihood, per_step.sum(1), **TOL[dtype])
    outer = (resp[:, :-1, :, None] * resp[:, 1:, None, :]).sum(1)
    assert_close(res.pair_counts, outer, **TOL[dtype])


@pytest.mark.parametrize("method", METHODS)
def test_gradient_of_log_likelihood_is_the_posterior(method):
    lengths = torch.tensor([5, 3, 4])
    log_init, log_trans, log_emit = random_hmm(3, 5, 3, seed=6)
    log_emit.requires_grad_(True)
    res = forward_backward(log_init, log_trans, log_emit, lengths, method=method)
    (grad,) = torch.autograd.grad(res.log_likelihood.sum(), log_emit)
    assert_close(grad, res.posterior.detach(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("zeros", ["structural_zeros", "tiny_probs"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_dynamic_range_stays_exact(dtype, zeros):
    """Forward variables 150 nats apart: shifted products underflow in float32, and auto falls back."""
    tiny = float("-inf") if zeros == "structural_zeros" else -200.0
    log_trans = torch.tensor([[0.0, 0.0, tiny], [tiny, 0.0, 0.0], [tiny, tiny, 0.0]], dtype=torch.float64)
    log_trans = torch.log_softmax(log_trans, -1)
    log_init = torch.full((3,), -np.log(3.0), dtype=torch.float64)
    log_emit = torch.tensor([[[0.0, -150.0, -150.0], [-2000.0, -2000.0, 0.0], [-1.0, -2.0, 0.0]]], dtype=torch.float64)
    ref = brute_force(log_init, log_trans, log_emit, [3])
    args = [x.to(dtype) for x in (log_init, log_trans, log_emit)]
    for method in METHODS:
        res = forward_backward(*args, method=method)
        assert_close(res.log_likelihood, ref["ll"], **TOL[dtype])
        assert_close(res.posterior, ref["post"], **TOL[dtype])
        assert_close(res.pair_counts, ref["pairs"], **TOL[dtype])
    log_init, log_trans, emit, _, mask, _ = _check_inputs(*args, None)
    scaled = _smooth_scaled(log_init, log_trans, emit.transpose(0, 1), mask.T)
    assert (scaled is None) == (dtype == torch.float32)  # the fallback is taken exactly when needed


def test_single_step_sequences():
    log_init, log_trans, log_emit = random_hmm(3, 1, 4, seed=7)
    res = forward_backward(log_init, log_trans, log_emit, torch.ones(3, dtype=torch.long))
    assert_close(res.posterior[:, 0], torch.softmax(log_init + log_emit[:, 0], -1))
    assert (res.pair_counts == 0).all()
    paths, best = viterbi(log_init, log_trans, log_emit)
    assert torch.equal(paths[:, 0], (log_init + log_emit[:, 0]).argmax(-1))


def test_numpy_inputs_and_dtype_promotion():
    log_init, log_trans, log_emit = random_hmm(2, 3, 2, seed=8)
    res = forward_backward(log_init.numpy(), log_trans.float(), log_emit.float(), np.array([3, 2]))
    assert res.posterior.dtype == torch.float64
    assert_close(res.log_likelihood, forward_backward(log_init, log_trans, log_emit, [3, 2]).log_likelihood, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_runs_on_device_of_data(device):
    log_init, log_trans, log_emit = (x.to(device) for x in random_hmm(4, 6, 3, seed=9))
    lengths = torch.tensor([6, 2, 5, 1])  # lengths may live on the CPU
    res = forward_backward(log_init, log_trans, log_emit, lengths)
    paths, best = viterbi(log_init, log_trans, log_emit, lengths)
    assert res.posterior.device.type == device and paths.device.type == device and best.device.type == device
    ref = brute_force(*(x.cpu() for x in (log_init, log_trans, log_emit)), lengths)
    assert_close(res.log_likelihood, ref["ll"])
    np.testing.assert_array_equal(paths.cpu().numpy(), ref["path"])


def _bad(**changes):
    log_init, log_trans, log_emit = random_hmm(3, 4, 2, seed=10)
    args = dict(log_init=log_init, log_trans=log_trans, log_emit=log_emit, lengths=torch.tensor([4, 2, 3]))
    for key, value in changes.items():
        args[key] = value(args[key]) if callable(value) else value
    return args


def _set(index, value):
    def change(x):
        x = x.clone()
        x[index] = value
        return x

    return change


BAD_INPUTS = [
    pytest.param(dict(lengths=torch.tensor([4, 0, 3])), ValueError, "lengths.*>= 1", id="zero-length"),
    pytest.param(dict(lengths=torch.tensor([4, -1, 3])), ValueError, "lengths", id="negative-length"),
    pytest.param(dict(lengths=torch.tensor([5, 2, 3])), ValueError, "lengths.*<= T=4", id="length-beyond-T"),
    pytest.param(dict(lengths=torch.tensor([4, 2])), ValueError, "lengths must have shape", id="lengths-wrong-size"),
    pytest.param(dict(lengths=torch.tensor([4.0, 2.0, 3.0])), TypeError, "lengths", id="float-lengths"),
    pytest.param(dict(log_emit=_set((0, 1, 0), float("nan"))), ValueError, "log_emit.*NaN", id="nan-emission"),
    pytest.param(dict(log_emit=_set((2, 0, 1), float("inf"))), ValueError, "log_emit.*inf", id="posinf-emission"),
    pytest.param(dict(log_trans=_set((0, 1), float("nan"))), ValueError, "log_trans.*NaN", id="nan-transition"),
    pytest.param(dict(log_init=_set(0, float("inf"))), ValueError, "log_init", id="posinf-init"),
    pytest.param(dict(log_trans=torch.zeros(3, 3)), ValueError, "log_trans must have shape", id="trans-wrong-K"),
    pytest.param(dict(log_trans=torch.zeros(2, 2, 2)), ValueError, "log_trans must have shape", id="trans-wrong-B"),
    pytest.param(dict(log_init=torch.zeros(3)), ValueError, "log_init must have shape", id="init-wrong-K"),
    pytest.param(dict(log_emit=lambda x: x[0]), ValueError, "log_emit must be 3-D.*log_emit\\[None\\]", id="2d-emit"),
    pytest.param(dict(log_emit=lambda x: x[:, :0]), ValueError, "log_emit is empty", id="empty-emit"),
    pytest.param(dict(log_emit=lambda x: x.long()), TypeError, "log_emit.*floating", id="integer-emit"),
    pytest.param(
        dict(log_emit=_set((1, 1), float("-inf"))),
        ValueError,
        "sequence\\(s\\) \\[1\\].*probability zero",
        id="impossible",
    ),
]


@pytest.mark.parametrize("changes, error, match", BAD_INPUTS)
@pytest.mark.parametrize("func", ["forward_backward", "viterbi"])
def test_bad_inputs_raise_clear_errors(func, changes, error, match):
    fn = forward_backward if func == "forward_backward" else viterbi
    with pytest.raises(error, match=match):
        fn(**_bad(**changes))


def test_neg_inf_at_padded_steps_and_in_parameters_is_allowed():
    args = _bad(log_emit=_set((1, 3), float("-inf")), log_trans=_set((0, 1), float("-inf")))
    ref = brute_force(args["log_init"], args["log_trans"], args["log_emit"], args["lengths"])
    res = forward_backward(**args)
    assert_close(res.log_likelihood, ref["ll"])
    assert_close(res.pair_counts, ref["pairs"])
    assert res.pair_counts[:, 0, 1].eq(0).all()


def test_unknown_method():
    with pytest.raises(ValueError, match="method must be one of"):
        forward_backward(**_bad(), method="scaled")


@pytest.mark.parametrize(
    "case",
    [
        "tree",
        "tree-per-sequence",
        "tree-per-step",
        "tree-wide-range",
        "forbidden-moves",
        "one-step",
        "forward-backward",
        "forward-backward-per-step",
    ],
)
def test_log_likelihood_and_its_gradients_are_the_forward_backward_answers(case, monkeypatch):
    """``log_likelihood`` (the pairwise tree of step matrices; with ``-inf`` entries or beyond ``TREE_CELLS`` one
    forward-backward) equals ``forward_backward``'s log-likelihood, and its gradients are the posteriors: ``d / d
    log_emit`` the state marginals, ``d / d log_trans`` the expected transition counts, ``d / d log_init`` the first
    state's marginals (the theory of the log-sum over paths), with padded steps of unequal lengths."""
    import ppmix.algorithms.forward_backward as fb

    gen = torch.Generator().manual_seed(3)
    b, t, k = 4, 1 if case == "one-step" else 11, 3
    lengths = torch.tensor([t, max(1, t - 4), 1, max(1, t - 1)])
    log_init = torch.randn(k, generator=gen, dtype=torch.float64).log_softmax(0)
    trans_shape = {"tree-per-sequence": (b, k, k), "tree-per-step": (b, t, k, k)}.get(case, (k, k))
    if case == "forward-backward-per-step":
        trans_shape = (b, t, k, k)
    log_trans = torch.randn(trans_shape, generator=gen, dtype=torch.float64).log_softmax(-1)
    log_emit = torch.randn(b, t, k, generator=gen, dtype=torch.float64) * (400.0 if case == "tree-wide-range" else 1.0)
    if case == "forbidden-moves":
        log_trans = log_trans.masked_fill(
            torch.tensor([[False, False, True], [True, False, False], [False, True, False]]), float("-inf")
        )
    if case.startswith("forward-backward"):
        monkeypatch.setattr(fb, "TREE_CELLS", 0)
    inputs = [x.clone().requires_grad_() for x in (log_init, log_trans, log_emit)]
    value = log_likelihood(*inputs, lengths)
    weights = torch.rand(b, generator=gen, dtype=torch.float64)  # a weighted sum: every sequence's gradient scaled
    grads = torch.autograd.grad((weights * value).sum(), inputs, allow_unused=True)  # one step: no transition
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]
    expected = forward_backward(log_init, log_trans, log_emit, lengths)
    assert_close(value, expected.log_likelihood, rtol=1e-10, atol=1e-10)
    w = weights[:, None, None]
    init_grad = (weights[:, None] * expected.initial).sum(0)
    if log_trans.dim() == 4:  # d / d log_trans[b, t] is step t's pair marginals
        trans_grad = weights[:, None, None, None] * expected.step_pairs
    elif case == "tree-per-sequence":
        trans_grad = w * expected.pair_counts
    else:
        trans_grad = (w * expected.pair_counts).sum(0)
    for got, want in zip(grads, (init_grad, trans_grad, w * expected.posterior)):
        assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_log_likelihood_is_nan_or_minus_inf_where_it_is_undefined_not_an_error():
    """NUTS's potential meets such points far out in warmup: NaN inputs give NaN, a sequence that no path explains
    gives -inf (``forward_backward`` raises there), each with a zero gradient."""
    log_init = torch.tensor([0.0, float("-inf")], dtype=torch.float64, requires_grad=True)
    log_trans = torch.tensor([[0.0, float("-inf")], [0.0, float("-inf")]], dtype=torch.float64)  # always state 0
    log_emit = torch.tensor([[[float("-inf"), 0.0], [0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    value = log_likelihood(log_init, log_trans, log_emit)
    assert value.tolist() == [float("-inf")]
    (grad,) = torch.autograd.grad(value.sum(), [log_emit])
    assert bool((grad == 0).all())
    nan_emit = log_emit.detach().clone()
    nan_emit[0, 1, 0] = float("nan")
    assert bool(torch.isnan(log_likelihood(log_init, log_trans, nan_emit)).all())
