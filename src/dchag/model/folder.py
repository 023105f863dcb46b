"""The model folder: what a single CPU loads with nothing else.

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
    step), ``class_names``, ``layout`` (the run's ``parallel.tp`` and ``parallel.strategy``:
    how predict lays it out under torchrun), the dataset section the run read (``data``: its ``era5`` or
    ``hsi`` config, for reading new inputs the same way), ``weights`` (file and SHA-256), and
    ``provenance`` (run, checkpoint, its fingerprint, dchag version and revision).

A model folder is untrusted until checked, and checked as a whole before it costs memory or
time (:func:`check`): model.json's every key (types, sizes within :data:`LIMITS`, heads
dividing widths), the weights file a bare name inside the folder, the safetensors header read
with a bound, the file's size equal to its header and data, every tensor's name, dtype and
shape equal to those of the network model.json describes (built on torch's meta device: no
memory), the parameter count within :data:`MAX_PARAMETERS`; only then is the file hashed
(:func:`load`) and the network built.

:func:`load` reads it, :func:`save` writes it; ``dchag.predict.export`` makes one from a
trained run (``dchag export``), and ``predict`` and fine-tuning take either.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from .. import jsonio
from ..config import model_settings
from ..errors import DchagError
from ..store import atomic_path
from ..vocabulary import Strategy, Task
from .model import AGGREGATIONS, TASKS, ChannelViT, ModelConfig

FORMAT, VERSION = "dchag-model", 1
WEIGHTS, META = "model.safetensors", "model.json"
CONSTANT = "constant."
MAX_META_BYTES = 64 * 2**20  # a model.json holds lists of channels and statistics, not megabytes of them
MAX_HEADER_BYTES = 16 * 2**20  # a safetensors header: names, dtypes, shapes and offsets
# The largest sizes a model description may give, checked before any network is described:
# with them the meta-device network of the largest description is built in seconds.
LIMITS = {
    "in_channels": 2**16,
    "patch_size": 2**10,
    "embed_dim": 2**16,
    "depth": 512,
    "num_heads": 2**10,
    "groups": 2**10,
    "tree": 2**10,
    "decoder_dim": 2**16,
    "decoder_depth": 512,
    "decoder_heads": 2**10,
    "num_classes": 2**16,
}
MAX_IMAGE, MAX_MLP_RATIO = 2**16, 64
MAX_PARAMETERS = 2**32  # 16 GiB of float32; loading holds the weights twice
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


class ModelFolderError(DchagError, ValueError):
    """A model folder is not a dchag model, is damaged, or does not fit what it is used for."""


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

    def require(self, task: Task) -> None:
        """Refuse a model of another task than the use it is put to."""
        if self.task != task:
            raise ModelFolderError(f"{self.source} is a {self.task} model, not a {task} model")

    @property
    def layout(self) -> tuple[int, str]:
        """(parallel.tp, parallel.strategy) of the run it was trained in: how predict lays it
        out under torchrun (a model folder without ``layout``: one rank's model, shared out by data)."""
        layout = self.meta.get("layout") or {"tp": 1, "strategy": "baseline"}
        return int(layout["tp"]), str(layout["strategy"])

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.network.state_dict().items()}

    @staticmethod
    def load(directory: str | Path) -> Model:
        """A model folder, checked, hashed and built (:func:`load`)."""
        return load(directory)

    # What `dchag predict` writes, as an xarray Dataset (dchag.predict.calls).
    def forecast(self, initial, lead_hours: list[int], **options):
        """Forecasts from initial conditions (a Dataset or files), WeatherBench 2's layout."""
        from ..predict.calls import forecast

        return forecast(self, initial, lead_hours, **options)

    def classify(self, image, **options):
        """Every pixel's class of a scene file."""
        from ..predict.calls import classify

        return classify(self, image, **options)

    def reconstruct(self, image, **options):
        """The reconstruction of every complete tile of a scene file."""
        from ..predict.calls import reconstruct

        return reconstruct(self, image, **options)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def save(model: Model, directory: str | Path) -> Path:
    """Write ``model`` as a model folder (atomically)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {k: v.contiguous().clone() for k, v in model.weights().items()}
    tensors.update({CONSTANT + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.constants.items()})
    with atomic_path(directory, "model") as tmp:
        tmp.mkdir()
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        mask = os.umask(0)
        os.umask(mask)
        (tmp / WEIGHTS).chmod(0o666 & ~mask)  # safetensors writes 0600; model.json beside it follows the umask
        meta = {**model.meta, "weights": {"file": WEIGHTS, "sha256": _sha256(tmp / WEIGHTS)}}
        (tmp / META).write_text(jsonio.dumps(meta, indent=1))
    return directory


def _is_int(v, lo: int, hi: float = math.inf) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _numbers(v, n: int, none: bool = False) -> bool:
    return isinstance(v, list) and len(v) == n and all(_is_number(x) or (none and x is None) for x in v)


class _Checker:
    """One-line errors naming model.json and the key at fault."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, value, expected: str) -> ModelFolderError:
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 60 else shown[:50] + "…"
        return ModelFolderError(f"{self.path}: key {key!r} is {shown}; expected {expected}")

    def need(self, ok: bool, key: str, value, expected: str) -> None:
        if not ok:
            raise self.fail(key, value, expected)

    def get(self, d: dict, key: str, prefix: str = ""):
        if key not in d:
            raise ModelFolderError(f"{self.path}: key {prefix + key!r} is missing")
        return d[key]

    def section(self, d: dict, key: str, prefix: str = "") -> dict:
        value = self.get(d, key, prefix)
        self.need(isinstance(value, dict), prefix + key, value, "a mapping")
        return value


def _model_config(c: _Checker, m) -> ModelConfig:
    """model.json's ``model`` as a ModelConfig, every setting checked (type and range)."""
    c.need(isinstance(m, dict), "model", m, "a mapping of the model's settings")
    # a model folder from before the fused front end: the schema's default way to compute it
    m = {"fused_front_end": model_settings().fused_front_end, **m}
    c.need(isinstance(m["fused_front_end"], bool), "model.fused_front_end", m["fused_front_end"], "true or false")
    known = {f.name: f for f in fields(ModelConfig)}
    for k in m:
        if k not in known:
            raise ModelFolderError(f"{c.path}: key 'model.{k}' is no setting of a dchag model")
    for k, f in known.items():
        if f.default is MISSING and f.default_factory is MISSING:
            c.get(m, k, "model.")
    for k, hi in LIMITS.items():
        lo = 0 if k in ("tree", "num_classes") else 1
        if k in m:
            c.need(_is_int(m[k], lo, hi), f"model.{k}", m[k], f"an integer from {lo} to {hi}")
    img = m["img_size"]
    c.need(
        isinstance(img, list) and len(img) == 2 and all(_is_int(v, 1, MAX_IMAGE) for v in img),
        "model.img_size",
        img,
        f"[height, width], integers from 1 to {MAX_IMAGE}",
    )
    ratio = m["mlp_ratio"]
    c.need(
        _is_number(ratio) and 0 < ratio <= MAX_MLP_RATIO, "model.mlp_ratio", ratio, f"a number in (0, {MAX_MLP_RATIO}]"
    )
    for k, allowed in (("aggregation", AGGREGATIONS), ("task", TASKS)):
        c.need(m[k] in allowed, f"model.{k}", m[k], "one of " + ", ".join(allowed))
    for dim, heads in (("embed_dim", "num_heads"), ("decoder_dim", "decoder_heads")):
        c.need(m[dim] % m[heads] == 0, f"model.{heads}", m[heads], f"a divisor of model.{dim} {m[dim]}")
    n = m["in_channels"]
    out = m.get("out_channels", [])
    c.need(
        isinstance(out, list) and all(_is_int(v, 0, n - 1) for v in out) and len(set(out)) == len(out),
        "model.out_channels",
        out,
        f"distinct channel indices from 0 to {n - 1}",
    )
    wl = m.get("wavelengths")
    c.need(wl is None or _numbers(wl, n), "model.wavelengths", wl, f"null or {n} band centres (nm)")
    try:
        return ModelConfig(**m)
    except ValueError as err:
        raise ModelFolderError(f"{c.path}: key 'model': {err}") from None


def _check_description(c: _Checker, meta: dict, cfg: ModelConfig) -> None:
    """The keys besides ``model`` that predict and fine-tuning read, against the model's sizes."""
    n = cfg.in_channels
    c.need(meta["task"] == cfg.task, "task", meta["task"], f"the model's task {cfg.task!r}")
    weights = c.section(meta, "weights")
    name = c.get(weights, "file", "weights.")
    c.need(name == WEIGHTS, "weights.file", name, f"the bare name {WEIGHTS} inside the model folder")
    digest = c.get(weights, "sha256", "weights.")
    c.need(isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) is not None, "weights.sha256", digest,
           "a SHA-256 (64 hexadecimal digits)")  # fmt: skip
    norm = c.section(meta, "normalisation")
    for k in ("mean", "std"):
        c.need(_numbers(c.get(norm, k, "normalisation."), n), f"normalisation.{k}", norm[k], f"{n} finite numbers")
    c.need(all(s > 0 for s in norm["std"]), "normalisation.std", norm["std"], "positive numbers")
    clip = norm.get("clip")
    c.need(clip is None or (isinstance(clip, list) and len(clip) == 2 and all(_numbers(b, n) for b in clip)),
           "normalisation.clip", clip, f"[low, high], {n} numbers each")  # fmt: skip
    layout = meta.get("layout")
    if layout is not None:
        c.need(isinstance(layout, dict) and _is_int(layout.get("tp"), 1, LIMITS["num_heads"])
               and layout.get("strategy") in tuple(Strategy), "layout", layout,
               f"{{tp: a whole number >= 1, strategy: one of {', '.join(Strategy)}}}")  # fmt: skip
    _CHECKS[cfg.task](c, meta, cfg, c.section(meta, "data"))


def _check_forecast(c: _Checker, meta: dict, cfg: ModelConfig, data: dict) -> None:
    n = cfg.in_channels
    channels = c.get(meta, "channels")
    c.need(
        isinstance(channels, list)
        and len(channels) == n
        and all(isinstance(ch, dict) and isinstance(ch.get("name"), str) for ch in channels),
        "channels",
        channels,
        f"{n} channels, each with a name",
    )
    names = [ch["name"] for ch in channels]
    c.need(len(set(names)) == n, "channels", names, "distinct names")
    outputs = c.get(meta, "outputs")
    predicted = [names[i] for i in cfg.out_channels]  # the head's channels, in its order
    c.need(outputs == predicted, "outputs", outputs, f"{predicted} (model.out_channels, in order)")
    grid = c.section(meta, "grid")
    for k, size in (("latitude", cfg.img_size[0]), ("longitude", cfg.img_size[1])):
        c.need(_numbers(c.get(grid, k, "grid."), size), f"grid.{k}", grid[k], f"{size} numbers")
    lead = c.section(meta, "lead_hours")
    step = c.get(lead, "time_step_hours", "lead_hours.")
    c.need(_is_int(step, 1, 24 * 366), "lead_hours.time_step_hours", step, "a whole number of hours")
    trained = c.get(lead, "trained", "lead_hours.")
    c.need(isinstance(trained, list) and len(trained) == 2 and all(_is_int(h, 0) for h in trained)
           and trained[0] <= trained[1], "lead_hours.trained", trained, "[lowest, highest] hours")  # fmt: skip
    c.need(isinstance(c.get(data, "era5", "data."), dict), "data.era5", data["era5"], "a mapping")


def _check_bands(c: _Checker, meta: dict, cfg: ModelConfig, data: dict) -> None:
    """A hyperspectral model's bands, sample size, data section and seed."""
    n = cfg.in_channels
    bands = c.section(meta, "bands")
    for k in ("wavelength", "fwhm"):
        c.need(_numbers(c.get(bands, k, "bands."), n, none=True), f"bands.{k}", bands[k], f"{n} numbers or nulls")
    size = c.get(meta, "sample_size")
    c.need(size == cfg.img_size[0], "sample_size", size, f"the model's image size {cfg.img_size[0]}")
    c.need(isinstance(c.get(data, "hsi", "data."), dict), "data.hsi", data["hsi"], "a mapping")
    if "seed" in meta:
        c.need(_is_int(meta["seed"], 0), "seed", meta["seed"], "a non-negative integer")


def _check_mae(c: _Checker, meta: dict, cfg: ModelConfig, data: dict) -> None:
    _check_bands(c, meta, cfg, data)
    ratio = c.get(meta, "mask_ratio")
    c.need(_is_number(ratio) and 0 <= ratio < 1, "mask_ratio", ratio, "a number in [0, 1)")


def _check_classification(c: _Checker, meta: dict, cfg: ModelConfig, data: dict) -> None:
    _check_bands(c, meta, cfg, data)
    classes = meta.get("class_names")
    c.need(classes is None or (isinstance(classes, list) and len(classes) == cfg.num_classes
           and all(isinstance(x, str) for x in classes)), "class_names", classes,
           f"{cfg.num_classes} names")  # fmt: skip


_CHECKS = {Task.FORECAST: _check_forecast, Task.MAE: _check_mae, Task.CLASSIFICATION: _check_classification}


def _read_meta(directory: Path) -> tuple[dict, ModelConfig]:
    path = directory / META
    if not path.is_file():
        raise ModelFolderError(f"{directory} is not a dchag model folder: it has no {META}")
    if path.stat().st_size > MAX_META_BYTES:
        raise ModelFolderError(f"{path}: {path.stat().st_size} bytes is too large for a dchag model description")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ModelFolderError(f"{path} is not JSON: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFolderError(f"{path} does not describe a dchag model (no 'format: {FORMAT}'); made elsewhere?")
    if meta.get("format_version") != VERSION:
        raise ModelFolderError(f"{path}: format_version {meta.get('format_version')!r}; this dchag reads {VERSION}")
    c = _Checker(path)
    for key in ("task", "model", "normalisation", "weights"):
        c.get(meta, key)
    cfg = _model_config(c, meta["model"])
    _check_description(c, meta, cfg)
    return meta, cfg


def expected_state(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The state dict's names, shapes and dtypes of ``cfg``'s network, built on torch's meta
    device (no memory; the sizes must be within :data:`LIMITS` for it to be quick)."""
    with torch.device("meta"):
        network = ChannelViT(cfg)
    return {k: (tuple(v.shape), v.dtype) for k, v in network.state_dict().items()}


def _read_header(weights: Path) -> dict[str, dict]:
    """The safetensors header (read with a bound), its entries' offsets contiguous and the
    file's size equal to 8 + the header + the data."""
    size = weights.stat().st_size
    with open(weights, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
            raise ModelFolderError(
                f"{weights} is not a readable safetensors file: a header of {n} bytes in a file of {size} bytes"
            )
        text = f.read(n)
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ModelFolderError(f"{weights} is not a readable safetensors file: its header is no JSON ({err})") from None
    if not isinstance(header, dict):
        raise ModelFolderError(f"{weights} is not a readable safetensors file: its header is not a mapping")
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        ok = (
            isinstance(entry, dict)
            and entry.get("dtype") in ITEMSIZE
            and isinstance(entry.get("shape"), list)
            and all(_is_int(v, 0) for v in entry["shape"])
            and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2
            and all(_is_int(v, 0) for v in entry["data_offsets"])
        )
        if not ok:
            raise ModelFolderError(f"{weights}: the header's entry {name!r} is not a safetensors tensor entry")
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1], k) for k, e in header.items())
    for lo, hi, name in spans:
        entry = header[name]
        nbytes = math.prod(entry["shape"]) * ITEMSIZE[entry["dtype"]]
        if lo != end or hi - lo != nbytes:
            raise ModelFolderError(
                f"{weights}: the header's entry {name!r} lies at bytes {lo}..{hi}, not at {end}..{end + nbytes}"
            )
        end = hi
    if size != 8 + n + end:
        raise ModelFolderError(f"{weights} is {size} bytes; its header describes {8 + n + end}")
    return header


def check(directory: str | Path) -> tuple[dict, ModelConfig]:
    """Check a model folder as a whole without hashing it or building its network:
    model.json, the weights file's header, size and every tensor's name, dtype and shape
    against the network model.json describes, and the parameter count. Returns model.json's
    content and its ModelConfig; raises ModelFolderError naming the file and what is wrong."""
    directory = Path(directory)
    meta, cfg = _read_meta(directory)
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise ModelFolderError(f"{directory}: the weights file {WEIGHTS} is missing")
    try:
        wanted = expected_state(cfg)
    except ValueError as err:
        raise ModelFolderError(f"{directory / META}: key 'model': {err}") from None
    total = sum(math.prod(shape) for shape, _ in wanted.values())
    if total > MAX_PARAMETERS:
        raise ModelFolderError(
            f"{directory / META} describes a network of {total:,} parameters ({total * 4 / 2**30:,.1f} GiB); "
            f"a model folder holds at most {MAX_PARAMETERS:,}"
        )
    names = {ch["name"] for ch in meta.get("channels") or []}  # a forecast's: its constants
    header = _read_header(weights)
    params = {k: e for k, e in header.items() if not k.startswith(CONSTANT)}
    missing = sorted(set(wanted) - set(params))
    extra = sorted(set(params) - set(wanted))
    shapes = sorted(
        f"{k} {tuple(params[k]['shape'])} {params[k]['dtype']} vs {wanted[k][0]} {DTYPES.get(wanted[k][1])}"
        for k in set(wanted) & set(params)
        if (tuple(params[k]["shape"]), params[k]["dtype"]) != (wanted[k][0], DTYPES.get(wanted[k][1]))
    )
    for k, e in header.items():
        if k.startswith(CONSTANT):
            ok = k.removeprefix(CONSTANT) in names
            if not ok or (tuple(e["shape"]), e["dtype"]) != (cfg.img_size, "F32"):
                extra.append(k)
    if missing or extra or shapes:
        parts = [
            f"{what}: {', '.join(keys[:6])}{' …' if len(keys) > 6 else ''}"
            for what, keys in (("missing", missing), ("not in the model", extra), ("other shape or dtype", shapes))
            if keys
        ]
        raise ModelFolderError(f"{weights} does not fit the model {directory / META} describes; " + "; ".join(parts))
    return meta, cfg


def load(directory: str | Path) -> Model:
    """A model folder as a :class:`Model` on the CPU: :func:`check`, then the
    weights' SHA-256, then the network; every damaged or foreign part is one ModelFolderError
    naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    meta, cfg = check(directory)
    weights = directory / WEIGHTS
    digest = _sha256(weights)
    if digest != meta["weights"]["sha256"]:
        raise ModelFolderError(
            f"{weights} is not the file {directory / META} describes (SHA-256 {digest[:12]}…, "
            f"expected {meta['weights']['sha256'][:12]}…): damaged, or from another model"
        )
    try:
        tensors = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ModelFolderError(f"{weights} is not a readable safetensors file: {err}") from None
    network = ChannelViT(cfg)
    constants = {k.removeprefix(CONSTANT): v.numpy() for k, v in tensors.items() if k.startswith(CONSTANT)}
    network.load_state_dict({k: v for k, v in tensors.items() if not k.startswith(CONSTANT)})
    return Model(meta, network.eval(), constants, source=str(directory))
