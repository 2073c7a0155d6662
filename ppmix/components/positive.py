"""Positive data prepared once per fit with their logarithms, and the base of the families that model them
(gamma, log-normal).

Both families' log-densities and statistics read ``log x`` as well as ``x``; :class:`LogData` forms the
logarithms once per fit (or per prediction), centred as Gaussian data (:class:`~ppmix.components.centred.CentredData`)
so that the log-normal's Gaussian algebra on ``log x`` runs unchanged and the k-means start clusters the rows on
the log scale, where components that differ in scale are apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ppmix._validation import InvalidDataError
from ppmix.components.centred import CentredData
from ppmix.components.family import DensityFamily, PreparedRows

__all__ = ["LogData", "LogDataFamily", "as_log_data", "check_positive"]


@dataclass
class LogData(PreparedRows):
    """Positive rows ``x`` ``(N, D)`` and their logarithms ``log``, centred (``log.x`` is ``log x``).

    Examples
    --------
    >>> data = LogData.from_tensor(torch.tensor([[1.0], [100.0]], dtype=torch.float64))
    >>> [round(v, 4) for v in data.log.x.ravel().tolist()], [round(v, 4) for v in data.log.centred.ravel().tolist()]
    ([0.0, 4.6052], [-2.3026, 2.3026])
    """

    x: torch.Tensor
    log: CentredData

    @classmethod
    def from_tensor(cls, x: torch.Tensor, shift: torch.Tensor | None = None) -> "LogData":
        """``x`` with ``log x`` centred at ``shift`` (default: the column mean of ``log x``)."""
        return cls(x=x, log=CentredData.from_tensor(x.log(), shift))

    @property
    def n_samples(self) -> int:
        return int(self.x.shape[0])

    @property
    def rows(self) -> torch.Tensor:
        return self.x

    @property
    def start_points(self) -> torch.Tensor:
        """The centred logarithms, where components of different scales are apart."""
        return self.log.centred


def as_log_data(
    data: torch.Tensor | LogData,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    shift: torch.Tensor | None = None,
) -> LogData:
    """``data`` prepared in ``dtype`` on ``device`` (no copy when it already is); a plain tensor of positive rows
    has its logarithms centred at ``shift`` (default: their column mean).

    Examples
    --------
    >>> as_log_data(torch.ones(3, 2), torch.float64).log.x.dtype
    torch.float64
    """
    if isinstance(data, LogData):
        if (dtype is None or data.x.dtype == dtype) and (device is None or data.x.device == device):
            return data
        data, shift = data.x, data.log.shift
    data = torch.as_tensor(data)
    if data.dim() != 2:
        raise ValueError("data must be a 2-D tensor (n_samples, n_features)")
    return LogData.from_tensor(data.to(dtype=dtype, device=device), shift)


def check_positive(x: torch.Tensor, family: str, name: str = "X") -> None:
    """Refuse data with a zero, negative or infinite entry, naming ``name`` (the support of ``family``).

    Examples
    --------
    >>> check_positive(torch.tensor([[1.0], [0.0]]), "gamma")
    Traceback (most recent call last):
    ...
    ppmix._validation.InvalidDataError: X must be positive (and finite) for the gamma family; it holds 0.0
    """
    outside = ~((x > 0) & torch.isfinite(x))
    if bool(outside.any()):
        raise InvalidDataError(
            f"{name} must be positive (and finite) for the {family} family; it holds {float(x[outside][0])}"
        )


class LogDataFamily(DensityFamily):
    """Base of the families of positive data: they refuse data outside ``(0, inf)``, take :class:`LogData` as
    EM data and start k-means on the centred logarithms, where components of different scales are apart."""

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        check_positive(x, self.name, name)

    def prepare(self, x: torch.Tensor, components: Any = None) -> LogData:
        return LogData.from_tensor(x)
