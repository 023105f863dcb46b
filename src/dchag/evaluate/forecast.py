"""Forecast files in WeatherBench 2's layout, for `dchag score`, WeatherBench 2's evaluation
or any other scorer (:mod:`dchag.evaluate.wb2`).

Long variable names, pressure levels on ``level`` (hPa), dims (time, prediction_timedelta,
[level], latitude, longitude): ``time`` is the initialisation time, ``prediction_timedelta``
a timedelta; physical units (denormalised with the training statistics kept in the split
store); consolidated metadata, so ``xarray.open_zarr(path)`` opens them with its defaults.
The trained model's forecasts are written by ``dchag predict`` (:mod:`dchag.predict.weather`);
here the two reference forecasts, persistence and climatology, over the same initialisation
times (:func:`init_indices`); the truth file holds every level of the
forecast variables over (time, [level], latitude, longitude).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .. import provenance
from ..store import InputError, open_store, select_channels, write_zarr
from . import wb2
from .weather import LAND_SEA

log = logging.getLogger(__name__)


class ForecastError(InputError):
    pass


def _open_split(store: str) -> xr.Dataset:
    if not Path(store).exists():
        raise ForecastError(f"Zarr store not found: {store}")
    ds = open_store(store)
    shards = ds["data"].encoding.get("shards") if "data" in ds else None
    # a dask task per shard's time steps of a channel, not per chunk (one step of one channel):
    # the demo's truth and baseline forecasts read their fields 6x faster
    return open_store(store, chunks={"time": shards[0]}) if shards else ds


def _times_and_step(ds: xr.Dataset, store: str) -> tuple[pd.DatetimeIndex, int]:
    from ..train.data import DataError, time_step_hours

    times = pd.DatetimeIndex(ds.time.values)
    if len(times) < 2:
        raise ForecastError(f"{store} has {len(times)} time step(s); forecasts need at least two")
    try:
        return times, time_step_hours(times, store)
    except DataError as err:
        raise ForecastError(str(err)) from None


def init_indices(times: pd.DatetimeIndex, step_h: int, lead_hours: list[int], store: str) -> np.ndarray:
    """Initialisation times whose every lead's valid time is in the data (matched by
    timestamp, so a gap is never spanned), so each lead is scored over the same
    initialisations."""
    from ..train.data import lead_pairs

    bad = [h for h in lead_hours if h <= 0 or h % step_h]
    if bad:
        raise ForecastError(f"lead time(s) {bad} h must be positive multiples of the {step_h} h time step of {store}")
    anchors, _ = lead_pairs(times, np.asarray(lead_hours))
    if anchors.size == 0:
        raise ForecastError(
            f"lead time {max(lead_hours)} h is beyond {store}: no initialisation has a valid time at every lead "
            f"({len(times)} steps, {times[0]} to {times[-1]})"
        )
    return anchors


def forecast_dataset(
    values: dict[str, np.ndarray], init: pd.DatetimeIndex, lead_hours: list[int], lat, lon, attrs: dict
) -> xr.Dataset:
    coords = {
        "time": init.values,
        "prediction_timedelta": pd.to_timedelta(lead_hours, unit="h").values,
        "latitude": np.asarray(lat, np.float64),
        "longitude": np.asarray(lon, np.float64),
    }
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    ds = wb2.to_wb2({name: xr.DataArray(v.astype(np.float32), dims=dims, coords=coords) for name, v in values.items()})
    ds.attrs = attrs
    return ds.chunk({"time": 64, "prediction_timedelta": 1})


def denormalised(store: str, variables: list[str]) -> xr.Dataset:
    """The split store's ``variables`` in physical units, (time, latitude, longitude), lazily."""
    ds = _open_split(store)
    names = [str(c) for c in ds.channel.values]
    select_channels(names, variables, store)
    out = xr.Dataset(coords={"time": ds.time.values})
    for v in variables:
        ch = ds.sel(channel=v)
        out[v] = (
            (ch["data"] * ch["std"] + ch["mean"])
            .astype(np.float32)
            .drop_vars(["channel", "mean", "std"], errors="ignore")
        )
    return out.rename({"lat": "latitude", "lon": "longitude"}).transpose("time", "latitude", "longitude")


def truth_channels(store: str, variables: list[str]) -> list[str]:
    """The channels a truth file holds for ``variables``: every level the store has of each
    pressure-level variable among them (a complete ``level`` dimension), and the others."""
    names = [str(c) for c in _open_split(store).channel.values]
    select_channels(names, variables, store)
    wanted = {wb2.split_channel(v)[0] for v in variables}
    return [
        n
        for n in names
        if n in variables or (wb2.split_channel(n)[1] is not None and wb2.split_channel(n)[0] in wanted)
    ]


def write_truth(store: str, variables: list[str], output: str) -> Path:
    """The verifying fields of ``variables`` in physical units, in WeatherBench 2's layout, with
    the land-sea mask (``land_sea_mask``, static) where the store has one: the land and sea
    regions of `dchag score`."""
    names = truth_channels(store, variables)
    mask = LAND_SEA in _open_split(store).channel.values and LAND_SEA not in names
    fields = denormalised(store, names + [LAND_SEA] * mask)
    static = {LAND_SEA: fields[LAND_SEA].isel(time=0, drop=True).clip(0, 1)} if mask else {}  # float32 round trip
    ds = wb2.to_wb2({v: fields[v] for v in names} | static)
    ds.attrs = {
        "description": f"verifying fields from {store}, physical units",
        **provenance.as_attrs(provenance.record({"store": store, "variables": variables})),
    }
    write_zarr(ds.chunk({"time": 64}), output, kind="truth")
    return Path(output)


def baseline_forecast(
    kind: str, store: str, variables: list[str], lead_hours: list[int], output: str, climatology: str | None = None
) -> Path:
    """Persistence (the state at initialisation, for every lead) or climatology (the day-of-year
    climatology at the valid time)."""
    truth = denormalised(store, variables)
    times, step = _times_and_step(truth, store)
    idx = init_indices(times, step, lead_hours, store)
    init = times[idx]
    values = {}
    if kind == "persistence":
        for v in variables:
            now = truth[v].isel(time=idx).values
            values[v] = np.repeat(now[:, None], len(lead_hours), axis=1)
    elif kind == "climatology":
        if not climatology:
            raise ForecastError("a climatology forecast needs --climatology (a store from `dchag era5-climatology`)")
        from .score import _climatology_at, open_fields

        clim = open_fields(climatology, "climatology")
        for v in variables:
            if v not in clim.data_vars:
                raise ForecastError(f"variable {v!r} is missing from the climatology {climatology}")
            per_lead = [_climatology_at(clim[v], init + pd.Timedelta(hours=h), climatology, v) for h in lead_hours]
            values[v] = np.stack(per_lead, axis=1)
    else:
        raise ForecastError(f"baseline {kind!r}: expected persistence or climatology")
    attrs = {
        "forecast": kind,
        "source": store,
        **provenance.as_attrs(
            provenance.record({"kind": kind, "store": store, "lead_hours": lead_hours, "climatology": climatology})
        ),
    }
    forecast = forecast_dataset(values, init, lead_hours, truth.latitude.values, truth.longitude.values, attrs)
    write_zarr(forecast, output, kind="forecast")
    return Path(output)


def wb2_climatology(climatology: str, output: str) -> Path:
    """The pipeline's climatology store (`dchag era5-climatology`) in WeatherBench 2's layout:
    what WB2's ACC and `dchag score` read at each valid time."""
    from ..store import day_of_year_encoding, open_any

    src = open_any(str(climatology), "climatology", normalise_names=False)
    ds = wb2.climatology(src)
    ds.attrs.update(
        {
            "source": str(climatology),
            **provenance.as_attrs(provenance.record({"climatology": str(climatology)})),
        }
    )
    write_zarr(ds.chunk(-1), output, encoding=day_of_year_encoding(ds), kind="wb2-climatology")
    return Path(output)
