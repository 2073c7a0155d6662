"""Flat (improper) priors for maximum-likelihood fits of Pyro models."""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions.util import broadcast_shape


class FlatPrior(dist.ImproperUniform):
    """Pyro's ``ImproperUniform`` whose zero log-density keeps the value's dtype and device.

    With these priors and a point-mass guide, ``TraceEnum_ELBO`` equals the
    log-likelihood, so SVI is maximum likelihood and matches the EM objective.

    Examples
    --------
    >>> import torch
    >>> from pyro.distributions import constraints
    >>> FlatPrior(constraints.positive, (2,), (3,)).log_prob(torch.ones(2, 3, dtype=torch.float64)).dtype
    torch.float64
    """

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        batch_shape = broadcast_shape(value.shape[: value.dim() - self.event_dim], self.batch_shape)
        return value.new_zeros(()).expand(batch_shape)
