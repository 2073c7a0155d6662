"""The log-likelihood of a diagonal Gaussian or diagonal Student-t mixture at every NUTS chain's parameters and its
gradient, in one compiled pass over the rows (numba).

For each chain ``c`` and row ``n`` the pass scores the ``K`` components from the deviations ``x_n - mu_ck`` (no
expansion of the square, so no cancellation far from the origin), takes the ``logsumexp`` and the responsibilities
``r_nck``, and accumulates the sums the gradient needs (:mod:`ppmix.engines.potential_grads` gives the formulas):
``R = sum_n r``, ``sum_n r w (x_n - mu)`` and ``sum_n r w (x_n - mu)^2`` with ``w = 1`` for the Gaussian and the latent
precision ``u = (nu + D) / (nu + delta)`` for the Student t, and for the latter ``sum_n r (u delta / nu - log(1 +
delta / nu))``. Nothing of size ``(N, C K)`` is stored: the cost is ``N C K D`` multiply-adds and ``N C K``
exponentials, single-threaded and deterministic.

The functions below are plain Python, compiled by :func:`compiled` on first use (``numba.njit(cache=True)``: the
machine code is cached on disk, a later process loads it); importing this module does not import numba.
:func:`compiled` returns None where numba is not installed: the potential then uses the torch path of
:mod:`ppmix.engines.potential_grads` (tested equal).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

__all__ = ["compiled", "diag_gaussian_mixture", "diag_student_t_mixture"]

HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


def diag_gaussian_mixture(x, loc, scale, log_weights):  # pragma: no cover - compiled by numba
    """``sum_n log sum_k w_ck N(x_n | mu_ck, diag(sigma_ck^2))`` per chain and its gradient.

    Parameters
    ----------
    x : ndarray (N, D)
        The rows.
    loc, scale : ndarray (C, K, D)
        Every chain's component means and standard deviations.
    log_weights : ndarray (C, K)
        Every chain's log mixture weights.

    Returns
    -------
    value : ndarray (C,)
    g_log_weights, g_loc, g_scale : ndarray (C, K), (C, K, D), (C, K, D)
        The gradients of ``value[c]`` with respect to chain ``c``'s parameters.
    """
    n_rows, d = x.shape
    chains, k = log_weights.shape
    value = np.zeros(chains)
    total = np.zeros((chains, k))
    first = np.zeros((chains, k, d))
    second = np.zeros((chains, k, d))
    joint = np.empty(k)
    deviation = np.empty((k, d))
    for c in range(chains):
        precision = 1.0 / (scale[c] * scale[c])
        const = log_weights[c] - np.log(scale[c]).sum(1) - d * HALF_LOG_TWO_PI
        for n in range(n_rows):
            top = -np.inf
            for j in range(k):
                square = 0.0
                for i in range(d):
                    dev = x[n, i] - loc[c, j, i]
                    deviation[j, i] = dev
                    square += dev * dev * precision[j, i]
                joint[j] = const[j] - 0.5 * square
                top = max(top, joint[j])
            norm = 0.0
            for j in range(k):
                joint[j] = np.exp(joint[j] - top)
                norm += joint[j]
            value[c] += top + np.log(norm)
            for j in range(k):
                r = joint[j] / norm
                total[c, j] += r
                for i in range(d):
                    dev = deviation[j, i]
                    first[c, j, i] += r * dev
                    second[c, j, i] += r * dev * dev
    variance = scale * scale
    g_loc = first / variance
    g_scale = (second / variance - total.reshape(chains, k, 1)) / scale
    return value, total, g_loc, g_scale


def diag_student_t_mixture(x, df, loc, scale, log_weights):  # pragma: no cover - compiled by numba
    """``sum_n log sum_k w_ck t_df(x_n | mu_ck, diag(sigma_ck^2))`` per chain and the sums of its gradient.

    Parameters
    ----------
    x : ndarray (N, D)
        The rows.
    df : ndarray (C, K)
        Every chain's degrees of freedom.
    loc, scale : ndarray (C, K, D)
        Every chain's component locations and scales.
    log_weights : ndarray (C, K)
        Every chain's log mixture weights.

    Returns
    -------
    value : ndarray (C,)
    g_log_weights, g_loc, g_scale : ndarray (C, K), (C, K, D), (C, K, D)
        The gradients of ``value[c]`` with respect to chain ``c``'s parameters.
    df_sum : ndarray (C, K)
        ``sum_n r (u delta / df - log(1 + delta / df))``: the gradient with respect to ``df`` is ``(R (psi((df + D) /
        2) - psi(df / 2) - D / df) + df_sum) / 2`` (digamma is not compiled here).
    """
    n_rows, d = x.shape
    chains, k = log_weights.shape
    value = np.zeros(chains)
    total = np.zeros((chains, k))
    first = np.zeros((chains, k, d))
    second = np.zeros((chains, k, d))
    df_sum = np.zeros((chains, k))
    joint = np.empty(k)
    delta = np.empty(k)
    log_term = np.empty(k)
    deviation = np.empty((k, d))
    for c in range(chains):
        precision = 1.0 / (scale[c] * scale[c])
        half = 0.5 * (df[c] + d)
        base = log_weights[c] - np.log(scale[c]).sum(1) - 0.5 * d * np.log(df[c] * math.pi)
        for j in range(k):
            base[j] += math.lgamma(half[j]) - math.lgamma(0.5 * df[c, j])
        for n in range(n_rows):
            top = -np.inf
            for j in range(k):
                square = 0.0
                for i in range(d):
                    dev = x[n, i] - loc[c, j, i]
                    deviation[j, i] = dev
                    square += dev * dev * precision[j, i]
                delta[j] = square
                log_term[j] = np.log1p(square / df[c, j])
                joint[j] = base[j] - half[j] * log_term[j]
                top = max(top, joint[j])
            norm = 0.0
            for j in range(k):
                joint[j] = np.exp(joint[j] - top)
                norm += joint[j]
            value[c] += top + np.log(norm)
            for j in range(k):
                r = joint[j] / norm
                weighted = r * (df[c, j] + d) / (df[c, j] + delta[j])
                total[c, j] += r
                df_sum[c, j] += weighted * delta[j] / df[c, j] - r * log_term[j]
                for i in range(d):
                    dev = deviation[j, i]
                    first[c, j, i] += weighted * dev
                    second[c, j, i] += weighted * dev * dev
    variance = scale * scale
    g_loc = first / variance
    g_scale = (second / variance - total.reshape(chains, k, 1)) / scale
    return value, total, g_loc, g_scale, df_sum


@functools.cache
def compiled(name: str) -> Callable[..., Any] | None:
    """The kernel ``name`` of this module compiled by ``numba.njit(cache=True)``, or None without numba.

    Examples
    --------
    >>> import numpy as np
    >>> kernel = compiled("diag_gaussian_mixture")
    >>> x, loc, scale = np.zeros((3, 1)), np.zeros((1, 2, 1)), np.ones((1, 2, 1))
    >>> value, *_ = (kernel or diag_gaussian_mixture)(x, loc, scale, np.log(np.full((1, 2), 0.5)))
    >>> bool(np.isclose(value[0], -3 * 0.5 * np.log(2 * np.pi)))
    True
    """
    try:
        import numba
    except ImportError:
        return None
    return numba.njit(cache=True)(globals()[name])
