"""Rectilinear latitude-longitude grids: the WeatherBench target grids and checks on input grids.

A grid here is a pair of 1-D coordinate arrays in degrees. Inputs may name them
``lat``/``latitude`` and ``lon``/``longitude`` and store latitude in either order and
longitude from any origin (0..360 or -180..180); every grid this package writes has
ascending latitude (south to north) and longitude from 0. Longitudes are evenly spaced;
latitudes are evenly spaced on a regular lat-lon grid and unevenly on a regular Gaussian
grid (the Gauss-Legendre latitudes of ECMWF's ``regular_gg``), which the regridding takes
as a source.
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
    """A rectilinear lat-lon grid: 1-D latitude and longitude in degrees, in storage order."""

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

    def same_as(self, other: LatLonGrid, atol: float = 1e-6) -> bool:
        return (
            self.shape == other.shape
            and np.allclose(self.lat, other.lat, atol=atol)
            and np.allclose(self.lon, other.lon, atol=atol)
        )

    def order_onto(self, other: LatLonGrid, atol: float = 5e-4) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, cols) such that data on this grid indexed ``[..., rows, :][..., cols]`` lies on
        ``other`` point for point (the same points in another latitude order or longitude
        origin), or None when the two grids do not hold the same points. ``atol`` (degrees):
        GRIB edition 1 stores coordinates in millidegrees (87.1875 is 87.188 there)."""
        if self.shape != other.shape:
            return None
        rows = np.argsort(self.lat)[np.argsort(np.argsort(other.lat))]
        lon_self = np.mod(self.lon, 360.0)
        lon_other = np.mod(other.lon, 360.0)
        cols = np.argsort(lon_self)[np.argsort(np.argsort(lon_other))]
        lat_ok = np.allclose(self.lat[rows], other.lat, atol=atol)
        diff = np.abs(lon_self[cols] - lon_other)
        lon_ok = np.all(np.minimum(diff, 360.0 - diff) <= atol)
        return (rows, cols) if lat_ok and lon_ok else None


FINEST_GRID = 0.1  # deg: ERA5-Land's; ERA5's own is 0.25


def weatherbench_grid(resolution: float) -> LatLonGrid:
    """The pole-free WeatherBench (v1) / ClimaX grid of ``resolution`` degrees.

    lat = arange(-90 + d/2, 90, d) (ascending), lon = arange(0, 360, d).
    """
    d = float(resolution)
    if not FINEST_GRID <= d <= 180:  # finer asks for memory by the terabyte
        raise GridError(f"grid resolution {resolution!r} deg: expected {FINEST_GRID} to 180 deg")
    nlat = 180.0 / d
    nlon = 360.0 / d
    if abs(nlat - round(nlat)) > 1e-9 or abs(nlon - round(nlon)) > 1e-9:
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


def grid_of(
    ds: xr.Dataset | xr.DataArray, source: str = "", *, require_global: bool = True, uneven_lat: bool = False
) -> LatLonGrid:
    """The lat-lon grid of ``ds``, checked.

    Raises GridError naming ``source`` if the coordinates are not 1-D, not monotonic, not
    evenly spaced (latitude may be uneven with ``uneven_lat``: a regular Gaussian grid) or
    (with ``require_global``) do not span the globe in longitude.
    """
    lat_name, lon_name = lat_lon_names(ds, source)
    where = f" of {source}" if source else ""
    lat = np.asarray(ds[lat_name].values, dtype=np.float64)
    lon = np.asarray(ds[lon_name].values, dtype=np.float64)
    lat_dims, lon_dims = ds[lat_name].dims, ds[lon_name].dims
    if lat.ndim == 1 and lat_dims == lon_dims:  # cfgrib's layout of a reduced Gaussian or unstructured grid
        kind = ds.attrs.get("GRIB_gridType") or next(
            (v.attrs["GRIB_gridType"] for v in getattr(ds, "data_vars", {}).values() if "GRIB_gridType" in v.attrs),
            "unstructured",
        )
        raise GridError(
            f"grid{where} is not rectilinear: '{lat_name}' and '{lon_name}' both run along '{lat_dims[0]}' "
            f"(a {kind} grid; reduced Gaussian and unstructured grids are not supported): request a regular "
            "grid (CDS/MARS: grid 0.25/0.25, or a regular Gaussian grid such as grid=F320)"
        )
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
        if uneven_lat and name == lat_name:
            continue
        if np.max(np.abs(step - step[0])) > 1e-6 * max(1.0, abs(step[0])) + 1e-9:
            raise GridError(
                f"grid{where} is not a regular lat-lon grid: '{name}' spacing varies from "
                f"{np.min(np.abs(step)):g} to {np.max(np.abs(step)):g} deg"
                + (
                    " (a Gaussian grid is read as ERA5 input and by `dchag regrid`; this operation needs even spacing)"
                    if name == lat_name
                    else " (longitudes must be evenly spaced)"
                )
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
    """n+1 cell edges, midway between neighbouring centres (the outer two half a spacing beyond
    the end centres), in the centres' order; evenly or unevenly spaced (Gaussian latitudes).

    With ``clip_to_poles`` (latitudes) the edges stop at the poles, and an outer edge that
    falls short of a pole by less than a row spacing is moved onto it: a Gaussian grid's rows
    stop short of the poles, and its polar cells must still reach them, or conservative
    weights would leave the caps uncovered (a constant field would not stay constant there)."""
    c = np.asarray(centres, dtype=np.float64)
    edges = np.concatenate([[c[0] - (c[1] - c[0]) / 2], (c[1:] + c[:-1]) / 2, [c[-1] + (c[-1] - c[-2]) / 2]])
    if not clip_to_poles:
        return edges
    edges = np.clip(edges, -90.0, 90.0)
    for end, inner in ((0, 1), (-1, -2)):
        pole = 90.0 * np.sign(edges[end] - edges[inner])
        if 0 < abs(pole - edges[end]) < abs(edges[end] - edges[inner]):
            edges[end] = pole
    return edges
