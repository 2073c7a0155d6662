"""Inference: engines that fit a model (EM, SVI, MCMC, forward–backward, Gibbs) and the optimizers
that are not generative models (PRESTO, Regularized Weighting, the OT reduction of mixtures of experts).

The layers: :mod:`ppmix.inference.engines` sits below :mod:`ppmix.models` (models call the
engines through a small protocol); :mod:`ppmix.inference.optimizers` sits above it (the OT
reduction builds a :class:`~ppmix.models.MixtureOfExperts`). The names below load on first use.

Examples
--------
>>> from ppmix.inference import project_simplex
>>> import torch
>>> project_simplex(torch.tensor([[0.9, 0.4, -1.0]], dtype=torch.float64))
tensor([[0.7500, 0.2500, 0.0000]], dtype=torch.float64)
"""

from ppmix._lazy import lazy_exports

_ENGINES = "ppmix.inference.engines"
_PRESTO = "ppmix.inference.optimizers.presto"
_RW = "ppmix.inference.optimizers.rw"
_OT = "ppmix.inference.optimizers.ot"
_EXPORTS = {
    **dict.fromkeys(
        ["ConvergenceWarning", "FitResult", "ForwardBackwardResult", "forward_backward", "viterbi"], _ENGINES
    ),
    **dict.fromkeys(["run_em", "run_gibbs", "run_mcmc", "run_svi"], _ENGINES),
    "ChainsDisagreeWarning": "ppmix.inference.engines.draws",
    "project_simplex": "ppmix.ops.simplex",
    **dict.fromkeys(
        ["PRESTO", "greedy_capacity_assignment", "LinearSVMComponent", "MLPComponent", "TorchComponent"], _PRESTO
    ),
    **dict.fromkeys(
        [
            "RegularizedWeighting",
            "WeightStepResult",
            "joint_loss",
            "solve_weights",
            "GaussianLearner",
            "RegressionLearner",
            "SquaredDistanceLearner",
            "SubspaceLearner",
            "WeightedLearner",
        ],
        _RW,
    ),
    **dict.fromkeys(
        ["align_experts", "middle_estimator", "ot_reduce", "transport_divergence", "weighted_average_estimator"], _OT
    ),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
