"""Inference, the public face: one import for the engines that fit a model (EM, SVI, MCMC, Gibbs), the
algorithms they run (forward–backward, Viterbi, the simplex projection) and the optimizers that are not generative
models (PRESTO, Regularized Weighting, the OT reduction of mixtures of experts).

The names below load on first use from the folders that hold them, one per layer: :mod:`ppmix.algorithms` (below
every family and engine), :mod:`ppmix.engines` (below :mod:`ppmix.models`; models call the engines through a small
protocol) and :mod:`ppmix.optimizers` (above :mod:`ppmix.models`: the OT reduction builds a
:class:`~ppmix.models.MixtureOfExperts`).

Examples
--------
>>> from ppmix.inference import project_simplex
>>> import torch
>>> project_simplex(torch.tensor([[0.9, 0.4, -1.0]], dtype=torch.float64))
tensor([[0.7500, 0.2500, 0.0000]], dtype=torch.float64)
"""

from ppmix._lazy import lazy_exports

_ENGINES = "ppmix.engines"
_FORWARD_BACKWARD = "ppmix.algorithms.forward_backward"
_PRESTO = "ppmix.optimizers.presto"
_RW = "ppmix.optimizers.rw"
_OT = "ppmix.optimizers.ot"
_EXPORTS = {
    **dict.fromkeys(
        ["ConvergenceWarning", "FitResult", "run_em", "run_gibbs", "run_mcmc", "run_svi", "run_vb"], _ENGINES
    ),
    **dict.fromkeys(["ForwardBackwardResult", "forward_backward", "viterbi"], _FORWARD_BACKWARD),
    "ChainsDisagreeWarning": "ppmix.engines.draws",
    "SingleChainWarning": "ppmix.engines.chain_starts",
    "project_simplex": "ppmix.algorithms.simplex",
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
