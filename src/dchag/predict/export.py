"""A trained run as a model folder (``dchag export``): its checkpoint loaded by
``checkpoint.load_weights`` (any parallel layout) and described from its config and training
store; the folder and what it holds: :mod:`dchag.model.folder`. ``predict`` and evaluation take the
model folder, fine-tuning a model folder or a run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from .. import provenance
from ..model import ChannelViT
from ..model.folder import FORMAT, VERSION, Model, save

log = logging.getLogger(__name__)


def from_run(config: dict, run: str, checkpoint: str | Path, store: str | Path) -> Model:
    """A trained run as a :class:`Model`: its checkpoint loaded by
    ``checkpoint.load_weights`` (any parallel layout), described from its config and its
    training ``store``."""
    from ..config import run_settings
    from ..train import checkpoint as ckpt
    from ..train.tasks import build_task

    cfg = run_settings(config, run)
    store = Path(store)
    task = build_task(cfg, {"train": store, "val": store})
    ckpt.check_data(task, checkpoint, store)  # the store's statistics are what the model folder will hold
    network = ChannelViT(task.model_cfg)
    ckpt.load_weights(network, checkpoint)
    fp = Path(checkpoint) / ckpt.FINGERPRINT
    origin = {
        "run": run,
        "checkpoint": str(checkpoint),
        "fingerprint": json.loads(fp.read_text()) if fp.is_file() else None,
        **provenance.record({k: config[k] for k in ("name",) if k in config}),
    }
    model = describe(task, store, network, origin, source=f"run {run} ({checkpoint})")
    model.meta["layout"] = {"tp": cfg.parallel.tp, "strategy": cfg.parallel.strategy}
    return model


def describe(task, store: str | Path, network: ChannelViT, origin: dict, source: str = "") -> Model:
    """A :class:`Model` of ``network`` (a one-device model of ``task``), described from the
    task's training ``store``; ``origin``: its provenance."""
    store = Path(store)
    meta = {"format": FORMAT, "format_version": VERSION, "task": task.name, "model": asdict(task.model_cfg)}
    meta.update(task.export_meta(store))
    constants = task.export_constants(store, meta)
    meta["provenance"] = origin
    return Model(meta, network.eval(), constants, source=source or str(origin.get("run", "")))


def export(config: dict, run: str, checkpoint: str | Path, output: str | Path, store: str | Path) -> Path:
    model = from_run(config, run, checkpoint, store)
    save(model, output)
    log.info("exported run %s (%s) to %s", run, checkpoint, output)
    from ..train.tracking import log_model

    log_model(config, run, checkpoint, output)  # to the run's MLflow run, when train.mlflow is on
    return Path(output)
