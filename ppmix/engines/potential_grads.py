"""The log-likelihood of a mixture at every NUTS chain's parameters, with its gradient in closed form.

``L_c = sum_n log sum_k w_ck p(x_n | theta_ck)``: its gradient is the responsibilities ``r_nck`` (the softmax over
``k`` of the joint log-densities) times each component's score,

    dL_c / d log w_ck = sum_n r_nck,      dL_c / d theta_ck = sum_n r_nck d log p(x_n | theta_ck) / d theta_ck,

and for the families below the score's sums over the rows are a few weighted sums of the data, with no autograd graph
through the ``(N, C K)`` log-densities (whose backward pass costs more than the forward):

* diagonal Gaussian ``N(mu, diag(sigma^2))``: with ``R = sum_n r_n``, ``S1 = sum_n r_n x_n``, ``S2 = sum_n r_n x_n^2``
  (rows centred at the data's mean, as the family centres them), ``d/d mu = (S1 - R mu) / sigma^2`` and
  ``d/d sigma = -R / sigma + (S2 - 2 mu S1 + R mu^2) / sigma^3``;
* full Gaussian ``N(mu, L L^T)``: with the scatter ``M = sum_n r_n (x_n - mu)(x_n - mu)^T``, ``d/d mu = Sigma^{-1}
  (S1 - R mu)`` and ``d/d L = tril(L^{-T} (L^{-1} M L^{-T} - R I))``;
* diagonal Student t with ``delta_n = sum_d ((x_nd - mu_d) / sigma_d)^2`` and the latent precisions ``u_n = (nu + D) /
  (nu + delta_n)``: ``d/d mu = sum_n r_n u_n (x_n - mu) / sigma^2``, ``d/d sigma = -R / sigma + sum_n r_n u_n (x_n -
  mu)^2 / sigma^3``, ``d/d nu = R (psi((nu + D) / 2) - psi(nu / 2) - D / nu) / 2 + sum_n r_n (u_n delta_n / nu -
  log(1 + delta_n / nu)) / 2``.

On the CPU, where numba is installed, the diagonal Gaussian's and Student t's value and sums come from one compiled
pass over the rows (:mod:`ppmix.engines.mixture_kernel`: the log-densities from the deviations, nothing of size
``(N, C K)`` stored), tested equal to the torch path below. Elsewhere the value is the components' own ``log_prob``
(the function the program defines, computed without a graph); in both the gradient flows on by autograd from the
components' parameters to the sites (the full covariance's ``L`` from its scales and correlation factor: small
tensors). Each score, and each kernel, is tested equal to autograd's (``tests/inference/test_potential_grads.py``).
An HMM with diagonal Gaussian emissions has the same form with the state posteriors in place of the
responsibilities: :func:`fused_hmm_log_likelihood` takes its value and every gradient from the compiled forward-backward
(:func:`~ppmix.engines.hmm_chains.gaussian_chains_log_likelihood`). Other families return None from
:func:`mixture_log_likelihood`: the potential then differentiates the log-densities
by autograd.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ppmix.components import FullGaussian
from ppmix.components.centred import as_centred
from ppmix.components.gaussian_diag import DiagGaussian
from ppmix.components.student_t import StudentTComponents
from ppmix.engines import hmm_chains, mixture_kernel

__all__ = [
    "component_log_prob",
    "fused_hmm_log_likelihood",
    "fused_mixture_log_likelihood",
    "mixture_log_likelihood",
]

#: ``(components, data, r (N, M)) -> the gradients of sum_n r_nm log p_m(x_n)`` in the order of the family's
#: :data:`_PARAMETERS`
Score = Callable[[Any, Any, torch.Tensor], tuple[torch.Tensor, ...]]


def _diag_gaussian_score(components: DiagGaussian, data: Any, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    data = as_centred(data, components.dtype, components.device)
    loc = components.loc.detach() - data.shift
    scale = components.scale.detach()
    total = r.sum(0)[:, None]
    first = r.T @ data.centred
    second = r.T @ data.centred.square()
    variance = scale.square()
    g_loc = (first - total * loc) / variance
    g_scale = (-total + (second - 2 * loc * first + total * loc.square()) / variance) / scale
    return g_loc, g_scale


def _full_gaussian_score(components: FullGaussian, data: Any, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    data = as_centred(data, components.dtype, components.device)
    x, loc, tril = data.centred, components.loc.detach() - data.shift, components.scale_tril.detach()
    d = x.shape[1]
    total = r.sum(0)
    first = r.T @ x  # (M, D)
    second = (r.T @ (x[:, :, None] * x[:, None, :]).reshape(-1, d * d)).reshape(-1, d, d)
    outer = first[:, :, None] * loc[:, None, :]
    scatter = second - outer - outer.transpose(-1, -2) + total[:, None, None] * loc[:, :, None] * loc[:, None, :]
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    inverse = torch.linalg.solve_triangular(tril, eye.expand_as(tril), upper=False)  # L^{-1}
    residual = (first - total[:, None] * loc)[..., None]
    g_loc = (inverse.transpose(-1, -2) @ (inverse @ residual))[..., 0]
    whitened = inverse @ scatter @ inverse.transpose(-1, -2)
    g_tril = torch.tril(inverse.transpose(-1, -2) @ (whitened - total[:, None, None] * eye))
    return g_loc, g_tril


def _student_t_score(components: StudentTComponents, data: Any, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = torch.as_tensor(data).to(components.dtype)
    df, loc, scale = components.df.detach(), components.loc.detach(), components.scale.detach()
    d = x.shape[1]
    diff = x[:, None, :] - loc  # (N, M, D)
    variance = scale.square()
    delta = (diff.square() / variance).sum(-1)  # (N, M)
    ratio = delta / df
    weighted = r * (df + d) / (df + delta)  # r u
    total = r.sum(0)
    g_loc = (weighted[..., None] * diff).sum(0) / variance
    g_scale = (-total[:, None] + (weighted[..., None] * diff.square()).sum(0) / variance) / scale
    constant = torch.digamma((df + d) / 2) - torch.digamma(df / 2) - d / df
    g_df = 0.5 * (total * constant + (weighted * ratio - r * torch.log1p(ratio)).sum(0))
    return g_df, g_loc, g_scale


#: the families with a closed-form score: their parameters (attributes of the components) and the score
_SCORES: dict[type, tuple[tuple[str, ...], Score]] = {
    DiagGaussian: (("loc", "scale"), _diag_gaussian_score),
    FullGaussian: (("loc", "scale_tril"), _full_gaussian_score),
    StudentTComponents: (("df", "loc", "scale"), _student_t_score),
}


#: ``(components, data, log_weights (C, K)) -> (value (C,), the gradients of value[c] with respect to log_weights
#: and to the family's parameters, a row per component)``, from a compiled kernel
Fused = Callable[[Any, Any, torch.Tensor], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]


def _array(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().numpy())


def _tensors(arrays: tuple[np.ndarray, ...], like: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """The kernel's outputs as tensors of ``like``'s dtype, the parameters' gradients ``(C, K, ...)`` as ``(C K, ...)``
    rows."""
    value, g_log_weights, *parameters = (torch.from_numpy(a).to(like.dtype) for a in arrays)
    return value, g_log_weights, *(g.reshape(rows, *g.shape[2:]) for g in parameters)


def _diag_gaussian_fused(
    components: DiagGaussian, data: Any, log_weights: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    kernel = mixture_kernel.compiled("diag_gaussian_mixture")
    data = as_centred(data, components.dtype, components.device)
    chains, k = log_weights.shape
    loc = (components.loc.detach() - data.shift).reshape(chains, k, -1)
    scale = components.scale.detach().reshape(chains, k, -1)
    arrays = kernel(_array(data.centred), _array(loc), _array(scale), _array(log_weights))
    value, *gradients = _tensors(arrays, log_weights, chains * k)
    return value, tuple(gradients)


def _student_t_fused(
    components: StudentTComponents, data: Any, log_weights: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    kernel = mixture_kernel.compiled("diag_student_t_mixture")
    x = torch.as_tensor(data).to(components.dtype)
    chains, k = log_weights.shape
    df = components.df.detach().reshape(chains, k)
    loc, scale = (p.detach().reshape(chains, k, -1) for p in (components.loc, components.scale))
    arrays = kernel(_array(x), _array(df), _array(loc), _array(scale), _array(log_weights))
    value, total, g_loc, g_scale, df_sum = _tensors(arrays, log_weights, chains * k)
    d = x.shape[1]
    df = df.reshape(-1)
    constant = torch.digamma((df + d) / 2) - torch.digamma(df / 2) - d / df
    g_df = 0.5 * (total.reshape(-1) * constant + df_sum.reshape(-1))
    return value, (total, g_df, g_loc, g_scale)


#: the families with a compiled kernel (:mod:`ppmix.engines.mixture_kernel`) and its kernel's name
_FUSED: dict[type, tuple[str, Fused]] = {
    DiagGaussian: ("diag_gaussian_mixture", _diag_gaussian_fused),
    StudentTComponents: ("diag_student_t_mixture", _student_t_fused),
}


def _fused(components: Any) -> Fused | None:
    """The compiled value and gradient of ``components``' mixture where there is one: a family of :data:`_FUSED` on
    the CPU with numba installed."""
    entry = _FUSED.get(type(components))
    if entry is None or components.device.type != "cpu" or mixture_kernel.compiled(entry[0]) is None:
        return None
    return entry[1]


def fused_mixture_log_likelihood(
    components: Any, data: Any, log_weights: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
    """``sum_n log sum_k w_ck p(x_n | theta_ck)`` per chain ``(C,)`` and its gradients, without autograd, from the
    compiled kernel (module notes): ``{"log_weights": (C, K), parameter name: a row per component}``; None where the
    family has no kernel here (:func:`mixture_log_likelihood` then differentiates by autograd)."""
    fused = _fused(components)
    if fused is None:
        return None
    value, (g_log_weights, *gradients) = fused(components, data, log_weights.detach())
    names = _SCORES[type(components)][0]
    return value, {"log_weights": g_log_weights, **dict(zip(names, gradients))}


def hmm_fusable(components: Any) -> bool:
    """Whether :func:`fused_hmm_log_likelihood` computes an HMM with these emission components: diagonal Gaussians on
    the CPU, numba installed (the compiled kernel)."""
    return type(components) is DiagGaussian and components.device.type == "cpu" and hmm_chains._kernel() is not None


def fused_hmm_log_likelihood(
    components: Any, data: Any, log_init: torch.Tensor, log_trans: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
    """``sum_b log p(x_b)`` per chain ``(C,)`` of an HMM whose emissions are ``components`` (chain ``c``'s state ``k``
    at ``c K + k``) and its gradients, without autograd
    (:func:`~ppmix.engines.hmm_chains.gaussian_chains_log_likelihood` on the rows centred as the family centres them):
    ``{"log_init": (C, K), "log_trans": (C, K, K), parameter name: a row per component}``; None where
    :func:`hmm_fusable` does not hold or the kernel's rescaling leaves its safe range (the caller then differentiates
    by autograd)."""
    if not hmm_fusable(components):
        return None
    data = as_centred(data, components.dtype, components.device)
    chains, k = log_init.shape
    loc = (components.loc.detach() - data.shift).reshape(chains, k, -1)
    scale = components.scale.detach().reshape(chains, k, -1)
    fused = hmm_chains.gaussian_chains_log_likelihood(
        log_init.detach(), log_trans.detach(), data.centred, loc, scale, lengths
    )
    if fused is None:
        return None
    gradients = {"log_init": fused.log_init, "log_trans": fused.log_trans}
    gradients.update(loc=fused.loc.reshape(chains * k, -1), scale=fused.scale.reshape(chains * k, -1))
    return fused.value, gradients


class _FusedMixtureLogLikelihood(torch.autograd.Function):
    """``L_c`` per chain and its gradient from one compiled pass (:func:`_fused`); the backward pass scales each
    chain's gradient by the incoming one."""

    @staticmethod
    def forward(ctx: Any, log_weights, components, data, fused, *parameters):  # type: ignore[override]
        value, ctx.gradients = fused(components, data, log_weights.detach())
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        chains = grad.shape[0]
        scaled = [(g.reshape(chains, -1) * grad[:, None]).reshape(g.shape) for g in ctx.gradients]
        return (scaled[0], None, None, None, *scaled[1:])


class _MixtureLogLikelihood(torch.autograd.Function):
    """``L_c`` per chain; its backward pass the responsibilities times the closed-form score (module notes)."""

    @staticmethod
    def forward(ctx: Any, log_weights, components, data, score, *parameters):  # type: ignore[override]
        chains, k = log_weights.shape
        with torch.no_grad():
            joint = components.log_prob(data).reshape(-1, chains, k) + log_weights
            top = joint.amax(-1, keepdim=True)
            shifted = joint.sub_(top).exp_()  # one exponential for the value and the responsibilities
            total = shifted.sum(-1, keepdim=True)
            ctx.responsibilities = shifted.div_(total)
        ctx.components, ctx.data, ctx.score = components, data, score
        return (top + total.log()).sum((0, 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        r = ctx.responsibilities.mul_(grad[:, None])  # the forward's tensor, used once
        scores = ctx.score(ctx.components, ctx.data, r.reshape(r.shape[0], -1))
        return (r.sum(0), None, None, None, *scores)


class _ComponentLogProb(torch.autograd.Function):
    """The components' ``log_prob`` ``(N, M)``; its backward pass the closed-form score weighted by the incoming
    gradient (an HMM's state posteriors)."""

    @staticmethod
    def forward(ctx: Any, components, data, score, *parameters):  # type: ignore[override]
        ctx.components, ctx.data, ctx.score = components, data, score
        with torch.no_grad():
            return components.log_prob(data)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        return (None, None, None, *ctx.score(ctx.components, ctx.data, grad))


def component_log_prob(components: Any, data: Any) -> torch.Tensor:
    """``components.log_prob(data)`` ``(N, M)``, its gradient in closed form where the family has one (module notes),
    else by autograd.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components.gaussian_diag import DiagGaussian
    >>> loc = torch.tensor([[-1.0], [1.0]], dtype=torch.float64, requires_grad=True)
    >>> components = DiagGaussian(loc, torch.ones(2, 1, dtype=torch.float64))
    >>> x = torch.tensor([[0.5], [-0.3], [1.7]], dtype=torch.float64)
    >>> (g,) = torch.autograd.grad(component_log_prob(components, x).sum(), loc)
    >>> (e,) = torch.autograd.grad(components.log_prob(x).sum(), loc)
    >>> bool(torch.allclose(g, e))
    True
    """
    family = _SCORES.get(type(components))
    if family is None:
        return components.log_prob(data)
    names, score = family
    return _ComponentLogProb.apply(components, data, score, *(getattr(components, name) for name in names))


def mixture_log_likelihood(components: Any, data: Any, log_weights: torch.Tensor) -> torch.Tensor | None:
    """``sum_n log sum_k w_ck p(x_n | theta_ck)`` per chain ``(C,)``, with its gradient in closed form (module notes),
    or None for a family without one.

    Parameters
    ----------
    components : ComponentFamily
        Every chain's components as one set of ``C K`` (chain ``c``'s component ``k`` at ``c K + k``), its
        parameters in the autograd graph of the sites.
    data : object
        The rows as the family prepared them.
    log_weights : Tensor
        ``(C, K)`` log mixture weights.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components.gaussian_diag import DiagGaussian
    >>> loc = torch.tensor([[-1.0], [1.0], [0.0], [2.0]], dtype=torch.float64, requires_grad=True)  # 2 chains, K = 2
    >>> components = DiagGaussian(loc, torch.ones(4, 1, dtype=torch.float64))
    >>> x = torch.tensor([[0.5], [-0.3], [1.7]], dtype=torch.float64)
    >>> log_weights = torch.full((2, 2), 0.5, dtype=torch.float64).log()
    >>> value = mixture_log_likelihood(components, x, log_weights)
    >>> exact = torch.logsumexp(components.log_prob(x).reshape(3, 2, 2) + log_weights, -1).sum(0)
    >>> bool(torch.allclose(value, exact))
    True
    >>> (g,) = torch.autograd.grad(value.sum(), loc)
    >>> (e,) = torch.autograd.grad(exact.sum(), loc)
    >>> bool(torch.allclose(g, e))
    True
    """
    family = _SCORES.get(type(components))
    if family is None:
        return None
    names, score = family
    parameters = [getattr(components, name) for name in names]
    fused = _fused(components)
    if fused is not None:
        return _FusedMixtureLogLikelihood.apply(log_weights, components, data, fused, *parameters)
    return _MixtureLogLikelihood.apply(log_weights, components, data, score, *parameters)
