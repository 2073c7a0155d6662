"""PRESTO (Sangani et al.): partition the data while training one model per part."""

from ppmix.inference.optimizers.presto.assignment import greedy_capacity_assignment
from ppmix.inference.optimizers.presto.components import LinearSVMComponent, MLPComponent, TorchComponent
from ppmix.inference.optimizers.presto.estimator import PRESTO

__all__ = ["LinearSVMComponent", "MLPComponent", "PRESTO", "TorchComponent", "greedy_capacity_assignment"]
