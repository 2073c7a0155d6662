"""Online (stochastic) EM for data that arrive in chunks: ``partial_fit`` of every structure with sharded EM
(:class:`~ppmix.models.mixture.Mixture`, :class:`~ppmix.models.hmm.HMM`, which take it as a method by assignment,
``partial_fit = partial_fit``; its state is an :class:`OnlineState` the model holds). The chunks are a source of the
one EM loop (:class:`Stream`, a :class:`~ppmix.engines.em.EMSource` of :func:`~ppmix.engines.em.em_loop`): every
E-step takes the next chunk, every M-step the update from the running statistics.

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
from typing import Any, Iterator

import torch
from sklearn.utils.metaestimators import available_if

from ppmix.components.family import merge_statistics, scale_statistics
from ppmix.engines.em import em_loop

__all__ = ["OnlineState", "Stream", "partial_fit"]


@dataclass(frozen=True)
class OnlineState:
    """Where a stream stands: the running average of the statistics per observation, the chunks and the
    observations (weighted) seen."""

    statistics: Any
    steps: int
    observations: float


class Stream:
    """Chunks of EM data as a source of :func:`~ppmix.engines.em.em_loop` (:class:`~ppmix.engines.em.EMSource`):
    every E-step the statistics per observation of the next chunk under the current parameters, every M-step the
    running average moved toward them by ``rho_t = (t + step_offset) ** -step_exponent`` (the first chunk of a
    stream: taken as it is) and the model's M-step from it, the prior counted once against every observation seen.

    Parameters
    ----------
    model : Mixture or HMM
    chunks : iterator of the model's EM data (``model._em_data``)
    state : OnlineState or None
        Where the stream stands (None: it starts at the first chunk).
    step_offset, step_exponent : float
        ``t0`` and ``kappa`` of the step sizes.
    """

    monotone = False  # every E-step sees new data

    def __init__(
        self, model: Any, chunks: Iterator[Any], state: OnlineState | None, step_offset: float, step_exponent: float
    ) -> None:
        self.model, self.chunks, self.state = model, chunks, state
        self.step_offset, self.step_exponent = step_offset, step_exponent
        self.n_observations: float = 0.0

    def e_step(self) -> tuple[Any, torch.Tensor] | None:
        data = next(self.chunks, None)
        if data is None:
            return None
        chunk_stats, objective = self.model._e_step(data)
        self.n_observations = self.model._n_observations(data)
        return scale_statistics(self.model._em_statistics(data, chunk_stats), 1.0 / self.n_observations), objective

    def m_step(self, mean_stats: Any) -> None:
        n, state = float(self.n_observations), self.state
        if state is None:
            state = OnlineState(mean_stats, 1, n)
        else:
            rho = (state.steps + self.step_offset) ** -self.step_exponent
            running = merge_statistics(scale_statistics(state.statistics, 1.0 - rho), scale_statistics(mean_stats, rho))
            state = OnlineState(running, state.steps + 1, state.observations + n)
        self.state = state
        self.model._em_update(scale_statistics(state.statistics, state.observations))  # a prior counts once


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
    # a stream starts at the first chunk, or after a fit by another engine
    state = getattr(self, "_online", None) if getattr(self, "engine_", None) == "online-em" else None
    stream = Stream(self, iter([data]), state, step_offset, step_exponent)
    result = em_loop(stream, max_iter=1, tol=0.0)
    history = ([] if state is None else list(self.history_)) + result.history
    self._online = stream.state
    self.engine_, self.history_ = "online-em", history
    self.n_iter_, self.converged_, self.lower_bound_ = stream.state.steps, False, history[-1]
    return self
