"""Online (stochastic) EM for data that arrive in chunks: ``partial_fit`` of every structure with sharded EM
(:class:`~ppmix.models.mixture.Mixture`, :class:`~ppmix.models.hmm.HMM`, which take it as a method by assignment,
``partial_fit = partial_fit``; its state is an :class:`OnlineState` the model holds).

Cappé and Moulines (2009): keep a running average ``s_t`` of the E-step's sufficient
statistics per observation and take the M-step from it,

    s_t = (1 - rho_t) s_{t-1} + rho_t * sbar(chunk_t; theta_{t-1}),     theta_t = M-step(s_t),

with step sizes ``rho_t = (t + t0)^(-kappa)``, ``kappa`` in ``(1/2, 1]``. The statistics are the
mergeable statistics of :func:`ppmix.distributed.fit_em` (``_em_statistics``), so the convex
combination is exact (:func:`~ppmix.components.family.scale_statistics`,
:func:`~ppmix.components.family.merge_statistics`).

**What it converges to.** On a stream of fresh data from a fixed distribution, ``theta_t``
converges (almost surely, under the conditions of Cappé and Moulines, Thm. 1) to a stationary
point of the expected log-likelihood, i.e. to a fixed point of batch EM on infinitely many
rows; on planted data it approaches the batch EM fit of the same rows at the statistical
rate. It is not batch EM on the rows seen: a finite data set passed once gives an answer
within sampling noise of it, not equal to it (:func:`~ppmix.distributed.fit_em` gives the exact fit).

**With a prior** (``priors=``, an HMM's ``transition_prior``): MAP online EM. The M-step is the
model's MAP update (MAP-EM's, as ``fit`` with the same prior) of ``N_t s_t``, where ``N_t`` is the
number of rows (an HMM's steps; with ``sample_weight``, weighted) of every chunk of the stream so
far: the running average stands for the rows seen, and the prior is counted once against all of
them, as batch MAP-EM counts it once against the data set. So the prior's pull shrinks as the stream
grows, the first chunk's update is one MAP-EM iteration on it, and a stream approaches batch MAP-EM
on the rows seen as it approaches batch EM without a prior. (Counting the prior against each chunk
would make a stream of small chunks stay at the prior; against the average alone, at every step.)
Without a prior the M-step does not depend on ``N_t``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sklearn.utils.metaestimators import available_if

from ppmix.components.family import merge_statistics, scale_statistics

__all__ = ["OnlineState", "partial_fit"]


@dataclass(frozen=True)
class OnlineState:
    """Where a stream stands: the running average of the statistics per observation, the chunks and the
    observations (weighted) seen."""

    statistics: Any
    steps: int
    observations: float


def _online_em_available(model: Any) -> bool:
    """Whether ``model`` offers ``partial_fit``; a model that cannot names why in its ``online_em_unavailable``
    (an ``AttributeError``, so ``hasattr(model, "partial_fit")`` is False and scikit-learn does not try it)."""
    if why := getattr(model, "online_em_unavailable", None):
        raise AttributeError(f"{type(model).__name__} has no partial_fit: {why}")
    return True


def _check_steps(step_offset: float, step_exponent: float) -> None:
    if not (math.isfinite(step_offset) and step_offset >= 0):
        raise ValueError(f"step_offset must be a finite number >= 0; got {step_offset!r}")
    if not 0.5 < step_exponent <= 1:
        raise ValueError(f"step_exponent must be in (0.5, 1]; got {step_exponent!r}")


@available_if(_online_em_available)
def partial_fit(
    self: Any,
    X: Any,
    y: Any = None,
    *,
    sample_weight: Any = None,
    step_offset: float = 2.0,
    step_exponent: float = 0.6,
) -> Any:
    """One step of online EM (Cappé & Moulines, 2009) on the chunk ``X``.

    The first call on an unfitted model initialises it from the chunk as ``fit`` would
    (k-means start, the relative variance floor measured on this chunk); a model already
    fitted continues from its parameters. Every call then updates the running statistics
    with step ``rho_t = (t + step_offset) ** -step_exponent`` and takes the M-step; with a prior
    (``priors=``, an HMM's ``transition_prior``), the MAP M-step with the prior counted once against all the
    rows of the stream so far (see :mod:`ppmix.models._online`).

    Parameters
    ----------
    X : a chunk of data, as for ``fit``.
    y : None
    sample_weight : array-like, optional
        One non-negative weight per row (per sequence for an HMM) of the chunk, as in ``fit``: the chunk's
        statistics are its weighted means.
    step_offset : float, default 2.0
        ``t0 >= 0``: delays the decay of the steps.
    step_exponent : float, default 0.6
        ``kappa`` in ``(0.5, 1]``: smaller forgets old chunks faster.

    Returns
    -------
    self
        With ``n_iter_`` the number of chunks seen and ``history_`` the mean
        log-likelihood of every chunk under the parameters before its update.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> rng = np.random.default_rng(0)
    >>> gmm = GMM(2, seed=0, progress=False)
    >>> for _ in range(20):
    ...     gmm = gmm.partial_fit(np.r_[rng.normal(size=(50, 1)), rng.normal(size=(50, 1)) + 6])
    >>> sorted(abs(round(m)) for m in gmm.means_.numpy().ravel().tolist())
    [0, 6]
    """
    _check_steps(step_offset, step_exponent)
    starting = not self.is_fitted
    if starting:
        self._validate_hyperparameters()
    prepared = self.prepare_data(X, y, fitting=starting)
    if sample_weight is not None:
        prepared = self._weigh(prepared, sample_weight, fitting=starting)
    data = self._em_data(prepared)
    if starting:
        self._em_initialize(data, self._generator(0))
    chunk_stats, objective = self._e_step(data)
    n = self._n_observations(data)
    mean_stats = scale_statistics(self._em_statistics(data, chunk_stats), 1.0 / n)
    # a stream starts at the first chunk, or after a fit by another engine
    state: OnlineState | None = (
        getattr(self, "_online", None) if getattr(self, "engine_", None) == "online-em" else None
    )
    if state is None:
        state, history = OnlineState(mean_stats, 1, float(n)), []
    else:
        rho = (state.steps + step_offset) ** -step_exponent
        old = scale_statistics(state.statistics, 1.0 - rho)
        running = merge_statistics(old, scale_statistics(mean_stats, rho))
        state, history = OnlineState(running, state.steps + 1, state.observations + float(n)), list(self.history_)
    self._em_update(scale_statistics(state.statistics, state.observations))  # a prior counts once against the rows
    self._online = state
    history.append(float(objective) / n)
    self.engine_, self.history_ = "online-em", history
    self.n_iter_, self.converged_, self.lower_bound_ = state.steps, False, history[-1]
    return self
