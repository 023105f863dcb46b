"""Opening inputs: netCDF files, Zarr stores and GRIB files, read lazily into the one layout
dchag reads (``time`` the valid time, ``level`` in hPa); a missing or damaged input is one
InputError naming it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DchagError

if TYPE_CHECKING:
    import xarray as xr


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
    import xarray as xr

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
