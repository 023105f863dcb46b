"""Running a check in several real processes with torch.distributed on gloo (CPU)."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def _rank(rank: int, world_size: int, port: int, report: str):
    """This process as rank ``rank`` of torchrun's (its variables, one math thread); at the end its
    CPU seconds into ``report`` (see :data:`RANKS_CPU`)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    try:
        yield
    finally:
        u = resource.getrusage(resource.RUSAGE_SELF)
        Path(report, f"{rank}.cpu").write_text(str(u.ru_utime + u.ru_stime))


def _worker(rank: int, world_size: int, port: int, fn, args, report: str) -> None:
    with _rank(rank, world_size, port, report):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            fn(rank, world_size, *args)
            dist.barrier()
        finally:
            dist.destroy_process_group()


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
        "dchag.cli",
        "dchag.train.trainer",
        "torch._inductor",
        "tensorstore",
        "parallel_checks",
    ]
)


def run_distributed(fn, world_size: int, *args) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; a failure on any rank fails."""
    _start(_worker, world_size, fn, args)


def _start(worker, world_size: int, *args) -> None:
    """``worker(rank, world_size, port, *args, report)`` on ``world_size`` ranks forked from the server."""
    with tempfile.TemporaryDirectory() as report:
        try:
            mp.start_processes(
                worker,
                args=(world_size, free_port(), *args, report),
                nprocs=world_size,
                join=True,
                start_method="forkserver",
            )
        finally:  # what the ranks cost counts as this test's (tests/conftest.py: cpu_s)
            RANKS_CPU[0] += sum(float(f.read_text()) for f in Path(report).glob("*.cpu"))


def _dchag_rank(rank: int, world_size: int, port: int, args: list[str], console: str, report: str) -> None:
    """``dchag ARGS`` as a rank of torchrun runs it, its stdout and stderr into ``console``.<rank>."""
    import sys

    from dchag.cli import main

    with _rank(rank, world_size, port, report):
        with open(f"{console}.{rank}", "w") as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        try:
            code = main(args)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    if code:
        raise RuntimeError(f"dchag {args[0]} ended with exit status {code} on rank {rank}")


def run_dchag_ranks(args: list[str], world_size: int, console: Path) -> str:
    """``dchag ARGS`` (e.g. ``train``) on ``world_size`` gloo ranks forked from this process's
    server: what torchrun's ranks run, without torchrun's agent (``dchag launch-train``, which
    tests of the launch itself start) and its second import of torch, a fraction of a launch's
    CPU time. Returns the ranks' console output, rank 0's first, also written to ``console``."""
    try:
        _start(_dchag_rank, world_size, args, str(console))
    finally:
        parts = [Path(f"{console}.{rank}") for rank in range(world_size)]
        text = "".join(p.read_text() for p in parts if p.exists())
        console.write_text(text)
        for p in parts:
            p.unlink(missing_ok=True)
    return text
