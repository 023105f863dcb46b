"""ERA5 preprocessing on small netCDF files written by netCDF4: outputs, and every bad input."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from dchag.config import ConfigError, validate
from dchag.era5.climatology import climatology
from dchag.era5.preprocess import make_weights, preprocess_year
from dchag.era5.source import Era5InputError
from dchag.era5.split import build_split
from dchag.era5.statistics import normalization_stats
from dchag.grids import GridError, weatherbench_grid
from dchag.regrid.weights import RegridWeights, WeightsError
from dchag.store import InputError, open_store

CHANNELS = ["z500", "z850", "t500", "t850", "t2m", "u10", "lsm"]


def _no_leftovers(directory):
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name]


@pytest.fixture
def weights(era5_config, tmp_path):
    path = tmp_path / "w.nc"
    make_weights(era5_config["era5"], 2001, path)
    return path


def test_year_store_is_the_regridded_input(era5_config, era5_files, weights, tmp_path):
    out = preprocess_year(era5_config["era5"], 2001, weights, tmp_path / "2001.zarr")
    ds = open_store(out)
    assert ds.attrs["channel_names"] == CHANNELS
    assert ds.data.dims == ("time", "channel", "lat", "lon") and ds.data.shape == (10, 7, 32, 64)
    assert np.all(np.diff(ds.lat.values) > 0)  # ascending on output
    assert ds.level.values[:4].tolist() == [500, 850, 500, 850] and np.isnan(ds.level.values[4])
    assert json.loads(ds.attrs["provenance"])["packages"]["xarray"] == xr.__version__

    # Independently: read the netCDF with netCDF4 itself (unpacked), regrid with the matrix.
    w = RegridWeights.from_netcdf(weights, _grid(era5_files), weatherbench_grid(5.625))
    with netCDF4.Dataset(era5_files / "pressure_levels_2001.nc") as nc:
        level = list(nc["pressure_level"][:]).index(850)
        t850 = np.asarray(nc["t"][3, level], dtype=np.float64)
    expected = (w.matrix @ t850.ravel()).reshape(32, 64)
    assert np.allclose(ds.data.sel(channel="t850").isel(time=3).values, expected, rtol=1e-6)


def _grid(root):
    from dchag.grids import grid_of

    with xr.open_dataset(root / "constants.nc") as ds:
        return grid_of(ds)


def test_splits_are_normalised_with_training_statistics(era5_config, weights, tmp_path):
    years = {y: preprocess_year(era5_config["era5"], y, weights, tmp_path / f"{y}.zarr") for y in (2001, 2002, 2003)}
    stats = normalization_stats([years[2001]], tmp_path / "stats.json")
    train = open_store(build_split("train", [years[2001]], stats, tmp_path / "train.zarr"))
    test = open_store(build_split("test", [years[2003]], stats, tmp_path / "test.zarr"))
    x = train.data.values
    mean, std = x.mean(axis=(0, 2, 3)), x.std(axis=(0, 2, 3))
    varying = [c != "lsm" for c in CHANNELS]
    assert np.allclose(mean, 0, atol=1e-4) and np.allclose(std[varying], 1, atol=1e-4)
    # Denormalising with the stored coordinates gives back physical units.
    raw = open_store(years[2003]).data.values
    back = test.data * test["std"] + test["mean"]
    assert np.allclose(back.values, raw, rtol=1e-5, atol=1e-3)
    # One time step of one channel is one chunk, and shards group time steps.
    assert test.data.encoding["chunks"] == (1, 1, 32, 64)
    assert test.data.encoding["shards"][1:] == (7, 32, 64)
    assert test.attrs["split"] == "test" and test.attrs["years"] == [2003]

    clim = open_store(climatology([years[2003]], tmp_path / "clim.zarr"))
    assert clim["t850"].dims == ("dayofyear", "lat", "lon") and clim.sizes["dayofyear"] == 366
    assert np.allclose(clim["t850_time_mean"].values, raw[:, 3].mean(axis=0), rtol=1e-5)


def test_climatology_is_a_61_day_circular_window_and_leaves_unreached_days_empty(era5_config, weights, tmp_path):
    """Two years of the first 10 days each: the day-of-year mean over years, then a centred
    61-day window around the year (day 366 reaches days 1-30), NaN where no day is in reach."""
    stores = [preprocess_year(era5_config["era5"], y, weights, tmp_path / f"{y}.zarr") for y in (2001, 2002)]
    clim = open_store(climatology(stores, tmp_path / "clim.zarr"))
    raw = np.stack([open_store(s).data.sel(channel="t2m").values for s in stores])  # (year, day, lat, lon)
    per_day = raw.mean(axis=0).astype(np.float64)  # days 1..10, averaged over the two years
    got = clim["t2m"].values.astype(np.float64)
    for doy in (1, 5, 20, 40, 41, 200, 337, 340, 366):
        in_reach = [d for d in range(1, 11) if min(abs(doy - d), 366 - abs(doy - d)) <= 30]
        if in_reach:
            assert np.allclose(got[doy - 1], per_day[[d - 1 for d in in_reach]].mean(0), rtol=1e-5), doy
        else:
            assert np.isnan(got[doy - 1]).all(), doy
    assert not np.isnan(got[39]).any() and np.isnan(got[40]).all()  # day 40 reaches day 10, day 41 reaches none


def test_peak_memory_is_flat_in_time_steps(era5_files, tmp_path):
    """Streaming by time chunk: 3x the time steps, about the same peak (tracemalloc sees numpy)."""
    import tracemalloc

    from support.era5 import small_era5_config

    from dchag.era5 import demo

    peaks = {}
    for days in (12, 36):
        root = tmp_path / f"d{days}"
        for year in (2001, 2002, 2003):
            demo.write_year(root, year, 3.75, [500, 850], days=days if year == 2001 else 1)
        demo.write_constants(root, 3.75)
        cfg = small_era5_config(root)["era5"]
        make_weights(cfg, 2001, root / "w.nc")
        tracemalloc.start()
        preprocess_year(cfg, 2001, root / "w.nc", root / "out.zarr")
        peaks[days] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[36] < 1.3 * peaks[12], peaks


# -- bad input: a clear error naming the culprit, and no output that looks complete ----------
def _expect_failure(cfg, weights, out, exc, match):
    with pytest.raises(exc, match=match):
        preprocess_year(cfg, 2001, weights, out)
    assert not out.exists()
    assert _no_leftovers(out.parent) == []


def test_missing_input_file(era5_config, weights, tmp_path):
    era5_config["era5"]["inputs"][1] = str(tmp_path / "nowhere_{year}.nc")
    _expect_failure(era5_config["era5"], weights, tmp_path / "o.zarr", InputError, "nowhere_2001.nc")


def test_missing_variable(era5_config, weights, tmp_path):
    era5_config["era5"]["channels"]["single_level"].append("mean_sea_level_pressure")
    _expect_failure(era5_config["era5"], weights, tmp_path / "o.zarr", Era5InputError, "mean_sea_level_pressure")


def test_missing_pressure_level(era5_config, weights, tmp_path):
    era5_config["era5"]["channels"]["pressure_level"]["levels"].append(925)
    _expect_failure(
        era5_config["era5"], weights, tmp_path / "o.zarr", Era5InputError, r"925 hPa.*pressure_levels_2001.nc"
    )


def test_irregular_grid(era5_config, era5_files, weights, tmp_path):
    """Uneven latitudes are a Gaussian grid, which is read (tests/unit/era5/test_era5_inputs.py); uneven
    longitudes are refused."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("pressure_levels_2001.nc", "single_levels_2001.nc"):
        with xr.open_dataset(era5_files / name) as ds:
            lon = ds.longitude.values.copy()
            lon[1:-1] += np.linspace(0, 1.5, lon.size - 2)  # stretched, uneven spacing
            ds.assign_coords(longitude=lon).to_netcdf(bad / name)
    era5_config["era5"]["inputs"] = [str(bad / "pressure_levels_{year}.nc"), str(bad / "single_levels_{year}.nc")]
    era5_config["era5"]["channels"]["constants"] = []
    _expect_failure(era5_config["era5"], weights, tmp_path / "o.zarr", GridError, "longitudes must be evenly spaced")


def _with_nan(era5_files, tmp_path):
    bad = tmp_path / "nan"
    bad.mkdir()
    with xr.open_dataset(era5_files / "single_levels_2001.nc") as ds:
        ds = ds.load()
    t2m = ds.t2m.values.copy()
    t2m[7, 5, 10:13] = np.nan  # day 8: late in the year, after the first chunk was written
    ds["t2m"] = (ds.t2m.dims, t2m, ds.t2m.attrs)
    ds.to_netcdf(bad / "single_levels_2001.nc")
    return bad / "single_levels_{year}.nc"


def test_nan_fails_by_default(era5_config, era5_files, weights, tmp_path):
    era5_config["era5"]["inputs"][1] = str(_with_nan(era5_files, tmp_path))
    _expect_failure(era5_config["era5"], weights, tmp_path / "o.zarr", Era5InputError, r"3 NaN.*'t2m'.*2001-01-08")


def test_nan_fill_uses_the_zonal_mean(era5_config, era5_files, weights, tmp_path):
    era5_config["era5"]["inputs"][1] = str(_with_nan(era5_files, tmp_path))
    era5_config["era5"]["nan_policy"] = "fill"
    ds = open_store(preprocess_year(era5_config["era5"], 2001, weights, tmp_path / "o.zarr"))
    assert np.all(np.isfinite(ds.data.values)) and ds.attrs["nan_filled"] == 3


def test_truncated_netcdf(era5_config, era5_files, weights, tmp_path):
    cut = tmp_path / "cut"
    cut.mkdir()
    data = (era5_files / "single_levels_2001.nc").read_bytes()
    (cut / "single_levels_2001.nc").write_bytes(data[: len(data) // 2])
    era5_config["era5"]["inputs"][1] = str(cut / "single_levels_{year}.nc")
    _expect_failure(era5_config["era5"], weights, tmp_path / "o.zarr", InputError, "single_levels_2001.nc")


def test_corrupt_netcdf(era5_config, weights, tmp_path):
    (tmp_path / "single_levels_2001.nc").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 400)
    era5_config["era5"]["inputs"][1] = str(tmp_path / "single_levels_{year}.nc")
    _expect_failure(era5_config["era5"], weights, tmp_path / "o.zarr", InputError, "cannot read ERA5 input")


def test_weights_for_another_grid(era5_config, tmp_path):
    from support import REGRID_DATA

    other = REGRID_DATA / "xesmf_bilinear_global_2.5_to_wb_5.625.nc"
    _expect_failure(era5_config["era5"], other, tmp_path / "o.zarr", WeightsError, "xesmf_bilinear_global_2.5")


def test_misspelled_config_key(era5_config):
    era5_config["era5"]["nan_polcy"] = "fill"
    with pytest.raises(ConfigError, match=r"key 'era5'.*'nan_polcy' was unexpected"):
        validate(era5_config, "my.yaml")


def test_config_errors_name_the_key(era5_config, tmp_path):
    bad = {**era5_config, "era5": {**era5_config["era5"], "grid": "fine"}}
    with pytest.raises(ConfigError, match=r"key 'era5.grid'"):
        validate(bad, "c.yaml")
    bad = {**era5_config, "era5": {**era5_config["era5"], "inputs": [str(tmp_path / "x_{year}.nc")]}}
    with pytest.raises(ConfigError, match=r"x_2001.nc"):
        validate(bad, "c.yaml")
    years = {"train": [2001], "val": [2001], "test": [2003]}
    with pytest.raises(ConfigError, match=r"2001 is in both 'train' and 'val'"):
        validate({**era5_config, "era5": {**era5_config["era5"], "years": years}}, "c.yaml")


def test_interrupted_write_leaves_nothing(era5_config, weights, tmp_path, monkeypatch):
    """A crash after some chunks were written (here: KeyboardInterrupt) removes the partial store."""
    from dchag.era5 import source as src

    calls = {"n": 0}
    real = src.Era5Year.read

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(src.Era5Year, "read", flaky)
    out = tmp_path / "o.zarr"
    with pytest.raises(KeyboardInterrupt):
        preprocess_year(era5_config["era5"], 2001, weights, out)
    assert not out.exists() and _no_leftovers(tmp_path) == []


def test_time_subsampling_keeps_the_steps_on_the_configured_interval(tmp_path):
    """6-hourly inputs (CDS names: valid_time, pressure_level) read every 12 h: the store holds
    the 00 and 12 UTC fields themselves, not averages, and no other hour."""
    from support import LEVELS
    from support.era5 import small_era5_config

    from dchag.era5 import demo

    raw = tmp_path / "raw"
    for year in (2001, 2002, 2003):
        demo.write_year(raw, year, 3.75, LEVELS, time_step_hours=6, days=3)
    demo.write_constants(raw, 3.75)
    cfg = small_era5_config(raw)["era5"]
    make_weights(cfg, 2001, tmp_path / "w.nc")
    source = xr.open_dataset(raw / "single_levels_2001.nc")
    time_name = "valid_time" if "valid_time" in source.dims else "time"
    assert pd.DatetimeIndex(source[time_name].values).hour.unique().tolist() == [0, 6, 12, 18]
    for step, hours in ((12, [0, 12]), (24, [0]), (6, [0, 6, 12, 18])):
        cfg["time_step_hours"] = step
        ds = open_store(preprocess_year(cfg, 2001, tmp_path / "w.nc", tmp_path / f"o{step}.zarr"))
        times = pd.DatetimeIndex(ds.time.values)
        assert sorted(set(times.hour)) == hours and len(times) == 3 * len(hours), step
        # each kept step is the regridded input of that very time (read with netCDF4 itself)
        w = RegridWeights.from_netcdf(tmp_path / "w.nc", _grid(raw), weatherbench_grid(5.625))
        file_times = pd.DatetimeIndex(source[time_name].values)
        with netCDF4.Dataset(raw / "single_levels_2001.nc") as nc:
            for k in (1, len(times) - 1):
                field = np.asarray(nc["t2m"][file_times.get_loc(times[k])], dtype=np.float64)
                expected = (w.matrix @ field.ravel()).reshape(32, 64)
                assert np.allclose(ds.data.sel(channel="t2m").isel(time=k).values, expected, rtol=1e-6), (step, k)
