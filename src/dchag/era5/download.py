"""Downloading one year of the configured ERA5 channels: from the public ARCO-ERA5 Zarr store
(anonymous, via gcsfs) or from the Copernicus Climate Data Store (cdsapi, needs an account).

Both write one netCDF file per year holding every configured variable, in the layout
:mod:`dchag.era5.source` reads; point ``era5.inputs`` at it (e.g. ``resources/era5/era5_{year}.nc``).
The selection is the same code whether the store is remote or a local copy in the same layout.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import xarray as xr
from dask.diagnostics import ProgressBar

from .. import provenance
from ..store import atomic_path, open_any
from .source import Era5InputError, channels_from_config

ARCO_ERA5_STORE = "gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3"
CDS_PRESSURE_LEVELS = "reanalysis-era5-pressure-levels"
CDS_SINGLE_LEVELS = "reanalysis-era5-single-levels"


def select_year(ds: xr.Dataset, era5: dict, year: int, origin: str) -> xr.Dataset:
    """The configured variables, levels and time steps of ``year`` from an ARCO-layout dataset."""
    channels = channels_from_config(era5)
    step = era5["time_step_hours"]
    times = pd.DatetimeIndex(ds["time"].values)
    keep = times[(times.year == year) & (times.hour % step == 0)]
    if keep.size == 0:
        raise Era5InputError(f"{origin} has no time step in {year}")
    levels = sorted({c.level for c in channels if c.level is not None})
    variables = {}
    for ch in channels:
        name = next((n for n in ch.variable.names if n in ds.data_vars), None)
        if name is None:
            raise Era5InputError(f"variable {ch.variable.long_name!r} not in {origin}")
        if name in variables:
            continue
        da = ds[name]
        if ch.variable.kind == "constant" and "time" in da.dims:
            da = da.sel(time=keep[:1])
        elif "time" in da.dims:
            da = da.sel(time=keep)
        if "level" in da.dims:
            missing = [lv for lv in levels if lv not in set(da["level"].values.tolist())]
            if missing:
                raise Era5InputError(f"pressure level(s) {missing} of {name!r} not in {origin}")
            da = da.sel(level=levels)
        variables[name] = da.drop_vars([c for c in da.coords if c not in da.dims], errors="ignore")
    out = xr.Dataset(variables)
    if "time" in out.dims:
        out = out.sel(time=keep) if len(out.time) > 1 else out
    return out


def download_arco(era5: dict, year: int, output: str | Path, store: str | None = None) -> Path:
    store = store or ARCO_ERA5_STORE
    if store.startswith("gs://"):
        try:
            ds = xr.open_zarr(store, chunks=None, storage_options={"token": "anon"}, consolidated=None)
        except Exception as err:
            raise Era5InputError(
                f"cannot open ARCO-ERA5 store {store}: {err} (network access and gcsfs are needed)"
            ) from err
    else:
        ds = open_any(store, "ARCO-ERA5-layout store")
    out = select_year(ds, era5, year, store)
    out.attrs = {"source": f"ARCO-ERA5 {store}", **provenance.as_attrs(provenance.record({"era5": era5, "year": year}))}
    with atomic_path(output) as tmp, ProgressBar(minimum=5):
        out.chunk({"time": 24} if "time" in out.dims else {}).drop_encoding().to_netcdf(tmp)
    return Path(output)


def cds_requests(era5: dict, year: int) -> list[tuple[str, dict]]:
    """The CDS API requests (dataset, request) for the configured channels of ``year``."""
    channels = channels_from_config(era5)
    step = era5["time_step_hours"]
    base = {
        "product_type": ["reanalysis"],
        "year": [str(year)],
        "month": [f"{m:02d}" for m in range(1, 13)],
        "day": [f"{d:02d}" for d in range(1, 32)],
        "time": [f"{h:02d}:00" for h in range(0, 24, step)],
        "data_format": "netcdf",
        "download_format": "unarchived",
    }
    pl_vars = list(dict.fromkeys(c.variable.long_name for c in channels if c.variable.kind == "pressure_level"))
    sl_vars = list(dict.fromkeys(c.variable.long_name for c in channels if c.variable.kind != "pressure_level"))
    requests = []
    if pl_vars:
        levels = sorted({c.level for c in channels if c.level is not None})
        requests.append(
            (CDS_PRESSURE_LEVELS, {**base, "variable": pl_vars, "pressure_level": [str(lv) for lv in levels]})
        )
    if sl_vars:
        requests.append((CDS_SINGLE_LEVELS, {**base, "variable": sl_vars}))
    return requests


def download_cds(era5: dict, year: int, output: str | Path) -> Path:
    try:
        import cdsapi  # noqa: PLC0415 - optional dependency
    except ImportError as err:
        raise Era5InputError("the CDS download needs cdsapi: pip install 'dchag[download]'") from err
    client = cdsapi.Client()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.parts-") as parts_dir:
        parts = []
        for i, (dataset, request) in enumerate(cds_requests(era5, year)):
            part = Path(parts_dir) / f"part{i}.nc"
            client.retrieve(dataset, request, str(part))
            parts.append(open_any(str(part), f"CDS download {dataset}"))
        merged = xr.merge(parts, compat="override")
        merged.attrs = {
            "source": "Copernicus Climate Data Store",
            **provenance.as_attrs(provenance.record({"era5": era5, "year": year})),
        }
        with atomic_path(output) as tmp:
            merged.drop_encoding().to_netcdf(tmp)
        for ds in parts:
            ds.close()
    return output


def download_year(era5: dict, year: int, source: str, output: str | Path, store: str | None = None) -> Path:
    if source == "arco":
        return download_arco(era5, year, output, store)
    if source == "cds":
        return download_cds(era5, year, output)
    raise Era5InputError(f"unknown ERA5 source {source!r}; expected arco or cds")
