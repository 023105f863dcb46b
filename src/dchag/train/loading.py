"""A trained run's model on one device, for evaluation: no process group, no training loop.

The checkpoint may come from any parallel layout (tensor-parallel, FSDP, D-CHAG); its
parameters are read whole and D-CHAG's per-rank tokenizer blocks put side by side
(``checkpoint.load_weights``), which gives the one-device hierarchical model.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError, RunSettings, run_settings
from ..model import ChannelViT
from . import checkpoint as ckpt
from .tasks import Task, build_task


def load_trained(
    config: dict, run: str, checkpoint: str | Path, task: str, store: str | Path | None = None
) -> tuple[RunSettings, Task, ChannelViT]:
    """The run's settings, its task and its trained model in eval mode. ``store`` is the
    dataset store the model's shape is read from (hyperspectral tasks); a forecasting model's
    shape comes from the config alone."""
    cfg = run_settings(config, run)
    if cfg.task != task:
        raise ConfigError(f"run {run!r} is a {cfg.task} run, not a {task} run")
    if store is None and task != "forecast":
        raise ConfigError(f"run {run!r}: a {task} model's shape is read from its store; give the store (--data)")
    t = build_task(cfg, {"train": Path(store), "val": Path(store)} if store is not None else {})
    if store is not None:
        ckpt.check_data(t, checkpoint, store)
    model = ChannelViT(t.model_cfg)
    ckpt.load_weights(model, checkpoint)
    return cfg, t, model.eval()
