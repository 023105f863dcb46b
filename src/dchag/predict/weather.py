"""Forecasts from a trained model (a run or a model folder) for given initialisation times:
a date range of a store (hindcasts over a period into one store), or a user's own initial
conditions in any input layout the pipeline's ERA5 preprocessing reads, regridded and
normalised as in training. Written in physical units in WeatherBench 2's layout
(:mod:`dchag.evaluate.wb2`).

Under torchrun the model runs in the run's layout (:mod:`dchag.predict.layout`): each
tensor-parallel group forecasts its share of the initialisation times and rank 0 writes.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dask.array as da
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import provenance
from ..model.folder import Model
from ..store import absent_chunks, atomic_path, compressors, open_any, open_store
from ..train.data import ChunkReader
from ..vocabulary import Task
from .layout import PredictError, lay_out

log = logging.getLogger(__name__)


@dataclass
class InitialConditions:
    """Physical-unit fields (time, channel, lat, lon) in the model's channel order."""

    times: pd.DatetimeIndex
    read: object  # callable: indices -> np.ndarray (n, C, H, W) float32, physical units
    source: str


def _check_grid(model: Model, lat, lon, source: str) -> None:
    grid = model.meta["grid"]
    same = (len(lat), len(lon)) == (len(grid["latitude"]), len(grid["longitude"]))
    if not same or not (
        np.allclose(lat, grid["latitude"], atol=1e-6) and np.allclose(lon, grid["longitude"], atol=1e-6)
    ):
        raise PredictError(
            f"{source} is on a {len(lat)}x{len(lon)} grid, the model on its {len(grid['latitude'])}x"
            f"{len(grid['longitude'])} {grid.get('resolution')} deg grid; give files to be regridded (--input)"
        )


def _between(times: pd.DatetimeIndex, start: str | None, end: str | None) -> np.ndarray:
    """Which of ``times`` lie between ``start`` and ``end`` (inclusive; None: open)."""
    keep = np.ones(len(times), bool)
    if start:
        keep &= times >= pd.Timestamp(start)
    if end:
        keep &= times <= pd.Timestamp(end)
    return keep


def from_store(
    model: Model, store: str, start: str | None = None, end: str | None = None, verified_at: list[int] | None = None
) -> InitialConditions:
    """Initial conditions from a dchag store: a normalised split store (its own statistics
    undone) or a per-year store in physical units, between ``start`` and ``end`` (inclusive).
    ``verified_at`` (lead hours): only the times whose valid time at every one of these leads
    is in the store too, so that each lead is scored against it over the same initialisations."""
    ds = open_store(store)
    names = [str(c) for c in ds.channel.values]
    wanted = model.channel_names()
    missing = [c for c in wanted if c not in names]
    if missing:
        raise PredictError(f"store {store} lacks channel(s) {missing} the model reads (it has {', '.join(names)})")
    _check_grid(model, ds.lat.values, ds.lon.values, f"store {store}")
    times = pd.DatetimeIndex(ds.time.values)
    keep = _between(times, start, end)
    if verified_at:
        from ..evaluate.forecast import init_indices

        verified = np.zeros(len(times), bool)
        verified[init_indices(times, model.meta["lead_hours"]["time_step_hours"], verified_at, store)] = True
        keep &= verified
    idx_all = np.flatnonzero(keep)
    if idx_all.size == 0:
        raise PredictError(f"store {store} has no time step between {start} and {end} ({times[0]} to {times[-1]})")
    ids = [names.index(c) for c in wanted]
    normalised = "mean" in ds.coords and "std" in ds.coords
    mean = ds["mean"].values[ids].astype(np.float32)[None, :, None, None] if normalised else 0.0
    std = ds["std"].values[ids].astype(np.float32)[None, :, None, None] if normalised else 1.0
    # the training loader's reader: a batch's chunks in one concurrent read (through xarray and
    # dask, 20x slower: a year at 5.625 deg took 29 s instead of 1.5)
    reader = ChunkReader(store, "data")

    def read(indices):
        (x,) = reader.read((idx_all[indices], np.asarray(ids), slice(None), slice(None)))
        if not np.isfinite(x).all():
            lost = absent_chunks(store, "data", idx_all[indices])
            if lost:
                raise PredictError(
                    f"store {store}: the file(s) {', '.join(lost[:4])} of variable 'data' (time steps from "
                    f"{times[idx_all[indices][0]]}) are missing; zarr reads them as NaN: recreate the store"
                )
        return x * std + mean

    return InitialConditions(times[idx_all], read, f"store {store}")


def _input_years(paths: list[str], start: str | None, end: str | None) -> list[int]:
    """The years the initial conditions lie in: from the files' time coordinates (netCDF,
    Zarr), or from --init-start/--init-end (GRIB files, whose times the reader finds)."""
    from ..store import is_grib

    if start and end:
        return list(range(pd.Timestamp(start).year, pd.Timestamp(end).year + 1))
    if any(is_grib(p) for p in paths):
        raise PredictError(f"{', '.join(paths)}: give --init-start and --init-end for GRIB initial conditions")
    years = set()
    for p in paths:
        ds = open_any(p, "initial conditions")
        if "time" not in ds.coords:
            raise PredictError(f"{p} has no time coordinate ('time' or 'valid_time'); give --init-start/--init-end")
        times = pd.DatetimeIndex(np.atleast_1d(ds["time"].values))
        years |= set(times.year.tolist())
        ds.close()
    return sorted(
        y for y in years if (not start or y >= pd.Timestamp(start).year) and (not end or y <= pd.Timestamp(end).year)
    )


def from_files(
    model: Model, paths: list[str], start: str | None = None, end: str | None = None, member: int | None = None
) -> InitialConditions:
    """A user's own initial conditions: files in any layout the ERA5 preprocessing reads,
    regridded onto the model's grid and converted as the training data were (the model's
    ``era5`` section, with these files as its inputs); the time-invariant channels come from
    the model folder. ``member``: the ensemble member to read from files that hold several. The
    entry point into the preprocessing is its per-year job (``preprocess_year``) and its weights
    (``make_weights``) alone."""
    from ..config import validate
    from ..era5.preprocess import make_weights, preprocess_year
    from ..era5.source import channels_from_config

    model.require(Task.FORECAST)
    era5 = copy.deepcopy(model.meta["data"]["era5"])
    constants = [c.name for c in channels_from_config(era5) if c.variable.kind == "constant"]
    absent = [c for c in constants if c not in model.constants]
    if absent:
        raise PredictError(f"{model.source} holds no field of the constant channel(s) {absent}")
    era5.update(inputs=[str(p) for p in paths], constants=None, demo=False, download=None, member=member)
    era5["channels"]["constants"] = []
    # Re-validated by this dchag's schema: keys a newer reader adds take their defaults.
    era5 = validate({"name": "predict", "era5": era5}, "the model's era5 section", check_files=False)["era5"]
    years = _input_years(paths, start, end)
    if not years:
        raise PredictError(f"{', '.join(paths)}: no time step between {start} and {end}")
    fields = []
    with tempfile.TemporaryDirectory(prefix="dchag-predict-") as tmp:
        weights = Path(tmp) / "weights.nc"
        make_weights(era5, years[0], weights)
        for y in years:  # the per-year job keeps the steps on the model's time step
            fields.append(open_store(preprocess_year(era5, y, weights, Path(tmp) / f"{y}.zarr")).load())
    import xarray as xr

    ds = xr.concat(fields, dim="time")
    times = pd.DatetimeIndex(ds.time.values)
    keep = _between(times, start, end)
    if not keep.any():
        raise PredictError(f"{', '.join(paths)}: no time step between {start} and {end} on the model's time step")
    ds = ds.isel(time=np.flatnonzero(keep))
    times = times[keep]
    _check_grid(model, ds.lat.values, ds.lon.values, "the regridded inputs")
    names = [str(c) for c in ds.channel.values]
    data = ds["data"].values
    shape = (len(times), *data.shape[2:])
    columns = [
        data[:, names.index(c)] if c in names else np.broadcast_to(model.constants[c], shape)
        for c in model.channel_names()
    ]
    cube = np.stack(columns, axis=1).astype(np.float32)
    return InitialConditions(times, lambda indices: cube[indices], ", ".join(paths))


def _forecast_batch(run, model, inputs, sel, lead_hours, mean_all, std_all, mean, std) -> np.ndarray:
    """(time, lead, output, lat, lon) forecasts in physical units from initial times ``sel``."""
    x = (inputs.read(sel) - mean_all) / std_all
    if not np.isfinite(x).all():
        raise PredictError(f"{inputs.source}: the initial conditions at {inputs.times[sel[0]]}.. are not finite")
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    per_lead = []
    for h in lead_hours:
        pred = run(xt, torch.full((len(sel),), float(h), device=run.device)).numpy()
        if not np.isfinite(pred).all():
            raise PredictError(f"{model.source}: the forecast from {inputs.times[sel[0]]} at {h} h is not finite")
        per_lead.append(pred * std + mean)
    return np.stack(per_lead, axis=1)


def check_leads(model: Model, lead_hours: list[int]) -> None:
    """Lead times this forecast model can make: positive multiples of its time step, each once
    (checked before any input is read)."""
    model.require(Task.FORECAST)
    step = model.meta["lead_hours"]["time_step_hours"]
    twice = sorted({h for h in lead_hours if lead_hours.count(h) > 1})
    if twice:
        raise PredictError(f"lead time(s) {twice} h given more than once")
    bad = [h for h in lead_hours if h <= 0 or h % step]
    if bad:
        raise PredictError(f"lead time(s) {bad} h: the model steps {step} h; give positive multiples of it")


def forecast(
    model: Model, inputs: InitialConditions, lead_hours: list[int], output: str, batch_size: int = 16
) -> Path | None:
    """Forecasts from every initial condition at each lead, in physical units, written to
    ``output`` (WB2 layout); under torchrun rank 0 writes and returns the path."""
    from ..evaluate.forecast import forecast_dataset

    check_leads(model, lead_hours)
    lo, hi = model.meta["lead_hours"]["trained"]
    outside = [h for h in lead_hours if not lo <= h <= hi]
    if outside:
        log.warning(
            "%s was trained on lead times %s-%s h; %s h lie outside (extrapolation)", model.source, lo, hi, outside
        )
    run = lay_out(model)
    mean_all = np.asarray(model.meta["normalisation"]["mean"], np.float32)[None, :, None, None]
    std_all = np.asarray(model.meta["normalisation"]["std"], np.float32)[None, :, None, None]
    names = model.channel_names()
    out_ids = [names.index(o) for o in model.meta["outputs"]]
    mean, std = mean_all[:, out_ids], std_all[:, out_ids]
    grid = model.meta["grid"]
    attrs = {
        "forecast": "model",
        "model": model.source,
        "initial_conditions": inputs.source,
        **provenance.as_attrs(
            provenance.record(
                {"model": model.meta.get("provenance"), "lead_hours": lead_hours, "inputs": inputs.source}
            )
        ),
    }
    outputs, lat, lon = model.meta["outputs"], grid["latitude"], grid["longitude"]

    def dataset(values, times):
        return forecast_dataset(values, times, lead_hours, lat, lon, attrs)

    # Rounds of one batch per share of the work: rank 0 writes each round's forecasts into the
    # store as they come (memory: one round, however long the period), then renames it into place.
    n = len(inputs.times)
    starts = list(range(0, n, batch_size))
    rounds = [starts[i : i + run.shares] for i in range(0, len(starts), run.shares)]
    width = batch_size * run.shares  # the store's time chunk: each round fills whole chunks
    with atomic_path(output, "forecast") if run.writer else contextlib.nullcontext() as tmp, torch.no_grad():
        if run.writer:
            shape = (n, len(lead_hours), len(lat), len(lon))
            empty = {o: da.zeros(shape, dtype=np.float32, chunks=(width, 1, len(lat), len(lon))) for o in outputs}
            template = dataset(empty, inputs.times).chunk({"time": width, "prediction_timedelta": 1})
            encoding = {v: {"compressors": compressors()} for v in template.data_vars}
            template.to_zarr(tmp, zarr_format=3, consolidated=False, compute=False, mode="w", encoding=encoding)
        for batches in tqdm(rounds, desc="forecast", unit="round", disable=not run.writer, mininterval=1):
            part = {}
            if run.share_rank < len(batches):
                sel = np.arange(batches[run.share_rank], min(batches[run.share_rank] + batch_size, n))
                part[int(sel[0])] = _forecast_batch(run, model, inputs, sel, lead_hours, mean_all, std_all, mean, std)
            part = run.gather(part)
            if not run.writer:
                continue
            a, b = batches[0], min(batches[-1] + batch_size, n)
            cube = np.concatenate([part[k] for k in sorted(part)])  # (time, lead, output, lat, lon)
            region = dataset({o: cube[:, :, k] for k, o in enumerate(outputs)}, inputs.times[a:b])
            fixed = [c for c in region.coords if "time" not in region[c].dims]
            region = region.drop_vars(fixed).drop_attrs().load()  # numpy: whole chunks of the store
            region.to_zarr(tmp, region={"time": slice(a, b)}, consolidated=False)
    if not run.writer:
        return None
    return Path(output)
