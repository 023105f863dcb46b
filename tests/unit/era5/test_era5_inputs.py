"""ERA5 inputs as people download them: real GRIB files, GRIB written by ecCodes (editions 1
and 2, regular lat-lon and Gaussian, monthly files holding pressure and single levels), the
netCDF cfgrib writes, WeatherBench 2 and other on-grid stores, other reanalyses' conventions
and units. Values are checked against ecCodes' own decoding (or the written arrays) and the
regridding matrix; every unusable file stops with a DchagError naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from support.era5_layouts import (
    REAL_ERA5_GRIB,
    REAL_T_PL_GRIB,
    cfgrib_netcdf,
    field,
    gaussian_latitudes,
    grib_fields,
    write_grib,
    write_wb2_store,
)

from dchag.config import ConfigError, era5_input_paths, validate
from dchag.era5.preprocess import make_weights, preprocess_year
from dchag.era5.source import Era5InputError, Era5Year, inputs_on_target_grid
from dchag.era5.units import GRAVITY, UnitsError
from dchag.errors import DchagError
from dchag.grids import GridError, LatLonGrid, weatherbench_grid
from dchag.plan import Plan
from dchag.regrid.weights import RegridWeights
from dchag.store import InputError, open_store

WB = weatherbench_grid(5.625)


def era5_section(inputs, years=(2001, 2002, 2003), levels=(500, 850), pl=("geopotential", "temperature"), **extra):
    train, val, test = years
    cfg = {
        "inputs": [str(p) for p in inputs],
        "years": {"train": [train], "val": [val], "test": [test]},
        "time_step_hours": 6,
        "channels": {
            "pressure_level": {"variables": list(pl), "levels": list(levels)},
            "single_level": [],
            "constants": [],
        },
        "regrid": {"method": "bilinear", "backend": "builtin"},
        "time_chunk": 4,
    }
    for key, value in extra.items():
        if key in ("single_level", "constants"):
            cfg["channels"][key] = value
        else:
            cfg[key] = value
    return validate({"name": "inputs", "era5": cfg}, "test config", check_files=False)["era5"]


def _weights(era5, year, tmp_path, source_grid):
    path = tmp_path / "w.nc"
    make_weights(era5, year, path)
    return path, RegridWeights.from_netcdf(path, source_grid, WB)


# -- the real ERA5 GRIB: an ensemble, edition 1 -------------------------------------------------
def test_real_era5_grib_ensemble_refuses_without_a_member_and_lists_them():
    era5 = era5_section([REAL_ERA5_GRIB], years=(2017, 2018, 2019), levels=(500,))
    with pytest.raises(
        Era5InputError, match=r"era5-levels-members.grib is an ensemble of 10 members \(number = 0, 1, 2"
    ):
        Era5Year(era5, 2017)
    era5["member"] = 12
    with pytest.raises(Era5InputError, match=r"era5.member 12 is not a member of .*era5-levels-members.grib"):
        Era5Year(era5, 2017)


def test_real_era5_grib_member_reads_as_eccodes_decodes_it(tmp_path):
    era5 = era5_section([REAL_ERA5_GRIB], years=(2017, 2018, 2019), levels=(850, 500), member=3, time_step_hours=12)
    source = Era5Year(era5, 2017)
    try:
        assert [c.name for c in source.channels] == ["z850", "z500", "t850", "t500"]
        assert source.grid.shape == (61, 120) and source.grid.lat[0] == 90
        assert list(source.times) == list(pd.date_range("2017-01-01", periods=4, freq="12h"))
        rows = np.arange(61)
        reference = {
            (f["shortName"], f["level"], f["time"]): f["values"]
            for f in grib_fields(REAL_ERA5_GRIB)
            if f["number"] == 3
        }
        for ch in source.channels:
            got = source.read(ch, source.times, rows)
            for k, t in enumerate(source.times):
                np.testing.assert_array_equal(
                    got[k], reference[(ch.variable.short_name, ch.level, t)].astype(np.float32)
                )
    finally:
        source.close()
    # and through the regridding: the store holds the matrix applied to ecCodes' values
    wpath, w = _weights(era5, 2017, tmp_path, LatLonGrid(np.linspace(90, -90, 61), np.arange(120) * 3.0))
    ds = open_store(preprocess_year(era5, 2017, wpath, tmp_path / "2017.zarr"))
    z500 = reference[("z", 500, pd.Timestamp("2017-01-02 12:00"))].astype(np.float64)
    np.testing.assert_allclose(ds.data.sel(channel="z500").isel(time=3).values, w.apply(z500), rtol=1e-6)
    assert ds.attrs["ensemble_member"] == 3 and ds.attrs["units_converted"] == "none"


def test_real_single_step_grib_and_its_level_order():
    """t_pl.grib: one time step (cfgrib gives a scalar time), levels 1000 -> 300, a 30 deg grid."""
    era5 = era5_section([REAL_T_PL_GRIB], years=(2018, 2019, 2020), levels=(300, 1000), pl=("temperature",))
    source = Era5Year(era5, 2018)
    try:
        assert list(source.times) == [pd.Timestamp("2018-08-01 12:00")]
        ref = {f["level"]: f["values"] for f in grib_fields(REAL_T_PL_GRIB)}
        for ch in source.channels:
            np.testing.assert_array_equal(
                source.read(ch, source.times, np.arange(7))[0], ref[ch.level].astype(np.float32)
            )
    finally:
        source.close()


def test_cfgrib_netcdf_of_the_real_grib_reads_like_the_grib(tmp_path):
    """cfgrib's netCDF: reference `time`, `valid_time` and `step`, `isobaricInhPa`, `number`
    (today's main: `ValueError: the new name 'time' conflicts`)."""
    nc = cfgrib_netcdf(REAL_ERA5_GRIB, tmp_path / "era5-levels-members.nc")
    with xr.open_dataset(nc) as raw:
        assert {"time", "valid_time", "step", "isobaricInhPa", "number"} <= set(raw.variables)
    kwargs = dict(years=(2017, 2018, 2019), levels=(500, 850), member=7, time_step_hours=12)
    from_nc, from_grib = (
        Era5Year(era5_section([nc], **kwargs), 2017),
        Era5Year(era5_section([REAL_ERA5_GRIB], **kwargs), 2017),
    )
    try:
        assert list(from_nc.times) == list(from_grib.times)
        for ch in from_nc.channels:
            np.testing.assert_array_equal(
                from_nc.read(ch, from_nc.times, np.arange(61)), from_grib.read(ch, from_grib.times, np.arange(61))
            )
    finally:
        from_nc.close()
        from_grib.close()


# -- GRIB written by ecCodes: editions, grids, monthly files with both kinds of level -----------------
def _monthly_gribs(root, years, edition, grid):
    """One file per month ({year}_{month}.grib), each holding z and t on two pressure levels and
    2 m temperature and 10 m wind (a CDS request for both datasets, as MARS returns it), the
    first day of the month at 00 and 06 UTC; and a constants file (land-sea mask)."""
    for year in years:
        for month in range(1, 13):
            times = [pd.Timestamp(year, month, 1, h) for h in (0, 6)]
            msgs = [(p, lv, t) for t in times for p, lv in ((129, 500), (129, 850), (130, 500), (130, 850))]
            msgs += [(p, None, t) for t in times for p in (167, 165)]
            write_grib(root / f"era5_{year}_{month:02d}.grib", msgs, edition=edition, grid=grid)
    write_grib(root / "constants.grib", [(172, None, pd.Timestamp(years[0], 1, 1))], edition=edition, grid=grid)


@pytest.mark.parametrize("edition", [1, 2])
@pytest.mark.parametrize("grid", ["regular_ll", "regular_gg"])
def test_written_grib_monthly_files_both_kinds_of_level(edition, grid, tmp_path):
    _monthly_gribs(tmp_path, [2001], edition, grid)
    era5 = era5_section(
        [tmp_path / "era5_{year}_{month}.grib"],
        single_level=["2m_temperature", "10m_u_component_of_wind"],
        constants=["land_sea_mask"],
    )
    era5["constants"] = str(tmp_path / "constants.grib")
    source = Era5Year(era5, 2001)
    grid_ = source.grid
    source.close()
    if grid == "regular_gg":  # ecCodes' N32 latitudes are the Gauss-Legendre ones
        np.testing.assert_allclose(grid_.lat, gaussian_latitudes(32), atol=1e-6)
    wpath, w = _weights(era5, 2001, tmp_path, grid_)
    ds = open_store(preprocess_year(era5, 2001, wpath, tmp_path / "2001.zarr"))
    assert ds.attrs["channel_names"] == ["z500", "z850", "t500", "t850", "t2m", "u10", "lsm"]
    assert ds.sizes["time"] == 24 and pd.DatetimeIndex(ds.time.values)[-1] == pd.Timestamp("2001-12-01 06:00")
    ref = {
        (f["paramId"], f["level"] if f["typeOfLevel"] == "isobaricInhPa" else None, f["time"]): f["values"]
        for f in grib_fields(tmp_path / "era5_2001_07.grib")
    }
    t = pd.Timestamp("2001-07-01 06:00")
    for ch, key in (("z850", (129, 850, t)), ("t500", (130, 500, t)), ("t2m", (167, None, t))):
        expected = w.apply(ref[key].astype(np.float32).astype(np.float64))
        np.testing.assert_allclose(ds.data.sel(channel=ch, time=t).values, expected, rtol=1e-6)
    assert ds.attrs["source_grid"] == grid_.describe()


def test_one_file_per_pressure_level(tmp_path):
    """MARS and CDS requests are often made per level: each channel is found in its own file;
    a level in no file is refused, naming the files and the levels they hold."""
    times = [pd.Timestamp("2001-01-01") + pd.Timedelta(hours=6 * i) for i in range(3)]
    files = [write_grib(tmp_path / f"t{lv}.grib", [(130, lv, t) for t in times]) for lv in (500, 850)]
    source = Era5Year(era5_section(files, pl=("temperature",)), 2001)
    assert {c.name: [Path(p.path) for p in source.where[c.name]] for c in source.channels} == {
        "t500": [files[0]],
        "t850": [files[1]],
    }
    lat, lon = source.grid.lat, source.grid.lon
    for ch in source.channels:
        got = source.read(ch, source.times, np.arange(lat.size))
        want = np.stack([field(130, int(ch.name[1:]), t, lat, lon) for t in times])
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5)
    source.close()
    with pytest.raises(Era5InputError, match=r"pressure level 700 hPa .* not in .*t500.grib; available: 500"):
        Era5Year(era5_section(files, pl=("temperature",), levels=(500, 700)), 2001)


def test_grib_with_forecast_steps_is_read_by_valid_time_and_its_cfgrib_netcdf_is_refused(tmp_path):
    """Fields stored as reference time + step (ERA5's accumulations are): GRIB by valid time; the
    netCDF cfgrib writes of it by default has a (time, step) valid_time, refused with the way out."""
    import eccodes

    grib = tmp_path / "fc.grib"
    with open(grib, "wb") as out:
        for day in (1, 2):
            for step in (6, 12):
                h = eccodes.codes_grib_new_from_samples("regular_ll_sfc_grib2")
                for key, value in (
                    ("Ni", 36),
                    ("Nj", 19),
                    ("latitudeOfFirstGridPointInDegrees", 90.0),
                    ("latitudeOfLastGridPointInDegrees", -90.0),
                    ("longitudeOfLastGridPointInDegrees", 350.0),
                    ("iDirectionIncrementInDegrees", 10.0),
                    ("jDirectionIncrementInDegrees", 10.0),
                    ("paramId", 167),
                    ("dataDate", 20010100 + day),
                    ("dataTime", 0),
                    ("stepRange", str(step)),
                    ("bitsPerValue", 24),
                ):
                    eccodes.codes_set(h, key, value)
                eccodes.codes_set_values(h, np.full(19 * 36, 270.0 + 10 * day + step))
                eccodes.codes_write(h, out)
                eccodes.codes_release(h)
    era5 = era5_section([grib], pl=(), levels=(), single_level=["2m_temperature"])
    era5["channels"].pop("pressure_level")
    source = Era5Year(era5, 2001)
    try:
        expected = pd.DatetimeIndex(["2001-01-01 06:00", "2001-01-01 12:00", "2001-01-02 06:00", "2001-01-02 12:00"])
        assert list(source.times) == list(expected)
        got = source.read(source.channels[0], source.times, np.arange(19))[:, 0, 0]
        np.testing.assert_array_equal(got, [286, 292, 296, 302])
    finally:
        source.close()
    nc = cfgrib_netcdf(grib, tmp_path / "fc.nc")
    era5["inputs"] = [str(nc)]
    with pytest.raises(InputError, match=r"fc.nc holds forecast-style times \(valid_time over time, step\)"):
        Era5Year(era5, 2001)


# -- inputs already on the target grid ---------------------------------------------------------
def _wb2(tmp_path):
    times = pd.DatetimeIndex([t for y in (2001, 2002, 2003) for t in pd.date_range(f"{y}-03-01", periods=6, freq="6h")])
    path = tmp_path / "1959-2023_01_10-6h-64x32_equiangular_conservative.zarr"
    return path, write_wb2_store(path, times)


def test_weatherbench2_store_is_passed_through_exactly(tmp_path):
    path, wb2 = _wb2(tmp_path)
    era5 = era5_section(
        [path],
        levels=(850, 500),
        single_level=["2m_temperature", "10m_u_component_of_wind"],
        constants=["land_sea_mask"],
    )
    assert inputs_on_target_grid(era5)
    assert Plan({"name": "wb2", "era5": era5}).era5_weights is None  # no weights job
    ds = open_store(preprocess_year(era5, 2002, None, tmp_path / "2002.zarr"))
    assert ds.attrs["channel_names"] == ["z850", "z500", "t850", "t500", "t2m", "u10", "lsm"]
    assert ds.attrs["regrid_method"] == "none" and "values copied" in ds.attrs["regrid_weights_origin"]
    year = wb2.sel(time=wb2.time.dt.year == 2002)
    for ch, expected in (
        ("z500", year.geopotential.sel(level=500)),
        ("t850", year.temperature.sel(level=850)),
        ("t2m", year["2m_temperature"]),
        ("lsm", year.land_sea_mask.expand_dims(time=year.time)),
    ):
        np.testing.assert_array_equal(
            ds.data.sel(channel=ch).values, expected.transpose("time", "latitude", "longitude")
        )
    np.testing.assert_array_equal(ds.lat.values, WB.lat)


@pytest.mark.parametrize("edition", [1, 2])
def test_grib_on_the_target_grid_is_passed_through_in_both_editions(tmp_path, edition):
    """Edition 1 stores coordinates in millidegrees (87.1875 is 87.188): still the target grid."""
    import eccodes

    path = tmp_path / f"wb{edition}.grib"
    times = pd.date_range("2001-01-01", periods=2, freq="6h")
    rng = np.random.default_rng(edition)
    fields = {}
    with open(path, "wb") as out:
        for t in times:
            h = eccodes.codes_grib_new_from_samples(f"regular_ll_pl_grib{edition}")
            for key, value in (
                ("Ni", 64),
                ("Nj", 32),
                ("latitudeOfFirstGridPointInDegrees", 87.1875),
                ("latitudeOfLastGridPointInDegrees", -87.1875),
                ("longitudeOfFirstGridPointInDegrees", 0.0),
                ("longitudeOfLastGridPointInDegrees", 354.375),
                ("iDirectionIncrementInDegrees", 5.625),
                ("jDirectionIncrementInDegrees", 5.625),
                ("level", 500),
                ("paramId", 130),
                ("dataDate", int(t.strftime("%Y%m%d"))),
                ("dataTime", int(t.strftime("%H%M"))),
                ("bitsPerValue", 24),
            ):
                eccodes.codes_set(h, key, value)
            eccodes.codes_set_values(h, rng.uniform(250, 300, 64 * 32))
            fields[t] = eccodes.codes_get_values(h).reshape(32, 64)[::-1]  # north to south in GRIB
            eccodes.codes_write(h, out)
            eccodes.codes_release(h)
    era5 = era5_section([path], years=(2001, 2002, 2003), levels=(500,), pl=("temperature",))
    era5["regrid"]["inputs_on_grid"] = True
    ds = open_store(preprocess_year(era5, 2001, None, tmp_path / "2001.zarr"))
    assert ds.attrs["regrid_method"] == "none"
    np.testing.assert_array_equal(ds.lat.values, WB.lat)
    for t in times:
        np.testing.assert_array_equal(ds.data.sel(channel="t500", time=t).values, fields[t].astype(np.float32))


def test_own_store_on_the_target_grid_in_another_order_is_reordered_exactly(tmp_path):
    """Latitude north to south and longitude -180..180 on the 5.625 deg points: copied, reordered."""
    times = pd.date_range("2002-01-01", periods=4, freq="6h")
    lat, lon = WB.lat[::-1], WB.lon - 180.0
    rng = np.random.default_rng(1)
    t = rng.normal(250, 10, (4, 2, 32, 64)).astype(np.float32)
    xr.Dataset(
        {"t": (("time", "level", "lat", "lon"), t, {"units": "K"})},
        coords={"time": times, "level": [500, 850], "lat": lat, "lon": lon},
    ).to_netcdf(tmp_path / "mine.nc")
    era5 = era5_section([tmp_path / "mine.nc"], pl=("temperature",))
    assert inputs_on_target_grid(era5)
    ds = open_store(preprocess_year(era5, 2002, None, tmp_path / "o.zarr"))
    expected = t[:, 1, ::-1][..., np.argsort(np.mod(lon, 360))]
    np.testing.assert_array_equal(ds.data.sel(channel="t850").values, expected)


def test_inputs_said_to_be_on_the_grid_but_not_are_refused(tmp_path):
    _monthly_gribs(tmp_path, [2001], 2, "regular_ll")
    era5 = era5_section([tmp_path / "era5_{year}_{month}.grib"], regrid={"backend": "builtin", "inputs_on_grid": True})
    assert Plan({"name": "x", "era5": era5}).era5_weights is None
    with pytest.raises(
        Era5InputError,
        match=r"era5_2001_01.grib is on grid 19x36.*needs regridding weights.*inputs_on_grid is not true",
    ):
        preprocess_year(era5, 2001, None, tmp_path / "o.zarr")
    assert not (tmp_path / "o.zarr").exists()


# -- other reanalyses' conventions, units ------------------------------------------------------
def _ncep_like(path, *, z_units="m", t_units="degC", t_name="air"):
    """NCEP/MERRA-like: variables named by the centre (hgt, air) and known by CF standard name,
    geopotential height in metres and temperature in degrees Celsius, latitude north to south on
    a 2.5 deg grid, longitude -180..177.5, levels in millibar."""
    lat, lon = np.linspace(90, -90, 73), np.arange(-180, 180, 2.5)
    times = pd.date_range("2001-01-01", periods=3, freq="6h")
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    hgt = np.stack([[5500 + 300 * np.cos(la) * np.sin(lo + k), 1500 + 100 * np.sin(la)] for k in range(3)])
    air = np.stack([[-20 + 30 * np.cos(la) + k, 5 + 20 * np.cos(la) * np.cos(2 * lo)] for k in range(3)])
    attrs_z = {"standard_name": "geopotential_height", **({"units": z_units} if z_units else {})}
    xr.Dataset(
        {
            "hgt": (("time", "level", "lat", "lon"), hgt.astype(np.float32), attrs_z),
            t_name: (
                ("time", "level", "lat", "lon"),
                air.astype(np.float32),
                {"standard_name": "air_temperature", "units": t_units},
            ),
        },
        coords={"time": times, "level": ("level", [500.0, 850.0], {"units": "millibar"}), "lat": lat, "lon": lon},
    ).to_netcdf(path)
    return LatLonGrid(lat, lon), hgt, air


def test_other_reanalysis_conventions_and_units_are_converted(tmp_path):
    grid, hgt, air = _ncep_like(tmp_path / "ncep.nc")
    era5 = era5_section([tmp_path / "ncep.nc"])
    wpath, w = _weights(era5, 2001, tmp_path, grid)
    ds = open_store(preprocess_year(era5, 2001, wpath, tmp_path / "o.zarr"))
    z500 = hgt[2, 0].astype(np.float32).astype(np.float64) * GRAVITY  # gpm -> m**2 s**-2
    t850 = air[1, 1].astype(np.float32).astype(np.float64) + 273.15  # degC -> K
    np.testing.assert_allclose(ds.data.sel(channel="z500").isel(time=2).values, w.apply(z500), rtol=1e-6)
    np.testing.assert_allclose(ds.data.sel(channel="t850").isel(time=1).values, w.apply(t850), rtol=1e-6)
    notes = "\n".join(ds.attrs["units_converted"])
    assert "z500: 'hgt' in" in notes and "x 9.80665" in notes and "degC -> K" in notes
    assert ds.attrs["channel_units"][:2] == ["m**2 s**-2", "m**2 s**-2"]


def test_units_that_do_not_convert_are_refused_naming_file_variable_and_unit(tmp_path):
    _ncep_like(tmp_path / "bad.nc", t_units="furlong")
    with pytest.raises(
        UnitsError,
        match=r"'air' \(temperature\) in .*bad.nc: units 'furlong' are not ones dchag can read; expected 'K'",
    ):
        Era5Year(era5_section([tmp_path / "bad.nc"]), 2001)
    _ncep_like(tmp_path / "wrong.nc", t_units="m s-1")
    with pytest.raises(UnitsError, match=r"'air' \(temperature\) in .*wrong.nc: units 'm s-1' do not convert to 'K'"):
        Era5Year(era5_section([tmp_path / "wrong.nc"]), 2001)
    _ncep_like(tmp_path / "none.nc", z_units=None)
    with pytest.raises(
        UnitsError, match=r"'hgt' \(geopotential\) in .*none.nc has no units attribute; expected 'm\*\*2 s\*\*-2'"
    ):
        Era5Year(era5_section([tmp_path / "none.nc"]), 2001)
    # declared in the config instead: read and converted
    source = Era5Year(era5_section([tmp_path / "none.nc"], units={"z": "gpm"}), 2001)
    assert source.where["z500"][0].units.scale == GRAVITY
    source.close()


def test_units_spelled_differently_are_the_same(tmp_path):
    """ERA5's spellings and CF's for the catalogue's units need no conversion at all."""
    from dchag.era5.units import conversion

    for found, expected in (
        ("m2 s-2", "m**2 s**-2"),
        ("m^2/s^2", "m**2 s**-2"),
        ("m/s", "m s**-1"),
        ("kg/kg", "kg kg**-1"),
        ("1", "(0 - 1)"),
        ("kelvin", "K"),
    ):
        assert conversion(found, expected, "x", "f").identity, found
    assert conversion("hPa", "Pa", "mean_sea_level_pressure", "f").scale == 100
    assert conversion("%", "(0 - 1)", "land_sea_mask", "f").scale == pytest.approx(0.01)
    assert conversion("g kg**-1", "kg kg**-1", "specific_humidity", "f").scale == pytest.approx(0.001)
    assert conversion("mm", "m", "total_precipitation", "f").scale == pytest.approx(0.001)


def test_variables_are_found_by_grib_param_id(tmp_path):
    """A file whose variables carry neither ERA5's names nor a standard name, only GRIB_paramId."""
    times = pd.date_range("2001-01-01", periods=2, freq="6h")
    xr.Dataset(
        {
            "var130": (
                ("time", "level", "latitude", "longitude"),
                np.full((2, 1, 32, 64), 250.0, np.float32),
                {"GRIB_paramId": 130, "units": "K"},
            )
        },
        coords={"time": times, "level": [500], "latitude": WB.lat, "longitude": WB.lon},
    ).to_netcdf(tmp_path / "p.nc")
    source = Era5Year(era5_section([tmp_path / "p.nc"], pl=("temperature",), levels=(500,)), 2001)
    assert source.where["t500"][0].name == "var130"
    source.close()


# -- inputs that cannot be used: one DchagError naming the file ----------------------------------
def test_reduced_gaussian_grib_is_refused(tmp_path):
    grib = write_grib(tmp_path / "rgg.grib", [(130, 500, pd.Timestamp("2001-01-01"))], grid="reduced_gg")
    with pytest.raises(GridError, match=r"rgg.grib is not rectilinear.*reduced_gg grid.*regular Gaussian grid"):
        Era5Year(era5_section([grib], pl=("temperature",), levels=(500,)), 2001)


def test_truncated_and_empty_grib_are_named(tmp_path):
    _monthly_gribs(tmp_path, [2001], 1, "regular_ll")
    data = (tmp_path / "era5_2001_03.grib").read_bytes()
    (tmp_path / "era5_2001_03.grib").write_bytes(data[: len(data) // 3 + 7])  # mid-message
    (tmp_path / "empty.grib").write_bytes(b"")
    for inputs, name in (
        ([tmp_path / "era5_{year}_{month}.grib"], "era5_2001_03.grib"),
        ([tmp_path / "empty.grib"], "empty.grib"),
    ):
        with pytest.raises(DchagError, match=name):
            source = Era5Year(era5_section(inputs), 2001)
            for ch in source.channels:
                source.read(ch, source.times, np.arange(19))


def test_grib_lacking_a_variable_names_it_and_the_file(tmp_path):
    _monthly_gribs(tmp_path, [2001], 2, "regular_ll")
    era5 = era5_section([tmp_path / "era5_{year}_{month}.grib"], pl=("specific_humidity",))
    with pytest.raises(
        Era5InputError,
        match=r"'specific_humidity' \(short name 'q', GRIB paramId 133\) not found in .*era5_2001_01.grib",
    ):
        Era5Year(era5, 2001)


def test_a_time_in_two_files_and_an_extra_dimension_are_refused(tmp_path):
    _monthly_gribs(tmp_path, [2001], 2, "regular_ll")
    shutil.copy(tmp_path / "era5_2001_02.grib", tmp_path / "again.grib")
    era5 = era5_section([tmp_path / "era5_{year}_{month}.grib", tmp_path / "again.grib"])
    with pytest.raises(
        Era5InputError,
        match=r"2001-02-01 00:00:00 of 'z' \(z500\) is in more than one input: .*era5_2001_02.grib, .*again.grib",
    ):
        Era5Year(era5, 2001)
    times = pd.date_range("2001-01-01", periods=2, freq="6h")
    xr.Dataset(
        {
            "t": (
                ("time", "expver", "level", "latitude", "longitude"),
                np.ones((2, 2, 1, 32, 64), np.float32),
                {"units": "K"},
            )
        },
        coords={"time": times, "expver": [1, 5], "level": [500], "latitude": WB.lat, "longitude": WB.lon},
    ).to_netcdf(tmp_path / "expver.nc")
    with pytest.raises(Era5InputError, match=r"'t' in .*expver.nc has dimension\(s\) expver.*ERA5T"):
        Era5Year(era5_section([tmp_path / "expver.nc"], pl=("temperature",), levels=(500,)), 2001)


def test_a_deterministic_file_read_for_another_member_is_refused(tmp_path):
    grib = write_grib(tmp_path / "det.grib", [(130, 500, pd.Timestamp("2001-01-01"))], edition=1)
    with pytest.raises(Era5InputError, match=r"'t' in .*det.grib holds ensemble member 0 only, but era5.member is 4"):
        Era5Year(era5_section([grib], pl=("temperature",), levels=(500,), member=4), 2001)


# -- input paths: monthly files and globs ------------------------------------------------------
def test_monthly_and_glob_input_paths(tmp_path):
    for name in ("a_2001.grib", "a_2002.grib", "b_2001_x.nc"):
        (tmp_path / name).touch()
    era5 = {
        "inputs": [str(tmp_path / "m_{year}_{month}.grib"), str(tmp_path / "a_*.grib"), str(tmp_path / "b_{year}_*.nc")]
    }
    paths = era5_input_paths(era5, 2001)
    assert paths[:12] == [str(tmp_path / f"m_2001_{m:02d}.grib") for m in range(1, 13)]
    assert paths[12:] == [str(tmp_path / "a_2001.grib"), str(tmp_path / "a_2002.grib"), str(tmp_path / "b_2001_x.nc")]
    cfg = {"name": "m", "era5": {**era5_section([tmp_path / "m_{year}_{month}.grib"])}}
    with pytest.raises(ConfigError, match=r"m_2001_01.grib\n.*m_2001_02.grib"):
        validate(cfg, "c.yaml")
    cfg["era5"]["download"] = "arco"
    with pytest.raises(ConfigError, match=r"no '\{month\}' or wildcard"):
        validate(cfg, "c.yaml", check_files=True)


def test_field_helper_is_what_the_written_grib_holds(tmp_path):
    """The written GRIB holds the analytic field to ecCodes' 24-bit packing."""
    t = pd.Timestamp("2001-01-01")
    grib = write_grib(tmp_path / "f.grib", [(129, 500, t)], edition=2)
    lat, lon = np.linspace(90, -90, 19), np.arange(36) * 10.0
    expected = field(129, 500, t, lat, lon)
    np.testing.assert_allclose(grib_fields(grib)[0]["values"], expected, atol=1e-6 * np.ptp(expected) * 16)


# -- through the pipeline: snakemake --configfile ----------------------------------------------
def _snakemake(workdir, config: dict, *args):
    import yaml
    from support.commands import snakemake

    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return snakemake(workdir, *args, configfile=path)


@pytest.mark.parametrize("layout", ["grib", "cfgrib-netcdf"])
def test_real_era5_grib_through_the_pipeline(tmp_path, layout):
    """The real ERA5 GRIB (member 0 of 10) as the training year, GRIB written by ecCodes on the
    same 3 deg grid as the validation and test years: weights, year stores, statistics, split
    stores and climatology, by `snakemake --configfile`; the same from the netCDF files cfgrib
    writes of them (``number``, ``time`` + ``valid_time`` + ``step``, ``isobaricInhPa``)."""
    grib = tmp_path / "grib"
    grib.mkdir()
    shutil.copy(REAL_ERA5_GRIB, grib / "era5_2017.grib")
    for year in (2018, 2019):
        times = pd.date_range(f"{year}-01-01", periods=4, freq="12h")
        msgs = [(p, lv, t) for t in times for p in (129, 130) for lv in (850, 500)]
        write_grib(grib / f"era5_{year}.grib", msgs, edition=1, resolution=3.0)
    inputs = "grib/era5_{year}.grib"
    if layout == "cfgrib-netcdf":
        for year in (2017, 2018, 2019):
            cfgrib_netcdf(grib / f"era5_{year}.grib", grib / f"era5_{year}.nc")
            (grib / f"era5_{year}.grib").unlink()
        inputs = "grib/era5_{year}.nc"
        assert {"number", "time", "isobaricInhPa"} <= set(xr.open_dataset(grib / "era5_2017.nc").dims)
    era5 = {
        "inputs": [inputs],
        "member": 0,
        "years": {"train": [2017], "val": [2018], "test": [2019]},
        "time_step_hours": 12,
        "channels": {"pressure_level": {"variables": ["z", "t"], "levels": [500, 850]}},
        "regrid": {"backend": "builtin"},
    }
    proc = _snakemake(tmp_path, {"name": "grib", "era5": era5})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    results = tmp_path / "results" / "grib" / "era5"
    train, year = open_store(results / "train.zarr"), open_store(results / "years" / "2017.zarr")
    assert train.attrs["channel_names"] == ["z500", "z850", "t500", "t850"]
    assert np.all(np.diff(train.lat.values) > 0) and train.sizes["time"] == 4
    back = train.data * train["std"] + train["mean"]
    np.testing.assert_allclose(back.values, year.data.values, rtol=1e-5)
    w = RegridWeights.from_netcdf(
        results / "weights" / "bilinear_5.625deg.nc", LatLonGrid(np.linspace(90, -90, 61), np.arange(120) * 3.0), WB
    )
    ref = next(
        f["values"]
        for f in grib_fields(REAL_ERA5_GRIB)
        if (f["shortName"], f["level"], f["number"], f["time"]) == ("t", 850, 0, pd.Timestamp("2017-01-01 12:00"))
    )
    np.testing.assert_allclose(
        year.data.sel(channel="t850").isel(time=1).values, w.apply(ref.astype(np.float64)), rtol=1e-6
    )
    assert year.attrs["ensemble_member"] == 0 and year.attrs["channel_units"] == ["m**2 s**-2"] * 2 + ["K"] * 2
    assert (results / "climatology.zarr").exists() and (results / "test.zarr").exists()


def test_weatherbench2_store_through_the_pipeline_plans_no_weights_job(tmp_path):
    path, wb2 = _wb2(tmp_path)
    era5 = {
        "inputs": [path.name],
        "years": {"train": [2001], "val": [2002], "test": [2003]},
        "channels": {
            "pressure_level": {"variables": ["geopotential", "temperature"], "levels": [500, 850]},
            "single_level": ["2m_temperature"],
            "constants": ["land_sea_mask"],
        },
    }
    proc = _snakemake(tmp_path, {"name": "wb2", "era5": era5})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "era5_weights" not in out and "era5_year" in out
    year = open_store(tmp_path / "results" / "wb2" / "era5" / "years" / "2003.zarr")
    assert year.attrs["regrid_method"] == "none"
    expected = wb2.temperature.sel(level=850, time=wb2.time.dt.year == 2003).transpose("time", "latitude", "longitude")
    np.testing.assert_array_equal(year.data.sel(channel="t850").values, expected.values)
    test = open_store(tmp_path / "results" / "wb2" / "era5" / "test.zarr")
    assert test.attrs["channel_names"] == ["z500", "z850", "t500", "t850", "t2m", "lsm"]


def test_the_cli_prints_one_line_naming_the_file(tmp_path):
    """`dchag era5-weights` on the real ensemble GRIB without era5.member: exit 2, one line."""
    import json
    import subprocess
    import sys

    cfg = {"name": "cli", "era5": era5_section([REAL_ERA5_GRIB], years=(2017, 2018, 2019), levels=(500,))}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "dchag", "era5-weights", "--config", str(tmp_path / "c.json"), "--year", "2017"]
        + ["--output", str(tmp_path / "w.nc")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "era5-levels-members.grib is an ensemble of 10 members" in lines[0], proc.stderr
    assert not (tmp_path / "w.nc").exists()
