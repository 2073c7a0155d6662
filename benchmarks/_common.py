"""Thread settings shared by the benchmark scripts.

Import this module before numpy and torch: :func:`early_threads` must put ``--threads`` in
the environment before those libraries start their thread pools. It imports nothing but
the standard library at module level.
"""

from __future__ import annotations

import argparse
import os

# Read by OpenMP (torch, scikit-learn) and the BLAS libraries (numpy/scipy OpenBLAS, torch MKL) when they load.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def early_threads(default: int) -> int:
    """Put the script's ``--threads`` (read from ``sys.argv``) into every thread variable.

    Parameters
    ----------
    default : int
        The script's default for ``--threads``.

    Returns
    -------
    int
        The thread count written to the environment.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=default)
    ns, _ = pre.parse_known_args()
    for var in THREAD_VARS:
        os.environ[var] = str(ns.threads)
    return ns.threads


def set_torch_threads(threads: int, *, uses_pomegranate: bool) -> None:
    """Set torch's thread count, after importing pomegranate if the benchmark uses it.

    Importing pomegranate (its ``apricot`` dependency) resets the OpenMP thread count,
    which torch shares, to the number of CPUs. Imported lazily inside a timed run, it
    would silently change the thread count of every timing after it; imported here, it
    happens before the count is set.

    Parameters
    ----------
    threads : int
        Threads for torch's intra-op pool.
    uses_pomegranate : bool
        Whether the run will use pomegranate.
    """
    import torch

    if uses_pomegranate:
        import pomegranate.distributions  # noqa: F401
    torch.set_num_threads(threads)


def require_torch_threads(expected: int) -> int:
    """Return torch's thread count, or raise if it is not the one a timing was meant to use.

    Parameters
    ----------
    expected : int
        The thread count the timing was run at.

    Returns
    -------
    int
        ``torch.get_num_threads()`` (equal to ``expected``).

    Raises
    ------
    RuntimeError
        If torch ran with another thread count.
    """
    import torch

    used = torch.get_num_threads()
    if used != expected:
        raise RuntimeError(f"torch ran with {used} threads, not the {expected} this timing is for")
    return used
