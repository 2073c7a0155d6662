"""PRESTO (Sangani et al.): partition the data while training one model per part."""

from ppmix.optimizers.presto.assignment import greedy_capacity_assignment
from ppmix.optimizers.presto.components import LinearSVMComponent, MLPComponent, TorchComponent
from ppmix.optimizers.presto.estimator import PRESTO

__all__ = ["LinearSVMComponent", "MLPComponent", "PRESTO", "TorchComponent", "greedy_capacity_assignment"]
