"""Stopping a run at a step boundary on a signal: SIGTERM (a Slurm time limit, scancel, torchrun
shutting its workers down) or SIGUSR1 (a warning before a time limit). Every rank finishes the
step it is in; the ranks agree on the step (one all-reduce per step, so none waits in a
collective the others left); the step is checkpointed and the run ends with one line saying so.
A rerun (Snakemake's retry of the job) continues from that checkpoint."""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from ..errors import DchagError

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(DchagError):
    """A run stopped by a signal after checkpointing its step."""


class StopOnSignal:
    """Within ``with``: the signals of SIGNALS are noted, not obeyed; :meth:`agreed` tells every
    rank at once whether any rank got one."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict = {}

    def __enter__(self) -> StopOnSignal:
        self._previous = {s: signal.signal(s, self._note) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _note(self, signum, frame) -> None:
        self.signum = signum

    def agreed(self, device: torch.device) -> str | None:
        """The name of the signal any rank got (the highest number), or None: on every rank."""
        flag = torch.tensor([self.signum], device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return signal.Signals(int(flag.item())).name if int(flag.item()) else None


def ignore_in_worker(worker_id: int) -> None:
    """A data loader worker's start: the signals are its rank's to act on (the rank stops the
    workers when it ends)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
