"""Regridding weights against xESMF/ESMF's real output and against the definition of its rule."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import xarray as xr
from support import REGRID_DATA

from dchag.grids import LatLonGrid, weatherbench_grid
from dchag.regrid.bilinear import unit_vectors
from dchag.regrid.weights import RegridWeights, WeightsError

ERA5_GRID = LatLonGrid(np.linspace(90, -90, 721), np.arange(1440) * 0.25)
GLOBAL_25 = LatLonGrid(np.linspace(90, -90, 73), np.arange(144) * 2.5)
WB = weatherbench_grid(5.625)


def _xesmf_matrix(name: str, source: LatLonGrid) -> sp.csr_matrix:
    with xr.open_dataset(REGRID_DATA / name) as w:
        return sp.coo_matrix((w.S.values, (w.row.values - 1, w.col.values - 1)), shape=(WB.size, source.size)).tocsr()


@pytest.mark.parametrize(
    "name, source",
    [
        ("xesmf_bilinear_era5_0.25_to_wb_5.625.nc", ERA5_GRID),
        ("xesmf_bilinear_global_2.5_to_wb_5.625.nc", GLOBAL_25),
    ],
)
def test_builtin_bilinear_matches_xesmf_entry_by_entry(name, source):
    ours = RegridWeights.build(source, WB, "bilinear").matrix
    ref = _xesmf_matrix(name, source)
    assert abs(ours - ref).max() <= 1e-6
    # Structure too: the same source points carry the weight (ESMF writes some exact zeros).
    ref.eliminate_zeros()
    assert set(zip(*ours.nonzero())) >= set(zip(*(abs(ref) > 1e-12).nonzero()))


def _analytic(grid: LatLonGrid) -> np.ndarray:
    lat, lon = np.meshgrid(grid.lat, grid.lon, indexing="ij")
    return np.cos(np.deg2rad(lat)) * np.sin(2 * np.deg2rad(lon)) + 0.01 * lat


def test_builtin_and_xesmf_file_reproduce_xesmf_output():
    with xr.open_dataset(REGRID_DATA / "xesmf_bilinear_analytic_0.25_to_5.625.nc") as ref:
        expected = ref.f_xesmf_bilinear.values
    field = _analytic(ERA5_GRID)
    ours = RegridWeights.build(ERA5_GRID, WB, "bilinear").apply(field)
    from_file = RegridWeights.from_netcdf(REGRID_DATA / "xesmf_bilinear_era5_0.25_to_wb_5.625.nc", ERA5_GRID, WB).apply(
        field
    )
    assert np.max(np.abs(ours - expected)) < 1e-12
    assert np.max(np.abs(from_file - expected)) < 1e-12


# Grid pairs that put destination points in collapsed pole cells, beyond a pole-free source's
# last row, in the periodic wrap cell, on source meridians, and that refine as well as coarsen.
PAIRS = {
    "2.5 with poles -> 1.40625 (collapsed pole cells)": (GLOBAL_25, weatherbench_grid(1.40625)),
    "5.625 -> 1.40625 (beyond last row, wrap)": (weatherbench_grid(5.625), weatherbench_grid(1.40625)),
    "1.40625 -> 5.625": (weatherbench_grid(1.40625), WB),
    "lon -180..180, lat ascending 3 deg -> 5.625": (
        LatLonGrid(np.linspace(-90, 90, 61), np.arange(-180, 180, 3.0)),
        WB,
    ),
}


@pytest.mark.parametrize("pair", PAIRS, ids=list(PAIRS))
def test_weights_are_a_partition_of_unity(pair):
    source, target = PAIRS[pair]
    w = RegridWeights.build(source, target, "bilinear").matrix
    assert np.allclose(np.asarray(w.sum(axis=1)).ravel(), 1.0, atol=1e-12)
    assert w.min() > -1e-12


@pytest.mark.parametrize("pair", [p for p in PAIRS if "beyond" not in p], ids=[p for p in PAIRS if "beyond" not in p])
def test_interpolated_position_lies_on_the_ray_through_the_target(pair):
    """ESMF's rule, checked from its definition: bilinear weights on a flat patch reproduce a
    linear function of 3-D position exactly, so regridding the x, y, z fields of the source
    points must give the patch point on the ray through the target: parallel to it, just
    inside the sphere. Holds in every cell, the collapsed pole cells and the wrap cell too."""
    source, target = PAIRS[pair]
    w = RegridWeights.build(source, target, "bilinear")
    src_xyz = unit_vectors(*np.meshgrid(source.lat, source.lon, indexing="ij"))
    got = np.moveaxis(w.apply(np.moveaxis(src_xyz, -1, 0)), 0, -1).reshape(-1, 3)
    p = unit_vectors(*np.meshgrid(target.lat, target.lon, indexing="ij")).reshape(-1, 3)
    assert np.max(np.linalg.norm(np.cross(got, p), axis=1)) < 1e-12
    radius = np.linalg.norm(got, axis=1)
    assert np.all(radius <= 1 + 1e-12) and np.all(radius > 0.99)


def test_pole_free_source_gets_esmf_allavg_pole():
    """Beyond the last row of a pole-free source ESMF adds a pole whose value is the mean of
    that row: a target there weights its two neighbours most and every row point equally."""
    source, target = PAIRS["5.625 -> 1.40625 (beyond last row, wrap)"]
    w = RegridWeights.build(source, target, "bilinear").matrix.tocsr()
    north = np.flatnonzero(np.repeat(target.lat, target.lon.size) > source.lat.max())
    assert north.size > 0
    top_row = set(range((source.lat.size - 1) * source.lon.size, source.size))
    for r in north[:: max(1, north.size // 20)]:
        row = w.getrow(r)
        assert set(row.indices) == top_row
        vals = np.sort(row.data)
        assert np.allclose(vals[:-2], vals[0])  # the pole's share, spread evenly
    # A field constant on the last row stays that constant up to the pole.
    field = np.tile(np.linspace(0, 1, source.lat.size)[:, None], (1, source.lon.size))
    out = (w @ field.ravel())[north]
    assert np.allclose(out, 1.0)


def test_conservative_preserves_area_mean_and_constants():
    source = weatherbench_grid(1.40625)
    w = RegridWeights.build(source, WB, "conservative")
    rng = np.random.default_rng(0)
    field = rng.standard_normal(source.shape)
    out = w.apply(field)

    def area_mean(f, grid):
        edges = np.sin(np.deg2rad(np.linspace(-90, 90, grid.lat.size + 1)))
        a = np.diff(edges)[:, None]
        return float((f * a).sum() / (a.sum() * grid.lon.size))

    assert area_mean(out, WB) == pytest.approx(area_mean(field, source), abs=1e-12)
    assert np.allclose(w.apply(np.full(source.shape, 3.5)), 3.5)
    # 1.40625 -> 5.625: latitude cells nest 4 to 1; the target cell centred on lon 0 spans
    # -2.8125..2.8125, i.e. source columns -2..2 with the outer two half covered.
    block = field[:4][:, [-2, -1, 0, 1, 2]]
    a = np.diff(np.sin(np.deg2rad(np.linspace(-90, -90 + 4 * 1.40625, 5))))[:, None]
    b = np.array([0.5, 1, 1, 1, 0.5])[None, :]
    assert out[0, 0] == pytest.approx(float((block * a * b).sum() / (a.sum() * 4)), abs=1e-12)


def test_weights_file_round_trip(tmp_path):
    w = RegridWeights.build(GLOBAL_25, WB, "bilinear")
    path = tmp_path / "w.nc"
    w.to_netcdf(path)
    with xr.open_dataset(path) as ds:  # the ESMF/xESMF layout
        assert {"S", "row", "col"} <= set(ds.data_vars) and ds.row.values.min() == 1
    back = RegridWeights.from_netcdf(path, GLOBAL_25, WB)
    assert abs(back.matrix - w.matrix).max() == 0


def test_weights_for_another_grid_are_rejected(tmp_path):
    own = tmp_path / "w.nc"
    RegridWeights.build(GLOBAL_25, WB, "bilinear").to_netcdf(own)
    with pytest.raises(WeightsError, match="source grid"):
        RegridWeights.from_netcdf(own, ERA5_GRID, WB)
    # A bare xESMF file records no grid: index bounds catch a smaller grid...
    bare = REGRID_DATA / "xesmf_bilinear_era5_0.25_to_wb_5.625.nc"
    with pytest.raises(WeightsError, match="indexes a target"):
        RegridWeights.from_netcdf(bare, GLOBAL_25, WB)
    # ...and regridding the coordinates catches a grid of the same size laid out differently.
    flipped = LatLonGrid(GLOBAL_25.lat[::-1], GLOBAL_25.lon)
    with pytest.raises(WeightsError, match="misplaces"):
        RegridWeights.from_netcdf(REGRID_DATA / "xesmf_bilinear_global_2.5_to_wb_5.625.nc", flipped, WB)


def test_corrupt_weights_file_is_named(tmp_path):
    bad = tmp_path / "bad.nc"
    bad.write_bytes(b"CDF\x01 not really")
    with pytest.raises(WeightsError, match="bad.nc"):
        RegridWeights.from_netcdf(bad, GLOBAL_25, WB)
