"""The duration distributions of an explicit-duration HMM (:class:`~ppmix.models.hsmm.HSMM`), each over
``d = 1..D`` (``D = max_duration``), with their EM updates from expected duration counts.

Support convention: a duration is ``d = 1 + X``; ``"poisson"`` has ``X ~ Poisson(rate)`` and
``"negative_binomial"`` ``X ~ NB(shape, prob)`` (``P(X = x) = Gamma(x + shape) / (Gamma(shape) x!) (1 - prob)^shape
prob^x``, mean ``shape prob / (1 - prob)``), both truncated to ``X <= D - 1`` and renormalised, so the table over
``1..D`` sums to one; ``"nonparametric"`` is any probability vector over ``1..D``. The parametric M-step maximises
the truncated log-likelihood of the expected counts by monotone Newton steps (a generalised EM: it never lowers the
objective), from the better of the current parameters and the counts' moment estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ppmix.algorithms.ascent import newton_ascent

__all__ = ["DURATIONS", "DurationFamily", "completed_counts", "duration_family"]

#: added to every count of a nonparametric table, so a duration never seen keeps a tiny probability
_EPS = 1e-10


def completed_counts(durations: torch.Tensor, censored: torch.Tensor, log_table: torch.Tensor) -> torch.Tensor:
    """Expected counts of every whole duration ``(K, D)``: the complete segments' ``durations`` plus each censored
    last segment (seen ``d`` steps, ``censored[k, d - 1]``) spread over ``d' >= d`` by ``p_k(d') / P_k(>= d)``,
    its posterior under the current table (``log_table``), which makes the duration M-step exact EM.

    Examples
    --------
    >>> table = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)
    >>> completed_counts(torch.zeros(1, 3).double(), torch.tensor([[0.0, 1.0, 0.0]]).double(), table.log()).tolist()
    [[0.0, 0.5, 0.5]]
    """
    log_survival = torch.logcumsumexp(log_table.flip(-1), -1).flip(-1)
    spread = (censored * (-log_survival).exp()).cumsum(-1)
    return durations + log_table.exp() * spread


@dataclass(frozen=True)
class DurationFamily:
    """A duration distribution over ``1..D`` for ``K`` states: its parameters (named tensors ``(K,)`` or ``(K, D)``),
    their log table ``(K, D)``, their free count, a start and the EM update from expected counts ``(K, D)``."""

    name: str
    names: tuple[str, ...]
    #: theta ``(K, M)`` and ``x = d - 1`` ``(D,)`` -> unnormalised log pmf ``(K, D)``; None: nonparametric
    log_pmf: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: named parameters -> theta, and back
    to_theta: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None
    from_theta: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None
    #: (mean, variance) of ``x = d - 1`` ``(K,)`` -> theta
    moments: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def n_parameters(self, k: int, depth: int) -> int:
        """Free parameters of ``k`` states' durations over ``1..depth``."""
        return k * (depth - 1) if self.log_pmf is None else k * len(self.names)

    def log_table(self, params: dict[str, torch.Tensor], depth: int) -> torch.Tensor:
        """``log p_k(d)`` at ``[k, d - 1]``, ``(K, depth)``."""
        if self.log_pmf is None:
            return params["duration"].log()
        return self._normalised(self.to_theta(params), depth)

    def _normalised(self, theta: torch.Tensor, depth: int) -> torch.Tensor:
        x = torch.arange(depth, dtype=theta.dtype, device=theta.device)
        values = self.log_pmf(theta, x)
        return values - torch.logsumexp(values, -1, keepdim=True)

    def start(self, counts: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameters from first, hard counts ``(K, D)``: the smoothed frequencies, or the moment estimate."""
        if self.log_pmf is None:
            smoothed = counts + 1.0 / counts.shape[-1]
            return {"duration": smoothed / smoothed.sum(-1, keepdim=True)}
        return self.from_theta(self._moment_theta(counts))

    def update(self, counts: torch.Tensor, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The M-step from expected counts ``(K, D)``: frequencies, or monotone Newton ascent of the truncated
        log-likelihood from the better of ``params`` and the moment estimate."""
        if self.log_pmf is None:
            padded = counts + _EPS
            return {"duration": padded / padded.sum(-1, keepdim=True)}
        depth = counts.shape[-1]

        def values(theta: torch.Tensor) -> torch.Tensor:
            return (counts * self._normalised(theta, depth)).sum(-1)

        current, moment = self.to_theta(params), self._moment_theta(counts)
        start = torch.where((values(moment) > values(current))[:, None], moment, current)
        ascent = newton_ascent(values, _autograd_derivatives(values), start, project=_bounded, max_steps=8)
        return self.from_theta(ascent)

    def _moment_theta(self, counts: torch.Tensor) -> torch.Tensor:
        x = torch.arange(counts.shape[-1], dtype=counts.dtype, device=counts.device)
        total = counts.sum(-1).clamp_min(torch.finfo(counts.dtype).tiny)
        mean = (counts * x).sum(-1) / total
        variance = (counts * (x - mean[:, None]).square()).sum(-1) / total
        return self.moments(mean.clamp_min(1e-3), variance)


def _autograd_derivatives(values: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """Gradients ``(B, M)`` and Hessians ``(B, M, M)`` of independent objectives ``values (B,)`` by autograd."""

    def derivatives(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            point = theta.detach().requires_grad_(True)
            (gradient,) = torch.autograd.grad(values(point).sum(), point, create_graph=True)
            rows = [
                torch.autograd.grad(gradient[:, m].sum(), point, retain_graph=True)[0] for m in range(point.shape[1])
            ]
        return gradient.detach(), torch.stack(rows, 1).detach()

    return derivatives


def _bounded(theta: torch.Tensor) -> torch.Tensor:
    """Log parameters within ``[-30, 15]`` (rates and shapes up to about 3e6): an under-dispersed negative
    binomial's shape runs off to infinity (its limit, the Poisson), where ``lgamma`` differences lose precision."""
    return theta.clamp(-30.0, 15.0)


def _poisson_log_pmf(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x * theta - theta.exp() - torch.lgamma(x + 1)


def _negative_binomial_log_pmf(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    shape, logit = theta[:, :1].exp(), theta[:, 1:]
    return (
        torch.lgamma(x + shape)
        - torch.lgamma(shape)
        - torch.lgamma(x + 1)
        + shape * torch.nn.functional.logsigmoid(-logit)
        + x * torch.nn.functional.logsigmoid(logit)
    )


def _negative_binomial_moments(mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """Shape ``m^2 / (v - m)`` where the counts are over-dispersed (else a near-Poisson shape of 100 m), prob
    ``m / (shape + m)``."""
    shape = torch.where(variance > mean * 1.01, mean.square() / (variance - mean).clamp_min(1e-12), 100.0 * mean)
    prob = mean / (shape + mean)
    return torch.stack([shape.log(), torch.logit(prob)], -1)


DURATIONS: dict[str, DurationFamily] = {
    "poisson": DurationFamily(
        "poisson",
        ("duration_rate",),
        _poisson_log_pmf,
        lambda p: p["duration_rate"].log()[:, None],
        lambda theta: {"duration_rate": theta[:, 0].exp()},
        lambda mean, variance: mean.log()[:, None],
    ),
    "negative_binomial": DurationFamily(
        "negative_binomial",
        ("duration_shape", "duration_prob"),
        _negative_binomial_log_pmf,
        lambda p: torch.stack([p["duration_shape"].log(), torch.logit(p["duration_prob"])], -1),
        lambda theta: {"duration_shape": theta[:, 0].exp(), "duration_prob": torch.sigmoid(theta[:, 1])},
        _negative_binomial_moments,
    ),
    "nonparametric": DurationFamily("nonparametric", ("duration",)),
}


def duration_family(name: object) -> DurationFamily:
    """The duration distribution ``name`` (:data:`DURATIONS`), or a ``ValueError`` naming ``duration``.

    Examples
    --------
    >>> duration_family("gamma")
    Traceback (most recent call last):
    ...
    ValueError: duration must be one of ['negative_binomial', 'nonparametric', 'poisson']; got 'gamma'
    """
    if not isinstance(name, str) or name not in DURATIONS:
        raise ValueError(f"duration must be one of {sorted(DURATIONS)}; got {name!r}")
    return DURATIONS[name]
