"""Shared fixtures (small ERA5-layout inputs written by the real writers, netCDF4 via xarray)
and the suite's order: tests/integration/ is marked ``integration``; tests marked
``minutes(n)`` (the end-to-end runs that take minutes in CI) go first, longest first."""

from __future__ import annotations

import copy
import gc
import resource
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from support import LEVELS, once
from support.era5 import LAT, LON, small_era5_config, synthetic_truth

from dchag.era5 import demo

YEARS = (2001, 2002, 2003)


@pytest.fixture(scope="session")
def era5_files(tmp_path_factory) -> Path:
    """Three 10-day years of synthetic ERA5-layout netCDF on a 3.75 deg grid, plus constants."""

    def make(root):
        for year in YEARS:
            demo.write_year(root, year, 3.75, LEVELS, time_step_hours=24, days=10)
        demo.write_constants(root, 3.75)

    return once(tmp_path_factory, "era5", make)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """Tiny ERA5 train/val stores (10 daily steps each) made by the real preprocessing; made once
    per test run (all workers) and only read by the tests (a test that changes a store copies it)."""
    from dchag.era5.preprocess import make_weights, preprocess_year
    from dchag.era5.split import build_split
    from dchag.era5.statistics import normalization_stats

    def make(root):
        raw = root / "raw"
        raw.mkdir()
        for year in YEARS:
            demo.write_year(raw, year, 3.75, LEVELS, days=12)
        demo.write_constants(raw, 3.75)
        cfg = small_era5_config(raw)
        make_weights(cfg["era5"], 2001, root / "w.nc")
        years = {y: preprocess_year(cfg["era5"], y, root / "w.nc", root / f"y{y}.zarr") for y in YEARS}
        stats = normalization_stats([years[2001]], root / "stats.json")
        for split, y in (("train", 2001), ("val", 2002)):
            build_split(split, [years[y]], stats, root / "era5" / f"{split}.zarr")

    root = once(tmp_path_factory, "results", make)
    return root, small_era5_config(root / "raw")


@pytest.fixture
def era5_config(era5_files) -> dict:
    return copy.deepcopy(small_era5_config(era5_files))


@pytest.fixture
def scored(tmp_path):
    """A truth of 40 days (t2m in K, z500 in m**2 s**-2) and a 24 h forecast of its first 30."""
    times = pd.date_range("2019-01-01", periods=40, freq="D")
    ds = synthetic_truth(times)
    ds.t2m.attrs["units"] = "K"
    ds.z500.attrs["units"] = "m**2 s**-2"
    ds.to_netcdf(tmp_path / "truth.nc")
    rng = np.random.default_rng(3)
    noise = xr.DataArray(rng.normal(0, 1, (30, LAT.size, LON.size)), dims=("time", "lat", "lon"))
    fc = ds.isel(time=slice(1, 31)) + noise
    fc = fc.assign_coords(time=ds.time.values[:30], prediction_timedelta=np.timedelta64(24, "h"))
    for v in fc.data_vars:
        fc[v].attrs = ds[v].attrs
    fc.to_netcdf(tmp_path / "forecast.nc")
    return tmp_path, ds


def pytest_configure(config):
    # As `dchag` itself (dchag.cli.run): a worker holds ~550k objects (torch, xarray, pytest's), and
    # the collector's full passes over them, one every 10 young ones, cost a worker ~2 CPU-s in
    # tests/unit/{model,hsi,evaluate} alone; one in 100: 0.46.
    gc.set_threshold(*gc.get_threshold()[:2], 100)
    config.addinivalue_line(
        "markers",
        "minutes(n): an end-to-end run that takes about n minutes in CI; scheduled first, longest first",
    )


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config, items):
    """The order `make test` hands tests to its pytest-xdist workers (`--dist load
    --maxschedchunk 1`: each worker first gets two consecutive tests, then one at a time): the
    tests marked ``minutes`` longest first, each of the first (one per worker) paired with a
    quick test so that no worker starts with two of them; then the rest of tests/integration; then the unit
    tests."""
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)

    def minutes(item):
        mark = item.get_closest_marker("minutes")
        return mark.args[0] if mark else 0

    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    long = sorted((i for i in items if minutes(i)), key=minutes, reverse=True)
    rest = sorted((i for i in items if not minutes(i)), key=lambda i: i.get_closest_marker("integration") is None)
    ordered = []
    for i, item in enumerate(long):
        ordered.append(item)
        if i < workers and rest:
            ordered.append(rest.pop(-1))  # a quick unit test
    items[:] = ordered + rest


def _cpu_seconds() -> float:
    """User + system CPU seconds of this worker and of every process it has waited for (a
    snakemake's jobs and torchrun's ranks included: each parent waits for its children), and
    of the gloo ranks of :func:`support.distributed.run_distributed` (its fork server's children)."""
    from support.distributed import RANKS_CPU

    return RANKS_CPU[0] + sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[CPU_START] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Each test's CPU seconds (setup, call and teardown), as the property ``cpu_s`` of its
    JUnit record: with other workers on the same cores a test's wall time tells more about its neighbours
    than about itself; CPU time is what the suite's length is made of."""
    try:
        return (yield)
    finally:
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[CPU_START], 1)))
