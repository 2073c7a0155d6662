"""Sufficient statistics of weighted Gaussian fits that merge exactly across shards.

A Gaussian family's M-step needs, per component, the total weight, the weighted mean and
the weighted scatter about that mean. Each shard computes them on its own rows (accurately:
about its own means, see :mod:`ppmix.components.centred`); two sets of statistics merge by
the parallel update of Chan, Golub and LeVeque (1979), which is exact in exact arithmetic and
keeps its accuracy in floating point. So one M-step from merged statistics is the M-step on
all rows at once, whatever the number and order of the shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppmix.components.family import Statistics

__all__ = ["GaussianStatistics"]


@dataclass(frozen=True)
class GaussianStatistics(Statistics):
    """Per component: total weight ``counts`` ``(K,)``, weighted ``mean`` ``(K, D)`` and ``scatter``
    ``sum_n w_nk (x_n - mean_k)^2`` (``(K, D)``, diagonal) or its outer products (``(K, D, D)``, full). The tied
    covariance's statistics hold in ``scatter`` each component's ``n_k / n`` share of the pooled scatter (what
    the tied M-step reads is only their sum over ``k``, which merging and scaling keep).

    Examples
    --------
    >>> x = torch.tensor([[0.0], [2.0], [4.0], [10.0]], dtype=torch.float64)
    >>> def stats(rows):
    ...     mean = rows.mean(0, keepdim=True)
    ...     return GaussianStatistics(torch.tensor([float(len(rows))]), mean, ((rows - mean) ** 2).sum(0, keepdim=True))
    >>> both = stats(x[:1]).merge(stats(x[1:]))
    >>> both.counts.item(), both.mean.item(), both.scatter.item() / 4, x.var(unbiased=False).item()
    (4.0, 4.0, 14.0, 14.0)
    """

    counts: torch.Tensor
    mean: torch.Tensor
    scatter: torch.Tensor

    def merge(self, other: "GaussianStatistics") -> "GaussianStatistics":
        """The statistics of the union of both sets of rows (Chan et al.'s parallel update)."""
        if getattr(other, "absorbs_family_statistics", False):  # per-feature statistics of rows with missing entries
            return other.merge(self)
        total = self.counts + other.counts
        share = torch.where(total > 0, other.counts / torch.where(total > 0, total, 1.0), 0.5)  # (K,)
        delta = other.mean - self.mean
        mean = self.mean + share[:, None] * delta
        cross = self.counts * share  # n_a n_b / (n_a + n_b)
        if self.scatter.dim() == 2:
            between = cross[:, None] * delta.square()
        else:
            between = cross[:, None, None] * delta[:, :, None] * delta[:, None, :]
        return GaussianStatistics(total, mean, self.scatter + other.scatter + between)

    def scaled(self, factor: float) -> "GaussianStatistics":
        """The statistics of the same rows with every weight multiplied by ``factor`` (the mean is unchanged)."""
        return GaussianStatistics(self.counts * factor, self.mean, self.scatter * factor)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "GaussianStatistics":
        """The statistics in ``dtype`` on ``device`` (themselves where they already are)."""
        tensors = (self.counts, self.mean, self.scatter)
        wanted = None if device is None else torch.device(device)
        if all((dtype in (None, t.dtype)) and (wanted in (None, t.device)) for t in tensors):
            return self
        return GaussianStatistics(*(t.to(dtype=dtype, device=device) for t in tensors))
