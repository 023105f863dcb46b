"""A model folder called from Python: what `dchag predict` writes, returned as an xarray
Dataset. Each call runs the same functions as the command, into a temporary folder that is
removed once the result is in memory, so the two cannot differ."""

from __future__ import annotations

import tempfile
from pathlib import Path

import xarray as xr

from ..model.folder import Model


def _in_memory(store: Path) -> xr.Dataset:
    with xr.open_zarr(store, consolidated=False) as ds:
        return ds.load()


def forecast(
    model: Model,
    initial: xr.Dataset | str | Path | list,
    lead_hours: list[int],
    init_start: str | None = None,
    init_end: str | None = None,
    member: int | None = None,
    batch_size: int = 16,
) -> xr.Dataset:
    """``dchag predict --input``: forecasts at ``lead_hours`` from initial conditions in any
    layout the ERA5 preprocessing reads (a Dataset as a netCDF file of them would hold, or the
    files), in WeatherBench 2's layout (time, prediction_timedelta, latitude, longitude)."""
    from . import weather

    weather.check_leads(model, list(lead_hours))
    with tempfile.TemporaryDirectory(prefix="dchag-forecast-") as tmp:
        if isinstance(initial, xr.Dataset):
            paths = [str(Path(tmp) / "initial.nc")]
            initial.to_netcdf(paths[0])
        else:
            paths = [str(p) for p in (initial if isinstance(initial, list | tuple) else [initial])]
        inputs = weather.from_files(model, paths, init_start, init_end, member)
        return _in_memory(weather.forecast(model, inputs, list(lead_hours), str(Path(tmp) / "f.zarr"), batch_size))


def classify(model: Model, image: str | Path, key: str | None = None, batch_size: int = 512) -> xr.Dataset:
    """``dchag predict --image`` of a classifier: every pixel's class (label) and class
    probabilities of a scene file (ENVI, .mat, GeoTIFF, EnMAP/PRISMA/EMIT)."""
    from .hsi import classify_scene

    with tempfile.TemporaryDirectory(prefix="dchag-classify-") as tmp:
        return _in_memory(classify_scene(model, str(image), str(Path(tmp) / "c.zarr"), key, batch_size)["zarr"])


def reconstruct(model: Model, image: str | Path, key: str | None = None, batch_size: int = 16) -> xr.Dataset:
    """``dchag predict --image`` of a masked autoencoder: the reconstruction of every complete
    tile of a scene file, its mask and scores."""
    from .hsi import reconstruct_image

    with tempfile.TemporaryDirectory(prefix="dchag-reconstruct-") as tmp:
        return _in_memory(reconstruct_image(model, str(image), str(Path(tmp) / "r.zarr"), key, batch_size)["zarr"])
