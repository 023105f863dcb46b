"""Small ERA5 inputs in the layouts people download, written by the real writers: GRIB by
ecCodes (from its sample messages, editions 1 and 2, regular lat-lon and regular Gaussian),
netCDF by cfgrib + xarray (as cfgrib converts a GRIB file), a WeatherBench 2 store by
xarray's Zarr writer. The fields are smooth analytic functions of position and time, so a
test can check values after regridding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from . import REPO

GRIB_DATA = REPO / "tests" / "data" / "grib"  # real GRIB files (see its README.md)
REAL_ERA5_GRIB = GRIB_DATA / "era5-levels-members.grib"
REAL_T_PL_GRIB = GRIB_DATA / "t_pl.grib"

PRESSURE = {129, 130, 131, 132, 133}  # GRIB paramIds of pressure-level fields (the others: single level)


def ll_grid(resolution: float) -> tuple[np.ndarray, np.ndarray]:
    """ERA5's layout: latitude 90 -> -90 with the poles, longitude 0 -> 360 - d."""
    return np.linspace(90, -90, int(round(180 / resolution)) + 1), np.arange(int(round(360 / resolution))) * resolution


def gaussian_latitudes(n: int) -> np.ndarray:
    """The 2N Gauss-Legendre latitudes of a regular Gaussian grid N (north to south), in degrees."""
    nodes, _ = np.polynomial.legendre.leggauss(2 * n)
    return np.rad2deg(np.arcsin(nodes))[::-1]


def field(param: int, level: int | None, time: pd.Timestamp, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """A smooth, plausible field in the catalogue's units: (lat, lon)."""
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    hours = (time - pd.Timestamp("2000-01-01")) / pd.Timedelta(hours=1)
    wave = np.cos(la) * np.sin(2 * lo + 0.01 * hours)
    p = 1000.0 if level is None else float(level)
    if param == 129:  # geopotential, m**2 s**-2
        return 9.80665 * (44330.8 * (1 - (p / 1013.25) ** 0.190263)) + 800.0 * wave + 300 * np.sin(la)
    if param in (130, 167):  # temperature, K
        return 300.0 - 40 * np.sin(la) ** 2 - 0.05 * (1000 - p) + 5 * wave
    if param in (131, 165):  # eastward wind, m s**-1
        return 10 * np.cos(la) ** 2 + 3 * wave
    if param == 172:  # land-sea mask
        return (np.sin(3 * lo) * np.cos(la) > 0.3).astype(float)
    raise ValueError(param)


def write_grib(
    path: Path,
    messages: list[tuple[int, int | None, pd.Timestamp]],
    *,
    edition: int = 2,
    grid: str = "regular_ll",
    resolution: float = 10.0,
    values=None,
) -> Path:
    """GRIB messages (paramId, pressure level or None, valid time) by ecCodes from its sample
    messages; ``grid`` regular_ll (global, ``resolution`` degrees, ERA5's orientation),
    regular_gg (the samples' N32: 64 Gaussian latitudes x 128) or reduced_gg.
    ``values(param, level, time, lat, lon)`` gives each field (default: :func:`field`)."""
    import eccodes

    values = values or field
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        for param, level, time in messages:
            kind = "pl" if param in PRESSURE else "sfc"
            sample = f"{'reduced_gg' if grid == 'reduced_gg' else grid}_{kind}_grib{edition}"
            h = eccodes.codes_grib_new_from_samples(sample)
            try:
                if grid == "regular_ll":
                    lat, lon = ll_grid(resolution)
                    for key, value in (
                        ("Ni", lon.size),
                        ("Nj", lat.size),
                        ("latitudeOfFirstGridPointInDegrees", 90.0),
                        ("latitudeOfLastGridPointInDegrees", -90.0),
                        ("longitudeOfFirstGridPointInDegrees", 0.0),
                        ("longitudeOfLastGridPointInDegrees", float(lon[-1])),
                        ("iDirectionIncrementInDegrees", resolution),
                        ("jDirectionIncrementInDegrees", resolution),
                    ):
                        eccodes.codes_set(h, key, value)
                if level is not None:
                    eccodes.codes_set(h, "typeOfLevel", "isobaricInhPa")
                    eccodes.codes_set(h, "level", int(level))
                eccodes.codes_set(h, "paramId", int(param))
                eccodes.codes_set(h, "dataDate", int(time.strftime("%Y%m%d")))
                eccodes.codes_set(h, "dataTime", int(time.strftime("%H%M")))
                eccodes.codes_set(h, "bitsPerValue", 24)
                if grid == "reduced_gg":
                    lats = eccodes.codes_get_array(h, "latitudes")
                    lons = eccodes.codes_get_array(h, "longitudes")
                    la, lo = np.deg2rad(lats), np.deg2rad(lons)
                    eccodes.codes_set_values(h, 280 + 10 * np.cos(la) * np.sin(lo))
                else:
                    if grid == "regular_gg":
                        lat = gaussian_latitudes(int(eccodes.codes_get(h, "N")))
                        lon = np.arange(eccodes.codes_get(h, "Ni")) * 360.0 / eccodes.codes_get(h, "Ni")
                    eccodes.codes_set_values(h, np.ascontiguousarray(values(param, level, time, lat, lon)).ravel())
                eccodes.codes_write(h, out)
            finally:
                eccodes.codes_release(h)
    return path


def grib_fields(path: Path) -> list[dict]:
    """Every message of a GRIB file as ecCodes decodes it: keys and values (Nj, Ni), the
    reference the readers are checked against."""
    import eccodes

    out = []
    with open(path, "rb") as f:
        while (h := eccodes.codes_grib_new_from_file(f)) is not None:
            try:
                keys = {k: eccodes.codes_get(h, k) for k in ("shortName", "paramId", "typeOfLevel", "level")}
                keys["number"] = eccodes.codes_get(h, "number") if eccodes.codes_is_defined(h, "number") else None
                keys["time"] = pd.Timestamp(
                    f"{eccodes.codes_get(h, 'validityDate')} {eccodes.codes_get(h, 'validityTime'):04d}"
                )
                keys["values"] = eccodes.codes_get_values(h).reshape(eccodes.codes_get(h, "Nj"), -1)
                keys["lat"] = np.unique(eccodes.codes_get_array(h, "latitudes"))[::-1]
                out.append(keys)
            finally:
                eccodes.codes_release(h)
    return out


def cfgrib_netcdf(grib: Path, out: Path) -> Path:
    """The netCDF cfgrib writes from a GRIB file, its defaults (cfgrib's documented
    conversion: ``xr.open_dataset(engine="cfgrib").to_netcdf``): dims number, time
    (reference time), isobaricInhPa; coordinates valid_time and step."""
    with xr.open_dataset(grib, engine="cfgrib", backend_kwargs={"indexpath": ""}) as ds:
        ds.load().to_netcdf(out)
    return out


WB2_LEVELS = [50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000]
WB2_UNITS = {
    "geopotential": "m**2 s**-2",
    "temperature": "K",
    "2m_temperature": "K",
    "10m_u_component_of_wind": "m s**-1",
    "land_sea_mask": "(0 - 1)",
}


def write_wb2_store(path: Path, times: pd.DatetimeIndex, seed: int = 0) -> xr.Dataset:
    """A store in WeatherBench 2's ERA5 layout (``1959-2023_01_10-6h-64x32_equiangular_conservative.zarr``):
    Zarr v2 with consolidated metadata, long names, dims (time, level, longitude, latitude) and
    (time, longitude, latitude), latitude ascending -87.1875..87.1875, longitude 0..354.375, all
    years in one store, constants without time, float32."""
    lat = np.linspace(-87.1875, 87.1875, 32)
    lon = np.linspace(0, 360, 64, endpoint=False)
    rng = np.random.default_rng(seed)
    nt, nl = times.size, len(WB2_LEVELS)
    data = {
        "geopotential": (("time", "level", "longitude", "latitude"), 5e4 + 1e3 * rng.standard_normal((nt, nl, 64, 32))),
        "temperature": (("time", "level", "longitude", "latitude"), 250 + 10 * rng.standard_normal((nt, nl, 64, 32))),
        "2m_temperature": (("time", "longitude", "latitude"), 280 + 10 * rng.standard_normal((nt, 64, 32))),
        "10m_u_component_of_wind": (("time", "longitude", "latitude"), 3 * rng.standard_normal((nt, 64, 32))),
        "land_sea_mask": (("longitude", "latitude"), rng.random((64, 32))),
    }
    ds = xr.Dataset(
        {
            name: (dims, values.astype(np.float32), {"units": WB2_UNITS[name], "long_name": name.replace("_", " ")})
            for name, (dims, values) in data.items()
        },
        coords={"time": times, "level": ("level", np.array(WB2_LEVELS, np.int64)), "latitude": lat, "longitude": lon},
    )
    ds.to_zarr(path, zarr_format=2, consolidated=True, mode="w")
    return ds
