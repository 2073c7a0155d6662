"""Data prepared once per fit for the Gaussian families.

Centring by a point near the data before forming second moments keeps the
``E[x^2] - E[x]^2`` algebra accurate (also in float32); the prepared object is
reused by every E- and M-step of a fit, so derived arrays are built only once.

The algebra is exact for any centre, so the centre only sets the rounding. A fit centres
its training data at their column mean; predictions centre at a point the fitted model
fixes (the families' ``reference``, the mean of the component means), never at the mean
of the batch, so that a row's prediction depends on that row and the model only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class CentredData:
    """Feature matrix ``x`` with its column mean ``shift`` and ``x - shift`` cached."""

    x: torch.Tensor
    shift: torch.Tensor
    centred: torch.Tensor
    _moments: torch.Tensor | None = field(default=None, repr=False)
    _outer: torch.Tensor | None = field(default=None, repr=False)
    _max_square: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def from_tensor(cls, x: torch.Tensor, shift: torch.Tensor | None = None) -> "CentredData":
        """Centre ``x`` at ``shift`` (default: its column mean, for training data).

        Examples
        --------
        >>> data = CentredData.from_tensor(torch.tensor([[1.0], [3.0]]))
        >>> data.shift.tolist(), data.centred.ravel().tolist()
        ([2.0], [-1.0, 1.0])
        >>> CentredData.from_tensor(torch.tensor([[1.0]]), shift=torch.tensor([0.5])).centred.item()
        0.5
        """
        shift = x.mean(dim=0) if shift is None else shift.to(dtype=x.dtype, device=x.device)
        return cls(x=x, shift=shift, centred=x - shift)

    @property
    def n_samples(self) -> int:
        return int(self.x.shape[0])

    @property
    def moments(self) -> torch.Tensor:
        """``[x - shift, (x - shift)^2]`` as one ``[N, 2D]`` matrix (built on first use; :attr:`centred`
        then becomes a view of its first ``D`` columns, so the centred data are held once)."""
        if self._moments is None:
            d = self.centred.shape[1]
            moments = self.centred.new_empty(self.centred.shape[0], 2 * d)
            moments[:, :d] = self.centred
            moments[:, d:] = self.centred.square()
            self._moments, self.centred = moments, moments[:, :d]
        return self._moments

    @property
    def max_square(self) -> torch.Tensor:
        """``max_n (x_nd - shift_d)^2`` per feature, ``(D,)``: the size of the terms the
        moment products cancel (built on first use)."""
        if self._max_square is None:
            self._max_square = (
                self.centred.square().amax(dim=0) if self.n_samples else self.shift.new_zeros(self.shift.shape)
            )
        return self._max_square

    def outer_moments_bytes(self) -> int:
        """Memory :attr:`outer_moments` needs."""
        n, d = self.centred.shape
        return n * (d + d * (d + 1) // 2) * self.centred.element_size()

    @property
    def outer_moments(self) -> torch.Tensor:
        """``[x - shift, (x_i - s_i)(x_j - s_j) for i <= j]`` as ``[N, D + D(D+1)/2]`` (built on first use)."""
        if self._outer is None:
            rows, cols = upper_triangle(self.centred.shape[1], self.centred.device)
            self._outer = torch.cat([self.centred, self.centred[:, rows] * self.centred[:, cols]], dim=1)
        return self._outer


def upper_triangle(d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column indices of the upper triangle (diagonal included) of a ``d x d`` matrix."""
    rows, cols = torch.triu_indices(d, d, device=device)
    return rows, cols


def as_centred(
    data: torch.Tensor | CentredData,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    shift: torch.Tensor | None = None,
) -> CentredData:
    """Return ``data`` prepared in ``dtype`` on ``device`` (no copy when it already is).

    Prepared data keep their centre; a plain tensor is centred at ``shift`` (default: its
    column mean).
    """
    if isinstance(data, CentredData):
        if (dtype is None or data.x.dtype == dtype) and (device is None or data.x.device == device):
            return data
        data, shift = data.x, data.shift
    data = torch.as_tensor(data)
    if data.dim() != 2:
        raise ValueError("data must be a 2-D tensor (n_samples, n_features)")
    return CentredData.from_tensor(data.to(dtype=dtype, device=device), shift)


def cancellation_tol(dtype: torch.dtype) -> float:
    """The largest relative rounding error tolerated where the moment algebra cancels, in ``dtype``.

    Half the significant digits (``sqrt(eps)``: 1.5e-8 in float64, 3.5e-4 in float32):
    log-densities (in nats) and variances whose moment products would cancel more are
    computed directly instead. This happens only for components far from the centre or
    collapsed at the floor, so the fast path stays the rule, in float32 too.

    Examples
    --------
    >>> cancellation_tol(torch.float64) < 2e-8 < cancellation_tol(torch.float32)
    True
    """
    return math.sqrt(torch.finfo(dtype).eps)


def inexact_spreads(second: torch.Tensor, spread: torch.Tensor) -> list[int]:
    """Components whose spread ``second - mean^2`` (per component, ``(K,)``: a variance or a trace of
    covariances about the centre) lost more than :func:`cancellation_tol` of its digits to rounding.

    ``second`` is the weighted mean square about the centre, whose rounding the difference inherits.

    Examples
    --------
    >>> inexact_spreads(torch.tensor([2.0, 1e20], dtype=torch.float64), torch.tensor([1.0, 1e-5], dtype=torch.float64))
    [1]
    """
    eps = torch.finfo(second.dtype).eps
    return torch.nonzero(eps * second > cancellation_tol(second.dtype) * spread).flatten().tolist()


def component_counts(weights: torch.Tensor) -> torch.Tensor:
    """Effective number of points per component, kept away from zero."""
    return padded_counts(weights.sum(dim=0))


def padded_counts(counts: torch.Tensor) -> torch.Tensor:
    """Total weights ``(K,)`` kept away from zero, so that an empty component divides safely."""
    return counts + 10 * torch.finfo(counts.dtype).eps


def as_floor(reg_covar: float | torch.Tensor) -> float | torch.Tensor:
    """The variance floor of a Gaussian family: a scalar as ``float``, a per-feature floor ``(D,)`` as a tensor."""
    if isinstance(reg_covar, torch.Tensor) and reg_covar.numel() > 1:
        return reg_covar.detach()
    return float(reg_covar)
