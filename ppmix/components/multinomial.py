"""The multinomial family: ``K`` components over count vectors, ``x ~ Multinomial(n = sum_d x_d, probs_k)``.

Each row is a vector of ``D`` non-negative integer counts with any total (word counts of a document, species
counts of a sample). The multinomial coefficient ``log n! - sum_d log x_d!`` does not depend on the parameters:
it is computed once per fit with the rows (:class:`CountRows`). Registered in :mod:`ppmix.components.registry`
as ``"multinomial"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.components.base import ComponentFamily
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    MeanStatisticsComponents,
    PriorKey,
    SiteSpec,
    WeightedSums,
)

__all__ = ["CountRows", "MultinomialComponents", "MultinomialFamily", "RowTotalMultinomial"]


def log_multinomial_coefficient(x: torch.Tensor) -> torch.Tensor:
    """``log n! - sum_d log x_d!`` of every count vector, ``n = sum_d x_d``, ``x.shape[:-1]``.

    Examples
    --------
    >>> log_multinomial_coefficient(torch.tensor([[1.0, 1.0, 2.0]])).exp().round()  # 4! / (1! 1! 2!)
    tensor([12.])
    """
    return torch.lgamma(x.sum(-1) + 1) - torch.lgamma(x + 1).sum(-1)


@dataclass
class CountRows:
    """Count vectors ``x`` ``(N, D)`` with their multinomial coefficients ``log_coefficient`` ``(N,)``."""

    x: torch.Tensor
    log_coefficient: torch.Tensor

    @classmethod
    def from_tensor(cls, x: torch.Tensor) -> "CountRows":
        return cls(x, log_multinomial_coefficient(x))


class RowTotalMultinomial(dist.TorchDistribution):
    """A multinomial whose number of trials is each value's own total (``torch.distributions.Multinomial``
    takes one ``total_count`` for the whole batch): ``log p(x) = log n! - sum_d log x_d! + sum_d x_d log p_d``.

    ``total_count`` is used by :meth:`sample` only.

    Examples
    --------
    >>> d = RowTotalMultinomial(torch.tensor([0.25, 0.75]))
    >>> d.log_prob(torch.tensor([[1.0, 1.0], [0.0, 3.0]])).exp()
    tensor([0.3750, 0.4219])
    """

    arg_constraints = {"probs": constraints.simplex}
    support = constraints.independent(constraints.nonnegative_integer, 1)

    def __init__(self, probs: torch.Tensor, total_count: int = 1, validate_args: bool | None = None) -> None:
        self.probs, self.total_count = probs, int(total_count)
        super().__init__(probs.shape[:-1], probs.shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape: Any, _instance: Any = None) -> "RowTotalMultinomial":
        new = self._get_checked_instance(RowTotalMultinomial, _instance)
        new.probs, new.total_count = self.probs.expand(*batch_shape, *self.event_shape), self.total_count
        super(RowTotalMultinomial, new).__init__(torch.Size(batch_shape), self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return log_multinomial_coefficient(value) + torch.xlogy(value, self.probs).sum(-1)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008 (torch's signature)
        return dist.Multinomial(self.total_count, probs=self.probs).sample(sample_shape)


class MultinomialComponents(MeanStatisticsComponents):
    """``K`` multinomial components with category probabilities ``probs`` ``(K, D)``.

    Parameters
    ----------
    probs : Tensor (K, D)
        Each row on the simplex.
    floor : float, default 1e-10
        The weighted MLE gives every category a probability of at least about ``floor`` (floored, then
        renormalised), so a category unseen in a component keeps a finite log-density.
    sample_total : int, default 1
        The number of trials of the rows :meth:`sample` draws (the model passes the training rows' median total).

    Examples
    --------
    >>> comp = MultinomialComponents(torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64))
    >>> comp.log_prob(torch.tensor([[1.0, 1.0]], dtype=torch.float64)).exp()
    tensor([[0.5000, 0.1800]], dtype=torch.float64)
    """

    param_names = ("probs",)

    def __init__(self, probs: torch.Tensor, floor: float = 1e-10, sample_total: int = 1) -> None:
        probs = torch.as_tensor(probs)
        if probs.dim() != 2:
            raise ValueError(f"probs must have shape (K, D); got {tuple(probs.shape)}")
        if not bool((probs >= 0).all()):
            raise ValueError("probs must be non-negative")
        self.probs, self.floor, self.sample_total = probs, float(floor), int(sample_total)

    @property
    def mean(self) -> torch.Tensor:
        """The expected share of each category in a row, ``probs`` ``(K, D)`` (of ``n`` trials: ``n`` times it)."""
        return self.probs

    def log_prob(self, data: Any) -> torch.Tensor:
        """``log n! - sum_d log x_d! + sum_d x_d log probs_kd``, ``(N, K)``: one GEMM, the coefficient cached in
        prepared :class:`CountRows` (a probability of 0 taken as the smallest positive number)."""
        rows = data if isinstance(data, CountRows) else CountRows.from_tensor(data.to(self.dtype))
        log_probs = self.probs.clamp_min(torch.finfo(self.dtype).tiny).log()
        return rows.x.to(self.dtype) @ log_probs.T + rows.log_coefficient.to(self.dtype)[:, None]

    def statistics(self, data: Any, weights: torch.Tensor) -> WeightedSums:
        return super().statistics(data.x if isinstance(data, CountRows) else data, weights)

    def fit_statistics(self, stats: WeightedSums) -> "MultinomialComponents":
        """The weighted MLE ``probs_k ∝ sum_n r_nk x_n``, floored at ``floor`` and renormalised (uniform for a
        component without counts); in place."""
        totals = stats.totals.to(self.dtype)
        row_sums = totals.sum(1, keepdim=True)
        shares = torch.where(row_sums > 0, totals / torch.where(row_sums > 0, row_sums, 1.0), 1.0 / totals.shape[1])
        floored = shares.clamp_min(self.floor)
        self.probs = floored / floored.sum(1, keepdim=True)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        probs = self.probs if index is None else self.probs[index]
        return RowTotalMultinomial(probs, self.sample_total)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        draws = torch.multinomial(self.probs[index], self.sample_total, replacement=True, generator=generator)
        counts = torch.zeros(len(index), self.probs.shape[1], dtype=self.dtype, device=self.device)
        return counts.scatter_add_(1, draws, torch.ones_like(draws, dtype=self.dtype))

    def kl(self, other: "MultinomialComponents") -> torch.Tensor:
        """``KL`` of one trial, ``(K, K')``: ``sum_d p log(p / q)`` (``n`` trials: ``n`` times it)."""
        p, q = self.probs[:, None, :], other.probs[None, :, :]
        return torch.xlogy(p, p / q).sum(-1)


class MultinomialFamily(DensityFamily):
    """Multinomial components over count vectors of any total, for the structures (registered as
    ``"multinomial"``).

    Parameters
    ----------
    floor : float, default 1e-10
        The smallest fitted probability of a category (before renormalising).

    Notes
    -----
    The Pyro site is ``probs`` ``(K, D)`` (as in ``torch.distributions.Multinomial``); under MCMC its prior is
    ``Dirichlet(1, ..., 1)`` (uniform); a model's ``priors=`` sets its concentration ``probs_concentration``
    (default 1: a number or one per category), and MAP-EM's probabilities are ``counts + alpha - 1``,
    normalised. Sampled rows have the training rows' median total.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.multinomial(30, [0.7, 0.2, 0.1], 200), rng.multinomial(50, [0.1, 0.2, 0.7], 200)])
    >>> mix = Mixture(2, family="multinomial", seed=0, progress=False).fit(X)
    >>> probs = mix.components_.probs.numpy()
    >>> np.round(probs[np.argsort(probs[:, 0])], 1)
    array([[0.1, 0.2, 0.7],
           [0.7, 0.2, 0.1]])
    """

    name = "multinomial"
    components_class = MultinomialComponents

    def __init__(self, floor: float = 1e-10) -> None:
        self.floor = floor

    def validate(self) -> None:
        if not (isinstance(self.floor, (int, float)) and 0 < self.floor < 1e-2):
            raise ValueError(f"floor must be a number in (0, 0.01); got {self.floor!r}")

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        if not bool(((x >= 0) & (x == x.round())).all()):
            raise InvalidDataError(
                f"{name} must hold counts (non-negative integers) for the multinomial family, one count vector a row"
            )

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        """``total``: the median number of trials of a row (what sampled rows get)."""
        total = x.sum(1).median() if x.numel() else torch.tensor(1.0)
        return {"total": total.to(dtype=x.dtype, device=x.device)}

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> CountRows:
        return CountRows.from_tensor(x)

    def rows(self, data: Any) -> torch.Tensor:
        return data.x if isinstance(data, CountRows) else data

    def start_points(self, data: Any) -> torch.Tensor:
        """Each row's shares of its total (zero for a row without counts): k-means compares the rows' profiles."""
        x = self.rows(data)
        totals = x.sum(1, keepdim=True)
        return x / torch.where(totals > 0, totals, 1.0)

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"probs": SiteSpec(constraints.simplex, (d,))}

    def _component_options(self, scale: DataScale) -> dict[str, Any]:
        total = scale.get("total")
        return {"floor": self.floor, "sample_total": 1 if total is None else max(int(total.round()), 1)}

    def prior_keys(self) -> dict[str, PriorKey]:
        return {
            "probs_concentration": PriorKey(
                "the Dirichlet concentration of the categories (default 1)", "concentration"
            )
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        return dist.Dirichlet(self.prior_value("probs_concentration", torch.ones(d, **opts)))

    def map_update(self, components: MultinomialComponents, stats: WeightedSums, scale: DataScale) -> None:
        """The weighted MLE of the counts plus ``alpha - 1`` under ``Dirichlet(alpha)``: the posterior mode."""
        opts = {"dtype": components.dtype, "device": components.device}
        alpha = self.prior("probs", 1, stats.totals.shape[1], scale, opts).concentration
        components.fit_statistics(WeightedSums(stats.counts, stats.totals.to(**opts) + alpha - 1))

    def conjugate_posterior(
        self, site: str, stats: WeightedSums, values: dict, scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """``probs_k | rows ~ Dirichlet(alpha + sum_n x_n)`` under the prior ``Dirichlet(alpha)``."""
        prior = self.prior(site, 1, stats.totals.shape[1], scale, opts)
        return dist.Dirichlet(prior.concentration + stats.totals)

    def n_parameters(self, k: int, d: int) -> int:
        return k * (d - 1)
