"""Writing results atomically, and only over what dchag wrote.

Results are built under a temporary name beside the target and renamed on success, so a
crash or interrupt never leaves a store, file or directory at the target path that looks
complete; the temporary is removed on failure. A directory written is marked with the kind
of output it is, and a path holding anything else (an input, a run, a link, another kind of
output) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from ..errors import DchagError


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class OutputError(DchagError, OSError):
    """A result cannot be written (a full disk, a read-only or forbidden place), or its path
    holds something dchag did not write there."""


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def write_error(err: BaseException) -> OSError | None:
    """The OSError of a full or read-only disk behind ``err`` (libraries wrap it), if any."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


LOW_SPACE = 64 * 2**20  # a write that failed with less than this free on its disk failed for the space


def write_failure(err: BaseException, written: Path) -> str | None:
    """Why a write into ``written`` (a temporary file or directory, not yet removed) failed,
    when the cause is the machine's state whatever the library raised: the OSError of a full,
    read-only or forbidden place behind ``err``, or its description in the message of a
    library's own exception; else a disk left with almost no free space, or a file that reached
    the file size limit (``ulimit -f``), which torch's writer reports as a bare RuntimeError."""
    import resource

    cause = write_error(err)
    if cause is not None:
        return cause.strerror or str(cause)
    chain = []
    while err is not None and len(chain) < 16:
        chain.append(str(err))
        err = err.__cause__ or err.__context__
    for code in sorted(_WRITE_ERRNOS):  # in the message of a library's own type (safetensors: "os error 27")
        if any(os.strerror(code) in text for text in chain):
            return os.strerror(code)
    with contextlib.suppress(OSError):
        disk = os.statvfs(written if written.exists() else written.parent)
        if disk.f_bavail * disk.f_frsize < LOW_SPACE:
            return os.strerror(errno.ENOSPC)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        files = written.rglob("*") if written.is_dir() else [written]
        with contextlib.suppress(OSError):
            if any(f.is_file() and f.stat().st_size >= limit for f in files):
                return f"{os.strerror(errno.EFBIG)} (the file size limit is {limit} bytes)"
    return None


def _remove_settled(path: Path, wait_s: float = 3.0) -> None:
    """Remove a failed write's temporary, again while the writer's threads that were still in
    flight when the first one failed (Zarr and dask write chunks concurrently) create files in
    it, until it stays gone for a moment."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError):
            _remove(path)
        time.sleep(0.1)
        if not (path.exists() or path.is_symlink()) or time.monotonic() > deadline:
            return


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def _remove_dead_temporaries(target: Path) -> None:
    """The temporaries of ``target`` that writers on this host left when they were killed."""
    host = socket.gethostname()
    for tmp in target.parent.glob(f".{glob.escape(target.name)}.tmp-{glob.escape(host)}-*"):
        pid = tmp.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove(tmp)


# -- outputs are owned --------------------------------------------------------------------------------
OWNER = ".dchag-output"  # in every directory dchag writes: the kind of output it is
RUN_MARKS = (".lock", "checkpoints", "run.json")  # what a training run's directory holds


OWNER_ATTRIBUTE = "dchag_output"  # the same, as an attribute of a Zarr store's root group


def output_kind(path: Path) -> str | None:
    """The kind of output dchag wrote at ``path`` (a directory), if it wrote it."""
    import json

    with contextlib.suppress(OSError, ValueError, AttributeError):
        if (path / "zarr.json").is_file():
            return json.loads((path / "zarr.json").read_text()).get("attributes", {}).get(OWNER_ATTRIBUTE)
        return (path / OWNER).read_text().strip() or None
    return None


def _mark(path: Path, kind: str) -> None:
    """Mark a directory output with its kind: a Zarr store in its root attributes (a file
    beside its nodes would be an unknown object to Zarr), any other directory with a file."""
    if (path / "zarr.json").is_file():
        import zarr

        zarr.open_group(store=str(path), mode="r+", zarr_format=3).attrs[OWNER_ATTRIBUTE] = kind
    else:
        (path / OWNER).write_text(f"{kind}\n")


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in RUN_MARKS)


def check_inputs(target: str | os.PathLike, inputs) -> None:
    """Refuse an output path that is, or contains, one of a command's ``inputs`` (writing it
    would replace them)."""
    where = Path(target).resolve()
    for name in inputs:
        try:  # a value that names no file (an inline JSON config) is not an input path
            source = Path(name).resolve()
            if not source.exists():
                continue
        except (OSError, ValueError):
            continue
        if source.is_relative_to(where):
            relation = "is" if where == source else "contains"
            raise OutputError(f"output {target} {relation} the input {name}: choose another output path")


def check_output(target: str | os.PathLike, kind: str | None = None, inputs=()) -> None:
    """Refuse an output path that would destroy what this writer did not make: one of
    ``inputs`` or a folder holding one, a run directory, a symbolic link, or a directory that
    is not an earlier output of the same ``kind``. A file may replace a regular file (a file
    holds no mark of who wrote it), except one inside a run directory or a directory output
    (a checkpoint's metadata, a run's log, a model's description); :func:`atomic_path` refuses
    a directory in place of a file."""
    target = Path(target)
    check_inputs(target, inputs)
    if not (target.exists() or target.is_symlink()):
        return
    if target.is_symlink():
        raise OutputError(f"refusing to replace {target}: a symbolic link; remove it or choose another output path")
    if target.is_dir():
        if not any(target.iterdir()):
            return  # nothing to lose: an empty folder (Snakemake makes an output's folder before the job)
        if is_run_dir(target):
            raise OutputError(f"refusing to replace {target}: it is a training run's directory")
        found = output_kind(target)
        if found != (kind or "output"):
            what = f"a dchag {found} output" if found else "a directory dchag did not write"
            raise OutputError(
                f"refusing to replace {target}: {what}, not an earlier {kind or 'output'}; "
                "remove it or choose another output path"
            )
    elif not target.is_file():
        raise OutputError(f"refusing to replace {target}: not a regular file")
    else:
        holder = _holder(target)
        if holder:
            raise OutputError(f"refusing to replace {target}: a file of {holder}; choose another output path")


def _holder(path: Path) -> str | None:
    """What holds the file ``path`` that no other writer may replace: a training run's
    directory, a checkpoint or a directory output of dchag (a model folder, a store), at any
    depth; else a Zarr store or group."""
    folder = path.parent.resolve()
    parents = (folder, *folder.parents)
    for parent in parents:
        # two of a run's marks (one alone, such as a `.lock`, is common in any folder)
        if sum((parent / m).exists() for m in (*RUN_MARKS, "log.csv", "final")) >= 2:
            return f"the training run {parent}"
        if (parent / ".metadata").is_file():
            return f"the checkpoint {parent}"
        kind = output_kind(parent)
        if kind:
            return f"the dchag {kind} output {parent}"
    zarr_node = next((p for p in parents if (p / "zarr.json").is_file()), None)
    return f"the Zarr store {zarr_node}" if zarr_node else None


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, kind: str | None = None, inputs=()) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it to ``target`` if the block succeeds.
    Only an earlier output of the same ``kind`` is replaced (:func:`check_output`); a directory
    written is marked with its kind. A full or read-only disk, or a file at the size limit, is
    an OutputError naming the target whatever the library raised (and nothing is left)."""
    target = Path(target)
    check_output(target, kind, inputs)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot write {target}: {err.strerror} ({target.parent})") from err
    tmp = _temporary(target)
    _remove(tmp)
    _remove_dead_temporaries(target)
    try:
        yield tmp
        if tmp.is_dir():
            _mark(tmp, kind or "output")
        if (tmp / "zarr.json").exists():
            consolidate(tmp)
        if tmp.is_dir():
            if target.is_file():
                raise OutputError(f"refusing to replace the file {target} with a directory: choose another output path")
        if target.exists():
            _remove(target)
        os.replace(tmp, target)
    except BaseException as err:
        failed = isinstance(err, Exception) and not isinstance(err, DchagError)  # not an interrupt
        cause = write_failure(err, tmp) if failed else None
        _remove_settled(tmp)
        if cause is not None:
            raise OutputError(f"cannot write {target}: {cause} (a full disk, or a read-only place?)") from err
        raise


def consolidate(path: Path) -> None:
    """Consolidated metadata in the store and in each of its groups, so that ``xr.open_zarr``
    opens it (or ``group=...``) the default way without a warning."""
    import warnings

    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: consolidated metadata is not yet in the v3 spec
        root = zarr.open_group(store=str(path), mode="r")
        groups = [name for name, _ in root.groups()]
        for name in groups:
            zarr.consolidate_metadata(str(path), path=name, zarr_format=3)
        zarr.consolidate_metadata(str(path), zarr_format=3)
