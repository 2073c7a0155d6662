"""How many threads torch uses inside ppmix: a policy for small passes, and a context to set the count.

Torch starts one intra-op thread per core. A second thread pays only on operations large
enough to amortise its parallel region; on the many small operations of an EM pass over
a few thousand rows, a forward–backward recursion or a Newton loop on a small gate, it
gains little on an idle machine, and on a busy one every parallel region waits for a
time slice for each of its threads. Measured on 2 cores under a background load
(``benchmarks/bench_threads.py``, table in ``benchmarks/README.md``), torch's default of 2
threads made such fits 3–16× slower than 1 thread, while large dense passes (a
full-covariance GMM on 50 000 × 20) kept their gain.

So by default (policy ``"auto"``) ppmix runs a fit on one thread when the work of one pass
(rows times parameter values) is below :data:`PARALLEL_WORK`, or when the CPU is already
contended as the fit starts: the kernel's pressure stall information says runnable tasks
waited for a CPU at least :data:`BUSY_PRESSURE` percent of the last 10 seconds (where
``/proc/pressure/cpu`` is missing, the 1-minute load average is at least the number of
cores). Otherwise it keeps torch's own setting. The policy only ever lowers the count: a
user who set ``torch.set_num_threads(1)`` keeps one thread everywhere.
``set_thread_policy("torch")`` switches it off (for example on a dedicated machine).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

__all__ = [
    "BUSY_PRESSURE",
    "PARALLEL_WORK",
    "THREAD_POLICIES",
    "cpu_busy",
    "get_thread_policy",
    "set_thread_policy",
    "threads_for",
    "torch_threads",
]

#: passes with less work than this (rows x parameters touched per pass) run on one thread under policy "auto"
PARALLEL_WORK = 2e7
#: percent of the last 10 s in which runnable tasks waited for a CPU, from which the CPU counts as busy
BUSY_PRESSURE = 10.0
#: ``"auto"``: one thread for small passes (the default); ``"torch"``: torch's setting everywhere
THREAD_POLICIES = ("auto", "torch")
_policy = "auto"


def set_thread_policy(policy: str) -> str:
    """Set how ppmix chooses torch's thread count inside its fits; returns the previous policy.

    Parameters
    ----------
    policy : {"auto", "torch"}
        ``"auto"`` (the default) runs passes with less work than :data:`PARALLEL_WORK` on one
        thread; ``"torch"`` leaves torch's setting (``torch.get_num_threads()``) in place.

    Returns
    -------
    str
        The policy in force before the call.

    Examples
    --------
    >>> previous = set_thread_policy("torch")
    >>> threads_for(1.0) == torch.get_num_threads()
    True
    >>> set_thread_policy(previous)
    'torch'
    """
    global _policy
    if policy not in THREAD_POLICIES:
        raise ValueError(f"policy must be one of {THREAD_POLICIES}; got {policy!r}")
    previous, _policy = _policy, policy
    return previous


def get_thread_policy() -> str:
    """The policy set by :func:`set_thread_policy` (``"auto"`` unless changed)."""
    return _policy


def cpu_busy(pressure_file: Path = Path("/proc/pressure/cpu")) -> bool:
    """Whether other work already contends for the CPU (see the module docstring).

    Examples
    --------
    >>> isinstance(cpu_busy(), bool)
    True
    """
    try:
        first = pressure_file.read_text().splitlines()[0].split()  # "some avg10=... avg60=... avg300=... total=..."
        fields = dict(item.split("=", 1) for item in first[1:])
        return float(fields["avg10"]) >= BUSY_PRESSURE
    except (OSError, KeyError, ValueError):
        pass
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1)
    except (AttributeError, OSError):  # no load average on this platform
        return False


def threads_for(work: float) -> int:
    """Threads for a fit whose passes each do ``work`` (rows x parameter values), under the current policy.

    One thread under policy ``"auto"`` when ``work`` is below :data:`PARALLEL_WORK` or the
    CPU is busy (:func:`cpu_busy`); torch's setting otherwise.

    Examples
    --------
    >>> threads_for(1e3)
    1
    >>> threads_for(1e12) in (1, torch.get_num_threads())
    True
    """
    threads = torch.get_num_threads()
    if threads > 1 and _policy == "auto" and (work < PARALLEL_WORK or cpu_busy()):
        return 1
    return threads


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)``; the previous count is restored after.

    For loops of many small tensor operations (cache-sized blocks, per-step recursions):
    there a second thread gains little, and on a busy machine every operation's parallel
    region waits for a time slice. The setting is process-wide, as torch's is.

    Examples
    --------
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
