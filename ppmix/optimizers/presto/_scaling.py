"""PRESTO's internal standardisation: the scales fitted on the training data, applied to new data, saved and
checked on load (``PRESTO(standardize=True)``; the identity with ``standardize=False``)."""

from __future__ import annotations

import torch

from ppmix.ops.scaling import feature_scales

__all__ = ["load_scales", "scale_tensors", "standardise_x", "standardise_y", "training_scales"]

#: the entries of ``PRESTO.scales_``
SCALE_NAMES = ("x_mean", "x_scale", "y_mean", "y_scale")


def training_scales(
    x: torch.Tensor, y: torch.Tensor, *, standardize: bool, scale_y: bool, weight: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Column means and scales of ``x`` ``(P,)``, and of ``y`` when ``scale_y`` (labels stay in {0, 1}); with row
    ``weight`` (``sample_weight``), those of the rows repeated (:func:`~ppmix.ops.scaling.feature_scales`).

    Examples
    --------
    >>> scales = training_scales(torch.tensor([[0.0], [2.0]]), torch.tensor([1.0, 3.0]), standardize=True, scale_y=True)
    >>> [round(scales[name].flatten()[0].item(), 4) for name in SCALE_NAMES]
    [1.0, 1.4142, 2.0, 1.4142]
    """
    zero, one = x.new_zeros(()), x.new_ones(())
    x_mean, x_scale = feature_scales(x, weight) if standardize else (x.new_zeros(x.shape[1]), x.new_ones(x.shape[1]))
    y_mean, y_scale = (v[0] for v in feature_scales(y[:, None], weight)) if standardize and scale_y else (zero, one)
    return {"x_mean": x_mean, "x_scale": x_scale, "y_mean": y_mean, "y_scale": y_scale}


def standardise_x(x: torch.Tensor, scales: dict[str, torch.Tensor]) -> torch.Tensor:
    return (x - scales["x_mean"]) / scales["x_scale"]


def standardise_y(y: torch.Tensor, scales: dict[str, torch.Tensor]) -> torch.Tensor:
    return (y - scales["y_mean"]) / scales["y_scale"]


def scale_tensors(scales: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors a save writes (``scales.<name>``, on the CPU)."""
    return {f"scales.{name}": value.detach().cpu() for name, value in scales.items()}


def load_scales(
    tensors: dict[str, torch.Tensor], n_features: int, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """The scales of a save, checked: finite, ``(P,)`` for ``x``, scalars for ``y``."""
    scales = {}
    for name in SCALE_NAMES:
        value = tensors[f"scales.{name}"].to(dtype=dtype, device=device)
        expected = (n_features,) if name.startswith("x") else ()
        if value.shape != expected or not torch.isfinite(value).all():
            raise ValueError(f"saved scales.{name} must be finite with shape {expected}; got {tuple(value.shape)}")
        scales[name] = value
    return scales
