"""A trained run as a model file (``dchag export``): its checkpoint loaded by
``checkpoint.load_weights`` (any parallel layout) and described from its config and training
store; the file and what it holds: :mod:`dchag.model.file`. ``predict`` and evaluation take the
model file, fine-tuning a model file or a run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import provenance
from ..model import ChannelViT
from ..model.file import FORMAT, VERSION, Model, save

log = logging.getLogger(__name__)


# -- from a trained run --------------------------------------------------------------------------
def _era5_meta(task, store: Path) -> dict:
    from ..store import open_store

    ds = open_store(store)
    names = [str(c) for c in ds.channel.values]
    long_names = ds.attrs.get("channel_long_names") or names
    unit = ds.attrs.get("channel_units") or [None] * len(names)
    levels = ds["level"].values
    chosen = task.channels
    idx = [names.index(c) for c in chosen]
    channels = [
        {
            "name": names[i],
            "long_name": long_names[i],
            "units": unit[i],
            "level": None if np.isnan(levels[i]) else int(levels[i]),
        }
        for i in idx
    ]
    era5 = task.cfg.era5
    return {
        "channels": channels,
        "outputs": list(task.outputs),
        "grid": {"latitude": ds.lat.values.tolist(), "longitude": ds.lon.values.tolist(), "resolution": era5["grid"]},
        "normalisation": {"mean": ds["mean"].values[idx].tolist(), "std": ds["std"].values[idx].tolist()},
        "lead_hours": {
            "trained": list(task.cfg.train.forecast.lead_hours),
            "time_step_hours": era5["time_step_hours"],
        },
        "data": {"era5": era5},
    }


def _constants(task, store: Path, meta: dict) -> dict[str, np.ndarray]:
    """The time-invariant channels' fields (physical units) from the first step of ``store``."""
    from ..era5.source import channels_from_config
    from ..store import open_store

    kinds = {c.name: c.variable.kind for c in channels_from_config(task.cfg.era5)}
    ds = open_store(store)
    out = {}
    for ch in meta["channels"]:
        if kinds.get(ch["name"]) == "constant":
            sel = ds.sel(channel=ch["name"])
            out[ch["name"]] = (sel["data"].isel(time=0) * sel["std"] + sel["mean"]).values.astype(np.float32)
    return out


def _hsi_meta(task, store: Path) -> dict:
    from ..train.data import open_array, store_info

    info = store_info(store, "train")

    def arr(name):
        return np.asarray(open_array(store, f"train/{name}")[:], np.float64)

    wavelength, fwhm = arr("wavelength"), arr("fwhm")
    clipped = (Path(store) / "train" / "clip_low").exists()  # hsi.clip_percentiles: the training bounds
    normalisation = {"mean": arr("mean").tolist(), "std": arr("std").tolist()}
    if clipped:
        normalisation["clip"] = [arr("clip_low").tolist(), arr("clip_high").tolist()]
    return {
        "bands": {
            "wavelength": [None if not np.isfinite(v) else float(v) for v in wavelength],
            "fwhm": [None if not np.isfinite(v) else float(v) for v in fwhm],
            "band": arr("band").astype(int).tolist(),
            "sensor_band": arr("sensor_band").astype(int).tolist(),
            "num_input_bands": info.get("num_input_bands"),
        },
        "normalisation": normalisation,
        "class_names": list(task.class_names),
        "label_values": info.get("label_values"),
        "sample_size": int(task.model_cfg.img_size[0]),
        "mask_ratio": task.cfg.train.mae.mask_ratio,
        "seed": task.cfg.train.seed,
        "data": {"hsi": task.cfg.hsi},
    }


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
    ckpt.check_data(task, checkpoint, store)  # the store's statistics are what the model file will hold
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
    meta.update(_era5_meta(task, store) if task.name == "forecast" else _hsi_meta(task, store))
    constants = _constants(task, store, meta) if task.name == "forecast" else {}
    meta["provenance"] = origin
    return Model(meta, network.eval(), constants, source=source or str(origin.get("run", "")))


def export(config: dict, run: str, checkpoint: str | Path, output: str | Path, store: str | Path) -> Path:
    model = from_run(config, run, checkpoint, store)
    save(model, output)
    log.info("exported run %s (%s) to %s", run, checkpoint, output)
    return Path(output)
