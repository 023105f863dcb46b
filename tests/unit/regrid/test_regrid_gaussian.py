"""Regridding from a regular Gaussian grid (unequal latitudes, ECMWF's regular_gg) by ESMF's
rules, checked from their definitions (tests/unit/regrid/test_regrid_weights.py checks the same code
entry by entry against real xESMF weights on regular grids)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from support.era5_layouts import gaussian_latitudes

from dchag.grids import GridError, LatLonGrid, grid_of, weatherbench_grid
from dchag.regrid.bilinear import unit_vectors
from dchag.regrid.files import regrid_file
from dchag.regrid.weights import RegridWeights

N32 = LatLonGrid(gaussian_latitudes(32), np.arange(128) * 360.0 / 128)  # north to south, as ECMWF stores it
N48 = LatLonGrid(gaussian_latitudes(48)[::-1], np.arange(-180, 180, 360.0 / 192))  # south to north, -180..180
TARGETS = {"5.625": weatherbench_grid(5.625), "1.40625 (beyond the last Gaussian row)": weatherbench_grid(1.40625)}
PAIRS = [(s, t) for s in ("N32", "N48") for t in TARGETS]


def _pair(source, target):
    return {"N32": N32, "N48": N48}[source], TARGETS[target]


def test_gaussian_latitudes_are_uneven_and_read_as_a_grid():
    step = np.diff(N32.lat)
    assert np.ptp(step) > 1e-3  # not a regular grid: spacing varies
    ds = xr.Dataset(coords={"latitude": N32.lat, "longitude": N32.lon})
    with pytest.raises(GridError, match="spacing varies"):
        grid_of(ds, "g.nc")  # where even spacing is needed (scoring)
    assert grid_of(ds, "g.nc", uneven_lat=True).same_as(N32)


@pytest.mark.parametrize("source, target", PAIRS)
def test_bilinear_from_gaussian_is_esmfs_3d_rule(source, target):
    """ESMF's bilinear rule from its definition: weights on a flat patch reproduce a linear
    function of 3-D position exactly, so regridding the source points' x, y, z gives the
    point of the cell's patch on the ray through the target: parallel to it, inside the
    sphere; weights non-negative (the target lies in its cell) and summing to one."""
    src, dst = _pair(source, target)
    w = RegridWeights.build(src, dst, "bilinear")
    got = np.moveaxis(w.apply(np.moveaxis(unit_vectors(*np.meshgrid(src.lat, src.lon, indexing="ij")), -1, 0)), 0, -1)
    p = unit_vectors(*np.meshgrid(dst.lat, dst.lon, indexing="ij")).reshape(-1, 3)
    got = got.reshape(-1, 3)
    inside = np.abs(np.repeat(dst.lat, dst.lon.size)) < np.abs(src.lat).max()
    # inside the Gaussian rows: the patch point on the ray (beyond them ESMF's artificial pole)
    assert np.max(np.linalg.norm(np.cross(got[inside], p[inside]), axis=1)) < 1e-12
    assert np.all(np.linalg.norm(got, axis=1) <= 1 + 1e-12)
    m = w.matrix
    assert np.allclose(np.asarray(m.sum(axis=1)).ravel(), 1.0, atol=1e-12) and m.min() > -1e-12
    # each target inside uses the four corners of the cell between its neighbouring Gaussian rows
    lat_sorted = np.sort(src.lat)
    for r in np.flatnonzero(inside)[:: max(1, inside.sum() // 25)]:
        rows = np.unique(m.getrow(r).indices // src.lon.size)
        la = np.repeat(dst.lat, dst.lon.size)[r]
        k = np.searchsorted(lat_sorted, la)
        assert set(src.lat[rows]) <= {lat_sorted[k - 1], lat_sorted[k]}


def test_bilinear_from_gaussian_is_close_to_a_smooth_field():
    f = lambda lat, lon: np.cos(np.deg2rad(lat)) * np.sin(2 * np.deg2rad(lon)) + 0.01 * lat  # noqa: E731
    dst = weatherbench_grid(5.625)
    w = RegridWeights.build(N32, dst, "bilinear")
    out = w.apply(f(*np.meshgrid(N32.lat, N32.lon, indexing="ij")))
    truth = f(*np.meshgrid(dst.lat, dst.lon, indexing="ij"))
    assert np.max(np.abs(out - truth)) < 2e-3  # second order in a 2.8 deg cell


def test_conservative_from_gaussian_keeps_constants_and_the_area_mean():
    """Cells bounded midway between the Gaussian rows (the edges xESMF is handed), clipped at
    the poles: constants stay constant, the area-weighted mean is kept."""
    dst = weatherbench_grid(5.625)
    w = RegridWeights.build(N32, dst, "conservative")
    assert np.allclose(w.apply(np.full(N32.shape, 7.25)), 7.25)
    field = np.random.default_rng(0).standard_normal(N32.shape)

    def area_mean(f, lat):
        pole = 90.0 if lat[0] > lat[-1] else -90.0  # cells from pole to pole, bounded midway between rows
        edges = np.concatenate([[pole], (lat[1:] + lat[:-1]) / 2, [-pole]])
        a = np.abs(np.diff(np.sin(np.deg2rad(edges))))[:, None]
        return float((f * a).sum() / (a.sum() * f.shape[1]))

    assert area_mean(w.apply(field), dst.lat) == pytest.approx(area_mean(field, N32.lat), abs=1e-12)


def test_dchag_regrid_takes_a_gaussian_file(tmp_path):
    lat2, lon2 = np.meshgrid(N32.lat, N32.lon, indexing="ij")
    src = xr.Dataset(
        {"t": (("time", "latitude", "longitude"), (280 + 10 * np.cos(np.deg2rad(lat2)))[None], {"units": "K"})},
        coords={"time": [np.datetime64("2001-01-01")], "latitude": N32.lat, "longitude": N32.lon},
    )
    src.to_netcdf(tmp_path / "gg.nc")
    out = regrid_file(str(tmp_path / "gg.nc"), str(tmp_path / "out.nc"), 5.625, backend="builtin")
    with xr.open_dataset(out) as ds:
        expected = RegridWeights.build(N32, weatherbench_grid(5.625), "bilinear").apply(src.t.values[0])
        np.testing.assert_allclose(ds.t.values[0], expected, rtol=1e-12)
