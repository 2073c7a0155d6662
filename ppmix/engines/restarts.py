"""Keep the best of several fits from different starts: an engine piece called with explicit arguments.

The caller says how to fit from start ``s`` (``_fit_start(s)``), how to score the fit it just made
(per-row scores, so that the rule can weigh their spread), how to snapshot and restore a fit, and
when one fit is better than another (``better``). Nothing here knows the model it serves.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

__all__ = ["best_of_starts"]

logger = logging.getLogger(__name__)


def best_of_starts(
    n_starts: int,
    fit_start: Callable[[int], None],
    score_rows: Callable[[], np.ndarray],
    snapshot: Callable[[], Any],
    restore: Callable[[Any], None],
    better: Callable[[np.ndarray, np.ndarray], bool],
    each: Callable[[int], Any] | None = None,
) -> list[float]:
    """Fit from starts ``0 .. n_starts - 1`` and leave the best fit in place; the mean score of every start.

    ``_fit_start(s)`` fits from start ``s``; ``each(s)``, if given, is called right after; ``score_rows()`` scores
    the fit just made row by row; a later start replaces the kept one when ``better(its rows, the kept rows)``.
    ``snapshot()``/``restore(snap)`` save and reinstate a fit (with one start there is nothing to restore).

    Examples
    --------
    >>> fits = iter([1.0, 3.0, 2.0])
    >>> state = {}
    >>> scores = best_of_starts(
    ...     3,
    ...     fit_start=lambda s: state.update(value=next(fits)),
    ...     score_rows=lambda: np.array([state["value"]]),
    ...     snapshot=lambda: dict(state),
    ...     restore=state.update,
    ...     better=lambda rows, best: rows.mean() > best.mean(),
    ... )
    >>> scores, state["value"]
    ([1.0, 3.0, 2.0], 3.0)
    """
    best: tuple[np.ndarray, Any] | None = None
    scores = []
    for start in range(n_starts):
        fit_start(start)
        if each is not None:
            each(start)
        rows = np.asarray(score_rows(), dtype=np.float64)
        scores.append(float(rows.mean()))
        logger.debug("start %d: %.5f", start, scores[-1])
        if best is None or better(rows, best[0]):
            best = (rows, snapshot())
    if best is None:
        raise ValueError(f"n_starts must be a positive integer; got {n_starts!r}")
    if n_starts > 1:
        restore(best[1])
    return scores
