"""Where Pyro keeps the parameters of a model while an engine runs."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import pyro

#: Pyro keeps its effect-handler stack and its settings in module globals, so two programs run at once in two
#: threads see each other's sample sites ("Multiple sample sites named ...", "duplicate plate"); every Pyro-based
#: run of ppmix (SVI, MCMC, ELBOs, enumerated posteriors, ArviZ export) holds this lock, re-entrant so that
#: nested runs in one thread pass
_PYRO_LOCK = threading.RLock()


@contextlib.contextmanager
def taking_turns() -> Iterator[None]:
    """Run alone among ppmix's calls that use Pyro's global state or torch's global generator.

    Re-entrant: a call inside another in the same thread passes. :func:`local_params` and the models'
    ``_forked_rng`` (which seeds torch's global generator from a model's seed) hold it, so two threads sampling
    with one seed draw what one thread draws.

    Examples
    --------
    >>> with taking_turns(), taking_turns():  # nested in one thread
    ...     pass
    """
    with _PYRO_LOCK:
        yield


@contextlib.contextmanager
def local_params() -> Iterator[None]:
    """Keep ``PyroModule`` parameters local to their module (no global param store), and run alone.

    Pyro is not thread-safe (its handler stack is global), so concurrent Pyro-based calls from several
    threads (``fit(engine="svi")``, ``elbo()``, ``to_arviz()``, ...) take turns here instead of corrupting
    each other's traces; EM and the exact predictions do not use Pyro and run concurrently. Processes are
    independent.

    Examples
    --------
    >>> import pyro
    >>> with local_params():
    ...     pyro.settings.get("module_local_params")
    True
    """
    with taking_turns(), pyro.settings.context(module_local_params=True):
        yield
