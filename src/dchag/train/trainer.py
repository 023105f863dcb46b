"""`dchag train`: the torchrun entry point. One run = one task with its model and parallel
layout, assembled from components as torchtitan's trainer is:

* the task (``tasks.py``): stores, model shape, loss, validation metric;
* the parallelized model (``dchag.parallel``) over the ("dp", "tp") device mesh;
* the train step (``step.py``): forward, backward, clipping, optimizer, schedule, rotation;
* the metrics logger (``metrics.py``): CSV logs, TensorBoard, progress bar, opt-in instruments;
* the checkpoint manager (``checkpoint.py``): save every N steps and at the end, resume a
  restarted group (torchrun --max-restarts) from the newest checkpoint, replaying exactly the
  batches an uninterrupted run would have seen.

Collectives: every tensor handed to a collective lies on the training device (``self.device``:
the GPU under NCCL, the CPU under gloo); see ``dchag.parallel.dims.init_distributed``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from .. import jsonio
from .. import provenance
from ..config import ConfigError, run_settings
from ..model import ChannelViT
from ..parallel import ParallelDims, init_distributed, parallelize_model
from ..parallel.parallelize import autocast, resolve_precision
from . import checkpoint as ckpt
from .data import DataError, ResumableSampler
from .memory import step_peak
from .metrics import CommTimer, MetricsLogger, StepTimes, gather_rank_values
from .step import TrainStep, param_groups
from ..plan import default_stores
from .tasks import build_task


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def _collate(items):
    return [torch.stack(parts) for parts in zip(*items)]


class Trainer:
    def __init__(self, config: dict, run: str, outdir: str | Path, stores: dict[str, str | Path] | None = None):
        self.cfg = run_settings(config, run)
        self.full_config = config
        self.out = Path(outdir)
        t, par = self.cfg.train, self.cfg.parallel
        self.task = build_task(self.cfg, stores or default_stores(config, self.cfg.task))
        if par.strategy == "dchag" and self.task.model_cfg.aggregation == "baseline":
            raise ConfigError(f"run {run!r}: parallel.strategy dchag needs model.aggregation linear or cross")
        self.backend, self.device = init_distributed()
        torch.use_deterministic_algorithms(True, warn_only=True)
        self.dims = ParallelDims(tp=par.tp, dp_mode=par.dp, world_size=dist.get_world_size())
        self.mesh = self.dims.build_mesh(self.device.type)
        self.rank = dist.get_rank()
        self.seed = t.seed
        self.precision = resolve_precision(par.precision, self.device)

        torch.manual_seed(self.seed)
        self.model = parallelize_model(ChannelViT(self.task.model_cfg).to(self.device), self.dims, self.mesh,
                                       strategy=par.strategy, activation_checkpointing=par.activation_checkpointing,
                                       reshard_after_forward=par.fsdp_reshard_after_forward,
                                       ddp_bucket_mb=par.ddp_bucket_mb, comm_hook=par.comm_hook,
                                       powersgd_rank=par.powersgd_rank, find_unused_parameters=t.rotation is not None,
                                       timed_ddp=t.measure_comm)
        self.compression = getattr(self.model, "compression", None)
        self.hook_state = getattr(self.model, "comm_hook_state", None)  # DDP: its collectives' time
        self.best_val = float("inf")
        core = self.model.module if hasattr(self.model, "module") else self.model
        self.tp_group = self.mesh["tp"].get_group() if self.dims.tp > 1 else None
        # Only under D-CHAG does a rank hold a slice of the channels (the MAE target needs all).
        self.channel_group = self.tp_group if core.group_gather is not None else None

        self.opt = torch.optim.AdamW(param_groups(self.model, self.cfg, self.task.model_cfg, self.dims.tp), lr=t.lr,
                                     weight_decay=t.weight_decay, betas=tuple(t.betas), foreach=True)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t.warmup_steps, t.steps, t.min_lr_ratio))
        self.step_fn = TrainStep(self.model, core, self.task, self.opt, self.sched, device=self.device,
                                 precision=self.precision, grad_clip=t.grad_clip, tp_group=self.tp_group,
                                 channel_group=self.channel_group, rotation=t.rotation, seed=self.seed)
        self.checkpoints = ckpt.CheckpointManager(self.out, ckpt.fingerprint(self.cfg), t.checkpoint_every, self.rank)

        channels = core.tokenizer.channel_ids.tolist()  # each rank reads only its tokenizer's channels
        self.train_set = self.task.dataset("train", channels, self.seed)
        self.val_set = self.task.dataset("val", channels, self.seed + 1)
        dp_rank = self.mesh["dp"].get_local_rank()
        self.batch = t.batch_size
        self.sampler = ResumableSampler(len(self.train_set), self.dims.dp, dp_rank, self.seed)
        if self.sampler.per_rank < self.batch:
            raise DataError(f"{len(self.train_set)} training samples over {self.dims.dp} data-parallel ranks is less "
                            f"than one batch of {self.batch}")
        self.val_sampler = ResumableSampler(len(self.val_set), self.dims.dp, dp_rank, self.seed, shuffle=False)

    # -- data --------------------------------------------------------------------------------
    def _loader(self, dataset, sampler, drop_last: bool = True):
        workers = self.cfg.train.num_workers
        return DataLoader(dataset, batch_size=self.batch, sampler=sampler, drop_last=drop_last, num_workers=workers,
                          prefetch_factor=self.cfg.train.prefetch_factor if workers else None, collate_fn=_collate,
                          persistent_workers=False)

    def _batches(self, epoch: int, start: int):
        while True:
            self.sampler.epoch, self.sampler.start = epoch, start
            if hasattr(self.train_set, "epoch"):
                self.train_set.epoch = epoch
            for i, batch in enumerate(self._loader(self.train_set, self.sampler)):
                yield epoch, start + (i + 1) * self.batch, batch
            epoch, start = epoch + 1, 0

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self, step: int, epoch: int, pos: int) -> dict[str, torch.Tensor]:
        hook = self.compression.residual_state(self.model, ckpt.canonical) if self.compression is not None else {}
        counters = {"step": step, "epoch": epoch, "position": pos, "scheduler_last_epoch": self.sched.last_epoch}
        return ckpt.state(self.model, self.opt, counters, hook)

    def _resume(self) -> tuple[int, int, int]:
        self.checkpoints.prepare()
        last = self.checkpoints.latest()
        if last is None:
            return 0, 0, 0
        c = ckpt.load(self._state(0, 0, 0), last)
        # The schedule is a function of the step: put the learning rates where they were.
        self.sched.last_epoch = c["scheduler_last_epoch"]
        for group, base, fn in zip(self.opt.param_groups, self.sched.base_lrs, self.sched.lr_lambdas):
            group["lr"] = base * fn(self.sched.last_epoch)
        self.sched._last_lr = [g["lr"] for g in self.opt.param_groups]
        if self.rank == 0:
            print(f"resuming from {last} (step {c['step']})", flush=True)
        return c["step"], c["epoch"], c["position"]

    # -- validation --------------------------------------------------------------------------
    def validate(self) -> dict:
        self.model.eval()
        losses, extra = [], []
        with torch.no_grad(), autocast(self.device, self.precision):
            for i, batch in enumerate(self._loader(self.val_set, self.val_sampler, drop_last=False)):
                if i >= self.cfg.train.val_batches:
                    break
                batch = [b.to(self.device) for b in batch]
                loss, info = self.task.loss(self.model, batch, 10**9 + i, self.seed, self.channel_group)
                losses.append(float(loss))
                extra.append(info.get("accuracy"))
        self.model.train()
        accuracies = [e for e in extra if e is not None]
        stats = torch.tensor([sum(losses), len(losses), sum(accuracies), len(accuracies)], dtype=torch.float64,
                             device=self.device)
        dist.all_reduce(stats)
        total, n, acc, n_acc = stats.tolist()
        out = {"val_loss": total / n if n > 0 else float("nan")}
        if n_acc > 0:
            out["val_accuracy"] = acc / n_acc
        return out

    def _check_compression(self, step: int, val_loss: float) -> None:
        """Fall back from PowerSGD / 8-bit to fp16 compression when validation loss rises more than
        parallel.compression_fallback (relative) above its best so far."""
        threshold = self.cfg.parallel.compression_fallback
        if self.compression is not None and self.compression.active != "fp16" and val_loss > self.best_val * (1 + threshold):
            self.compression.fall_back(step)
            if self.rank == 0:
                print(f"step {step}: validation loss {val_loss:.4f} is {val_loss / self.best_val - 1:+.1%} above its best "
                      f"{self.best_val:.4f}: {self.compression.kind} compression falls back to fp16", flush=True)
        self.best_val = min(self.best_val, val_loss)

    # -- the loop ----------------------------------------------------------------------------
    def _track_memory(self, steps_run: int) -> bool:
        """On a GPU the allocator's peak is free to read every step; on the CPU one step (the
        second this process runs: optimizer state exists then) is tracked by MemTracker, and
        only when asked (train.measure_memory)."""
        return self.device.type == "cuda" or (self.cfg.train.measure_memory and steps_run == 1)

    def train(self) -> Path:
        t = self.cfg.train
        self.out.mkdir(parents=True, exist_ok=True)
        step, epoch, pos = self._resume()
        logger = MetricsLogger(self.out, self.cfg.run, self.rank, t.steps, step, t.tensorboard)
        batches = self._batches(epoch, pos)
        self.model.train()
        comm = CommTimer() if t.measure_comm else None
        peak_mib, steps_run, complete = float("nan"), 0, False
        try:
            while step < t.steps:
                t0 = time.perf_counter()
                epoch, pos, batch = next(batches)
                batch = [b.to(self.device) for b in batch]
                data_s = time.perf_counter() - t0
                track = self._track_memory(steps_run)
                tracked = step_peak(self.device, self.model, self.opt) if track else contextlib.nullcontext({})
                with tracked as mem, (comm or contextlib.nullcontext()):
                    result = self.step_fn(batch, step)
                step_s = time.perf_counter() - t0
                times = replace(result.times, data=data_s)
                t_comm = comm.take() + (self.hook_state.take_seconds() if self.hook_state else 0.0) if comm else None
                if track:
                    peak_mib = mem["total"]
                instrumented = "+".join(k for k, on in (("comm", comm is not None),
                                                        ("memory", track and self.device.type == "cpu")) if on)
                if "memory" in instrumented:  # MemTracker's bookkeeping slowed this step: no timings
                    times, step_s = StepTimes(*[float("nan")] * 4), float("nan")
                    t_comm = float("nan") if t_comm is not None else None
                step += 1
                steps_run += 1
                row = {"step": step, "epoch": epoch, "loss": float(result.loss), "lr": self.sched.get_last_lr()[0],
                       "grad_norm": result.grad_norm, "samples_per_s": self.batch / step_s if step_s == step_s else float("nan"),
                       "peak_mem_mib": peak_mib, **{f"t_{k}": v for k, v in asdict(times).items()}, "t_comm": t_comm,
                       "instrumented": instrumented}
                if step % t.val_every == 0 or step == t.steps:
                    row.update(self.validate())
                    self._check_compression(step, row["val_loss"])
                logger.record(row, gather_rank_values(row, self.device))
                if self.checkpoints.due(step, t.steps):
                    self.checkpoints.save_step(self._state(step, epoch, pos), step)
            final = self.checkpoints.save_final(self._state(step, epoch, pos))
            if self.rank == 0:
                self._write_run_info(logger.excluded)
            complete = True
        finally:
            logger.close(complete)
        dist.barrier()
        return final

    def _write_run_info(self, excluded: list[int]) -> None:
        info = {
            "run": self.cfg.run,
            "task": self.task.name,
            "model": asdict(self.task.model_cfg),
            "parallel": {**asdict(self.cfg.parallel), "world_size": self.dims.world_size, "dp": self.dims.dp, "backend": self.backend},
            "precision": self.precision,
            "train": asdict(self.cfg.train),
            "stores": {k: str(v) for k, v in self.task.stores.items()},
            "steps_excluded_from_timings": excluded,
            "compression": ({"hook": self.compression.kind, "fell_back_to_fp16_at_step": self.compression.fell_back_at}
                            if self.compression is not None else None),
            "provenance": provenance.record(self.full_config),
        }
        (self.out / "run.json").write_text(jsonio.dumps(info, indent=1))


def main(config: dict, run: str, outdir: str | Path, stores: dict[str, str | Path] | None = None) -> None:
    trainer = None
    try:
        trainer = Trainer(config, run, outdir, stores)
        trainer.train()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
