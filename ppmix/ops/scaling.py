"""Per-feature standardisation shared by the estimators that fit on standardised data (MoE, PRESTO)."""

from __future__ import annotations

import torch

__all__ = ["feature_scales"]


def feature_scales(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means and standard deviations of ``x`` ``(N, D)``, each ``(D,)``.

    A constant column (or a single row) gets the scale one, so ``(x - mean) / scale``
    is always finite; any other scale is the column's own (unbiased) standard deviation, however
    small, so that standardised data are the same for ``x`` and ``c * x`` at any ``c > 0``.

    Examples
    --------
    >>> mean, scale = feature_scales(torch.tensor([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]]))
    >>> mean.tolist(), scale.tolist()
    ([3.0, 5.0], [2.0, 1.0])
    >>> round(feature_scales(torch.tensor([[0.0], [4e-200]], dtype=torch.float64))[1].item() / 4e-200, 12)
    0.707106781187
    """
    mean = x.mean(0)
    if x.shape[0] < 2:
        return mean, torch.ones_like(mean)
    deviation = x - mean
    # divide by a power of two near the largest deviation (exact) so the squares cannot underflow or overflow
    largest = deviation.abs().amax(0)
    unit = torch.where(largest > 0, torch.exp2(torch.floor(torch.log2(largest))), torch.ones_like(largest))
    scale = (deviation / unit).std(0) * unit
    return mean, torch.where(scale > 0, scale, torch.ones_like(scale))
