"""What every engine returns to ``MixtureModel.fit``."""

from __future__ import annotations

from dataclasses import dataclass, field


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
