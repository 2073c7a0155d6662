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

    Parameters
    ----------
    history : list of float
        The objective per data point after every iteration or step, as above.
    n_iter : int
        The iterations (EM) or steps (SVI) run.
    converged : bool
        Whether the engine met its tolerance before its iteration limit.

    Examples
    --------
    >>> result = FitResult(history=[-1.30, -1.21, -1.20], n_iter=3, converged=True)
    >>> result.history[-1], result.n_iter, result.converged
    (-1.2, 3, True)
    """

    history: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False


class ConvergenceWarning(UserWarning):
    """An engine stopped at its iteration limit before meeting its tolerance.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> X = np.random.default_rng(0).normal(size=(200, 2))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     gmm = GMM(3, max_iter=2, tol=0, seed=0, progress=False).fit(X)
    >>> [w.category.__name__ for w in caught], gmm.converged_
    (['ConvergenceWarning'], False)
    """


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
