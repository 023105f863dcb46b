"""`dchag train`: the torchrun entry point. One run = one task with its model and parallel
layout, assembled from components as torchtitan's trainer is:

* the task (``tasks.py``): stores, model shape, loss, validation metric;
* the parallelized model (``dchag.parallel``) over the ("dp", "tp") device mesh;
* the train step (``step.py``): forward, backward, clipping, optimizer, schedule, rotation;
  a non-finite loss or gradient norm stops the run before the update;
* the metrics logger and the step's instruments (``metrics.py``): CSV logs, TensorBoard, an
  MLflow run (``tracking.py``), a progress bar, opt-in timing and memory tracking;
* the checkpoint manager (``checkpoint.py``) over the run's stateful parts (``state.py``):
  save every N steps and at the end, resume a restarted group (torchrun --max-restarts) from
  the newest checkpoint, replaying exactly the batches an uninterrupted run would have seen,
  its logs restored from the checkpoint;
* the run lock (``lock.py``): one writer per run directory.

Collectives: every tensor handed to a collective lies on the training device (``self.device``:
the GPU under NCCL, the CPU under gloo); see ``dchag.parallel.dims.init_distributed``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from .. import jsonio, provenance
from ..config import ConfigError
from ..errors import DchagError
from ..model import ChannelViT
from ..parallel import ParallelDims, init_distributed
from ..parallel.names import unwrap
from ..parallel.parallelize import autocast, parallelize_model, resolve_precision
from ..vocabulary import Aggregation, MeshAxis, Strategy
from . import checkpoint as ckpt
from . import finetune, state, tracking
from .data import ResumableSampler, collate
from .lock import RunLock, die_with_parent
from .metrics import MetricsLogger, StepInstruments, gather_rank_values
from .preflight import check_splits, resolve_run
from .step import NonFiniteError, TrainStep, lr_lambda, param_groups
from .stop import StopOnSignal, Stopped, ignore_in_worker
from .tasks import build_task

log = logging.getLogger(__name__)

ERROR_FILE = ".error.json"  # a user error of this torchrun launch: its restarts end at once


class Trainer:
    def __init__(
        self,
        config: dict,
        run: str,
        outdir: str | Path,
        stores: dict[str, str | Path],
        init_from: str | Path | None = None,
    ):
        world = int(os.environ.get("WORLD_SIZE", 1))  # what the plan checks, for a run started by hand
        # checked and resolved once: the run's settings from here on
        config, self.cfg = resolve_run(config, run, init_from, world)
        self.full_config = config
        self.out = Path(outdir)
        t, par = self.cfg.train, self.cfg.parallel
        self.task = build_task(self.cfg, stores)
        if par.strategy == Strategy.DCHAG and self.task.model_cfg.aggregation == Aggregation.BASELINE:
            raise ConfigError(f"run {run!r}: parallel.strategy dchag needs model.aggregation linear or cross")
        self.backend, self.device = init_distributed()
        torch.use_deterministic_algorithms(True, warn_only=True)
        self.dims = ParallelDims(tp=par.tp, dp_mode=par.data_parallel, world_size=dist.get_world_size())
        self.mesh = self.dims.build_mesh(self.device.type)
        self.rank = dist.get_rank()
        self.seed = t.seed
        self.precision = resolve_precision(par.precision, self.device)

        torch.manual_seed(self.seed)
        core_model = ChannelViT(self.task.model_cfg)
        self.init_report, init_record = self._initialise(core_model)
        core = self._parallelize(core_model)
        self._optimizer(core)
        self._stateful_parts()
        self._data(core)
        self.checkpoints = ckpt.CheckpointManager(
            self.out,
            {**ckpt.fingerprint(self.cfg, self.task.data_signature()), **init_record},
            t.checkpoint_every,
            t.keep_checkpoints,
            self.rank,
            self.parts,
        )

    # -- assembly ----------------------------------------------------------------------------
    def _parallelize(self, core_model: ChannelViT) -> ChannelViT:
        """The one-device model on the training device, parallelized over the mesh (its
        fine-tuning's frozen parts frozen); the groups its step reduces over. Returns the
        unwrapped model."""
        t, par = self.cfg.train, self.cfg.parallel
        frozen_parts = finetune.frozen_parts(t)
        self.model = parallelize_model(
            core_model.to(self.device),
            self.dims,
            self.mesh,
            par,
            find_unused_parameters=t.rotation is not None,
            timed_ddp=t.measure_comm,
            freeze=(lambda m: finetune.freeze(m, frozen_parts)) if frozen_parts else None,
        )
        self.compression = getattr(self.model, "compression", None)
        core = unwrap(self.model)
        self.tp_group = self.mesh[MeshAxis.TP].get_group() if self.dims.tp > 1 else None
        # Only under D-CHAG does a rank hold a slice of the channels (the MAE target needs all).
        self.channel_group = self.tp_group if core.group_gather is not None else None
        return core

    def _optimizer(self, core: ChannelViT) -> None:
        """AdamW, the warmup-cosine schedule and the train step over them."""
        t = self.cfg.train
        self.opt = torch.optim.AdamW(
            param_groups(self.model, self.cfg, self.task.model_cfg, self.dims.tp),
            lr=t.lr,
            weight_decay=t.weight_decay,
            betas=tuple(t.betas),
            foreach=True,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t.warmup_steps, t.steps, t.min_lr_ratio))
        self.step_fn = TrainStep(
            self.model,
            core,
            self.task,
            self.opt,
            self.sched,
            device=self.device,
            precision=self.precision,
            grad_clip=t.grad_clip,
            tp_group=self.tp_group,
            channel_group=self.channel_group,
            rotation=t.rotation,
            seed=self.seed,
        )

    def _stateful_parts(self) -> None:
        """What a checkpoint saves and restores (the counters among them), and the step's
        instruments."""
        t = self.cfg.train
        # position: the epoch's samples all data-parallel ranks (dp of them) have consumed
        counters = {"step": 0, "epoch": 0, "position": 0, "dp": 0, "best_val": float("inf")}
        self.counters = state.CountersState(counters, optional=("dp",))
        self.parts = {
            "model": state.ModelState(self.model),
            "optim": state.OptimizerState(self.model, self.opt),
            "sched": state.SchedulerState(self.sched),
            "trainer": self.counters,
            "rng": state.RngState(),
        }
        if self.compression is not None:
            self.parts["comm_hook"] = self.compression.checkpoint_part(self.model)
        self.instruments = StepInstruments(
            self.device,
            (self.model, self.opt),
            t.measure_comm,
            t.measure_memory,
            getattr(self.model, "comm_hook_state", None),
        )

    def _data(self, core: ChannelViT) -> None:
        """The train and validation sets of this rank's channels, checked against the data
        parallel size and batch, and their resumable samplers over this rank's share."""
        channels = core.tokenizer.channel_ids.tolist()  # each rank reads only its tokenizer's channels
        self.train_set = self.task.dataset("train", channels, self.seed)
        self.val_set = self.task.dataset("val", channels, self.seed + 1)
        dp_rank = self.mesh[MeshAxis.DP].get_local_rank()
        self.batch = self.cfg.train.batch_size
        check_splits(self.task, len(self.train_set), len(self.val_set), self.dims.dp, self.batch)
        self.sampler = ResumableSampler(len(self.train_set), self.dims.dp, dp_rank, self.seed)
        self.val_sampler = ResumableSampler(len(self.val_set), self.dims.dp, dp_rank, self.seed, shuffle=False)

    # -- fine-tuning -------------------------------------------------------------------------
    def _initialise(self, model: ChannelViT) -> tuple[dict | None, dict]:
        """Load the run's init_from model (an exported folder) into the one-device model; the
        report of what was loaded, resized and new, and the fingerprint's record of the source."""
        source = self.cfg.init_from
        if source is None:
            return None, {}
        from ..model.folder import load

        src = load(source)
        report = finetune.initialise(model, self.task.channel_target(), src, self.task.fits_head_of(src))
        report["source"] = str(source)
        report["frozen"] = finetune.frozen_parts(self.cfg.train)
        if int(os.environ.get("RANK", 0)) == 0:
            log.info("run %s: starting from %s", self.cfg.run, source)
            for line in finetune.describe(report):
                log.info("%s", line)
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "init.json").write_text(jsonio.dumps(report, indent=1))
        return report, {"init_from": str(source), "init_from.sha256": src.meta["weights"]["sha256"]}

    # -- data --------------------------------------------------------------------------------
    def _loader(self, dataset, sampler, drop_last: bool = True):
        workers = self.cfg.train.num_workers
        return DataLoader(
            dataset,
            batch_size=self.batch,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=workers,
            prefetch_factor=self.cfg.train.prefetch_factor if workers else None,
            collate_fn=collate,
            persistent_workers=False,
            worker_init_fn=ignore_in_worker if workers else None,
        )

    def _batches(self, epoch: int, offset: int):
        """(epoch, position after the batch, batch) from sample ``offset`` of ``epoch`` on."""
        per_step = self.batch * self.dims.dp
        while True:
            self.sampler.epoch, self.sampler.offset = epoch, offset
            if hasattr(self.train_set, "epoch"):
                self.train_set.epoch = epoch
            for i, batch in enumerate(self._loader(self.train_set, self.sampler)):
                yield epoch, offset + (i + 1) * per_step, batch
            epoch, offset = epoch + 1, 0

    def _samples(self, epoch: int, pos: int) -> list[int]:
        """This rank's training samples of the batch that ended at position ``pos``."""
        return self.sampler.indices(epoch, max(0, pos - self.batch * self.dims.dp))[: self.batch]

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
        stats = torch.tensor(
            [sum(losses), len(losses), sum(accuracies), len(accuracies)], dtype=torch.float64, device=self.device
        )
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
        best = self.counters.counters["best_val"]
        if self.compression is not None and self.compression.active != "fp16" and val_loss > best * (1 + threshold):
            self.compression.fall_back(step)
            if self.rank == 0:
                log.warning(
                    f"step {step}: validation loss {val_loss:.4f} is {val_loss / best - 1:+.1%} above its best "
                    f"{best:.4f}: {self.compression.kind} compression falls back to fp16"
                )
        self.counters.counters["best_val"] = min(best, val_loss)

    # -- the loop ----------------------------------------------------------------------------
    def _save(self, final: bool, step: int, epoch: int, pos: int, logger: MetricsLogger) -> Path:
        self.counters.counters.update(step=step, epoch=epoch, position=pos, dp=self.dims.dp)
        self.checkpoints.history = logger.history()
        return self.checkpoints.save_final() if final else self.checkpoints.save_step(step)

    def train(self) -> Path:
        t = self.cfg.train
        self.out.mkdir(parents=True, exist_ok=True)
        self.checkpoints.prepare()
        resumed = self.checkpoints.resume(t.steps)
        c = self.counters.counters
        step, epoch, pos = c["step"], c["epoch"], c["position"]
        if resumed is not None:
            pos = self._resumed_position(resumed, step, pos, c["dp"])
        tracker = tracking.start(self.cfg, self.out, resumed, step, self.rank, self.dims.world_size)
        logger = MetricsLogger(self.out, self.cfg.run, self.rank, t.steps, step, t.tensorboard, resumed, tracker)
        self.model.train()
        complete = False
        try:
            with StopOnSignal() as stop:
                step, epoch, pos = self._loop(stop, step, epoch, pos, logger)
            final = self._save(True, step, epoch, pos, logger)
            # the last step's checkpoint beside final/ (deleted by Snakemake before a rerun)
            self.checkpoints.keep_as_step(step)
            if self.rank == 0:
                self._write_run_info(logger.excluded, step, resumed)
            complete = True
        finally:
            logger.close(complete)
        dist.barrier()
        return final

    def _resumed_position(self, resumed: Path, step: int, pos: int, dp: int) -> int:
        """The epoch's position to continue from; a WARNING where the layout changed."""
        if dp == 0:  # counted by one rank: every rank had consumed as many
            dp, pos = self.dims.dp, pos * self.dims.dp
        if self.rank == 0:
            log.info(f"resuming from {resumed} (step {step})")
            if dp != self.dims.dp:
                log.warning(
                    f"run {self.cfg.run}: {resumed} was trained on {dp} data-parallel rank(s), this run has "
                    f"{self.dims.dp}: parameters and optimizer state are resharded, the epoch continues at its "
                    f"sample {pos}; a step now takes {self.batch * self.dims.dp} samples "
                    f"(train.batch_size {self.batch} per rank), {self.batch * dp} before"
                )
        return pos

    def _loop(self, stop: StopOnSignal, step: int, epoch: int, pos: int, logger: MetricsLogger) -> tuple:
        """Steps up to train.steps, checkpointed as due; on a signal, the step it came in is
        checkpointed and :class:`Stopped` raised. Returns (step, epoch, position)."""
        t = self.cfg.train
        batches = self._batches(epoch, pos)
        while step < t.steps:
            t0 = time.perf_counter()
            epoch, pos, batch = next(batches)
            batch = [b.to(self.device) for b in batch]
            with self.instruments.step(self.batch, time.perf_counter() - t0, t0) as measured:
                try:
                    result = self.step_fn(batch, step)
                except NonFiniteError as err:
                    samples = self._samples(epoch, pos)
                    raise NonFiniteError(
                        f"run {self.cfg.run}: {err} (training samples {samples[:8]} of "
                        f"{self.task.stores['train']}); nothing of this step was saved"
                    ) from None
                measured["times"] = result.times
            step += 1
            row = {
                "step": step,
                "epoch": epoch,
                "loss": float(result.loss),
                "lr": self.sched.get_last_lr()[0],
                "grad_norm": result.grad_norm,
                **measured,
            }
            if step % t.val_every == 0 or step == t.steps:
                row.update(self.validate())
                if not math.isfinite(row["val_loss"]):
                    raise NonFiniteError(
                        f"run {self.cfg.run}: the validation loss at step {step} is "
                        f"{row['val_loss']} (the validation data of {self.task.stores['val']} "
                        "or the model is not finite)"
                    )
                self._check_compression(step, row["val_loss"])
            logger.record(row, gather_rank_values(row, self.device))
            saved = self._save(False, step, epoch, pos, logger) if self.checkpoints.due(step, t.steps) else None
            signal_name = stop.agreed(self.device)
            if signal_name:
                saved = saved or self._save(False, step, epoch, pos, logger)
                raise Stopped(
                    f"run {self.cfg.run}: stopped by {signal_name} after step {step} of {t.steps}; "
                    f"checkpoint {saved} written: a rerun continues from it"
                )
        return step, epoch, pos

    def _write_run_info(self, excluded: list[int], step: int, resumed: Path | None) -> None:
        info = {
            "run": self.cfg.run,
            "task": self.task.name,
            "final_step": step,
            "resumed_from": str(resumed) if resumed else None,
            "model": asdict(self.task.model_cfg),
            "parallel": {
                **asdict(self.cfg.parallel),
                "world_size": self.dims.world_size,
                "dp": self.dims.dp,
                "backend": self.backend,
            },
            "precision": self.precision,
            "train": asdict(self.cfg.train),
            "stores": {k: str(v) for k, v in self.task.stores.items()},
            "init_from": self.init_report,
            "steps_excluded_from_timings": excluded,
            "compression": (
                {"hook": self.compression.kind, "fell_back_to_fp16_at_step": self.compression.fell_back_at}
                if self.compression is not None
                else None
            ),
            "provenance": provenance.record(self.full_config),
        }
        tmp = self.out / ".run.json.tmp"
        tmp.write_text(jsonio.dumps(info, indent=1))
        tmp.replace(self.out / "run.json")


def _earlier_error(outdir: Path) -> str | None:
    """The user error that ended an earlier attempt of this torchrun launch, if any: a restart
    would meet it again (a config or data mistake does not go away)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id or not int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0):
        return None
    try:
        record = json.loads((outdir / ERROR_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record.get("message") if record.get("run_id") == run_id else None


def main(
    config: dict, run: str, outdir: str | Path, stores: dict[str, str | Path], init_from: str | Path | None = None
) -> None:
    outdir = Path(outdir)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        die_with_parent()  # a killed launcher takes its workers with it
    rank0 = int(os.environ.get("RANK", 0)) == 0
    lock = RunLock(outdir)
    try:
        earlier = _earlier_error(outdir)
        if earlier:
            raise DchagError(f"{earlier} (as in the attempt before this restart)")
        if rank0:
            lock.acquire()
            (outdir / ERROR_FILE).unlink(missing_ok=True)
        Trainer(config, run, outdir, stores, init_from).train()
    except DchagError as err:
        if rank0 and lock._fd is not None and os.environ.get("TORCHELASTIC_RUN_ID"):
            (outdir / ERROR_FILE).write_text(
                json.dumps({"run_id": os.environ["TORCHELASTIC_RUN_ID"], "message": str(err)})
            )
        raise
    finally:
        lock.release()
        if dist.is_initialized():
            dist.destroy_process_group()
