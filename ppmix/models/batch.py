"""``Batch``: the one type of data every EM hook of the structures reads.

``prepare_data`` validates the user's input (rows ``(N, D)``, padded sequences, features and labels); ``fit`` adds
the ``sample_weight`` (:meth:`~ppmix.models.base.MixtureModel._weigh`, a batch of the prepared data and their
weights) and the structure's EM data preparation (``_em_data``) completes the batch once per fit: the rows as the
family prepares them (centred, logged, ...), the partly observed view where entries are missing, the sequences'
lengths and mask, the known latents of a partly labelled fit. The structures and their parts then ask the batch
(``batch.rows``, ``batch.weight``, ``batch.observed``, ``batch.lengths``, ``batch.known``) and never inspect what
kind of data they hold.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Batch", "as_batch"]


@dataclass(frozen=True, eq=False)
class Batch:
    """Prepared data of one fit (or one shard, one chunk of a stream), as the EM hooks read them.

    Attributes
    ----------
    data : Any
        What ``prepare_data`` returned: rows ``(N, D)`` (NaN where missing), a padded
        :class:`~ppmix.models._sequences.SequenceBatch`, features and labels.
    weight : Tensor or None
        One weight per unit (row, or sequence); None: every unit counts once.
    rows : Any
        The rows (an HMM's valid frames, stacked) as the family prepares them (``family.prepare``: centred, logged,
        ...), or None before the EM data preparation and where entries are missing.
    observed : PartlyObserved or None
        The rows as complete and partly observed ones, where some entries are missing
        (:class:`~ppmix.models._missing.PartlyObserved`); None where every entry is observed.
    sequences : SequenceBatch or None
        The padded sequences (their ``lengths`` and ``mask``) of a structure over sequences.
    known : Clamp or None
        The known latents of a partly labelled fit (:class:`~ppmix.models.known_latents.Clamp`).
    labels : Any
        Observed labels of a supervised structure (the pf models' frame labels), or None.
    inputs : Any
        Per-unit inputs of an input-driven structure, or None.

    Examples
    --------
    >>> batch = Batch(torch.zeros(3, 2), torch.tensor([1.0, 2.0, 0.0]))
    >>> batch.n_observations, batch.prepared(rows=batch.data).rows.shape
    (3.0, torch.Size([3, 2]))
    >>> Batch(torch.zeros(3, 2)).n_observations
    3
    """

    data: Any
    weight: torch.Tensor | None = None
    rows: Any = None
    observed: Any = None
    sequences: Any = None
    known: Any = None
    labels: Any = None
    inputs: Any = None

    def prepared(self, **fields: Any) -> "Batch":
        """This batch with ``fields`` (``rows``, ``observed``, ``sequences``, ``known``, ...) set."""
        return dataclasses.replace(self, **fields)

    @property
    def lengths(self) -> torch.Tensor:
        """The sequences' lengths ``(B,)``."""
        return self.sequences.lengths

    @property
    def mask(self) -> torch.Tensor:
        """The valid steps of the padded sequences ``(B, T)``."""
        return self.sequences.mask

    @property
    def n_rows(self) -> int:
        """The number of rows (of valid frames)."""
        if self.sequences is not None:
            return int(self.sequences.lengths.sum())
        return int(self.observed.x.shape[0] if self.observed is not None else self.data.shape[0])

    @property
    def n_observations(self) -> float | int:
        """The rows (an HMM's steps), each counted as often as its unit's weight: what EM's objective is reported
        per."""
        if self.weight is None:
            return self.n_rows
        if self.sequences is None:
            return float(self.weight.sum())
        return float(self.weight @ self.sequences.lengths.to(self.weight))

    @property
    def frame_weight(self) -> torch.Tensor | None:
        """Every row's weight ``(n_rows,)`` (an HMM's frame: its sequence's), or None without weights."""
        if self.weight is None or self.sequences is None:
            return self.weight
        seq = self.sequences
        return self.weight.to(seq.x)[:, None].expand(seq.n_sequences, seq.max_length)[seq.mask]


def as_batch(data: Any) -> Batch:
    """``data`` as a :class:`Batch`: a batch as it is, any other prepared data as a batch of unweighted units (the
    one place where prepared data are told apart by type).

    Examples
    --------
    >>> as_batch(torch.zeros(2, 1)).weight is None, as_batch(Batch("rows", torch.ones(2))).weight.tolist()
    (True, [1.0, 1.0])
    """
    return data if isinstance(data, Batch) else Batch(data)
