"""MAP-EM's M-step of full and tied Gaussian components, under the prior of the MCMC program (no second prior).

The prior is :meth:`~ppmix.components.gaussian_family.GaussianFamily.prior`'s: ``locs ~ N(m0, diag(s0^2))``, every
variance ``v_d ~ InverseGamma(a_d, b_d)`` and the correlation's Cholesky factor ``L ~ LKJCholesky(D, eta)``, the
covariance being ``Sigma = diag(sqrt v) L L^T diag(sqrt v)``. MAP-EM finds a mode of the posterior *density of
(locs, v, L)*: the variances' inverse-gamma density (as the diagonal family's closed-form update, not the density of
the program's ``scales = sqrt(v)``, whose mode differs by a Jacobian) and Pyro's LKJCholesky density of ``L`` (the
program's own site). :func:`covariance_log_prior` is that density, which the models' MAP-EM objective adds to the
log-likelihood, so the objective reported is the one the update increases.

There is no closed form: the M-step is generalised EM (GEM). The means given the covariance are exact
(:func:`map_means`); then :func:`map_covariance` raises ``-n/2 log|Sigma| - tr(Sigma^{-1} A) / 2 + log prior(v, L)``
(``A``: the scatter about the new means) by batched Newton steps, started at the current covariance, each step
accepted only where it raises the objective, so MAP-EM never decreases its objective. The steps are taken on the
lower triangle of the Cholesky factor of ``Sigma``, whose gradient and Hessian are a few matrix products (a mode
and a stationary point do not depend on the coordinates that find them; ``torch.func``'s Hessian in the
coordinates of ``biject_to(constraints.corr_cholesky)`` cost about 100 times as much).

Cost: the Newton steps run on all ``M = D (D + 1) / 2`` entries of the factor, with a ``(K, M, D, D)`` array of
directions and an ``M x M`` eigendecomposition per step: fine for a few dozen features (an M-step of five
components took 0.2 s at ``D = 20``, one thread) but growing as ``D^6`` (5 s at ``D = 40``); for many features
prefer ``covariance_type="diag"`` with priors, or the fit without them.
"""

from __future__ import annotations

import torch
from pyro.distributions import InverseGamma, LKJCholesky

from ppmix.algorithms.ascent import newton_ascent

__all__ = ["covariance_log_prior", "map_covariance", "map_means"]


def covariance_log_prior(
    variance: torch.Tensor, corr: torch.Tensor, shape: torch.Tensor, rate: torch.Tensor, concentration: torch.Tensor
) -> torch.Tensor:
    """``sum_d log InverseGamma(v_d | a_d, b_d) + log LKJCholesky(L | D, eta)`` for a batch of covariances: the
    density whose mode MAP-EM takes, ``(B,)`` (no LKJ term for ``D = 1``, whose correlation is 1).

    Parameters
    ----------
    variance : Tensor, shape (B, D)
    corr : Tensor, shape (B, D, D)
        Lower Cholesky factors of the correlations (rows of unit norm).
    shape, rate : Tensor, shape (D,)
        The inverse-gamma prior of every variance.
    concentration : Tensor, scalar
        The LKJ concentration ``eta``.

    Examples
    --------
    >>> f64 = torch.float64
    >>> one = torch.ones(2, dtype=f64)
    >>> round(covariance_log_prior(one[None], torch.eye(2, dtype=f64)[None], one, one, torch.tensor(1.0)).item(), 6)
    -2.693147
    """
    log_prior = InverseGamma(shape, rate, validate_args=False).log_prob(variance).sum(-1)
    d = variance.shape[-1]
    if d > 1:
        log_prior = log_prior + LKJCholesky(d, concentration.to(variance), validate_args=False).log_prob(corr)
    return log_prior


def map_means(
    prior_loc: torch.Tensor,
    prior_scale: torch.Tensor,
    counts: torch.Tensor,
    sample_mean: torch.Tensor,
    scale_tril: torch.Tensor,
) -> torch.Tensor:
    """The means maximising the posterior given the covariances: ``(P0 + n_k Sigma_k^{-1})^{-1} (P0 m0 + n_k
    Sigma_k^{-1} xbar_k)`` with ``P0 = diag(1 / s0^2)``, ``(K, D)`` (an empty component: ``m0``).

    Parameters
    ----------
    prior_loc, prior_scale : Tensor, shape (D,)
        ``m0`` and ``s0``.
    counts : Tensor, shape (K,)
    sample_mean : Tensor, shape (K, D)
        The weighted means ``xbar_k`` (any finite value where ``n_k = 0``).
    scale_tril : Tensor, shape (K, D, D)
        The lower Cholesky factors of the covariances ``Sigma_k``.

    Examples
    --------
    >>> f64 = torch.float64
    >>> map_means(torch.zeros(1, dtype=f64), torch.ones(1, dtype=f64), torch.tensor([3.0], dtype=f64),
    ...           torch.tensor([[4.0]], dtype=f64), torch.ones(1, 1, 1, dtype=f64)).tolist()
    [[3.0]]
    """
    prior_precision = prior_scale.pow(-2)
    scaled_precision = counts[:, None, None] * torch.cholesky_inverse(scale_tril)
    system = scaled_precision + torch.diag_embed(prior_precision).expand_as(scaled_precision)
    target = prior_precision * prior_loc + (scaled_precision @ sample_mean.unsqueeze(-1)).squeeze(-1)
    return torch.linalg.solve(system, target)


def _row_orders(d: int, concentration: torch.Tensor) -> torch.Tensor:
    """The exponents ``c_i`` of ``log LKJCholesky(L) = sum_i c_i log L_ii + const``: ``2 (eta - 1) + D - i`` for the
    rows ``i = 2 .. D`` (Pyro's), 0 for the first (whose ``L_11`` is 1)."""
    rows = torch.arange(1, d + 1, dtype=concentration.dtype, device=concentration.device)
    return torch.where(rows > 1, 2 * (concentration - 1) + d - rows, 0.0)


class _CovarianceObjective:
    """The covariance step's objective ``-n/2 log|Sigma| - tr(Sigma^{-1} A) / 2 + covariance_log_prior(v, L)`` of
    a batch, its gradient and Hessian in the coordinates ``theta``: the lower triangle (diagonal included) of the
    Cholesky factor ``C`` of ``Sigma``, where ``v_i = |C_i|^2`` (row norms) and ``L = diag(v)^{-1/2} C``.

    In these coordinates the derivatives are a few batched matrix products: with ``P = Sigma^{-1}`` and ``Q = P A
    P``, the trace's gradient is ``-2 Q C`` and its derivative along ``E`` is ``-2 Q E + 2 (P dS Q + Q dS P) C``,
    ``dS = E C^T + C E^T``; the prior is a sum over the rows of ``-(a_i + 1 + c_i / 2) log r_i - b_i / r_i + c_i log
    C_ii`` (``r_i = |C_i|^2``) plus a constant."""

    def __init__(
        self,
        scatter: torch.Tensor,
        counts: torch.Tensor,
        shape: torch.Tensor,
        rate: torch.Tensor,
        concentration: torch.Tensor,
    ) -> None:
        d = scatter.shape[-1]
        self.scatter, self.counts, self.shape, self.rate = scatter, counts, shape, rate
        self.concentration = concentration
        self.rows, self.cols = torch.tril_indices(d, d, device=scatter.device)
        self.orders = _row_orders(d, concentration)
        self.diagonal = self.rows == self.cols
        # the directions E_m (one per coordinate) of the Hessian's products
        self.basis = torch.zeros(self.rows.shape[0], d, d, dtype=scatter.dtype, device=scatter.device)
        self.basis[torch.arange(self.rows.shape[0], device=scatter.device), self.rows, self.cols] = 1.0

    def tril(self, theta: torch.Tensor) -> torch.Tensor:
        """``C`` ``(B, D, D)`` from ``theta`` ``(B, M)``."""
        d = self.scatter.shape[-1]
        tril = theta.new_zeros(theta.shape[0], d, d)
        tril[:, self.rows, self.cols] = theta
        return tril

    def value(self, theta: torch.Tensor) -> torch.Tensor:
        """The objective ``(B,)``; ``-inf`` where a diagonal entry of ``C`` is not positive."""
        tril = self.tril(theta)
        diagonal = tril.diagonal(dim1=-2, dim2=-1)
        valid = (diagonal > 0).all(-1)
        tril = torch.where(valid[:, None, None], tril, torch.eye(tril.shape[-1], dtype=tril.dtype, device=tril.device))
        diagonal = tril.diagonal(dim1=-2, dim2=-1)
        precision = torch.cholesky_inverse(tril)
        likelihood = -self.counts * diagonal.log().sum(-1) - 0.5 * (precision * self.scatter).sum((-2, -1))
        variance = tril.square().sum(-1)
        corr = tril / variance.sqrt()[..., None]
        log_prior = covariance_log_prior(variance, corr, self.shape, self.rate, self.concentration)
        return torch.where(valid, likelihood + log_prior, -torch.inf)

    def derivatives(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient ``(B, M)`` and Hessian ``(B, M, M)`` at ``theta``."""
        rows, cols = self.rows, self.cols
        tril = self.tril(theta)
        diagonal = tril.diagonal(dim1=-2, dim2=-1)
        precision = torch.cholesky_inverse(tril)
        whitened = precision @ self.scatter @ precision  # Q
        # the likelihood: -n sum log C_ii - tr(P A) / 2
        gradient = whitened @ tril - torch.diag_embed(self.counts[:, None] / diagonal)
        step = self.basis[None] @ tril.mT[:, None]  # E C^T, (B, M, D, D)
        spread = step + step.mT  # dS
        products = (
            whitened[:, None] @ self.basis[None]
            - (precision[:, None] @ spread @ whitened[:, None] + whitened[:, None] @ spread @ precision[:, None])
            @ tril[:, None]
        )
        hessian = products[:, :, rows, cols]
        hessian = hessian + torch.diag_embed(
            torch.where(self.diagonal, (self.counts[:, None] / diagonal.square())[:, rows], 0.0)
        )
        # the prior, row by row: phi(r) = -(a + 1 + c / 2) log r - b / r, and c log C_ii
        variance = tril.square().sum(-1)  # r_i
        power = self.shape + 1 + 0.5 * self.orders
        slope = -power / variance + self.rate / variance.square()  # phi'(r)
        bend = power / variance.square() - 2 * self.rate / variance.pow(3)  # phi''(r)
        gradient = gradient + 2 * slope[..., None] * tril + torch.diag_embed(self.orders / diagonal)
        same_row = rows[:, None] == rows[None, :]
        entries = tril[:, rows, cols]
        row_bend = bend[:, rows]
        prior_hessian = same_row * (
            4 * row_bend[:, :, None] * entries[:, :, None] * entries[:, None, :] + torch.diag_embed(2 * slope[:, rows])
        )
        prior_hessian = prior_hessian - torch.diag_embed(
            torch.where(self.diagonal, (self.orders / diagonal.square())[:, rows], 0.0)
        )
        hessian = hessian + prior_hessian
        return gradient[:, rows, cols], 0.5 * (hessian + hessian.mT)


def map_covariance(
    scatter: torch.Tensor,
    counts: torch.Tensor,
    scale_tril: torch.Tensor,
    shape: torch.Tensor,
    rate: torch.Tensor,
    concentration: torch.Tensor,
    floor: float | torch.Tensor,
    *,
    max_steps: int = 4,
    tol: float = 1e-12,
) -> torch.Tensor:
    """Raise ``-n_b/2 log|Sigma_b| - tr(Sigma_b^{-1} A_b) / 2 + covariance_log_prior(v_b, L_b)`` for every ``b`` by
    Newton steps from ``Sigma_b = scale_tril_b scale_tril_b^T``, every variance at least ``floor``; returns the new
    Cholesky factors ``(B, D, D)``.

    The steps are :func:`~ppmix.algorithms.ascent.newton_ascent`'s on the lower triangle of the Cholesky factor
    (:class:`_CovarianceObjective`, whose stationary points are the posterior's in any coordinates); a row whose
    variance falls below the floor is scaled up to it (its correlations kept), and a row on the floor that the
    gradient would shrink moves on its sphere only. A GEM M-step need only raise the objective, and EM's next M-step
    starts where this one stopped, so at EM's fixed point the covariances are a stationary point (off the floor).

    Parameters
    ----------
    scatter : Tensor, shape (B, D, D)
        ``A_b``: the weighted scatter about the (new) means.
    counts : Tensor, shape (B,)
    scale_tril : Tensor, shape (B, D, D)
        The start (the current covariances' Cholesky factors).
    shape, rate, concentration, floor
        The prior (:func:`covariance_log_prior`) and the variance floor (a number or ``(D,)``).
    max_steps : int, default 4
        Newton steps at most.
    tol : float, default 1e-12

    Examples
    --------
    With one feature the mode is the inverse-gamma posterior's, ``(2 b + A) / (2 a + 2 + n)``:

    >>> f64 = torch.float64
    >>> one = torch.ones(1, dtype=f64)
    >>> tril = map_covariance(torch.full((1, 1, 1), 9.0, dtype=f64), torch.tensor([5.0], dtype=f64),
    ...                       torch.ones(1, 1, 1, dtype=f64), one, one, torch.tensor(2.0), 1e-6, max_steps=10)
    >>> round(tril.square().item(), 10)
    1.2222222222
    """
    objective = _CovarianceObjective(scatter, counts, shape, rate, concentration.to(scatter))
    d = scatter.shape[-1]
    floor = torch.as_tensor(floor, dtype=scatter.dtype, device=scatter.device).expand(d)
    theta = newton_ascent(
        objective.value,
        objective.derivatives,
        scale_tril[:, objective.rows, objective.cols],
        project=lambda theta: _floored(objective.tril(theta), floor)[:, objective.rows, objective.cols],
        restrict=lambda theta, gradient, curvature: _on_the_floor(objective, theta, gradient, curvature, floor),
        max_steps=max_steps,
        tol=tol,
    )
    return objective.tril(theta)


def _on_the_floor(
    objective: _CovarianceObjective,
    theta: torch.Tensor,
    gradient: torch.Tensor,
    curvature: torch.Tensor,
    floor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient and (negative) Hessian restricted, for every row of ``C`` on the variance floor that the
    gradient would shrink, to the row's sphere ``|C_i|^2 = floor_i`` (its radial direction projected out), so that
    the step keeps the row's variance and moves its correlations only."""
    rows = objective.rows
    entries = objective.tril(theta)
    variance = entries.square().sum(-1)
    radial = (objective.tril(gradient) * entries).sum(-1)
    held = (variance <= floor * (1 + 1e-9)) & (radial < 0)
    if not bool(held.any()):
        return gradient, curvature
    direction = (entries / variance.sqrt()[..., None])[:, rows, objective.cols] * held[:, rows]
    same_row = (rows[:, None] == rows[None, :]).to(theta)
    eye = torch.eye(theta.shape[-1], dtype=theta.dtype, device=theta.device)
    projector = eye - same_row * direction[:, :, None] * direction[:, None, :]
    gradient = (projector @ gradient.unsqueeze(-1)).squeeze(-1)
    return gradient, projector @ curvature @ projector + (eye - projector)


def _floored(tril: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """Cholesky factors whose rows of squared norm (variance) below ``floor`` are scaled up to it."""
    variance = tril.square().sum(-1)
    raise_to = torch.where(variance < floor, (floor / variance).sqrt(), 1.0)
    return tril * raise_to[..., None]
