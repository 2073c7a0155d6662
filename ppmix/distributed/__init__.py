"""Training beyond one machine.

- :func:`fit_em`: exact EM for GMM and HMM on data shards held in the workers' memory
  (a local process pool, a Dask cluster or this process); only parameters and the
  M-step's statistics travel (:mod:`ppmix.distributed.em`).
- :func:`fit_distributed`: a mixture of experts fitted on every shard and the local fits
  reduced to one by optimal transport, one communication round (:mod:`ppmix.distributed.moe`);
  ``rounds=2`` adds a second, the reduced gate refitted on every shard (:mod:`ppmix.distributed.gate_rounds`,
  whose :class:`GateRounds` records it).
- :func:`read_shard`, :func:`read_features`, :func:`shard_columns`: reading shards where they live.
"""

from ppmix.distributed.em import fit_em
from ppmix.distributed.gate_rounds import GateRounds
from ppmix.distributed.moe import DistributedFit, fit_distributed
from ppmix.distributed.shards import read_features, read_shard, shard_columns

__all__ = ["DistributedFit", "GateRounds", "fit_distributed", "fit_em", "read_features", "read_shard", "shard_columns"]
