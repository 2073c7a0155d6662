"""Temporarily change the number of threads torch uses for intra-op parallelism."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["torch_threads"]


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
