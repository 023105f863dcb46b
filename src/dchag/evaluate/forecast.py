"""Forecast files in the WeatherBench 2 layout, for `dchag score` or any other scorer.

One variable per output channel, dims (time, prediction_timedelta, latitude, longitude):
``time`` is the initialisation time, ``prediction_timedelta`` a timedelta; physical units
(denormalised with the training statistics kept in the split store). Written for the trained
model and for the two reference forecasts, persistence and climatology, over the same
initialisation times; the truth file has the same variables over (time, latitude, longitude).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from tqdm.auto import tqdm

from .. import provenance
from ..store import InputError, open_store, select_channels, write_zarr


log = logging.getLogger(__name__)


class ForecastError(InputError):
    pass


def _open_split(store: str) -> xr.Dataset:
    if not Path(store).exists():
        raise ForecastError(f"Zarr store not found: {store}")
    return open_store(store)


def _times_and_step(ds: xr.Dataset, store: str) -> tuple[pd.DatetimeIndex, int]:
    times = pd.DatetimeIndex(ds.time.values)
    if len(times) < 2:
        raise ForecastError(f"{store} has {len(times)} time step(s); forecasts need at least two")
    step = int(round((times[1] - times[0]) / pd.Timedelta(hours=1)))
    return times, step


def init_indices(times: pd.DatetimeIndex, step_h: int, lead_hours: list[int], store: str) -> np.ndarray:
    """Initialisation times whose every lead stays inside the data, so each lead is scored over
    the same initialisations."""
    bad = [h for h in lead_hours if h <= 0 or h % step_h]
    if bad:
        raise ForecastError(f"lead time(s) {bad} h must be positive multiples of the {step_h} h time step of {store}")
    span = max(lead_hours) // step_h
    if span >= len(times):
        raise ForecastError(f"lead time {max(lead_hours)} h is beyond {store}, which spans {(len(times) - 1) * step_h} h "
                            f"({times[0]} to {times[-1]})")
    return np.arange(len(times) - span)


def _layout(values: dict[str, np.ndarray], init: pd.DatetimeIndex, lead_hours: list[int], lat, lon, attrs: dict) -> xr.Dataset:
    ds = xr.Dataset(
        {name: (("time", "prediction_timedelta", "latitude", "longitude"), v.astype(np.float32)) for name, v in values.items()},
        coords={
            "time": init.values,
            "prediction_timedelta": pd.to_timedelta(lead_hours, unit="h").values,
            "latitude": ("latitude", np.asarray(lat, np.float64), {"units": "degrees_north"}),
            "longitude": ("longitude", np.asarray(lon, np.float64), {"units": "degrees_east"}),
        },
        attrs=attrs,
    )
    return ds.chunk({"time": 64, "prediction_timedelta": 1})


def denormalised(store: str, variables: list[str]) -> xr.Dataset:
    """The split store's ``variables`` in physical units, (time, latitude, longitude), lazily."""
    ds = _open_split(store)
    names = [str(c) for c in ds.channel.values]
    select_channels(names, variables, store)
    out = xr.Dataset(coords={"time": ds.time.values})
    for v in variables:
        ch = ds.sel(channel=v)
        out[v] = (ch["data"] * ch["std"] + ch["mean"]).astype(np.float32).drop_vars(["channel", "mean", "std"], errors="ignore")
    return out.rename({"lat": "latitude", "lon": "longitude"}).transpose("time", "latitude", "longitude")


def write_truth(store: str, variables: list[str], output: str) -> Path:
    ds = denormalised(store, variables)
    ds.attrs = {"description": f"verifying fields from {store}, physical units",
                **provenance.as_attrs(provenance.record({"store": store, "variables": variables}))}
    write_zarr(ds.chunk({"time": 64}), output)
    return Path(output)


def baseline_forecast(kind: str, store: str, variables: list[str], lead_hours: list[int], output: str,
                      climatology: str | None = None) -> Path:
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
    attrs = {"forecast": kind, "source": store,
             **provenance.as_attrs(provenance.record({"kind": kind, "store": store, "lead_hours": lead_hours, "climatology": climatology}))}
    write_zarr(_layout(values, init, lead_hours, truth.latitude.values, truth.longitude.values, attrs), output)
    return Path(output)


def model_forecast(config: dict, run: str, checkpoint: str, store: str, lead_hours: list[int], output: str,
                   batch_size: int = 32) -> Path:
    """The trained model's forecasts from every initialisation time of ``store`` (a normalised
    split store) at each lead, on one device (the checkpoint's parallel layout is undone)."""
    # torch only here: the truth and the reference forecasts (a job each) run without it
    import torch

    from ..train.loading import load_trained

    cfg, task, model = load_trained(config, run, checkpoint, "forecast")
    trained = cfg.train.forecast.lead_hours
    outside = [h for h in lead_hours if not trained[0] <= h <= trained[-1]]
    if outside:
        log.warning("run %s was trained on lead times %s-%s h; %s h lie outside (extrapolation)", run, trained[0], trained[-1], outside)
    ds = _open_split(store)
    names = [str(c) for c in ds.channel.values]
    in_ids = select_channels(names, task.channels, store)
    out_ids = select_channels(names, task.outputs, store)
    times, step = _times_and_step(ds, store)
    idx = init_indices(times, step, lead_hours, store)
    mean = ds["mean"].values[out_ids].astype(np.float32)[None, :, None, None]
    std = ds["std"].values[out_ids].astype(np.float32)[None, :, None, None]
    data = ds["data"]
    out = np.empty((len(idx), len(lead_hours), len(out_ids), ds.sizes["lat"], ds.sizes["lon"]), np.float32)
    with torch.no_grad():
        for start in tqdm(range(0, len(idx), batch_size), desc=f"forecast {run}", unit="batch", mininterval=2):
            sel = idx[start:start + batch_size]
            x = torch.from_numpy(np.asarray(data.isel(time=sel, channel=in_ids).values, np.float32))
            for j, h in enumerate(lead_hours):
                pred = model(x, torch.full((len(sel),), float(h))).numpy()
                out[start:start + len(sel), j] = pred * std + mean
    values = {name: out[:, :, k] for k, name in enumerate(task.outputs)}
    attrs = {"forecast": "model", "run": run, "checkpoint": str(checkpoint), "source": store,
             **provenance.as_attrs(provenance.record(cfg.raw, checkpoint=str(checkpoint), lead_hours=lead_hours))}
    write_zarr(_layout(values, times[idx], lead_hours, ds.lat.values, ds.lon.values, attrs), output)
    return Path(output)
