"""Running a check in several real processes with torch.distributed on gloo (CPU)."""

from __future__ import annotations

import os
import resource
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANKS_CPU = [0.0]  # CPU seconds of the ranks this process ran: children of their fork server, not of ours


def _worker(rank: int, world_size: int, port: int, fn, args, report: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
        u = resource.getrusage(resource.RUSAGE_SELF)
        Path(report, f"{rank}.cpu").write_text(str(u.ru_utime + u.ru_stime))


# The ranks fork from one server process (per test process) that has imported torch and the
# checks once; "spawn" would start every rank as a fresh interpreter, ~3-4 s of imports each.
# (The server itself is started fresh and holds no threads or process group when it forks.)
mp.set_forkserver_preload(
    [
        "torch",
        "torch.distributed",
        "torch.distributed.tensor",
        "torch.distributed.fsdp",
        "torch.distributed.tensor.parallel",
        "dchag.model",
        "dchag.parallel",
        "parallel_checks",
    ]
)


def run_distributed(fn, world_size: int, *args) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; a failure on any rank fails."""
    with tempfile.TemporaryDirectory() as report:
        try:
            mp.start_processes(
                _worker,
                args=(world_size, free_port(), fn, args, report),
                nprocs=world_size,
                join=True,
                start_method="forkserver",
            )
        finally:  # what the ranks cost counts as this test's (tests/conftest.py: cpu_s)
            RANKS_CPU[0] += sum(float(f.read_text()) for f in Path(report).glob("*.cpu"))
