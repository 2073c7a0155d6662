"""Categorical label components: ``y | k ~ Categorical(probs[k])``."""

from __future__ import annotations

import pyro.distributions as dist
import torch

from ppmix.components.base import ParameterBatch
from ppmix.components.centred import component_counts
from ppmix.components.divergence import register_kl

__all__ = ["CategoricalLabel"]


class CategoricalLabel(ParameterBatch):
    """``K`` categorical distributions over ``C`` classes.

    Parameters
    ----------
    probs : Tensor, shape (K, C)
        Rows are probability vectors.
    eps : float, default 1e-6
        :meth:`fit` floors probabilities at ``eps`` (then renormalises).

    Labels are integer class indices ``(N,)`` or soft/one-hot rows ``(N, C)``.

    Examples
    --------
    >>> import torch
    >>> lab = CategoricalLabel(torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]]))
    >>> lab.log_prob(torch.tensor([2])).exp()
    tensor([[0.0000, 0.7000]])
    """

    param_names = ("probs",)

    def __init__(self, probs: torch.Tensor, eps: float = 1e-6) -> None:
        probs = torch.as_tensor(probs)
        if probs.dim() != 2 or (probs < 0).any():
            raise ValueError("probs must be a (K, C) tensor of non-negative probabilities")
        if not torch.allclose(probs.sum(-1), torch.ones((), dtype=probs.dtype), atol=1e-6):
            raise ValueError("each row of probs must sum to 1")
        self.probs, self.eps = probs, float(eps)

    @property
    def n_classes(self) -> int:
        return int(self.probs.shape[1])

    def _one_hot(self, y: torch.Tensor) -> torch.Tensor:
        y = torch.as_tensor(y, device=self.device)
        if y.dim() == 2:
            if y.shape[1] != self.n_classes or (y < 0).any():
                raise ValueError(f"soft labels y must have shape (N, {self.n_classes}) with non-negative entries")
            return y.to(self.dtype)
        if y.dim() != 1 or y.is_floating_point() and (y != y.round()).any():
            raise ValueError("y must be integer class indices (N,) or soft labels (N, C)")
        y = y.long()
        if (y < 0).any() or (y >= self.n_classes).any():
            raise ValueError(f"y has labels outside 0..{self.n_classes - 1}")
        return torch.nn.functional.one_hot(y, self.n_classes).to(self.dtype)

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``log probs[k, y_n]`` (or its soft-label average), shape ``(N, K)``."""
        return torch.xlogy(self._one_hot(y)[:, None, :], self.probs[None]).sum(-1)

    def fit(self, y: torch.Tensor, weights: torch.Tensor) -> "CategoricalLabel":
        """Weighted MLE ``probs[k] ∝ sum_n w_nk onehot(y_n)`` with an ``eps`` floor."""
        onehot = self._one_hot(y)
        weights = self._check_weights(weights, onehot.shape[0])
        probs = (weights.T @ onehot) / component_counts(weights)[:, None]
        probs = probs.clamp_min(self.eps)
        self.probs = probs / probs.sum(-1, keepdim=True)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        """``Categorical(probs[index])``."""
        return dist.Categorical(probs=self.probs if index is None else self.probs[index])

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One class index per entry of ``index``."""
        flat = torch.multinomial(self.probs[index.reshape(-1)], 1, generator=generator)
        return flat.reshape(index.shape)


@register_kl(CategoricalLabel, CategoricalLabel)
def _kl_categorical_label(p: CategoricalLabel, q: CategoricalLabel) -> torch.Tensor:
    """Pairwise ``KL(probs[k] || q.probs[l])``, shape ``(K, K')``."""
    a, b = p.probs[:, None, :], q.probs[None, :, :]
    return (torch.xlogy(a, a) - torch.xlogy(a, b)).sum(-1)
