"""The shapes of the pipeline's cluster jobs: where a torchrun job runs and what it asks Slurm
for, and the memory of the ERA5 preprocessing jobs, fitted to the preprocessing benchmark."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .bench.fits import fitted


@dataclass(frozen=True)
class JobShape:
    """Where a torchrun job runs: nodes, processes (GPUs) per node, and its Slurm limits."""

    nodes: int
    nproc: int
    gpus_per_node: int
    runtime: int  # minutes
    mem_mb: int

    def slurm_resources(self) -> dict:
        """Slurm resources: nodes x processes per node; with several nodes, one task per node
        started by srun (mpi). Site values (partition, account, a typed gres) belong in the
        profile."""
        return {
            "runtime": self.runtime,
            "mem_mb": self.mem_mb,
            "nodes": self.nodes,
            "tasks": self.nodes,
            "gres": f"gpu:{self.gpus_per_node}" if self.gpus_per_node else "",
            "mpi": "srun" if self.nodes > 1 else "",
        }

    def launcher(self, dchag: str) -> str:
        """`dchag` on one node; `srun -n NODES --ntasks-per-node 1 dchag` over several."""
        return f"srun -n {self.nodes} --ntasks-per-node 1 {dchag}" if self.nodes > 1 else dchag


# Peak RSS (MB) of the ERA5 jobs after the regridding, as a fixed part and a part per unit of
# data per time step (80 channels on the 64 x 32 grid of 5.625 deg): fitted by
# benchmarks/preprocess_benchmark.py (dchag.bench.fits.era5_job_mb) to its results at 5.625 deg
# and a whole year at 1.40625 deg, 80 channels (benchmarks/results/preprocess.json). The split
# assembly and the statistics combine stay near 130 and 100 MB on any grid.
ERA5_JOB_MB = {job: tuple(mb) for job, mb in fitted("era5_job_mb")["mb"].items()}


def era5_mem_mb(job: str, era5: dict, floor: int) -> int:
    """Memory (MB) to ask the scheduler for one ``job`` (a rule of ERA5_JOB_MB): 1.5 x the
    peak measured for the config's channels and grid, at least ``floor``."""
    from .era5.source import channel_names
    from .grids import weatherbench_grid

    fixed, per_unit = ERA5_JOB_MB[job]
    ny, nx = weatherbench_grid(era5["grid"]).shape
    units = len(channel_names(era5)) * ny * nx / (80 * 32 * 64)
    return max(floor, int(math.ceil(1.5 * (fixed + per_unit * units) / 100) * 100))
