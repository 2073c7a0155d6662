"""Families of independent features, and their rows with missing entries (NaN, missing at random).

Under a family whose features are independent given the component (Poisson, Bernoulli, categorical,
exponential, gamma, log-normal) a row's log-density is a sum over its features, ``log p_k(x) = sum_d log
p_kd(x_d)``, and every parameter belongs to one feature. A row with missing entries is then scored by its
observed features alone (the missing ones integrate to one), and EM's M-step, which maximises ``sum_n sum_k r_nk
sum_{d observed} log p_kd(x_nd)``, is each feature's weighted MLE under the weights ``r_nk o_nd`` (``o_nd`` one
where ``x_nd`` is observed): exact EM under MAR, with nothing imputed.

One mechanism serves every such family, written against the family's own ``log_prob``, ``statistics`` and
``fit_statistics`` applied to one feature at a time (:meth:`IndependentFeatures.feature`):
:class:`ObservedFeatures` is the components seen through the observed entries, and :class:`FeatureStatistics`
collects each feature's statistics under its own weights (they merge with the family's statistics of complete
rows, across shards and in online EM).

Examples
--------
>>> from ppmix.components.poisson import PoissonComponents
>>> comp = PoissonComponents(torch.tensor([[2.0, 5.0]], dtype=torch.float64))
>>> x = torch.tensor([[3.0, float("nan")]], dtype=torch.float64)
>>> round(float(ObservedFeatures(comp).log_prob(x)), 6)  # log Poisson(3 | 2): the missing count integrates out
-1.712318
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ppmix.components.base import ComponentFamily
from ppmix.components.family import Statistics

__all__ = ["ComponentsView", "FeatureStatistics", "IndependentFeatures", "ObservedFeatures", "split_by_feature"]


class IndependentFeatures:
    """Mixin of the :class:`~ppmix.components.base.ComponentFamily` classes whose features are independent given
    the component and whose every parameter is ``(K, D, ...)``, one slice per feature: it declares that rows with
    missing entries can be scored and fitted by their observed features (:class:`ObservedFeatures`)."""

    param_names: tuple[str, ...]
    mean: torch.Tensor

    def feature(self, d: int) -> Any:
        """The components on feature ``d`` alone: every parameter's slice ``[:, d:d + 1]`` (views; fitting the
        result rebinds its own parameters, not these)."""
        part = object.__new__(type(self))
        part.__dict__.update(self.__dict__)
        for name in self.param_names:
            setattr(part, name, getattr(self, name)[:, d : d + 1])
        return part

    def observed(self) -> "ObservedFeatures":
        """These components seen through the observed entries of rows (:class:`ObservedFeatures`)."""
        return ObservedFeatures(self)

    def imputed(self, resp: torch.Tensor) -> torch.Tensor:
        """Each row's missing entries given its posterior probabilities ``resp`` ``(N, K)`` over the components
        (given its observed entries) ``(N, D)``: the conditional mean ``sum_k resp_nk mean_kd`` (the features are
        independent given the component)."""
        return resp @ self.moments().mean

    def join_features(self, fitted: list[Any]) -> None:
        """Take the features ``fitted`` (each :meth:`feature` fitted) as these components' parameters."""
        for name in self.param_names:
            setattr(self, name, torch.cat([getattr(part, name) for part in fitted], dim=1))


def split_by_feature(stats: Any, n_features: int) -> tuple[Any, ...]:
    """A family's statistics ``stats`` (a dataclass of tensors: ``(K,)`` totals over the rows, ``(K, D * c)``
    feature-major sums) as ``n_features`` statistics of one feature each (the totals kept).

    Examples
    --------
    >>> from ppmix.components.family import WeightedSums
    >>> parts = split_by_feature(WeightedSums(torch.tensor([2.0]), torch.tensor([[1.0, 3.0]])), 2)
    >>> [part.totals.tolist() for part in parts], parts[1].counts.tolist()
    ([[[1.0]], [[3.0]]], [2.0])
    """
    fields = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}

    def one(d: int) -> Any:
        sliced = {
            name: value if value.dim() == 1 else value.reshape(value.shape[0], n_features, -1)[:, d]
            for name, value in fields.items()
        }
        return type(stats)(**sliced)

    return tuple(one(d) for d in range(n_features))


@dataclass(frozen=True)
class FeatureStatistics(Statistics):
    """E-step statistics of rows with missing entries under independent features: ``counts`` ``(K,)`` the total
    responsibilities of the rows (the mixing weights' statistic) and ``features`` one statistics object of the
    family per feature, under the weights ``r_nk o_nd``. They merge with each other, and with the family's own
    statistics of complete rows (split by :func:`split_by_feature`)."""

    counts: torch.Tensor
    features: tuple[Any, ...]
    absorbs_family_statistics: ClassVar[bool] = True

    def merge(self, other: Any) -> "FeatureStatistics":
        if not isinstance(other, FeatureStatistics):
            other = FeatureStatistics(other.counts, split_by_feature(other, len(self.features)))
        merged = tuple(a.merge(b) for a, b in zip(self.features, other.features, strict=True))
        return FeatureStatistics(self.counts + other.counts, merged)

    def scaled(self, factor: float) -> "FeatureStatistics":
        return FeatureStatistics(self.counts * factor, tuple(part.scaled(factor) for part in self.features))

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "FeatureStatistics":
        parts = tuple(part.to(dtype=dtype, device=device) for part in self.features)
        return FeatureStatistics(self.counts.to(dtype=dtype, device=device), parts)


class ComponentsView(ComponentFamily):
    """A view of fitted ``components`` that scores and fits rows with missing entries (fitting them in place):
    their number, device and dtype are the components'."""

    def __init__(self, components: Any) -> None:
        self.components = components

    @property
    def n_components(self) -> int:
        return self.components.n_components

    @property
    def device(self) -> torch.device:
        return self.components.device

    @property
    def dtype(self) -> torch.dtype:
        return self.components.dtype

    def pyro_dist(self, index: torch.Tensor | None = None) -> Any:
        """The components' own distribution (of whole rows: the view changes how rows are scored, not the model)."""
        return self.components.pyro_dist(index)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Whole rows drawn from the components."""
        return self.components.sample(index, generator)


class ObservedFeatures(ComponentsView):
    """Components of independent features seen through the observed entries of rows (NaN where missing): the
    log-density of a row is the sum of its observed features' (``(N, K)``), the statistics are each feature's
    under the responsibilities times its observation mask (:class:`FeatureStatistics`), and
    :meth:`fit_statistics` fits each feature of the underlying components from its own (in place). The EM of the
    structures then runs through the generic two-pass E-step of
    :func:`~ppmix.components.family_tools.mixture_statistics`.

    Parameters
    ----------
    components : IndependentFeatures
        The fitted components (a view: they are fitted in place).
    """

    def __init__(self, components: Any) -> None:
        if not isinstance(components, IndependentFeatures):
            raise TypeError(f"{type(components).__name__} does not have independent features")
        super().__init__(components)

    def _columns(self, x: torch.Tensor) -> tuple[torch.Tensor, list[Any], torch.Tensor]:
        """The observation mask ``(N, D)``, each feature's components, and ``x`` with every missing entry replaced
        by the first component's mean of its feature (a value every family scores; its terms are masked out)."""
        x = torch.as_tensor(x).to(dtype=self.dtype, device=self.device)
        observed = ~torch.isnan(x)
        filled = torch.where(observed, x, self.components.moments().mean[0])
        return observed, [self.components.feature(d) for d in range(x.shape[1])], filled

    def _scored(self, data: torch.Tensor) -> tuple[torch.Tensor, Any]:
        observed, features, filled = self._columns(data)
        log_prob = filled.new_zeros(filled.shape[0], self.n_components)
        for d, part in enumerate(features):
            log_prob += torch.where(observed[:, d, None], part.log_prob(filled[:, d : d + 1]), 0.0)
        return log_prob, (observed, features, filled)

    def log_prob(self, data: torch.Tensor) -> torch.Tensor:
        """``sum_{d observed} log p_kd(x_nd)`` ``(N, K)``."""
        return self._scored(data)[0]

    def _statistics_given(self, data: torch.Tensor, weights: torch.Tensor, shared: Any) -> FeatureStatistics:
        observed, features, filled = shared
        weights = self._check_weights(weights, filled.shape[0])
        mask = observed.to(weights.dtype)
        parts = tuple(
            part.statistics(filled[:, d : d + 1], weights * mask[:, d, None]) for d, part in enumerate(features)
        )
        return FeatureStatistics(weights.sum(0), parts)

    def statistics(self, data: torch.Tensor, weights: torch.Tensor) -> FeatureStatistics:
        return self._statistics_given(data, weights, self._columns(data))

    def imputed(self, resp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.components.imputed(resp)

    def fit_statistics(self, stats: Any) -> Any:
        """Each feature's weighted MLE from its statistics (the family's own statistics of complete rows split by
        feature), written into the underlying components; returns them."""
        components = self.components
        n_features = components.moments().mean.shape[1]
        parts = stats.features if isinstance(stats, FeatureStatistics) else split_by_feature(stats, n_features)
        components.join_features([components.feature(d).fit_statistics(part) for d, part in enumerate(parts)])
        return components
