"""Peak memory of one training step, per rank.

On a GPU: the caching allocator's peak (torch.cuda.max_memory_allocated). On the CPU the
process's peak RSS says nothing about a step (allocator caching, the interpreter, libraries;
see docs/conventions.md), so one step is run under torch's MemTracker, which follows every
tensor's storage and attributes it to parameters, buffers, gradients, optimizer state and
activations (+ temporaries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

MIB = 2**20
KINDS = ("parameters", "gradients", "optimizer", "activations")


@contextlib.contextmanager
def step_peak(device: torch.device, *tracked: nn.Module | torch.optim.Optimizer) -> Iterator[dict]:
    """Measure the step run inside; on exit the yielded dict holds ``total`` MiB (and, on the
    CPU, the split by kind at the peak, in MiB, and in ``bytes`` by MemTracker's kinds). The
    CPU's measure also follows fake tensors (dchag.benefit.fakemem)."""
    result: dict = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result["total"] = torch.cuda.max_memory_allocated(device) / MIB
        return
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    tracker = MemTracker()
    tracker.track_external(*tracked)
    # MemTracker registers a gradient hook on every parameter of every module it sees, which
    # raises for a frozen one (the MAE decoder's fixed position embedding): mark those as
    # hooked already, with handles that remove nothing.
    for obj in tracked:
        if isinstance(obj, nn.Module):
            for p in obj.parameters():
                if not p.requires_grad:
                    tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    # a measurement of several steps calls this between them (MemTracker's module statistics
    # follow one iteration)
    result["new_iteration"] = tracker.reset_mod_stats
    with tracker:
        yield result
    del result["new_iteration"]
    per: dict[str, float] = {}  # bytes by MemTracker's names of the kinds (Parameter, ..., Total)
    for dev_stats in tracker.get_tracker_snapshot("peak").values():
        for kind, nbytes in dev_stats.items():
            name = getattr(kind, "value", str(kind))
            per[name] = per.get(name, 0) + nbytes
    get = lambda *kinds: sum(per.get(k.value, 0) for k in kinds) / MIB  # noqa: E731
    result.update(
        {
            "total": per.get("Total", sum(v for k, v in per.items() if k != "Total")) / MIB,
            "parameters": get(_MemRefType.PARAM, _MemRefType.BUFFER),
            "gradients": get(_MemRefType.GRAD),
            "optimizer": get(_MemRefType.OPT),
            "activations": get(_MemRefType.ACT, _MemRefType.TEMP),
            "bytes": per,
        }
    )


class _NoHook:
    def remove(self) -> None:
        pass
