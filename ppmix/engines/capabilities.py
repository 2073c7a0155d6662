"""Optional capabilities of a model, declared as protocols that the engines and executors check by type.

A model offers a capability by defining the protocol's members; :func:`ppmix.distributed.fit_em`,
``partial_fit`` and the engines ask ``isinstance(model, Capability)`` instead of probing attributes.

Examples
--------
>>> from ppmix import GMM, MixtureOfExperts
>>> isinstance(GMM(2), ShardableEM), isinstance(MixtureOfExperts(2), ShardableEM)
(True, False)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "ConjugateGibbs",
    "DataStatisticsEM",
    "GibbsSampler",
    "GlobalObjectiveEM",
    "LabelledRows",
    "SequenceData",
    "ShardableEM",
]


@runtime_checkable
class ShardableEM(Protocol):
    """EM whose M-step needs only sums over the data: the statistics of every shard merge
    (:func:`~ppmix.components.family.merge_statistics`) into those of all rows, so EM runs on shards
    (:func:`ppmix.distributed.fit_em`) and on a stream (``partial_fit``) with the in-memory answer."""

    is_fitted: bool

    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> Any: ...

    def _em_data(self, data: Any) -> Any: ...

    def _n_observations(self, data: Any) -> int: ...

    def _em_initialize(self, data: Any, generator: torch.Generator) -> None: ...

    def _e_step(self, data: Any) -> tuple[Any, torch.Tensor]: ...

    def _em_statistics(self, data: Any, stats: Any) -> Any:
        """What the M-step needs of ``data`` under the E-step's ``stats``, as mergeable statistics."""

    def _em_update(self, stats: Any) -> None:
        """The M-step from (merged) statistics."""

    def _record_result(self, engine: str, result: Any) -> Any:
        """Record the fit's :class:`~ppmix.engines.result.FitResult` as the fitted attributes."""

    def _release_training_data(self) -> None:
        """Drop prepared training data held from an earlier fit."""


@runtime_checkable
class GlobalObjectiveEM(Protocol):
    """EM whose objective has terms that are not sums over the rows (e.g. a prior on the switches): the
    E-step's objective includes them once; on shards they are subtracted per shard and added once."""

    def _em_global_objective(self, n_observations: int) -> torch.Tensor: ...


@runtime_checkable
class DataStatisticsEM(Protocol):
    """EM that fits some parameters once, before the iterations, from statistics of all the data (e.g. the
    pf models' background): on shards, the statistics of every shard merge first."""

    def _em_data_statistics(self, data: Any) -> Any: ...

    def _em_set_data_statistics(self, stats: Any) -> None: ...


@runtime_checkable
class GibbsSampler(Protocol):
    """The blocked Gibbs sampler of a model whose priors are conjugate, every chain at once (a part the model
    builds: :meth:`ConjugateGibbs._gibbs_sampler`)."""

    def start(self, data: Any, n_chains: int, generator: torch.Generator) -> Any:
        """The latents (assignments, state paths) of every chain, drawn given the model's starting values."""

    def sweep(self, data: Any, latent: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor, Any]:
        """One sweep of every chain: the globals drawn given ``latent`` (``{site: (chains, ...)}``), their log
        joint density ``log p(x | globals) + log p(globals)`` ``(chains,)`` and the latents drawn given them."""


@runtime_checkable
class ConjugateGibbs(Protocol):
    """A model whose priors are conjugate, sampled by blocked Gibbs sweeps
    (:func:`~ppmix.engines.conjugate_gibbs.run_gibbs`) of the sampler it builds."""

    def _gibbs_sampler(self) -> GibbsSampler:
        """The model's :class:`GibbsSampler`."""


@runtime_checkable
class SequenceData(Protocol):
    """A model of sequences: a DataFrame's ``sequence_column`` names each row's sequence."""

    sequence_column: str | None


@runtime_checkable
class LabelledRows(Protocol):
    """Prepared data of a supervised model of rows: features ``x`` ``(N, D)`` and their (possibly missing)
    frame ``labels``."""

    x: torch.Tensor
    labels: Any
