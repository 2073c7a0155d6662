"""Optimal-transport aggregation of mixtures of experts fitted on shards: the reduction (MM on a supporting
sample), the gate refit, the transport divergence and the Middle / Weighted-average estimators."""

from ppmix.optimizers.ot.baselines import align_experts, middle_estimator, weighted_average_estimator
from ppmix.optimizers.ot.divergence import transport_divergence
from ppmix.optimizers.ot.reduction import ot_reduce

__all__ = ["align_experts", "middle_estimator", "ot_reduce", "transport_divergence", "weighted_average_estimator"]
