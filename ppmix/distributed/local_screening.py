"""Local fits that ended in a poor optimum, found by their log-likelihood against the other shards'.

The reduction estimator averages the local fits, so one local EM run stuck in a poor
optimum spoils it: on the S4.1 simulation (seed 3, M = 16) three of sixteen local fits
ended at a mean log-likelihood of -2.74 per row against -1.83 for the others, and one
reduced expert absorbed them (noise scale 11 instead of 1.7). When the shards are random
parts of one data set, their local fits' mean log-likelihoods differ only by sampling
noise, so a fit far below the others' median is a poor optimum; refitting that shard
with more starts finds the better one. When shards differ by design, a lower value may be
genuine: a refit then costs time but changes nothing, because the better of the two fits
is kept.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["OUTLIER_GAP", "OUTLIER_Z", "REFIT_STARTS", "poor_local_fits"]

#: a local fit is poor when it lies more than this many robust standard deviations (1.4826 x the median
#: absolute deviation) below the median of the local fits' mean log-likelihoods per row ...
OUTLIER_Z = 3.5
#: ... and more than this many nats per row below it (between random shards of a few thousand rows the
#: mean log-likelihood varies by about 0.01-0.02)
OUTLIER_GAP = 0.05
#: a poor local fit is refitted with this many times the EM starts (and other random starts)
REFIT_STARTS = 3


def poor_local_fits(mean_log_likelihoods: Sequence[float]) -> list[int]:
    """Indices of the local fits whose mean log-likelihood per row lies far below the others' (see the constants).

    Fewer than three fits give no reference, and none is flagged.

    Examples
    --------
    >>> poor_local_fits([-1.83, -1.84, -2.74, -1.82, -1.85])
    [2]
    >>> poor_local_fits([-1.83, -1.84, -1.85]), poor_local_fits([-1.0, -3.0])
    ([], [])
    """
    values = np.asarray(mean_log_likelihoods, dtype=float)
    if values.size < 3:
        return []
    median = float(np.median(values))
    spread = 1.4826 * float(np.median(np.abs(values - median)))
    threshold = median - max(OUTLIER_Z * spread, OUTLIER_GAP)
    return [int(i) for i in np.flatnonzero(values < threshold)]
