"""Forecast files in WeatherBench 2's layout, for `dchag score`, WeatherBench 2's evaluation
or any other scorer (:mod:`dchag.evaluate.wb2`).

Long variable names, pressure levels on ``level`` (hPa), dims (time, prediction_timedelta,
[level], latitude, longitude): ``time`` is the initialisation time, ``prediction_timedelta``
a timedelta; physical units (denormalised with the training statistics kept in the split
store); consolidated metadata, so ``xarray.open_zarr(path)`` opens them with its defaults.
Written for the trained model and for the two reference forecasts, persistence and
climatology, over the same initialisation times; the truth file holds every level of the
forecast variables over (time, [level], latitude, longitude).
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
from . import wb2

log = logging.getLogger(__name__)


class ForecastError(InputError):
    pass


def _open_split(store: str) -> xr.Dataset:
    if not Path(store).exists():
        raise ForecastError(f"Zarr store not found: {store}")
    return open_store(store)


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
    fields = denormalised(store, truth_channels(store, variables))
    ds = wb2.to_wb2({v: fields[v] for v in fields.data_vars})
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


def model_forecast(
    config: dict, run: str, checkpoint: str, store: str, lead_hours: list[int], output: str, batch_size: int
) -> Path:
    """The trained model's forecasts from every initialisation time of ``store`` (a normalised
    split store) at each lead, on one device (the checkpoint's parallel layout is undone)."""
    # torch only here: the truth and the reference forecasts (a job each) run without it
    import torch

    from ..train.loading import load_trained

    cfg, task, model = load_trained(config, run, checkpoint, "forecast")
    trained = cfg.train.forecast.lead_hours
    outside = [h for h in lead_hours if not trained[0] <= h <= trained[-1]]
    if outside:
        log.warning(
            "run %s was trained on lead times %s-%s h; %s h lie outside (extrapolation)",
            run,
            trained[0],
            trained[-1],
            outside,
        )
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
            sel = idx[start : start + batch_size]
            x = torch.from_numpy(np.asarray(data.isel(time=sel, channel=in_ids).values, np.float32))
            for j, h in enumerate(lead_hours):
                pred = model(x, torch.full((len(sel),), float(h))).numpy()
                if not np.isfinite(pred).all():
                    inputs = "finite" if np.isfinite(x.numpy()).all() else "not finite either"
                    raise ForecastError(
                        f"run {run}: the forecast from {times[idx[start]]} at {h} h has non-finite values "
                        f"(checkpoint {checkpoint}; its inputs from {store} are {inputs})"
                    )
                out[start : start + len(sel), j] = pred * std + mean
    values = {name: out[:, :, k] for k, name in enumerate(task.outputs)}
    attrs = {
        "forecast": "model",
        "run": run,
        "checkpoint": str(checkpoint),
        "source": store,
        **provenance.as_attrs(provenance.record(cfg.raw, checkpoint=str(checkpoint), lead_hours=lead_hours)),
    }
    forecast = forecast_dataset(values, times[idx], lead_hours, ds.lat.values, ds.lon.values, attrs)
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
