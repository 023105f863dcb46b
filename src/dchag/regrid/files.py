"""``dchag regrid``: regrid every lat-lon variable of a netCDF file or Zarr store.

Lazy and chunked: only the source rows the weights touch are read, block by block along
the other dimensions, so memory stays bounded however long the file is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr
from dask.diagnostics import ProgressBar

from .. import provenance
from ..grids import grid_of, lat_lon_names, weatherbench_grid
from ..store import atomic_path, open_any, write_zarr
from .backends import load_or_build


def regrid_file(
    input_path: str,
    output: str,
    resolution: float,
    method: str = "bilinear",
    weights_file: str | None = None,
    backend: str = "auto",
    time_chunk: int = 8,
) -> Path:
    ds = open_any(input_path, "input file", normalise_names=False)
    lat_name, lon_name = lat_lon_names(ds, input_path)
    source = grid_of(ds, input_path, uneven_lat=True)  # a regular Gaussian source too
    target = weatherbench_grid(resolution)
    weights = load_or_build(source, target, method, weights_file, backend)
    rows = xr.DataArray(weights.source_rows, dims=lat_name)
    out = xr.Dataset(attrs=dict(ds.attrs))
    for name, da in ds.data_vars.items():
        if lat_name not in da.dims or lon_name not in da.dims:
            out[name] = da
            continue
        lead = [d for d in da.dims if d not in (lat_name, lon_name)]
        da = da.transpose(*lead, lat_name, lon_name).isel({lat_name: rows})
        da = da.chunk({d: (time_chunk if i == 0 else -1) for i, d in enumerate(lead)} | {lat_name: -1, lon_name: -1})
        regridded = xr.apply_ufunc(
            weights.apply_rows,
            da,
            input_core_dims=[[lat_name, lon_name]],
            output_core_dims=[["__lat", "__lon"]],
            exclude_dims={lat_name, lon_name},
            dask="parallelized",
            output_dtypes=[np.float32 if da.dtype.itemsize <= 4 else np.float64],
            dask_gufunc_kwargs={"output_sizes": {"__lat": target.shape[0], "__lon": target.shape[1]}},
            keep_attrs=True,
        )
        out[name] = regridded.rename({"__lat": lat_name, "__lon": lon_name})
    out = out.assign_coords(
        {lat_name: (lat_name, target.lat, ds[lat_name].attrs), lon_name: (lon_name, target.lon, ds[lon_name].attrs)}
    )
    out.attrs.update(
        regrid_method=method,
        regrid_source_grid=source.describe(),
        regrid_target_grid=f"WeatherBench {resolution} deg: {target.describe()}",
        regrid_weights_origin=weights.origin,
        **provenance.as_attrs(
            provenance.record({"input": input_path, "grid": resolution, "method": method, "backend": backend})
        ),
    )
    with ProgressBar(minimum=2):
        if output.rstrip("/").endswith(".zarr"):
            write_zarr(out, output, kind="regridded")
        else:
            with atomic_path(output) as tmp:
                out.drop_encoding().to_netcdf(tmp)
    ds.close()
    return Path(output)
