"""The per-year stores that ``era5-year`` writes, read the way the jobs after it need them:
metadata at once, the data one store chunk (``era5.time_chunk`` steps, every channel) at a
time, so no job holds more than a chunk of a year whatever the year's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import zarr

from ..store import InputError, bounded_malloc, open_zarr
from .source import Era5InputError


class YearStore:
    """One regridded year (time, channel, lat, lon), physical units."""

    def __init__(self, path: str | Path):
        bounded_malloc()  # the jobs that read year stores keep a block's memory, whatever the years
        self.path = Path(path)
        ds = open_zarr(self.path)  # a missing store: MissingFileError naming it
        try:
            if "data" not in ds or ds["data"].dims != ("time", "channel", "lat", "lon"):
                raise InputError(f"{self.path} is not a per-year ERA5 store: no data(time, channel, lat, lon)")
            if "channel_names" not in ds.attrs:
                raise InputError(f"{self.path} is not a per-year ERA5 store: no channel_names attribute")
            self.attrs = dict(ds.attrs)
            self.names = list(ds.attrs["channel_names"])
            self.times = pd.DatetimeIndex(ds["time"].values)
            self.lat, self.lon = ds["lat"].values, ds["lon"].values
            self.level = ds["level"].values if "level" in ds.coords else None
        finally:
            ds.close()
        self.data = zarr.open_array(store=str(self.path), path="data", mode="r")
        self.chunk = int(self.data.chunks[0])

    @property
    def year(self) -> int:
        return int(self.attrs.get("year", self.times[0].year))

    @property
    def steps(self) -> int:
        return len(self.times)

    def blocks(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(first step, float32 block) over steps [start, stop), cut at the store's chunk
        boundaries so each block is (part of) one stored chunk."""
        stop = self.steps if stop is None else stop
        edge = start
        while edge < stop:
            end = min(stop, (edge // self.chunk + 1) * self.chunk)
            yield edge, np.asarray(self.data[edge:end], dtype=np.float32)
            edge = end


def open_years(paths: list[str | Path]) -> list[YearStore]:
    """The stores, checked to hold the same channels on the same grid (the jobs combine them)."""
    if not paths:
        raise InputError("no per-year stores given")
    years = [YearStore(p) for p in paths]
    first = years[0]
    for y in years[1:]:
        if y.names != first.names:
            raise Era5InputError(f"channels of {y.path} ({', '.join(y.names)}) differ from those of {first.path}")
        if (
            y.lat.shape != first.lat.shape
            or y.lon.shape != first.lon.shape
            or not (np.allclose(y.lat, first.lat) and np.allclose(y.lon, first.lon))
        ):
            raise Era5InputError(f"the grid of {y.path} differs from that of {first.path}")
    return years
