"""The process layout's arithmetic, without torch (the Snakefile checks it when it plans):
world = dp x tp, and which data-parallel modes combine with tensor parallelism."""

from __future__ import annotations

from .errors import DchagError
from .vocabulary import DataParallel

DP_MODES = tuple(DataParallel)


class ParallelConfigError(DchagError, ValueError):
    """The process layout does not fit the config's parallel section."""


def data_parallel_size(tp: int, dp_mode: str, world_size: int) -> int:
    """The data-parallel degree of ``world_size`` processes in tensor-parallel groups of
    ``tp``; raises ParallelConfigError where the layout cannot be built."""
    if tp < 1 or world_size % tp:
        raise ParallelConfigError(
            f"world size {world_size} is not a multiple of the tensor-parallel size tp={tp}; "
            f"launch a multiple of {tp} processes (torchrun --nproc-per-node) or change parallel.tp"
        )
    if dp_mode not in DP_MODES:
        raise ParallelConfigError(f"parallel.data_parallel {dp_mode!r}: expected one of {', '.join(DP_MODES)}")
    if dp_mode == DataParallel.DDP and tp > 1:
        raise ParallelConfigError(
            "parallel.data_parallel: ddp works with tp=1 only; use fsdp to combine data and tensor parallelism"
        )
    dp = world_size // tp
    if dp_mode == DataParallel.NONE and dp > 1:
        raise ParallelConfigError(
            f"parallel.data_parallel: none, but world size {world_size} leaves {dp} data-parallel replicas"
        )
    return dp
