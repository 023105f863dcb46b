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

from .dcp import check_compatible, flatten, load, load_weights, restore, save
from .fingerprint import MODEL_DATA, RESUMABLE, changed_keys, check_data, fingerprint
from .manager import RUN_RECORD, CheckpointManager
from .safety import (
    CHECKSUMS,
    FINGERPRINT,
    HAS_CHECKSUMS,
    CheckpointError,
    DamagedCheckpointError,
    SafeReader,
    check_intact,
    read_metadata,
    saved_shapes,
    saved_tensors,
    verify,
)

__all__ = [
    "CHECKSUMS",
    "FINGERPRINT",
    "HAS_CHECKSUMS",
    "MODEL_DATA",
    "RESUMABLE",
    "RUN_RECORD",
    "CheckpointError",
    "CheckpointManager",
    "DamagedCheckpointError",
    "SafeReader",
    "changed_keys",
    "check_compatible",
    "check_data",
    "check_intact",
    "fingerprint",
    "flatten",
    "load",
    "load_weights",
    "read_metadata",
    "restore",
    "save",
    "saved_shapes",
    "saved_tensors",
    "verify",
]
