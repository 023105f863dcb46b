"""Saving and loading a dict of tensors as a DCP checkpoint: written to a temporary directory
and renamed once every rank is done, with its checksums; loaded only after its files and its
metadata are checked against the tensors it fills."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from ...parallel import names as keys
from ...store import write_failure
from .safety import (
    CheckpointError,
    SafeReader,
    _digests,
    _TensorsOnlyPlanner,
    _write_checksums,
    saved_tensors,
    verify,
)


def flatten(parts: dict[str, object]) -> dict[str, torch.Tensor]:
    """``{part: Stateful}`` -> one flat dict of tensors ``part.key``."""
    return {f"{name}.{k}": v for name, part in parts.items() for k, v in part.state_dict().items()}


def optional_keys(parts: dict[str, object]):
    """Which keys of :func:`flatten`'s dict a checkpoint may lack (and hold more of): every key
    of a part kept per rank (``per_rank``: a checkpoint of another number of ranks has other
    ranks' keys) and the keys a part names ``optional`` (counters an older dchag did not keep)."""
    per_rank = {name for name, part in parts.items() if getattr(part, "per_rank", False)}
    named = {f"{name}.{k}" for name, part in parts.items() for k in getattr(part, "optional", ())}
    return lambda key: key.split(".", 1)[0] in per_rank or key in named


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


def check_compatible(tensors: dict[str, torch.Tensor], directory: str | Path, optional=lambda key: False) -> dict:
    """Raise CheckpointError listing keys missing from the checkpoint, unexpected in it, or of
    another shape or dtype, before anything is loaded; ``optional`` keys may be missing or
    unexpected. Returns the checkpoint's tensors' metadata (:func:`saved_tensors`)."""
    saved = saved_tensors(directory)
    wanted = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items() if not (optional(k) and k not in saved)}
    everyone = set(wanted)  # D-CHAG ranks hold different keys: "unexpected" is against all of them
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sorted(wanted))
        everyone = set().union(*gathered)
    missing = sorted(set(wanted) - set(saved))
    unexpected = sorted(k for k in set(saved) - everyone if not optional(k))
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
    return saved


def _difference(key: str, saved: tuple, wanted: tuple) -> str:
    """'key <saved> vs <wanted>': the shapes, or where they agree the dtypes."""
    if saved[0] != wanted[0]:
        return f"{key} {saved[0]} vs {wanted[0]}"
    return f"{key} {str(saved[1]).removeprefix('torch.')} vs {str(wanted[1]).removeprefix('torch.')}"


def load(tensors: dict[str, torch.Tensor], directory: str | Path, optional=lambda key: False) -> list[str]:
    """Load ``directory`` in place into ``tensors`` (every rank): its files compared with their
    checksums, its metadata with the tensors, then the data. The ``optional`` keys the
    checkpoint lacks are left out of ``tensors`` and returned."""
    verify(directory)
    saved = check_compatible(tensors, directory, optional)
    absent = sorted(k for k in tensors if optional(k) and k not in saved)
    for k in absent:
        del tensors[k]
    dcp.load(tensors, storage_reader=SafeReader(str(directory)), planner=_TensorsOnlyPlanner())
    return absent


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
