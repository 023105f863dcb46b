"""Split stores (train / val / test): a split's years concatenated in time, normalised with the
training statistics, in shards of ``TIME_SHARD`` steps whose chunks are one step of one
channel (a training rank reads only its channels).

Written one job per year and a small assembly, each one shard at a time with zarr directly
(no dask graph over the split):

* ``dchag era5-split-part`` (one per year of the split) lays out the whole split store
  (coordinates, the empty data array) and writes the shards that lie inside its year;
* ``dchag era5-split`` lays out the store again, hard-links every part's shard files into it
  (the parts share the layout, so a shard file means the same in both), writes the few shards
  that straddle two years, and renames it into place.

The result is the store one pass over the concatenated years would write, bit for bit.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from .. import jsonio, provenance
from ..store import InputError, atomic_path, channel_chunks, compressors, release_freed_memory
from .source import Era5InputError
from .years import YearStore, open_years

TIME_SHARD = 32  # time steps per shard: the store stays a modest number of files
DROPPED_ATTRS = ("year", "provenance", "units_note", "nan_filled")


class Layout:
    """Where each year's steps lie in the split store, and its shards."""

    def __init__(self, years: list[YearStore], time_shard: int = TIME_SHARD):
        self.years = years
        self.offsets = np.cumsum([0] + [y.steps for y in years])
        self.steps = int(self.offsets[-1])
        self.shard = max(1, min(time_shard, self.steps))

    def shards(self) -> list[tuple[int, int]]:
        return [(s, min(s + self.shard, self.steps)) for s in range(0, self.steps, self.shard)]

    def inside(self, k: int) -> list[tuple[int, int]]:
        """The shards that lie entirely inside year ``k``."""
        lo, hi = self.offsets[k], self.offsets[k + 1]
        return [(a, b) for a, b in self.shards() if a >= lo and b <= hi]

    def straddling(self) -> list[tuple[int, int]]:
        """The shards that hold steps of more than one year."""
        return [
            (a, b)
            for a, b in self.shards()
            if not any(a >= lo and b <= hi for lo, hi in zip(self.offsets[:-1], self.offsets[1:]))
        ]

    def read(self, a: int, b: int) -> np.ndarray:
        """Steps [a, b) of the concatenated years (physical units)."""
        pieces = []
        for k, y in enumerate(self.years):
            lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
            if hi <= a or lo >= b:
                continue
            for _, block in y.blocks(max(a, lo) - lo, min(b, hi) - lo):
                pieces.append(block)
        return np.concatenate(pieces, axis=0)


def _statistics(stats_file: str | Path, names: list[str], first: Path) -> tuple[np.ndarray, np.ndarray]:
    stats = jsonio.read_json(stats_file, "normalisation statistics")
    if not isinstance(stats, dict) or not {"channels", "mean", "std"} <= stats.keys():
        raise Era5InputError(f"{stats_file} is not a statistics file of `dchag era5-stats` (channels, mean, std)")
    if stats["channels"] != names:
        raise Era5InputError(f"channels of {first} differ from those of the statistics {stats_file}")
    return np.asarray(stats["mean"], np.float32), np.asarray(stats["std"], np.float32)


def _lay_out(
    path: Path, split: str, layout: Layout, mean: np.ndarray, std: np.ndarray, stats_file, config, extra: dict
) -> zarr.Array:
    """The split store's coordinates, attributes and empty data array at ``path``; returns the
    data array. Every part and the assembly call this with the same arguments, so their data
    arrays share one layout and a shard file is the same bytes in each."""
    years = layout.years
    first = years[0]
    ny, nx = len(first.lat), len(first.lon)
    shape = (layout.steps, len(first.names), ny, nx)
    times = np.concatenate([y.times.values for y in years])
    # dtype by keyword: dask ignores a positional one (and the store was float64)
    empty = da.zeros(shape, dtype=np.float32, chunks=(layout.shard, *shape[1:]))
    ds = xr.Dataset(
        {"data": (("time", "channel", "lat", "lon"), empty)},
        coords={
            "time": times,
            "channel": np.arange(shape[1]),
            "lat": ("lat", first.lat, {"units": "degrees_north", "standard_name": "latitude"}),
            "lon": ("lon", first.lon, {"units": "degrees_east", "standard_name": "longitude"}),
            **({"level": ("channel", first.level)} if first.level is not None else {}),
            "mean": ("channel", mean.astype(np.float64)),
            "std": ("channel", std.astype(np.float64)),
        },
        attrs={
            **{k: v for k, v in first.attrs.items() if k not in DROPPED_ATTRS},
            "split": split,
            "years": [y.year for y in years],
            "normalisation": "(x - mean) / std per channel; mean and std from the training years, in the coordinates",
            "nan_filled": int(sum(int(y.attrs.get("nan_filled", 0)) for y in years)),
            **provenance.as_attrs(provenance.record(config, statistics=str(stats_file))),
            **extra,
        },
    )
    encoding = {"data": {**channel_chunks(shape, layout.shard), "compressors": compressors()}}
    ds.to_zarr(path, zarr_format=3, consolidated=False, compute=False, mode="w", encoding=encoding)
    return zarr.open_array(store=str(path), path="data", mode="r+")


def _write_shards(out: zarr.Array, layout: Layout, shards, mean: np.ndarray, std: np.ndarray) -> None:
    m, s = mean[None, :, None, None], std[None, :, None, None]
    for a, b in shards:
        out[a:b] = ((layout.read(a, b) - m) / s).astype(np.float32)
        release_freed_memory()


def _open(split: str, year_stores, stats_file) -> tuple[Layout, np.ndarray, np.ndarray]:
    years = open_years(year_stores)
    if len({y.year for y in years}) != len(years):
        raise Era5InputError(f"split {split}: a year is given twice ({', '.join(str(y.path) for y in years)})")
    mean, std = _statistics(stats_file, years[0].names, years[0].path)
    return Layout(years), mean, std


def split_part(
    split: str,
    year_stores: list[str | Path],
    year: int,
    stats_file: str | Path,
    output: str | Path,
    config: dict | None = None,
) -> Path:
    """Year ``year``'s part of split ``split`` (its years ``year_stores``, in time order): the
    split store's layout with the shards that lie inside that year."""
    layout, mean, std = _open(split, year_stores, stats_file)
    k = next((i for i, y in enumerate(layout.years) if y.year == year), None)
    if k is None:
        raise InputError(f"year {year} is not among the stores of split {split}: {', '.join(map(str, year_stores))}")
    with atomic_path(output, "era5-split-part") as tmp:
        out = _lay_out(tmp, split, layout, mean, std, stats_file, config, {"part_of_year": year})
        _write_shards(out, layout, layout.inside(k), mean, std)
    return Path(output)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or, across file systems, copy) every file under ``src`` to the same place
    under ``dst``."""
    for root, _, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, target / name)
            except OSError as err:
                if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copyfile(Path(root) / name, target / name)


def assemble_split(
    split: str,
    year_stores: list[str | Path],
    parts: list[str | Path],
    stats_file: str | Path,
    output: str | Path,
    config: dict | None = None,
) -> Path:
    """The split store from its per-year parts: their shards linked in, the shards across
    year boundaries written here."""
    layout, mean, std = _open(split, year_stores, stats_file)
    by_year = {}
    for p in parts:
        if not (Path(p) / "data" / "zarr.json").exists():
            raise InputError(f"{p} is not a split part of `dchag era5-split-part` (no data array)")
        group = zarr.open_group(store=str(p), mode="r")
        attrs = group.attrs
        if attrs.get("split") != split or "part_of_year" not in attrs:
            raise InputError(f"{p} is not a part of split {split}")
        if not (
            np.array_equal(group["mean"][:], mean.astype(np.float64))
            and np.array_equal(group["std"][:], std.astype(np.float64))
        ):
            raise InputError(f"{p} was normalised with other statistics than {stats_file}: make the parts again")
        by_year[int(attrs["part_of_year"])] = Path(p)
    missing = [y.year for y in layout.years if y.year not in by_year]
    if missing or len(by_year) != len(layout.years):
        raise InputError(f"split {split}: parts of years {missing} missing, or parts of other years given")
    with atomic_path(output, "era5-split") as tmp:
        out = _lay_out(tmp, split, layout, mean, std, stats_file, config, {})
        for y in layout.years:
            chunks = by_year[y.year] / "data" / "c"
            if chunks.exists():
                _link_tree(chunks, tmp / "data" / "c")
        _write_shards(out, layout, layout.straddling(), mean, std)
    return Path(output)


def build_split(
    split: str,
    year_stores: list[str | Path],
    stats_file: str | Path,
    output: str | Path,
    config: dict | None = None,
) -> Path:
    """The per-year parts and their assembly in one process (for scripts and tests)."""
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(output).parent, prefix=f".{split}-parts-") as tmp:
        parts = []
        for store in year_stores:
            year = YearStore(store).year
            parts.append(split_part(split, year_stores, year, stats_file, Path(tmp) / f"{year}.zarr", config))
        return assemble_split(split, year_stores, parts, stats_file, output, config)
