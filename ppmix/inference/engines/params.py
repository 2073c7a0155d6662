"""Where Pyro keeps the parameters of a model while an engine runs."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pyro


@contextlib.contextmanager
def local_params() -> Iterator[None]:
    """Keep ``PyroModule`` parameters local to their module (no global param store).

    Examples
    --------
    >>> import pyro
    >>> with local_params():
    ...     pyro.settings.get("module_local_params")
    True
    """
    with pyro.settings.context(module_local_params=True):
        yield
