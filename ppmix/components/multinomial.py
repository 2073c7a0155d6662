"""The multinomial family: ``K`` components over count vectors, ``x ~ Multinomial(n = sum_d x_d, probs_k)``.

Each row is a vector of ``D`` non-negative integer counts with any total (word counts of a document, species
counts of a sample). The multinomial coefficient ``log n! - sum_d log x_d!`` does not depend on the parameters:
it is computed once per fit with the rows (:class:`CountRows`). Registered in :mod:`ppmix.components.registry`
as ``"multinomial"``.

Rows with missing counts (NaN, missing at random; ``missing="marginalize"``) are scored by a conditional
likelihood. The family models the shares of a row's total, not the total itself, and a row with missing counts
has an unknown total; given the sum ``n_o`` of its observed counts ``x_o``, those counts are multinomial over the
observed categories with the probabilities renormalised, ``x_o | n_o ~ Multinomial(n_o, p_o / sum(p_o))``. (This
is also the profile likelihood in ``p`` if the counts were independent Poisson with a free rate per row.) A
complete row's term is the usual ``log Mult(x | n, p)``. EM's M-step then maximises, per component,
``sum_d a_d log p_d - sum_n c_n log sum_{d in o_n} p_d`` (``a_d`` the weighted observed counts, ``c_n = r_n
n_o``), which has no closed form when the rows' observed categories differ. The objective does not change when
``p`` is scaled, so :meth:`ObservedCountStatistics.probabilities` maximises it without the simplex constraint,
by minorisation-maximisation: since ``log s <= log s' + s / s' - 1``, each step ``p_d <- a_d / sum_n c_n
[d in o_n] / s_n(p)``, then renormalised, never decreases it, and EM stays monotone (one step is the usual
``p ∝ a`` when every row is complete). Probabilities are identified only through categories observed together:
if the rows' observed categories split into groups that no row spans, the groups' relative masses stay where
the start put them. A missing count has no conditional expectation without a model of the row's total, so
``impute`` refuses this family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.algorithms.floored_simplex import floored_frequencies
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.divergence import register_kl
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    FamilyPriors,
    MeanStatisticsComponents,
    PreparedRows,
    PriorKey,
    SiteSpec,
    Statistics,
    WeightedSums,
)
from ppmix.components.family_tools import prior_value
from ppmix.components.independent import ComponentsView

__all__ = [
    "CountRows",
    "MultinomialComponents",
    "MultinomialFamily",
    "MultinomialPriors",
    "ObservedCountStatistics",
    "ObservedCounts",
    "RowTotalMultinomial",
]

#: the most minorisation-maximisation steps of one M-step on rows with missing counts, and the largest change
#: of a probability at which they stop
MM_MAX_STEPS = 100
MM_TOL = 1e-12


def log_multinomial_coefficient(x: torch.Tensor) -> torch.Tensor:
    """``log n! - sum_d log x_d!`` of every count vector, ``n = sum_d x_d``, ``x.shape[:-1]``.

    Examples
    --------
    >>> log_multinomial_coefficient(torch.tensor([[1.0, 1.0, 2.0]])).exp().round()  # 4! / (1! 1! 2!)
    tensor([12.])
    """
    return torch.lgamma(x.sum(-1) + 1) - torch.lgamma(x + 1).sum(-1)


@dataclass
class CountRows(PreparedRows):
    """Count vectors ``x`` ``(N, D)`` with their multinomial coefficients ``log_coefficient`` ``(N,)``."""

    x: torch.Tensor
    log_coefficient: torch.Tensor

    @classmethod
    def from_tensor(cls, x: torch.Tensor) -> "CountRows":
        return cls(x, log_multinomial_coefficient(x))

    @property
    def rows(self) -> torch.Tensor:
        return self.x

    @property
    def start_points(self) -> torch.Tensor:
        """Each row's shares of its total (zero for a row without counts): k-means compares the rows' profiles."""
        totals = self.x.sum(1, keepdim=True)
        return self.x / torch.where(totals > 0, totals, 1.0)


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


@dataclass(frozen=True)
class ObservedCountStatistics(Statistics):
    """E-step statistics of count rows of which some have missing counts: ``counts`` ``(K,)`` the rows' total
    responsibilities, ``totals`` ``(K, D)`` the weighted observed counts ``a_kd``, and, per pattern of observed
    categories ``patterns`` ``(P, D)`` (bool), ``pattern_totals`` ``(K, P)`` the weighted totals of the observed
    counts ``sum_n r_nk n_o`` of the rows with that pattern. They merge with each other and, from either side,
    with the family's :class:`~ppmix.components.family.WeightedSums` of complete rows (one pattern: every
    category).

    Examples
    --------
    >>> # a row observing categories 0 and 1 (counts 1 and 3), another 1 and 2 (counts 2 and 4)
    >>> seen = torch.tensor([[True, True, False], [False, True, True]])
    >>> totals, by_pattern = torch.tensor([[1.0, 5.0, 4.0]]), torch.tensor([[4.0, 6.0]])
    >>> stats = ObservedCountStatistics(torch.ones(1), totals, seen, by_pattern)
    >>> start = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    >>> stats.probabilities(start).round(decimals=6).tolist()  # p0 / (p0 + p1) = 1/4, p1 / (p1 + p2) = 2/6
    [[0.1, 0.3, 0.6]]
    >>> both = stats.merge(WeightedSums(torch.ones(1), torch.tensor([[1.0, 1.0, 2.0]])))
    >>> both.patterns.int().tolist(), both.pattern_totals.tolist()
    ([[0, 1, 1], [1, 1, 0], [1, 1, 1]], [[6.0, 4.0, 4.0]])
    """

    counts: torch.Tensor
    totals: torch.Tensor
    patterns: torch.Tensor
    pattern_totals: torch.Tensor
    absorbs_family_statistics: ClassVar[bool] = True

    @classmethod
    def of_complete_rows(cls, stats: WeightedSums) -> "ObservedCountStatistics":
        """The family's statistics of complete rows in this form: one pattern, every category observed."""
        every = torch.ones(1, stats.totals.shape[1], dtype=torch.bool, device=stats.totals.device)
        return cls(stats.counts, stats.totals, every, stats.totals.sum(1, keepdim=True))

    def merge(self, other: Any) -> "ObservedCountStatistics":
        if not isinstance(other, ObservedCountStatistics):
            other = ObservedCountStatistics.of_complete_rows(other)
        patterns, index = torch.unique(torch.cat([self.patterns, other.patterns]), dim=0, return_inverse=True)
        both = torch.cat([self.pattern_totals, other.pattern_totals], dim=1)
        pattern_totals = both.new_zeros(both.shape[0], patterns.shape[0]).index_add_(1, index, both)
        return ObservedCountStatistics(self.counts + other.counts, self.totals + other.totals, patterns, pattern_totals)

    def scaled(self, factor: float) -> "ObservedCountStatistics":
        return ObservedCountStatistics(
            self.counts * factor, self.totals * factor, self.patterns, self.pattern_totals * factor
        )

    def to(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> "ObservedCountStatistics":
        return ObservedCountStatistics(
            self.counts.to(dtype=dtype, device=device),
            self.totals.to(dtype=dtype, device=device),
            self.patterns.to(device=device),
            self.pattern_totals.to(dtype=dtype, device=device),
        )

    def objective(self, probs: torch.Tensor) -> torch.Tensor:
        """The M-step's objective per component ``(K,)``: ``sum_d a_d log p_d - sum_P c_P log sum_{d in P} p_d``
        (the conditional log-likelihood of the rows' observed counts under ``probs``, less the coefficients)."""
        shares = probs @ self.patterns.to(probs.dtype).T
        return torch.xlogy(self.totals, probs).sum(1) - torch.xlogy(self.pattern_totals, shares).sum(1)

    def probabilities(self, start: torch.Tensor) -> torch.Tensor:
        """The probabilities ``(K, D)`` that maximise :meth:`objective`, by minorisation-maximisation from ``start``
        (the current probabilities): ``p_d <- a_d / sum_P c_P [d in P] / sum_{d' in P} p_d'``, renormalised, until
        no probability moves by more than ``MM_TOL`` (at most ``MM_MAX_STEPS`` steps). Every step increases the
        objective. A category no weighted row observes gets 0; a component without counts, the uniform."""
        totals, weight = self.totals.to(start.dtype), self.pattern_totals.to(start.dtype)
        pattern = self.patterns.to(start.dtype)
        tiny = torch.finfo(start.dtype).tiny
        probs = start / start.sum(1, keepdim=True)
        for _ in range(MM_MAX_STEPS):
            rate = (weight / (probs @ pattern.T).clamp_min(tiny)) @ pattern
            unnormalised = torch.where(rate > 0, totals / torch.where(rate > 0, rate, 1.0), 0.0)
            sums = unnormalised.sum(1, keepdim=True)
            step = torch.where(sums > 0, unnormalised / torch.where(sums > 0, sums, 1.0), 1.0 / probs.shape[1])
            change, probs = float((step - probs).abs().max()), step
            if change <= MM_TOL:
                break
        return probs


class ObservedCounts(ComponentsView):
    """Multinomial components seen through the observed counts of rows with missing counts (NaN): ``log_prob`` the
    conditional log-likelihood ``log Mult(x_o | n_o, p_o / sum(p_o))`` ``(N, K)``, ``statistics``
    :class:`ObservedCountStatistics`, ``fit_statistics`` the components' M-step (in place).

    Parameters
    ----------
    components : MultinomialComponents
        The fitted components (a view: they are fitted in place).

    Examples
    --------
    >>> comp = MultinomialComponents(torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64))
    >>> x = torch.tensor([[1.0, 2.0, float("nan")]], dtype=torch.float64)
    >>> round(float(comp.observed().log_prob(x).exp()), 12)  # Binomial(2 of 3 | 0.3 / 0.5) = 3 * 0.4 * 0.6^2
    0.432
    """

    def _scored(self, data: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The conditional log-likelihoods, and the rows with zeros for the missing counts, their mask and
        observed totals ``n_o`` ``(N,)``."""
        x = torch.as_tensor(data).to(dtype=self.dtype, device=self.device)
        observed = ~torch.isnan(x)
        filled = torch.where(observed, x, 0.0)
        n_observed = filled.sum(1)
        shares = (observed.to(self.dtype) @ self.components.probs.T).clamp_min(torch.finfo(self.dtype).tiny)
        log_prob = self.components.log_prob(CountRows.from_tensor(filled)) - n_observed[:, None] * shares.log()
        return log_prob, (filled, observed, n_observed)

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        return self._scored(data)[0]

    def _statistics_given(self, data: torch.Tensor, weights: torch.Tensor, shared: Any) -> ObservedCountStatistics:
        filled, observed, n_observed = shared
        weights = self._check_weights(weights, filled.shape[0])
        patterns, pattern = torch.unique(observed, dim=0, return_inverse=True)
        pattern_totals = weights.new_zeros(self.n_components, patterns.shape[0]).index_add_(
            1, pattern, (weights * n_observed[:, None]).T
        )
        return ObservedCountStatistics(weights.sum(0), weights.T @ filled, patterns, pattern_totals)

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> ObservedCountStatistics:
        return self._statistics_given(data, weights, self._scored(data)[1])

    def fit_statistics(self, stats: Any) -> Any:
        return self.components.fit_statistics(stats)

    def imputed(self, resp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Refused: the family models a row's shares, not its total, so a missing count has no conditional
        expectation."""
        raise ValueError(
            "impute is not defined for the multinomial family: it models the shares of a row's total, not the "
            "total, so a missing count has no conditional expectation (the observed counts' shares do: "
            "predict_proba and the components' probs)"
        )


class MultinomialComponents(MeanStatisticsComponents):
    """``K`` multinomial components with category probabilities ``probs`` ``(K, D)``.

    Parameters
    ----------
    probs : Tensor (K, D)
        Each row on the simplex.
    floor : float, default 1e-10
        The M-step gives every category a probability of at least ``floor`` (beyond 10 categories ``10 * floor /
        D``: the floors hold at most ``10 * floor`` in all), so a category unseen in a component keeps a finite
        log-density; it is the maximiser of the likelihood under that constraint.
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

    def moments(self) -> Moments:
        """The expected share of each category in a row, ``probs`` ``(K, D)`` (of ``n`` trials: ``n`` times it); no
        covariance (a row's depends on its number of trials)."""
        return Moments(self.probs, None)

    def log_prob(self, data: Any) -> torch.Tensor:
        """``log n! - sum_d log x_d! + sum_d x_d log probs_kd``, ``(N, K)``: one GEMM, the coefficient cached in
        prepared :class:`CountRows` (a probability of 0 taken as the smallest positive number)."""
        rows = data if isinstance(data, CountRows) else CountRows.from_tensor(data.to(self.dtype))
        log_probs = self.probs.clamp_min(torch.finfo(self.dtype).tiny).log()
        return rows.x.to(self.dtype) @ log_probs.T + rows.log_coefficient.to(self.dtype)[:, None]

    def statistics(self, data: Any, weights: torch.Tensor) -> WeightedSums:
        return super().statistics(data.x if isinstance(data, CountRows) else data, weights)

    def observed(self) -> ObservedCounts:
        """These components seen through the observed counts of rows with missing counts (:class:`ObservedCounts`)."""
        return ObservedCounts(self)

    def fit_statistics(self, stats: WeightedSums | ObservedCountStatistics) -> "MultinomialComponents":
        """The weighted MLE ``probs_k ∝ sum_n r_nk x_n`` under the floor (the exact maximiser,
        :func:`~ppmix.algorithms.floored_simplex.floored_frequencies`; uniform for a component without counts); from
        rows with missing counts, :meth:`fit_observed`; in place."""
        if isinstance(stats, ObservedCountStatistics):
            return self.fit_observed(stats)
        self.probs = floored_frequencies(stats.totals.to(self.dtype), self.floor)
        return self

    def fit_observed(self, stats: ObservedCountStatistics) -> "MultinomialComponents":
        """The M-step from rows with missing counts: the maximiser of their conditional likelihood reached from the
        current ``probs`` (:meth:`ObservedCountStatistics.probabilities`), brought onto the floor
        (:func:`~ppmix.algorithms.floored_simplex.floored_frequencies` of it), kept for each
        component whose objective it does not lower (else the current ``probs`` stay): a generalised M-step, so EM
        never decreases its objective."""
        current = self.probs.to(self.dtype)
        proposal = floored_frequencies(stats.probabilities(current), self.floor)
        better = stats.objective(proposal) >= stats.objective(current)
        self.probs = torch.where(better[:, None], proposal, current)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        probs = self.probs if index is None else self.probs[index]
        return RowTotalMultinomial(probs, self.sample_total)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        draws = torch.multinomial(self.probs[index], self.sample_total, replacement=True, generator=generator)
        counts = torch.zeros(len(index), self.probs.shape[1], dtype=self.dtype, device=self.device)
        return counts.scatter_add_(1, draws, torch.ones_like(draws, dtype=self.dtype))


@register_kl(MultinomialComponents, MultinomialComponents)
def _kl_multinomial_components(p: MultinomialComponents, q: MultinomialComponents) -> torch.Tensor:
    """``KL`` of one trial, ``(K, K')``: ``sum_d p log(p / q)`` (``n`` trials: ``n`` times it)."""
    p, q = p.probs[:, None, :], q.probs[None, :, :]
    return torch.xlogy(p, p / q).sum(-1)


class MultinomialFamily(DensityFamily):
    """Multinomial components over count vectors of any total, for the structures (registered as
    ``"multinomial"``).

    Parameters
    ----------
    floor : float, default 1e-10
        The smallest fitted probability of a category (beyond 10 categories ``10 * floor / D``: the floors hold
        at most ``10 * floor`` in all); the M-step is the maximiser of the likelihood (MAP-EM: of the posterior)
        under that floor, so EM's objective never decreases.

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
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
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

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"probs": SiteSpec(constraints.simplex, (d,))}

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> MultinomialComponents:
        """The probabilities of the site values, with the family's floor and the training rows' total count (that
        of the rows :meth:`~MultinomialComponents.sample` draws; 1 before a fit)."""
        total = scale.get("total")
        sample_total = 1 if total is None else max(int(total.round()), 1)
        return MultinomialComponents(values["probs"], floor=self.floor, sample_total=sample_total)

    def priors(self) -> "MultinomialPriors":
        return MultinomialPriors(self)


class MultinomialPriors(FamilyPriors):
    """The priors of :class:`MultinomialFamily` (its :meth:`~MultinomialFamily.priors`)."""

    family: MultinomialFamily

    def keys(self) -> dict[str, PriorKey]:
        return {
            "probs_concentration": PriorKey(
                "the Dirichlet concentration of the categories (default 1)", "concentration"
            )
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        return dist.Dirichlet(prior_value(self.family, "probs_concentration", torch.ones(d, **opts)))

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
