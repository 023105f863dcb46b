"""What `dchag launch-train` checks before torchrun starts, as every rank would, and the run's
resolution it shares with the trainer. It imports neither FSDP nor DTensor (nor the trainer):
the launcher, which runs no model, starts without them."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError, Settings, settings
from ..layout import data_parallel_size
from . import tracking
from .data import DataError
from .lock import RunLock
from .tasks import Task, build_task


def resolve_run(config: dict, run: str, init_from: str | Path | None, world_size: int) -> tuple[dict, Settings]:
    """The config with the run's ``init_from`` given (:func:`with_init_from`), and the run's
    settings checked for ``world_size`` processes, resolved once."""
    from ..checks import check_run

    config = with_init_from(config, run, init_from)
    runs = config.get("train", {}).get("runs", {})
    return config, check_run(settings(config), run, runs, world_size=world_size).settings


def with_init_from(config: dict, run: str, init_from: str | Path | None) -> dict:
    """The config with the run's init_from set to the model folder it starts from: a run
    named there is exported by the pipeline and given as ``--init-from``."""
    runs = config.get("train", {}).get("runs", {})
    spec = runs.get(run)
    if spec is None:
        return config
    named = spec.get("init_from")
    if init_from is None:
        if named is not None and named in runs:
            raise ConfigError(f"run {run!r} starts from run {named!r}: give its model folder (--init-from DIR)")
        return config
    out = {**config, "train": {**config["train"], "runs": {**runs, run: {**spec, "init_from": str(init_from)}}}}
    return out


def check_splits(task, train: int, val: int, dp: int, batch: int) -> None:
    """Every data-parallel rank gets a training batch and a validation sample (an empty
    validation split would make the validation loss undefined, found only at its first step)."""
    if train // dp < batch:
        raise DataError(
            f"{train} training samples ({task.where('train')}) over {dp} data-parallel ranks is less "
            f"than one batch of {batch}"
        )
    if val // dp == 0:
        raise DataError(
            f"the validation split ({task.where('val')}) has {val} samples, fewer than one for each of the {dp} "
            "data-parallel rank(s): the validation loss would be undefined"
        )


def check_launch(
    config: dict,
    run: str,
    outdir: str | Path,
    stores: dict[str, str | Path],
    init_from: str | Path | None,
    world_size: int,
    lock: bool = True,
) -> Task:
    """What `dchag launch-train` checks before torchrun starts, as every rank would: the run's
    config for ``world_size`` processes, the model against this node's memory, the stores
    present and readable with data for a batch and for validation, then (``lock``) the run
    directory free; its lock is not kept: rank 0 takes it. A failed check leaves nothing.
    Returns the run's task."""
    from ..checks import check_model_size
    from ..jobs import node_memory_mb

    config, cfg = resolve_run(config, run, init_from, world_size)
    check_model_size(f"train.runs.{run}", cfg, *node_memory_mb())
    tracking.check(cfg, outdir)
    task = build_task(cfg, stores)
    every = list(range(task.model_cfg.in_channels))
    sizes = [len(task.dataset(split, every, cfg.train.seed, cache=False)) for split in ("train", "val")]
    dp = data_parallel_size(cfg.parallel.tp, cfg.parallel.data_parallel, world_size)
    check_splits(task, *sizes, dp, cfg.train.batch_size)
    if lock:
        RunLock(outdir).check_free()
    return task
