"""Reading a checkpoint's files without believing them: DCP metadata unpickled with an
allow-list of exact (module, name) pairs, data files named only inside the checkpoint, sizes
checked (:func:`check_intact`) and every file's SHA-256 compared with the ``checksums.json``
written at save (:func:`verify`)."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from ...errors import DchagError
from ...model.folder import _sha256

log = logging.getLogger(__name__)

# A checkpoint's record of what it depends on (dchag.train.checkpoint.fingerprint writes it).
FINGERPRINT = "fingerprint.json"


class CheckpointError(DchagError, ValueError):
    """A checkpoint is incomplete, unsafe, or made for another model or layout."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint's file differs from the checksum written when it was saved."""


def _read_json(path: Path) -> dict | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


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
