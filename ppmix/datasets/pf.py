"""The synthetic settings of the prediction-focused mixtures paper (Sharma et al., 2023).

* :func:`make_pf_synthetic` — Supplement E.3: relevant features and a binary label from
  one ``K_D``-component mixture, irrelevant features from an independent one
  ("simple": ``K_D = 3``, "complex": ``K_D = 4``), with the Q3 option of irrelevant
  clusters weakly correlated with the label.
* :func:`make_two_mixture` — §6.2 (eqs. 21–24): two isotropic two-component mixtures,
  one relevant (``Y = Z_R``), one irrelevant, with given sizes and SNRs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppmix._validation import check_positive_int

__all__ = ["PFSyntheticData", "bayes_label_limits", "make_pf_synthetic", "make_two_mixture"]

#: component spacing along every feature (E.3: "the gap between successive components is fixed to 6")
COMPONENT_GAP = 6.0
#: P(Y = 1 | relevant cluster) of E.3 (complex as printed; simple inferred from F.1: middle mode is Y = 1)
PAPER_LABEL_PROBS = {"complex": (0.05, 0.95, 0.05, 0.95), "simple": (0.05, 0.95, 0.05)}


@dataclass
class PFSyntheticData:
    """Features ``X`` (N, D), binary labels ``y``, which features are relevant and the planted clusters.

    Parameters
    ----------
    X : ndarray of shape (N, D)
        The features.
    y : ndarray of shape (N,)
        The binary labels.
    relevant : ndarray of shape (D,), bool
        Which features are relevant.
    relevant_clusters, irrelevant_clusters : ndarray of shape (N,)
        Each point's cluster in the relevant and in the irrelevant features.
    label_probs : ndarray of shape (K_D,)
        ``P(Y = 1 | relevant cluster k)``.
    cluster_weights : ndarray
        The weights of the planted clusters.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> data = make_pf_synthetic(100, n_relevant=4, n_features=6, seed=0)
    >>> data.X.shape, int(data.relevant.sum()), data.label_probs.tolist()
    ((100, 6), 4, [0.05, 0.95, 0.05, 0.95])
    """

    X: np.ndarray
    y: np.ndarray
    relevant: np.ndarray  # (D,) bool
    relevant_clusters: np.ndarray  # (N,) int
    irrelevant_clusters: np.ndarray  # (N,) int
    label_probs: np.ndarray  # (K_D,) P(Y = 1 | relevant cluster)
    cluster_weights: np.ndarray  # (K_D,) weights of the relevant mixture


def _normalize(v: np.ndarray) -> np.ndarray:
    return v / v.sum()


def make_pf_synthetic(
    n_samples: int = 2000,
    *,
    kind: str = "complex",
    n_relevant: int = 20,
    n_features: int = 100,
    n_clusters: int | None = None,
    label_probs: tuple[float, ...] | None = None,
    irrelevant_correlation: float = 0.0,
    seed: int | None = 0,
) -> PFSyntheticData:
    """Draw the Synthetic (simple / complex) data of Supplement E.3.

    Relevant cluster ``k`` has weight ``(0.5 + k) / sum``, mean ``6 k`` on every relevant
    feature, unit variance and ``P(Y = 1) = label_probs[k]``; the irrelevant features come
    from an independent mixture with weights ``(1 + k) / sum``, the same means and unit
    variance. With ``irrelevant_correlation = r > 0`` (question Q3) each point's irrelevant
    cluster copies its relevant cluster with probability ``r``, so the irrelevant features
    become weakly predictive of ``Y``.

    Parameters
    ----------
    n_samples : int
    kind : {"complex", "simple"}
        ``K_D = 4`` with labels ``(0.05, 0.95, 0.05, 0.95)``, or ``K_D = 3`` with
        ``(0.05, 0.95, 0.05)``.
    n_relevant, n_features : int
        ``D_R`` and ``D = D_R + D_Ir`` (the paper: ``D = 100``, ``D_R`` in 20..80).
    n_clusters : int, optional
        Overrides ``K_D`` (then ``label_probs`` must be given).
    label_probs : tuple of float, optional
        ``P(Y = 1 | relevant cluster k)``; see :func:`bayes_label_limits` for what they imply.
    irrelevant_correlation : float in [0, 1]
    seed : int, optional

    Examples
    --------
    >>> data = make_pf_synthetic(500, kind="complex", n_relevant=20, n_features=100, seed=0)
    >>> data.X.shape, int(data.relevant.sum()), sorted(set(data.y.tolist()))
    ((500, 100), 20, [0, 1])
    """
    n = check_positive_int(n_samples, "n_samples")
    d = check_positive_int(n_features, "n_features")
    d_r = check_positive_int(n_relevant, "n_relevant")
    if kind not in PAPER_LABEL_PROBS:
        raise ValueError(f"kind must be 'complex' or 'simple'; got {kind!r}")
    if d_r > d:
        raise ValueError(f"n_relevant ({d_r}) must be at most n_features ({d})")
    probs = np.asarray(label_probs if label_probs is not None else PAPER_LABEL_PROBS[kind], dtype=float)
    k = check_positive_int(n_clusters, "n_clusters") if n_clusters is not None else len(probs)
    if probs.shape != (k,) or np.any(probs < 0) or np.any(probs > 1):
        raise ValueError(f"label_probs must hold {k} probabilities in [0, 1]; got {probs.tolist()}")
    if not 0.0 <= irrelevant_correlation <= 1.0:
        raise ValueError(f"irrelevant_correlation must be in [0, 1]; got {irrelevant_correlation}")
    rng = np.random.default_rng(seed)
    weights_r = _normalize(0.5 + np.arange(k))
    weights_ir = _normalize(1.0 + np.arange(k))
    z_r = rng.choice(k, size=n, p=weights_r)
    z_ir = rng.choice(k, size=n, p=weights_ir)
    copy = rng.random(n) < irrelevant_correlation
    z_ir = np.where(copy, z_r, z_ir)
    y = (rng.random(n) < probs[z_r]).astype(np.int64)
    x = rng.normal(size=(n, d))
    x[:, :d_r] += COMPONENT_GAP * z_r[:, None]
    x[:, d_r:] += COMPONENT_GAP * z_ir[:, None]
    relevant = np.zeros(d, dtype=bool)
    relevant[:d_r] = True
    return PFSyntheticData(x, y, relevant, z_r, z_ir, probs, weights_r)


def bayes_label_limits(data: PFSyntheticData) -> dict[str, float]:
    """Best achievable mean ``log P(Y | X)`` and AUROC when the relevant cluster is known exactly.

    The label is ``Bernoulli(label_probs[k])`` given the cluster, so no model can beat
    the predictor that outputs ``label_probs[k]``: its expected log-likelihood is minus
    the mean label entropy and its AUROC follows from the two score levels.

    Parameters
    ----------
    data : PFSyntheticData
        A draw of :func:`make_pf_synthetic`, whose planted clusters and label probabilities are read.

    Returns
    -------
    dict
        ``log_p_y_given_x`` (the best mean ``log P(Y | X)``) and ``auroc`` (the best AUROC).

    Examples
    --------
    >>> limits = bayes_label_limits(make_pf_synthetic(100, seed=0))
    >>> round(limits["log_p_y_given_x"], 3)
    -0.199
    """
    w, p = data.cluster_weights, data.label_probs
    entropy = -(np.where(p > 0, p * np.log(np.clip(p, 1e-300, None)), 0.0))
    entropy -= np.where(p < 1, (1 - p) * np.log(np.clip(1 - p, 1e-300, None)), 0.0)
    positives, negatives = w * p, w * (1 - p)
    positives, negatives = positives / positives.sum(), negatives / negatives.sum()
    auc = 0.0
    for i in range(len(p)):
        for j in range(len(p)):
            auc += positives[i] * negatives[j] * (1.0 if p[i] > p[j] else 0.5 if p[i] == p[j] else 0.0)
    return {"log_p_y_given_x": float(-(w * entropy).sum()), "auroc": float(auc)}


def make_two_mixture(
    n_samples: int = 2000,
    *,
    n_relevant: int = 2,
    n_irrelevant: int = 6,
    snr_relevant: float = 5.0,
    snr_irrelevant: float = 5.0,
    sigma: float = 1.0,
    seed: int | None = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``(X, y)`` from the §6.2 setting (eqs. 21–24).

    ``Z_R, Z_Ir ~ Bern(0.5)`` independently; ``X_R ~ N(0, s^2 I)`` if ``Z_R = 1`` else
    ``N(mu_R 1, s^2 I)`` with ``mu_R = snr_relevant * s`` (likewise ``X_Ir``), and
    ``Y = Z_R``. The columns are ``[X_R, X_Ir]``.

    Parameters
    ----------
    n_samples : int
        The number of points.
    n_relevant, n_irrelevant : int
        The numbers of relevant (``D_R``) and irrelevant (``D_Ir``) features.
    snr_relevant, snr_irrelevant : float
        The distance between the two cluster means of each group, in units of ``sigma``.
    sigma : float
        The standard deviation ``s`` of every feature within a cluster.
    seed : int or None
        The seed of NumPy's generator.

    Returns
    -------
    X : ndarray of shape (N, D_R + D_Ir)
    y : ndarray of shape (N,)

    Examples
    --------
    >>> X, y = make_two_mixture(100, n_relevant=2, n_irrelevant=6, seed=0)
    >>> X.shape, y.shape
    ((100, 8), (100,))
    """
    n = check_positive_int(n_samples, "n_samples")
    d_r, d_ir = check_positive_int(n_relevant, "n_relevant"), check_positive_int(n_irrelevant, "n_irrelevant")
    if not sigma > 0:
        raise ValueError(f"sigma must be positive; got {sigma}")
    rng = np.random.default_rng(seed)
    z_r, z_ir = rng.integers(0, 2, n), rng.integers(0, 2, n)
    x_r = (1 - z_r)[:, None] * snr_relevant * sigma + sigma * rng.normal(size=(n, d_r))
    x_ir = (1 - z_ir)[:, None] * snr_irrelevant * sigma + sigma * rng.normal(size=(n, d_ir))
    return np.concatenate([x_r, x_ir], axis=1), z_r.astype(np.int64)
