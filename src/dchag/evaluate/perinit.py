"""The per-initialisation statistics `dchag score` keeps, and its scores recomputed from them.

Every metric of :data:`dchag.evaluate.weather.SCORING` is a function of per-initialisation
statistics (:data:`dchag.evaluate.weather.STATISTICS`: the latitude-weighted squared error;
for ACC the anomaly product, the anomalies' squared norms and, under ``climax``, their means).
`dchag score` writes them beside its CSV as netCDF in WeatherBench 2's layout: one variable
per WB2 variable (``geopotential``, ``2m_temperature``), pressure levels on ``level``, dims
``(statistic, region, lead_time, init_time[, level])``, ``lead_time`` a timedelta as WB2
writes it, ``init_time`` the forecasts' initialisation times; the attributes name the
convention, the metrics and the ClimaX batch size. The CSV is :func:`table` of this file, so
every score can be recomputed (and resampled over initialisation times, as `dchag
compare-scores` does) from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from ..store import InputError, atomic_path
from . import wb2, weather

log = logging.getLogger(__name__)

STATISTIC, REGION, LEAD, INIT = "statistic", "region", "lead_time", "init_time"
COLUMNS = ["variable", "lead_time_hours", "region", "metric", "value", "convention"]


def dataset(
    values: dict[str, np.ndarray],
    statistics: list[str],
    regions: list[str],
    lead_hours: list[float],
    inits: pd.DatetimeIndex,
    convention: str,
    metrics: list[str],
    batch_size: int | None,
) -> xr.Dataset:
    """The per-init statistics of each channel (``values[channel]``: statistic, region, lead,
    init) as a dataset in WB2's layout."""
    coords = {
        STATISTIC: statistics,
        REGION: regions,
        LEAD: pd.to_timedelta(np.asarray(lead_hours, np.float64), unit="h"),
        INIT: inits.values,
    }
    fields = {name: xr.DataArray(v, dims=(STATISTIC, REGION, LEAD, INIT), coords=coords) for name, v in values.items()}
    ds = wb2.to_wb2(fields)
    for s in statistics:  # what each statistic is
        ds.attrs[f"statistic_{s}"] = weather.STATISTICS[s]
    ds.attrs.update(
        convention=convention,
        metrics=" ".join(metrics),
        climax_batch_size=int(batch_size or 0),  # 0: all initialisation times in one batch
        description="per-initialisation statistics of dchag score; its CSV is a function of them",
    )
    return ds


def write(ds: xr.Dataset, output: str | Path) -> Path:
    with atomic_path(output) as tmp:
        ds.to_netcdf(tmp, engine="netcdf4")
    return Path(output)


def open_statistics(path: str | Path) -> xr.Dataset:
    """A file :func:`write` wrote, one variable per dchag channel (``z500``); anything else is
    an InputError naming the file and what it lacks."""
    if not Path(path).exists():
        raise InputError(f"per-initialisation statistics not found: {path}")
    try:
        ds = xr.load_dataset(path)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {path}: {err}") from None
    lacking = [k for k in ("convention", "metrics", "climax_batch_size") if k not in ds.attrs]
    lacking += [d for d in (STATISTIC, REGION, LEAD, INIT) if d not in ds.dims]
    if lacking:
        raise InputError(f"{path} is not a dchag score statistics file: it lacks {', '.join(lacking)}")
    try:
        weather.convention(ds.attrs["convention"]).select(ds.attrs["metrics"].split())
    except weather.WeatherScoreError as err:
        raise InputError(f"{path}: attribute convention/metrics: {err}") from None
    return wb2.channels(ds)


def metrics(ds: xr.Dataset) -> list[weather.Metric]:
    return weather.convention(ds.attrs["convention"]).select(ds.attrs["metrics"].split())


def batch_size(ds: xr.Dataset) -> int | None:
    return int(ds.attrs["climax_batch_size"]) or None


def lead_hours(ds: xr.Dataset) -> np.ndarray:
    return ds[LEAD].values / np.timedelta64(1, "h")


def series(da: xr.DataArray, region: str, lead: int) -> dict[str, np.ndarray]:
    """One channel's statistics at one region and lead index: name -> (init,) values."""
    part = da.sel({REGION: region}).isel({LEAD: lead}).transpose(STATISTIC, INIT)
    return {str(s): part.values[i] for i, s in enumerate(part[STATISTIC].values)}


def table(ds: xr.Dataset) -> pd.DataFrame:
    """The scores of every channel, lead, region and metric computed from the statistics (in
    either layout; the CSV of `dchag score`); an undefined ACC is NaN, with a warning."""
    ds = wb2.channels(ds)
    conv, chosen, batch = ds.attrs["convention"], metrics(ds), batch_size(ds)
    rows = []
    for var in sorted(ds.data_vars):
        for i, lead in enumerate(lead_hours(ds)):
            for region in ds[REGION].values:
                s = series(ds[var], str(region), i)
                for metric in chosen:
                    value = metric(s, batch)
                    if np.isnan(value) and region == "global":  # only an ACC can be: the inputs are finite
                        log.warning(
                            "%s of %r at lead %g h is undefined and written as NaN (as WeatherBench 2 gives it): "
                            "the forecast's or the truth's anomaly has no variance (a constant field, or a "
                            "forecast equal to the climatology)",
                            metric.name.upper(),
                            var,
                            lead,
                        )
                    rows.append(
                        {
                            "variable": str(var),
                            "lead_time_hours": float(lead),
                            "region": str(region),
                            "metric": metric.name,
                            "value": value,
                            "convention": conv,
                        }
                    )
    return pd.DataFrame(rows, columns=COLUMNS)
