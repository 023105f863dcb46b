"""Regular latitude-longitude grids: the WeatherBench target grids and checks on input grids.

A grid here is a pair of 1-D coordinate arrays in degrees. Inputs may name them
``lat``/``latitude`` and ``lon``/``longitude`` and store latitude in either order; every
grid this package writes has ascending latitude (south to north) and longitude from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr
from .errors import DchagError

LAT_NAMES = ("latitude", "lat")
LON_NAMES = ("longitude", "lon")

# Known WeatherBench / ClimaX resolutions and their shapes, for friendly error messages.
WEATHERBENCH_SHAPES = {5.625: (32, 64), 2.8125: (64, 128), 1.40625: (128, 256)}


class GridError(DchagError, ValueError):
    """An input grid is not the regular lat-lon grid the operation needs."""


@dataclass(frozen=True)
class LatLonGrid:
    """A regular lat-lon grid: 1-D latitude and longitude in degrees, in storage order."""

    lat: np.ndarray
    lon: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return (self.lat.size, self.lon.size)

    @property
    def size(self) -> int:
        return self.lat.size * self.lon.size

    def describe(self) -> str:
        return (
            f"{self.lat.size}x{self.lon.size} "
            f"(lat {self.lat[0]:g}..{self.lat[-1]:g}, lon {self.lon[0]:g}..{self.lon[-1]:g})"
        )

    def same_as(self, other: "LatLonGrid", atol: float = 1e-6) -> bool:
        return (
            self.shape == other.shape
            and np.allclose(self.lat, other.lat, atol=atol)
            and np.allclose(self.lon, other.lon, atol=atol)
        )


def weatherbench_grid(resolution: float) -> LatLonGrid:
    """The pole-free WeatherBench (v1) / ClimaX grid of ``resolution`` degrees.

    lat = arange(-90 + d/2, 90, d) (ascending), lon = arange(0, 360, d).
    """
    d = float(resolution)
    nlat = 180.0 / d
    nlon = 360.0 / d
    if d <= 0 or abs(nlat - round(nlat)) > 1e-9 or abs(nlon - round(nlon)) > 1e-9:
        raise GridError(
            f"grid resolution {resolution!r} deg does not divide 180 deg evenly; "
            f"expected e.g. one of {sorted(WEATHERBENCH_SHAPES)}"
        )
    lat = -90.0 + d / 2 + d * np.arange(int(round(nlat)))
    lon = d * np.arange(int(round(nlon)))
    return LatLonGrid(lat=lat, lon=lon)


def find_coord(ds: xr.Dataset | xr.DataArray, names: tuple[str, ...], what: str, source: str = "") -> str:
    for name in names:
        if name in ds.coords or name in ds.dims:
            return name
    where = f" in {source}" if source else ""
    raise GridError(
        f"no {what} coordinate{where}: expected one of {', '.join(names)}; "
        f"found coordinates {sorted(map(str, ds.coords))}"
    )


def lat_lon_names(ds: xr.Dataset | xr.DataArray, source: str = "") -> tuple[str, str]:
    return find_coord(ds, LAT_NAMES, "latitude", source), find_coord(ds, LON_NAMES, "longitude", source)


def grid_of(ds: xr.Dataset | xr.DataArray, source: str = "", *, require_global: bool = True) -> LatLonGrid:
    """The regular lat-lon grid of ``ds``, checked.

    Raises GridError naming ``source`` if the coordinates are not 1-D, not evenly spaced,
    not monotonic or (with ``require_global``) do not span the globe in longitude.
    """
    lat_name, lon_name = lat_lon_names(ds, source)
    where = f" of {source}" if source else ""
    lat = np.asarray(ds[lat_name].values, dtype=np.float64)
    lon = np.asarray(ds[lon_name].values, dtype=np.float64)
    if lat.ndim != 1 or lon.ndim != 1:
        raise GridError(
            f"grid{where} is not a regular lat-lon grid: '{lat_name}' and '{lon_name}' must be 1-D, "
            f"got shapes {lat.shape} and {lon.shape} (curvilinear grids are not supported)"
        )
    if lat.size < 2 or lon.size < 2:
        raise GridError(f"grid{where} needs at least 2 latitudes and 2 longitudes, got {lat.size}x{lon.size}")
    if np.any(np.abs(lat) > 90 + 1e-9):
        raise GridError(f"'{lat_name}'{where} has values outside [-90, 90]")
    for name, values in ((lat_name, lat), (lon_name, lon)):
        step = np.diff(values)
        if not (np.all(step > 0) or np.all(step < 0)):
            raise GridError(f"'{name}'{where} is not monotonic")
        if np.max(np.abs(step - step[0])) > 1e-6 * max(1.0, abs(step[0])) + 1e-9:
            raise GridError(
                f"grid{where} is not a regular lat-lon grid: '{name}' spacing varies from "
                f"{np.min(np.abs(step)):g} to {np.max(np.abs(step)):g} deg (Gaussian or stretched "
                f"grids must be interpolated to a regular grid first)"
            )
    if require_global:
        dlon = abs(lon[1] - lon[0])
        if abs(lon.size * dlon - 360.0) > 1e-6 * 360:
            raise GridError(
                f"grid{where} is not global in longitude: {lon.size} points every {dlon:g} deg cover "
                f"{lon.size * dlon:g} deg, expected 360 (periodic regridding needs a global grid)"
            )
    return LatLonGrid(lat=lat, lon=lon)


def cell_edges(centres: np.ndarray, clip_to_poles: bool = False) -> np.ndarray:
    """n+1 cell edges, midway between the n evenly spaced centres, in the centres' order."""
    c = np.asarray(centres, dtype=np.float64)
    edges = np.concatenate([[c[0] - (c[1] - c[0]) / 2], (c[1:] + c[:-1]) / 2, [c[-1] + (c[-1] - c[-2]) / 2]])
    return np.clip(edges, -90.0, 90.0) if clip_to_poles else edges
