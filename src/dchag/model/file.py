"""The model file: one folder that a single CPU loads with nothing else.

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

:func:`load` reads it, :func:`save` writes it; ``dchag.predict.artifact`` makes one from a
trained run (``dchag export``), and ``predict`` and fine-tuning take either.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import jsonio
from ..config import model_settings
from ..errors import DchagError
from ..store import atomic_path
from .model import ChannelViT, ModelConfig

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
        # a model file from before the fused front end: the schema's default way to compute it
        cfg = ModelConfig(**{"fused_front_end": model_settings().fused_front_end, **meta["model"]})
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
