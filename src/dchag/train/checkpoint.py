"""Sharded, resumable checkpoints with torch.distributed.checkpoint (DCP).

A checkpoint holds only tensors: each stateful part of a training run (the model, the
optimizer, the schedule, the trainer's counters, every rank's RNG, a communication hook; see
``dchag.train.state``) gives and takes its own state as a flat dict of tensors
(``state_dict`` / ``load_state_dict``); the :class:`CheckpointManager` saves and loads the
dict of them. Loading never runs code: the
metadata file is unpickled with an allow-list of exact (module, name) pairs — DCP's own
metadata classes, torch's dtypes and sizes, and nothing else — and byte (non-tensor) entries
are refused; tensor data is read with ``weights_only=True`` by DCP. The metadata is believed
only as far as it is checked: its data files must be bare names inside the checkpoint, and
its tensors' shapes and dtypes are compared with the model's before anything is allocated.

Every file of a checkpoint has its SHA-256 in the checkpoint's ``checksums.json``, written
last at save (each rank hashes a share of the files); a load compares the files it reads
with them first (each file hashed once, by one rank), so bytes damaged in place are found
before they are loaded (:func:`verify`).

Beside the tensors a checkpoint directory holds its ``fingerprint.json`` (what the run's
result depends on, see :func:`fingerprint`) and the run's logs up to its step (``log.csv``,
``ranks.csv``): a resumed run restores its history from them. Checkpoints are written to a
temporary directory and renamed when every rank is done, so a crash mid-save never leaves one
that looks complete; and no checkpoint is ever deleted because the configuration changed:
checkpoints of another configuration are moved aside to ``<run>/superseded/``, and with them
the run's record (``final/``, logs, ``run.json``, TensorBoard) unless ``final/`` is of this one.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import logging
import os
import pickle
import re
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from ..errors import DchagError
from ..model.file import _sha256
from ..parallel import names as keys
from ..store import write_failure

log = logging.getLogger(__name__)


class CheckpointError(DchagError, ValueError):
    """A checkpoint is incomplete, unsafe, or made for another model or layout."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint's file differs from the checksum written when it was saved."""


# -- reading metadata without running code ------------------------------------------------------
_DCP = "torch.distributed.checkpoint"
_ALLOWED: set[tuple[str, str]] = {
    *(
        (f"{_DCP}.metadata", n)
        for n in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided)
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    *(("builtins", n) for n in ("set", "frozenset", "slice", "complex")),
    *(("torch", n) for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)),
}


class _MetadataUnpickler(pickle._Unpickler):  # the Python unpickler: its opcodes can be checked
    """Admits exact (module, name) pairs only: a dotted name (``os.system`` reached as an
    attribute of an allowed module, which pickle protocol 4 resolves) is no pair of the list.
    BUILD sets the state of instances only: on an allowed class or function it would set that
    object's attributes for the whole process (``PosixPath.is_file = frozenset``)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}; refusing to load it")

    def load_build(self):
        target = self.stack[-2] if len(self.stack) >= 2 else None
        if isinstance(target, type) or callable(target) or type(target).__module__ == "builtins":
            raise pickle.UnpicklingError(
                f"checkpoint metadata sets attributes of {getattr(target, '__name__', type(target).__name__)}; "
                "refusing to load it"
            )
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata is unpickled with the allow-list."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
            except Exception as err:  # a crafted file can raise anything its opcodes reach
                raise CheckpointError(
                    f"{self.path}: unreadable checkpoint metadata: {type(err).__name__}: {str(err)[:200]}"
                ) from err
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{self.path}: the checkpoint metadata is a {type(metadata).__name__}, not DCP's")
        for index, info in (getattr(metadata, "storage_data", None) or {}).items():
            rel = getattr(info, "relative_path", None)
            if not isinstance(rel, str) or rel in ("", ".", "..") or "/" in rel or "\\" in rel:
                raise CheckpointError(
                    f"{self.path}: the checkpoint metadata puts {getattr(index, 'fqn', index)} in {rel!r}; "
                    "expected the bare name of a file inside the checkpoint"
                )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _TensorsOnlyPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item, value) -> None:
        raise CheckpointError(f"checkpoint entry {read_item.dest_index.fqn} is not a tensor; refusing to unpickle it")


def read_metadata(directory: str | Path):
    directory = Path(directory)
    if not (directory / ".metadata").is_file():
        raise CheckpointError(f"{directory} is not a complete checkpoint (no .metadata)")
    return SafeReader(str(directory)).read_metadata()


def saved_shapes(directory: str | Path) -> dict[str, tuple[int, ...]]:
    return {k: shape for k, (shape, _) in saved_tensors(directory).items()}


def saved_tensors(directory: str | Path) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Each tensor entry's shape and dtype, as the metadata states them (nothing allocated)."""
    meta = read_metadata(directory)
    return {
        k: (tuple(v.size), getattr(getattr(v, "properties", None), "dtype", None))
        for k, v in meta.state_dict_metadata.items()
        if hasattr(v, "size")
    }


def check_intact(directory: str | Path) -> None:
    """Raise CheckpointError unless the metadata is readable and every data file it refers to
    is there with all its bytes (a truncated or missing shard is found before loading)."""
    directory = Path(directory)
    meta = read_metadata(directory)
    needed: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        rel = str(getattr(info, "relative_path", ""))
        needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(needed.items()):
        path = directory / rel
        if not path.is_file():
            raise CheckpointError(f"{directory}: data file {rel} is missing")
        if path.stat().st_size < size:
            raise CheckpointError(f"{directory}: data file {rel} is truncated ({path.stat().st_size} of {size} bytes)")


# -- checksums ------------------------------------------------------------------------------------
CHECKSUMS = "checksums.json"  # {"sha256": {file: [size, hex digest]}} of every other file
# The fingerprint of a checkpoint saved with CHECKSUMS says so: a fingerprinted checkpoint that
# lacks them lost them (an older dchag's never had them). Not a setting: the record compared
# with a checkpoint's (changed_keys) never holds it.
HAS_CHECKSUMS = "checkpoint.checksums"


def _digests(directory: Path, names: list[str]) -> dict[str, list]:
    """[size, SHA-256] of each of ``names`` (None: unreadable), each file hashed by one rank;
    every rank gets them all."""
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    mine = {}
    for name in sorted(names)[rank::world]:
        try:
            mine[name] = [(directory / name).stat().st_size, _sha256(directory / name)]
        except OSError:
            mine[name] = None
    if world > 1:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        mine = {k: v for part in gathered for k, v in part.items()}
    return mine


def _write_checksums(directory: Path, sums: dict[str, list]) -> None:
    """``sums`` (and those of the files rank 0 added since) as the checkpoint's CHECKSUMS,
    written atomically."""
    added = [p.name for p in directory.iterdir() if p.is_file() and p.name not in sums and p.name != CHECKSUMS]
    sums = {**sums, **{n: [(directory / n).stat().st_size, _sha256(directory / n)] for n in added}}
    unreadable = sorted(n for n, v in sums.items() if v is None)
    if unreadable:
        raise OSError(f"cannot read back {', '.join(unreadable)}")
    tmp = directory / f".{CHECKSUMS}.tmp"
    tmp.write_text(json.dumps({"sha256": dict(sorted(sums.items()))}, indent=1))
    os.replace(tmp, directory / CHECKSUMS)


def _read_checksums(directory: Path) -> dict[str, tuple[int, str]] | None:
    path = directory / CHECKSUMS
    if not path.exists():
        return None
    out = _read_json(path)
    sums = out.get("sha256") if out is not None else None
    if not isinstance(sums, dict) or not all(
        isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str) for v in sums.values()
    ):
        raise DamagedCheckpointError(f"{path} is not a readable list of checksums")
    return {k: (v[0], v[1]) for k, v in sums.items()}


def verify(directory: str | Path, keys_read: set[str] | None = None) -> None:
    """Raise DamagedCheckpointError unless the files a load reads (the metadata and the data
    files holding ``keys_read``; None: every file) are those written at save: the sizes, then
    the SHA-256 in CHECKSUMS, each file hashed once, by one of the ranks (every rank calls
    it and gets the same answer). A checkpoint of an older dchag (no CHECKSUMS) is checked
    for sizes only (:func:`check_intact`)."""
    directory = Path(directory)
    listed = _read_checksums(directory)
    if listed is None and (_read_json(directory / FINGERPRINT) or {}).get(HAS_CHECKSUMS):
        raise DamagedCheckpointError(f"{directory}: its {CHECKSUMS} is missing (its {FINGERPRINT} says it was written)")
    if listed is None:
        log.info(f"{directory} has no {CHECKSUMS} (written by an older dchag): its bytes cannot be verified")
        return

    def compare(names: list[str]) -> None:
        for name in names:
            if name not in listed:
                raise DamagedCheckpointError(f"{directory}: {name} is not among the files of its {CHECKSUMS}")
            path = directory / name
            size = path.stat().st_size if path.is_file() else None
            if size != listed[name][0]:
                raise DamagedCheckpointError(
                    f"{directory}: {name} is {'missing' if size is None else f'{size} bytes'}, "
                    f"{listed[name][0]} when it was saved"
                )
        sums = _digests(directory, names)
        bad = sorted(n for n in names if sums[n] is None or sums[n][1] != listed[n][1])
        if bad:
            raise DamagedCheckpointError(
                f"{directory}: {', '.join(bad)} differ{'s' if len(bad) == 1 else ''} from the SHA-256 "
                "written when it was saved (damaged in place)"
            )

    compare([".metadata"])
    meta = read_metadata(directory)
    files = {str(i.relative_path) for i in (meta.storage_data or {}).values()}
    if keys_read is None:
        compare(sorted((set(listed) | files) - {".metadata"}))
    else:
        compare(sorted({str(i.relative_path) for k, i in meta.storage_data.items() if k.fqn in keys_read}))


def flatten(parts: dict[str, object]) -> dict[str, torch.Tensor]:
    """``{part: Stateful}`` -> one flat dict of tensors ``part.key``."""
    return {f"{name}.{k}": v for name, part in parts.items() for k, v in part.state_dict().items()}


def restore(parts: dict[str, object], loaded: dict[str, torch.Tensor]) -> None:
    for name, part in parts.items():
        prefix = f"{name}."
        part.load_state_dict({k.removeprefix(prefix): v for k, v in loaded.items() if k.startswith(prefix)})


# -- saving and loading ----------------------------------------------------------------------------
def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save(tensors: dict[str, torch.Tensor], directory: str | Path, files: dict[str, Path | str] | None = None) -> Path:
    """``tensors`` as a DCP checkpoint at ``directory``, with ``files`` (name -> a source path,
    or text) beside them, made visible only once every rank has written."""
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    if _rank0():
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    try:
        dcp.save(tensors, checkpoint_id=str(tmp))
    except (Exception, CheckpointException) as err:  # DCP gathers every rank's failure into one (a BaseException)
        failures = [f[0] if isinstance(f, tuple) else f for f in (getattr(err, "failures", {}) or {}).values()]
        # torch's writer reports a full disk as a RuntimeError: the cause is found on the disk
        cause = next(filter(None, (write_failure(e, tmp) for e in (err, *failures))), None)
        if cause is None:
            raise
        if _rank0():
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint {directory}: {cause} (disk full or read-only?)") from err
    _barrier()
    sums = _digests(tmp, [p.name for p in tmp.iterdir() if p.is_file()])
    if _rank0():
        try:
            for name, content in (files or {}).items():
                if isinstance(content, Path):
                    if content.exists():
                        shutil.copyfile(content, tmp / name)
                else:
                    (tmp / name).write_text(content)
            _write_checksums(tmp, sums)
            shutil.rmtree(directory, ignore_errors=True)
            tmp.rename(directory)
        except OSError as err:
            cause = write_failure(err, tmp) or err.strerror or str(err)
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"cannot write checkpoint {directory}: {cause}") from err
    _barrier()
    return directory


def check_compatible(tensors: dict[str, torch.Tensor], directory: str | Path) -> None:
    """Raise CheckpointError listing keys missing from the checkpoint, unexpected in it, or of
    another shape or dtype, before anything is loaded."""
    saved = saved_tensors(directory)
    wanted = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items() if not k.startswith("rng.")}
    everyone = set(wanted)  # D-CHAG ranks hold different keys: "unexpected" is against all of them
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sorted(wanted))
        everyone = set().union(*gathered)
    missing = sorted(set(wanted) - set(saved))
    unexpected = sorted(k for k in set(saved) - everyone if not k.startswith("rng."))
    shapes = sorted(k for k in set(wanted) & set(saved) if wanted[k] != saved[k])
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(
                "missing from the checkpoint: " + ", ".join(missing[:12]) + (" …" if len(missing) > 12 else "")
            )
        if unexpected:
            parts.append("not in this model: " + ", ".join(unexpected[:12]) + (" …" if len(unexpected) > 12 else ""))
        if shapes:
            parts.append("other shape or dtype: " + ", ".join(_difference(k, saved[k], wanted[k]) for k in shapes[:12]))
        raise CheckpointError(f"checkpoint {directory} was made for another model or layout; " + "; ".join(parts))


def _difference(key: str, saved: tuple, wanted: tuple) -> str:
    """'key <saved> vs <wanted>': the shapes, or where they agree the dtypes."""
    if saved[0] != wanted[0]:
        return f"{key} {saved[0]} vs {wanted[0]}"
    return f"{key} {str(saved[1]).removeprefix('torch.')} vs {str(wanted[1]).removeprefix('torch.')}"


def load(tensors: dict[str, torch.Tensor], directory: str | Path) -> None:
    """Load ``directory`` in place into ``tensors`` (every rank): its files compared with their
    checksums, its metadata with the tensors, then the data."""
    verify(directory)
    check_compatible(tensors, directory)
    dcp.load(tensors, storage_reader=SafeReader(str(directory)), planner=_TensorsOnlyPlanner())


def load_weights(model: nn.Module, directory: str | Path) -> None:
    """Load a training checkpoint's model weights into a one-device model (no process group).

    Tensor-parallel and FSDP parameters are read whole; D-CHAG's per-rank tokenizer blocks
    are put back side by side (:func:`dchag.parallel.names.consolidation`), which gives the
    one-device hierarchical model that D-CHAG parallelizes (groups = TP size) its exact weights.
    """
    directory = Path(directory)
    entries = {k.removeprefix("model."): v for k, v in saved_tensors(directory).items() if k.startswith("model.")}
    saved = {k: shape for k, (shape, _) in entries.items()}
    plan, problems = keys.consolidation(saved, model)
    params = {keys.canonical(n): p for n, p in model.named_parameters()}
    for name, ks in plan.items():  # the metadata against the model, before anything is allocated
        p = params[name]
        whole = (sum(saved[k][0] for k in ks), *saved[ks[0]][1:]) if all(saved[k] for k in ks) else saved[ks[0]]
        if tuple(whole) != tuple(p.shape) or any(saved[k][1:] != saved[ks[0]][1:] for k in ks):
            problems.append(f"{name} has shape {tuple(whole)} in the checkpoint, {tuple(p.shape)} in the model")
        elif any(entries[k][1] not in (None, p.dtype) for k in ks):
            problems.append(f"{name} is {entries[ks[0]][1]} in the checkpoint, {p.dtype} in the model")
    if problems:
        raise CheckpointError(f"checkpoint {directory} does not fit this model: " + "; ".join(problems[:8]))
    verify(directory, {f"model.{k}" for ks in plan.values() for k in ks})
    wanted = {f"model.{k}": torch.empty(saved[k], dtype=params[name].dtype) for name, ks in plan.items() for k in ks}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(wanted, storage_reader=SafeReader(str(directory)), planner=_TensorsOnlyPlanner(), no_dist=True)
    values = keys.assemble(plan, {k.removeprefix("model."): v for k, v in wanted.items()})
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = values[keys.canonical(name)]
            if tuple(value.shape) != tuple(p.shape):
                raise CheckpointError(
                    f"checkpoint {directory}: {name} has shape {tuple(value.shape)}, the model {tuple(p.shape)}"
                )
            p.copy_(value)


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
    "train.max_restarts",
    "train.gpus_per_node",
    "train.runtime",
    "train.mem_mb",
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
    from ..config import schema_default

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


def _read_json(path: Path) -> dict | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


# -- the training loop's checkpoint policy -----------------------------------------------------------
FINGERPRINT = "fingerprint.json"

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


LEGACY_STAMP = "run_config.json"  # checkpoints/run_config.json of dchag before per-checkpoint fingerprints
_STEP = re.compile(r"step_(\d+)")
# A run's record beside its checkpoints: moved aside with them when the configuration changes.
RUN_RECORD = ("final", "log.csv", "ranks.csv", "log.csv.partial", "ranks.csv.partial", "run.json", "tensorboard")


class CheckpointManager:
    """A run's checkpoints: ``<run>/checkpoints/step_N`` every ``every`` steps (the newest
    ``keep`` of them kept; None: all) and ``<run>/final``.

    :meth:`prepare` (every rank, once, under the run lock) removes the temporaries of dead
    writers and moves aside (never deletes) checkpoints of another configuration, naming the
    keys that changed, and damaged ones, naming what is wrong; :meth:`resume` loads the newest
    checkpoint at or before the run's last step into the run's parts.
    """

    def __init__(
        self,
        run_dir: str | Path,
        record: dict,
        every: int,
        keep: int | None,
        rank: int,
        parts: dict[str, object],
        history: dict[str, Path] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.directory = self.run_dir / "checkpoints"
        self.final_dir = self.run_dir / "final"
        self.record, self.every, self.keep, self.rank = record, every, keep, rank
        self.parts = parts
        self.history = history or {}

    # -- bookkeeping (rank 0) --------------------------------------------------------------------
    def steps(self) -> list[tuple[int, Path]]:
        found = []
        for p in self.directory.glob("step_*") if self.directory.is_dir() else []:
            m = _STEP.fullmatch(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def _stamp(self, path: Path) -> dict | None:
        """The checkpoint's fingerprint (an older dchag's: the run's stamp); raises
        CheckpointError if its fingerprint file is damaged."""
        if (path / FINGERPRINT).exists():
            stamp = _read_json(path / FINGERPRINT)
            if stamp is None:
                raise CheckpointError(f"{path / FINGERPRINT} is not readable JSON")
            return stamp
        return _read_json(self.directory / LEGACY_STAMP)

    def _move_aside(self, paths: list[Path], why: str) -> Path:
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        dest = self.run_dir / "superseded" / stamp
        n = 1
        while dest.exists():
            n += 1
            dest = self.run_dir / "superseded" / f"{stamp}-{n}"
        dest.mkdir(parents=True)
        for p in paths:
            p.rename(dest / p.name)
        (dest / "why.txt").write_text(why + "\n")
        return dest

    def _final_changes(self) -> list[str] | None:
        """What differs between final/'s configuration and this run's (None: no final/)."""
        if not self.final_dir.is_dir():
            return None
        try:
            stamp = self._stamp(self.final_dir)
        except CheckpointError as err:
            return [str(err)]
        return changed_keys(stamp, self.record) if stamp is not None else ["no record of it"]

    def prepare(self) -> None:
        if self.rank == 0:
            for tmp in [*self.directory.glob(".step_*.tmp"), self.run_dir / ".final.tmp"]:
                shutil.rmtree(tmp, ignore_errors=True)  # a dead writer's (the run lock is ours)
            damaged, other = [], {}
            for _, path in self.steps():
                try:
                    check_intact(path)
                    stamp = self._stamp(path)
                except CheckpointError as err:
                    damaged.append((path, str(err)))
                    continue
                changed = changed_keys(stamp, self.record) if stamp is not None else ["no record of it"]
                if changed:
                    other[path] = changed
            final_changed = self._final_changes()
            for path, why in damaged:
                dest = self._move_aside([path], f"damaged: {why}")
                log.warning(
                    f"checkpoint {path} is damaged ({why}); moved it to {dest} and resume from the previous "
                    "complete one"
                )
            if other or final_changed:
                changes = final_changed or next(iter(other.values()))
                why = f"another configuration ({'; '.join(changes)})"
                # the run's record (final/, its logs, run.json) goes with them, unless final/ is of this one
                record = [p for p in map(self.run_dir.joinpath, RUN_RECORD) if p.exists() and final_changed != []]
                dest = self._move_aside([*other, *record], why)
                log.info(f"{self.run_dir} holds a run of {why}; moved its checkpoints and record to {dest}")
            if self.directory.is_dir() and not self.steps():
                (self.directory / LEGACY_STAMP).unlink(missing_ok=True)
            self.directory.mkdir(parents=True, exist_ok=True)
        _barrier()

    def latest(self, last_step: int) -> Path | None:
        """The newest checkpoint at or before ``last_step`` (later ones, from a longer run, are
        kept but not used)."""
        usable = [(s, p) for s, p in self.steps() if s <= last_step]
        later = [p.name for s, p in self.steps() if s > last_step]
        if later and self.rank == 0:
            log.warning(f"train.steps is {last_step}: checkpoint(s) {', '.join(later)} lie beyond it and are not used")
        return usable[-1][1] if usable else None

    # -- saving and loading ------------------------------------------------------------------------
    def _files(self) -> dict[str, Path | str]:
        return {FINGERPRINT: json.dumps({**self.record, HAS_CHECKSUMS: True}, sort_keys=True, indent=1), **self.history}

    def due(self, step: int, total: int) -> bool:
        return step % self.every == 0 and step < total

    def save_step(self, step: int) -> Path:
        path = save(flatten(self.parts), self.directory / f"step_{step}", self._files())
        if self.rank == 0 and self.keep is not None:
            older = [p for s, p in self.steps() if s < step]
            for p in older[: max(0, len(older) - (self.keep - 1))]:
                shutil.rmtree(p, ignore_errors=True)
        return path

    def save_final(self) -> Path:
        return save(flatten(self.parts), self.final_dir, self._files())

    def resume(self, last_step: int) -> Path | None:
        """Load the newest usable checkpoint into the parts; returns it (None: start afresh).
        A checkpoint whose data cannot be read or differs from its checksums (damaged bytes
        that :func:`check_intact`, which compares sizes, cannot see) is moved aside and the
        previous one loaded."""
        failed = None
        while (path := self.latest(last_step)) is not None:
            loaded = flatten(self.parts)
            try:
                load(loaded, path)
            except (CheckpointException, DamagedCheckpointError) as err:  # raised on every rank
                failed = path
                why = f"damaged: its data cannot be read ({str(err).splitlines()[0][:200]})"
                if self.rank == 0:
                    dest = self._move_aside([path], why)
                    log.warning(f"checkpoint {path} is {why}; moved it to {dest}; trying the previous one")
                _barrier()
                continue
            restore(self.parts, loaded)
            return path
        if failed is not None:  # the parts may hold some of its values: no fresh start from them
            raise CheckpointError(
                f"checkpoint {failed} was damaged and no earlier complete checkpoint is left; "
                "run again to start afresh (the damaged one is under superseded/)"
            )
        return None
