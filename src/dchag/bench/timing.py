"""Steps timed as the benchmarks time them: after a warm-up, each path's peak memory of one
step, interleaved rounds (a change of the machine's load hits every path alike) and their
medians; under torch.distributed the slowest rank's seconds per step."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(
    paths: dict[str, tuple[list, Callable[[], None]]], warmup: int, rounds: int, device: torch.device | None = None
) -> dict[str, dict]:
    """``paths``: name -> (the modules and optimizers MemTracker follows, one step). Each path
    warmed up and its one step's peak memory taken (dchag.train.memory.step_peak, MiB), then
    ``rounds`` rounds timing one step of each path in turn: median seconds and every round's."""
    from ..train.memory import step_peak

    device = device or torch.device("cpu")
    out: dict[str, dict] = {}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for name, (tracked, step) in paths.items():
        for _ in range(warmup):
            step()
        with step_peak(device, *tracked) as mem:
            step()
        out[name] = {k: round(v, 1) for k, v in mem.items() if k != "bytes"}  # MiB (bytes: by kind)
    for _ in range(rounds):
        for name, (_, step) in paths.items():
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    for name in paths:
        out[name]["step_seconds"] = round(statistics.median(times[name]), 3)
        out[name]["step_seconds_all"] = [round(t, 3) for t in times[name]]
    return out


def slowest_rank_seconds(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds per step over ``steps`` timed steps, the slowest rank's (every rank calls it)."""
    import torch.distributed as dist

    dist.barrier()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    elapsed = torch.tensor((time.perf_counter() - t0) / steps, device=device, dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def max_over_ranks(value: float, device: torch.device) -> float:
    """The largest of every rank's ``value`` (every rank calls it)."""
    import torch.distributed as dist

    t = torch.tensor(float(value), device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)
