"""The baselines of the OT reduction (Chamroukhi & Pham, 2026, §5): the **Middle** estimator (the local model closest to
others in transport divergence) and the **Weighted-average** estimator (the local parameters averaged after their
expert labels are aligned), with :func:`align_experts`, the Hungarian matching of expert labels."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ppmix._validation import check_matrix
from ppmix.components import GaussianExpert
from ppmix.models.moe import MixtureOfExperts
from ppmix.optimizers.ot._local_models import check_models
from ppmix.optimizers.ot.divergence import pointwise_transport

__all__ = ["align_experts", "middle_estimator", "weighted_average_estimator"]


def middle_estimator(
    models: Sequence[MixtureOfExperts], X: Any, *, weights: Sequence[float] | None = None
) -> tuple[MixtureOfExperts, int]:
    """The local model minimising ``sum_m lambda_m T_KL(f_m, g)`` over ``g`` in the local models.

    Costs ``M^2 |X|`` small exact transport problems: pass a modest ``X`` (a few hundred rows).
    Returns the chosen model and its index.

    Parameters
    ----------
    models : sequence of MixtureOfExperts
        The local fits ``f_m``.
    X : array-like of shape (n, D)
        The covariates the transport divergences are averaged over.
    weights : sequence of float, optional
        ``lambda_m``; equal by default.

    Returns
    -------
    model : MixtureOfExperts
    index : int

    Examples
    --------
    >>> from ppmix.datasets.moe import make_moe
    >>> data = make_moe(60, n_experts=2, n_features=2, seed=0)
    >>> truth = data.true_model()
    >>> middle_estimator([truth, truth], data.X)[1]
    0
    """
    lam = np.asarray(check_models(models, weights))
    x, _ = check_matrix(X, "X", n_features=models[0].n_features_in_)
    probs = [m.gate_probabilities(x).numpy() for m in models]
    experts = [m.experts_ for m in models]
    total = np.zeros(len(models))
    for j, candidate in enumerate(experts):
        for i, source in enumerate(experts):
            if i != j:
                cost = source.kl(candidate, x).clamp_min(0.0).numpy()
                total[j] += lam[i] * pointwise_transport(probs[i], probs[j], cost).mean()
    index = int(np.argmin(total))
    return models[index], index


def align_experts(model: MixtureOfExperts, reference: MixtureOfExperts, X: Any) -> np.ndarray:
    """Permutation ``perm`` such that expert ``perm[j]`` of ``model`` matches expert ``j`` of ``reference``.

    Hungarian matching on the mean over ``X`` of ``KL(phi_k^model || phi_j^reference)``.

    Parameters
    ----------
    model, reference : MixtureOfExperts
        Two fitted mixtures of experts with the same number of experts.
    X : array-like of shape (N, D)
        The covariates the divergences are averaged over.

    Returns
    -------
    ndarray of int, shape (K,)

    Examples
    --------
    >>> from ppmix.datasets.moe import make_moe
    >>> data = make_moe(50, n_experts=3, n_features=2, seed=0)
    >>> truth = data.true_model()
    >>> align_experts(truth, truth, data.X).tolist()
    [0, 1, 2]
    """
    x, _ = check_matrix(X, "X", n_features=reference.n_features_in_)
    cost = model.experts_.kl(reference.experts_, x).mean(0).numpy()
    rows, cols = linear_sum_assignment(cost)
    perm = np.empty_like(rows)
    perm[cols] = rows
    return perm


def weighted_average_estimator(
    models: Sequence[MixtureOfExperts], X: Any, *, weights: Sequence[float] | None = None
) -> MixtureOfExperts:
    """``theta^W = sum_m lambda_m theta_m`` after aligning every model's expert labels.

    Labels are aligned to a reference — the model with the largest weight (the first
    one among ties) — by :func:`align_experts` on ``X``; then the gates (re-zeroed so
    that the last gate is zero after the permutation), expert coefficients, intercepts
    and noise variances are averaged with weights ``lambda_m``.

    Parameters
    ----------
    models : sequence of MixtureOfExperts
        The local fits, with the same number of experts and features.
    X : array-like of shape (n, D)
        The covariates the label alignment is computed on.
    weights : sequence of float, optional
        ``lambda_m``; equal by default.

    Returns
    -------
    MixtureOfExperts

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.datasets.moe import make_moe
    >>> data = make_moe(50, n_experts=2, n_features=2, seed=0)
    >>> truth = data.true_model()
    >>> avg = weighted_average_estimator([truth, truth], data.X)
    >>> bool(np.allclose(avg.coef_.numpy(), truth.coef_.numpy()))
    True
    """
    lam = check_models(models, weights)
    reference = models[int(np.argmax(lam))]
    sums: dict[str, torch.Tensor] = {}
    for w, m in zip(lam, models):
        perm = torch.as_tensor(align_experts(m, reference, X))
        gate, experts = m.gate_, m.experts_
        gate_coef, gate_intercept = gate.coef[perm], gate.intercept[perm]
        parts = {
            "gate_coef": gate_coef - gate_coef[-1],
            "gate_intercept": gate_intercept - gate_intercept[-1],
            "coef": experts.coef[perm],
            "intercept": experts.intercept[perm],
        }
        if isinstance(experts, GaussianExpert):
            parts["variance"] = experts.scale[perm].square()
        for name, value in parts.items():
            sums[name] = sums.get(name, 0) + w * value
    scale = sums.pop("variance").sqrt() if "variance" in sums else None
    return MixtureOfExperts.from_parameters(**sums, scale=scale, engine="weighted-average", expert=reference.expert)
