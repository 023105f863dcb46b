"""ERA5 preprocessing: regridding weights and the per-year regridded stores. Each function is
one Snakemake job; all write atomically.

Per-year stores hold physical units. What follows them, each in jobs whose memory is a chunk:
the training years' statistics (era5/statistics.py), the normalised split stores
(era5/split.py) and the climatologies (era5/climatology.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from tqdm.auto import tqdm

from .. import provenance
from ..grids import LatLonGrid, weatherbench_grid
from ..regrid.backends import build_weights, resolve_backend
from ..regrid.weights import RegridWeights
from ..store import atomic_path, compressors
from .source import Channel, Era5InputError, Era5Year

log = logging.getLogger(__name__)


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
    name, path = source.describe(ch)
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


class _PassThrough:
    """Inputs on the target grid: the same points, reordered (ascending latitude, longitude
    from 0) and copied, not interpolated."""

    def __init__(self, source: LatLonGrid, target: LatLonGrid):
        order = source.order_onto(target)
        assert order is not None
        self.source_rows, self.cols = order
        self.origin = "none: the inputs are on the target grid; values copied"

    def apply_rows(self, rows: np.ndarray) -> np.ndarray:
        return rows[..., self.cols]


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


def _weights(era5: dict, source: Era5Year, target, weights_file):
    """(on the target grid, method, backend, the weights) of a year: inputs on the target grid
    are copied, others regridded with ``weights_file``."""
    reg = era5["regrid"]
    on_grid = source.grid.order_onto(target) is not None
    if on_grid:
        # Also when weights were made anyway (inputs_on_grid: false, or the plan could not
        # look): the same points are copied exactly, never interpolated.
        method, backend = "none", "none"
        weights = _PassThrough(source.grid, target)
    elif weights_file is None:
        first = source.where[source.channels[0].name][0].path
        raise Era5InputError(
            f"{first} is on grid {source.grid.describe()}, not on the target grid {era5['grid']} deg "
            f"({target.describe()}): it needs regridding weights (era5-year --weights), which the pipeline "
            "gives only when era5.regrid.inputs_on_grid is not true: set it to auto or false"
        )
    else:
        method, backend = reg["method"], resolve_backend(reg["backend"])
        weights = RegridWeights.from_netcdf(weights_file, source.grid, target, method)
    return on_grid, method, backend, weights


def preprocess_year(
    era5: dict, year: int, weights_file: str | Path | None, output: str | Path, config: dict | None = None
) -> Path:
    """Regrid one year of inputs, channel by channel and ``time_chunk`` steps at a time, into a
    Zarr store (time, channel, lat, lon) in physical units (the catalogue's: converted where a
    file uses others). Inputs on the target grid are copied exactly instead (``weights_file``
    may then be None). Peak memory is one chunk of one channel's weighted source rows,
    whatever the year's length."""
    source = Era5Year(era5, year)
    try:
        target = weatherbench_grid(era5["grid"])
        on_grid, method, backend, weights = _weights(era5, source, target, weights_file)
        times = source.times
        channels = source.channels
        chunk = era5["time_chunk"]
        shape = (len(times), len(channels), *target.shape)
        ds = xr.Dataset(
            {"data": (("time", "channel", "lat", "lon"), _lazy_empty(shape, chunk))},
            coords={
                "time": times,
                "channel": np.arange(len(channels)),
                **_grid_coords(target),
                **_channel_coords(channels),
            },
            attrs={
                **_channel_attrs(channels),
                "year": year,
                "units_note": "physical units (not normalised)",
                "source_files": [*source.paths, *([era5["constants"]] if era5["constants"] else [])],
                "source_note": "; ".join(source.source_notes) or "ERA5",
                "source_grid": source.grid.describe(),
                "grid": f"WeatherBench {era5['grid']} deg: {target.describe()}",
                "regrid_method": method,
                "regrid_weights": "none" if on_grid else str(weights_file),
                "regrid_weights_origin": weights.origin,
                "regrid_backend": backend,
                "units_converted": source.units_notes() or "none",
                "ensemble_member": "none" if source.member is None else int(source.member),
                **provenance.as_attrs(provenance.record(config if config is not None else {"era5": era5})),
            },
        )
        filled = 0
        with atomic_path(output, "era5-year") as tmp:
            ds.to_zarr(
                tmp,
                zarr_format=3,
                consolidated=False,
                compute=False,
                mode="w",
                encoding={"data": {"chunks": (chunk, len(channels), *target.shape), "compressors": compressors()}},
            )
            out = zarr.open_array(store=str(tmp), path="data", mode="r+")
            steps = range(0, len(times), chunk)
            for start in tqdm(steps, desc=f"ERA5 {year}: regrid", unit="chunk", mininterval=2):
                sl = times[start : start + chunk]
                block = np.empty((len(sl), len(channels), *target.shape), np.float32)
                for c, ch in enumerate(channels):
                    rows = source.read(ch, sl, weights.source_rows)
                    filled += _fill_nans(rows, ch, era5, source, sl)
                    block[:, c] = weights.apply_rows(rows)
                out[start : start + len(sl)] = block
            group = zarr.open_group(store=str(tmp), mode="r+")
            group.attrs["nan_filled"] = filled
    finally:
        source.close()
    return Path(output)


def _lazy_empty(shape, chunk):
    import dask.array as da

    return da.zeros(shape, dtype=np.float32, chunks=(chunk, *shape[1:]))
