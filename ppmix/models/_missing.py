"""Missing values (NaN) in the rows of a mixture or an HMM's frames, marginalised by EM (``missing="marginalize"``).

The rows without a missing entry take the family's own path (prepared once, the fused E-step); the others
are scored by the marginal density of their observed entries, and their statistics are merged with the complete
rows' before the M-step. Gaussian components contribute EM's expected statistics of the missing block
(:mod:`ppmix.components.gaussian_missing`); components of independent features (Poisson, Bernoulli, categorical,
exponential, gamma, log-normal) drop the missing features and weigh each feature's statistics by whether it is
observed (:mod:`ppmix.components.independent`); the multinomial and the mixtures of diagonal Gaussians have views
of their own (:mod:`ppmix.components.multinomial`, :mod:`ppmix.components.gaussian_mixture`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from ppmix.components.base import ComponentFamily
from ppmix.components.family import DensityFamily, Statistics
from ppmix.components.family_tools import mixture_statistics
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_missing import (
    ROW_BLOCK_ENTRIES,
    MissingRows,
    conditional_mean,
    expected_statistics,
    marginal_log_prob,
    missing_e_step,
)
from ppmix.components.gaussian_mixture import DiagGaussianMixtures, FullGaussianMixtures
from ppmix.components.independent import FeatureStatistics

__all__ = [
    "MISSING_OPTIONS",
    "PartlyObserved",
    "check_missing_option",
    "fill_column_means",
    "fill_missing",
    "fit_statistics",
    "impute_rows",
    "log_prob_observed",
    "log_prob_with_missing",
    "partly_observed_e_step",
    "partly_observed_rows",
    "partly_observed_statistics",
    "sample_missing",
    "takes_missing",
]

#: what a NaN in ``X`` means: an error naming ``X`` (the default), or a value missing at random
MISSING_OPTIONS = ("error", "marginalize")


def takes_missing(family: DensityFamily) -> bool:
    """Whether ``missing="marginalize"`` serves ``family``: the Gaussian (every covariance type) and the families
    whose components see rows through their observed entries (:meth:`~ppmix.components.base.ComponentFamily.observed`:
    the families of independent features, the multinomial, the Student-t (diagonal or full) and mixtures of
    diagonal Gaussians).

    Examples
    --------
    >>> from ppmix.components.registry import FAMILIES, family_from
    >>> [name for name in FAMILIES if not takes_missing(family_from(name))]  # every family at its default settings
    ['autoregressive']
    >>> takes_missing(family_from({"name": "gmm", "covariance_type": "full"}))
    False
    """
    return isinstance(family, GaussianFamily) or family.components_class.observed is not ComponentFamily.observed


def _settings(family: DensityFamily) -> str:
    """`` (covariance_type='full')`` where the family has a covariance type, else nothing (for messages)."""
    covariance_type = getattr(family, "covariance_type", None)
    return "" if covariance_type is None else f" (covariance_type={covariance_type!r})"


def check_missing_option(missing: Any, family: DensityFamily) -> None:
    """``missing`` is one of :data:`MISSING_OPTIONS`, and ``"marginalize"`` comes with a family it serves."""
    if missing not in MISSING_OPTIONS:
        raise ValueError(f"missing must be one of {MISSING_OPTIONS}; got {missing!r}")
    if missing == "marginalize" and not takes_missing(family):
        raise ValueError(
            "missing='marginalize' is built for the Gaussian family (every covariance type), the families of "
            "independent features (poisson, bernoulli, categorical, exponential, gamma, lognormal), the multinomial, "
            "the Student-t (diagonal or full) and mixtures of diagonal Gaussians (gmm); got the "
            f"{family.name!r} family{_settings(family)}"
        )


def refuse_missing_in_program(data: Any, call: str) -> None:
    """Refuse prepared data with missing entries before ``call`` runs the Pyro program on them (the program needs
    every entry; only EM marginalises them), so the error comes up front, not from inside Pyro's trace.

    Examples
    --------
    >>> refuse_missing_in_program(torch.tensor([[1.0, float("nan")]]), "elbo")
    Traceback (most recent call last):
    ...
    ValueError: X has missing entries (NaN): missing='marginalize' is for EM (fit, partial_fit) only; elbo runs ...
    """
    x = getattr(data, "x", data)
    if isinstance(x, torch.Tensor) and x.is_floating_point() and bool(torch.isnan(x).any()):
        raise ValueError(
            "X has missing entries (NaN): missing='marginalize' is for EM (fit, partial_fit) only; "
            f"{call} runs the Pyro program, which needs every entry"
        )


@dataclass(frozen=True, eq=False)
class PartlyObserved:
    """Training rows of which some have missing entries.

    Attributes
    ----------
    x : Tensor (N, D)
        All rows, NaN where an entry is missing.
    complete : Any
        The rows without a missing entry, as the family prepares rows (None if there are none).
    complete_rows, partial_rows : LongTensor
        Which rows of ``x`` are complete and which are not.
    partial_x : Tensor (n, D)
        The rows with a missing entry.
    """

    x: torch.Tensor
    complete: Any
    complete_rows: torch.Tensor
    partial_rows: torch.Tensor
    partial_x: torch.Tensor
    reference: torch.Tensor | None = None

    @cached_property
    def partial(self) -> MissingRows:
        """The rows with a missing entry, prepared for the Gaussian E-step (once, when it first asks), centred at
        ``reference`` (default: their column means)."""
        return MissingRows.of(self.partial_x, self.reference)


def partly_observed_rows(
    x: torch.Tensor, family: DensityFamily | None = None, reference: torch.Tensor | None = None
) -> "PartlyObserved | None":
    """:class:`PartlyObserved` rows of ``x`` (the complete ones prepared by ``family``, or raw without one; the
    others centred at ``reference``, see :meth:`MissingRows.of`), or None when nothing is missing.

    Examples
    --------
    >>> data = partly_observed_rows(torch.tensor([[1.0, float("nan")], [2.0, 3.0]]), GaussianFamily("diag"))
    >>> data.complete_rows.tolist(), data.partial_rows.tolist()
    ([1], [0])
    >>> partly_observed_rows(torch.ones(2, 2)) is None
    True
    """
    missing = torch.isnan(x).any(dim=1)
    if not bool(missing.any()):
        return None
    complete_rows = torch.nonzero(~missing).squeeze(1)
    complete = family.prepare(x[complete_rows]) if family is not None and complete_rows.numel() else None
    partial_rows = torch.nonzero(missing).squeeze(1)
    return PartlyObserved(x, complete, complete_rows, partial_rows, x[partial_rows], reference)


def fill_column_means(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with every NaN replaced by its column's (weighted) mean over the observed entries: for the start
    of EM and for measuring the data's scale.

    Examples
    --------
    >>> fill_column_means(torch.tensor([[1.0, float("nan")], [3.0, 4.0]])).tolist()
    [[1.0, 4.0], [3.0, 4.0]]
    """
    observed = ~torch.isnan(x)
    if bool(observed.all()):
        return x
    return torch.where(observed, x, _column_means(x, observed, weight))


def _column_means(x: torch.Tensor, observed: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The (weighted) means of the columns of ``x`` over their ``observed`` entries ``(D,)`` (0 for a column
    without one)."""
    w = observed.to(x.dtype) if weight is None else observed.to(x.dtype) * weight[:, None].to(x.dtype)
    return (torch.where(observed, x, 0.0) * w).sum(0) / w.sum(0).clamp_min(torch.finfo(x.dtype).tiny)


def fill_missing(x: torch.Tensor, family: DensityFamily, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with every NaN filled for ``family``'s data checks, data scale and the start of EM: the column's
    (weighted) mean for the Gaussian (:func:`fill_column_means`), for other families the column's observed entry
    nearest to that mean (a value the family accepts: a count, a level, a positive number; where the column has
    none, the first observed entry of ``x``).

    Examples
    --------
    >>> from ppmix.components.poisson import PoissonFamily
    >>> x = torch.tensor([[1.0, float("nan")], [2.0, 4.0], [4.0, 5.0], [3.0, 9.0]])
    >>> fill_missing(x, PoissonFamily())[0].tolist()  # 5 is the count nearest to the column's mean, 6
    [1.0, 5.0]
    """
    observed = ~torch.isnan(x)
    if bool(observed.all()) or isinstance(family, GaussianFamily):
        return fill_column_means(x, weight)
    means = _column_means(x, observed, weight)
    nearest = torch.where(observed, (x - means).abs(), torch.inf).argmin(0)
    values = x[nearest, torch.arange(x.shape[1], device=x.device)]
    seen = observed.any(0)
    if not bool(seen.all()):  # a column without an observed entry (in a batch to predict) takes any observed one
        values = torch.where(seen, values, x[observed][:1])
    return torch.where(observed, x, values)


def partly_observed_e_step(
    components: Any, log_weights: torch.Tensor, data: PartlyObserved, weight: torch.Tensor | None
) -> tuple[Statistics, torch.Tensor]:
    """The E-step on :class:`PartlyObserved` rows: the merged statistics (complete rows by the components' fused
    E-step, the others by their expected statistics) and the log-likelihood of the observed entries."""
    partial_weight = None if weight is None else weight[data.partial_rows].to(data.partial_x)
    view = components.observed()
    if view is not None:
        stats, log_likelihood = mixture_statistics(view, data.partial_x, log_weights, partial_weight)
    else:
        stats, log_likelihood = missing_e_step(data.partial, log_weights, *components.moments(), partial_weight)
    if data.complete is None:
        return stats, log_likelihood
    complete_weight = None if weight is None else weight[data.complete_rows]
    complete_stats, complete_log_likelihood = mixture_statistics(
        components, data.complete, log_weights, complete_weight
    )
    return _merged(complete_stats, stats), complete_log_likelihood + log_likelihood


def _merged(complete: Statistics, partial: Statistics) -> Statistics:
    """The statistics of the complete and the partly observed rows together (per-feature statistics absorb the
    family's own)."""
    return partial.merge(complete) if isinstance(partial, FeatureStatistics) else complete.merge(partial)


def fit_statistics(components: Any, stats: Statistics) -> None:
    """The components' M-step from (merged) statistics, in place: per feature from
    :class:`~ppmix.components.independent.FeatureStatistics`, else the family's own."""
    if isinstance(stats, FeatureStatistics):
        components.observed().fit_statistics(stats)
    else:
        components.fit_statistics(stats)


def partly_observed_statistics(components: Any, data: PartlyObserved, resp: torch.Tensor) -> Statistics:
    """The M-step's statistics of :class:`PartlyObserved` rows under responsibilities ``resp`` ``(N, K)`` (times
    any row weights) and the current components."""
    partial_resp = resp[data.partial_rows]
    view = components.observed()
    if view is not None:
        stats = view.statistics(data.partial_x, partial_resp)
    else:
        stats = expected_statistics(data.partial, partial_resp, *components.moments())
    if data.complete is None:
        return stats
    return _merged(components.statistics(data.complete, resp[data.complete_rows]), stats)


def log_prob_with_missing(components: Any, x: torch.Tensor) -> torch.Tensor:
    """``log p_k(x_n)`` ``(N, K)`` of rows to predict, NaN where an entry is missing (those rows by their observed
    entries' marginal, centred at a point of the model, not of the batch: :func:`log_prob_observed`)."""
    rows = partly_observed_rows(x, reference=components.moments().mean.mean(0))
    return components.log_prob(x) if rows is None else log_prob_observed(components, rows)


def log_prob_observed(components: Any, data: PartlyObserved) -> torch.Tensor:
    """``log p_k(x_n)`` ``(N, K)`` of :class:`PartlyObserved` rows: the complete ones by the components' density,
    the others by the marginal density of their observed entries."""
    out = data.x.new_empty(data.x.shape[0], components.n_components)
    view = components.observed()
    if view is not None:
        out[data.partial_rows] = view.log_prob(data.partial_x)
    else:
        out[data.partial_rows] = marginal_log_prob(data.partial, *components.moments())
    if data.complete_rows.numel():
        complete = data.complete if data.complete is not None else data.x[data.complete_rows]
        out[data.complete_rows] = components.log_prob(complete)
    return out


def _flat(components: Any, log_weights: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The components and log mixing weights of a mixture: components that are mixtures of Gaussians as the flat
    mixture of all their Gaussians, others as they are."""
    if isinstance(components, (DiagGaussianMixtures, FullGaussianMixtures)):
        return components.flattened(log_weights)
    return components, log_weights


def impute_rows(components: Any, log_weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` with every missing entry replaced by its conditional expectation given the row's observed entries
    under the mixture (each component's conditional mean, weighted by the row's posterior probabilities given
    them; the most probable level for categorical features); observed entries as they are."""
    components, log_weights = _flat(components, log_weights)
    resp = torch.softmax(log_prob_with_missing(components, x) + log_weights, dim=1)
    view = components.observed()
    if view is not None:
        return torch.where(torch.isnan(x), view.imputed(resp, x), x)
    mean, covariance = components.moments()
    return conditional_mean(MissingRows.of(x, mean.mean(0)), resp, mean, covariance)


def sample_missing(
    components: Any, log_weights: torch.Tensor, x: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """``x`` with the missing entries of each row drawn from their distribution given the row's observed entries
    under a mixture of Gaussians (components that are mixtures of Gaussians: of all their Gaussians): a component
    ``k`` from the row's posterior probabilities given ``x_o``, then the missing block from the component's
    conditional Gaussian ``N(mu_k[m] + S_k[m, o] S_k[o, o]^{-1} (x_o - mu_k[o]), P_k[m, m]^{-1})`` (``P_k`` the
    precision; diagonal covariances: ``N(mu_k[m], diag(var_k[m]))``); observed entries, and rows without a missing
    entry, as they are. The draws use ``generator`` (on the CPU).

    Examples
    --------
    >>> from ppmix.components.gaussian_full import FullGaussian
    >>> f64 = torch.float64
    >>> comp = FullGaussian(torch.zeros(1, 2, dtype=f64), torch.tensor([[[1.0, 0.0], [0.9, 0.1]]], dtype=f64))
    >>> x = torch.tensor([[2.0, float("nan")]], dtype=f64).expand(20000, 2)
    >>> draws = sample_missing(comp, torch.zeros(1, dtype=f64), x, torch.Generator().manual_seed(0))[:, 1]
    >>> round(float(draws.mean()), 1), round(float(draws.var()), 2)  # N(0.9 * 2, 1 - 0.9^2)
    (1.8, 0.01)
    """
    components, log_weights = _flat(components, log_weights)
    missing = torch.isnan(x)
    rows = torch.nonzero(missing.any(dim=1)).squeeze(1)
    out = x.clone()
    if not rows.numel():
        return out
    partial, gaps = x[rows], missing[rows]
    loc, cov = components.moments()
    resp = torch.softmax(log_prob_with_missing(components, partial) + log_weights, dim=1)
    drawn = torch.multinomial(resp.cpu(), 1, generator=generator).squeeze(1).to(x.device)
    chosen = torch.nn.functional.one_hot(drawn, resp.shape[1]).to(x.dtype)
    mean = conditional_mean(MissingRows.of(partial, loc.mean(0)), chosen, loc, cov)  # centred as impute_rows
    noise = torch.randn(partial.shape, dtype=x.dtype, generator=generator).to(x.device) * gaps.to(x.dtype)
    if cov.dim() == 2:  # diagonal: given the component, the missing entries are independent of the observed ones
        spread = cov[drawn].sqrt() * noise
    else:  # P[m, m] embedded with the identity on the observed entries: L^{-T} noise has covariance P[m, m]^{-1}
        precision = torch.cholesky_inverse(torch.linalg.cholesky(cov))
        eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
        step = max(1, ROW_BLOCK_ENTRIES // x.shape[1] ** 2)
        spread = torch.cat(
            [
                _conditional_spread(precision[drawn[block]], gaps[block], noise[block], eye)
                for block in (slice(start, start + step) for start in range(0, len(rows), step))
            ]
        )
    out[rows] = torch.where(gaps, mean + spread, partial)
    return out


def _conditional_spread(
    precision: torch.Tensor, gaps: torch.Tensor, noise: torch.Tensor, eye: torch.Tensor
) -> torch.Tensor:
    """``L^{-T} noise`` ``(n, D)`` for each row's precision ``(n, D, D)``, ``L`` the Cholesky factor of its block
    ``P[m, m]`` on the missing entries ``gaps`` (the identity elsewhere, where ``noise`` is zero): a draw of the
    missing block's conditional spread, zero on the observed entries."""
    both = gaps[:, :, None] & gaps[:, None, :]
    chol = torch.linalg.cholesky(torch.where(both, precision, eye))
    return torch.linalg.solve_triangular(chol.mT, noise[:, :, None], upper=True).squeeze(2)
