"""Choosing the best of several restarts the same way on every device.

Restarts that reach the same optimum (k-means runs that end in the same partition, EM restarts that
converge to the same fixed point, often with the components in another order) have objectives that
differ by rounding alone, and rounding differs between the CPU and CUDA, and between thread counts.
A strict ``>`` then picks a different restart, and so a permutation of the components, on each
device. :func:`beats` asks a restart to be better by more than rounding before it replaces the one
kept, so the first of equals is kept everywhere.
"""

from __future__ import annotations

import torch

#: relative margin in float64: far above the rounding of a sum (1e-16 per term, ~1e-13 for 1e6 terms)
#: and far below any difference between two distinct optima worth choosing between
TIE_RTOL = 1e-10
#: ... or this many machine epsilons of a coarser dtype (float32: about 1.2e-5)
TIE_EPS = 100


def beats(candidate: float, incumbent: float | None, dtype: torch.dtype = torch.float64) -> bool:
    """Whether ``candidate`` is larger than ``incumbent`` by more than the rounding of ``dtype``.

    The margin is relative: :data:`TIE_RTOL` of the larger magnitude, or :data:`TIE_EPS` machine
    epsilons of ``dtype`` if more. ``incumbent`` None (nothing kept yet) is beaten by anything.

    Examples
    --------
    >>> beats(-10.0, None), beats(-9.0, -10.0), beats(-10.0 + 1e-14, -10.0)
    (True, True, False)
    >>> import torch
    >>> beats(-10.0 + 1e-6, -10.0), beats(-10.0 + 1e-6, -10.0, torch.float32)
    (True, False)
    """
    if incumbent is None:
        return True
    rtol = max(TIE_RTOL, TIE_EPS * torch.finfo(dtype).eps)
    return candidate - incumbent > rtol * max(abs(candidate), abs(incumbent))
