"""Closed-form log-densities of the prior families ppmix's programs use, for NUTS's potential.

A torch distribution's ``log_prob`` re-validates its argument and recomputes its normalising constant (``lgamma`` of
its parameters) at every call; at every leapfrog step of a small mixture that is about half of the potential. Here
the constant is computed once and the density is a few element-wise operations of the value, for the families of
:meth:`~ppmix.models.base.MixtureModel.bayesian`'s priors: ``Normal``, ``Gamma``, ``Beta``, ``Dirichlet``,
``LKJCholesky``, and any of them pushed through power and exponential maps (``InverseGamma``, the square root of an
inverse gamma, ``LogNormal``), each ``Independent`` or not. Every density is tested equal to the distribution's own
``log_prob`` (``tests/inference/test_nuts_priors.py``); :func:`closed_form` returns None for any other distribution
(the potential then calls its ``log_prob``).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.distributions import (
    Beta,
    Dirichlet,
    ExpTransform,
    Gamma,
    Independent,
    LKJCholesky,
    Normal,
    PowerTransform,
    TransformedDistribution,
)

__all__ = ["closed_form", "closed_form_derivative"]

#: a log-density of values with any leading batch dimensions, element-wise over the distribution's batch shape (and
#: summed over a Dirichlet's or LKJ's own event dimensions)
LogDensity = Callable[[torch.Tensor], torch.Tensor]

#: a univariate log-density and its derivative with respect to the value, element-wise
LogDensityDerivative = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _normal(prior: Normal) -> LogDensity:
    loc, scale = prior.loc, prior.scale
    const = -scale.log() - 0.5 * math.log(2 * math.pi)
    return lambda x: const - 0.5 * ((x - loc) / scale) ** 2


def _gamma(prior: Gamma) -> LogDensity:
    a, b = prior.concentration, prior.rate
    const = a * b.log() - torch.lgamma(a)
    return lambda x: const + (a - 1) * x.log() - b * x


def _beta(prior: Beta) -> LogDensity:
    a, b = prior.concentration1, prior.concentration0
    const = torch.lgamma(a + b) - torch.lgamma(a) - torch.lgamma(b)
    return lambda x: const + (a - 1) * x.log() + (b - 1) * torch.log1p(-x)


def _dirichlet(prior: Dirichlet) -> LogDensity:
    alpha = prior.concentration
    const = torch.lgamma(alpha.sum(-1)) - torch.lgamma(alpha).sum(-1)
    return lambda x: const + ((alpha - 1) * x.log()).sum(-1)


def _lkj_cholesky(prior: LKJCholesky) -> LogDensity:
    """``log p(L) = c + sum_{i >= 1} (D - i - 1 + 2 (eta - 1)) log L_ii`` (rows from 0); ``c`` is the density at the
    identity, where every logarithm vanishes."""
    dim = prior.dim
    eye = torch.eye(dim, dtype=prior.concentration.dtype, device=prior.concentration.device)
    const = prior.log_prob(eye.expand(*prior.batch_shape, dim, dim))
    rows = torch.arange(1, dim, dtype=eye.dtype, device=eye.device)
    exponents = 2 * (prior.concentration[..., None] - 1) + dim - 1 - rows
    return lambda x: const + (exponents * torch.diagonal(x, dim1=-2, dim2=-1)[..., 1:].log()).sum(-1)


def _pushed(prior: TransformedDistribution) -> LogDensity | None:
    """A base density pushed through power maps ``y = x^p`` and ``y = exp(x)``: ``log p(y) = log p_base(x) -
    log |dy/dx|`` with ``x`` the inverse image, the maps undone last to first."""
    base = closed_form(prior.base_dist)
    if base is None or not all(isinstance(t, (PowerTransform, ExpTransform)) for t in prior.transforms):
        return None
    # undone last to first; a power map's constants ``1 / p``, ``log |p|`` and ``p - 1`` computed once (None: exp)
    steps = [
        None if isinstance(t, ExpTransform) else (1 / t.exponent, t.exponent.abs().log(), t.exponent - 1)
        for t in reversed(prior.transforms)
    ]

    def log_density(y: torch.Tensor) -> torch.Tensor:
        log_jacobian: torch.Tensor | float = 0.0
        for step in steps:
            if step is None:
                x = y.log()
                log_jacobian = log_jacobian + x  # dy/dx = exp(x) = y
            else:
                inverse, log_abs, minus_one = step
                x = y**inverse
                log_jacobian = log_jacobian + log_abs + minus_one * x.log()  # dy/dx = p x^(p - 1)
            y = x
        return base(y) - log_jacobian

    return log_density


_FAMILIES: dict[type, Callable] = {
    Normal: _normal,
    Gamma: _gamma,
    Beta: _beta,
    Dirichlet: _dirichlet,
    LKJCholesky: _lkj_cholesky,
}


def closed_form(prior: torch.distributions.Distribution) -> LogDensity | None:
    """The log-density of ``prior`` as a function of its value (batch dimensions kept, before any ``Independent``'s
    sum), or None where its family is not one of the module's.

    Examples
    --------
    >>> import torch
    >>> from torch.distributions import Gamma
    >>> prior = Gamma(torch.tensor([2.0, 3.0]), torch.tensor([1.0, 0.5]))
    >>> x = torch.tensor([[0.5, 4.0], [1.5, 2.0]])  # two chains
    >>> bool(torch.allclose(closed_form(prior)(x), prior.log_prob(x)))
    True
    """
    if isinstance(prior, Independent):
        return closed_form(prior.base_dist)
    family = next((build for cls, build in _FAMILIES.items() if isinstance(prior, cls)), None)
    if family is not None:
        return family(prior)
    if isinstance(prior, TransformedDistribution):
        return _pushed(prior)
    return None


def _normal_derivative(prior: Normal) -> LogDensityDerivative:
    loc, precision = prior.loc, prior.scale**-2
    density = _normal(prior)
    return lambda x: (density(x), (loc - x) * precision)


def _gamma_derivative(prior: Gamma) -> LogDensityDerivative:
    a, b = prior.concentration, prior.rate
    const = a * b.log() - torch.lgamma(a)

    def log_density(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return const + (a - 1) * x.log() - b * x, (a - 1) / x - b

    return log_density


def _beta_derivative(prior: Beta) -> LogDensityDerivative:
    a, b = prior.concentration1, prior.concentration0
    density = _beta(prior)
    return lambda x: (density(x), (a - 1) / x - (b - 1) / (1 - x))


def _pushed_derivative(prior: TransformedDistribution) -> LogDensityDerivative | None:
    """:func:`_pushed` with its derivative: each step's inverse image ``x`` of ``y`` and ``dx/dy`` (``1 / y`` for
    ``x = log y``, ``x / (p y)`` for ``x = y^(1/p)``) chained, the log-Jacobians' derivatives (``dx/dy``, ``(p - 1) /
    x dx/dy``) subtracted."""
    base = closed_form_derivative(prior.base_dist)
    if base is None or not all(isinstance(t, (PowerTransform, ExpTransform)) for t in prior.transforms):
        return None
    steps = [
        None if isinstance(t, ExpTransform) else (1 / t.exponent, t.exponent.abs().log(), t.exponent - 1, t.exponent)
        for t in reversed(prior.transforms)
    ]

    def log_density(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_jacobian: torch.Tensor | float = 0.0
        d_log_jacobian: torch.Tensor | float = 0.0
        d_y: torch.Tensor | float = 1.0  # d (current value) / d (the argument)
        for step in steps:
            if step is None:
                x, d_x = y.log(), d_y / y
                log_jacobian, d_log_jacobian = log_jacobian + x, d_log_jacobian + d_x
            else:
                inverse, log_abs, minus_one, exponent = step
                x = y**inverse
                d_x = d_y * x / (exponent * y)
                log_jacobian = log_jacobian + log_abs + minus_one * x.log()
                d_log_jacobian = d_log_jacobian + minus_one / x * d_x
            y, d_y = x, d_x
        value, derivative = base(y)
        return value - log_jacobian, derivative * d_y - d_log_jacobian

    return log_density


_DERIVATIVES: dict[type, Callable] = {Normal: _normal_derivative, Gamma: _gamma_derivative, Beta: _beta_derivative}


def closed_form_derivative(prior: torch.distributions.Distribution) -> LogDensityDerivative | None:
    """The univariate log-density of ``prior`` (as :func:`closed_form`) with its derivative with respect to the
    value, both element-wise in real arithmetic; None for a family without one (a Dirichlet, an LKJ, any other).

    Examples
    --------
    >>> import torch
    >>> from torch.distributions import Gamma
    >>> prior = Gamma(torch.tensor([2.0]), torch.tensor([0.5]))
    >>> value, derivative = closed_form_derivative(prior)(torch.tensor([[2.0]]))  # (a - 1) / x - b at x = 2
    >>> derivative.tolist()
    [[0.0]]
    """
    if isinstance(prior, Independent):
        return closed_form_derivative(prior.base_dist)
    family = next((build for cls, build in _DERIVATIVES.items() if isinstance(prior, cls)), None)
    if family is not None:
        return family(prior)
    if isinstance(prior, TransformedDistribution):
        return _pushed_derivative(prior)
    return None
