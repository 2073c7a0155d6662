"""Where the chains of a sampler start: one dispersed point per chain, so that chains can disagree.

r_hat compares chains; chains that all start at one point of a posterior with several modes all stay in the
mode of that point and agree, whatever the posterior. So every sampler (``engine="gibbs"``,
``engine="mcmc"``) starts chain ``c`` from its own start:

- chain 0 from ``model._init_values(data, generator)``, the start a single chain always had (the best of the
  model's ``n_init`` EM initialisations: k-means on the rows, or on an HMM's frames);
- chain ``c >= 1`` from ``model._init_values`` with one initialisation (``n_init = 1``) seeded by the chain's own
  generator, ``model._generator(CHAIN_SEED_OFFSET + c)``; where the model starts from k-means
  (``init_params="kmeans"``) and offers its seeding alone (``"k-means++"``), from the k-means++ seeding: ``K``
  rows drawn far apart, every row given to the nearest, then one M-step. k-means itself (the best of several runs)
  finds the same partition from nearly every seed, so chains started from it all sit in one mode; the seeding
  alone lands in the basin of a different mode from different seeds where the data have several (e.g. which two
  of four clusters one component covers), and in the one basin where the components are well separated;
- a model without an EM initialisation (``_init_values`` returns ``{}``) leaves the start to the sampler (NUTS:
  the median of a few prior draws, drawn for each chain anew).

Relabelling (:mod:`ppmix.engines.relabel`) then aligns the chains' labels, so two chains that found one mode
under permuted labels agree, and only chains in different modes (different partitions of the data) give r_hat
above 1.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["CHAIN_SEED_OFFSET", "SingleChainWarning", "chain_starts", "warn_single_chain"]

logger = logging.getLogger(__name__)

#: chain ``c >= 1`` seeds its initialisation with ``model._generator(CHAIN_SEED_OFFSET + c)``: far from the
#: offsets of the EM restarts (``_generator(r)``, ``r < n_init``) and of the engines' own streams
CHAIN_SEED_OFFSET = 104_729


class SingleChainWarning(UserWarning):
    """A sampler ran one chain: r_hat, which compares chains, cannot be computed (it is NaN).

    Examples
    --------
    It is a ``UserWarning``; ask for chains to silence it (``fit(X, engine="gibbs", num_chains=4)``), or filter it:

    >>> import warnings
    >>> issubclass(SingleChainWarning, UserWarning)
    True
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", SingleChainWarning)  # one chain on purpose
    """


def chain_starts(
    model: "MixtureModel", data: Any, num_chains: int, generator: torch.Generator
) -> list[dict[str, torch.Tensor]]:
    """One start of the global sites per chain (module docstring): chain 0 at ``model._init_values(data,
    generator)``, chain ``c >= 1`` at one initialisation of its own seed. The model's globals are left at chain
    0's start.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> corners = np.array([[0.0, 0.0], [0.0, 6.0], [6.0, 0.0], [6.0, 6.0]])
    >>> X = np.repeat(corners, 50, axis=0) + np.random.default_rng(0).normal(size=(200, 2))
    >>> gmm = GMM(3, seed=0, progress=False)
    >>> data = gmm.prepare_data(X, fitting=True)
    >>> starts = chain_starts(gmm, data, 4, gmm._generator())
    >>> len(starts), tuple(starts[1]["locs"].shape)
    (4, (3, 2))
    """
    first = model._init_values(data, generator)
    starts = [first]
    if not first:
        return [{} for _ in range(num_chains)]
    init_params = getattr(model, "init_params", None)
    seeding = "k-means++" if init_params == "kmeans" and "k-means++" in getattr(model, "init_methods", ()) else None
    with model._overriding("n_init", 1), model._overriding("init_params", seeding or init_params):
        for chain in range(1, num_chains):
            starts.append(model._init_values(data, model._generator(CHAIN_SEED_OFFSET + chain)))
    model._set_globals(first)
    return starts


def warn_single_chain(num_chains: int, engine: str, stacklevel: int = 4) -> None:
    """Warn (:class:`SingleChainWarning`) that one chain gives no r_hat, and how to ask for more."""
    if num_chains == 1:
        warnings.warn(
            f"engine={engine!r} ran num_chains=1: r_hat compares chains, so it is unavailable (NaN) and a "
            "posterior with several modes cannot show; fit with num_chains=4 (or at least 2) for r_hat",
            SingleChainWarning,
            stacklevel=stacklevel,
        )
