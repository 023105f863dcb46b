"""``dchag score``: score a forecast file against a truth file (netCDF or Zarr, lat-lon).

Forecast variables are (time, [level,] lat, lon) or (time, prediction_timedelta | lead_time,
[level,] lat, lon) with ``time`` the initialisation time; each forecast is matched to the truth
at its valid time (time + lead). Files in WeatherBench 2's layout (long names, pressure levels
on a ``level`` dimension) and in dchag's own (one variable per channel, ``z500``) are read
alike: every variable is named by its dchag channel (:mod:`dchag.evaluate.wb2`). Variables are
matched by name; lat/latitude and lon/longitude are accepted in either order of latitude. The
metrics are the convention's table (:data:`dchag.evaluate.weather.SCORING`), in each of
WeatherBench 2's regions (:data:`dchag.evaluate.weather.REGIONS`) the grid has rows in, and
land and sea where the truth holds a land-sea mask (``lsm``, WB2's ``land_sea_mask``). The
result is the per-initialisation statistics every metric is a function of
(:mod:`dchag.evaluate.perinit`, written as netCDF) and the scores computed from them, a long
table: variable, lead_time_hours, region, metric, value, convention.

Nothing in the files is believed before it is compared:

* units: a variable of the ERA5 catalogue whose ``units`` attribute says otherwise is converted
  to the catalogue's units with the conversions preprocessing uses (:mod:`dchag.era5.units`:
  gpm -> m**2 s**-2, degC -> K, hPa -> Pa, ...), and units that do not convert are an error
  naming file, variable and unit (a variable without the attribute is taken to be in the
  catalogue's units); a variable outside the catalogue must carry the same units in forecast
  and truth;
* times: a repeated time in either file is an error, and so is a forecast valid time the truth
  lacks (a partial overlap names the missing range; score fewer leads with --lead-hours or give
  a truth that covers them);
* grids: forecast, truth and climatology on one grid (or --regrid);
* an ACC that is undefined (an anomaly without variance: a constant field, or a forecast equal
  to the climatology) is NaN, as WeatherBench 2 gives it: a warning names the variable and lead,
  and the CSV says ``NaN``;
* a damaged store (a truncated chunk or ``zarr.json``) is an error naming it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from ..era5 import units as era5_units
from ..era5.variables import CATALOG
from ..errors import DchagError
from ..grids import GridError, grid_of, lat_lon_names
from ..store import InputError, atomic_path, open_any
from . import perinit, wb2, weather

log = logging.getLogger(__name__)

LEAD_NAMES = ("prediction_timedelta", "lead_time")
COLUMNS = perinit.COLUMNS


class ScoreError(InputError):
    pass


def _lead_hours(coord: xr.DataArray) -> np.ndarray:
    values = np.atleast_1d(coord.values)
    if np.issubdtype(values.dtype, np.timedelta64):
        return values / np.timedelta64(1, "h")
    scale = 24.0 if "day" in str(coord.attrs.get("units", "")).lower() else 1.0
    return values.astype(np.float64) * scale


def open_fields(path: str, what: str) -> xr.Dataset:
    """Open ``path`` with one variable per dchag channel (a WeatherBench 2 file's levels split),
    latitude/longitude renamed to lat/lon and latitude ascending, and the ERA5 catalogue's
    variables in its units (:func:`catalogue_units`)."""
    try:
        ds = wb2.channels(open_any(str(path), what, normalise_names=False))
    except wb2.Wb2LayoutError as err:
        raise wb2.Wb2LayoutError(f"{what} {path}: {err}") from None
    lat, lon = lat_lon_names(ds, str(path))
    ds = ds.rename({k: v for k, v in ((lat, "lat"), (lon, "lon")) if k != v})
    if ds.lat.size > 1 and ds.lat.values[0] > ds.lat.values[-1]:
        ds = ds.isel(lat=slice(None, None, -1))
    return catalogue_units(ds, str(path), what)


def catalogue_units(ds: xr.Dataset, path: str, what: str) -> xr.Dataset:
    """Every variable of the ERA5 catalogue whose ``units`` attribute differs from the
    catalogue's converted to them (lazily, a time step at a time), with the conversions
    preprocessing uses; units that do not convert are a UnitsError naming file, variable and
    unit. A variable without the attribute, or outside the catalogue, is left as it is."""
    out = {}
    for name, da in ds.data_vars.items():
        var = CATALOG.get(wb2.split_channel(str(name))[0])
        found = da.attrs.get("units")
        if var is None or found is None:
            continue
        conv = era5_units.conversion(
            str(found),
            var.units,
            var.long_name,
            f"{what} {path}: variable {name!r}",
            hint="correct the file's units attribute",
        )
        if not conv.identity:
            log.info("%s %s: %s: %s", what, path, name, conv.note)
            lazy = da.chunk({"time": 1} if "time" in da.dims else {})
            converted = lazy.astype(np.float64) * conv.scale + conv.offset
            out[name] = converted.assign_attrs({**da.attrs, "units": var.units})
    return ds.assign(out) if out else ds


def _check_other_units(wanted: list[str], fds, tds, forecast: str, truth: str) -> None:
    """A variable the catalogue does not know must carry the same units in both files."""
    for var in wanted:
        if CATALOG.get(wb2.split_channel(var)[0]) is not None:
            continue
        fu, tu = fds[var].attrs.get("units"), tds[var].attrs.get("units")
        if fu is None or tu is None:
            continue
        a, b = era5_units.reduce(str(fu)), era5_units.reduce(str(tu))
        if (a != b) if a is not None and b is not None else str(fu).strip() != str(tu).strip():
            raise ScoreError(
                f"variable {var!r} is in {fu!r} in the forecast {forecast} but in {tu!r} in the truth {truth}: "
                "convert one of them"
            )


def _check_times(ds: xr.Dataset, path: str, what: str) -> None:
    """Each time, and each lead time, once."""
    for coord, kind in (("time", "time(s)"), *((c, "lead time(s)") for c in LEAD_NAMES)):
        if coord not in ds.coords:
            continue
        times = pd.Index(np.atleast_1d(ds[coord].values))
        if not times.is_unique:
            repeated = times[times.duplicated()].unique()
            raise ScoreError(
                f"{what} {path} repeats {kind} {', '.join(str(t) for t in repeated[:5])}"
                f"{' …' if len(repeated) > 5 else ''}: each must be there once"
            )


def _values(da: xr.DataArray, path: str, what: str, var: str) -> np.ndarray:
    """The values of ``da`` read from ``path``; a damaged file (a truncated Zarr chunk) is a
    ScoreError naming it."""
    try:
        return np.asarray(da.values)
    except DchagError:
        raise
    except Exception as err:  # zarr, numcodecs, netCDF4 and h5py raise many types for damaged data
        raise ScoreError(
            f"cannot read {var!r} from the {what} {path}: {type(err).__name__}: {err} "
            "(a damaged or truncated file or Zarr chunk?)"
        ) from err


def _forecast_leads(ds: xr.Dataset, path: str, lead_hours: list[float] | None) -> tuple[str | None, np.ndarray]:
    """The forecast's lead dimension (None for a single-lead file) and its leads in hours."""
    for name in LEAD_NAMES:
        if name in ds.dims:
            return name, _lead_hours(ds[name])
    for name in LEAD_NAMES:
        if name in ds.coords:  # a scalar lead coordinate
            return None, _lead_hours(ds[name])
    if lead_hours and len(lead_hours) == 1:
        return None, np.asarray(lead_hours, dtype=np.float64)
    raise ScoreError(
        f"forecast {path} has no lead time: expected a dimension or scalar coordinate named "
        f"{' or '.join(LEAD_NAMES)}, or pass one --lead-hours value for a (time, lat, lon) forecast"
    )


def _check_grids(forecast: xr.Dataset, truth: xr.Dataset, fpath: str, tpath: str, regrid: str | None) -> xr.Dataset:
    fgrid = grid_of(forecast, fpath, require_global=regrid is not None)
    tgrid = grid_of(truth, tpath, require_global=regrid is not None)
    if fgrid.same_as(tgrid):
        return forecast
    if regrid is None:
        raise GridError(
            f"forecast {fpath} is on grid {fgrid.describe()} but truth {tpath} is on {tgrid.describe()}; "
            f"regrid one of them, or pass --regrid bilinear|conservative to regrid the forecast onto the truth's grid"
        )
    from ..regrid.weights import RegridWeights

    weights = RegridWeights.build(fgrid, tgrid, regrid)
    out = {}
    for name, da in forecast.data_vars.items():
        if "lat" in da.dims and "lon" in da.dims:
            lead = [d for d in da.dims if d not in ("lat", "lon")]
            values = weights.apply(_values(da.transpose(*lead, "lat", "lon"), fpath, "forecast", str(name)))
            out[name] = xr.DataArray(
                values, dims=(*lead, "lat", "lon"), coords={d: da[d] for d in lead if d in da.coords}
            )
    return xr.Dataset(out, coords={"lat": tgrid.lat, "lon": tgrid.lon}).assign_coords(
        {
            c: forecast[c]
            for c in forecast.coords
            if c not in ("lat", "lon") and not set(forecast[c].dims) & {"lat", "lon"}
        }
    )


def _climatology_at(clim: xr.DataArray, valid: pd.DatetimeIndex, path: str, var: str) -> np.ndarray:
    sel = {"dayofyear": xr.DataArray(valid.day_of_year.values, dims="time")}
    if "hour" in clim.dims:
        sel["hour"] = xr.DataArray(valid.hour.values, dims="time")
    missing = sorted(set(sel["dayofyear"].values.tolist()) - set(clim["dayofyear"].values.tolist()))
    if missing:
        raise ScoreError(
            f"climatology {path} ({var}) lacks day(s) of year {missing[:10]} needed for the scored valid times"
        )
    try:
        values = _values(clim.sel(sel).transpose("time", "lat", "lon"), path, "climatology", var)
    except KeyError as err:
        raise ScoreError(
            f"climatology {path} ({var}) lacks an hour of day needed for the scored valid times: {err}"
        ) from err
    # A day the climatology years do not reach (beyond its smoothing window) is NaN there: an
    # ACC against it would be a silent NaN.
    empty = np.isnan(values).any(axis=(-2, -1))
    if empty.any():
        days = sorted(set(valid[empty].day_of_year.tolist()))
        raise ScoreError(
            f"climatology {path} has no values for {var!r} on day(s) of year "
            f"{days[:20]}{' …' if len(days) > 20 else ''} "
            f"({int(empty.sum())} of the {len(valid)} scored valid times): its years do not cover them; build it "
            "from years that span the scored days (era5.climatology_split)"
        )
    return values


def score_files(forecast: str, truth: str, climatology: str | None = None, convention: str = "wb2", **options):
    """The scores (:func:`score_statistics`'s options) as the CSV's long table."""
    return perinit.table(score_statistics(forecast, truth, climatology, convention, **options))


def score_statistics(
    forecast: str,
    truth: str,
    climatology: str | None = None,
    convention: str = "wb2",
    batch_size: int | None = None,
    metrics: list[str] | None = None,
    variables: list[str] | None = None,
    lead_hours: list[float] | None = None,
    regrid: str | None = None,
) -> xr.Dataset:
    """The per-initialisation statistics of the chosen metrics, per variable, lead and region
    (:mod:`dchag.evaluate.perinit`)."""
    conv, chosen = _metrics(convention, metrics, climatology)
    needs_clim = any(m.needs_climatology for m in chosen)
    fds, tds, cds = _open_all(forecast, truth, climatology, regrid)
    lead_dim, leads = _forecast_leads(fds, forecast, lead_hours)
    fds = _check_grids(fds, tds, forecast, truth, regrid)
    _check_climatology_grid(cds, tds, climatology, truth)
    fvars = sorted(v for v in fds.data_vars if {"time", "lat", "lon"} <= set(fds[v].dims))  # store order is arbitrary
    wanted = list(variables or fvars)
    _check_variables(wanted, fds, tds, cds, forecast, truth, climatology, needs_clim)
    _check_other_units(wanted, fds, tds, forecast, truth)
    leads_idx = _chosen_leads(leads, lead_hours, forecast)
    init = pd.DatetimeIndex(fds.time.values)
    valids = _valid_times(init, tds, leads, leads_idx, forecast, truth)
    scored_valid = pd.DatetimeIndex(np.unique(np.concatenate([v.values for v in valids.values()])))
    stats = [s for s in weather.STATISTICS if any(s in m.statistics for m in chosen)]
    regions = _regions(tds, conv.weights(tds.lat.values), truth)

    values = {}
    for var in wanted:
        fvar = fds[var]
        tvar = tds[var].transpose("time", "lat", "lon")
        period_mean = None
        if needs_clim and conv.climatology == "period_mean" and cds is None:
            # ClimaX: the time mean of the truth over the scored period.
            period_mean = _values(tvar.sel(time=scored_valid), truth, "truth", var).astype(np.float64).mean(0)
        values[var] = np.empty((len(stats), len(regions), len(leads_idx), len(init)))
        for j, i in enumerate(leads_idx):
            valid = valids[i]
            f = _values(
                (fvar.isel({lead_dim: i}) if lead_dim else fvar).transpose("time", "lat", "lon"),
                forecast,
                "forecast",
                var,
            )
            t = _values(tvar.sel(time=valid), truth, "truth", var)
            for name, arr, path in (("forecast", f, forecast), ("truth", t, truth)):
                if not np.isfinite(arr).all():
                    raise ScoreError(
                        f"{name} {path}: {int((~np.isfinite(arr)).sum())} non-finite value(s) of {var!r} at lead "
                        f"{leads[i]:g} h; scores of NaN would be NaN (WeatherBench 2 treats it as an error too)"
                    )
            clim = None
            if needs_clim:
                clim = _climatology_at(cds[var], valid, climatology, var) if cds is not None else period_mean
            for k, (rows, w, cells) in enumerate(regions.values()):
                part = weather.statistics(
                    f[:, rows], t[:, rows], w, None if clim is None else clim[..., rows, :], stats, cells
                )
                values[var][:, k, j, :] = [part[s] for s in stats]
    chosen_leads = [float(leads[i]) for i in leads_idx]
    names = [m.name for m in chosen]
    return perinit.dataset(values, stats, list(regions), chosen_leads, init, conv.name, names, batch_size)


def _regions(tds: xr.Dataset, w: np.ndarray, truth: str) -> dict[str, tuple]:
    """WeatherBench 2's regions the grid has cells in: name -> (rows, the rows' weights, the
    cells' shares or None); land and sea where the truth holds a land-sea mask (``lsm``,
    WeatherBench 2's ``land_sea_mask``: a land fraction, 0 to 1)."""
    lat, out = tds.lat.values, {}
    for name in weather.REGIONS:
        rows = weather.region_rows(lat, name)
        if rows.any():
            out[name] = (rows, weather.region_weights(w, rows), None)
        else:
            log.info("truth %s: no grid row in region %s; it is not scored", truth, name)
    if weather.LAND_SEA not in tds.data_vars:
        return out
    mask = tds[weather.LAND_SEA]
    lsm = (mask.isel(time=0) if "time" in mask.dims else mask).transpose("lat", "lon").values.astype(np.float64)
    if not (np.isfinite(lsm).all() and lsm.min() >= 0 and lsm.max() <= 1):
        raise ScoreError(f"truth {truth}: the land-sea mask {weather.LAND_SEA!r} must be a land fraction in [0, 1]")
    for name in weather.MASK_REGIONS:
        if weather.MASK_REGIONS[name](lsm).sum() > 0:
            out[name] = (np.ones_like(lat, bool), *weather.mask_weights(w, lsm, name))
        else:
            log.info("truth %s: no %s cell in the land-sea mask; %s is not scored", truth, name, name)
    return out


def _metrics(convention: str, metrics: list[str] | None, climatology: str | None) -> tuple:
    """The convention and the metrics chosen of its table; a day-of-year climatology is needed
    where a chosen metric takes one under that convention."""
    try:
        conv = weather.convention(convention)
        chosen = conv.select(metrics)
    except weather.WeatherScoreError as err:
        raise ScoreError(str(err)) from None
    if any(m.needs_climatology for m in chosen) and conv.climatology == "day_of_year" and not climatology:
        names = ", ".join(m.name for m in chosen if m.needs_climatology)
        raise ScoreError(
            f"{names.upper()} under the {conv.name} convention needs a day-of-year climatology: pass --climatology "
            "FILE (dims dayofyear[, hour], [level,] latitude, longitude; `dchag wb2-climatology` writes one), or "
            "leave it out with --metrics"
        )
    return conv, chosen


def _valid_times(init: pd.DatetimeIndex, tds: xr.Dataset, leads, leads_idx, forecast: str, truth: str) -> dict:
    """lead index -> the forecasts' valid times at that lead; every one must be in the truth: a
    partial overlap is not scored."""
    truth_times = pd.DatetimeIndex(tds.time.values)
    valids = {}
    for i in leads_idx:
        valid = init + pd.Timedelta(hours=float(leads[i]))
        lacking = valid[~valid.isin(truth_times)]
        if lacking.size == valid.size:
            raise ScoreError(
                f"no overlapping valid times for lead {float(leads[i])} h: "
                f"forecast {forecast} initialised {init.min()} .. {init.max()}, "
                f"truth {truth} covers {truth_times.min()} .. {truth_times.max()}"
            )
        if lacking.size:
            raise ScoreError(
                f"truth {truth} lacks {lacking.size} of the {valid.size} valid times of forecast {forecast} at lead "
                f"{leads[i]:g} h: {lacking.min()} .. {lacking.max()} (the truth covers {truth_times.min()} .. "
                f"{truth_times.max()}); give a truth that covers them, or score fewer leads with --lead-hours"
            )
        valids[i] = valid
    return valids


def _open_all(forecast: str, truth: str, climatology: str | None, regrid: str | None):
    fds = open_fields(forecast, "forecast")
    tds = open_fields(truth, "truth")
    cds = open_fields(climatology, "climatology") if climatology else None
    for name, ds, path in (("forecast", fds, forecast), ("truth", tds, truth)):
        if "time" not in ds.dims:
            raise ScoreError(f"{name} {path} has no time dimension (dims: {dict(ds.sizes)})")
        _check_times(ds, path, name)
    return fds, tds, cds


def _check_climatology_grid(cds, tds, climatology: str, truth: str) -> None:
    if cds is not None:
        cgrid, tgrid = grid_of(cds, climatology, require_global=False), grid_of(tds, truth, require_global=False)
        if not cgrid.same_as(tgrid):
            raise GridError(
                f"climatology {climatology} is on grid {cgrid.describe()} but truth {truth} is on {tgrid.describe()}"
            )


def _check_variables(wanted, fds, tds, cds, forecast, truth, climatology, needs_clim) -> None:
    for var in wanted:
        for name, ds, path in (("forecast", fds, forecast), ("truth", tds, truth)):
            if var not in ds.data_vars:
                have = [v for v in ds.data_vars if {"lat", "lon"} <= set(ds[v].dims)]
                raise ScoreError(
                    f"variable {var!r} is missing from the {name} {path} "
                    f"(it has {', '.join(have) or 'no lat-lon variables'})"
                )
        if cds is not None and needs_clim and var not in cds.data_vars:
            raise ScoreError(f"variable {var!r} is missing from the climatology {climatology} (needed for ACC)")


def _chosen_leads(leads: np.ndarray, lead_hours: list[float] | None, forecast: str) -> list[int]:
    if not lead_hours:
        return list(range(len(leads)))
    absent = [x for x in lead_hours if not any(abs(h - x) < 1e-6 for h in leads)]
    if absent:
        raise ScoreError(f"lead time(s) {absent} h are not in the forecast {forecast} (it has {leads.tolist()} h)")
    return [i for i, h in enumerate(leads) if any(abs(h - x) < 1e-6 for x in lead_hours)]


def write_csv(df: pd.DataFrame, output: str | Path) -> Path:
    with atomic_path(output) as tmp:
        df.to_csv(tmp, index=False, float_format="%.10g", na_rep="NaN")  # an undefined score says so
    return Path(output)
