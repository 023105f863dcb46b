"""The training loop's checkpoint policy: when to save, which to keep, which to resume from,
and what to move aside (never delete) when the configuration changed or a checkpoint is damaged."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
import shutil
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from .dcp import _barrier, flatten, load, optional_keys, restore, save
from .fingerprint import changed_keys
from .safety import (
    FINGERPRINT,
    HAS_CHECKSUMS,
    CheckpointError,
    DamagedCheckpointError,
    _read_json,
    check_intact,
)

log = logging.getLogger(__name__)


def step_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """The step checkpoints (folders ``step_<N>``) in ``directory``, oldest first."""
    found = []
    for p in directory.glob("step_*") if directory.is_dir() else []:
        m = _STEP.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


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
        return step_checkpoints(self.directory)

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
                log.warning(f"{self.run_dir} holds a run of {why}; moved its checkpoints and record to {dest}")
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
        self._prune(step)
        return path

    def _prune(self, step: int) -> None:
        """Keep train.keep_checkpoints step checkpoints: ``step``'s and the newest before it."""
        if self.rank == 0 and self.keep is not None:
            older = [p for s, p in self.steps() if s < step]
            for p in older[: max(0, len(older) - (self.keep - 1))]:
                shutil.rmtree(p, ignore_errors=True)

    def save_final(self) -> Path:
        return save(flatten(self.parts), self.final_dir, self._files())

    def keep_as_step(self, step: int) -> None:
        """The final checkpoint also as ``step_<step>`` (hard links where the file system has
        them, else copies), unless that step is kept already."""
        if self.rank == 0 and step not in {s for s, _ in self.steps()}:
            tmp = self.directory / f".step_{step}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                shutil.copytree(self.final_dir, tmp, copy_function=os.link)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(self.final_dir, tmp)
            tmp.rename(self.directory / f"step_{step}")
            self._prune(step)
        _barrier()

    def resume(self, last_step: int) -> Path | None:
        """Load the newest usable checkpoint into the parts; returns it (None: start afresh).
        A checkpoint whose data cannot be read or differs from its checksums (damaged bytes
        that :func:`check_intact`, which compares sizes, cannot see) is moved aside and the
        previous one loaded."""
        failed = None
        while (path := self.latest(last_step)) is not None:
            loaded = flatten(self.parts)
            try:
                load(loaded, path, optional_keys(self.parts))
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
