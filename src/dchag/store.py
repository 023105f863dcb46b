"""Opening inputs, and writing results atomically.

Results are built under a temporary name beside the target and renamed on success, so a
crash or interrupt never leaves a store, file or directory at the target path that looks
complete; the temporary is removed on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from pathlib import Path
from typing import Iterator

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
        raise InputError(f"store {store} lacks channel(s) the model expects: {', '.join(missing)} (it has {', '.join(available)})")
    return [available.index(c) for c in wanted]


@contextlib.contextmanager
def _quiet_snakemake_timestamp():
    """Silence zarr's warning about the ``.snakemake_timestamp`` file Snakemake leaves in
    directory outputs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        yield


def open_any(path: str, what: str = "input", normalise_names: bool = True) -> xr.Dataset:
    """Open a netCDF file or Zarr store lazily; with ``normalise_names`` the newer CDS names
    ``valid_time`` and ``pressure_level`` become ``time`` and ``level``."""
    is_zarr = path.rstrip("/").endswith(".zarr") or "://" in path or (Path(path) / "zarr.json").exists()
    if "://" not in path and not Path(path).exists():
        raise InputError(f"{what} not found: {path}")
    try:
        if is_zarr:
            with _quiet_snakemake_timestamp():
                ds = xr.open_zarr(path, consolidated=None if "://" in path else _has_consolidated(Path(path)), chunks=None)
        else:
            ds = xr.open_dataset(path, chunks=None, cache=False)
    except Exception as err:  # netCDF4/h5py/zarr raise many types for damaged files
        raise InputError(
            f"cannot read {what} {path}: {type(err).__name__}: {err} (is it a complete netCDF file or Zarr store?)"
        ) from err
    if not normalise_names:
        return ds
    rename = {old: new for old, new in (("valid_time", "time"), ("pressure_level", "level")) if old in ds.dims or old in ds.coords}
    return ds.rename(rename)

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


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it to ``target`` if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if (tmp / "zarr.json").exists():
            consolidate(tmp)
        if target.exists():
            _remove(target)
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
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


def write_zarr(ds: xr.Dataset, path: str | os.PathLike, encoding: dict | None = None) -> None:
    """Write ``ds`` as a Zarr v3 store atomically (inherited encodings dropped)."""
    ds = ds.drop_encoding()
    enc = {name: {"compressors": compressors()} for name in ds.data_vars if ds[name].dtype.kind in "fiu"}
    for name, extra in (encoding or {}).items():
        enc.setdefault(name, {}).update(extra)
    with atomic_path(path) as tmp:
        ds.to_zarr(tmp, zarr_format=3, consolidated=False, encoding=enc, mode="w")


def channel_chunks(shape: tuple[int, ...], time_shard: int) -> dict:
    """Encoding for (time, channel, lat, lon): one chunk per time step and channel, so a rank
    reads one step of its channels alone; chunks grouped into shards of ``time_shard`` steps
    and all channels so the store stays a modest number of files."""
    t, c, ny, nx = shape
    return {"chunks": (1, 1, ny, nx), "shards": (max(1, min(time_shard, t)), c, ny, nx)}


def open_zarr(path: str | os.PathLike, **kwargs) -> xr.Dataset:
    """xr.open_zarr for stores this package wrote (Zarr v3, not consolidated), quiet about the
    ``.snakemake_timestamp`` file Snakemake leaves in directory outputs."""
    if not Path(path).exists():
        raise MissingFileError(f"Zarr store not found: {path}")
    with _quiet_snakemake_timestamp():
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
