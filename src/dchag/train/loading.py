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
from ..plan import default_stores
from .tasks import Task, build_task


def load_trained(config: dict, run: str, checkpoint: str | Path, task: str,
                 store: str | Path | None = None) -> tuple[RunSettings, Task, ChannelViT]:
    """The run's settings, its task and its trained model in eval mode. ``store`` is the
    dataset store the model's shape is read from (hyperspectral tasks; default under
    results/<name>); a forecasting model's shape comes from the config alone."""
    cfg = run_settings(config, run)
    if cfg.task != task:
        raise ConfigError(f"run {run!r} is a {cfg.task} run, not a {task} run")
    stores = default_stores(config, task) if store is None else {"train": Path(store), "val": Path(store)}
    t = build_task(cfg, stores)
    model = ChannelViT(t.model_cfg)
    ckpt.load_weights(model, checkpoint)
    return cfg, t, model.eval()
