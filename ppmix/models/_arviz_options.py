"""What ``to_arviz`` is asked for: which groups, every how many draws, the log-likelihood's precision and the
draws replicated for ``posterior_predictive``, checked and resolved once (:class:`ArvizRequest`), so that the
builder (:func:`ppmix.models._arviz.build_inference_data`) computes only what was asked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppmix._validation import check_positive_int

__all__ = ["ALL_GROUPS", "DEFAULT_GROUPS", "PREDICTIVE_CELLS", "ArvizRequest", "predictive_subset"]

#: every group ``to_arviz`` can build
ALL_GROUPS = (
    "posterior",
    "sample_stats",
    "log_likelihood",
    "posterior_predictive",
    "prior",
    "prior_predictive",
    "observed_data",
    "discrete_posterior",
)
#: the groups built by default: all but ``discrete_posterior`` (every draw's ``(N, K)`` responsibilities, the
#: largest group by far: 1.9 GB for 4 000 draws of a three-component mixture of 20 000 rows)
DEFAULT_GROUPS = tuple(group for group in ALL_GROUPS if group != "discrete_posterior")
#: ``predictive_draws="auto"`` replicates the data for every draw while draws x observed values stay within this
#: many (80 MB of float32), else for evenly spaced draws of every chain within it
PREDICTIVE_CELLS = 20_000_000
LOG_LIKELIHOOD_DTYPES = {"float32": np.float32, "float64": np.float64}


@dataclass(frozen=True)
class ArvizRequest:
    """The checked options of ``to_arviz``: ``groups`` (a set of :data:`ALL_GROUPS`, ``posterior`` always in
    it; ``explicit`` whether the caller named them), ``thin`` (keep every ``thin``-th draw of every chain),
    ``log_likelihood_dtype`` (a NumPy float type) and ``predictive_draws`` (``"auto"``, ``"all"`` or a positive
    int: how many draws of every chain get a replicated data set)."""

    groups: frozenset[str]
    explicit: bool = False
    thin: int = 1
    log_likelihood_dtype: Any = np.float32
    predictive_draws: int | str = "auto"

    @classmethod
    def checked(
        cls,
        groups: Iterable[str] | None = None,
        thin: int = 1,
        log_likelihood_dtype: str = "float32",
        predictive_draws: int | str = "auto",
    ) -> "ArvizRequest":
        """The request, each argument checked (a ``ValueError`` or ``TypeError`` naming it and the choices).

        Examples
        --------
        >>> request = ArvizRequest.checked(groups=["log_likelihood"], thin=2)
        >>> sorted(request.groups), request.thin
        (['log_likelihood', 'posterior'], 2)
        """
        if groups is None:
            chosen = frozenset(DEFAULT_GROUPS)
        else:
            if isinstance(groups, str):
                raise TypeError(f"groups must be a list of group names, e.g. [{groups!r}]; got the string {groups!r}")
            chosen = frozenset(groups)
            unknown = sorted(chosen - set(ALL_GROUPS))
            if unknown:
                raise ValueError(f"groups: unknown {unknown}; choose among {list(ALL_GROUPS)}")
        if log_likelihood_dtype not in LOG_LIKELIHOOD_DTYPES:
            raise ValueError(
                f"log_likelihood_dtype must be one of {sorted(LOG_LIKELIHOOD_DTYPES)}; got {log_likelihood_dtype!r}"
            )
        if predictive_draws not in ("auto", "all"):
            predictive_draws = check_positive_int(predictive_draws, "predictive_draws ('auto', 'all' or a count)")
        return cls(
            groups=chosen | {"posterior"},
            explicit=groups is not None,
            thin=check_positive_int(thin, "thin"),
            log_likelihood_dtype=LOG_LIKELIHOOD_DTYPES[log_likelihood_dtype],
            predictive_draws=predictive_draws,
        )

    def wants(self, *groups: str) -> bool:
        """Whether any of ``groups`` was asked for."""
        return any(group in self.groups for group in groups)


def predictive_subset(n_draws: int, cells_per_draw: int, n_chains: int, predictive_draws: int | str) -> np.ndarray:
    """The draws of every chain that get a replicated data set: all (``"all"``, or ``"auto"`` within
    :data:`PREDICTIVE_CELLS`), else evenly spaced ones, as many as asked or as the budget allows (at least one).

    Examples
    --------
    >>> predictive_subset(1000, 40_000, 4, "auto")[:3].tolist()  # 4 chains x 1000 draws of 40 000 values: 125 each
    [0, 8, 16]
    >>> len(predictive_subset(10, 5, 2, "auto")), len(predictive_subset(10, 5, 2, 3))
    (10, 3)
    """
    if predictive_draws == "all":
        keep = n_draws
    elif predictive_draws == "auto":
        keep = max(1, PREDICTIVE_CELLS // max(1, cells_per_draw * n_chains))
    else:
        keep = int(predictive_draws)
    if keep >= n_draws:
        return np.arange(n_draws)
    return np.arange(0, n_draws, math.ceil(n_draws / keep))
