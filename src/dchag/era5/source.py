"""Reading ERA5 as CDS netCDF files or ARCO-ERA5-layout Zarr stores, channel by channel.

Names are normalised on open (``valid_time`` -> ``time``, ``pressure_level`` -> ``level``);
variables are found by long or short name. Every failure names the file and the variable or
level at fault.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np
import pandas as pd
import xarray as xr

from ..config import era5_input_paths
from ..grids import GridError, LatLonGrid, grid_of, lat_lon_names
from ..store import InputError, open_any
from .variables import Era5Variable, lookup


class Era5InputError(InputError):
    """An ERA5 input is missing, unreadable, or lacks a requested variable, level or time."""


@dataclass(frozen=True)
class Channel:
    name: str
    variable: Era5Variable
    level: int | None = None

    @property
    def long_name(self) -> str:
        return self.variable.long_name if self.level is None else f"{self.variable.long_name}_{self.level}"


DEFAULT_FORECAST_OUTPUTS = ("z500", "t850", "t2m", "u10", "v10")


def channel_names(era5: dict) -> list[str]:
    """The input channels' short names, in store order."""
    return [c.name for c in channels_from_config(era5)]


def forecast_outputs(outputs: list[str] | None, names: list[str]) -> list[str]:
    """The forecast variables: ``outputs`` (train.forecast.outputs), or (None) the default five
    that are among ``names``."""
    return list(outputs) if outputs else [n for n in DEFAULT_FORECAST_OUTPUTS if n in names]


def channels_from_config(era5: dict) -> list[Channel]:
    """Pressure-level channels (variable-major, levels in config order), then single-level, then constants."""
    spec = era5["channels"]
    out: list[Channel] = []
    pl = spec.get("pressure_level") or {"variables": []}  # the one optional group: no default in the schema
    for name in pl["variables"]:
        var = _lookup(name, "era5.channels.pressure_level.variables")
        if var.kind != "pressure_level":
            raise Era5InputError(f"config key 'era5.channels.pressure_level.variables': {name!r} is a {var.kind} variable")
        out += [Channel(var.channel_name(level), var, level) for level in pl["levels"]]
    for key, kind in (("single_level", "single_level"), ("constants", "constant")):
        for name in spec[key]:
            var = _lookup(name, f"era5.channels.{key}")
            if var.kind != kind:
                raise Era5InputError(f"config key 'era5.channels.{key}': {name!r} is a {var.kind} variable")
            out.append(Channel(var.channel_name(), var))
    return out


def _lookup(name: str, key: str) -> Era5Variable:
    try:
        return lookup(name)
    except KeyError as err:
        raise Era5InputError(f"config key '{key}': {err.args[0]}") from None


class Era5Year:
    """One year of ERA5 inputs: checked up front, then read channel by channel in time chunks."""

    def __init__(self, era5: dict, year: int):
        self.year = year
        self.channels = channels_from_config(era5)
        self.paths = era5_input_paths(era5, year)
        self.datasets = {p: open_any(p, "ERA5 input") for p in self.paths}
        self._const_path = era5["constants"]
        self._const = open_any(self._const_path, "ERA5 constants file") if self._const_path else None
        self.where: dict[str, tuple[xr.Dataset, str, str]] = {}
        for ch in self.channels:
            self.where[ch.name] = self._locate(ch)
        first_ds, _, first_path = self.where[self.channels[0].name]
        self.grid: LatLonGrid = grid_of(first_ds, first_path)
        for ch in self.channels:
            ds, _, path = self.where[ch.name]
            other = grid_of(ds, path)
            if not other.same_as(self.grid):
                raise GridError(f"{path} is on grid {other.describe()}, but {first_path} is on {self.grid.describe()}")
        self.times = self._year_times(era5["time_step_hours"])
        # Carried into every store made from these files (the demo inputs say "synthetic").
        self.source_notes = sorted({str(ds.attrs["source"]) for ds in self._all() if "source" in ds.attrs})

    def _all(self) -> list[xr.Dataset]:
        return [*self.datasets.values(), *([self._const] if self._const is not None else [])]

    def _locate(self, ch: Channel) -> tuple[xr.Dataset, str, str]:
        candidates = list(self.datasets.items())
        if ch.variable.kind == "constant" and self._const is not None:
            candidates.insert(0, (self._const_path, self._const))
        for path, ds in candidates:
            for name in ch.variable.names:
                if name not in ds.data_vars:
                    continue
                dims = ds[name].dims
                # "z" is geopotential on levels in one file and surface geopotential in another.
                fits = "level" not in dims if ch.variable.kind == "constant" else "time" in dims
                if fits:
                    self._check_level(ds, name, ch, path)
                    return ds, name, path
        searched = ", ".join(p for p, _ in candidates)
        raise Era5InputError(
            f"channel {ch.name}: variable {ch.variable.long_name!r} (short name {ch.variable.short_name!r}) "
            f"not found in {searched}"
        )

    @staticmethod
    def _check_level(ds: xr.Dataset, name: str, ch: Channel, path: str) -> None:
        if ch.level is None:
            return
        if "level" not in ds[name].dims:
            raise Era5InputError(f"variable {name!r} in {path} has no pressure-level dimension ('level' or 'pressure_level')")
        levels = np.asarray(ds["level"].values, dtype=float)
        if not np.any(np.isclose(levels, ch.level)):
            raise Era5InputError(
                f"pressure level {ch.level} hPa of {ch.variable.long_name!r} not in {path}; "
                f"available: {', '.join(f'{lv:g}' for lv in levels)}"
            )

    def _year_times(self, step_hours: int) -> pd.DatetimeIndex:
        common = None
        for ch in self.channels:
            if ch.variable.kind == "constant":
                continue
            ds, name, path = self.where[ch.name]
            t = pd.DatetimeIndex(ds["time"].values)
            t = t[(t.year == self.year) & (t.hour % step_hours == 0)]
            if t.size == 0:
                raise Era5InputError(f"no time steps of {self.year} (every {step_hours} h) for {name!r} in {path}")
            common = t if common is None else common.intersection(t)
        if common is None:  # constants only
            return pd.DatetimeIndex([pd.Timestamp(f"{self.year}-01-01")])
        if common.size == 0:
            raise Era5InputError(f"the input files share no time step in {self.year}: {', '.join(self.paths)}")
        return common.sort_values()

    def read(self, ch: Channel, times: pd.DatetimeIndex, rows: np.ndarray) -> np.ndarray:
        """float32 (len(times), len(rows), nlon) of one channel; ``rows`` index latitude as stored."""
        ds, name, path = self.where[ch.name]
        da = ds[name]
        lat_name, _ = lat_lon_names(da, path)
        sel: dict = {lat_name: rows}
        if ch.level is not None:
            sel["level"] = int(np.flatnonzero(np.isclose(ds["level"].values.astype(float), ch.level))[0])
        try:
            if ch.variable.kind == "constant":
                da = da.squeeze(drop=True) if "time" not in da.dims else da.isel(time=0, drop=True)
                block = da.isel(sel).transpose(lat_name, ...).values
                out = np.repeat(block[None], len(times), axis=0)
            else:
                da = da.isel(sel).sel(time=times)
                out = da.transpose("time", lat_name, ...).values
        except Exception as err:
            raise Era5InputError(
                f"cannot read {name!r} ({ch.name}) from {path}: {type(err).__name__}: {err} "
                "(the file may be truncated or corrupt)"
            ) from err
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        for ds in self._all():
            ds.close()
