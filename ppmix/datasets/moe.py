"""The mixture-of-experts simulation of Chamroukhi & Pham (2026, Supplement S4.1).

``K`` clusters of covariates ``x ~ N(c_k, Sigma)`` with ``Sigma_uv = rho^|u-v|`` (``N/K``
points each), then the standard MoE generative process: ``z | x ~ softmax(x^T alpha)``
(last gate fixed to zero) and ``y | x, z = k ~ N(x^T beta_k, sigma_k^2)`` (Gaussian
experts) or ``Bernoulli(sigmoid(x^T beta_k))`` (logistic experts). Gate and expert
coefficients, intercepts and cluster centres are integers drawn uniformly in
``[-param_range, param_range]``, as in the paper; the noise variances ``sigma_k^2``
(which the paper does not specify) are integers drawn uniformly in ``[1, param_range]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ppmix._validation import check_positive_int

if TYPE_CHECKING:
    from ppmix.models.moe import MixtureOfExperts

__all__ = ["MoEData", "make_moe"]

EXPERT_KINDS = ("gaussian", "logistic")


@dataclass
class MoEData:
    """Covariates ``X``, responses ``y``, the true expert ``labels`` and the planted parameters.

    Gate parameters have the last row zero; ``scale`` is ``None`` for logistic experts.

    Parameters
    ----------
    X : ndarray of shape (N, D)
        The covariates.
    y : ndarray of shape (N,)
        The responses (real for Gaussian experts, 0/1 for logistic ones).
    labels : ndarray of shape (N,)
        The expert that generated each response.
    gate_coef, gate_intercept : ndarray of shape (K, D) and (K,)
        The softmax gate; the last row is zero.
    coef, intercept : ndarray of shape (K, D) and (K,)
        The experts' slopes and intercepts.
    scale : ndarray of shape (K,) or None
        The Gaussian experts' noise scales; ``None`` for logistic experts.
    centres : ndarray of shape (K, D)
        The centres of the covariate clusters.
    expert : {"gaussian", "logistic"}
        The kind of expert.

    Examples
    --------
    >>> from ppmix.datasets import make_moe
    >>> data = make_moe(200, seed=0)
    >>> data.X.shape, data.y.shape, data.expert
    ((200, 20), (200,), 'gaussian')
    """

    X: np.ndarray
    y: np.ndarray
    labels: np.ndarray
    gate_coef: np.ndarray
    gate_intercept: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    scale: np.ndarray | None
    centres: np.ndarray
    expert: str

    def true_model(self) -> "MixtureOfExperts":
        """The planted model as a fitted :class:`~ppmix.models.moe.MixtureOfExperts`."""
        from ppmix.models.moe import MixtureOfExperts

        return MixtureOfExperts.from_parameters(
            gate_coef=self.gate_coef,
            gate_intercept=self.gate_intercept,
            coef=self.coef,
            intercept=self.intercept,
            scale=self.scale,
        )


def make_moe(
    n_samples: int = 1000,
    *,
    expert: str = "gaussian",
    n_experts: int = 4,
    n_features: int = 20,
    rho: float = 0.25,
    param_range: int = 5,
    seed: int | None = 0,
    param_seed: int | None = None,
) -> MoEData:
    """Draw a data set from the simulation of Supplement S4.1 of Chamroukhi & Pham (2026).

    Parameters
    ----------
    n_samples : int
        Number of points; the ``K`` covariate clusters get ``n_samples // K`` points
        each (the first ``n_samples % K`` clusters one more). Rows are shuffled.
    expert : {"gaussian", "logistic"}
    n_experts, n_features : int
        ``K = 4`` and ``d = 20`` in the paper.
    rho : float
        Covariance of the covariate clusters, ``Sigma_uv = rho^|u - v|``.
    param_range : int
        Parameters and centres are integers in ``[-param_range, param_range]``.
    seed : int, optional
        Seeds the data (and the parameters unless ``param_seed`` is given).
    param_seed : int, optional
        Seeds the planted parameters separately, so that several data sets can share
        one true model.

    Returns
    -------
    MoEData

    Examples
    --------
    >>> data = make_moe(200, seed=0)
    >>> data.X.shape, data.y.shape, data.coef.shape, data.gate_coef[-1].tolist() == [0.0] * 20
    ((200, 20), (200,), (4, 20), True)
    >>> set(make_moe(100, expert="logistic", seed=1).y.tolist()) <= {0.0, 1.0}
    True
    """
    if expert not in EXPERT_KINDS:
        raise ValueError(f"expert must be one of {EXPERT_KINDS}; got {expert!r}")
    n = check_positive_int(n_samples, "n_samples")
    k = check_positive_int(n_experts, "n_experts")
    d = check_positive_int(n_features, "n_features")
    r = check_positive_int(param_range, "param_range")
    if not -1.0 < rho < 1.0:
        raise ValueError(f"rho must lie in (-1, 1); got {rho}")
    param_rng = np.random.default_rng(seed if param_seed is None else param_seed)

    def integers(*shape: int) -> np.ndarray:
        return param_rng.integers(-r, r + 1, size=shape).astype(np.float64)

    centres = integers(k, d)
    gate = np.concatenate([integers(k - 1, d + 1), np.zeros((1, d + 1))])
    beta = integers(k, d + 1)
    scale = np.sqrt(param_rng.integers(1, r + 1, size=k).astype(np.float64)) if expert == "gaussian" else None

    rng = np.random.default_rng(seed)
    lags = np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
    chol = np.linalg.cholesky(rho**lags)
    cluster = np.repeat(np.arange(k), n // k)
    cluster = np.concatenate([cluster, np.arange(n % k)])
    x = centres[cluster] + rng.standard_normal((n, d)) @ chol.T
    x = x[rng.permutation(n)]
    logits = x @ gate[:, :-1].T + gate[:, -1]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = (probs.cumsum(1) < rng.random((n, 1))).sum(1).clip(max=k - 1)
    eta = np.einsum("nd,nd->n", x, beta[labels, :-1]) + beta[labels, -1]
    if expert == "gaussian":
        y = eta + scale[labels] * rng.standard_normal(n)
    else:
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-eta))).astype(np.float64)
    return MoEData(
        X=x,
        y=y,
        labels=labels,
        gate_coef=gate[:, :-1],
        gate_intercept=gate[:, -1],
        coef=beta[:, :-1],
        intercept=beta[:, -1],
        scale=scale,
        centres=centres,
        expert=expert,
    )
