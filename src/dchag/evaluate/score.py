"""``dchag score``: score a forecast file against a truth file (netCDF or Zarr, lat-lon).

Forecast variables are (time, [level,] lat, lon) or (time, prediction_timedelta | lead_time,
[level,] lat, lon) with ``time`` the initialisation time; each forecast is matched to the truth
at its valid time (time + lead). Files in WeatherBench 2's layout (long names, pressure levels
on a ``level`` dimension) and in dchag's own (one variable per channel, ``z500``) are read
alike: every variable is named by its dchag channel (:mod:`dchag.evaluate.wb2`). Variables are
matched by name; lat/latitude and lon/longitude are accepted in either order of latitude. The
metrics are the convention's table (:data:`dchag.evaluate.weather.SCORING`). The result is a
long table: variable, lead_time_hours, metric, value, convention.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from ..grids import GridError, grid_of, lat_lon_names
from ..store import InputError, atomic_path, open_any
from . import wb2, weather

LEAD_NAMES = ("prediction_timedelta", "lead_time")
COLUMNS = ["variable", "lead_time_hours", "metric", "value", "convention"]


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
    latitude/longitude renamed to lat/lon and latitude ascending."""
    ds = wb2.channels(open_any(str(path), what, normalise_names=False))
    lat, lon = lat_lon_names(ds, str(path))
    ds = ds.rename({k: v for k, v in ((lat, "lat"), (lon, "lon")) if k != v})
    if ds.lat.size > 1 and ds.lat.values[0] > ds.lat.values[-1]:
        ds = ds.isel(lat=slice(None, None, -1))
    return ds


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
            values = weights.apply(da.transpose(*lead, "lat", "lon").values)
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
        values = clim.sel(sel).transpose("time", "lat", "lon").values
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


def score_files(
    forecast: str,
    truth: str,
    climatology: str | None = None,
    convention: str = "wb2",
    batch_size: int | None = None,
    metrics: list[str] | None = None,
    variables: list[str] | None = None,
    lead_hours: list[float] | None = None,
    regrid: str | None = None,
) -> pd.DataFrame:
    try:
        conv = weather.convention(convention)
        chosen = conv.select(metrics)
    except weather.WeatherScoreError as err:
        raise ScoreError(str(err)) from None
    needs_clim = any(m.needs_climatology for m in chosen)
    if needs_clim and conv.climatology == "day_of_year" and not climatology:
        names = ", ".join(m.name for m in chosen if m.needs_climatology)
        raise ScoreError(
            f"{names.upper()} under the {conv.name} convention needs a day-of-year climatology: pass --climatology "
            "FILE (dims dayofyear[, hour], [level,] latitude, longitude; `dchag wb2-climatology` writes one), or "
            "leave it out with --metrics"
        )
    fds, tds, cds = _open_all(forecast, truth, climatology, regrid)
    lead_dim, leads = _forecast_leads(fds, forecast, lead_hours)
    fds = _check_grids(fds, tds, forecast, truth, regrid)
    _check_climatology_grid(cds, tds, climatology, truth)
    fvars = sorted(v for v in fds.data_vars if {"time", "lat", "lon"} <= set(fds[v].dims))  # store order is arbitrary
    wanted = list(variables or fvars)
    _check_variables(wanted, fds, tds, cds, forecast, truth, climatology, needs_clim)
    leads_idx = _chosen_leads(leads, lead_hours, forecast)
    init = pd.DatetimeIndex(fds.time.values)
    truth_times = pd.DatetimeIndex(tds.time.values)
    w = conv.weights(tds.lat.values)
    # Which forecasts have a truth at their valid time, per lead.
    matches = {}
    for i in leads_idx:
        valid = init + pd.Timedelta(hours=float(leads[i]))
        ok = valid.isin(truth_times)
        matches[i] = (np.flatnonzero(ok), valid[ok])
    empty = [float(leads[i]) for i, (idx, _) in matches.items() if idx.size == 0]
    if empty:
        raise ScoreError(
            f"no overlapping valid times for lead(s) {empty} h: "
            f"forecast {forecast} initialised {init.min()} .. {init.max()}, "
            f"truth {truth} covers {truth_times.min()} .. {truth_times.max()}"
        )
    scored_valid = pd.DatetimeIndex(np.unique(np.concatenate([v.values for _, v in matches.values()])))

    rows = []
    for var in wanted:
        fvar = fds[var]
        tvar = tds[var].transpose("time", "lat", "lon")
        period_mean = None
        if needs_clim and conv.climatology == "period_mean" and cds is None:
            # ClimaX: the time mean of the truth over the scored period.
            period_mean = tvar.sel(time=scored_valid).mean("time").values.astype(np.float64)
        for i in leads_idx:
            idx, valid = matches[i]
            f = (fvar.isel({lead_dim: i}) if lead_dim else fvar).isel(time=idx).transpose("time", "lat", "lon").values
            t = tvar.sel(time=valid).values
            for name, arr, path in (("forecast", f, forecast), ("truth", t, truth)):
                if not np.isfinite(arr).all():
                    raise ScoreError(
                        f"{name} {path}: {int((~np.isfinite(arr)).sum())} non-finite value(s) of {var!r} at lead "
                        f"{leads[i]:g} h; scores of NaN would be NaN (WeatherBench 2 treats it as an error too)"
                    )
            clim = None
            if needs_clim:
                clim = _climatology_at(cds[var], valid, climatology, var) if cds is not None else period_mean
            fields = weather.Fields(f, t, w, clim, batch_size)
            for metric in chosen:
                rows.append(
                    {
                        "variable": var,
                        "lead_time_hours": float(leads[i]),
                        "metric": metric.name,
                        "value": metric(fields),
                        "convention": conv.name,
                    }
                )
    return pd.DataFrame(rows, columns=COLUMNS)


def _open_all(forecast: str, truth: str, climatology: str | None, regrid: str | None):
    fds = open_fields(forecast, "forecast")
    tds = open_fields(truth, "truth")
    cds = open_fields(climatology, "climatology") if climatology else None
    for name, ds, path in (("forecast", fds, forecast), ("truth", tds, truth)):
        if "time" not in ds.dims:
            raise ScoreError(f"{name} {path} has no time dimension (dims: {dict(ds.sizes)})")
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
        df.to_csv(tmp, index=False, float_format="%.10g")
    return Path(output)
