"""Sharded, resumable checkpoints with torch.distributed.checkpoint (DCP).

A checkpoint holds only tensors: model parameters (DTensor shards as they lie), AdamW state,
the trainer's counters and every rank's RNG state. Loading never unpickles arbitrary
objects: the metadata file is read by an unpickler that admits DCP's own metadata classes
and nothing else, and byte (non-tensor) entries are refused.

Under D-CHAG a rank's tokenizer holds channel block [lo, hi); its entries are keyed
``tokenizer[lo:hi].…`` so blocks of different ranks never collide, and a checkpoint made
with another channel layout fails with the mismatched keys listed.

Checkpoints are written to a temporary directory and renamed when every rank is done, so a
crash mid-save never leaves one that looks complete.

:class:`CheckpointManager` is the training loop's view: the run's checkpoint directory, the
policy (save every N steps and at the end, resume from the newest), and the guard that a run
resumes only checkpoints of its own configuration.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.tensor import DTensor

from ..errors import DchagError


class CheckpointError(DchagError, ValueError):
    """A checkpoint is incomplete, unsafe, or made for another model or layout."""


_ALLOWED = {
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint._extension",
    "collections",
    "torch",
    "torch.storage",
}
# Functions DCP's metadata legitimately names: they rebuild dtypes/layouts from their names.
_ALLOWED_FUNCTIONS = {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
                      ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath")}
_ALLOWED_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bool", "slice", "NoneType"}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_FUNCTIONS or (module == "builtins" and name in _ALLOWED_BUILTINS):
            return super().find_class(module, name)
        if module in _ALLOWED and not name.startswith("_load") and name not in ("load", "eval", "exec"):
            obj = super().find_class(module, name)
            if module == "torch" and not isinstance(obj, (type, torch.dtype)) and name != "Size":
                raise pickle.UnpicklingError(f"checkpoint metadata refers to torch.{name}, which is not data")
            return obj
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}; refusing to load it")


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata is unpickled with an allow-list (tensor data is
    already read with ``weights_only=True`` by DCP)."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
            except pickle.UnpicklingError as err:
                raise CheckpointError(f"{self.path}: {err}") from err
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _TensorsOnlyPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item, value) -> None:
        raise CheckpointError(f"checkpoint entry {read_item.dest_index.fqn} is not a tensor; refusing to unpickle it")


def canonical(name: str) -> str:
    """Parameter name without wrapper prefixes (DDP's module., activation checkpointing's)."""
    return name.replace("_checkpoint_wrapped_module.", "").removeprefix("module.")


def state(model: nn.Module, optimizer: torch.optim.Optimizer, counters: dict[str, int],
          extra: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The flat tensor state of a training run (optimizer state created if still empty), plus
    ``extra`` tensors (a communication hook's per-rank state)."""
    core = model.module if hasattr(model, "module") else model
    ids = getattr(core, "tokenizer").channel_ids
    block = f"tokenizer[{int(ids[0])}:{int(ids[-1]) + 1}]." if getattr(core, "group_gather", None) is not None else "tokenizer."
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        key = canonical(name).replace("tokenizer.", block, 1) if canonical(name).startswith("tokenizer.") else canonical(name)
        out[f"model.{key}"] = p
        st = optimizer.state[p]
        if not st and p.requires_grad:  # AdamW creates its state lazily: make it, so it can be loaded into
            st.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        for k, v in st.items():
            out[f"optim.{key}.{k}"] = v
    for k, v in counters.items():
        out[f"trainer.{k}"] = torch.tensor(int(v))
    rank = dist.get_rank() if dist.is_initialized() else 0
    out[f"rng.rank{rank}"] = torch.get_rng_state()
    out.update(extra or {})
    return out


def save(tensors: dict[str, torch.Tensor], directory: str | Path) -> Path:
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    dcp.save(tensors, checkpoint_id=str(tmp))
    if dist.is_initialized():
        dist.barrier()
    if rank0:
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
    if dist.is_initialized():
        dist.barrier()
    return directory


def _saved_shapes(directory: str | Path) -> dict[str, tuple[int, ...]]:
    meta = SafeReader(str(directory)).read_metadata()
    return {k: tuple(v.size) for k, v in meta.state_dict_metadata.items() if hasattr(v, "size")}


def check_compatible(tensors: dict[str, torch.Tensor], directory: str | Path) -> None:
    """Raise CheckpointError listing keys missing from the checkpoint, unexpected in it, or of
    another shape, before anything is loaded."""
    saved = _saved_shapes(directory)
    wanted = {k: tuple(v.shape) for k, v in tensors.items() if not k.startswith("rng.")}
    everyone = set(wanted)  # D-CHAG ranks hold different keys: "unexpected" is against all of them
    if dist.is_initialized() and dist.get_world_size() > 1:
        keys: list = [None] * dist.get_world_size()
        dist.all_gather_object(keys, sorted(wanted))
        everyone = set().union(*keys)
    missing = sorted(set(wanted) - set(saved))
    unexpected = sorted(k for k in set(saved) - everyone if not k.startswith("rng."))
    shapes = sorted(k for k in set(wanted) & set(saved) if wanted[k] != saved[k])
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append("missing from the checkpoint: " + ", ".join(missing[:12]) + (" …" if len(missing) > 12 else ""))
        if unexpected:
            parts.append("not in this model: " + ", ".join(unexpected[:12]) + (" …" if len(unexpected) > 12 else ""))
        if shapes:
            parts.append("other shape: " + ", ".join(f"{k} {saved[k]} vs {wanted[k]}" for k in shapes[:12]))
        raise CheckpointError(f"checkpoint {directory} was made for another model or layout; " + "; ".join(parts))


def load(tensors: dict[str, torch.Tensor], directory: str | Path) -> dict[str, int]:
    """Load in place into ``tensors``; returns the trainer counters; restores this rank's RNG."""
    check_compatible(tensors, directory)
    dcp.load(tensors, storage_reader=SafeReader(str(directory)), planner=_TensorsOnlyPlanner())
    rank = dist.get_rank() if dist.is_initialized() else 0
    if f"rng.rank{rank}" in tensors:
        torch.set_rng_state(tensors[f"rng.rank{rank}"])
    return {k.removeprefix("trainer."): int(v) for k, v in tensors.items() if k.startswith("trainer.")}


def latest(directory: str | Path) -> Path | None:
    """The newest complete step_N checkpoint in ``directory`` (temporaries are ignored)."""
    steps = []
    for p in Path(directory).glob("step_*"):
        m = re.fullmatch(r"step_(\d+)", p.name)
        if m and (p / ".metadata").exists():
            steps.append((int(m.group(1)), p))
    return max(steps)[1] if steps else None


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded parameters by canonical name (DTensors gathered) — for comparisons and export."""
    return {canonical(n): (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}


_BLOCK = re.compile(r"model\.tokenizer\[(\d+):(\d+)\]\.(.+)")
_PER_CHANNEL = ("weight", "bias", "channel_embed")  # tokenizer parameters with a leading channel axis


def load_weights(model: nn.Module, directory: str | Path) -> None:
    """Load a training checkpoint's model weights into a one-device model (no process group).

    Tensor-parallel and FSDP parameters are read whole; D-CHAG's per-rank tokenizer blocks
    (``tokenizer[lo:hi].*``) are put back side by side, which gives the one-device
    hierarchical model that D-CHAG parallelizes (groups = TP size) its exact weights.
    """
    directory = Path(directory)
    if not (directory / ".metadata").exists():
        raise CheckpointError(f"{directory} is not a complete checkpoint (no .metadata)")
    saved = _saved_shapes(directory)
    blocks: dict[str, list[tuple[int, int, str]]] = {}
    for key in saved:
        m = _BLOCK.fullmatch(key)
        if m:
            blocks.setdefault(m.group(3), []).append((int(m.group(1)), int(m.group(2)), key))
    wanted: dict[str, torch.Tensor] = {}
    plan: dict[str, list[str]] = {}
    problems = []
    for name, p in model.named_parameters():
        key = f"model.{canonical(name)}"
        if key in saved:
            plan[name] = [key]
        elif name.startswith("tokenizer.") and name.removeprefix("tokenizer.") in blocks:
            parts = sorted(blocks[name.removeprefix("tokenizer.")])
            per_channel = name.removeprefix("tokenizer.") in _PER_CHANNEL
            plan[name] = [k for _, _, k in parts] if per_channel else [parts[0][2]]
            if per_channel and (parts[0][0] != 0 or parts[-1][1] != p.shape[0]
                                or any(a[1] != b[0] for a, b in zip(parts, parts[1:]))):
                problems.append(f"{name}: channel blocks {[(lo, hi) for lo, hi, _ in parts]} do not cover 0..{p.shape[0]}")
        else:
            problems.append(f"{name}: not in the checkpoint")
            continue
        for k in plan[name]:
            wanted[k] = torch.empty(saved[k], dtype=p.dtype)
    if problems:
        raise CheckpointError(f"checkpoint {directory} does not fit this model: " + "; ".join(problems[:8]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(wanted, storage_reader=SafeReader(str(directory)), planner=_TensorsOnlyPlanner(), no_dist=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = torch.cat([wanted[k] for k in plan[name]]) if len(plan[name]) > 1 else wanted[plan[name][0]]
            if tuple(value.shape) != tuple(p.shape):
                raise CheckpointError(f"checkpoint {directory}: {name} has shape {tuple(value.shape)}, the model {tuple(p.shape)}")
            p.copy_(value)


# -- the training loop's checkpoint policy ---------------------------------------------------
# Settings that change neither the model, the data order nor the optimiser's state: a run
# whose config differs from its checkpoints' only in these resumes from them.
RESUMABLE = {"train.steps", "train.checkpoint_every", "train.val_every", "train.val_batches", "train.num_workers",
             "train.prefetch_factor", "train.cache_mb", "train.measure_comm", "train.measure_memory", "train.tensorboard",
             "train.max_restarts", "train.gpus_per_node", "parallel.activation_checkpointing",
             "parallel.fsdp_reshard_after_forward"}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def fingerprint(cfg) -> dict:
    """What a run's checkpoints depend on: the task, its dataset section, model, parallel and
    train settings (dotted keys), less the RESUMABLE ones. ``cfg``: a RunSettings."""
    from dataclasses import asdict

    data = {"era5": cfg.era5} if cfg.task == "forecast" else {"hsi": cfg.hsi}
    train = {k: v for k, v in asdict(cfg.train).items() if k != "runs"}
    flat = _flatten({"task": cfg.task, **data, "model": asdict(cfg.model), "parallel": asdict(cfg.parallel), "train": train})
    return json.loads(json.dumps({k: v for k, v in flat.items() if k not in RESUMABLE}, default=str))


def changed_keys(old: dict | None, new: dict) -> list[str]:
    """'key: old -> new' for every key that differs (all, when there is no readable record)."""
    if old is None:
        return ["no readable record of the checkpoints' configuration"]
    return [f"{k}: {old.get(k, '(absent)')} -> {new.get(k, '(absent)')}" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)]


def _read_record(path: Path) -> dict | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


class CheckpointManager:
    """A run's checkpoints: ``<run>/checkpoints/step_N`` every ``every`` steps and ``<run>/final``.

    ``prepare()`` (every rank, once) removes checkpoints of another configuration, naming the
    keys that changed, and records this one's; ``latest()`` is the newest complete step
    checkpoint to resume from.
    """

    def __init__(self, run_dir: str | Path, record: dict, every: int, rank: int):
        self.directory = Path(run_dir) / "checkpoints"
        self.final_dir = Path(run_dir) / "final"
        self.record, self.every, self.rank = record, every, rank

    def prepare(self) -> None:
        if self.rank == 0:
            stamp = self.directory / "run_config.json"
            if self.directory.exists():
                changed = changed_keys(_read_record(stamp), self.record)
                if changed:
                    print(f"{self.directory} holds checkpoints of another configuration ({'; '.join(changed)}); "
                          "starting afresh", flush=True)
                    shutil.rmtree(self.directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            stamp.write_text(json.dumps(self.record, sort_keys=True, indent=1))
        if dist.is_initialized():
            dist.barrier()

    def latest(self) -> Path | None:
        return latest(self.directory)

    def due(self, step: int, total: int) -> bool:
        return step % self.every == 0 and step < total

    def save_step(self, tensors: dict[str, torch.Tensor], step: int) -> Path:
        return save(tensors, self.directory / f"step_{step}")

    def save_final(self, tensors: dict[str, torch.Tensor]) -> Path:
        return save(tensors, self.final_dir)
