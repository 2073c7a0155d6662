"""Bernoulli label components: ``y | k ~ Bernoulli(probs[k])``."""

from __future__ import annotations

import pyro.distributions as dist
import torch

from ppmix.components.base import ParameterBatch
from ppmix.components.centred import padded_counts
from ppmix.components.divergence import register_kl

__all__ = ["BernoulliLabel"]


class BernoulliLabel(ParameterBatch):
    """``K`` Bernoulli distributions for a binary label.

    Parameters
    ----------
    probs : Tensor, shape (K,)
        ``P(y = 1 | k)``.
    eps : float, default 1e-6
        :meth:`fit` keeps probabilities in ``[eps, 1 - eps]`` so log-likelihoods stay finite.

    Examples
    --------
    >>> import torch
    >>> lab = BernoulliLabel(torch.tensor([0.2, 0.9]))
    >>> lab.log_prob(torch.tensor([1.0, 0.0])).exp()
    tensor([[0.2000, 0.9000],
            [0.8000, 0.1000]])
    """

    param_names = ("probs",)

    def __init__(self, probs: torch.Tensor, eps: float = 1e-6) -> None:
        probs = torch.as_tensor(probs)
        if probs.dim() != 1 or (probs < 0).any() or (probs > 1).any():
            raise ValueError("probs must be a 1-D tensor of probabilities in [0, 1]")
        self.probs, self.eps = probs, float(eps)

    def _labels(self, y: torch.Tensor) -> torch.Tensor:
        y = torch.as_tensor(y).to(device=self.device, dtype=self.dtype)
        if y.dim() != 1 or (y < 0).any() or (y > 1).any():
            raise ValueError("y must be a 1-D tensor of labels in [0, 1] (soft labels allowed)")
        return y

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``y log p_k + (1 - y) log(1 - p_k)``, shape ``(N, K)``; ``y`` may be soft."""
        y = self._labels(y)[:, None]
        return torch.xlogy(y, self.probs) + torch.xlogy(1 - y, 1 - self.probs)

    def fit(self, y: torch.Tensor, weights: torch.Tensor) -> "BernoulliLabel":
        """Weighted MLE ``p_k = sum_n w_nk y_n / sum_n w_nk`` (clamped to ``[eps, 1-eps]``)."""
        return self.fit_statistics(self.statistics(y, weights))

    def statistics(self, y: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Total weight ``counts`` and weighted label sum ``positives`` per component (additive across shards)."""
        y = self._labels(y)
        weights = self._check_weights(weights, y.shape[0])
        return {"counts": weights.sum(0), "positives": weights.T @ y}

    def fit_statistics(self, stats: dict[str, torch.Tensor]) -> "BernoulliLabel":
        """The weighted MLE from :meth:`statistics`; with no labelled weight at all the probabilities stay."""
        counts = stats["counts"].to(device=self.device, dtype=self.dtype)
        if float(counts.sum()) > 0:
            positives = stats["positives"].to(device=self.device, dtype=self.dtype)
            self.probs = (positives / padded_counts(counts)).clamp(self.eps, 1 - self.eps)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``Bernoulli(probs[index])``."""
        return dist.Bernoulli(probs=self.probs if index is None else self.probs[index])

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One label per entry of ``index``."""
        u = torch.rand(index.shape, generator=generator, dtype=self.dtype, device=self.device)
        return (u < self.probs[index]).to(self.dtype)


@register_kl(BernoulliLabel, BernoulliLabel)
def _kl_bernoulli_label(p: BernoulliLabel, q: BernoulliLabel) -> torch.Tensor:
    """Pairwise ``KL(Bern(p_k) || Bern(q_l))``, shape ``(K, K')``."""
    a, b = p.probs[:, None], q.probs[None, :]
    return torch.xlogy(a, a) - torch.xlogy(a, b) + torch.xlogy(1 - a, 1 - a) - torch.xlogy(1 - a, 1 - b)
