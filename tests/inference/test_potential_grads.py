"""The closed-form gradients of NUTS's potential equal autograd's: the mixture log-likelihood and the component
log-densities of :mod:`ppmix.engines.potential_grads` (diagonal and full Gaussian, diagonal Student t) and the
chain-batched HMM forward of :mod:`ppmix.engines.hmm_chains`, at random parameters, to 1e-10."""

from __future__ import annotations

import math

import pytest
import torch

from ppmix.algorithms.forward_backward import log_likelihood
from ppmix.components import FullGaussian
from ppmix.components.centred import CentredData
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.student_t import StudentTComponents
from ppmix.engines import potential_grads
from ppmix.engines.hmm_chains import chains_log_likelihood
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


@pytest.mark.parametrize("lengths", [[6, 6, 6], [6, 2, 1]])
@pytest.mark.parametrize("forbidden", [False, True])
def test_hmm_chains_gradient_equals_autograd(lengths, forbidden):
    generator = torch.Generator().manual_seed(3)
    chains, states, steps = 2, 3, 6
    lengths = torch.tensor(lengths)
    log_init = torch.randn(chains, states, generator=generator, dtype=F64).log_softmax(-1).requires_grad_()
    raw = torch.randn(chains, states, states, generator=generator, dtype=F64)
    if forbidden:  # a transition pattern: the scaled recursion keeps exact zeros
        raw = raw.masked_fill(torch.eye(states, dtype=torch.bool).roll(1, 0), float("-inf"))
    log_trans = raw.log_softmax(-1).requires_grad_()
    log_emit = (4 * torch.randn(chains, 3, steps, states, generator=generator, dtype=F64)).requires_grad_()
    upstream = torch.randn(chains, generator=generator, dtype=F64)
    ours = chains_log_likelihood(log_init, log_trans, log_emit, lengths)
    exact = _log_space_forward(log_init, log_trans, log_emit, lengths)
    _close(ours, exact)
    leaves = [log_init, log_trans, log_emit]
    mine = torch.autograd.grad((ours * upstream).sum(), leaves)
    theirs = torch.autograd.grad((exact * upstream).sum(), leaves)
    for a, b in zip(mine, theirs):
        _close(torch.nan_to_num(a, neginf=0.0), torch.nan_to_num(b, neginf=0.0))


def test_hmm_chains_fall_back_where_a_step_is_impossible():
    """A sequence no path explains: the scaled recursion's normaliser is zero, the log-space one answers ``-inf``."""
    log_init = torch.tensor([[0.0, float("-inf")]], dtype=F64)
    log_trans = torch.tensor([[[0.0, float("-inf")], [float("-inf"), 0.0]]], dtype=F64)
    log_emit = torch.tensor([[[[0.0, 0.0], [float("-inf"), 0.0]]]], dtype=F64)  # state 0 cannot emit step 1
    lengths = torch.tensor([2])
    value = chains_log_likelihood(log_init, log_trans, log_emit, lengths)
    assert value.shape == (1,) and torch.isneginf(value).all()
    assert torch.equal(value, log_likelihood(log_init[0], log_trans[0], log_emit[0], lengths).sum()[None])
