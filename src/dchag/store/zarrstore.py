"""dchag's Zarr stores: their format (codecs, chunk and shard layout, :data:`STORE_FORMAT`),
writing one atomically and reading one back, with a damaged file an InputError naming the store.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from ..errors import DchagError, MissingFileError
from .inputs import InputError, _quiet_snakemake_timestamp
from .outputs import atomic_path


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


def open_store(path: str | os.PathLike, **kwargs) -> xr.Dataset:
    """Open a dchag Zarr store, with channel names as the ``channel`` coordinate.

    Stores keep names in the ``channel_names`` attribute (portable across Zarr readers);
    this puts them back as labels so ``ds.sel(channel="z500")`` works. ``kwargs`` go to
    :func:`open_zarr` (``chunks=None``: no dask, for a few values read once).
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"Zarr store not found: {path}")
    ds = open_zarr(path, **kwargs)
    names = ds.attrs.get("channel_names")
    if names is not None and "channel" in ds.dims:
        ds = ds.assign_coords(channel=np.asarray(names, dtype=str))
    return ds
