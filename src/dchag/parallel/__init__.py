"""Parallelizations applied to the one-device model over a named device mesh ("dp", "tp"):
tensor parallelism (baseline TP and D-CHAG), FSDP2 / DDP, activation checkpointing
(:func:`dchag.parallel.parallelize.parallelize_model`). Importing the package imports the mesh
alone, not FSDP and DTensor: `dchag launch-train` checks a run without them."""

from .dims import ParallelDims, init_distributed

__all__ = ["ParallelDims", "init_distributed"]
