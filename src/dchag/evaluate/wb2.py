"""WeatherBench 2's file layout, in one place: every writer of forecasts, truth and
climatologies and `dchag score` go through it.

WeatherBench 2 (``weatherbench2.evaluation``) reads Zarr stores with long variable names
(``geopotential``, ``temperature``, ``2m_temperature``, ``10m_u_component_of_wind``, ...),
pressure-level variables on a ``level`` dimension in hPa, ``latitude``/``longitude``;
forecasts ``(time = initialisation, prediction_timedelta, [level], latitude, longitude)``,
truth ``(time, [level], latitude, longitude)``, climatology ``(dayofyear[, hour], [level],
latitude, longitude)``. dchag's channels are one field each (``z500``, ``t2m``): a channel is
a WB2 variable at one level or a single-level variable (the ERA5 catalogue,
``dchag.era5.variables``, knows both names).

A dataset holds one ``level`` coordinate for all its variables: where a variable is not
given at one of the levels (a forecast of z500 and t850 only) its values there are NaN, as
WB2's own ``_decode_pressure_level_suffixes`` merges ``geopotential_500`` and
``temperature_850``. Reading back (:func:`channels`), a level that is NaN everywhere is
absent; a level with some NaN is data (and `dchag score` refuses it).
"""

from __future__ import annotations

import re

import numpy as np
import xarray as xr

from ..era5.variables import CATALOG, Era5Variable
from ..errors import DchagError

LEVEL = "level"
LAT, LON = "latitude", "longitude"


class Wb2LayoutError(DchagError, ValueError):
    """A channel or file cannot be put into (or read from) WeatherBench 2's layout."""


def _pressure_level_pattern() -> dict[str, Era5Variable]:
    return {v.short_name: v for v in CATALOG.values() if v.kind == "pressure_level"}


def split_channel(name: str) -> tuple[str, int | None]:
    """A dchag channel name -> (WB2 variable name, level in hPa or None): ``z500`` ->
    (``geopotential``, 500), ``t2m`` -> (``2m_temperature``, None). A name the catalogue does
    not know is kept as a variable of its own (a user's extra field)."""
    for var in CATALOG.values():  # first: u10 is 10m_u_component_of_wind, not u at 10 hPa
        if var.kind != "pressure_level" and var.channel_name() == name:
            return var.long_name, None
    m = re.fullmatch(r"([a-z]+)(\d+)", name)
    if m and m.group(1) in _pressure_level_pattern():
        return _pressure_level_pattern()[m.group(1)].long_name, int(m.group(2))
    return name, None


def channel_name(variable: str, level: int | float | None = None) -> str:
    """(WB2 variable, level) -> the dchag channel name (the inverse of :func:`split_channel`)."""
    var = CATALOG.get(variable)
    if level is not None and not (isinstance(level, float) and np.isnan(level)):
        lev = int(round(float(level)))
        if var is not None and var.kind == "pressure_level":
            return var.channel_name(lev)
        return f"{variable}_{lev}"
    if var is not None and var.kind != "pressure_level":
        return var.channel_name()
    return variable


def units(variable: str) -> str | None:
    var = CATALOG.get(variable)
    return var.units if var is not None else None


def to_wb2(fields: dict[str, xr.DataArray]) -> xr.Dataset:
    """dchag channels (each a DataArray, ``latitude``/``longitude`` last where it has them) as a WB2 dataset:
    pressure-level channels of one variable stacked on ``level`` (ascending hPa), levels a
    variable lacks NaN."""
    by_var: dict[str, list[tuple[int | None, xr.DataArray]]] = {}
    for name, da in fields.items():
        var, level = split_channel(name)
        by_var.setdefault(var, []).append((level, da))
    out = {}
    for var, parts in by_var.items():
        levels = [lev for lev, _ in parts]
        if any(lev is None for lev in levels):
            if len(parts) > 1:
                raise Wb2LayoutError(f"channels {[n for n in fields if split_channel(n)[0] == var]} are one variable")
            da = parts[0][1]
        else:
            parts = sorted(parts, key=lambda p: p[0])
            da = xr.concat(
                [d.expand_dims({LEVEL: np.asarray([lev], np.int64)}) for lev, d in parts], dim=LEVEL, join="outer"
            )
            rest = [d for d in da.dims if d not in (LEVEL, LAT, LON)]
            da = da.transpose(*rest, LEVEL, *[d for d in (LAT, LON) if d in da.dims])
        attrs = dict(da.attrs)
        if units(var):
            attrs["units"] = units(var)
        if LEVEL in da.dims:  # the levels it is given at (the others are NaN): read back without data
            attrs[GIVEN_LEVELS] = [int(lev) for lev, _ in parts]
        out[var] = da.rename(var).assign_attrs(attrs)
    ds = xr.merge(list(out.values()), join="outer", compat="no_conflicts", combine_attrs="drop")
    for var, da in out.items():  # merge drops the variables' attributes
        ds[var].attrs = da.attrs
    if LEVEL in ds.coords:
        ds[LEVEL].attrs.update(units="hPa", long_name="pressure level")
    for coord, unit in ((LAT, "degrees_north"), (LON, "degrees_east")):
        if coord in ds.coords:
            ds[coord].attrs["units"] = unit
    return ds


GIVEN_LEVELS = "dchag_levels"  # a level variable's attribute: the levels it holds values at


def _given_levels(name: str, given) -> list[int] | None:
    """A variable's GIVEN_LEVELS as a list of levels: netCDF reads a list of one back as a
    number (a forecast of one level saved as netCDF); anything but whole numbers is refused."""
    if given is None:
        return None
    values = np.atleast_1d(np.asarray(given))
    whole = values.dtype.kind in "iuf" and np.all(np.isfinite(values) & (values == np.round(values)))
    if values.ndim != 1 or not whole:
        shown = np.asarray(given).tolist()
        raise Wb2LayoutError(f"variable {name!r}: attribute {GIVEN_LEVELS} is {shown!r}; expected levels (hPa)")
    return [int(v) for v in values]


def channels(ds: xr.Dataset) -> xr.Dataset:
    """A dataset with dchag channel names: each WB2 variable with a ``level`` dimension split
    into one variable per level where it holds any value, long names of single-level
    variables shortened (``2m_temperature`` -> ``t2m``). A dataset in dchag's own layout
    (``z500``, no level dimension) comes back unchanged."""
    out = {}
    for name, da in ds.data_vars.items():
        name = str(name)
        if LEVEL in da.dims:
            given = _given_levels(name, da.attrs.get(GIVEN_LEVELS))
            for lev in da[LEVEL].values:
                part = da.sel({LEVEL: lev}, drop=True)
                if given is not None:
                    if int(lev) not in given:
                        continue
                elif bool(part.isel({d: 0 for d in part.dims if d not in (LAT, LON)}).isnull().all()):
                    continue  # a level this variable is not given at (its first field is all NaN)
                part = part.copy(deep=False)
                part.attrs = {k: v for k, v in part.attrs.items() if k != GIVEN_LEVELS}
                out[channel_name(name, lev)] = part
        else:
            out[channel_name(name)] = da.drop_vars(LEVEL, errors="ignore")
    keep = {c: ds[c] for c in ds.coords if c != LEVEL and LEVEL not in ds[c].dims}
    return xr.Dataset(out, coords=keep, attrs=ds.attrs)


def climatology(dchag_climatology: xr.Dataset) -> xr.Dataset:
    """dchag's climatology store (``<channel>(dayofyear[, hour], lat, lon)``, as
    `dchag era5-climatology` writes it) in WB2's layout, ``(dayofyear[, hour], [level],
    latitude, longitude)``; the time means (``<channel>_time_mean``) are dchag's own and not
    part of it."""
    ds = dchag_climatology.rename({k: v for k, v in (("lat", LAT), ("lon", LON)) if k in dchag_climatology.dims})
    names = list(ds.attrs.get("channel_names") or [v for v in ds.data_vars if not str(v).endswith("_time_mean")])
    missing = [n for n in names if n not in ds.data_vars]
    if missing:
        raise Wb2LayoutError(f"the climatology lacks channel(s) {missing}")
    out = to_wb2({n: ds[n] for n in names})
    out.attrs = {k: v for k, v in ds.attrs.items() if k != "channel_names"}
    out.attrs["layout"] = "WeatherBench 2 (dayofyear[, hour], [level], latitude, longitude)"
    return out
