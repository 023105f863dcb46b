"""Gradient compression for DDP (parallel.data_parallel: ddp): one communication hook per run that can
compress with fp16, PowerSGD or 8-bit quantisation with error feedback, and fall back to fp16
when validation degrades (Trainer calls ``fall_back``).

8-bit with error feedback: each bucket's gradient plus the residual left from the last step
is quantised to int8 with one scale per parameter (max |x| / 127: independent of how DDP
groups parameters into buckets, which it changes after the first step of every process); the
residual keeps what quantisation lost, so the error does not accumulate, and is checkpointed
per parameter. int8 values from N ranks cannot be
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

from ..layout import ParallelConfigError
from . import names

HOOKS = ("none", "fp16", "powersgd", "int8_ef")
# "allreduce": plain fp32 averaging issued from Python (synchronously), so the trainer's
# collective timer sees DDP's communication (DDP's built-in reducer calls it from C++).


def quantize_int8(x: torch.Tensor, sizes: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and one scale (max |x| / 127) per segment of ``sizes`` (the whole of x by default)."""
    sizes = sizes or [x.numel()]
    scale = (
        (torch.stack([part.abs().max() for part in x.split(sizes)]) / 127.0)
        .clamp_min(torch.finfo(torch.float32).tiny)
        .float()
    )
    return torch.round(x / expand_scales(scale, sizes)).clamp_(-127, 127).to(torch.int8), scale


def expand_scales(scale: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(scale, torch.tensor(sizes, device=scale.device), output_size=sum(sizes))


class CompressionHook:
    def __init__(self, kind: str, process_group=None, powersgd_rank: int = 2, timed: bool = False):
        if kind not in (*HOOKS[1:], "allreduce"):
            raise ParallelConfigError(f"parallel.comm_hook {kind!r}: expected one of {', '.join(HOOKS)}")
        self.kind = kind
        self.active = kind
        self.group = process_group
        self.residuals: dict[torch.Tensor, torch.Tensor] = {}  # int8-EF: parameter -> its flat fp32 residual
        # With ``timed``, each bucket's collective is waited for and its time kept (DDP runs hooks
        # outside the trainer's collective timer); without, the future is returned unwaited.
        self.timed = timed
        self.seconds = 0.0
        self.fell_back_at: int | None = None
        self.powersgd = (
            psgd.PowerSGDState(
                process_group=process_group, matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=2
            )
            if kind == "powersgd"
            else None
        )

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

    def checkpoint_part(self, model: torch.nn.Module) -> "ResidualState":
        return ResidualState(self, model)

    def _int8(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        grad = bucket.buffer()
        world = dist.get_world_size(self.group)
        params = bucket.parameters()
        sizes = [p.numel() for p in params]
        if sum(sizes) != grad.numel():
            raise RuntimeError(
                f"int8_ef hook: bucket {bucket.index()} holds {grad.numel()} values, its parameters {sum(sizes)}"
            )
        x = grad.float() + torch.cat(
            [
                self.residuals[p] if p in self.residuals else grad.new_zeros(n, dtype=torch.float32)
                for p, n in zip(params, sizes)
            ]
        )
        q, scale = quantize_int8(x, sizes)  # one scale per parameter: the same whatever the bucketing
        for p, r in zip(params, (x - q.float() * expand_scales(scale, sizes)).split(sizes)):
            self.residuals[p] = r.clone()
        qs = [torch.empty_like(q) for _ in range(world)]
        scales = [torch.empty_like(scale) for _ in range(world)]
        dist.all_gather(qs, q, group=self.group)
        dist.all_gather(scales, scale, group=self.group)
        total = torch.zeros_like(x)
        for qi, si in zip(qs, scales):
            total.add_(qi.float() * expand_scales(si, sizes))
        grad.copy_(total / world)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(grad)
        return fut


class ResidualState:
    """A checkpoint part (see ``dchag.train.state``): this rank's int8-EF residuals by
    parameter, so a resumed run continues the error feedback where it stopped. Kept per
    parameter, not per bucket, because DDP rebuilds its buckets after the first step of every
    process. Other hooks have no state. A rank new to a checkpoint of fewer ranks starts
    with no residual."""

    per_rank = True

    def __init__(self, hook: CompressionHook, model: torch.nn.Module):
        self.hook, self.model = hook, model

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.hook.kind != "int8_ef":
            return {}
        rank = dist.get_rank(self.hook.group)
        out = {}
        for key, p in names.named_parameters(self.model):
            if p.requires_grad:
                if p not in self.hook.residuals:
                    self.hook.residuals[p] = torch.zeros(p.numel(), dtype=torch.float32, device=p.device)
                out[f"rank{rank}.{key}"] = self.hook.residuals[p]
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass  # loaded in place
