"""The download code's selection, run against a local Zarr store in ARCO-ERA5's layout."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from dchag.config import validate
from dchag.era5.download import cds_requests, download_arco
from dchag.era5.source import Era5InputError


@pytest.fixture
def arco_store(tmp_path):
    """ARCO-ERA5 layout: long names, dims time/level/latitude/longitude, hourly, all years in one store."""
    times = pd.date_range("2019-12-31", "2020-01-03 23:00", freq="1h")
    lat = np.linspace(90, -90, 19)
    lon = np.arange(0, 360, 10.0)
    levels = np.array([250, 500, 850, 1000])
    rng = np.random.default_rng(0)
    shape3 = (times.size, levels.size, lat.size, lon.size)
    shape2 = (times.size, lat.size, lon.size)
    ds = xr.Dataset(
        {
            "geopotential": (("time", "level", "latitude", "longitude"), rng.random(shape3, dtype=np.float32)),
            "temperature": (("time", "level", "latitude", "longitude"), rng.random(shape3, dtype=np.float32)),
            "2m_temperature": (("time", "latitude", "longitude"), rng.random(shape2, dtype=np.float32)),
            "land_sea_mask": (("time", "latitude", "longitude"), np.ones(shape2, np.float32)),
        },
        coords={"time": times, "level": levels, "latitude": lat, "longitude": lon},
    )
    path = tmp_path / "arco.zarr"
    ds.to_zarr(path, zarr_format=3, consolidated=False)
    return path, ds


def _cfg(levels=(500, 850)):
    return validate(
        {
            "name": "dl",
            "era5": {
                "download": "arco",
                "inputs": ["resources/era5/era5_{year}.nc"],
                "years": {"train": [2020], "val": [2021], "test": [2022]},
                "time_step_hours": 6,
                "channels": {
                    "pressure_level": {"variables": ["geopotential", "temperature"], "levels": list(levels)},
                    "single_level": ["2m_temperature"],
                    "constants": ["land_sea_mask"],
                },
            },
        }
    )["era5"]


def test_arco_selection_from_local_store(arco_store, tmp_path):
    path, full = arco_store
    out = download_arco(_cfg(), 2020, tmp_path / "era5_2020.nc", store=str(path))
    with xr.open_dataset(out) as ds:
        assert sorted(ds.data_vars) == ["2m_temperature", "geopotential", "land_sea_mask", "temperature"]
        times = pd.DatetimeIndex(ds.time.values)
        assert (times.year == 2020).all() and set(times.hour) == {0, 6, 12, 18} and times.size == 12
        assert ds.level.values.tolist() == [500, 850]
        expected = full.geopotential.sel(time="2020-01-02T06:00", level=850).values
        assert np.array_equal(ds.geopotential.sel(time="2020-01-02T06:00", level=850).values, expected)


def test_arco_missing_level_is_named(arco_store, tmp_path):
    path, _ = arco_store
    with pytest.raises(Era5InputError, match=r"pressure level\(s\) \[700\]"):
        download_arco(_cfg(levels=(500, 700)), 2020, tmp_path / "x.nc", store=str(path))
    assert not (tmp_path / "x.nc").exists()


def test_cds_requests():
    reqs = dict(cds_requests(_cfg(), 2020))
    pl = reqs["reanalysis-era5-pressure-levels"]
    assert pl["variable"] == ["geopotential", "temperature"] and pl["pressure_level"] == ["500", "850"]
    assert pl["time"] == ["00:00", "06:00", "12:00", "18:00"] and pl["year"] == ["2020"]
    assert reqs["reanalysis-era5-single-levels"]["variable"] == ["2m_temperature", "land_sea_mask"]
