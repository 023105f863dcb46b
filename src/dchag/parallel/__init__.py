"""Parallelizations applied to the one-device model over a named device mesh ("dp", "tp"):
tensor parallelism (baseline TP and D-CHAG), FSDP2 / DDP, activation checkpointing."""

from .dims import ParallelDims, init_distributed
from .parallelize import parallelize_model

__all__ = ["ParallelDims", "init_distributed", "parallelize_model"]
