"""Sample weights: prepared data with one weight per observation unit (a row, a sequence).

A model that takes ``sample_weight`` names its unit (:meth:`~ppmix.models.base.MixtureModel.sample_weight_units`);
``fit`` checks the weights against the data and hands the EM engine :class:`Weighted` data, which the model's
hooks unwrap with :func:`split_weights`. The semantics are scikit-learn's: an integer weight is the row repeated
that many times, a zero weight drops the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Weighted", "check_sample_weight", "split_weights"]


@dataclass(frozen=True)
class Weighted:
    """Prepared data and the weights ``(n_units,)`` of its observation units."""

    data: Any
    weight: torch.Tensor


def split_weights(data: Any) -> tuple[Any, torch.Tensor | None]:
    """``(data, weights)`` of :class:`Weighted` data, ``(data, None)`` of any other.

    Examples
    --------
    >>> split_weights(Weighted("rows", torch.ones(2)))[1].tolist(), split_weights("rows")
    ([1.0, 1.0], ('rows', None))
    """
    if isinstance(data, Weighted):
        return data.data, data.weight
    return data, None


def check_sample_weight(
    sample_weight: Any, n_units: int, unit: str, *, dtype: torch.dtype, device: torch.device, min_positive: int = 1
) -> torch.Tensor:
    """``sample_weight`` as a tensor ``(n_units,)``, or a ``ValueError``/``TypeError`` naming it.

    One finite, non-negative number per ``unit``; at least ``min_positive`` of them positive (e.g. one
    per component: a mixture of K components needs K rows it can see).

    Examples
    --------
    >>> check_sample_weight([1, 2], 2, "row", dtype=torch.float64, device=torch.device("cpu")).tolist()
    [1.0, 2.0]
    >>> check_sample_weight([1, -2], 2, "row", dtype=torch.float64, device=torch.device("cpu"))
    Traceback (most recent call last):
    ...
    ValueError: sample_weight must be finite and non-negative; entry 1 is -2.0
    """
    if isinstance(sample_weight, torch.Tensor):
        values = sample_weight.detach().cpu().numpy()
    else:
        try:
            values = np.asarray(sample_weight)
        except Exception as err:  # ragged lists and the like
            kind = type(sample_weight).__name__
            raise TypeError(f"sample_weight must be a 1-D array of numbers; got {kind}") from err
    if values.dtype.kind not in "biuf":
        raise TypeError(f"sample_weight must be numeric; got dtype {values.dtype}")
    values = values.astype(np.float64, copy=False)
    if values.ndim != 1 or values.shape[0] != n_units:
        raise ValueError(f"sample_weight must have one entry per {unit} ({n_units}); got shape {values.shape}")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise ValueError(f"sample_weight must be finite and non-negative; entry {bad[0]} is {values[bad[0]]}")
    positive = int(np.count_nonzero(values))
    if positive == 0:
        raise ValueError(f"sample_weight must not be zero for every {unit}: zero weights drop {unit}s")
    if positive < min_positive:
        raise ValueError(
            f"sample_weight must give {min_positive} {unit}(s) a positive weight (one per component); "
            f"{positive} have one"
        )
    return torch.as_tensor(np.ascontiguousarray(values), dtype=dtype, device=device)
