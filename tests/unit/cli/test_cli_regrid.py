"""`dchag regrid` as a user runs it: any lat/lon names and order, extra dims kept."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from dchag.grids import LatLonGrid, weatherbench_grid
from dchag.regrid.weights import RegridWeights


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "dchag", "regrid", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return proc


def _field(lat, lon, t):
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    return np.cos(la) * np.sin(2 * lo + 0.3 * t) + 0.01 * np.rad2deg(la)


@pytest.fixture
def source_file(tmp_path):
    lat = np.linspace(90, -90, 73)  # descending, as ERA5
    lon = np.arange(144) * 2.5
    times = pd.date_range("2020-01-01", periods=5, freq="6h")
    data = np.stack([_field(lat, lon, t) for t in range(5)]).astype(np.float32)
    ds = xr.Dataset(
        {
            "t2m": (("time", "latitude", "longitude"), data, {"units": "K"}),
            "station_count": (("time",), np.arange(5)),
        },
        coords={"time": times, "latitude": lat, "longitude": lon},
    )
    path = tmp_path / "in.nc"
    ds.to_netcdf(path)
    return path


@pytest.mark.parametrize("out_name", ["out.nc", "out.zarr"])
def test_regrid_cli(source_file, tmp_path, out_name):
    out = tmp_path / out_name
    weights = tmp_path / "w.nc"
    run(
        str(source_file),
        "--grid",
        "5.625",
        "--weights",
        str(weights),
        "--backend",
        "builtin",
        "--time-chunk",
        "2",
        "--output",
        str(out),
    )
    ds = xr.open_zarr(out, consolidated=False) if out_name.endswith(".zarr") else xr.open_dataset(out)
    wb = weatherbench_grid(5.625)
    assert ds.t2m.dims == ("time", "latitude", "longitude") and ds.t2m.shape == (5, 32, 64)
    assert np.allclose(ds.latitude.values, wb.lat) and np.allclose(ds.longitude.values, wb.lon)
    assert ds.station_count.values.tolist() == [0, 1, 2, 3, 4]
    assert ds.t2m.attrs["units"] == "K" and ds.attrs["regrid_method"] == "bilinear"
    # Against the weights applied to the full field directly.
    src = LatLonGrid(np.linspace(90, -90, 73), np.arange(144) * 2.5)
    w = RegridWeights.from_netcdf(weights, src, wb)
    with xr.open_dataset(source_file) as raw:
        expected = w.apply(raw.t2m.values.astype(np.float64))
    assert np.allclose(ds.t2m.values, expected, atol=1e-6)
    # The reused weights file gives the same result.
    run(str(source_file), "--grid", "5.625", "--weights", str(weights), "--output", str(tmp_path / "again.nc"))
    with xr.open_dataset(tmp_path / "again.nc") as again:
        assert np.allclose(again.t2m.values, ds.t2m.values)


def test_regrid_cli_conservative_and_lat_names(tmp_path):
    lat = np.arange(-89.5, 90, 1.0)
    lon = np.arange(0, 360, 1.0)
    ds = xr.Dataset({"tp": (("lat", "lon"), np.ones((180, 360)))}, coords={"lat": lat, "lon": lon})
    ds.to_netcdf(tmp_path / "in.nc")
    run(str(tmp_path / "in.nc"), "--grid", "5.625", "--method", "conservative", "--output", str(tmp_path / "o.nc"))
    with xr.open_dataset(tmp_path / "o.nc") as out:
        assert out.tp.dims == ("lat", "lon") and np.allclose(out.tp.values, 1.0)


def test_regrid_cli_errors_are_one_line(tmp_path):
    proc = run(str(tmp_path / "missing.nc"), "--grid", "5.625", "--output", str(tmp_path / "o.nc"), check=False)
    assert proc.returncode == 2 and "missing.nc" in proc.stderr and "Traceback" not in proc.stderr
    proc = run(str(tmp_path / "missing.nc"), "--grid", "5.5", "--output", str(tmp_path / "o.nc"), check=False)
    assert proc.returncode == 2
    ds = xr.Dataset(
        {"x": (("lat", "lon"), np.zeros((10, 10)))}, coords={"lat": np.arange(10.0), "lon": np.arange(10.0)}
    )
    ds.to_netcdf(tmp_path / "regional.nc")
    proc = run(str(tmp_path / "regional.nc"), "--grid", "5.625", "--output", str(tmp_path / "o.nc"), check=False)
    assert proc.returncode == 2 and "not global in longitude" in proc.stderr
    assert not (tmp_path / "o.nc").exists()
