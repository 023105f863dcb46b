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


@pytest.fixture
def era5_config(era5_files) -> dict:
    return copy.deepcopy(small_era5_config(era5_files))


# The longest end-to-end tests first: under pytest-xdist (make test: -n 2 --dist loadfile)
# a file is scheduled where its first test falls, so the two longest start at once on the two
# workers (the Slurm one mostly waits on job states) and the short ones fill in around them.
FIRST = ["test_workflow.py", "test_slurm.py", "test_gpu_check.py", "test_configs.py", "test_train.py"]


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return (FIRST.index(name) if name in FIRST else len(FIRST), 0 if item.get_closest_marker("integration") else 1)

    items.sort(key=rank)  # stable: the order inside a file is kept
