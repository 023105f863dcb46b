"""Gradient compression for DDP (parallel.dp: ddp): one communication hook per run that can
compress with fp16, PowerSGD or 8-bit quantisation with error feedback, and fall back to fp16
when validation degrades (Trainer calls ``fall_back``).

8-bit with error feedback: each bucket's gradient plus the residual left from the last step
is quantised to int8 with one scale per bucket (max |x| / 127); the residual keeps what
quantisation lost, so the error does not accumulate. int8 values from N ranks cannot be
summed in 8 bits, so the quantised buckets and their scales are all-gathered (N x 1 byte per
value received) and averaged in fp32 — cheaper than fp32 all-reduce (2 x 4 bytes per value
sent) up to about 8 ranks; the cost model (benefit/costmodel.py) says the same.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real types.
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

HOOKS = ("none", "fp16", "powersgd", "int8_ef")
# "allreduce": plain fp32 averaging issued from Python (synchronously), so the trainer's
# collective timer sees DDP's communication (DDP's built-in reducer calls it from C++).


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.abs().max() / 127.0).clamp_min(torch.finfo(torch.float32).tiny).reshape(1).float()
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8), scale


class CompressionHook:
    def __init__(self, kind: str, process_group=None, powersgd_rank: int = 2, timed: bool = False):
        if kind not in (*HOOKS[1:], "allreduce"):
            raise ValueError(f"parallel.comm_hook {kind!r}: expected one of {', '.join(HOOKS)}")
        self.kind = kind
        self.active = kind
        self.group = process_group
        self.residuals: dict[int, torch.Tensor] = {}
        # With ``timed``, each bucket's collective is waited for and its time kept (DDP runs hooks
        # outside the trainer's collective timer); without, the future is returned unwaited.
        self.timed = timed
        self.seconds = 0.0
        self.fell_back_at: int | None = None
        self.powersgd = (psgd.PowerSGDState(process_group=process_group, matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=2) if kind == "powersgd" else None)

    def fall_back(self, step: int) -> bool:
        """Switch to fp16 compression from now on; True if this changed anything."""
        if self.active in ("fp16", "allreduce"):
            return False
        self.active, self.fell_back_at = "fp16", step
        self.residuals.clear()
        return True

    def take_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    @staticmethod
    def hook(state: "CompressionHook", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if not state.timed:
            return state._dispatch(bucket)
        t0 = time.perf_counter()
        fut = state._dispatch(bucket)
        fut.wait()
        state.seconds += time.perf_counter() - t0
        return fut

    def _dispatch(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        state = self
        if state.active == "allreduce":
            grad = bucket.buffer()
            dist.all_reduce(grad, group=state.group)
            grad.div_(dist.get_world_size(state.group))
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(grad)
            return fut
        if state.active == "fp16":
            return default_hooks.fp16_compress_hook(state.group, bucket)
        if state.active == "powersgd":
            return psgd.powerSGD_hook(state.powersgd, bucket)
        return state._int8(bucket)

    def _int8(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        grad = bucket.buffer()
        world = dist.get_world_size(self.group)
        e = self.residuals.get(bucket.index())
        x = grad.float() + (e if e is not None and e.shape == grad.shape else 0.0)
        q, scale = quantize_int8(x)
        self.residuals[bucket.index()] = x - q.float() * scale
        qs = [torch.empty_like(q) for _ in range(world)]
        scales = [torch.empty_like(scale) for _ in range(world)]
        dist.all_gather(qs, q, group=self.group)
        dist.all_gather(scales, scale, group=self.group)
        total = torch.zeros_like(x)
        for qi, si in zip(qs, scales):
            total.add_(qi.float() * si)
        grad.copy_(total / world)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(grad)
        return fut
