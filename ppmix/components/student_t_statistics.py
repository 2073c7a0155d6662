"""The E-step statistics of Student-t components (:mod:`ppmix.components.student_t`), in a module of their own so
that the t's rows with missing entries (:mod:`ppmix.components.student_t_missing`) build them too."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppmix.components.family import Statistics
from ppmix.components.gaussian_statistics import GaussianStatistics

__all__ = ["StudentTStatistics"]


@dataclass(frozen=True)
class StudentTStatistics(Statistics):
    """One E-step's statistics of ``K`` t components: per component the total responsibility ``counts``
    ``(K,)``, the ``r u``-weighted rows as :class:`~ppmix.components.gaussian_statistics.GaussianStatistics`
    (``sum r u``, the ``r u``-weighted mean and ``sum r u (x - mean)^2``) and ``log_precision``
    ``sum r (E[log u] - u)`` ``(K,)``. They merge exactly (the weighted rows by Chan et al.'s update)."""

    counts: torch.Tensor
    weighted: GaussianStatistics
    log_precision: torch.Tensor

    def merge(self, other: "StudentTStatistics") -> "StudentTStatistics":
        return StudentTStatistics(
            self.counts + other.counts, self.weighted.merge(other.weighted), self.log_precision + other.log_precision
        )

    def scaled(self, factor: float) -> "StudentTStatistics":
        return StudentTStatistics(self.counts * factor, self.weighted.scaled(factor), self.log_precision * factor)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "StudentTStatistics":
        return StudentTStatistics(
            self.counts.to(dtype=dtype, device=device),
            self.weighted.to(dtype=dtype, device=device),
            self.log_precision.to(dtype=dtype, device=device),
        )
