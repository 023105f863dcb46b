"""What a training run records: ``log.csv`` (one row per step), ``ranks.csv`` (every rank's
throughput, memory and timings), TensorBoard event files in ``tensorboard/``, the metrics of
an MLflow run (``train.mlflow``, :mod:`dchag.train.tracking`) and a progress bar, all on rank 0.
Files under construction end in ``.partial`` until the run completes.

Instruments that slow the step they measure are opt-in: ``train.measure_comm`` times the
collectives of every step (``instrumented`` = ``comm``; the timings are kept, they are what
is being measured), ``train.measure_memory`` tracks one step's peak memory on the CPU with
MemTracker (``instrumented`` = ``memory``), whose bookkeeping distorts that step: its timings
are NaN and the run's log names it as left out.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

RANK_FIELDS = ["samples_per_s", "peak_mem_mib", "t_data", "t_forward", "t_backward", "t_optimizer", "t_comm"]
FIELDS = ["step", "epoch", "loss", "lr", "grad_norm", *RANK_FIELDS, "instrumented", "val_loss", "val_accuracy"]


@dataclass
class StepTimes:
    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0


class CommTimer(TorchDispatchMode):
    """Seconds spent inside collective calls and their waits (c10d and functional collectives
    as dispatched ops): on gloo these block, so this is the communication time; on NCCL the
    calls are asynchronous and this undercounts (use a profiler there). It intercepts every
    operator of the step, which slows the step: opt-in (``train.measure_comm``)."""

    def __init__(self):
        super().__init__()
        self.total = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "c10d" not in str(func):
            return func(*args, **(kwargs or {}))
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.total += time.perf_counter() - t0
        return out

    def take(self) -> float:
        total, self.total = self.total, 0.0
        return total


class CsvLog:
    """An append-only CSV log. A resumed run starts it from the history its checkpoint kept
    (``history``: the copy saved with the checkpoint), up to the step resumed from: later rows
    are redone by the resumed run, and a log deleted meanwhile (Snakemake deletes a rerun job's
    outputs) loses nothing."""

    def __init__(self, path: Path, fields: list[str], resume_step: int, history: Path | None = None):
        self.path, self.fields = path, fields
        kept = []
        source = history if history is not None and history.exists() else path
        if resume_step > 0 and source.exists():
            with open(source) as f:
                kept = [r for r in csv.DictReader(f) if r.get("step") and int(r["step"]) <= resume_step]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(kept)

    def append(self, row: dict) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow({k: row.get(k) for k in self.fields})


def gather_rank_values(row: dict, device: torch.device) -> list[list[float]] | None:
    """Every rank's RANK_FIELDS of this step on rank 0 (None elsewhere): one small collective,
    on the training device (NCCL takes no CPU tensors)."""
    mine = torch.tensor(
        [row[k] if row.get(k) is not None else float("nan") for k in RANK_FIELDS], dtype=torch.float64, device=device
    )
    rank0 = dist.get_rank() == 0
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())] if rank0 else None
    dist.gather(mine, everyone, dst=0)
    return [v.tolist() for v in everyone] if rank0 else None


class MetricsLogger:
    """Rank 0's logs of one run (other ranks hold a logger that writes nothing)."""

    def __init__(
        self,
        out: Path,
        run: str,
        rank: int,
        total_steps: int,
        resume_step: int,
        tensorboard: bool,
        history: Path | None = None,
        tracker=None,
    ):
        self.out, self.active, self.tracker = Path(out), rank == 0, tracker
        self.paths = {"log": self.out / "log.csv.partial", "ranks": self.out / "ranks.csv.partial"}
        self.excluded: list[int] = []
        if not self.active:
            return
        kept = {name: history / f"{name}.csv" if history is not None else None for name in self.paths}
        self.log = CsvLog(self.paths["log"], FIELDS, resume_step, kept["log"])
        self.ranks = CsvLog(self.paths["ranks"], ["step", "rank", *RANK_FIELDS], resume_step, kept["ranks"])
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run drops the events its previous attempt wrote past the resume step
            self.tb = SummaryWriter(
                log_dir=str(self.out / "tensorboard"), purge_step=resume_step + 1 if resume_step else None
            )
        self.bar = tqdm(total=total_steps, initial=resume_step, desc=f"train {run}", mininterval=2)

    def record(self, row: dict, rank_values: list[list[float]] | None) -> None:
        if "memory" in (row.get("instrumented") or ""):
            self.excluded.append(int(row["step"]))
        if not self.active:
            return
        self.log.append(row)
        for r, values in enumerate(rank_values or []):
            self.ranks.append({"step": row["step"], "rank": r, **dict(zip(RANK_FIELDS, values))})
        scalars = {
            f"train/{k}" if not k.startswith("val_") else f"val/{k[4:]}": v
            for k, v in row.items()
            if k not in ("step", "epoch", "instrumented") and isinstance(v, (int, float)) and v == v
        }
        for k, v in scalars.items() if self.tb is not None else ():
            self.tb.add_scalar(k, v, row["step"])
        if self.tracker is not None:
            self.tracker.log_step(row["step"], scalars)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{row['loss']:.4f}")

    def history(self) -> dict[str, Path | str]:
        """The logs as they stand, for a checkpoint to keep (rank 0's; none elsewhere)."""
        if not self.active:
            return {}
        kept: dict[str, Path | str] = {f"{name}.csv": path for name, path in self.paths.items()}
        if self.tracker is not None:
            from .tracking import RECORD

            kept[RECORD] = self.tracker.record()  # a run resumed from the checkpoint continues it
        return kept

    def close(self, complete: bool) -> None:
        """Flush; when the run completed, the logs take their final names."""
        if not self.active:
            return
        self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.tracker is not None:  # called from the trainer's finally: the exception, if any, is in flight
            from .stop import Stopped

            stopped = isinstance(sys.exc_info()[1], Stopped)
            self.tracker.end("FINISHED" if complete else "KILLED" if stopped else "FAILED")
        if complete:
            self.paths["log"].replace(self.out / "log.csv")
            self.paths["ranks"].replace(self.out / "ranks.csv")
        if self.excluded:
            log.info(
                f"step(s) {self.excluded} ran under memory tracking and are left out of the timings "
                "(NaN in log.csv; its 'instrumented' column names them)"
            )


class StepInstruments:
    """What is measured around a training step, out of the loop: the step's phases (always),
    the collectives' time (``train.measure_comm``), and peak memory — the allocator's peak on a
    GPU every step, one step (the second a process runs: optimizer state exists then) tracked
    by MemTracker on the CPU when ``train.measure_memory`` asks. MemTracker's bookkeeping slows
    the step it tracks: that step's timings are NaN and its row says ``memory``."""

    def __init__(self, device: torch.device, tracked: tuple, measure_comm: bool, measure_memory: bool, hook_state=None):
        self.device, self.tracked = device, tracked
        self.comm = CommTimer() if measure_comm else None
        self.measure_memory, self.hook_state = measure_memory, hook_state
        self.steps_run = 0
        self.peak_mib = float("nan")

    def _tracks_memory(self) -> bool:
        return self.device.type == "cuda" or (self.measure_memory and self.steps_run == 1)

    @contextlib.contextmanager
    def step(self, batch_size: int, data_s: float, t0: float):
        """Around one step; yields a dict that holds the row's measured fields on exit."""
        from .memory import step_peak

        fields: dict = {}
        track = self._tracks_memory()
        tracked = step_peak(self.device, *self.tracked) if track else contextlib.nullcontext({})
        with tracked as mem, self.comm or contextlib.nullcontext():
            yield fields
        step_s = time.perf_counter() - t0
        times = dataclasses.replace(fields.pop("times"), data=data_s)
        t_comm = None
        if self.comm is not None:
            t_comm = self.comm.take() + (self.hook_state.take_seconds() if self.hook_state else 0.0)
        if track:
            self.peak_mib = mem["total"]
        memory = track and self.device.type == "cpu"
        instrumented = "+".join(k for k, on in (("comm", self.comm is not None), ("memory", memory)) if on)
        if memory:  # MemTracker's bookkeeping slowed this step: no timings
            times, step_s = StepTimes(*[float("nan")] * 4), float("nan")
            t_comm = float("nan") if t_comm is not None else None
        self.steps_run += 1
        fields.update(
            {
                "samples_per_s": batch_size / step_s if step_s == step_s else float("nan"),
                "peak_mem_mib": self.peak_mib,
                **{f"t_{k}": v for k, v in dataclasses.asdict(times).items()},
                "t_comm": t_comm,
                "instrumented": instrumented,
            }
        )
