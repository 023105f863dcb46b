"""What a run's checkpoints depend on (:func:`fingerprint`), what changed between two records
(:func:`changed_keys`), and whether a store is the data a checkpoint was trained on
(:func:`check_data`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .safety import FINGERPRINT, CheckpointError, _read_json

# -- what a run's checkpoints depend on ----------------------------------------------------------
# Settings that change neither the model, the data order nor the optimiser's state: a run
# whose fingerprint differs from its checkpoints' only in these resumes from them.
RESUMABLE = {
    "train.steps",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.val_every",
    "train.val_batches",
    "train.num_workers",
    "train.prefetch_factor",
    "train.cache_mb",
    "train.measure_comm",
    "train.measure_memory",
    "train.tensorboard",
    "train.mlflow.enabled",
    "train.mlflow.tracking_uri",
    "train.mlflow.experiment",
    "train.max_restarts",
    "train.gpus_per_node",
    # the number of data-parallel ranks (TP is parallel.tp): DCP reshards the parameters and
    # the optimizer's state, the sampler continues at the epoch's sample (the trainer warns)
    "train.nproc",
    "train.nodes",
    "parallel.activation_checkpointing",
    "parallel.fsdp_reshard_after_forward",
    "model.fused_front_end",  # the same parameters and function, computed another way
}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Settings only one task reads: another task's run does not depend on them.
TASK_ONLY = {
    "train.forecast": "forecast",
    "train.mae": "mae",
    "model.decoder": "mae",
}


def fingerprint(cfg, data: dict) -> dict:
    """What a run's checkpoints depend on, as dotted keys: the task, the data it reads
    (``data``: the task's signature of its stores — their channels or bands, sizes and
    normalisation, not the config that made them), the model, parallel and train settings,
    less the RESUMABLE ones and the sections of other tasks (TASK_ONLY). ``cfg``: a RunSettings."""
    train = {k: v for k, v in asdict(cfg.train).items() if k != "runs"}
    flat = _flatten(
        {"task": cfg.task, "data": data, "model": asdict(cfg.model), "parallel": asdict(cfg.parallel), "train": train}
    )

    def read(key: str) -> bool:
        section = next((s for s in TASK_ONLY if key.startswith(s + ".")), None)
        return key not in RESUMABLE and (section is None or TASK_ONLY[section] == cfg.task)

    return json.loads(json.dumps({k: v for k, v in flat.items() if read(k)}, default=str))


def _schema_default(key: str):
    from ...config import schema_default

    try:
        return json.loads(json.dumps(schema_default(key), default=str))
    except KeyError:
        return _NO_DEFAULT


_NO_DEFAULT = object()


def changed_keys(old: dict, new: dict) -> list[str]:
    """'key: old -> new' for every key whose value differs. A key the old record lacks counts
    as its schema default (an older dchag, before the key existed, behaved as the default
    does); a key the new one lacks is no longer a setting and does not count."""

    def short(v) -> str:
        text = json.dumps(v)
        return text if len(text) <= 60 else text[:50] + "…"

    out = []
    for k in sorted(new):
        before = old[k] if k in old else _schema_default(k)
        if before is _NO_DEFAULT:
            out.append(f"{k}: (absent) -> {short(new[k])}")
        elif before != new[k]:
            out.append(f"{k}: {short(before)} -> {short(new[k])}")
    return out


# What a trained model holds of its training store wherever it is applied: its channels or bands,
# their normalisation, and the grid or sample size (the store's shape less its first axis, the
# time steps or samples, which differ between a run's splits).
MODEL_DATA = ("channels", "wavelength", "kept_bands_1based", "mean", "std")


def check_data(task, checkpoint: str | Path, store: str | Path) -> None:
    """Refuse a ``store`` whose channels, bands, grid or normalisation differ from those the
    ``checkpoint`` was trained on (the ``data.*`` of its fingerprint), naming the store and the
    first differing field: a model described or applied with another store's statistics would
    contradict its own fingerprint. A checkpoint without a fingerprint (an older dchag's) has
    nothing to compare with."""
    path = Path(checkpoint) / FINGERPRINT
    if not path.exists():
        return
    record = _read_json(path)
    if record is None:
        raise CheckpointError(f"{path} is not readable JSON")
    here = task.data_signature()
    pairs = [(f"data.{k}", here.get(k), record[f"data.{k}"]) for k in MODEL_DATA if f"data.{k}" in record]
    if "data.shape" in record and "shape" in here:  # its first axis (time steps, samples) not compared
        trained = list(record["data.shape"])
        pairs.append(("data.shape", trained[:1] + list(here["shape"])[1:], trained))
    for field, mine, trained in pairs:
        if mine == trained:
            continue
        where = ""
        if isinstance(mine, list) and isinstance(trained, list) and len(mine) == len(trained):
            i = next(j for j, (a, b) in enumerate(zip(mine, trained)) if a != b)
            where, mine, trained = f"[{i}]", mine[i], trained[i]
        text = [json.dumps(v) if len(json.dumps(v)) <= 60 else json.dumps(v)[:50] + "…" for v in (mine, trained)]
        raise CheckpointError(
            f"store {store} is not the data checkpoint {checkpoint} was trained on: its {field}{where} is {text[0]}, "
            f"the checkpoint's fingerprint has {text[1]}; give the run's training store (--data)"
        )
