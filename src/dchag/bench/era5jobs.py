"""The ERA5 preprocessing jobs after the regridding, as the pipeline's rules call them, each
the real `dchag` subcommand in a process of its own under GNU time (procs.run_job)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from .procs import du, run_job
from .stores import era5_section


class Run:
    """The jobs of one grid and year count; every job's row (wall and CPU time, peak RSS) is
    appended to ``rows``, and ``save`` (if given) called after each (a long run can be cut
    short). ``days``: the generated days per year (None: whole years)."""

    def __init__(
        self,
        root: Path,
        grid: float,
        years: list[int],
        year_stores: list[Path],
        rows: list,
        save: Callable[[], object] | None = None,
        days: int | None = None,
        levels: list[int] | None = None,
    ):
        self.root, self.grid, self.years, self.stores, self.rows = root, grid, years, year_stores, rows
        self.save, self.days = save, days
        root.mkdir(parents=True, exist_ok=True)
        self.config = json.dumps({"name": "bench", "era5": era5_section(years, grid, levels)})

    def run(self, name: str, args: list[str], **extra) -> dict:
        row = run_job([name, "--config", self.config, *args], self.root / f"{name}-{len(self.rows)}.log")
        row.update(grid=self.grid, years=len(self.years), days=self.days, **extra)
        self.rows.append(row)
        if self.save:
            self.save()
        print(
            f"{self.grid:8} deg  {len(self.years)} y  {name:22s} {row['seconds']:8.1f} s  {row['peak_rss_mb']:8.0f} MB",
            flush=True,
        )
        return row

    def year_statistics(self) -> list[Path]:
        """One era5-year-stats job per year: the partial statistics."""
        partials = []
        for y, s in zip(self.years, self.stores):
            partials.append(self.root / f"{y}.json")
            self.run("era5-year-stats", ["--output", str(partials[-1]), str(s)])
        return partials

    def statistics(self, partials: list[Path]) -> Path:
        stats = self.root / "normalization.json"
        self.run("era5-stats", ["--output", str(stats), *map(str, partials)])
        return stats

    def split(self, stats: Path) -> tuple[Path, dict]:
        parts = []
        for y in self.years:
            part = self.root / "parts" / f"{y}.zarr"
            self.run(
                "era5-split-part",
                ["--split", "train", "--year", str(y), "--stats", str(stats), "--output", str(part)]
                + list(map(str, self.stores)),
            )
            self.rows[-1]["bytes"] = du(part)
            parts.append(part)
        store = self.root / "train.zarr"
        row = self.run(
            "era5-split",
            ["--split", "train", "--stats", str(stats), "--output", str(store), "--parts", *map(str, parts)]
            + ["--years", *map(str, self.stores)],
        )
        row["bytes"] = du(store)
        shutil.rmtree(self.root / "parts")  # temp() in the workflow: the store keeps the linked files
        return store, row

    def climatology(self, drop_years: bool = False) -> Path:
        """The parts, then the combine; ``drop_years``: delete the year stores once the parts
        have read them (room on disk at 1.40625 deg)."""
        n = len(self.years)
        parts = []
        for k in range(1, n + 1):
            part = self.root / "clim_parts" / f"{k}.zarr"
            self.run(
                "era5-climatology-part",
                ["--part", str(k), "--parts", str(n), "--output", str(part), *map(str, self.stores)],
            )
            self.rows[-1]["bytes"] = du(part)
            parts.append(part)
        if drop_years:
            for store in self.stores:
                shutil.rmtree(store)
        out = self.root / "climatology.zarr"
        self.run("era5-climatology", ["--output", str(out), *map(str, parts)])
        self.rows[-1]["bytes"] = du(out)
        shutil.rmtree(self.root / "clim_parts")
        return out
