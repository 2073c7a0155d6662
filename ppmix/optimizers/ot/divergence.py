"""The expected transportation divergence between two mixtures of experts (Chamroukhi & Pham, 2026, Definition 1): the
evaluation metric of the OT aggregation, solved exactly at every point with POT's ``ot.emd``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ppmix._validation import check_matrix
from ppmix.models.moe import MixtureOfExperts

__all__ = ["pointwise_transport", "transport_divergence"]


def pointwise_transport(pa: np.ndarray, pb: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Exact optimal transport cost between ``pa[s]`` and ``pb[s]`` under ``cost[s]`` for every ``s``.

    ``pa`` (S, K) and ``pb`` (S, L) are normalised row by row; ``cost`` has shape (S, K, L).

    Examples
    --------
    >>> import numpy as np
    >>> pointwise_transport(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[[0.0, 2.0], [2.0, 0.0]]]))
    array([2.])
    """
    import ot

    pa = pa / pa.sum(1, keepdims=True)
    pb = pb / pb.sum(1, keepdims=True)
    return np.array([(ot.emd(pa[s], pb[s], cost[s]) * cost[s]).sum() for s in range(cost.shape[0])])


def transport_divergence(moe_a: MixtureOfExperts, moe_b: MixtureOfExperts, X: Any) -> float:
    """Expected transportation divergence ``T_KL(a, b)`` of Definition 1, averaged over ``X``.

    At every ``x`` the exact optimal plan between the gate distributions ``pi^a(x)`` and
    ``pi^b(x)`` (both marginals) under the cost ``KL(phi_k^a(.|x) || phi_l^b(.|x))`` is
    solved with POT (``ot.emd``).

    Parameters
    ----------
    moe_a, moe_b : MixtureOfExperts
        Two fitted mixtures of experts (their numbers of experts may differ).
    X : array-like of shape (N, D)
        The covariates the divergence is averaged over.

    Returns
    -------
    float

    Examples
    --------
    >>> from ppmix.datasets.moe import make_moe
    >>> data = make_moe(50, n_experts=3, n_features=2, seed=0)
    >>> truth = data.true_model()
    >>> transport_divergence(truth, truth, data.X)
    0.0
    """
    for name, m in (("moe_a", moe_a), ("moe_b", moe_b)):
        if not isinstance(m, MixtureOfExperts):
            raise TypeError(f"{name} must be a MixtureOfExperts; got {type(m).__name__}")
        m._check_fitted()
    if moe_a._expert_family().name != moe_b._expert_family().name or moe_a.n_features_in_ != moe_b.n_features_in_:
        raise ValueError("moe_a and moe_b must have the same kind of experts and the same features")
    x, _ = check_matrix(X, "X", n_features=moe_a.n_features_in_)
    cost = moe_a.experts_.kl(moe_b.experts_, x).clamp_min(0.0)
    values = pointwise_transport(moe_a.gate_probabilities(x).numpy(), moe_b.gate_probabilities(x).numpy(), cost.numpy())
    return float(values.mean())
