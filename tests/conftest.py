"""Shared fixtures: small ERA5-layout inputs written by the real writers (netCDF4 via xarray)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dchag.config import validate
from dchag.era5 import demo

REPO = Path(__file__).resolve().parents[1]
REGRID_DATA = REPO / "tests" / "data" / "regrid"  # real xESMF files (see its README.md)
LEVELS = [500, 850]


def small_era5_config(root: Path, years=(2001, 2002, 2003)) -> dict:
    train, val, test = years
    return validate(
        {
            "name": "t",
            "era5": {
                "inputs": [str(root / "pressure_levels_{year}.nc"), str(root / "single_levels_{year}.nc")],
                "constants": str(root / "constants.nc"),
                "years": {"train": [train], "val": [val], "test": [test]},
                "time_step_hours": 24,
                "channels": {
                    "pressure_level": {"variables": ["geopotential", "temperature"], "levels": LEVELS},
                    "single_level": ["2m_temperature", "10m_u_component_of_wind"],
                    "constants": ["land_sea_mask"],
                },
                "grid": 5.625,
                "regrid": {"method": "bilinear", "backend": "builtin"},
                "time_chunk": 4,
            },
        },
        "test config",
    )


@pytest.fixture(scope="session")
def era5_files(tmp_path_factory) -> Path:
    """Three 10-day years of synthetic ERA5-layout netCDF on a 3.75 deg grid, plus constants."""
    root = tmp_path_factory.mktemp("era5")
    for year in (2001, 2002, 2003):
        demo.write_year(root, year, 3.75, LEVELS, time_step_hours=24, days=10)
    demo.write_constants(root, 3.75)
    return root


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """Tiny ERA5 train/val stores (10 daily steps each) made by the real preprocessing; made once
    per test process and only read by the tests (a test that changes a store copies it)."""
    raw = tmp_path_factory.mktemp("raw")
    for year in (2001, 2002, 2003):
        demo.write_year(raw, year, 3.75, [500, 850], days=12)
    demo.write_constants(raw, 3.75)
    from dchag.era5.preprocess import make_weights, preprocess_year
    from dchag.era5.split import build_split
    from dchag.era5.statistics import normalization_stats

    cfg = small_era5_config(raw)
    root = tmp_path_factory.mktemp("results")
    make_weights(cfg["era5"], 2001, root / "w.nc")
    years = {y: preprocess_year(cfg["era5"], y, root / "w.nc", root / f"y{y}.zarr") for y in (2001, 2002, 2003)}
    stats = normalization_stats([years[2001]], root / "stats.json")
    for split, y in (("train", 2001), ("val", 2002)):
        build_split(split, [years[y]], stats, root / "era5" / f"{split}.zarr")
    return root, cfg


@pytest.fixture
def era5_config(era5_files) -> dict:
    return copy.deepcopy(small_era5_config(era5_files))


# The longest end-to-end tests first, each on its own worker: `make test` runs pytest-xdist
# with `--dist load --maxschedchunk 1`, whose initial distribution hands every worker two
# consecutive tests (then one at a time, in collection order). So the long tests go to even
# positions (0, 2, 4: one per worker's first pair, started at once — the demo pipeline, the
# Slurm cluster, which mostly waits on job states, the GPU-check rehearsal), the next long ones
# right after (the paper sweep, a user's config, the verification experiment, two "nodes"),
# and every other test keeps its place behind them.
LONGEST = [
    "test_demo_pipeline_produces_normalised_stores",
    "test_pipeline_on_slurm_equals_local_and_survives_a_cancelled_job",
    "test_gpu_check_rehearses_the_device_run_on_the_cpu",
    "test_paper_sweep_measures_every_point_and_draws_its_figures",
    "test_a_users_own_one_dataset_config_runs_through_training_and_scoring",
    "test_verification_experiment_on_the_demo_data",
    "test_two_nodes_as_srun_starts_them_train_as_one_four_rank_group",
]
FIRST_PAIRS = 3  # long tests placed one per initial pair (the workers of `make test`)


def pytest_collection_modifyitems(config, items):
    def name(item):
        return item.originalname if hasattr(item, "originalname") else item.name

    long = sorted((i for i in items if name(i) in LONGEST), key=lambda i: LONGEST.index(name(i)))
    rest = [i for i in items if name(i) not in LONGEST]
    ordered = []
    for i, item in enumerate(long):
        ordered.append(item)
        if i < FIRST_PAIRS and rest:
            ordered.append(rest.pop(0))
    items[:] = ordered + rest
