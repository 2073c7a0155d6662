"""The HMM simulation of the prediction-focused mixtures paper (Sharma et al., 2023, Supplement E.4)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppmix._validation import check_positive_int

__all__ = ["PFHMMSyntheticData", "make_pf_hmm_synthetic"]

#: distance between the emission means of successive states on every feature (E.4: ``N(6k 1, I)``)
STATE_GAP = 6.0
#: ``P(Y_t = 1 | relevant state k)`` of E.4
PAPER_LABEL_PROBS = (0.05, 0.95, 0.05, 0.95)
#: initial-state probabilities ``theta^R = theta^Ir`` of E.4
PAPER_INITIAL = (0.1, 0.2, 0.3, 0.4)


@dataclass
class PFHMMSyntheticData:
    """Sequences ``X`` (list of ``(T_n, D)``), per-step labels ``y``, the relevant features and the planted chains.

    Parameters
    ----------
    X : list of ndarray of shape (T_n, D)
        The sequences of features.
    y : list of ndarray of shape (T_n,)
        The per-step binary labels.
    relevant : ndarray of shape (D,), bool
        The relevant features (the first ``n_relevant``).
    relevant_states, irrelevant_states : list of ndarray of shape (T_n,)
        The hidden states of the relevant and the irrelevant chain, per sequence.
    label_probs : ndarray of shape (K,)
        ``P(y = 1 | relevant state k)``.
    initial : ndarray of shape (K,)
        The initial-state distribution, shared by both chains.
    transition_relevant, transition_irrelevant : ndarray of shape (K, K)
        The transition matrices of the two chains.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_hmm_synthetic
    >>> data = make_pf_hmm_synthetic(5, length=10, n_relevant=2, n_features=4, seed=0)
    >>> len(data.X), data.X[0].shape, data.relevant.tolist()
    (5, (10, 4), [True, True, False, False])
    """

    X: list[np.ndarray]
    y: list[np.ndarray]
    relevant: np.ndarray  # (D,) bool: the first n_relevant features
    relevant_states: list[np.ndarray]  # (T_n,) int per sequence
    irrelevant_states: list[np.ndarray]
    label_probs: np.ndarray  # (K,)
    initial: np.ndarray  # (K,) theta, shared by both chains
    transition_relevant: np.ndarray  # (K, K) A^R
    transition_irrelevant: np.ndarray  # (K, K) A^Ir


def _transition(offset: float, n_states: int, rng: np.random.Generator) -> np.ndarray:
    """``normalize_row(offset + Z + I)``, the rows of ``Z`` one-hot draws from ``Cat(1/K)``."""
    jumps = np.eye(n_states)[rng.integers(0, n_states, size=n_states)]
    rows = offset + jumps + np.eye(n_states)
    return rows / rows.sum(1, keepdims=True)


def _chain(initial: np.ndarray, transition: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    states = np.empty(length, dtype=np.int64)
    states[0] = rng.choice(len(initial), p=initial)
    for t in range(1, length):
        states[t] = rng.choice(len(initial), p=transition[states[t - 1]])
    return states


def make_pf_hmm_synthetic(
    n_sequences: int = 200,
    length: int | tuple[int, int] = 20,
    *,
    n_relevant: int = 2,
    n_features: int = 20,
    n_states: int = 4,
    label_probs: tuple[float, ...] = PAPER_LABEL_PROBS,
    initial: tuple[float, ...] | None = None,
    seed: int | None = 0,
) -> PFHMMSyntheticData:
    """Draw the pf-HMM simulation of Supplement E.4.

    Two independent ``K``-state HMMs with the same initial probabilities
    ``theta = (.1, .2, .3, .4)``: the relevant one emits the first ``n_relevant``
    features and the label, the irrelevant one the other ``n_features - n_relevant``.
    State ``k`` (``k = 0..K-1``) emits ``N(6k 1, I)`` on its block and, for the relevant
    chain, ``y_t ~ Bern(label_probs[k])``.

    The transition matrices are printed garbled in the seed; the reading used here is
    ``A^R = normalize_row(0.1 + Z + I)`` and ``A^Ir = normalize_row(0.01 + Z' + I)``,
    where row ``i`` of ``Z`` (and of ``Z'``, drawn independently) is a one-hot vector
    ``z_i ~ Cat(1/K)``: each state keeps itself with extra weight 1, jumps to one random
    state with extra weight 1 (itself again if ``z_i`` picks it) and reaches every state
    with a small floor (0.1 for the relevant chain, 0.01 for the irrelevant one). The
    matrices are drawn from ``seed`` together with the sequences, so take train and test
    sequences from one call (split the list) when they must share the chains.

    Parameters
    ----------
    n_sequences : int
    length : int or (min, max)
        Length of every sequence, or inclusive bounds of uniformly drawn lengths.
    n_relevant, n_features : int
        ``D_R`` and ``D = D_R + D_Ir`` (the paper: ``D = 20``, ``D_R`` in {2, 3, 4, 5, 8, 12, 20}).
    n_states : int
        ``K`` of both chains (the paper: 4).
    label_probs : tuple of float
        ``P(Y = 1 | relevant state k)``, one per state.
    initial : tuple of float, optional
        ``theta``; default ``(.1, .2, .3, .4)`` for ``K = 4``, uniform otherwise.
    seed : int, optional

    Returns
    -------
    PFHMMSyntheticData

    Examples
    --------
    >>> data = make_pf_hmm_synthetic(5, length=(3, 8), n_relevant=2, n_features=6, seed=0)
    >>> len(data.X), data.X[0].shape[1], data.relevant.tolist()
    (5, 6, [True, True, False, False, False, False])
    >>> all(len(x) == len(y) and 3 <= len(x) <= 8 for x, y in zip(data.X, data.y))
    True
    """
    n = check_positive_int(n_sequences, "n_sequences")
    k = check_positive_int(n_states, "n_states")
    d = check_positive_int(n_features, "n_features")
    d_r = check_positive_int(n_relevant, "n_relevant")
    if d_r > d:
        raise ValueError(f"n_relevant={d_r} is larger than n_features={d}")
    if isinstance(length, (tuple, list)):
        if len(length) != 2:
            raise ValueError(f"length must be an int or a (min, max) pair; got {length!r}")
        low, high = (check_positive_int(v, "length") for v in length)
        if low > high:
            raise ValueError(f"length must have min <= max; got {length!r}")
    else:
        low = high = check_positive_int(length, "length")
    probs = np.asarray(label_probs, dtype=np.float64)
    if probs.shape != (k,) or not np.all((probs >= 0) & (probs <= 1)):
        raise ValueError(f"label_probs must hold {k} probabilities (one per state); got {label_probs!r}")
    if initial is None:
        initial = PAPER_INITIAL if k == len(PAPER_INITIAL) else tuple(np.full(k, 1.0 / k))
    theta = np.asarray(initial, dtype=np.float64)
    if theta.shape != (k,) or np.any(theta < 0) or not np.isclose(theta.sum(), 1.0):
        raise ValueError(f"initial must be {k} probabilities summing to one; got {initial!r}")

    rng = np.random.default_rng(seed)
    a_r, a_ir = _transition(0.1, k, rng), _transition(0.01, k, rng)
    xs, ys, z_rs, z_irs = [], [], [], []
    for _ in range(n):
        steps = int(rng.integers(low, high + 1))
        z_r, z_ir = _chain(theta, a_r, steps, rng), _chain(theta, a_ir, steps, rng)
        means = np.concatenate(
            [np.repeat(STATE_GAP * z_r[:, None], d_r, axis=1), np.repeat(STATE_GAP * z_ir[:, None], d - d_r, axis=1)],
            axis=1,
        )
        xs.append(means + rng.normal(size=(steps, d)))
        ys.append((rng.random(steps) < probs[z_r]).astype(np.int64))
        z_rs.append(z_r)
        z_irs.append(z_ir)
    relevant = np.arange(d) < d_r
    return PFHMMSyntheticData(xs, ys, relevant, z_rs, z_irs, probs, theta, a_r, a_ir)
