"""The 2-D synthetic setting of PRESTO (Sangani et al., §4.1, eqs. 14-17).

Four sets ``S_1* .. S_4*`` live on four adjacent vertical strips of
``[-1.73, 1.73] x [-1.17, 2.59]``; in each, the label ``y in {-1, +1}`` is given by
the side of a curve: two parallel lines (``S_1*``, ``S_4*``, eqs. 14 and 17), a
parabola (``S_2*``, eq. 15) and an exponential (``S_3*``, eq. 16).

**Interpretation (stated, since the printed equations cannot hold literally).**
Read literally, eqs. (14)-(17) ask ``f_k(x) - 2 y = 0`` with ``y = +-1``, but on the
stated boxes ``f_k`` stays far from ``+-2`` (e.g. ``7 x1 + x2 - 27`` lies in
``[-40, -33]`` on the box of ``S_1*``), so no point would qualify, and every point
of a box lies on the same side of the curve. We keep the boxes and the shapes of
the curves and move each curve to pass through the centre of its box:
``x`` is uniform on box ``k`` and ``y = sign(s_k (f_k(x) - f_k(c_k)))`` with ``c_k``
the box centre, ``f_1 = f_4 = 7 x1 + x2``, ``f_2 = 20 x1^2 - 200 x1 + x2``,
``f_3 = x2 + exp(-x1)``, and ``s_k = +1`` where the equation has ``-2y``
(eqs. 14, 15, 17) and ``-1`` where it has ``+2y`` (eq. 16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppmix._validation import check_positive_int

__all__ = ["PrestoSyntheticData", "make_presto_synthetic"]

#: boxes (x1 range, x2 range) of S_1* .. S_4* (eqs. 14-17)
BOXES = (
    ((-1.73, -0.86), (-1.16, 0.04)),
    ((-0.87, 0.01), (-1.15, 2.59)),
    ((-0.01, 0.87), (-1.17, 2.56)),
    ((0.86, 1.73), (-1.17, 0.04)),
)
_SIGNS = (1.0, 1.0, -1.0, 1.0)


def _curve(k: int, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    if k in (0, 3):
        return 7.0 * x1 + x2
    if k == 1:
        return 20.0 * x1**2 - 200.0 * x1 + x2
    return x2 + np.exp(-x1)


@dataclass
class PrestoSyntheticData:
    """Covariates ``X`` (N, 2), labels ``y`` in {0, 1}, labels ``y_pm`` in {-1, +1}, true set ``sets`` in 0..3.

    Parameters
    ----------
    X : ndarray of shape (N, 2)
        The covariates.
    y : ndarray of shape (N,)
        The labels in {0, 1}.
    y_pm : ndarray of shape (N,)
        The same labels in {-1, +1}.
    sets : ndarray of shape (N,)
        The true set of every point, in 0..3.

    Examples
    --------
    >>> from ppmix.datasets import make_presto_synthetic
    >>> data = make_presto_synthetic(10, seed=0)
    >>> data.X.shape, sorted(set(data.sets.tolist())), bool(((data.y_pm + 1) // 2 == data.y).all())
    ((40, 2), [0, 1, 2, 3], True)
    """

    X: np.ndarray
    y: np.ndarray
    y_pm: np.ndarray
    sets: np.ndarray


def make_presto_synthetic(n_per_set: int = 5000, *, seed: int | None = 0, shuffle: bool = True) -> PrestoSyntheticData:
    """Draw the four sets of PRESTO's 2-D synthetic experiment (§4.1).

    Parameters
    ----------
    n_per_set : int, default 5000
        Points per set (the paper: 5000, i.e. ``|D| = 20000``).
    seed : int or None
    shuffle : bool, default True
        Shuffle the rows (otherwise they are ordered by set).

    Returns
    -------
    PrestoSyntheticData

    Examples
    --------
    >>> data = make_presto_synthetic(100, seed=0)
    >>> data.X.shape, sorted(set(data.y.tolist())), sorted(set(data.sets.tolist()))
    ((400, 2), [0, 1], [0, 1, 2, 3])
    """
    n = check_positive_int(n_per_set, "n_per_set")
    rng = np.random.default_rng(seed)
    xs, ys, sets = [], [], []
    for k, ((a1, b1), (a2, b2)) in enumerate(BOXES):
        x1 = rng.uniform(a1, b1, size=n)
        x2 = rng.uniform(a2, b2, size=n)
        centre = _curve(k, np.array([(a1 + b1) / 2]), np.array([(a2 + b2) / 2]))[0]
        side = _SIGNS[k] * (_curve(k, x1, x2) - centre)
        xs.append(np.stack([x1, x2], axis=1))
        ys.append(np.where(side > 0, 1, -1))
        sets.append(np.full(n, k))
    x, y_pm, s = np.concatenate(xs), np.concatenate(ys), np.concatenate(sets)
    if shuffle:
        order = rng.permutation(x.shape[0])
        x, y_pm, s = x[order], y_pm[order], s[order]
    return PrestoSyntheticData(X=x, y=(y_pm > 0).astype(np.int64), y_pm=y_pm, sets=s)
