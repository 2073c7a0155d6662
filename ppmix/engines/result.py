"""What every engine returns to ``MixtureModel.fit``."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class FitResult:
    """Outcome of one engine run.

    ``history`` holds the objective per data point after every iteration (EM), the
    negative loss per data point after every step (SVI) or is empty (MCMC).
    """

    history: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False


class ConvergenceWarning(UserWarning):
    """An engine stopped at its iteration limit before meeting its tolerance."""


@contextmanager
def convergence_warnings_ignored(ignore: bool = True) -> Iterator[None]:
    """Silence :class:`ConvergenceWarning` inside the block (when ``ignore``): for runs short by design, or
    whose verdict a later step replaces. Other warnings pass.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     with convergence_warnings_ignored():
    ...         warnings.warn("stopped early", ConvergenceWarning)
    ...         warnings.warn("other", UserWarning)
    >>> [str(w.message) for w in caught]
    ['other']
    """
    with warnings.catch_warnings():
        if ignore:
            warnings.simplefilter("ignore", ConvergenceWarning)
        yield
