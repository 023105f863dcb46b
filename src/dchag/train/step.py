"""One optimisation step, the same for every task and parallel layout: forward under
autocast, backward, clipping by the global gradient norm, the optimizer and the schedule.

Under channel-subset rotation (``train.rotation``) only k = round(fraction x G) channel groups
are trained per step, consecutive modulo G, so every group is trained once every ceil(G / k)
steps; the idle groups' rows of the tokenizer's per-channel parameters and their Adam
moments come out of the optimizer step unchanged (the idle partial aggregators get no
gradient, so AdamW skips them).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import ConfigError, RunSettings
from ..errors import DchagError
from ..parallel.names import canonical
from ..parallel.parallelize import autocast, clip_grad_norm_
from ..vocabulary import Aggregation, Strategy
from .metrics import StepTimes
from .tasks import Task


def rotation_groups(rotation, groups: int, step: int) -> list[int] | None:
    """The channel groups trained at ``step`` (None: all, no rotation)."""
    if rotation is None:
        return None
    k = max(1, round(groups * rotation.fraction))
    return sorted({(step * k + j) % groups for j in range(k)})


def param_groups(model: torch.nn.Module, cfg: RunSettings, model_cfg, tp: int) -> list[dict]:
    """One optimizer group, or under rotation the rotated parts (tokenizer, partial
    aggregators) apart with their learning rate scaled by train.rotation.lr_scale; each split
    into its DTensor and its plain parameters (the multi-tensor AdamW takes one kind at once)."""
    return [g for group in _groups(model, cfg, model_cfg, tp) for g in _by_kind(group)]


def _by_kind(group: dict) -> list[dict]:
    from torch.distributed.tensor import DTensor

    kinds = [[p for p in group["params"] if isinstance(p, DTensor) == dt] for dt in (True, False)]
    return [{**group, "params": ps} for ps in kinds if ps]


def _groups(model: torch.nn.Module, cfg: RunSettings, model_cfg, tp: int) -> list[dict]:
    t, rot = cfg.train, cfg.train.rotation
    if rot is None:
        return [{"params": list(model.parameters())}]
    if model_cfg.aggregation == Aggregation.BASELINE or tp > 1 or cfg.parallel.strategy == Strategy.DCHAG:
        raise ConfigError(
            f"run {cfg.run!r}: train.rotation needs a hierarchical model (model.aggregation linear "
            f"or cross, model.groups) with parallel.strategy baseline and tp 1"
        )
    rotated = [p for n, p in model.named_parameters() if canonical(n).startswith(("tokenizer.", "partial."))]
    ids = {id(p) for p in rotated}
    return [
        {"params": [p for p in model.parameters() if id(p) not in ids]},
        {"params": rotated, "lr": t.lr * rot.lr_scale},
    ]


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """The learning rate's factor at a step: linear warm-up, then a cosine to ``min_ratio``."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


class NonFiniteError(DchagError, FloatingPointError):
    """The loss or the gradient norm of a step is NaN or infinite; no update was made."""


@dataclass
class StepResult:
    loss: torch.Tensor
    grad_norm: float
    times: StepTimes  # data time is the caller's


class TrainStep:
    def __init__(
        self,
        model,
        core,
        task: Task,
        opt,
        sched,
        *,
        device,
        precision: str,
        grad_clip: float,
        tp_group,
        channel_group,
        rotation,
        seed: int,
    ):
        self.model, self.core, self.task, self.opt, self.sched = model, core, task, opt, sched
        self.device, self.precision, self.clip = device, precision, grad_clip
        self.tp_group, self.channel_group, self.rotation, self.seed = tp_group, channel_group, rotation, seed

    def active_groups(self, step: int) -> list[int] | None:
        return rotation_groups(self.rotation, self.task.model_cfg.groups, step)

    def __call__(self, batch: list[torch.Tensor], step: int) -> StepResult:
        groups = self.active_groups(step)
        t1 = time.perf_counter()
        with autocast(self.device, self.precision):
            loss, _ = self.task.loss(self.model, batch, step, self.seed, self.channel_group, groups)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        grad_norm = float(clip_grad_norm_(self.model, self.clip, self.tp_group))
        self._check_finite(float(loss.detach()), grad_norm, batch, step)
        with self._idle_channels_kept(groups):
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        return StepResult(loss.detach(), grad_norm, StepTimes(0.0, t2 - t1, t3 - t2, time.perf_counter() - t3))

    def _check_finite(self, loss: float, grad_norm: float, batch: list[torch.Tensor], step: int) -> None:
        """Every rank stops together, before the update, if any rank's loss or gradient norm
        is not finite (one small all-reduce: a rank alone would leave the others waiting)."""
        bad = torch.tensor([0.0 if math.isfinite(loss) and math.isfinite(grad_norm) else 1.0], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if not bad.item():
            return
        self.opt.zero_grad(set_to_none=True)
        inputs = int(sum((~torch.isfinite(b)).sum() for b in batch if b.is_floating_point()))
        if inputs:
            cause = f"the batch holds {inputs} non-finite input value(s) on this rank"
        elif math.isnan(loss):
            cause = "the inputs are finite and the loss is NaN (a mean over no element, or a diverged model)"
        else:
            cause = "the inputs are finite: the model diverged (lower train.lr or raise train.warmup_steps)"
        raise NonFiniteError(f"step {step + 1}: loss {loss:g}, gradient norm {grad_norm:g} on this rank; {cause}")

    @contextlib.contextmanager
    def _idle_channels_kept(self, groups: list[int] | None):
        if groups is None:
            yield
            return
        tok = self.core.tokenizer
        idle = [i for g, (lo, hi) in enumerate(self.core.groups) if g not in groups for i in range(lo, hi)]
        params = [p for p in (tok.weight, tok.bias, tok.channel_embed) if p is not None]
        saved = [
            (
                p,
                p.detach()[idle].clone(),
                {
                    k: v[idle].clone()
                    for k, v in self.opt.state[p].items()
                    if torch.is_tensor(v) and v.dim() and v.shape[0] == p.shape[0]
                },
            )
            for p in params
        ]
        yield
        with torch.no_grad():
            for p, rows, moments in saved:
                p[idle] = rows
                for k, v in moments.items():
                    self.opt.state[p][k][idle] = v
