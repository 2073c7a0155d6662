"""Sample weights: prepared data with one weight per observation unit (a row, a sequence).

A model that takes ``sample_weight`` names its unit (:meth:`~ppmix.models.base.MixtureModel._sample_weight_units`);
``fit`` checks the weights against the data and hands the EM engine a :class:`~ppmix.models.batch.Batch` of the data
and their weights, which the model's hooks read (``batch.weight``; :func:`split_weights` for hooks that take the data
and the weights apart). The semantics are scikit-learn's: an integer weight is the row repeated
that many times, a zero weight drops the row. So a fit without a prior (or penalty) depends on the weights'
ratios only: scaling every weight by a positive constant changes nothing, whatever the constant (1e-300 or 1e300)
and dtype, as weights far from one are brought near it by an exact power of two (:func:`in_safe_range`); with a
prior, the weights' total is the amount of data it is weighed against, as repeated rows would be.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ppmix.models.batch import as_batch

__all__ = ["SAFE_EXPONENT", "check_sample_weight", "in_safe_range", "split_weights"]

#: weights whose mean (over the positive ones) lies within ``2**±SAFE_EXPONENT`` are used as given, frequencies as
#: scikit-learn's; beyond, they are rescaled by an exact power of two to a mean in ``[1, 2)``
SAFE_EXPONENT = 10


def split_weights(data: Any) -> tuple[Any, torch.Tensor | None]:
    """``(data, weights)`` of a :class:`~ppmix.models.batch.Batch`, ``(data, None)`` of any other prepared data.

    Examples
    --------
    >>> from ppmix.models.batch import Batch
    >>> split_weights(Batch("rows", torch.ones(2)))[1].tolist(), split_weights("rows")
    ([1.0, 1.0], ('rows', None))
    """
    batch = as_batch(data)
    return batch.data, batch.weight


def check_sample_weight(
    sample_weight: Any,
    n_units: int,
    unit: str,
    *,
    dtype: torch.dtype,
    device: torch.device,
    min_positive: int = 1,
    rescale: bool = False,
) -> torch.Tensor:
    """``sample_weight`` as a tensor ``(n_units,)``, or a ``ValueError``/``TypeError`` naming it.

    One finite, non-negative number per ``unit``; at least ``min_positive`` of them positive (e.g. one
    per component: a mixture of K components needs K rows it can see). With ``rescale``, weights whose mean is
    far from one (beyond ``2**±SAFE_EXPONENT``) are first multiplied by a power of two (:func:`in_safe_range`),
    so that the tensor's dtype holds them (no overflow of 1e39 or underflow of 1e-50 in float32) and the fit's
    guards against empty components (``10 eps`` added to a count) stay negligible beside their counts.

    Examples
    --------
    >>> check_sample_weight([1, 2], 2, "row", dtype=torch.float64, device=torch.device("cpu")).tolist()
    [1.0, 2.0]
    >>> check_sample_weight([1, -2], 2, "row", dtype=torch.float64, device=torch.device("cpu"))
    Traceback (most recent call last):
    ...
    ValueError: sample_weight must be finite and non-negative; entry 1 is -2.0
    >>> weight = check_sample_weight([0, 1e-300, 3e-300], 3, "row", dtype=torch.float32, device=torch.device("cpu"),
    ...                              rescale=True)
    >>> round(float(weight[2] / weight[1]), 6), bool(1 <= weight[1:].mean() < 2)
    (3.0, True)
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
    if rescale and values.any():
        values = in_safe_range(values)
    weight = torch.as_tensor(np.ascontiguousarray(values), dtype=dtype, device=device)
    positive = int(torch.count_nonzero(weight))
    if positive == 0:
        raise ValueError(f"sample_weight must not be zero for every {unit}: zero weights drop {unit}s")
    if positive < min_positive:
        raise ValueError(
            f"sample_weight must give {min_positive} {unit}(s) a positive weight (one per component); "
            f"{positive} have one"
        )
    return weight


def in_safe_range(values: np.ndarray) -> np.ndarray:
    """Non-negative float64 ``values`` (not all zero) as they are where the mean of the positive ones lies within
    ``2**±SAFE_EXPONENT``; beyond, multiplied by the power of two that brings that mean into ``[1, 2)``: exact, so
    ties and integer ratios survive, and every ratio is kept.

    Examples
    --------
    >>> scaled = in_safe_range(np.array([0.0, 1e-300, 3e-300]))
    >>> bool(1 <= scaled[1:].mean() < 2), round(float(scaled[2] / scaled[1]), 12)
    (True, 3.0)
    >>> in_safe_range(np.array([0.0, 2.0, 5.0])).tolist()
    [0.0, 2.0, 5.0]
    """
    largest = values.max()
    mean = largest * (values / largest)[values > 0].mean()  # no overflow of the sum
    exponent = math.frexp(mean)[1] - 1  # mean = m * 2**exponent, 1 <= m < 2
    return values if abs(exponent) <= SAFE_EXPONENT else np.ldexp(values, -exponent)
