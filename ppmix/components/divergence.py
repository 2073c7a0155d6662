"""Closed-form divergences between batches of components, registered by pairs of classes (as
``torch.distributions.kl.register_kl``), so that a family's components carry no divergence of their own.

A family module registers the pairwise ``KL(p_i || q_j)`` of its components with :func:`register_kl`;
:func:`kl_divergence` finds the most specific registered pair for two batches.

Examples
--------
>>> import torch
>>> from ppmix.components.poisson import PoissonComponents
>>> p = PoissonComponents(torch.tensor([[1.0], [2.0]], dtype=torch.float64))
>>> kl_divergence(p, p).diagonal().tolist()
[0.0, 0.0]
"""

from __future__ import annotations

from typing import Callable

import torch

from ppmix.components.base import ParameterBatch

__all__ = ["kl_divergence", "register_kl"]

#: the registered divergences, by (class of p, class of q)
_KL: dict[tuple[type, type], Callable[[ParameterBatch, ParameterBatch], torch.Tensor]] = {}


def register_kl(type_p: type, type_q: type) -> Callable:
    """A decorator registering ``fn(p, q) -> (K, K')``, the pairwise ``KL(p_i || q_j)`` between a batch of
    ``type_p`` and one of ``type_q`` (subclasses included, the most specific pair winning).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonComponents
    >>> class Counts(PoissonComponents):
    ...     pass
    >>> @register_kl(Counts, Counts)
    ... def _zero(p, q):
    ...     return torch.zeros(p.n_components, q.n_components)
    >>> kl_divergence(Counts(torch.ones(2, 1)), Counts(torch.ones(3, 1))).shape
    torch.Size([2, 3])
    """

    def register(fn: Callable[[ParameterBatch, ParameterBatch], torch.Tensor]) -> Callable:
        _KL[(type_p, type_q)] = fn
        return fn

    return register


def kl_divergence(p: ParameterBatch, q: ParameterBatch) -> torch.Tensor:
    """``KL(p_i || q_j)`` ``(K, K')`` between every component of ``p`` and every one of ``q``, by the divergence
    registered for their classes (:func:`register_kl`); a ``TypeError`` where none is.

    Examples
    --------
    >>> from ppmix.components.bernoulli import BernoulliComponents
    >>> p = BernoulliComponents(torch.tensor([[0.5], [0.9]], dtype=torch.float64))
    >>> round(kl_divergence(p, p)[1, 0].item(), 4)
    0.3681
    """
    matches = [
        (type(p).__mro__.index(tp) + type(q).__mro__.index(tq), fn)
        for (tp, tq), fn in _KL.items()
        if isinstance(p, tp) and isinstance(q, tq)
    ]
    if not matches:
        raise TypeError(f"no closed-form KL divergence is registered between {type(p).__name__} and {type(q).__name__}")
    return min(matches, key=lambda match: match[0])[1](p, q)
