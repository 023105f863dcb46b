"""Day-of-year (and hour) and time-mean climatologies of the climatology years, in jobs whose
memory is a chunk and whose work is one year's worth of data each.

A year holds one value per (day of year, hour), so the day-of-year means are a reduction over
years with an output as large as a year: splitting the work by year would only copy each year.
It is split by day of year instead: with N climatology years, part k of N (``dchag
era5-climatology-part``) takes day block k (about 366/N days) of every year, one year's worth
of reading, and writes, sub-block of days by sub-block (whole store chunks of days, at most
``SUB_BLOCK_BYTES`` of float64 sums), the sums over years divided by their counts (float32
means, with the counts), plus its steps' float64 time sum. The combine (``dchag
era5-climatology``) reads the parts one channel at a time, applies the 61-day circular window
of WeatherBench 2 to the day-of-year means and divides the summed time sums by the step
count: the mean over years per day of year, smoothed, and the mean over every step, to float
rounding.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from .. import provenance
from ..store import InputError, atomic_path, compressors, day_of_year_encoding
from .source import Era5InputError
from .years import YearStore, open_years

CLIMATOLOGY_WINDOW_DAYS = 61  # WeatherBench 2's smoothing window for day-of-year climatologies
DAYS = 366
# A part sums this much of its days at once (float64, every channel): whole store chunks of
# days, at least one. Larger sub-blocks mean fewer, larger Zarr chunks to write and for the
# combine to read (per chunk, zarr-python costs about a millisecond).
SUB_BLOCK_BYTES = 64 * 2**20


def day_block(part: int, parts: int) -> tuple[int, int]:
    """Days of year [first, stop) of part ``part`` (1-based) of ``parts``."""
    if not 1 <= part <= parts <= DAYS:
        raise InputError(f"climatology part {part} of {parts}: expected 1 <= part <= parts <= {DAYS}")
    return 1 + (DAYS * (part - 1)) // parts, 1 + (DAYS * part) // parts


def _hours(years: list[YearStore]) -> np.ndarray:
    return np.unique(np.concatenate([y.times.hour.values for y in years]))


def climatology_part(
    year_stores: list[str | Path], part: int, parts: int, output: str | Path, config: dict | None = None
) -> Path:
    """Part ``part`` of ``parts``: the day-of-year means of day block ``part`` over every given
    year, and the time sum of its steps. Memory: a sub-block of days of every channel in
    float64 (at most ``SUB_BLOCK_BYTES``, at least one store chunk's days), whatever the number
    of years."""
    years = open_years(year_stores)
    first, stop = day_block(part, parts)
    hours = _hours(years)
    names = years[0].names
    ny, nx = len(years[0].lat), len(years[0].lon)
    nc, nh = len(names), len(hours)
    # a sub-block: whole stored chunks of days (read once per year), within SUB_BLOCK_BYTES
    chunk_days = max(1, years[0].chunk // nh)
    per_day = nh * nc * ny * nx * 8
    sub = chunk_days * max(1, SUB_BLOCK_BYTES // (per_day * chunk_days))
    doy = [(y.times.day_of_year.values, np.searchsorted(hours, y.times.hour.values)) for y in years]
    time_sum = np.zeros((nc, ny, nx), np.float64)
    steps = 0
    with atomic_path(output, "climatology-part") as tmp:
        group = zarr.open_group(store=str(tmp), mode="w", zarr_format=3)
        days = stop - first
        mean = group.create_array(
            "mean",
            shape=(days, nh, nc, ny, nx),
            chunks=(min(sub, days), nh, 1, ny, nx),
            shards=(min(sub, days), nh, nc, ny, nx),
            dtype="float32",
            fill_value=np.nan,
            compressors=compressors(),
            dimension_names=("dayofyear", "hour", "channel", "lat", "lon"),
        )
        count = group.create_array(
            "count", shape=(days, nh), chunks=(days, nh), dtype="int64", fill_value=0, compressors=compressors()
        )
        counts = np.zeros((days, nh), np.int64)
        for d0 in range(first, stop, sub):
            d1 = min(stop, d0 + sub)
            acc = np.zeros((d1 - d0, nh, nc, ny, nx), np.float64)
            for y, (d, h) in zip(years, doy):
                inside = np.flatnonzero((d >= d0) & (d < d1))
                if not inside.size:
                    continue
                lo, hi = int(inside[0]), int(inside[-1]) + 1  # times are sorted: the days are one range
                for start, block in y.blocks(lo, hi):
                    for j in range(block.shape[0]):
                        k = start + j
                        acc[d[k] - d0, h[k]] += block[j]
                        counts[d[k] - first, h[k]] += 1
                    time_sum += block.sum(axis=0, dtype=np.float64)
                    steps += block.shape[0]
            n = counts[d0 - first : d1 - first, :, None, None, None]
            acc /= np.maximum(n, 1)
            acc[np.broadcast_to(n == 0, acc.shape)] = np.nan
            mean[d0 - first : d1 - first] = acc.astype(np.float32)
        count[:] = counts
        group.create_array("time_sum", data=time_sum, chunks=time_sum.shape, compressors=compressors())
        group.attrs.update(
            {
                "description": f"climatology part {part} of {parts}: day-of-year means of days {first}-{stop - 1}",
                "part": part,
                "parts": parts,
                "first_day": first,
                "stop_day": stop,
                "hours": hours.tolist(),
                "time_steps": steps,
                "channel_names": names,
                "years": sorted({int(t) for y in years for t in np.unique(y.times.year)}),
                "grid_lat": years[0].lat.tolist(),
                "grid_lon": years[0].lon.tolist(),
                **provenance.as_attrs(provenance.record(config)),
            }
        )
    return Path(output)


def _open_parts(paths: list[str | Path]) -> list[zarr.Group]:
    parts = []
    for p in paths:
        if not Path(p).exists():
            from ..errors import MissingFileError

            raise MissingFileError(f"climatology part not found: {p}")
        try:
            g = zarr.open_group(store=str(p), mode="r")
            _ = (g.attrs["first_day"], g.attrs["stop_day"], g["mean"], g["time_sum"])
        except Exception as err:
            raise Era5InputError(f"{p} is not a climatology part of `dchag era5-climatology-part`: {err}") from err
        parts.append((p, g))
    parts.sort(key=lambda pg: pg[1].attrs["first_day"])
    keys = ("channel_names", "hours", "years", "parts")
    day = 1
    for p, g in parts:
        if any(g.attrs[k] != parts[0][1].attrs[k] for k in keys):
            raise Era5InputError(
                f"climatology part {p} was made from other years, channels or hours than {parts[0][0]}"
            )
        if g.attrs["first_day"] != day:
            raise Era5InputError(
                f"the climatology parts do not cover day of year {day} once: {p} starts at {g.attrs['first_day']}"
            )
        day = g.attrs["stop_day"]
    if day != DAYS + 1:
        raise Era5InputError(f"the climatology parts stop at day of year {day - 1}, not {DAYS}")
    return [g for _, g in parts]


def smooth_circular(means: np.ndarray, window: int = CLIMATOLOGY_WINDOW_DAYS) -> np.ndarray:
    """The centred ``window``-day mean around the year (day 366 neighbours day 1) of the days
    that have a value, NaN where none is in reach; ``means`` is (dayofyear, ...) float64, NaN
    where a day has no data (overwritten)."""
    half = window // 2
    valid = np.isfinite(means)
    values = means  # in place: a channel's year of means is the job's largest array
    values[~valid] = 0.0
    days = means.shape[0]
    total = sum(values[j % days] for j in range(-half, half + 1))
    count = sum(valid[j % days].astype(np.int64) for j in range(-half, half + 1))
    out = np.empty(means.shape, np.float32)
    for i in range(days):
        with np.errstate(invalid="ignore", divide="ignore"):
            out[i] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        total += values[(i + half + 1) % days] - values[(i - half) % days]
        count += valid[(i + half + 1) % days].astype(np.int64) - valid[(i - half) % days]
    return out


def combine_climatology(part_stores: list[str | Path], output: str | Path, config: dict | None = None) -> Path:
    """climatology.zarr from the parts, one channel at a time: ``<channel>`` (dayofyear[,
    hour], lat, lon), smoothed with a 61-day circular window as in WeatherBench 2, and
    ``<channel>_time_mean`` (lat, lon), physical units."""
    parts = _open_parts(part_stores)
    a = parts[0].attrs
    names, hours = list(a["channel_names"]), np.asarray(a["hours"])
    lat, lon = np.asarray(a["grid_lat"]), np.asarray(a["grid_lon"])
    steps = sum(int(g.attrs["time_steps"]) for g in parts)
    if not steps:
        raise Era5InputError("the climatology parts hold no time steps")
    time_mean = sum(np.asarray(g["time_sum"][:], np.float64) for g in parts) / steps
    hourly = hours.size > 1
    dims = ("dayofyear", "hour", "lat", "lon") if hourly else ("dayofyear", "lat", "lon")
    shape = (DAYS, hours.size, len(lat), len(lon)) if hourly else (DAYS, len(lat), len(lon))
    coords = {
        "dayofyear": np.arange(1, DAYS + 1),
        **({"hour": hours} if hourly else {}),
        "lat": ("lat", lat, {"units": "degrees_north", "standard_name": "latitude"}),
        "lon": ("lon", lon, {"units": "degrees_east", "standard_name": "longitude"}),
    }
    import dask.array as da

    skeleton = xr.Dataset(coords=coords)
    for name in names:
        skeleton[name] = (dims, da.zeros(shape, dtype=np.float32, chunks=shape))
        skeleton[f"{name}_time_mean"] = (("lat", "lon"), da.zeros(shape[-2:], dtype=np.float32, chunks=shape[-2:]))
    skeleton.attrs = {
        "description": "climatologies for ACC: day-of-year (61-day circular smoothing) and time mean",
        "years": list(a["years"]),
        "channel_names": names,
        **provenance.as_attrs(provenance.record(config)),
    }
    encoding = {v: {"compressors": compressors(), "chunks": skeleton[v].shape} for v in skeleton.data_vars}
    for v, by_day in day_of_year_encoding(skeleton).items():
        encoding[v].update(by_day)
    with atomic_path(output, "climatology") as tmp:
        skeleton.to_zarr(tmp, zarr_format=3, consolidated=False, compute=False, mode="w", encoding=encoding)
        for c, name in enumerate(names):
            means = np.empty((DAYS, hours.size, len(lat), len(lon)), np.float64)
            for g in parts:
                means[g.attrs["first_day"] - 1 : g.attrs["stop_day"] - 1] = g["mean"][:, :, c]
            smooth = smooth_circular(means)
            zarr.open_array(store=str(tmp), path=name, mode="r+")[...] = smooth if hourly else smooth[:, 0]
            zarr.open_array(store=str(tmp), path=f"{name}_time_mean", mode="r+")[...] = time_mean[c].astype(np.float32)
    return Path(output)


def climatology(year_stores: list[str | Path], output: str | Path, config: dict | None = None) -> Path:
    """The parts (one per year's worth, as the pipeline runs them) and their combine in one
    process (for scripts and tests)."""
    parts = min(len(year_stores), DAYS)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(output).parent, prefix=".climatology-parts-") as tmp:
        stores = [climatology_part(year_stores, k, parts, Path(tmp) / f"{k}.zarr", config) for k in range(1, parts + 1)]
        return combine_climatology(stores, output, config)
