"""ERA5 preprocessing: regrid each year, fit normalisation on the training years, write split
stores and climatologies. Each function is one Snakemake job; all write atomically.

Per-year stores hold physical units; split stores hold normalised fields
((x - mean) / std per channel, statistics from the training years alone) with ``mean`` and
``std`` as coordinates so any reader can undo it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
import zarr
from tqdm.auto import tqdm

from .. import jsonio
from .. import provenance
from ..grids import LatLonGrid, weatherbench_grid
from ..regrid.backends import build_weights, resolve_backend
from ..regrid.weights import RegridWeights
from ..store import atomic_path, channel_chunks, compressors, open_zarr, write_zarr
from .source import Channel, Era5InputError, Era5Year

log = logging.getLogger(__name__)

CLIMATOLOGY_WINDOW_DAYS = 61  # WeatherBench 2's smoothing window for day-of-year climatologies


def make_weights(era5: dict, year: int, output: str | Path) -> RegridWeights:
    """Regridding weights from the inputs' grid to the target grid, saved in ESMF's format."""
    source = Era5Year(era5, year)
    try:
        reg = era5["regrid"]
        weights = build_weights(source.grid, weatherbench_grid(era5["grid"]), reg["method"], reg["backend"])
    finally:
        source.close()
    weights.to_netcdf(output)
    return weights


def _fill_nans(block: np.ndarray, ch: Channel, era5: dict, source: Era5Year, times) -> int:
    bad = ~np.isfinite(block)
    count = int(bad.sum())
    if not count:
        return 0
    _, name, path = source.where[ch.name]
    first = times[int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))]
    if era5["nan_policy"] == "fail":
        raise Era5InputError(
            f"{count} NaN/inf value(s) in {name!r} ({ch.name}) of {path}, first at {first}; "
            "set era5.nan_policy: fill to fill them with the zonal mean"
        )
    for i in range(block.shape[0]):
        field = block[i]
        rowmean = np.nanmean(np.where(np.isfinite(field), field, np.nan), axis=-1, keepdims=True)
        if not np.any(np.isfinite(rowmean)):
            raise Era5InputError(f"{name!r} ({ch.name}) of {path} at {times[i]} has no finite value to fill from")
        rowmean = np.where(np.isfinite(rowmean), rowmean, np.nanmean(rowmean))
        np.copyto(field, np.broadcast_to(rowmean, field.shape), where=~np.isfinite(field))
    return count


def _channel_coords(channels: list[Channel]) -> dict:
    return {
        "level": ("channel", np.array([np.nan if c.level is None else float(c.level) for c in channels])),
    }


def _channel_attrs(channels: list[Channel]) -> dict:
    return {
        "channel_names": [c.name for c in channels],
        "channel_long_names": [c.long_name for c in channels],
        "channel_units": [c.variable.units for c in channels],
    }


def _grid_coords(grid: LatLonGrid) -> dict:
    return {
        "lat": ("lat", grid.lat, {"units": "degrees_north", "standard_name": "latitude"}),
        "lon": ("lon", grid.lon, {"units": "degrees_east", "standard_name": "longitude"}),
    }


def preprocess_year(era5: dict, year: int, weights_file: str | Path, output: str | Path, config: dict | None = None) -> Path:
    """Regrid one year of inputs, channel by channel and ``time_chunk`` steps at a time, into a
    Zarr store (time, channel, lat, lon) in physical units. Peak memory is one chunk of one
    channel's weighted source rows, whatever the year's length."""
    source = Era5Year(era5, year)
    try:
        target = weatherbench_grid(era5["grid"])
        reg = era5["regrid"]
        method = reg["method"]
        weights = RegridWeights.from_netcdf(weights_file, source.grid, target, method)
        times = source.times
        channels = source.channels
        chunk = era5["time_chunk"]
        shape = (len(times), len(channels), *target.shape)
        ds = xr.Dataset(
            {"data": (("time", "channel", "lat", "lon"), _lazy_empty(shape, chunk))},
            coords={"time": times, "channel": np.arange(len(channels)), **_grid_coords(target), **_channel_coords(channels)},
            attrs={
                **_channel_attrs(channels),
                "year": year,
                "units_note": "physical units (not normalised)",
                "source_files": [*source.paths, *([era5["constants"]] if era5["constants"] else [])],
                "source_note": "; ".join(source.source_notes) or "ERA5",
                "source_grid": source.grid.describe(),
                "grid": f"WeatherBench {era5['grid']} deg: {target.describe()}",
                "regrid_method": method,
                "regrid_weights": str(weights_file),
                "regrid_weights_origin": weights.origin,
                "regrid_backend": resolve_backend(reg["backend"]),
                **provenance.as_attrs(provenance.record(config if config is not None else {"era5": era5})),
            },
        )
        filled = 0
        with atomic_path(output) as tmp:
            ds.to_zarr(tmp, zarr_format=3, consolidated=False, compute=False, mode="w",
                       encoding={"data": {"chunks": (chunk, len(channels), *target.shape), "compressors": compressors()}})
            out = zarr.open_array(store=str(tmp), path="data", mode="r+")
            steps = range(0, len(times), chunk)
            for start in tqdm(steps, desc=f"ERA5 {year}: regrid", unit="chunk", mininterval=2):
                sl = times[start:start + chunk]
                block = np.empty((len(sl), len(channels), *target.shape), np.float32)
                for c, ch in enumerate(channels):
                    rows = source.read(ch, sl, weights.source_rows)
                    filled += _fill_nans(rows, ch, era5, source, sl)
                    block[:, c] = weights.apply_rows(rows)
                out[start:start + len(sl)] = block
            group = zarr.open_group(store=str(tmp), mode="r+")
            group.attrs["nan_filled"] = filled
    finally:
        source.close()
    return Path(output)


def _lazy_empty(shape, chunk):
    import dask.array as da

    return da.zeros(shape, dtype=np.float32, chunks=(chunk, *shape[1:]))


def _open_years(paths: list[str | Path]) -> list[xr.Dataset]:
    return [open_zarr(p) for p in paths]


def normalization_stats(train_year_stores: list[str | Path], output: str | Path, config: dict | None = None) -> Path:
    """Per-channel mean and std over the training years (float64 sums, streamed by year)."""
    total = total_sq = None
    count = 0
    names = None
    for ds in tqdm(_open_years(train_year_stores), desc="normalisation statistics", unit="year"):
        names = names or ds.attrs["channel_names"]
        x = ds["data"].values.astype(np.float64)
        s = x.sum(axis=(0, 2, 3))
        s2 = (x**2).sum(axis=(0, 2, 3))
        total = s if total is None else total + s
        total_sq = s2 if total_sq is None else total_sq + s2
        count += x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))
    std = np.where(std > 0, std, 1.0)  # constants with no spread: leave them centred, unscaled
    stats = {
        "channels": names,
        "mean": mean.tolist(),
        "std": std.tolist(),
        "years": [str(p) for p in train_year_stores],
        "provenance": provenance.record(config),
    }
    with atomic_path(output) as tmp:
        tmp.write_text(jsonio.dumps(stats, indent=1))
    return Path(output)


def build_split(split: str, year_stores: list[str | Path], stats_file: str | Path, output: str | Path,
                config: dict | None = None, time_shard: int = 32) -> Path:
    """Concatenate a split's years, normalise with the training statistics, write a sharded
    store whose chunks are one time step of one channel."""
    stats = jsonio.read_json(stats_file, "normalisation statistics")
    years = _open_years(year_stores)
    names = years[0].attrs["channel_names"]
    if names != stats["channels"]:
        raise Era5InputError(f"channels of {year_stores[0]} differ from those of the statistics {stats_file}")
    mean = np.asarray(stats["mean"], np.float32)[None, :, None, None]
    std = np.asarray(stats["std"], np.float32)[None, :, None, None]
    ds = xr.concat(years, dim="time", combine_attrs="drop")
    ds.attrs = {
        **{k: v for k, v in years[0].attrs.items() if k not in ("year", "provenance", "units_note", "nan_filled")},
        "split": split,
        "years": [int(y.attrs["year"]) for y in years],
        "normalisation": "(x - mean) / std per channel; mean and std from the training years, in the coordinates",
        "nan_filled": int(sum(y.attrs.get("nan_filled", 0) for y in years)),
        **provenance.as_attrs(provenance.record(config, statistics=str(stats_file))),
    }
    ds = ds.assign_coords(
        mean=("channel", mean.ravel().astype(np.float64)),
        std=("channel", std.ravel().astype(np.float64)),
    )
    ds["data"] = ((ds["data"] - mean) / std).astype(np.float32)
    ds = ds.chunk({"time": time_shard, "channel": -1, "lat": -1, "lon": -1})
    write_zarr(ds, output, encoding={"data": channel_chunks(ds["data"].shape, time_shard)})
    return Path(output)


def climatology(year_stores: list[str | Path], output: str | Path, config: dict | None = None) -> Path:
    """Time-mean and day-of-year(-and-hour) climatologies in physical units, one variable per
    channel: ``<channel>`` (dayofyear[, hour], lat, lon), smoothed with a 61-day circular
    window as in WeatherBench 2, and ``<channel>_time_mean`` (lat, lon)."""
    ds = xr.concat(_open_years(year_stores), dim="time", combine_attrs="drop_conflicts")
    names = ds.attrs["channel_names"]
    data = ds["data"].assign_coords(channel=names).load()
    hours = np.unique(pd.DatetimeIndex(data.time.values).hour)
    doy = data.groupby("time.dayofyear").mean() if hours.size == 1 else data.groupby(["time.dayofyear", "time.hour"]).mean()
    doy = doy.reindex(dayofyear=np.arange(1, 367))
    # Circular smoothing in day of year; the window also fills days absent from the data.
    half = CLIMATOLOGY_WINDOW_DAYS // 2
    padded = xr.concat([doy.isel(dayofyear=slice(-half, None)), doy, doy.isel(dayofyear=slice(0, half))], "dayofyear")
    smooth = padded.rolling(dayofyear=CLIMATOLOGY_WINDOW_DAYS, center=True, min_periods=1).mean()
    smooth = smooth.isel(dayofyear=slice(half, half + 366)).assign_coords(dayofyear=np.arange(1, 367))
    out = xr.Dataset(attrs={
        "description": "climatologies for ACC: day-of-year (61-day circular smoothing) and time mean",
        "years": sorted({int(t) for t in pd.DatetimeIndex(data.time.values).year}),
        "channel_names": names,
        **provenance.as_attrs(provenance.record(config)),
    })
    for name in names:
        out[name] = smooth.sel(channel=name, drop=True).astype(np.float32)
        out[f"{name}_time_mean"] = data.sel(channel=name, drop=True).mean("time").astype(np.float32)
    write_zarr(out.chunk(-1), output)
    return Path(output)
