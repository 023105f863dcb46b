"""The shapes of the pipeline's cluster jobs: where a torchrun job runs and what it asks Slurm
for, and the memory of the ERA5 preprocessing jobs, fitted to the preprocessing benchmark."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .bench.fits import fitted

# Host memory (MB) of a training job's processes beside what the config makes large (the cache,
# the model): one rank (torch and dchag imported; 0.4 GB peak RSS measured on the CPU for the
# demo's model, the rest is room for a GPU runtime's host side) and one loader worker (0.35 GB).
RANK_MB = 1024
WORKER_MB = 512


@dataclass(frozen=True)
class JobShape:
    """Where a torchrun job runs (nodes, processes per node, GPUs per node) and what each node
    needs: CPUs for every rank and its loader workers, and the host memory those processes,
    their caches and the one-device model need (None: the profile's)."""

    nodes: int
    nproc: int
    gpus_per_node: int
    workers: int = 0  # loader workers per rank
    mem_mb: int | None = None  # per node

    @property
    def cpus(self) -> int:
        """CPUs per node (the rule's threads; Slurm's cpus-per-task of the node's one task)."""
        return self.nproc * (1 + self.workers)

    def rank_threads(self, threads: int) -> int:
        """Compute threads of each rank when the job got ``threads`` CPUs: its share less one
        CPU per loader worker, at least 1."""
        return max(1, threads // self.nproc - self.workers)

    def slurm_resources(self) -> dict:
        """Slurm resources: nodes x processes per node; with several nodes, one task per node
        started by srun (mpi); the host memory where the config sets it. Site values
        (partition, account, the time limit, a typed gres) belong in the profile."""
        return {
            "nodes": self.nodes,
            "tasks": self.nodes,
            "gres": f"gpu:{self.gpus_per_node}" if self.gpus_per_node else "",
            "mpi": "srun" if self.nodes > 1 else "",
            **({"mem_mb": self.mem_mb} if self.mem_mb is not None else {}),
        }

    def launcher(self, dchag: str) -> str:
        """`dchag` on one node; `srun -n NODES --ntasks-per-node 1 dchag` over several."""
        return f"srun -n {self.nodes} --ntasks-per-node 1 {dchag}" if self.nodes > 1 else dchag


def train_mem_mb(nproc: int, workers: int, cache_mb: float, model_mb: float) -> int:
    """Host memory (MB) per node of a training job: each of its ``nproc`` ranks with its
    ``workers`` loader workers (RANK_MB, WORKER_MB), its cache (train.cache_mb: the most it
    holds) and the one-device float32 model it builds before parallelizing (``model_mb``);
    1.5 x that, rounded up to 1000 MB."""
    need = nproc * (RANK_MB + workers * WORKER_MB + cache_mb + model_mb)
    return int(math.ceil(1.5 * need / 1000) * 1000)


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


def node_memory_mb() -> tuple[float, str]:
    """The host memory (MB) this process may use, and what sets it: the tightest cgroup v2
    memory.max on its cgroup's path (where Slurm confines a job), else the machine's memory."""
    from pathlib import Path

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    best, where = total, "this machine's memory"
    try:
        path = next(
            line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines() if line[:3] == "0::"
        )
    except (OSError, StopIteration):
        return best / 2**20, where
    folder = Path("/sys/fs/cgroup") / path.lstrip("/")
    for d in (folder, *folder.parents):
        try:
            value = (d / "memory.max").read_text().strip()
        except OSError:
            value = "max"
        if value != "max" and int(value) < best:
            best, where = int(value), f"the cgroup memory limit ({d / 'memory.max'})"
        if d == Path("/sys/fs/cgroup"):
            break
    return best / 2**20, where
