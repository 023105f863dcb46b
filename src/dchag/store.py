"""Opening inputs, and writing results atomically.

Results are built under a temporary name beside the target and renamed on success, so a
crash or interrupt never leaves a store, file or directory at the target path that looks
complete; the temporary is removed on failure.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from .errors import DchagError, MissingFileError


class InputError(DchagError, ValueError):
    """An input file is missing or unreadable; the message names it."""


def select_channels(available: list[str], wanted: list[str], store: str | Path) -> list[int]:
    """Indices of the ``wanted`` channel names in a store's ``available`` ones."""
    missing = [c for c in wanted if c not in available]
    if missing:
        raise InputError(
            f"store {store} lacks channel(s) the model expects: {', '.join(missing)} (it has {', '.join(available)})"
        )
    return [available.index(c) for c in wanted]


@contextlib.contextmanager
def _quiet_snakemake_timestamp():
    """Silence zarr's warning about the ``.snakemake_timestamp`` file Snakemake leaves in
    directory outputs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        yield


GRIB_SUFFIXES = (".grib", ".grb", ".grib1", ".grib2", ".grb1", ".grb2")
# The level dimension's names: ERA5 on the CDS since 2024, cfgrib's (GRIB typeOfLevel).
LEVEL_NAMES = ("pressure_level", "isobaricInhPa")
_GRIB_INDEX_DIR: str | None = None


def is_grib(path: str) -> bool:
    """By name, or by the 'GRIB' that starts every GRIB message (CDS downloads may be called .data)."""
    if path.lower().endswith(GRIB_SUFFIXES):
        return True
    if "://" in path or not Path(path).is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GRIB"


def _grib_index_dir() -> str:
    """One temporary folder per process for cfgrib's index files: each file is scanned once per
    job, and nothing is written beside the user's files (which may be read-only)."""
    global _GRIB_INDEX_DIR
    if _GRIB_INDEX_DIR is None:
        import atexit
        import tempfile

        _GRIB_INDEX_DIR = tempfile.mkdtemp(prefix="dchag-grib-index-")
        atexit.register(shutil.rmtree, _GRIB_INDEX_DIR, True)
    return _GRIB_INDEX_DIR


def open_grib(path: str, what: str = "input") -> list[xr.Dataset]:
    """A GRIB file (edition 1 or 2) as cfgrib's hypercubes, lazily: one dataset per kind of
    level (pressure levels, surface, 2 m, ...), each with ``valid_time`` as its time dimension
    (so accumulated fields, stored as reference time + step, come out by the time they are valid)."""
    try:
        import cfgrib
    except ImportError as err:  # cfgrib brings ecCodes' Python interface; the library is the eccodes wheel
        raise InputError(
            f"{what} {path} is GRIB: reading it needs cfgrib and ecCodes: pip install 'dchag[grib]'"
        ) from err
    import hashlib

    _check_grib_end(path, what)

    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    kwargs = {
        "indexpath": str(Path(_grib_index_dir()) / f"{key}.{{short_hash}}.idx"),
        "time_dims": ("valid_time",),
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            datasets = cfgrib.open_datasets(path, backend_kwargs=kwargs, cache=False)
    except Exception as err:  # ecCodes and cfgrib raise many types for damaged files
        raise InputError(
            f"cannot read {what} {path}: {type(err).__name__}: {err} (is it a complete GRIB file?)"
        ) from err
    if not datasets or not any(ds.data_vars for ds in datasets):
        raise InputError(f"{what} {path} holds no GRIB field cfgrib can read (an empty or truncated file?)")
    return [_exact_longitudes(normalise_layout(ds, path)) for ds in datasets]


def _check_grib_end(path: str, what: str) -> None:
    """Every GRIB message ends with '7777' (some writers pad with zeros after it): a file that
    does not was cut short, and cfgrib would silently drop its last message."""
    if "://" in path or not Path(path).is_file():
        return
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            raise InputError(f"{what} {path} is empty")
        f.seek(max(0, size - 4096))
        tail = f.read().rstrip(b"\0")
    if not tail.endswith(b"7777"):
        raise InputError(
            f"{what} {path} is truncated: its last GRIB message does not end with '7777' (an interrupted download?)"
        )


def _exact_longitudes(ds: xr.Dataset) -> xr.Dataset:
    """GRIB edition 1 stores grid corners in millidegrees (a global N32 Gaussian grid ends at
    357.188, not 357.1875): a longitude axis that is global to that precision gets its exact
    values, 360/n apart, so that it is recognised as periodic."""
    if "longitude" not in ds.dims or ds["longitude"].ndim != 1 or ds.sizes["longitude"] < 2:
        return ds
    lon = np.asarray(ds["longitude"].values, dtype=np.float64)
    n = lon.size
    exact = lon[0] + np.arange(n) * 360.0 / n
    if np.max(np.abs(lon - exact)) <= 1e-3 and not np.array_equal(lon, exact):
        ds = ds.assign_coords(longitude=("longitude", exact, ds["longitude"].attrs))
    return ds


def open_any(path: str, what: str = "input", normalise_names: bool = True) -> xr.Dataset:
    """Open a netCDF file, Zarr store or GRIB file (one hypercube) lazily; with
    ``normalise_names`` the layout is made the one dchag reads (:func:`normalise_layout`)."""
    if is_grib(path):
        datasets = open_grib(path, what)
        if len(datasets) > 1:
            kinds = ", ".join(
                sorted({str(v.attrs.get("GRIB_typeOfLevel", "?")) for d in datasets for v in d.data_vars.values()})
            )
            raise InputError(
                f"{what} {path} holds GRIB fields on several kinds of level ({kinds}); split it "
                "(grib_copy file 'out_[typeOfLevel].grib') or read it as ERA5 input (era5.inputs), which takes them all"
            )
        return datasets[0]
    is_zarr = path.rstrip("/").endswith(".zarr") or "://" in path or (Path(path) / "zarr.json").exists()
    if "://" not in path and not Path(path).exists():
        raise InputError(f"{what} not found: {path}")
    try:
        if is_zarr:
            with _quiet_snakemake_timestamp():
                ds = xr.open_zarr(
                    path, consolidated=None if "://" in path else _has_consolidated(Path(path)), chunks=None
                )
        else:
            ds = xr.open_dataset(path, chunks=None, cache=False)
    except Exception as err:  # netCDF4/h5py/zarr raise many types for damaged files
        raise InputError(
            f"cannot read {what} {path}: {type(err).__name__}: {err} (is it a complete netCDF file or Zarr store?)"
        ) from err
    if not normalise_names:
        return ds
    return normalise_layout(ds, path)


def normalise_layout(ds: xr.Dataset, path: str = "") -> xr.Dataset:
    """One layout for ERA5-like inputs, whoever wrote them: ``time`` the valid time (a
    dimension, or a scalar coordinate for a file of one step), ``level`` the pressure level in hPa.

    * CDS since 2024: ``valid_time``, ``pressure_level``; old CDS and ARCO-ERA5 / WeatherBench 2:
      ``time``, ``level``;
    * cfgrib (GRIB, or the netCDF it writes): ``time`` is the reference time beside ``step``
      and ``valid_time``, the level ``isobaricInhPa``; with ``time_dims=valid_time`` or a
      single step, ``valid_time`` is the time.

    Raises InputError naming ``path`` for forecast-style files whose times are reference
    time x step (a 2-D ``valid_time``).
    """
    where = f" {path}" if path else ""
    rename = {}
    for name in LEVEL_NAMES:  # a dimension, or a scalar coordinate where a file holds one level
        if name in ds.variables and "level" not in ds.variables:
            rename[name] = "level"
            break
    ds = ds.rename(rename)
    if "level" in ds.coords and str(ds["level"].attrs.get("units", "")).strip() == "Pa":
        level = ds["level"]
        ds = ds.assign_coords(level=(level.dims, level.values / 100.0, {**level.attrs, "units": "hPa"}))
    if "valid_time" in ds.variables:
        valid = ds["valid_time"]
        if valid.ndim > 1:
            raise InputError(
                f"input{where} holds forecast-style times (valid_time over {', '.join(valid.dims)}), as cfgrib "
                "writes accumulated fields by default; give dchag the GRIB file itself, which it reads by valid "
                "time, or convert it with cfgrib's backend_kwargs time_dims=['valid_time']"
            )
        if "valid_time" in ds.dims:  # CDS 2024, cfgrib with time_dims=valid_time
            ds = ds.drop_vars([c for c in ("time", "step") if c in ds.coords and c not in ds.dims])
            ds = ds.rename(valid_time="time")
        elif valid.ndim == 1 and "time" in ds.dims and valid.dims == ("time",):  # cfgrib's netCDF: time = reference
            ds = ds.assign_coords(time=("time", valid.values, {"long_name": "time", "standard_name": "time"}))
            ds = ds.drop_vars(["valid_time", *(c for c in ("step",) if c in ds.coords and c not in ds.dims)])
        elif valid.ndim == 0 and "time" not in ds.dims:  # one step: a scalar valid_time
            ds = ds.drop_vars([c for c in ("time", "step") if c in ds.coords])
            ds = ds.rename(valid_time="time")
    if "step" in ds.coords and ds["step"].ndim == 0 and "time" in ds.coords:
        ds = ds.drop_vars("step")
    return ds


def _has_consolidated(path: Path) -> bool:
    meta = path / "zarr.json"
    if (path / ".zmetadata").exists():
        return True
    return meta.exists() and '"consolidated_metadata": {' in meta.read_text().replace('":{', '": {')


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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: consolidated metadata is not yet in the v3 spec
        root = zarr.open_group(store=str(path), mode="r")
        groups = [name for name, _ in root.groups()]
        for name in groups:
            zarr.consolidate_metadata(str(path), path=name, zarr_format=3)
        zarr.consolidate_metadata(str(path), zarr_format=3)


def compressors() -> list:
    return [zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")]


# What the pipeline's writers put in a store, named: the rules that write field stores carry it as
# a parameter, and Snakemake reruns a job whose recorded parameters differ, so a store written
# before a change of format (the float64 stores before 2026-12; the climatology in one chunk per
# variable) is rewritten by the next run. Change it when the writers' output changes.
STORE_FORMAT = "zarr3 float32, climatology by day of year (2026-12)"


def day_of_year_encoding(ds: xr.Dataset) -> dict:
    """Encoding of a climatology: a chunk per day of year (what scoring reads, a forecast's valid
    days), each variable's days in one shard (one file)."""
    return {
        name: {
            "chunks": tuple(1 if d == "dayofyear" else n for d, n in zip(v.dims, v.shape)),
            "shards": v.shape,
        }
        for name, v in ds.data_vars.items()
        if "dayofyear" in v.dims
    }


def write_zarr(
    ds: xr.Dataset, path: str | os.PathLike, encoding: dict | None = None, kind: str = "store", inputs=()
) -> None:
    """Write ``ds`` as a Zarr v3 store atomically (inherited encodings dropped); ``kind`` and
    ``inputs`` as for :func:`atomic_path`."""
    ds = ds.drop_encoding()
    enc = {name: {"compressors": compressors()} for name in ds.data_vars if ds[name].dtype.kind in "fiu"}
    for name, extra in (encoding or {}).items():
        enc.setdefault(name, {}).update(extra)
    with atomic_path(path, kind, inputs) as tmp:
        ds.to_zarr(tmp, zarr_format=3, consolidated=False, encoding=enc, mode="w")


def _glibc():
    global _libc
    if _libc is None:
        import ctypes
        import ctypes.util

        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
            _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):  # not glibc
            _libc = False
    return _libc


_libc = None
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def bounded_malloc(arenas: int = 2) -> None:
    """Zarr encodes and decodes chunks in a thread pool, and glibc gives each thread an arena
    that keeps what it freed: a job that writes one block after another grows with the number
    of blocks (era5-split: 274 MB with 2 years, 338 MB with 8). At most ``arenas`` arenas, and
    :func:`release_freed_memory` after each block, keep it flat (glibc only; elsewhere nothing)."""
    if _glibc():
        _libc.mallopt(_M_ARENA_MAX, arenas)


def release_freed_memory() -> None:
    """Give memory that was freed back to the system (glibc's malloc_trim)."""
    if _glibc():
        _libc.malloc_trim(0)


def channel_chunks(shape: tuple[int, ...], time_shard: int) -> dict:
    """Encoding for (time, channel, lat, lon): one chunk per time step and channel, so a rank
    reads one step of its channels alone; chunks grouped into shards of ``time_shard`` steps
    and all channels so the store stays a modest number of files."""
    t, c, ny, nx = shape
    return {"chunks": (1, 1, ny, nx), "shards": (max(1, min(time_shard, t)), c, ny, nx)}


@contextlib.contextmanager
def reading(store: str | os.PathLike) -> Iterator[None]:
    """Reading Zarr store ``store``: whatever a damaged file of it makes zarr, its codecs or the
    JSON parser raise (a truncated chunk or shard, an unparsable ``zarr.json``) is one
    InputError naming the store."""
    try:
        yield
    except DchagError:
        raise
    except Exception as err:
        raise InputError(f"cannot read Zarr store {store}: {type(err).__name__}: {err} (a damaged file?)") from err


def absent_chunks(store: str | os.PathLike, var: str, steps) -> list[str]:
    """The files of variable ``var`` of a local Zarr store that hold its time steps ``steps``
    (indices on its first axis) and are missing: zarr reads a missing chunk as the fill value."""
    import itertools
    import math

    with reading(store):
        array = zarr.open_array(store=str(store), path=var, mode="r")
        outer = array.shards or array.chunks
        rest = [range(math.ceil(n / c)) for n, c in zip(array.shape[1:], outer[1:], strict=True)]
        keys = [
            f"{var}/{array.metadata.encode_chunk_key((t, *r))}"
            for t in sorted({int(i) // outer[0] for i in steps})
            for r in itertools.product(*rest)
        ]
    return [k for k in keys if not (Path(store) / k).exists()]


def open_zarr(path: str | os.PathLike, **kwargs) -> xr.Dataset:
    """xr.open_zarr for stores this package wrote (Zarr v3, not consolidated), quiet about the
    ``.snakemake_timestamp`` file Snakemake leaves in directory outputs; a damaged store is an
    InputError naming it."""
    if not Path(path).exists():
        raise MissingFileError(f"Zarr store not found: {path}")
    with _quiet_snakemake_timestamp(), reading(path):
        return xr.open_zarr(path, consolidated=False, **kwargs)


def open_store(path: str | os.PathLike) -> xr.Dataset:
    """Open a dchag Zarr store, with channel names as the ``channel`` coordinate.

    Stores keep names in the ``channel_names`` attribute (portable across Zarr readers);
    this puts them back as labels so ``ds.sel(channel="z500")`` works.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"Zarr store not found: {path}")
    ds = open_zarr(path)
    names = ds.attrs.get("channel_names")
    if names is not None and "channel" in ds.dims:
        ds = ds.assign_coords(channel=np.asarray(names, dtype=str))
    return ds
