"""Constants fitted to the benchmarks' results, kept in fits.json beside this module: the
benchmark that measures them writes them there when it fits (benchmarks/preprocess_benchmark.py,
benchmarks/paper_memory_fake.py), the package reads them (dchag.jobs, dchag.benefit.fakemem),
and a test refits them from the committed benchmarks/results/*.json."""

from __future__ import annotations

import json
import statistics
from functools import cache
from pathlib import Path

FITS = Path(__file__).with_name("fits.json")
ERA5_JOBS = ("era5_year_stats", "era5_split_part", "era5_climatology_part", "era5_climatology")
COARSE, FINE = 5.625, 1.40625


@cache
def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def fitted(key: str, path: Path = FITS) -> dict:
    """The fit ``key`` of fits.json."""
    try:
        return _load(path)[key]
    except KeyError:
        raise KeyError(f"{path}: no fit {key!r}") from None


def write(key: str, value: dict, path: Path = FITS) -> None:
    """Set the fit ``key`` in the fits file at ``path`` (the others kept)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[key] = value
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    _load.cache_clear()


def era5_job_mb(rows: list[dict]) -> dict:
    """Each ERA5 job's peak RSS as fixed MB + MB per unit of data per time step (80 channels on
    the 32 x 64 points of 5.625 deg): the line through the largest peak measured at 5.625 deg
    and at 1.40625 deg (a whole year; 16 units), in whole MB. ``rows``: preprocess_benchmark's."""
    from ..grids import weatherbench_grid

    units = {g: weatherbench_grid(g).size / weatherbench_grid(COARSE).size for g in (COARSE, FINE)}
    out = {}
    for job in ERA5_JOBS:
        peak = {}
        for grid in (COARSE, FINE):
            peaks = [
                r["peak_rss_mb"]
                for r in rows
                if r["job"] == job.replace("_", "-") and r["grid"] == grid and not r.get("days")
            ]
            if not peaks:
                raise ValueError(f"no whole-year {job.replace('_', '-')} row at {grid} deg to fit")
            peak[grid] = max(peaks)
        per_unit = round((peak[FINE] - peak[COARSE]) / (units[FINE] - units[COARSE]))
        out[job] = [round(peak[COARSE] - per_unit * units[COARSE]), per_unit]
    return out


def overhead(rows: list[dict]) -> dict:
    """Least squares reserved = scale x peak + fixed (GiB) over ``rows`` (paper_gib against
    peak_gib); fixed >= 0 (a context and buffers hold memory, they cannot free it): where the
    free fit's is negative, the line through the origin. Unrounded."""
    xs = [r["peak_gib"] for r in rows]
    ys = [r["paper_gib"] for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    scale = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 1.0
    if my - scale * mx >= 0:
        return {"scale": scale, "fixed_gib": my - scale * mx}
    return {"scale": sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs), "fixed_gib": 0.0}


def rounded_overhead(fit: dict) -> dict:
    """The overhead as the package keeps it: the scale to 3 decimals, fixed GiB to 2."""
    return {"scale": round(fit["scale"], 3), "fixed_gib": round(fit["fixed_gib"], 2)}
