"""The responsibilities a mixture's first M-step takes from its start: hard clusters, or softened ones.

The k-means start (:meth:`~ppmix.models._family_components.FamilyModel._initial_responsibilities`)
cuts the rows into hard clusters. For a Gaussian that is a good start: a cluster's mean and spread are close to
a component's. For families whose parameters are frequencies or dispersions it is not: a cluster cut out of
overlapping components gives extreme values (a level never seen in the cluster: a probability at the floor; a
binary feature constant in the cluster: a probability of 0 or 1; a gamma fitted to a slice of the axis: a huge
shape), under which every row's responsibilities are almost hard, and EM stalls near the start or creeps out of
it (a categorical mixture 0.02-0.07 nats per row below its optimum after 100 iterations, ``benchmarks/
_defaults_starts.py``). Such a family declares a ``start_spread`` ``s`` in ``(0, 1)`` (a class attribute; a
family without one starts hard): the start's M-step then counts every row ``1 - s`` to its cluster and ``s``
spread evenly over all ``K`` components, so each component starts at its cluster's estimate pulled towards the
pooled one, away from the extremes, and still apart from the others.
"""

from __future__ import annotations

import torch

from ppmix.components.family import DensityFamily

__all__ = ["START_SPREAD", "spread", "start_responsibilities"]

#: the ``start_spread`` the families that declare one declare (bernoulli, categorical, exponential, gamma): on planted
#: data (``benchmarks/_defaults_starts.py``) 0.3 and 0.5 both reach the best random start's optimum where the hard
#: start misses it; 0.8 leaves a one-feature gamma mixture at the symmetric point, as random starts do
START_SPREAD = 0.5


def spread(family: DensityFamily) -> float:
    """The share of a row that the start spreads over all components for ``family`` (0: a hard start).

    Examples
    --------
    >>> from ppmix.components.registry import family_from
    >>> spread(family_from("gaussian")), spread(family_from("categorical"))
    (0.0, 0.5)
    """
    return float(getattr(family, "start_spread", 0.0))


def start_responsibilities(family: DensityFamily, resp: torch.Tensor) -> torch.Tensor:
    """The start's responsibilities ``(N, K)``: ``resp`` (k-means' one-hot clusters) as they are for a family
    without a :func:`spread`, else ``(1 - s) resp + s / K``.

    Examples
    --------
    >>> from ppmix.components.registry import family_from
    >>> start_responsibilities(family_from("bernoulli"), torch.tensor([[1.0, 0.0]])).tolist()
    [[0.75, 0.25]]
    """
    share = spread(family)
    if share == 0.0:
        return resp
    return resp * (1.0 - share) + share / resp.shape[1]
