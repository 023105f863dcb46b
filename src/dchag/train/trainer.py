"""`dchag train`: the torchrun entry point. One run = one task with its model and parallel
layout; the loop is the same for forecasting, masked autoencoding and classification.

Per step: data / forward / backward / optimizer time (and the time spent inside collectives
where measurable), loss, learning rate, samples/s and peak memory per rank (train/memory.py:
every step on a GPU, one tracked step on the CPU) go to a CSV log and TensorBoard; rank 0 shows a progress bar. Checkpoints (DCP) every N steps and at the
end; a restarted group (torchrun --max-restarts) resumes from the newest one and replays
exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

from .. import jsonio
from .. import provenance
from ..config import ConfigError, RunSettings, run_settings
from ..model import ChannelViT, random_masking
from ..model.build import model_config
from ..parallel import ParallelDims, init_distributed, parallelize_model
from ..parallel.parallelize import autocast, clip_grad_norm_
from . import checkpoint as ckpt
from .data import DataError, ForecastDataset, ResumableSampler, SampleDataset, open_array, store_info
from .memory import step_peak

RANK_FIELDS = ["samples_per_s", "peak_mem_mib", "t_data", "t_forward", "t_backward", "t_optimizer", "t_comm"]
TASK_STORES = {"forecast": "era5", "mae": "hsi/mae.zarr", "classify": "hsi/classification.zarr"}
# Settings that change neither the model, the data order nor the optimiser's state: a run
# whose config differs from its checkpoints' only in these resumes from them.
RESUMABLE = {"train.steps", "train.checkpoint_every", "train.val_every", "train.val_batches", "train.num_workers",
             "train.prefetch_factor", "train.measure_comm", "train.max_restarts", "train.gpus_per_node",
             "parallel.activation_checkpointing", "parallel.fsdp_reshard_after_forward"}


def data_root_of(config: dict, data_root: str | Path | None) -> Path:
    """Where the preprocessed stores are: the given folder, or results/<name>."""
    return Path(data_root) if data_root else Path("results") / config["name"]


def load_trained(config: dict, run: str, checkpoint: str | Path, task: str,
                 data_root: str | Path | None = None) -> tuple[RunSettings, "Task", ChannelViT]:
    """A run's trained model on one device, in eval mode (its parallel layout undone), with
    the run's config and task."""
    cfg = run_settings(config, run)
    if cfg.task != task:
        raise ConfigError(f"run {run!r} is a {cfg.task} run, not a {task} run")
    t = Task(cfg, data_root_of(config, data_root))
    model = ChannelViT(t.model_cfg)
    ckpt.load_weights(model, checkpoint)
    return cfg, t, model.eval()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def fingerprint(cfg: RunSettings) -> dict:
    """What a run's checkpoints depend on: the task, its dataset section, model, parallel and
    train settings (dotted keys), less the RESUMABLE ones."""
    data = {"era5": cfg.era5} if cfg.task == "forecast" else {"hsi": cfg.hsi}
    train = {k: v for k, v in asdict(cfg.train).items() if k != "runs"}
    flat = _flatten({"task": cfg.task, **data, "model": asdict(cfg.model), "parallel": asdict(cfg.parallel), "train": train})
    return json.loads(json.dumps({k: v for k, v in flat.items() if k not in RESUMABLE}, default=str))


def changed_keys(old: dict | None, new: dict) -> list[str]:
    """'key: old -> new' for every key that differs (all, when there is no readable record)."""
    if old is None:
        return ["no readable record of the checkpoints' configuration"]
    return [f"{k}: {old.get(k, '(absent)')} -> {new.get(k, '(absent)')}" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)]


def _read_json(path: Path) -> dict | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def lat_weights(store: str | Path) -> torch.Tensor:
    """cos(lat) / mean(cos(lat)), the WeatherBench/ClimaX latitude weights, shape (lat, 1)."""
    from ..store import open_zarr

    with open_zarr(store) as ds:
        w = np.cos(np.deg2rad(ds.lat.values))
    return torch.tensor(w / w.mean(), dtype=torch.float32)[:, None]


@dataclass
class StepTimes:
    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0


class Task:
    """What differs between tasks: data, model config, loss, validation metric."""

    def __init__(self, cfg: RunSettings, results: Path):
        self.cfg = cfg
        self.name = cfg.task
        self.train_cfg = cfg.train
        self.results = results
        if self.name == "forecast":
            from ..model.build import era5_shape, forecast_outputs

            names, shape = era5_shape(cfg)
            outputs = forecast_outputs(cfg, names)
            missing = [o for o in outputs if o not in names]
            if missing:
                raise ConfigError(f"config key 'train.forecast.outputs': {missing} are not input channels ({', '.join(names)})")
            self.channels, self.outputs = names, outputs
            self.model_cfg = model_config(cfg, "forecast", out_channels=[names.index(o) for o in outputs])
            self.store = {s: results / "era5" / f"{s}.zarr" for s in ("train", "val")}
            self.weights = lat_weights(self.store["train"])
        else:
            store = results / TASK_STORES[self.name]
            info = store_info(store, "train")
            var = "patches" if self.name == "classify" else "tiles"
            _, bands, h, w = open_array(store, f"train/{var}").shape
            wl = None
            if cfg.model.channel_embedding == "wavelength":
                wl_meta = np.asarray(open_array(store, "train/wavelength")[:])
                wl = wl_meta.tolist() if np.all(np.isfinite(wl_meta)) else None
            classes = len(info.get("class_names", [])) if self.name == "classify" else 0
            self.model_cfg = model_config(cfg, self.name, in_channels=bands, img_size=(h, w), num_classes=classes, wavelengths=wl)
            self.store = {s: store for s in ("train", "val")}
            self.var = var
            self.class_names = info.get("class_names", [])

    def dataset(self, split: str, rank_channels: list[int], seed: int):
        if self.name == "forecast":
            lead = tuple(self.train_cfg.forecast.lead_hours)
            return ForecastDataset(self.store[split], self.channels, rank_channels, self.outputs, lead, seed)
        return SampleDataset(self.store[split], split, self.var, rank_channels, self.model_cfg.in_channels)

    def rotation_groups(self, step: int) -> list[int] | None:
        """Channel-subset rotation: the k = round(fraction x G) groups trained at ``step``,
        consecutive modulo G, so every group is trained once every ceil(G / k) steps."""
        rot = self.train_cfg.rotation
        if rot is None:
            return None
        g = self.model_cfg.groups
        k = max(1, round(g * rot.fraction))
        return sorted({(step * k + j) % g for j in range(k)})

    def loss(self, model, batch, step: int, seed: int, channel_group, rotate: bool = True) -> tuple[torch.Tensor, dict]:
        groups = self.rotation_groups(step) if rotate else None
        if self.name == "forecast":
            x, lead, y = batch
            pred = model(x, lead, active_groups=groups)
            w = self.weights.to(pred.device)
            return (((pred - y) ** 2) * w).mean(), {}
        if self.name == "classify":
            x, label = batch
            logits = model(x, active_groups=groups)
            return torch.nn.functional.cross_entropy(logits, label), {"accuracy": (logits.argmax(-1) == label).float().mean().item()}
        (x,) = batch
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)  # same mask on every TP rank
        ids_keep, mask = random_masking(x.shape[0], self.model_cfg.num_patches, self.train_cfg.mae.mask_ratio, g)
        pred = model(x, ids_keep=ids_keep.to(x.device), active_groups=groups)
        target = gather_channels(x, channel_group)
        per_patch = patchwise_mse(pred, target, self.model_cfg.patch_size)
        if self.train_cfg.mae.loss == "masked":
            m = mask.to(per_patch.device)
            return (per_patch * m).sum() / m.sum(), {}
        return per_patch.mean(), {}


def patchwise_mse(pred: torch.Tensor, target: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) x2 -> (B, L) mean squared error per patch."""
    d = (pred - target) ** 2
    b, c, h, w = d.shape
    return d.reshape(b, c, h // p, p, w // p, p).mean(dim=(1, 3, 5)).reshape(b, -1)


def gather_channels(x: torch.Tensor, group) -> torch.Tensor:
    """All channels from every TP rank's block (uneven blocks padded for the collective):
    the masked autoencoder reconstructs every channel, while each rank reads only its own."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    sizes = [torch.zeros((), dtype=torch.long) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor(x.shape[1]), group=group)
    width = int(max(sizes))
    padded = torch.zeros(x.shape[0], width, *x.shape[2:], dtype=x.dtype)
    padded[:, : x.shape[1]] = x
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[:, : int(n)] for part, n in zip(parts, sizes)], dim=1)


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
    def __init__(self, config: dict, run: str, outdir: str | Path, data_root: str | Path | None = None):
        self.cfg = run_settings(config, run)
        self.full_config = config
        self.out = Path(outdir)
        self.backend, self.device = init_distributed()
        torch.use_deterministic_algorithms(True, warn_only=True)
        par = self.cfg.parallel
        self.dims = ParallelDims(tp=par.tp, dp_mode=par.dp, world_size=dist.get_world_size())
        self.mesh = self.dims.build_mesh(self.device.type)
        self.rank = dist.get_rank()
        t = self.cfg.train
        self.seed = t.seed
        self.task = Task(self.cfg, data_root_of(config, data_root))
        torch.manual_seed(self.seed)
        model = ChannelViT(self.task.model_cfg)
        strategy = par.strategy
        if strategy == "dchag" and self.task.model_cfg.aggregation == "baseline":
            raise ConfigError(f"run {run!r}: parallel.strategy dchag needs model.aggregation linear or cross")
        precision = par.precision
        self.precision = ("bf16" if self.device.type == "cuda" else "fp32") if precision == "auto" else precision
        self.model = parallelize_model(model.to(self.device), self.dims, self.mesh, strategy=strategy,
                                       activation_checkpointing=par.activation_checkpointing,
                                       reshard_after_forward=par.fsdp_reshard_after_forward,
                                       ddp_bucket_mb=par.ddp_bucket_mb, comm_hook=par.comm_hook,
                                       powersgd_rank=par.powersgd_rank,
                                       find_unused_parameters=t.rotation is not None,
                                       timed_ddp=t.measure_comm)
        self.compression = getattr(self.model, "compression", None)
        self.hook_state = getattr(self.model, "comm_hook_state", None)  # DDP: its collectives' time
        self.fallback_threshold = par.compression_fallback
        self.best_val = float("inf")
        self.core = self.model.module if hasattr(self.model, "module") else self.model
        self.channel_ids = self.core.tokenizer.channel_ids.tolist()
        self.tp_group = self.mesh["tp"].get_group() if self.dims.tp > 1 else None
        # Only under D-CHAG does a rank hold a slice of the channels (the MAE target needs all).
        self.channel_group = self.tp_group if self.core.group_gather is not None else None
        self.opt = torch.optim.AdamW(self._param_groups(t), lr=t.lr, weight_decay=t.weight_decay, betas=tuple(t.betas))
        self.steps = t.steps
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t.warmup_steps, self.steps, t.min_lr_ratio))
        self.train_set = self.task.dataset("train", self.channel_ids, self.seed)
        self.val_set = self.task.dataset("val", self.channel_ids, self.seed + 1)
        dp_rank = self.mesh["dp"].get_local_rank()
        self.batch = t.batch_size
        self.sampler = ResumableSampler(len(self.train_set), self.dims.dp, dp_rank, self.seed)
        if self.sampler.per_rank < self.batch:
            raise DataError(f"{len(self.train_set)} training samples over {self.dims.dp} data-parallel ranks is less than one batch of {self.batch}")
        self.val_sampler = ResumableSampler(len(self.val_set), self.dims.dp, dp_rank, self.seed, shuffle=False)
        self.workers = t.num_workers
        self.prefetch = t.prefetch_factor if self.workers else None

    def _param_groups(self, t) -> list[dict]:
        """One group, or under channel-subset rotation the rotated parts (tokenizer, partial
        aggregators) apart with their learning rate scaled by train.rotation.lr_scale."""
        rot = t.rotation
        if rot is None:
            return [{"params": list(self.model.parameters())}]
        if self.task.model_cfg.aggregation == "baseline" or self.dims.tp > 1 or self.cfg.parallel.strategy == "dchag":
            raise ConfigError(f"run {self.cfg.run!r}: train.rotation needs a hierarchical model (model.aggregation linear "
                              f"or cross, model.groups) with parallel.strategy baseline and tp 1")
        rotated = [p for n, p in self.model.named_parameters() if ckpt.canonical(n).startswith(("tokenizer.", "partial."))]
        ids = {id(p) for p in rotated}
        return [{"params": [p for p in self.model.parameters() if id(p) not in ids]},
                {"params": rotated, "lr": t.lr * rot.lr_scale}]

    @contextlib.contextmanager
    def _idle_channels_kept(self, step: int):
        """Under rotation, the idle groups' rows of the tokenizer's per-channel parameters (one
        tensor for all channels) and their Adam moments come out of the optimizer step unchanged,
        as the idle partial aggregators' (no gradient, so AdamW skips them) do."""
        groups = self.task.rotation_groups(step)
        if groups is None:
            yield
            return
        tok = self.core.tokenizer
        idle = [i for g, (lo, hi) in enumerate(self.core.groups) if g not in groups for i in range(lo, hi)]
        params = [p for p in (tok.weight, tok.bias, tok.channel_embed) if p is not None]
        saved = [(p, p.detach()[idle].clone(), {k: v[idle].clone() for k, v in self.opt.state[p].items() if torch.is_tensor(v) and v.dim() and v.shape[0] == p.shape[0]})
                 for p in params]
        yield
        with torch.no_grad():
            for p, rows, moments in saved:
                p[idle] = rows
                for k, v in moments.items():
                    self.opt.state[p][k][idle] = v

    # -- data --------------------------------------------------------------------------------
    def _loader(self, dataset, sampler, drop_last: bool = True):
        return DataLoader(dataset, batch_size=self.batch, sampler=sampler, drop_last=drop_last, num_workers=self.workers,
                          prefetch_factor=self.prefetch, collate_fn=_collate, persistent_workers=False)

    def _batches(self, epoch: int, start: int):
        while True:
            self.sampler.epoch, self.sampler.start = epoch, start
            if hasattr(self.train_set, "epoch"):
                self.train_set.epoch = epoch
            for i, batch in enumerate(self._loader(self.train_set, self.sampler)):
                yield epoch, start + (i + 1) * self.batch, batch
            epoch, start = epoch + 1, 0

    # -- checkpoints -------------------------------------------------------------------------
    def _counters(self, step, epoch, pos):
        return {"step": step, "epoch": epoch, "position": pos, "scheduler_last_epoch": self.sched.last_epoch}

    def _forget_stale_checkpoints(self) -> None:
        """Checkpoints of a run whose model, data or optimiser settings differ are not resumed:
        they are removed, with the keys that changed named. A change in RESUMABLE settings only
        (steps, validation cadence, workers, logging) resumes."""
        directory = self.out / "checkpoints"
        if self.rank == 0:
            stamp = directory / "run_config.json"
            now = fingerprint(self.cfg)
            if directory.exists():
                changed = changed_keys(_read_json(stamp), now)
                if changed:
                    print(f"{directory} holds checkpoints of another configuration ({'; '.join(changed)}); "
                          "starting afresh", flush=True)
                    shutil.rmtree(directory)
            directory.mkdir(parents=True, exist_ok=True)
            stamp.write_text(json.dumps(now, sort_keys=True, indent=1))
        dist.barrier()

    def _state(self, step: int, epoch: int, pos: int) -> dict[str, torch.Tensor]:
        hook = self.compression.residual_state(self.model, ckpt.canonical) if self.compression is not None else {}
        return ckpt.state(self.model, self.opt, self._counters(step, epoch, pos), hook)

    def _resume(self) -> tuple[int, int, int]:
        self._forget_stale_checkpoints()
        last = ckpt.latest(self.out / "checkpoints")
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

    # -- the loop ----------------------------------------------------------------------------
    def validate(self) -> dict:
        self.model.eval()
        losses, extra = [], []
        max_batches = self.cfg.train.val_batches
        with torch.no_grad(), autocast(self.device, self.precision):
            for i, batch in enumerate(self._loader(self.val_set, self.val_sampler, drop_last=False)):
                if i >= max_batches:
                    break
                batch = [b.to(self.device) for b in batch]
                loss, info = self.task.loss(self.model, batch, 10**9 + i, self.seed, self.channel_group, rotate=False)
                losses.append(float(loss))
                extra.append(info.get("accuracy"))
        self.model.train()
        stats = torch.tensor([sum(losses), len(losses), sum(e for e in extra if e is not None), sum(e is not None for e in extra)], dtype=torch.float64)
        dist.all_reduce(stats)
        out = {"val_loss": float(stats[0] / stats[1]) if stats[1] > 0 else float("nan")}
        if stats[3] > 0:
            out["val_accuracy"] = float(stats[2] / stats[3])
        return out

    def _check_compression(self, step: int, val_loss: float) -> None:
        """Fall back from PowerSGD / 8-bit to fp16 compression when validation loss rises more than
        parallel.compression_fallback (relative) above its best so far."""
        if self.compression is not None and self.compression.active != "fp16" and val_loss > self.best_val * (1 + self.fallback_threshold):
            self.compression.fall_back(step)
            if self.rank == 0:
                print(f"step {step}: validation loss {val_loss:.4f} is {val_loss / self.best_val - 1:+.1%} above its best "
                      f"{self.best_val:.4f}: {self.compression.kind} compression falls back to fp16", flush=True)
        self.best_val = min(self.best_val, val_loss)

    def train(self) -> Path:
        t = self.cfg.train
        self.out.mkdir(parents=True, exist_ok=True)
        step, epoch, pos = self._resume()
        log_path = self.out / "log.csv.partial"
        fields = ["step", "epoch", "loss", "lr", "grad_norm", "samples_per_s", "peak_mem_mib", "t_data", "t_forward",
                  "t_backward", "t_optimizer", "t_comm", "val_loss", "val_accuracy"]
        rank_log_path = self.out / "ranks.csv.partial"
        log = CsvLog(log_path, fields, step) if self.rank == 0 else None
        rank_log = CsvLog(rank_log_path, ["step", "rank", *RANK_FIELDS], step) if self.rank == 0 else None
        writer_tb = self._tensorboard() if self.rank == 0 else None
        ckpt_every = t.checkpoint_every
        val_every = t.val_every
        clip = t.grad_clip
        bar = tqdm(total=self.steps, initial=step, desc=f"train {self.cfg.run}", disable=self.rank != 0, mininterval=2)
        batches = self._batches(epoch, pos)
        self.model.train()
        comm = _CommTimer() if t.measure_comm else contextlib.nullcontext()
        # Peak memory: on a GPU every step (allocator peak); on the CPU the second step this
        # process runs (optimizer state exists then) under MemTracker, whose bookkeeping slows
        # that step: its times are left out of the logs' timings (NaN).
        peak_mib, steps_run = float("nan"), 0
        while step < self.steps:
            t0 = time.perf_counter()
            epoch, pos, batch = next(batches)
            batch = [b.to(self.device) for b in batch]
            t1 = time.perf_counter()
            measure_memory = self.device.type == "cuda" or steps_run == 1
            tracked = step_peak(self.device, self.model, self.opt) if measure_memory else contextlib.nullcontext({})
            with tracked as mem, comm:
                with autocast(self.device, self.precision):
                    loss, _ = self.task.loss(self.model, batch, step, self.seed, self.channel_group)
                t2 = time.perf_counter()
                loss.backward()
                t3 = time.perf_counter()
                grad_norm = float(clip_grad_norm_(self.model, clip, self.tp_group))
                with self._idle_channels_kept(step):
                    self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                self.sched.step()
            t4 = time.perf_counter()
            times = StepTimes(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
            t_comm = (comm.take() + (self.hook_state.take_seconds() if self.hook_state else 0.0)) if isinstance(comm, _CommTimer) else None
            if measure_memory:
                peak_mib = mem["total"]
            untimed = measure_memory and self.device.type == "cpu"  # MemTracker's bookkeeping slowed this step
            if untimed:
                times = StepTimes(*[float("nan")] * 4)
                t_comm = float("nan") if t_comm is not None else None
            step += 1
            steps_run += 1
            row = {"step": step, "epoch": epoch, "loss": float(loss.detach()), "lr": self.sched.get_last_lr()[0], "grad_norm": grad_norm,
                   "samples_per_s": float("nan") if untimed else self.batch / max(1e-9, t4 - t0),
                   "peak_mem_mib": peak_mib, **{f"t_{k}": v for k, v in asdict(times).items()}, "t_comm": t_comm}
            if step % val_every == 0 or step == self.steps:
                row.update(self.validate())
                self._check_compression(step, row["val_loss"])
            # Every rank's throughput, memory and timings, gathered to rank 0 (one small collective).
            mine = torch.tensor([row[k] if row[k] is not None else float("nan") for k in RANK_FIELDS], dtype=torch.float64)
            everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())] if self.rank == 0 else None
            dist.gather(mine, everyone, dst=0)
            if self.rank == 0:
                log.append(row)
                for r, values in enumerate(everyone):
                    rank_log.append({"step": step, "rank": r, **dict(zip(RANK_FIELDS, values.tolist()))})
                if writer_tb is not None:
                    for k, v in row.items():
                        if k not in ("step", "epoch") and v is not None:
                            writer_tb.add_scalar(k, v, step)
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.4f}")
            if step % ckpt_every == 0 and step < self.steps:
                ckpt.save(self._state(step, epoch, pos), self.out / "checkpoints" / f"step_{step}")
        bar.close()
        final = ckpt.save(self._state(step, epoch, pos), self.out / "final")
        if self.rank == 0:
            self._write_run_info()
            if writer_tb is not None:
                writer_tb.close()
            log_path.replace(self.out / "log.csv")
            rank_log_path.replace(self.out / "ranks.csv")
        dist.barrier()
        return final

    def _tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
        return SummaryWriter(log_dir=str(self.out / "tensorboard"))

    def _write_run_info(self) -> None:
        info = {
            "run": self.cfg.run,
            "task": self.task.name,
            "model": asdict(self.task.model_cfg),
            "parallel": {**asdict(self.cfg.parallel), "world_size": self.dims.world_size, "dp": self.dims.dp, "backend": self.backend},
            "precision": self.precision,
            "train": asdict(self.cfg.train),
            "mae_loss": self.cfg.train.mae.loss if self.task.name == "mae" else None,
            "compression": ({"hook": self.compression.kind, "fell_back_to_fp16_at_step": self.compression.fell_back_at}
                            if self.compression is not None else None),
            "provenance": provenance.record(self.full_config),
        }
        (self.out / "run.json").write_text(jsonio.dumps(info, indent=1))


class _CommTimer(TorchDispatchMode):
    """Seconds spent inside collective calls and their waits (c10d and functional collectives
    as dispatched ops): on gloo these block, so this is the communication time; on NCCL the
    calls are asynchronous and this undercounts (use a profiler there)."""

    def __init__(self):
        super().__init__()
        self.total = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "c10d" not in name:
            return func(*args, **(kwargs or {}))
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.total += time.perf_counter() - t0
        return out

    def take(self) -> float:
        total, self.total = self.total, 0.0
        return total


class CsvLog:
    """An append-only CSV log; reopened after a restart, it keeps the rows up to the step
    resumed from (later ones are redone by the resumed run)."""

    def __init__(self, path: Path, fields: list[str], resume_step: int):
        self.path, self.fields = path, fields
        kept = []
        if path.exists() and resume_step > 0:
            with open(path) as f:
                kept = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(kept)

    def append(self, row: dict) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow({k: row.get(k) for k in self.fields})


def main(config: dict, run: str, outdir: str | Path, data_root: str | Path | None = None) -> None:
    trainer = Trainer(config, run, outdir, data_root)
    try:
        trainer.train()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
