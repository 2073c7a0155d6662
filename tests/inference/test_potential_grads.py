"""The closed-form gradients of NUTS's potential equal autograd's: the mixture log-likelihood and the component
log-densities of :mod:`ppmix.engines.potential_grads` (diagonal and full Gaussian, diagonal Student t) and the
chain-batched HMM forward of :mod:`ppmix.engines.hmm_chains` (also with diagonal Gaussian emissions scored inside the
kernel), at random parameters, to 1e-10."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.algorithms.forward_backward import log_likelihood
from ppmix.components import FullGaussian
from ppmix.components.centred import CentredData
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.student_t import StudentTComponents
from ppmix.engines import hmm_chains, potential_grads
from ppmix.engines.hmm_chains import (
    _exact_log_likelihood,
    _torch_log_likelihood,
    chains_log_likelihood,
    gaussian_chains_log_likelihood,
    packed_chains_log_likelihood,
)
from ppmix.engines.potential_grads import component_log_prob, mixture_log_likelihood

F64 = torch.float64
CHAINS, K, D, N = 3, 2, 2, 40


def _parameters(kind: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random parameters of ``CHAINS * K`` components, leaves of the autograd graph."""
    m = CHAINS * K
    values = {"loc": 2 * torch.randn(m, D, generator=generator, dtype=F64)}
    if kind == "full":
        tril = torch.tril(0.4 * torch.randn(m, D, D, generator=generator, dtype=F64), -1)
        diagonal = 0.5 + torch.rand(m, D, generator=generator, dtype=F64)
        values["scale_tril"] = tril + torch.diag_embed(diagonal)
    else:
        values["scale"] = 0.5 + torch.rand(m, D, generator=generator, dtype=F64)
    if kind == "student_t":
        values["df"] = 0.5 + 10 * torch.rand(m, generator=generator, dtype=F64)
    return {name: value.requires_grad_() for name, value in values.items()}


def _components(kind: str, values: dict[str, torch.Tensor]):
    if kind == "diag":
        return DiagGaussian(values["loc"], values["scale"])
    if kind == "full":
        return FullGaussian(values["loc"], values["scale_tril"])
    return StudentTComponents(values["df"], values["loc"], values["scale"])


def _rows(kind: str, generator: torch.Generator, centred: bool):
    x = 3 * torch.randn(N, D, generator=generator, dtype=F64) + 1.0
    return CentredData.from_tensor(x) if centred and kind != "student_t" else x


CASES = [("diag", False), ("diag", True), ("full", False), ("full", True), ("student_t", False)]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.detach(), b.detach()
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-10 * float(b.abs().max().clamp(min=1.0))), (a - b).abs().max()


@pytest.mark.parametrize("kind, centred", CASES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("path", ["compiled", "torch"])
def test_mixture_gradient_equals_autograd(kind, centred, seed, path, monkeypatch):
    """Both paths: the compiled kernel (:mod:`ppmix.engines.mixture_kernel`, where numba is installed) and the torch
    scores it falls back to (CUDA, no numba)."""
    if path == "torch":
        monkeypatch.setattr(potential_grads, "_FUSED", {})
    generator = torch.Generator().manual_seed(seed)
    values = _parameters(kind, generator)
    log_weights = torch.randn(CHAINS, K, generator=generator, dtype=F64).log_softmax(-1).requires_grad_()
    data = _rows(kind, generator, centred)
    upstream = torch.randn(CHAINS, generator=generator, dtype=F64)  # a weighted sum: every chain's gradient apart
    ours = mixture_log_likelihood(_components(kind, values), data, log_weights)
    components = _components(kind, values)
    exact = torch.logsumexp(components.log_prob(data).reshape(N, CHAINS, K) + log_weights, -1).sum(0)
    _close(ours, exact)
    leaves = [log_weights, *values.values()]
    for a, b in zip(
        torch.autograd.grad((ours * upstream).sum(), leaves), torch.autograd.grad((exact * upstream).sum(), leaves)
    ):
        _close(a, b)


@pytest.mark.parametrize("kind", ["diag", "student_t"])
def test_the_compiled_kernel_is_taken_on_the_cpu_with_numba(kind):
    pytest.importorskip("numba")
    components = _components(kind, _parameters(kind, torch.Generator().manual_seed(4)))
    assert potential_grads._fused(components) is not None


@pytest.mark.parametrize("path", ["compiled", "torch"])
def test_a_far_row_is_scored_without_cancellation(path, monkeypatch):
    """Both paths score a row far from the origin under a tight component from its deviation (the kernel always,
    the torch path where the expansion would cancel): the Gaussian log-density of ``x - mu`` to 1e-12."""
    if path == "torch":
        monkeypatch.setattr(potential_grads, "_FUSED", {})
    loc = torch.tensor([[1e6]], dtype=F64, requires_grad=True)
    scale = torch.tensor([[1e-3]], dtype=F64, requires_grad=True)
    x = torch.tensor([[1e6 + 2e-3], [1e6 - 1e-3]], dtype=F64)
    value = mixture_log_likelihood(DiagGaussian(loc, scale), x, torch.zeros(1, 1, dtype=F64))
    z = ((x - loc) / scale).detach()
    exact = (-0.5 * z.square() - math.log(1e-3) - 0.5 * math.log(2 * math.pi)).sum()
    assert float(value) == pytest.approx(float(exact), abs=1e-12)


@pytest.mark.parametrize("kind, centred", CASES)
def test_component_log_prob_gradient_equals_autograd(kind, centred):
    generator = torch.Generator().manual_seed(2)
    values = _parameters(kind, generator)
    data = _rows(kind, generator, centred)
    weights = torch.rand(N, CHAINS * K, generator=generator, dtype=F64)  # e.g. an HMM's state posteriors
    ours = component_log_prob(_components(kind, values), data)
    exact = _components(kind, values).log_prob(data)
    _close(ours, exact)
    leaves = list(values.values())
    for a, b in zip(
        torch.autograd.grad((ours * weights).sum(), leaves), torch.autograd.grad((exact * weights).sum(), leaves)
    ):
        _close(a, b)


def _log_space_forward(log_init, log_trans, log_emit, lengths):
    """``sum_b log p(x_b)`` per chain by the log-space forward recursion, differentiated by autograd."""
    alpha = log_init[:, None, :] + log_emit[:, :, 0]
    for t in range(1, log_emit.shape[2]):
        step = torch.logsumexp(alpha[..., :, None] + log_trans[:, None], dim=-2) + log_emit[:, :, t]
        alpha = torch.where((t < lengths)[None, :, None], step, alpha)
    return torch.logsumexp(alpha, -1).sum(-1)


def _hmm_case(generator, chains, states, lengths, forbidden, dtype=F64):
    """Random log initial distributions ``(C, K)``, log transitions ``(C, K, K)`` (``-inf`` off a cyclic pattern
    where ``forbidden``) and emission log-densities ``(C, B, T, K)``, leaves of the autograd graph."""
    steps = int(lengths.max())
    log_init = torch.randn(chains, states, generator=generator, dtype=F64).log_softmax(-1)
    raw = torch.randn(chains, states, states, generator=generator, dtype=F64)
    if forbidden and states > 1:  # a transition pattern: the scaled recursions keep exact zeros
        raw = raw.masked_fill(torch.eye(states, dtype=torch.bool).roll(1, 0), float("-inf"))
    log_emit = 4 * torch.randn(chains, len(lengths), steps, states, generator=generator, dtype=F64)
    return [x.to(dtype).requires_grad_() for x in (log_init, raw.log_softmax(-1), log_emit)]


def _packed(log_init, log_trans, log_emit, lengths):
    """:func:`packed_chains_log_likelihood` of the valid steps of a padded batch."""
    mask = torch.arange(log_emit.shape[2]) < lengths[:, None]
    return packed_chains_log_likelihood(log_init, log_trans, log_emit[:, mask].transpose(0, 1), lengths)


#: the ways of computing the chains' log-likelihood: the compiled kernel (on the CPU with numba), the batched torch
#: recursions (CUDA, no numba), the kernel on packed valid steps (the potential's), the log-space recursion of
#: :func:`ppmix.algorithms.forward_backward.log_likelihood`
HMM_PATHS = {
    "kernel": chains_log_likelihood,
    "torch": _torch_log_likelihood,
    "packed": _packed,
    "log-space": _exact_log_likelihood,
}


def _gradients(output, inputs):
    """The gradients of ``output``, zero for an input it does not use (the transitions of one-step sequences)."""
    grads = torch.autograd.grad(output, inputs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]


def _hmm_agree(inputs, lengths, generator, paths=HMM_PATHS, tolerance=1e-10):
    """Every path's value and gradient (of a random weighted sum over the chains) equal the hand-written log-space
    recursion's, differentiated by autograd (``-inf`` gradients of forbidden transitions read as zero)."""
    upstream = torch.randn(inputs[0].shape[0], generator=generator, dtype=F64).to(inputs[0].dtype)
    exact = _log_space_forward(*inputs, lengths)
    expected = [exact, *_gradients((exact * upstream).sum(), inputs)]
    for name, path in paths.items():
        value = path(*inputs, lengths)
        got = [value, *_gradients((value * upstream).sum(), inputs)]
        for a, b in zip(got, expected):
            a, b = (torch.nan_to_num(x.detach().double(), neginf=0.0) for x in (a, b))
            scale = float(b.abs().max().clamp(min=1.0))
            assert torch.allclose(a, b, rtol=tolerance, atol=tolerance * scale), (name, float((a - b).abs().max()))


@pytest.mark.parametrize("lengths", [[6, 6, 6], [6, 2, 1]])
@pytest.mark.parametrize("forbidden", [False, True])
@pytest.mark.parametrize("states", [1, 3])
def test_hmm_chains_gradient_equals_autograd(lengths, forbidden, states):
    """The kernel, the torch recursions, the packed kernel and the log-space recursion of ``forward_backward`` give
    the same log-likelihood and gradients, with padding, forbidden transitions and a single state."""
    generator = torch.Generator().manual_seed(3)
    lengths = torch.tensor(lengths)
    _hmm_agree(_hmm_case(generator, 2, states, lengths, forbidden), lengths, generator)


def test_hmm_chains_float32_agree():
    """float32 inputs: the kernel (which computes in float64) and the torch recursions (in float32) agree with the
    float64 log-space recursion to float32's precision, and answer in float32."""
    generator = torch.Generator().manual_seed(5)
    lengths = torch.tensor([7, 3, 5])
    inputs = _hmm_case(generator, 3, 3, lengths, True, dtype=torch.float32)
    assert all(path(*inputs, lengths).dtype == torch.float32 for path in HMM_PATHS.values())
    _hmm_agree(inputs, lengths, generator, tolerance=2e-5)


@settings(max_examples=15, deadline=None)
@given(
    chains=st.integers(1, 3),
    states=st.integers(1, 4),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    forbidden=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_hmm_chains_agree_on_random_batches(chains, states, lengths, forbidden, seed):
    """Random batches (more sequences than a block of lanes, unequal lengths, any number of chains and states):
    every path agrees with the log-space recursion."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    _hmm_agree(_hmm_case(generator, chains, states, lengths, forbidden), lengths, generator)


def test_hmm_chains_without_numba_run_on_torch(monkeypatch):
    """Where numba cannot be imported the CPU path is the torch recursions' (the same function)."""
    monkeypatch.setattr(hmm_chains, "_kernel", lambda: None)
    generator = torch.Generator().manual_seed(4)
    lengths = torch.tensor([5, 3])
    inputs = _hmm_case(generator, 2, 3, lengths, False)
    assert not hmm_chains._runs_on_kernel(*inputs)
    _hmm_agree(inputs, lengths, generator, paths={"kernel": chains_log_likelihood, "packed": _packed})


@pytest.mark.parametrize("path", sorted(HMM_PATHS))
def test_hmm_chains_nan_emissions_give_nan(path):
    """A NaN emission log-density: the scaled recursions refuse it and every path answers as the log-space one
    (NaN for the chain that has it), without an error."""
    generator = torch.Generator().manual_seed(6)
    lengths = torch.tensor([4, 4])
    log_init, log_trans, log_emit = (x.detach() for x in _hmm_case(generator, 2, 2, lengths, False))
    log_emit[1, 0, 2, 1] = float("nan")
    value = HMM_PATHS[path](log_init, log_trans, log_emit, lengths)
    assert torch.isnan(value[1])
    torch.testing.assert_close(value, _exact_log_likelihood(log_init, log_trans, log_emit, lengths), equal_nan=True)


def test_hmm_chains_fall_back_where_a_step_is_impossible():
    """A sequence no path explains: the scaled recursion's normaliser is zero, the log-space one answers ``-inf``."""
    log_init = torch.tensor([[0.0, float("-inf")]], dtype=F64)
    log_trans = torch.tensor([[[0.0, float("-inf")], [float("-inf"), 0.0]]], dtype=F64)
    log_emit = torch.tensor([[[[0.0, 0.0], [float("-inf"), 0.0]]]], dtype=F64)  # state 0 cannot emit step 1
    lengths = torch.tensor([2])
    for path in HMM_PATHS.values():
        value = path(log_init, log_trans, log_emit, lengths)
        assert value.shape == (1,) and torch.isneginf(value).all()
        assert torch.equal(value, log_likelihood(log_init[0], log_trans[0], log_emit[0], lengths).sum()[None])


def _gaussian_hmm_case(generator, chains, states, lengths, forbidden, dims):
    """Random chain parameters (:func:`_hmm_case`'s), rows ``(N, D)`` away from the origin, emission means and
    standard deviations ``(C, K, D)``, leaves of the autograd graph."""
    log_init, log_trans, _ = _hmm_case(generator, chains, states, lengths, forbidden)
    x = 5.0 + 2 * torch.randn(int(lengths.sum()), dims, generator=generator, dtype=F64)
    loc = (5.0 + 2 * torch.randn(chains, states, dims, generator=generator, dtype=F64)).requires_grad_()
    scale = (0.3 + torch.rand(chains, states, dims, generator=generator, dtype=F64)).requires_grad_()
    return log_init, log_trans, x, loc, scale


def _gaussian_hmm_reference(log_init, log_trans, x, loc, scale, lengths):
    """``sum_b log p(x_b)`` per chain by the family's ``log_prob`` and ppmix's log-space forward recursion
    (:func:`~ppmix.algorithms.forward_backward.log_likelihood`), differentiable by autograd."""
    chains, k, dims = loc.shape
    frames = DiagGaussian(loc.reshape(-1, dims), scale.reshape(-1, dims)).log_prob(x).reshape(-1, chains, k)
    mask = torch.arange(int(lengths.max())) < lengths[:, None]
    log_emit = frames.new_zeros(chains, len(lengths), int(lengths.max()), k)
    log_emit[:, mask] = frames.transpose(0, 1)
    return _exact_log_likelihood(log_init, log_trans, log_emit, lengths)


@settings(max_examples=15, deadline=None)
@given(
    chains=st.integers(1, 3),
    states=st.integers(1, 4),
    dims=st.integers(1, 3),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    forbidden=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_gaussian_hmm_kernel_equals_autograd_of_the_log_space_recursion(chains, states, dims, lengths, forbidden, seed):
    """The kernel that scores diagonal Gaussian emissions itself gives the value and the gradients with respect to the
    log initial distributions, log transitions, means and standard deviations that autograd gives through the
    family's ``log_prob`` and the log-space recursion, to 1e-10 (padding, forbidden transitions, one state, unequal
    lengths, more sequences than a block of lanes)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    inputs = _gaussian_hmm_case(generator, chains, states, lengths, forbidden, dims)
    fast = gaussian_chains_log_likelihood(*inputs, lengths)
    exact = _gaussian_hmm_reference(*inputs, lengths)
    leaves = [inputs[0], inputs[1], inputs[3], inputs[4]]
    expected = [exact, *_gradients(exact.sum(), leaves)]
    got = [fast.value, fast.log_init, fast.log_trans, fast.loc, fast.scale]
    for name, a, b in zip(("value", "log_init", "log_trans", "loc", "scale"), got, expected):
        a, b = (torch.nan_to_num(v.detach(), neginf=0.0) for v in (a, b))
        scale = float(b.abs().max().clamp(min=1.0))
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10 * scale), (name, float((a - b).abs().max()))


def test_gaussian_hmm_kernel_declines_an_impossible_step():
    """A step that the only allowed path explains with a density of ``exp(-5e9)`` (the rescaling normaliser underflows):
    None, for the caller's log-space recursion, which gives the value."""
    log_init = torch.tensor([[0.0, float("-inf")]], dtype=F64)
    log_trans = torch.tensor([[[0.0, float("-inf")], [float("-inf"), 0.0]]], dtype=F64)
    x = torch.tensor([[0.0], [100.0]], dtype=F64)  # state 0 cannot have emitted step 1
    loc = torch.tensor([[[0.0], [100.0]]], dtype=F64)
    scale = torch.full((1, 2, 1), 1e-3, dtype=F64)
    lengths = torch.tensor([2])
    assert gaussian_chains_log_likelihood(log_init, log_trans, x, loc, scale, lengths) is None
    assert float(_gaussian_hmm_reference(log_init, log_trans, x, loc, scale, lengths)) < -4e9


def test_gaussian_hmm_kernel_needs_numba(monkeypatch):
    """Without numba the kernel declines (the potential then differentiates by autograd)."""
    monkeypatch.setattr(hmm_chains, "_kernel", lambda: None)
    generator = torch.Generator().manual_seed(2)
    lengths = torch.tensor([3, 2])
    assert gaussian_chains_log_likelihood(*_gaussian_hmm_case(generator, 2, 2, lengths, False, 1), lengths) is None
    components = DiagGaussian(torch.zeros(2, 1, dtype=F64), torch.ones(2, 1, dtype=F64))
    assert not potential_grads.hmm_fusable(components)
