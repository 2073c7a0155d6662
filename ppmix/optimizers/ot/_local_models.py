"""The check of the fitted local mixtures of experts that the OT aggregation and its baselines combine, and of
their weights ``lambda_m``."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ppmix.models.moe import MixtureOfExperts

__all__ = ["check_models"]


def check_models(models: Sequence[MixtureOfExperts], weights: Sequence[float] | None) -> list[float]:
    """Check that ``models`` are fitted MoEs with the same experts and features; their normalised weights.

    ``weights=None`` gives equal weights.
    """
    if len(models) == 0:
        raise ValueError("models is empty: give at least one fitted MixtureOfExperts")
    for i, m in enumerate(models):
        if not isinstance(m, MixtureOfExperts):
            raise TypeError(f"models[{i}] must be a MixtureOfExperts; got {type(m).__name__}")
        m._check_fitted()
    first = models[0]
    for i, m in enumerate(models):
        kind, first_kind = m._expert_family().name, first._expert_family().name
        if (m.n_experts, kind, m.n_features_in_) != (first.n_experts, first_kind, first.n_features_in_):
            raise ValueError(
                f"models[{i}] has {m.n_experts} {kind} experts on {m.n_features_in_} features; "
                f"models[0] has {first.n_experts} {first_kind} experts on {first.n_features_in_}"
            )
    if weights is None:
        return [1.0 / len(models)] * len(models)
    lam = np.asarray(weights, dtype=np.float64)
    if lam.shape != (len(models),) or not np.isfinite(lam).all() or (lam < 0).any() or lam.sum() <= 0:
        raise ValueError(f"weights must be {len(models)} non-negative finite numbers with a positive sum")
    return (lam / lam.sum()).tolist()
