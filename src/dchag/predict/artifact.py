"""The exported model: one folder that a single CPU loads with nothing else.

``<dir>/model.safetensors``
    the consolidated one-device weights (no DTensor shards, D-CHAG's tokenizer blocks side
    by side), one tensor per parameter name of :class:`dchag.model.ChannelViT`; for a
    forecasting model also the time-invariant channels' fields (``constant.<channel>``,
    physical units) that a user's initial conditions need not hold. safetensors: a JSON
    header and raw bytes, no pickle.
``<dir>/model.json``
    ``format: dchag-model``, ``format_version``, ``task``, ``model`` (the ModelConfig),
    ``channels`` (name, long name, units, level) and ``outputs`` or ``bands`` (wavelength,
    fwhm, sensor band numbers), ``grid`` (latitude, longitude) or the tile / patch size,
    ``normalisation`` (mean, std per channel or band), ``lead_hours`` (trained range, time
    step), ``class_names``, the dataset section the run read (``data``: its ``era5`` or
    ``hsi`` config, for reading new inputs the same way), ``weights`` (file and SHA-256), and
    ``provenance`` (run, checkpoint, its fingerprint, dchag version and revision).

A trained run (its config, final/ checkpoint and store) gives the same object
(:func:`from_run`), so ``predict`` and fine-tuning take either.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import jsonio, provenance
from ..errors import DchagError
from ..model import ChannelViT, ModelConfig
from ..store import atomic_path

log = logging.getLogger(__name__)

FORMAT, VERSION = "dchag-model", 1
WEIGHTS, META = "model.safetensors", "model.json"
CONSTANT = "constant."
MAX_META_BYTES = 64 * 2**20  # a model.json holds lists of channels and statistics, not megabytes of them


class ArtifactError(DchagError, ValueError):
    """A model file is not a dchag model, is damaged, or does not fit what it is used for."""


@dataclass
class Model:
    """A trained model with what it needs to be applied: the network (eval mode, one
    device) and the description of its inputs and outputs (``meta``, model.json's content)."""

    meta: dict
    network: ChannelViT
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""

    @property
    def task(self) -> str:
        return self.meta["task"]

    @property
    def config(self) -> ModelConfig:
        return self.network.cfg

    def channel_names(self) -> list[str]:
        return [c["name"] for c in self.meta.get("channels", [])]

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.network.state_dict().items()}


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
    return {
        "bands": {
            "wavelength": [None if not np.isfinite(v) else float(v) for v in wavelength],
            "fwhm": [None if not np.isfinite(v) else float(v) for v in fwhm],
            "band": arr("band").astype(int).tolist(),
            "sensor_band": arr("sensor_band").astype(int).tolist(),
            "num_input_bands": info.get("num_input_bands"),
        },
        "normalisation": {"mean": arr("mean").tolist(), "std": arr("std").tolist()},
        "class_names": list(task.class_names),
        "label_values": info.get("label_values"),
        "sample_size": int(task.model_cfg.img_size[0]),
        "mask_ratio": task.cfg.train.mae.mask_ratio,
        "seed": task.cfg.train.seed,
        "data": {"hsi": task.cfg.hsi},
    }


def from_run(config: dict, run: str, checkpoint: str | Path, store: str | Path | None = None) -> Model:
    """A trained run as a :class:`Model`: its checkpoint loaded by
    ``checkpoint.load_weights`` (any parallel layout), described from its config and store
    (``store``: the training store; default where the pipeline puts it)."""
    from ..config import run_settings
    from ..plan import default_stores
    from ..train import checkpoint as ckpt
    from ..train.tasks import build_task

    cfg = run_settings(config, run)
    store = Path(store) if store else default_stores(config, cfg.task)["train"]
    task = build_task(cfg, {"train": store, "val": store})
    network = ChannelViT(task.model_cfg)
    ckpt.load_weights(network, checkpoint)
    fp = Path(checkpoint) / ckpt.FINGERPRINT
    origin = {
        "run": run,
        "checkpoint": str(checkpoint),
        "fingerprint": json.loads(fp.read_text()) if fp.is_file() else None,
        **provenance.record({k: config[k] for k in ("name",) if k in config}),
    }
    return describe(task, store, network, origin, source=f"run {run} ({checkpoint})")


def describe(task, store: str | Path, network: ChannelViT, origin: dict, source: str = "") -> Model:
    """A :class:`Model` of ``network`` (a one-device model of ``task``), described from the
    task's training ``store``; ``origin``: its provenance."""
    store = Path(store)
    meta = {"format": FORMAT, "format_version": VERSION, "task": task.name, "model": asdict(task.model_cfg)}
    meta.update(_era5_meta(task, store) if task.name == "forecast" else _hsi_meta(task, store))
    constants = _constants(task, store, meta) if task.name == "forecast" else {}
    meta["provenance"] = origin
    return Model(meta, network.eval(), constants, source=source or str(origin.get("run", "")))


# -- the file ------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def save(model: Model, directory: str | Path) -> Path:
    """Write ``model`` as an exported model folder (atomically)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {k: v.contiguous().clone() for k, v in model.weights().items()}
    tensors.update({CONSTANT + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.constants.items()})
    with atomic_path(directory) as tmp:
        tmp.mkdir()
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        meta = {**model.meta, "weights": {"file": WEIGHTS, "sha256": _sha256(tmp / WEIGHTS)}}
        (tmp / META).write_text(jsonio.dumps(meta, indent=1))
    return directory


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / META).is_file()


def _read_meta(directory: Path) -> dict:
    path = directory / META
    if not path.is_file():
        raise ArtifactError(f"{directory} is not an exported dchag model: it has no {META}")
    if path.stat().st_size > MAX_META_BYTES:
        raise ArtifactError(f"{path}: {path.stat().st_size} bytes is too large for a dchag model description")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path} is not JSON: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtifactError(f"{path} does not describe a dchag model (no 'format: {FORMAT}'); made by something else?")
    if meta.get("format_version") != VERSION:
        raise ArtifactError(f"{path}: format_version {meta.get('format_version')!r}; this dchag reads {VERSION}")
    for key in ("task", "model", "normalisation", "weights"):
        if key not in meta:
            raise ArtifactError(f"{path} lacks {key!r}")
    return meta


def load(directory: str | Path) -> Model:
    """An exported model folder as a :class:`Model` on the CPU; every damaged or foreign part
    is one ArtifactError naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = _read_meta(directory)
    weights = directory / meta["weights"].get("file", WEIGHTS)
    if weights.name != WEIGHTS or not weights.is_file():
        raise ArtifactError(f"{directory}: the weights file {WEIGHTS} is missing")
    digest = _sha256(weights)
    if digest != meta["weights"].get("sha256"):
        raise ArtifactError(
            f"{weights} is not the file {directory / META} describes (SHA-256 {digest[:12]}…, "
            f"expected {str(meta['weights'].get('sha256'))[:12]}…): damaged, or from another model"
        )
    try:
        tensors = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ArtifactError(f"{weights} is not a readable safetensors file: {err}") from None
    try:
        cfg = ModelConfig(**meta["model"])
    except (TypeError, ValueError) as err:
        raise ArtifactError(f"{directory / META}: its 'model' is not a dchag model configuration: {err}") from None
    network = ChannelViT(cfg)
    constants = {k.removeprefix(CONSTANT): v.numpy() for k, v in tensors.items() if k.startswith(CONSTANT)}
    params = {k: v for k, v in tensors.items() if not k.startswith(CONSTANT)}
    wanted = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    missing = sorted(set(wanted) - set(params))
    extra = sorted(set(params) - set(wanted))
    shapes = sorted(k for k in set(wanted) & set(params) if tuple(params[k].shape) != wanted[k])
    if missing or extra or shapes:
        parts = [
            f"{what}: {', '.join(keys[:6])}{' …' if len(keys) > 6 else ''}"
            for what, keys in (("missing", missing), ("not in the model", extra), ("other shape", shapes))
            if keys
        ]
        raise ArtifactError(f"{weights} does not fit the model {directory / META} describes; " + "; ".join(parts))
    network.load_state_dict(params)
    return Model(meta, network.eval(), constants, source=str(directory))


def export(config: dict, run: str, checkpoint: str | Path, output: str | Path, store: str | Path | None = None) -> Path:
    model = from_run(config, run, checkpoint, store)
    save(model, output)
    log.info("exported run %s (%s) to %s", run, checkpoint, output)
    return Path(output)


def open_model(
    model: str | Path | None = None,
    config: dict | None = None,
    run: str | None = None,
    checkpoint: str | Path | None = None,
    store: str | Path | None = None,
) -> Model:
    """An exported model folder (``model``), or a trained run (``config``, ``run``,
    ``checkpoint``, and its training ``store``)."""
    if model is not None:
        return load(model)
    if config is None or run is None or checkpoint is None:
        raise ArtifactError("give an exported model (--model DIR), or a run: --config, --run-name and --checkpoint")
    return from_run(config, run, checkpoint, store)
