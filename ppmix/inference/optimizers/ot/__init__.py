"""Optimal-transport aggregation of mixtures of experts fitted on shards: the reduction (MM on a supporting
sample), the gate refit, the transport divergence and the Middle / Weighted-average estimators."""

from ppmix.inference.optimizers.ot.reduction import (
    align_experts,
    middle_estimator,
    ot_reduce,
    transport_divergence,
    weighted_average_estimator,
)

__all__ = ["align_experts", "middle_estimator", "ot_reduce", "transport_divergence", "weighted_average_estimator"]
