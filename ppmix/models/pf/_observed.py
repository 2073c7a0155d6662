"""Frames with missing entries (NaN, missing at random) in the pf models (``missing="marginalize"``).

Given its component and its switches a frame's features are independent: a switched-on feature from the
component's diagonal Gaussian, a switched-off one from the background's. A missing entry therefore drops its
term from every log-density, the components' (weighted by ``phi_d`` in the E-step) and the background's, and
EM's M-step, which maximises ``sum_n sum_k r_nk sum_{d observed} phi_d log N(x_nd | k)``, fits each feature's
Gaussians on the frames that observe it (weights ``r_nk o_nd``, ``o_nd`` one where ``x_nd`` is observed). The
switches of a missing entry keep their prior and entropy terms, so the update of ``phi`` (B.2.1) weighs each
feature's log-likelihood gain, summed over the frames that observe it, by all ``N`` frames: exact variational EM
of the observed entries, nothing imputed.

Frames with a missing entry are held as :class:`~ppmix.components.gaussian_missing.MissingRows` (centred at a
reference point, zero where missing, with the mask): log-densities and statistics are matrix products with
their design ``[x0 ** 2, x0, mask]``. Frames without one keep the complete path (:class:`CentredData`).

Examples
--------
>>> from ppmix.components import DiagGaussian
>>> f64 = torch.float64
>>> comp = DiagGaussian(torch.zeros(1, 2, dtype=f64), torch.ones(1, 2, dtype=f64))
>>> frames = frames_of(torch.tensor([[1.0, float("nan")]], dtype=f64))
>>> round(float(frame_log_prob(comp, frames)), 6)  # log N(1; 0, 1): the missing entry integrates out
-1.418939
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ppmix.components import DiagGaussian
from ppmix.components.centred import CentredData, padded_counts
from ppmix.components.family import DataScale, DensityFamily, Statistics, with_priors
from ppmix.components.gaussian_missing import LOG_2PI, MissingRows, design_coefficients
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.models._missing import fill_column_means

__all__ = [
    "ObservedStatistics",
    "fit_frame_statistics",
    "frame_log_prob",
    "frame_statistics",
    "frames_of",
    "map_fit_frame_statistics",
    "start_frames",
]

Frames = CentredData | MissingRows | torch.Tensor


def frames_of(x: torch.Tensor, shift: torch.Tensor | None = None) -> Frames:
    """``x`` centred at ``shift`` (default: its columns' means over their observed entries): :class:`CentredData`
    when nothing is missing, else :class:`~ppmix.components.gaussian_missing.MissingRows`."""
    if bool(torch.isnan(x).any()):
        return MissingRows.of(x, shift)
    return CentredData.from_tensor(x, shift)


def start_frames(frames: CentredData | MissingRows, weight: torch.Tensor | None = None) -> CentredData:
    """The frames a start sees (k-means, the label tests of the start): missing entries filled with their columns'
    (``weight``-ed) means over the observed entries."""
    if not isinstance(frames, MissingRows):
        return frames
    return CentredData.from_tensor(fill_column_means(frames.x, weight))


def frame_log_prob(
    components: DiagGaussian, frames: Frames, feature_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """``sum_{d observed} w_d log N(x_nd | loc_kd, scale_kd^2)`` ``(N, K)`` (every ``w_d`` one without
    ``feature_weights``); :meth:`DiagGaussian.log_prob` where nothing is missing."""
    if not isinstance(frames, MissingRows):
        return components.log_prob(frames, feature_weights=feature_weights)
    coefficients = design_coefficients(components.loc, components.variance, frames.reference)
    if feature_weights is not None:
        coefficients = coefficients * feature_weights.to(coefficients).repeat(3)
    return -0.5 * (frames.design @ coefficients.T)


@dataclass(frozen=True)
class ObservedStatistics(Statistics):
    """Diagonal Gaussian statistics of frames with missing entries: ``counts`` ``(K,)`` the components' total
    weights (every frame's), and ``cells`` the statistics of each component's observed entries of each feature
    (:class:`GaussianStatistics` over the ``K * D`` cells ``(k, d)``, each one feature wide: the weights
    ``r_nk o_nd``), which merge by Chan's update as the family's own do."""

    counts: torch.Tensor
    cells: GaussianStatistics
    absorbs_family_statistics: ClassVar[bool] = True

    @classmethod
    def of_complete(cls, stats: GaussianStatistics) -> "ObservedStatistics":
        """The statistics of complete frames (every cell weighs as its component)."""
        k, d = stats.mean.shape
        cell_counts = stats.counts[:, None].expand(k, d).reshape(-1)
        return cls(
            stats.counts, GaussianStatistics(cell_counts, stats.mean.reshape(-1, 1), stats.scatter.reshape(-1, 1))
        )

    def merge(self, other: Any) -> "ObservedStatistics":
        if isinstance(other, GaussianStatistics):
            other = ObservedStatistics.of_complete(other)
        return ObservedStatistics(self.counts + other.counts, self.cells.merge(other.cells))

    def scaled(self, factor: float) -> "ObservedStatistics":
        return ObservedStatistics(self.counts * factor, self.cells.scaled(factor))

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "ObservedStatistics":
        return ObservedStatistics(self.counts.to(dtype=dtype, device=device), self.cells.to(dtype=dtype, device=device))

    def feature_counts(self) -> torch.Tensor:
        """``sum_n r_nk o_nd`` ``(K, D)``."""
        return self.cells.counts.reshape(self.counts.shape[0], -1)


def frame_statistics(components: DiagGaussian, frames: Frames, weights: torch.Tensor) -> Statistics:
    """The components' M-step statistics of ``frames`` under ``weights`` ``(N, K)``: the family's own
    (:meth:`DiagGaussian.statistics`) where nothing is missing, else :class:`ObservedStatistics`."""
    if not isinstance(frames, MissingRows):
        return components.statistics(frames, weights)
    weights = weights.to(frames.x0)
    squares, first, seen = (weights.T @ frames.design).chunk(3, dim=1)  # each (K, D)
    counts = padded_counts(seen)
    mean_c = first / counts
    spread = (squares / counts - mean_c.square()).clamp_min(0.0)
    cells = GaussianStatistics(
        seen.reshape(-1), (mean_c + frames.reference).reshape(-1, 1), (spread * seen).reshape(-1, 1)
    )
    return ObservedStatistics(weights.sum(0), cells)


def fit_frame_statistics(components: DiagGaussian, stats: Statistics) -> torch.Tensor:
    """The components' weighted maximum-likelihood update from (merged) statistics, in place; returns the fitted
    log-likelihood of the entries fitted, ``sum_n w_nk o_nd log N(x_nd | k)`` ``(K, D)`` (no pass over the data).

    From :class:`ObservedStatistics` each feature's Gaussians are fitted on its observed entries (variance floored
    at ``reg_covar``), as :meth:`DiagGaussian.fit_statistics` fits complete frames.

    Examples
    --------
    >>> f64 = torch.float64
    >>> comp = DiagGaussian(torch.zeros(1, 2, dtype=f64), torch.ones(1, 2, dtype=f64), reg_covar=0.0)
    >>> x = torch.tensor([[0.0, 1.0], [2.0, float("nan")], [4.0, 3.0]], dtype=f64)
    >>> stats = frame_statistics(comp, frames_of(x), torch.ones(3, 1, dtype=f64))
    >>> loglik = fit_frame_statistics(comp, stats)
    >>> comp.loc.tolist(), comp.variance.round(decimals=12).tolist()  # feature 1 from its two observed entries
    ([[2.0, 2.0]], [[2.666666666667, 1.0]])
    """
    if not isinstance(stats, ObservedStatistics):
        components.fit_statistics(stats)
        return components.fitted_feature_log_likelihood(stats.counts.to(components.dtype))
    stats = stats.to(dtype=components.dtype, device=components.device)
    shape = components.loc.shape
    seen = stats.feature_counts()
    spread = stats.cells.scatter.reshape(shape) / padded_counts(seen)
    floor = torch.as_tensor(components.reg_covar, dtype=components.dtype, device=components.device)
    variance = torch.maximum(spread, floor)
    components.loc = stats.cells.mean.reshape(shape)
    components.scale = variance.sqrt()
    return -0.5 * seen * (LOG_2PI + variance.log() + spread / variance)


def map_fit_frame_statistics(
    family: DensityFamily,
    components: DiagGaussian,
    stats: Statistics,
    feature_weights: torch.Tensor,
    scale: DataScale,
) -> torch.Tensor:
    """MAP-EM's update of the components from (merged) statistics, in place: each cell ``(k, d)`` maximises ``w_d
    sum_n r_nk o_nd log N(x_nd | k) + log prior(loc_kd, scale_kd)`` (``w = feature_weights`` ``(D,)``, the ELBO's
    ``phi``: a switched-off share of the data does not count), by the family's
    :meth:`~ppmix.components.family.FamilyPriors.map_update` on the ``K * D`` one-feature cells whose statistics
    are the data's times ``w_d`` (the weighted log-likelihood of a Gaussian is its likelihood of the statistics
    scaled so), each with its feature's data scale (``scale``: the training data's, with ``mean`` and ``std``) and
    hyperparameters (``family._prior_settings``: numbers or ``(D,)``). Returns the log-likelihood of the entries
    fitted at the new values, ``sum_n r_nk o_nd log N(x_nd | k)`` ``(K, D)`` (not weighted), as
    :func:`fit_frame_statistics` does.

    Examples
    --------
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> f64 = torch.float64
    >>> comp = DiagGaussian(torch.zeros(1, 2, dtype=f64), torch.ones(1, 2, dtype=f64), reg_covar=0.0)
    >>> x = torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]], dtype=f64)
    >>> stats = frame_statistics(comp, frames_of(x), torch.ones(3, 1, dtype=f64))
    >>> family = with_priors(GaussianFamily("diag"), {"locs_loc": 0.0, "locs_scale": 1e-6})
    >>> phi, scale = torch.tensor([1.0, 0.5], dtype=f64), family.data_scale(x)
    >>> _ = map_fit_frame_statistics(family, comp, stats, phi, scale)
    >>> comp.loc.abs().max().item() < 1e-9  # pinned at the prior mean
    True
    """
    k, d = components.loc.shape
    cells = stats.cells if isinstance(stats, ObservedStatistics) else ObservedStatistics.of_complete(stats).cells
    cells = cells.to(dtype=components.dtype, device=components.device)
    weight = feature_weights.to(cells.counts).repeat(k)  # cell (k, d) is row k * D + d
    weighted = GaussianStatistics(cells.counts * weight, cells.mean, cells.scatter * weight[:, None])
    opts = {"dtype": components.dtype, "device": components.device}

    def per_cell(value: Any, name: str) -> torch.Tensor:
        try:
            return torch.as_tensor(value, **opts).expand(k, d).reshape(-1, 1)
        except RuntimeError:
            raise ValueError(
                f"{name} must be a number or broadcast to shape ({d},); got shape {tuple(torch.as_tensor(value).shape)}"
            ) from None

    settings = {key: per_cell(v, f"priors[{key!r}]") for key, v in family._prior_settings.items() if v is not None}
    cell_family = with_priors(family, settings)
    cell_scale = {name: per_cell(value, name) for name, value in scale.items()}
    cell = DiagGaussian(
        components.loc.reshape(-1, 1), components.scale.reshape(-1, 1), reg_covar=cell_scale.get("floor", 0.0)
    )
    cell_family.priors().map_update(cell, weighted, cell_scale)
    components.loc, components.scale = cell.loc.reshape(k, d), cell.scale.reshape(k, d)
    squares = cells.scatter[:, 0] + cells.counts * (cells.mean[:, 0] - cell.loc[:, 0]).square()
    variance = cell.variance[:, 0]
    return (-0.5 * (cells.counts * (LOG_2PI + variance.log()) + squares / variance)).reshape(k, d)
