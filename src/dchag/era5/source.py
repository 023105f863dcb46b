"""Reading ERA5 inputs channel by channel: GRIB (CDS, MARS), netCDF (CDS old and 2024, cfgrib's),
Zarr (ARCO-ERA5, WeatherBench 2, a user's own), in any mix.

Layouts are normalised on open (:func:`dchag.store.normalise_layout`: ``time`` the valid
time, ``level`` the pressure level); an ensemble dimension is cut to ``era5.member``;
variables are found by long or short name, GRIB paramId or CF ``standard_name``, in every
file that holds them (a variable split over monthly files is read from each by time); units
are checked against the catalogue and converted (:mod:`dchag.era5.units`). Every failure
names the file and the variable, level, member or unit at fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr

from ..config import era5_input_paths
from ..grids import GridError, LatLonGrid, grid_of, lat_lon_names, weatherbench_grid
from ..store import InputError, is_grib, open_any, open_grib
from .units import Conversion, UnitsError, conversion
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
            raise Era5InputError(
                f"config key 'era5.channels.pressure_level.variables': {name!r} is a {var.kind} variable"
            )
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


MEMBER_DIMS = ("number", "realization")  # GRIB/cfgrib and WeatherBench 2; CF


@dataclass
class Part:
    """One variable of one channel in one input file (or GRIB hypercube)."""

    path: str
    ds: xr.Dataset
    name: str
    times: pd.DatetimeIndex | None  # valid times (None: a constant)
    level_index: int | None  # position on the level dimension (None: no level dimension)
    units: Conversion

    @property
    def label(self) -> str:
        return f"{self.name!r} in {self.path}"


def open_inputs(path: str, what: str = "ERA5 input") -> list[xr.Dataset]:
    """An input's datasets: a GRIB file's hypercubes, or the one netCDF file or Zarr store."""
    return open_grib(path, what) if is_grib(path) else [open_any(path, what)]


def _levels(da: xr.DataArray) -> np.ndarray | None:
    """The pressure levels (hPa) of a variable: its level dimension, a scalar level coordinate
    (a file of one level), or None."""
    if "level" in da.dims or ("level" in da.coords and da["level"].ndim == 0):
        return np.atleast_1d(np.asarray(da["level"].values, dtype=float))
    return None


def _times(da: xr.DataArray) -> pd.DatetimeIndex | None:
    if "time" in da.dims or ("time" in da.coords and da["time"].ndim == 0):
        return pd.DatetimeIndex(np.atleast_1d(da["time"].values))
    return None


class Era5Year:
    """One year of ERA5 inputs: checked up front, then read channel by channel in time chunks."""

    def __init__(self, era5: dict, year: int):
        self.year = year
        self.channels = channels_from_config(era5)
        self.paths = era5_input_paths(era5, year)
        self.member = era5.get("member")
        self.declared_units = {
            _lookup(name, "era5.units").long_name: unit for name, unit in (era5.get("units") or {}).items()
        }
        self.inputs: list[tuple[str, xr.Dataset]] = []
        self._const: list[tuple[str, xr.Dataset]] = []
        try:
            for p in self.paths:
                self.inputs += [(p, self._one_member(ds, p)) for ds in open_inputs(p)]
            self._const_path = era5["constants"]
            if self._const_path:
                self._const = [(self._const_path, ds) for ds in open_inputs(self._const_path, "ERA5 constants file")]
            self.where: dict[str, list[Part]] = {ch.name: self._locate(ch) for ch in self.channels}
            first = self.where[self.channels[0].name][0]
            self.grid: LatLonGrid = grid_of(first.ds[first.name], first.path, uneven_lat=True)
            for ch in self.channels:
                for part in self.where[ch.name]:
                    other = grid_of(part.ds[part.name], part.path, uneven_lat=True)
                    if not other.same_as(self.grid):
                        raise GridError(
                            f"{part.path} is on grid {other.describe()}, but {first.path} is on {self.grid.describe()}"
                        )
            self.times = self._year_times(era5["time_step_hours"])
        except BaseException:
            self.close()
            raise
        # Carried into every store made from these files (the demo inputs say "synthetic").
        self.source_notes = sorted({str(ds.attrs["source"]) for ds in self._all() if "source" in ds.attrs})

    def _all(self) -> list[xr.Dataset]:
        return [ds for _, ds in (*self.inputs, *self._const)]

    # -- ensemble members ---------------------------------------------------------------------
    def _one_member(self, ds: xr.Dataset, path: str) -> xr.Dataset:
        for dim in MEMBER_DIMS:
            if dim not in ds.dims:
                continue
            members = [int(m) for m in (ds[dim].values if dim in ds.coords else range(ds.sizes[dim]))]
            if self.member is None and len(members) == 1:
                return ds.isel({dim: 0})
            shown = ", ".join(map(str, members[:20])) + (", ..." if len(members) > 20 else "")
            if self.member is None:
                raise Era5InputError(
                    f"{path} is an ensemble of {len(members)} members ({dim} = {shown}); choose the one to read: "
                    "era5.member in the config (dchag predict: --member)"
                )
            if self.member not in members:
                raise Era5InputError(f"era5.member {self.member} is not a member of {path} ({dim} = {shown})")
            return ds.isel({dim: members.index(self.member)})
        return ds

    def _check_scalar_member(self, part: Part) -> None:
        """A deterministic file, or one member, read for another member: refused (after the
        selection above, a member file's scalar ``number`` is the member read)."""
        if self.member is None or part.times is None:
            return
        for dim in MEMBER_DIMS:
            coord = part.ds[part.name].coords.get(dim)
            if coord is not None and coord.ndim == 0 and _int(coord.values) != self.member:
                raise Era5InputError(
                    f"{part.label} holds ensemble member {_int(coord.values)} only, but era5.member is {self.member}"
                )

    # -- finding a channel's variable ---------------------------------------------------------
    @staticmethod
    def _candidates(ds: xr.Dataset, var: Era5Variable) -> list[str]:
        """Variables of ``ds`` that are ``var``: by name first, then by GRIB paramId, then by
        CF standard name."""
        named = [n for n in var.names if n in ds.data_vars]
        by_id = [
            n
            for n, da in ds.data_vars.items()
            if var.param_id is not None and _int(da.attrs.get("GRIB_paramId")) == var.param_id
        ]
        by_cf = [n for n, da in ds.data_vars.items() if da.attrs.get("standard_name") in var.standard_names]
        return list(dict.fromkeys(named + by_id + by_cf))

    def _locate(self, ch: Channel) -> list[Part]:
        var = ch.variable
        candidates = list(self.inputs)
        if var.kind == "constant" and self._const:
            candidates = [*self._const, *candidates]
        parts: list[Part] = []
        misfits: list[str] = []
        for path, ds in candidates:
            for name in self._candidates(ds, var):
                da = ds[name]
                levels = _levels(da)
                times = _times(da)
                # "z" is geopotential on levels in one file and surface geopotential in another.
                if var.kind == "pressure_level":
                    fits = levels is not None and times is not None
                    if levels is None:
                        misfits.append(
                            f"{name!r} in {path} has no pressure-level dimension ('level', 'pressure_level' or "
                            "'isobaricInhPa')"
                        )
                else:
                    fits = levels is None and (times is not None or var.kind == "constant")
                if not fits:
                    continue
                self._check_dims(da, name, path)
                part = Part(path, ds, name, None if var.kind == "constant" else times, None, self._units(ds, name, ch))
                if ch.level is not None:
                    hit = np.flatnonzero(np.isclose(levels, ch.level))
                    if hit.size == 0:  # another file may hold it (one file per level)
                        misfits.append(
                            f"pressure level {ch.level:g} hPa of {var.long_name!r} not in {path}; "
                            f"available: {', '.join(f'{lv:g}' for lv in levels)}"
                        )
                        continue
                    part.level_index = int(hit[0]) if "level" in da.dims else None
                if part.times is not None and not part.times.is_unique:
                    raise Era5InputError(
                        f"{part.label} repeats time steps (first {part.times[part.times.duplicated()][0]})"
                    )
                self._check_scalar_member(part)
                parts.append(part)
                break  # one variable per dataset
            if parts and var.kind == "constant":
                return parts[:1]
        if not parts:
            searched = ", ".join(dict.fromkeys(p for p, _ in candidates))
            if misfits:
                raise Era5InputError(f"channel {ch.name}: " + "; ".join(dict.fromkeys(misfits)))
            raise Era5InputError(
                f"channel {ch.name}: variable {var.long_name!r} (short name {var.short_name!r}"
                + (f", GRIB paramId {var.param_id}" if var.param_id else "")
                + f") not found in {searched}"
            )
        return parts

    @staticmethod
    def _check_dims(da: xr.DataArray, name: str, path: str) -> None:
        grid_of(da, path, uneven_lat=True)  # a reduced or unstructured grid is named as such
        lat, lon = lat_lon_names(da, path)
        extra = [d for d in da.dims if d not in ("time", "level", lat, lon)]
        if extra:
            hint = (
                " (old CDS files mixing ERA5 and ERA5T: request them apart, or select one expver)"
                if "expver" in extra
                else ""
            )
            raise Era5InputError(
                f"{name!r} in {path} has dimension(s) {', '.join(map(str, extra))} besides time, level, "
                f"latitude and longitude; dchag cannot tell which to read{hint}"
            )

    def _units(self, ds: xr.Dataset, name: str, ch: Channel) -> Conversion:
        var = ch.variable
        declared = self.declared_units.get(var.long_name)
        found = declared if declared is not None else ds[name].attrs.get("units")
        where = f"{name!r} ({var.long_name}) in {self._path_of(ds)}"
        if found is None:
            raise UnitsError(
                f"{where} has no units attribute; expected {var.units!r}: declare them with era5.units "
                f"({{{var.long_name}: ...}})"
            )
        return conversion(str(found), var.units, var.long_name, where)

    def _path_of(self, ds: xr.Dataset) -> str:
        return next((p for p, d in (*self.inputs, *self._const) if d is ds), "?")

    def _year_times(self, step_hours: int) -> pd.DatetimeIndex:
        common = None
        for ch in self.channels:
            if ch.variable.kind == "constant":
                continue
            parts = self.where[ch.name]
            kept = []
            for part in parts:
                t = part.times
                kept.append(t[(t.year == self.year) & (t.hour % step_hours == 0)])
            t = kept[0].append(kept[1:]) if len(kept) > 1 else kept[0]
            if not t.is_unique:
                dup = t[t.duplicated()][0]
                holders = [p.path for p, k in zip(parts, kept) if dup in k]
                raise Era5InputError(
                    f"{dup} of {parts[0].name!r} ({ch.name}) is in more than one input: {', '.join(holders)}"
                )
            if t.size == 0:
                raise Era5InputError(
                    f"no time steps of {self.year} (every {step_hours} h) for {parts[0].name!r} in "
                    + ", ".join(dict.fromkeys(p.path for p in parts))
                )
            common = t if common is None else common.intersection(t)
        if common is None:  # constants only
            return pd.DatetimeIndex([pd.Timestamp(f"{self.year}-01-01")])
        if common.size == 0:
            raise Era5InputError(f"the input files share no time step in {self.year}: {', '.join(self.paths)}")
        return common.sort_values()

    # -- reading ------------------------------------------------------------------------------
    def describe(self, ch: Channel) -> tuple[str, str]:
        """(variable name, files) of a channel, for messages."""
        parts = self.where[ch.name]
        return parts[0].name, ", ".join(dict.fromkeys(p.path for p in parts))

    def units_notes(self) -> list[str]:
        """The unit conversions applied, one line per channel and file."""
        return [
            f"{ch.name}: {part.label}: {part.units.note}"
            for ch in self.channels
            for part in self.where[ch.name]
            if not part.units.identity
        ]

    def read(self, ch: Channel, times: pd.DatetimeIndex, rows: np.ndarray) -> np.ndarray:
        """float32 (len(times), len(rows), nlon) of one channel in the catalogue's units; ``rows``
        index latitude as stored."""
        parts = self.where[ch.name]
        if ch.variable.kind == "constant":
            block = self._read_part(parts[0], None, rows)
            return np.repeat(block[None], len(times), axis=0)
        out = np.empty((len(times), len(rows), self.grid.shape[1]), np.float32)
        filled = np.zeros(len(times), bool)
        for part in parts:
            pos = part.times.get_indexer(times)
            hit = pos >= 0
            if hit.any():
                out[hit] = self._read_part(part, pos[hit], rows)
                filled |= hit
        if not filled.all():
            raise Era5InputError(f"no field of {parts[0].name!r} ({ch.name}) at {times[~filled][0]} in the inputs")
        return out

    @staticmethod
    def _read_part(part: Part, positions: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
        da = part.ds[part.name]
        lat_name, lon_name = lat_lon_names(da, part.path)
        sel: dict = {lat_name: rows}
        if part.level_index is not None:
            sel["level"] = part.level_index
        try:
            if positions is None:  # a constant: its first (or only) time
                if "time" in da.dims:
                    sel["time"] = 0
                out = da.isel(sel).transpose(lat_name, lon_name).values
            elif "time" in da.dims:
                sel["time"] = positions
                out = da.isel(sel).transpose("time", lat_name, lon_name).values
            else:  # a file of one time step
                out = da.isel(sel).transpose(lat_name, lon_name).values[None]
        except Exception as err:
            raise Era5InputError(
                f"cannot read {part.label}: {type(err).__name__}: {err} (the file may be truncated or corrupt)"
            ) from err
        out = np.asarray(out, dtype=np.float32)
        if not part.units.identity:
            out = (out.astype(np.float64) * part.units.scale + part.units.offset).astype(np.float32)
        return out

    def close(self) -> None:
        for ds in self._all():
            ds.close()


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def first_input_grid(era5: dict) -> LatLonGrid | None:
    """The grid of the first netCDF or Zarr input of the first training year, or None where it
    cannot be seen without reading data (a GRIB file, a file still to be made or downloaded, an
    unreadable one: its own job names the problem)."""
    if era5.get("demo") or era5.get("download"):
        return None
    years = sorted(era5["years"]["train"])
    paths = era5_input_paths(era5, years[0]) if years else []
    if not paths or is_grib(paths[0]):
        return None
    try:
        ds = open_any(paths[0], "ERA5 input")
    except Exception:
        return None
    try:
        for da in ds.data_vars.values():
            try:
                return grid_of(da, paths[0], uneven_lat=True)
            except Exception:
                continue
        return None
    finally:
        ds.close()


def inputs_on_target_grid(era5: dict) -> bool:
    """Whether the inputs are on the target grid already (era5.regrid.inputs_on_grid; auto: the
    first input's grid holds the target grid's points, in any order)."""
    setting = era5["regrid"].get("inputs_on_grid", "auto")
    if setting != "auto":
        return bool(setting)
    grid = first_input_grid(era5)
    return grid is not None and grid.order_onto(weatherbench_grid(era5["grid"])) is not None


def run_channels(cfg) -> list[str]:
    """The ERA5 channels a run reads: its ``channels`` (train.runs.<run>.channels, a subset, in
    store order) or all of the config's."""
    names = channel_names(cfg.era5)
    subset = getattr(cfg, "channels", None)
    return [n for n in names if n in subset] if subset else names


def forecast_model_config(cfg, in_channels: int | None = None, img_size: tuple[int, int] | None = None):
    """The forecasting model of a config (a dchag.config.Settings) with an ``era5`` section:
    its channels, outputs and grid unless given (the cost model and describe-model count other
    channel numbers and image sizes)."""
    from ..config import ConfigError
    from ..grids import weatherbench_grid
    from ..model.build import model_config

    if cfg.era5 is None and (in_channels is None or img_size is None):
        raise ConfigError(
            "cannot tell the model's channels and image size: the config has no era5 section "
            "(give the channel count and image size)"
        )
    names = run_channels(cfg) if cfg.era5 is not None else []
    shape = weatherbench_grid(cfg.era5["grid"]).shape if cfg.era5 is not None else None
    channels = in_channels or len(names)
    outputs = [names.index(n) for n in forecast_outputs(cfg.train.forecast.outputs, names) if n in names]
    return model_config(
        cfg.model,
        cfg.parallel.tp,
        "forecast",
        channels,
        img_size or shape,
        out_channels=[o for o in outputs if o < channels],
    )
