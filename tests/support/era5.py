"""Small ERA5-side inputs: a validated config of the synthetic demo files, a truth on the
5.625° grid and a forecast of it, scored by ``dchag score``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from dchag.cli import main
from dchag.config import validate

from . import LEVELS

LAT = np.arange(-90 + 5.625 / 2, 90, 5.625)
LON = np.arange(0, 360, 5.625)


def small_era5_config(root: Path, years=(2001, 2002, 2003)) -> dict:
    """A validated config of the demo's ERA5-layout files in ``root``: one year per split."""
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


def synthetic_truth(times) -> xr.Dataset:
    """t2m and z500 on the 5.625° grid: a seasonal cycle, a latitude gradient and noise."""
    rng = np.random.default_rng(0)
    doy = pd.DatetimeIndex(times).day_of_year.values
    season = 10 * np.sin(2 * np.pi * doy / 365.25)[:, None, None]
    field = (
        280 + season + 5 * np.cos(np.deg2rad(LAT))[None, :, None] + rng.normal(0, 1, (len(times), LAT.size, LON.size))
    )
    return xr.Dataset(
        {"t2m": (("time", "lat", "lon"), field), "z500": (("time", "lat", "lon"), field * 20)},
        coords={"time": times, "lat": LAT, "lon": LON},
    )


def score_cli(capsys, forecast, truth, output, *extra):
    """``dchag score`` (RMSE, the wb2 convention) in process: its exit status and stderr."""
    code = main(["score", "--forecast", str(forecast), "--truth", str(truth), "--convention", "wb2",
                 "--metrics", "rmse", *extra, "--output", str(output)])  # fmt: skip
    return code, capsys.readouterr().err
