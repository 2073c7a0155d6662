"""A global site's prior log-density plus the log-Jacobian of its map from the unconstrained space, with its gradient
in the unconstrained coordinates, without an autograd graph.

NUTS's potential holds, for every site ``s``, ``h_s(u) = log p_s(T_s(u)) + log |dT_s / du|``. Through autograd its
gradient costs a backward pass over some twenty small operations per site, at every leapfrog step: on a small mixture
more than its likelihood. Two cases cover the sites of ppmix's mixtures; :func:`site_gradient` returns None for any
other (the potential then differentiates the site by autograd):

* **element-wise** sites: ``T`` acts on each coordinate alone (exponential and affine maps, composed, as
  ``biject_to`` builds them for ``positive``, ``greater_than`` and ``real`` supports) and the prior is a product of
  univariate densities with a closed form (:func:`~ppmix.engines.nuts_priors.closed_form`). Each coordinate's
  derivative is then the complex-step derivative ``h'(u) = Im h(u + i e) / e`` (Squire & Trapp 1998): exact to
  rounding for an analytic ``h`` (no difference is taken), one complex evaluation for every coordinate at once. The
  construction checks it against autograd at two points and declines a site where it differs (an operation that is
  not analytic, such as ``abs``). Where the map is ``a + b exp(u)`` or ``a + b u`` (``positive``, ``greater_than``,
  ``real``), the map, its derivative and its log-Jacobian are computed in closed form and the prior's derivative at
  ``T(u)`` comes from :func:`~ppmix.engines.nuts_priors.closed_form_derivative` (real arithmetic), or by the complex
  step where the family has none, chained by ``T'(u)``;
* a **Dirichlet** prior on the simplex under the stick-breaking map ``y = SB(u)`` (torch's
  ``StickBreakingTransform``: ``z_i = sigmoid(u_i - log(K - 1 - i))``, ``y_i = z_i prod_{j<i} (1 - z_j)``). The
  stick-breaking fractions of a ``Dirichlet(alpha)`` are independent, ``z_i ~ Beta(alpha_i, beta_i)`` with ``beta_i =
  sum_{j>i} alpha_j``, and ``dz_i / du_i = z_i (1 - z_i)``, so

      h(u) = sum_i [log B(alpha_i, beta_i)^{-1} + alpha_i log z_i + beta_i log(1 - z_i)],
      dh / du_i = alpha_i - (alpha_i + beta_i) z_i.

Both are tested equal to autograd's gradient of the site's density (``tests/inference/test_potential.py`` compares
the potential and its gradient with Pyro's traced program).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.distributions import Dirichlet, Independent
from torch.distributions.transforms import (
    AffineTransform,
    ComposeTransform,
    ExpTransform,
    IndependentTransform,
    StickBreakingTransform,
    Transform,
)

from ppmix.engines.nuts_priors import closed_form, closed_form_derivative

__all__ = ["COMPLEX_STEP", "SiteGradient", "site_gradient"]

#: ``u (C, *shape) -> (h (C,), dh/du (C, *shape), T(u), dT/du)``: a site's log prior plus log-Jacobian per chain, its
#: gradient, the site's value and, for an element-wise map, its derivative ``(C, *shape)`` (None for the simplex)
SiteGradient = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]

#: the imaginary step of the complex-step derivative (its error is of order ``COMPLEX_STEP^2``: none in float64)
COMPLEX_STEP = 1e-20

_ELEMENTWISE = (ExpTransform, AffineTransform)


def _elementwise_transform(transform: Transform) -> Transform | None:
    """The element-wise map underneath ``transform`` (``IndependentTransform`` only sums its log-Jacobian over event
    dimensions), or None if it mixes coordinates."""
    if isinstance(transform, IndependentTransform):
        return _elementwise_transform(transform.base_transform)
    if isinstance(transform, ComposeTransform):
        return transform if all(_elementwise_transform(part) is not None for part in transform.parts) else None
    if isinstance(transform, _ELEMENTWISE) and transform.domain.event_dim == 0:
        return transform
    return None


def _univariate(prior: torch.distributions.Distribution) -> torch.distributions.Distribution:
    return _univariate(prior.base_dist) if isinstance(prior, Independent) else prior


def _elementwise(prior: torch.distributions.Distribution, transform: Transform) -> SiteGradient | None:
    """The complex-step gradient of an element-wise site (module notes), or None where the site is not one."""
    base = _elementwise_transform(transform)
    density = closed_form(prior)
    if base is None or density is None or _univariate(prior).event_shape != ():
        return None

    affine = _exp_affine(base)
    if affine is not None:
        return _exp_affine_site(closed_form_derivative(prior) or _complex_step(density), *affine)

    def value_and_gradient(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        shifted = torch.complex(u, torch.full_like(u, COMPLEX_STEP))
        value = base(shifted)
        h = density(value) + base.log_abs_det_jacobian(shifted, value)
        return h.real.reshape(u.shape[0], -1).sum(-1), h.imag / COMPLEX_STEP, value.real, value.imag / COMPLEX_STEP

    return value_and_gradient


def _parts(transform: Transform) -> list[Transform]:
    """``transform``'s element-wise maps in the order they apply (compositions flattened)."""
    if isinstance(transform, ComposeTransform):
        return [part for inner in transform.parts for part in _parts(inner)]
    return [transform]


def _exp_affine(transform: Transform) -> tuple[bool, Any, Any] | None:
    """``(exponential, a, b)`` where the element-wise ``transform`` is ``T(u) = a + b exp(u)`` (``exponential``) or
    ``a + b u``: at most one exponential map, first, then affine maps (as ``biject_to`` builds them for ``real``,
    ``positive`` and ``greater_than``); None for any other composition."""
    parts = _parts(transform)
    exponential = bool(parts) and isinstance(parts[0], ExpTransform)
    a: Any = 0.0
    b: Any = 1.0
    for part in parts[int(exponential) :]:
        if not isinstance(part, AffineTransform):
            return None
        a, b = part.loc + part.scale * a, part.scale * b
    return exponential, a, b


def _complex_step(density: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``x -> (density(x), density'(x))`` by the complex step (module notes), for a prior without a closed-form
    derivative (:func:`~ppmix.engines.nuts_priors.closed_form_derivative`)."""

    def value_and_derivative(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stepped = density(torch.complex(x, torch.full_like(x, COMPLEX_STEP)))
        return stepped.real, stepped.imag / COMPLEX_STEP

    return value_and_derivative


def _exp_affine_site(density: Callable, exponential: bool, a: Any, b: Any) -> SiteGradient:
    """The value and gradient of a site under ``T(u) = a + b exp(u)`` (or ``a + b u``): the map, its derivative and
    its log-Jacobian ``log |b| + u`` (or ``log |b|``) in closed form, the prior's value and derivative at ``T(u)``
    from ``density`` (``x -> (log p(x), d log p / dx)``), chained by ``T'(u)``: no complex arithmetic through the
    map, and none at all where the prior's derivative has a closed form."""
    log_b = torch.as_tensor(b).abs().log()

    def value_and_gradient(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        grown = u.exp() if exponential else u
        value = a + b * grown
        derivative = (b * grown).expand_as(u) if exponential else torch.as_tensor(b, dtype=u.dtype).expand_as(u)
        log_prior, d_log_prior = density(value)
        if exponential:
            return (
                (log_prior + log_b + u).reshape(u.shape[0], -1).sum(-1),
                d_log_prior * derivative + 1.0,
                value,
                derivative,
            )
        return (log_prior + log_b).reshape(u.shape[0], -1).sum(-1), d_log_prior * derivative, value, derivative

    return value_and_gradient


def _stick_breaking_dirichlet(prior: torch.distributions.Distribution, transform: Transform) -> SiteGradient | None:
    """The Beta-product form of a Dirichlet under the stick-breaking map (module notes), or None where the site is
    not one."""
    if not (isinstance(prior, Dirichlet) and isinstance(transform, StickBreakingTransform)):
        return None
    alpha = prior.concentration[..., :-1]
    beta = prior.concentration.flip(-1).cumsum(-1).flip(-1)[..., 1:]  # sum_{j>i} alpha_j
    const = (torch.lgamma(alpha + beta) - torch.lgamma(alpha) - torch.lgamma(beta)).sum(-1)
    k = prior.concentration.shape[-1]
    offset = torch.arange(k - 1, 0, -1, dtype=alpha.dtype, device=alpha.device).log()

    def value_and_gradient(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x = u - offset
        log_z, log_rest = -F.softplus(-x), -F.softplus(x)  # log z, log (1 - z)
        h = const + (alpha * log_z + beta * log_rest).sum(-1)
        grad = alpha - (alpha + beta) * log_z.exp()
        return h.reshape(u.shape[0], -1).sum(-1), grad, transform(u), None

    return value_and_gradient


def _agrees(prior: torch.distributions.Distribution, transform: Transform, gradient: SiteGradient, opts: dict) -> bool:
    """Whether ``gradient`` gives the site's density and autograd's gradient at two points of its unconstrained
    space (a chain axis in front), to ``1e-10`` relative."""
    shape = (2, *transform.inverse_shape(prior.batch_shape + prior.event_shape))
    u = torch.linspace(-1.3, 0.9, math.prod(shape), **opts).reshape(shape)
    try:
        with torch.enable_grad():
            leaf = u.clone().requires_grad_()
            value = transform(leaf)
            log_jacobian = transform.log_abs_det_jacobian(leaf, value).reshape(2, -1).sum(-1)
            density = closed_form(prior) or prior.log_prob  # as the potential computes it by autograd
            expected = density(value).reshape(2, -1).sum(-1) + log_jacobian
            (expected_grad,) = torch.autograd.grad(expected.sum(), leaf)
        h, grad, value, derivative = gradient(u)
        if derivative is not None:  # an element-wise map: its derivative as autograd gives it
            (expected_derivative,) = torch.autograd.grad(transform(leaf).sum(), leaf)
            grad = torch.cat([grad, derivative])
            expected_grad = torch.cat([expected_grad, expected_derivative])
        if not torch.allclose(value, transform(u), rtol=1e-12, atol=1e-12):
            return False
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    return bool(
        torch.allclose(h, expected.detach(), rtol=1e-10, atol=1e-10)
        and torch.allclose(grad, expected_grad, rtol=1e-10, atol=1e-10)
    )


def site_gradient(prior: torch.distributions.Distribution, transform: Transform, opts: dict) -> SiteGradient | None:
    """``u -> (h(u), dh/du)`` for a site with prior ``prior`` under ``transform`` (module notes), every chain at once,
    or None where neither case applies or its check against autograd fails (``opts``: the dtype and device of the
    check's points).

    Examples
    --------
    >>> import torch
    >>> from torch.distributions import Gamma, biject_to
    >>> prior = Gamma(torch.tensor([2.0, 3.0], dtype=torch.float64), torch.tensor([1.0, 0.5], dtype=torch.float64))
    >>> fn = site_gradient(prior, biject_to(prior.support), {"dtype": torch.float64})
    >>> h, grad, theta, derivative = fn(torch.zeros(1, 2, dtype=torch.float64))  # theta = exp(0) = 1, dh/du = a - b
    >>> bool(torch.allclose(h, prior.log_prob(torch.ones(2, dtype=torch.float64)).sum())), grad.tolist()
    (True, [[1.0, 2.5]])
    """
    for build in (_elementwise, _stick_breaking_dirichlet):
        gradient = build(prior, transform)
        if gradient is not None:
            return gradient if _agrees(prior, transform, gradient, opts) else None
    return None
