"""Preprocessing that scales with the years: per-year statistics and split parts, climatology
parts of one year's worth each, small combines. Checked against the definitions computed with
plain numpy over all the data at once, for flat memory in the number of years, for the
statistics' hygiene, and for the per-year plan of the paper's config."""

from __future__ import annotations

import json
import logging
import os
import tracemalloc

import numpy as np
import pandas as pd
import pytest
import yaml
import zarr
from support import LEVELS, REPO, once
from support.era5 import small_era5_config

from dchag.era5 import demo
from dchag.era5.climatology import climatology, climatology_part, combine_climatology, day_block
from dchag.era5.preprocess import make_weights, preprocess_year
from dchag.era5.source import Era5InputError
from dchag.era5.split import assemble_split, build_split, split_part
from dchag.era5.statistics import STD_FLOOR_RATIO, combine_statistics, normalization_stats, year_statistics
from dchag.store import InputError, open_store

YEARS = (2003, 2004, 2005, 2006)  # 2004 is a leap year: day 60 is 29 February there, 1 March elsewhere
DAYS = 70


@pytest.fixture(scope="module")
def six_hourly(tmp_path_factory):
    """Four 70-day years of 6-hourly demo inputs regridded into per-year stores (chunks of 8 steps)."""

    def make(root):
        for year in YEARS:
            demo.write_year(root, year, 3.75, LEVELS, time_step_hours=6, days=DAYS)
        demo.write_constants(root, 3.75)
        cfg = small_era5_config(root, years=YEARS[:3])["era5"]
        cfg.update(time_step_hours=6, time_chunk=8)
        make_weights(cfg, YEARS[0], root / "w.nc")
        for y in YEARS:
            preprocess_year(cfg, y, root / "w.nc", root / f"{y}.zarr")

    root = once(tmp_path_factory, "six_hourly", make)  # made once for all test workers; read only
    return [root / f"{y}.zarr" for y in YEARS]


def _all(stores) -> tuple[np.ndarray, pd.DatetimeIndex]:
    x = np.concatenate([zarr.open_array(store=str(s), path="data", mode="r")[:] for s in stores])
    return x.astype(np.float64), pd.DatetimeIndex(np.concatenate([open_store(s).time.values for s in stores]))


def _reference_climatology(x: np.ndarray, times: pd.DatetimeIndex) -> tuple[np.ndarray, np.ndarray]:
    """By the definition: the mean over the years of each (day of year, hour), then for each
    day the mean of the days within 30 of it around the year (366 days) that have data."""
    hours = np.unique(times.hour)
    means = np.full((366, hours.size, *x.shape[1:]), np.nan)
    for d in range(1, 367):
        for k, h in enumerate(hours):
            at = (times.day_of_year == d) & (times.hour == h)
            if at.any():
                means[d - 1, k] = x[at].mean(axis=0)
    smooth = np.full_like(means, np.nan)
    has = ~np.isnan(means[:, 0, 0, 0, 0])
    for d in range(366):
        near = [j for j in range(366) if has[j] and min(abs(d - j), 366 - abs(d - j)) <= 30]
        if near:
            smooth[d] = means[near].mean(axis=0)
    return smooth, x.mean(axis=0)


def test_jobs_equal_the_definitions_over_all_the_data(six_hourly, tmp_path):
    """The pipeline's jobs (per-year statistics, split parts, climatology parts, combines) give
    the mean/std, the normalised split and the smoothed day-of-year and time-mean climatology
    that plain numpy computes over all years at once."""
    stores = list(six_hourly)
    x, times = _all(stores)
    names = open_store(stores[0]).attrs["channel_names"]

    partials = [year_statistics(s, tmp_path / f"s{k}.json") for k, s in enumerate(stores)]
    stats = json.loads(combine_statistics(partials, tmp_path / "stats.json").read_text())
    assert stats["channels"] == names and stats["count"] == x.shape[0] * 32 * 64
    assert np.allclose(stats["mean"], x.mean(axis=(0, 2, 3)), rtol=1e-12)
    assert np.allclose(stats["std_measured"], x.std(axis=(0, 2, 3)), rtol=1e-10)
    assert stats["near_constant"] == []
    in_process = json.loads(normalization_stats(stores, tmp_path / "stats2.json").read_text())
    assert in_process["mean"] == stats["mean"] and in_process["std"] == stats["std"]

    parts = [split_part("train", stores, y, tmp_path / "stats.json", tmp_path / f"p{y}.zarr") for y in YEARS]
    split = assemble_split("train", stores, parts, tmp_path / "stats.json", tmp_path / "train.zarr")
    ds = open_store(split)
    mean, std = np.asarray(stats["mean"]), np.asarray(stats["std"])
    expected = (x - mean[None, :, None, None]) / std[None, :, None, None]
    values = zarr.open_array(store=str(split), path="data", mode="r")[:]  # (xarray reads chunk by dask chunk: slow)
    assert values.shape == x.shape and np.allclose(values, expected, atol=2e-5)
    assert (pd.DatetimeIndex(ds.time.values) == times).all() and ds.attrs["years"] == list(YEARS)
    assert ds.data.encoding["chunks"] == (1, 1, 32, 64) and ds.data.encoding["shards"] == (32, 7, 32, 64)
    # the shards inside a year are the part's files, linked (not rewritten); 280 steps a year,
    # so shards 8 (steps 256-287) and 17 straddle years and were written by the assembly
    shard = split / "data" / "c" / "1" / "0" / "0" / "0"
    assert os.stat(shard).st_nlink == 2 and os.path.samefile(shard, parts[0] / "data" / "c" / "1" / "0" / "0" / "0")
    assert not (parts[0] / "data" / "c" / "8").exists() and (split / "data" / "c" / "8").exists()
    # the one-process helper writes the same store, and the parts' bytes are the final bytes
    again = build_split("train", stores, tmp_path / "stats.json", tmp_path / "train2.zarr")
    assert np.array_equal(zarr.open_array(store=str(again), path="data", mode="r")[:], values)

    n = len(stores)
    cparts = [climatology_part(stores, k, n, tmp_path / f"c{k}.zarr") for k in range(1, n + 1)]
    clim = open_store(combine_climatology(cparts, tmp_path / "clim.zarr"), chunks=None)  # no dask: read whole
    smooth, time_mean = _reference_climatology(x, times)
    for c, name in enumerate(names):
        got = clim[name].transpose("dayofyear", "hour", "lat", "lon").values
        assert np.array_equal(np.isnan(got), np.isnan(smooth[:, :, c])), name
        assert np.allclose(
            got, smooth[:, :, c], rtol=2e-6, atol=1e-6 * np.nanmax(np.abs(smooth[:, :, c])), equal_nan=True
        ), name
        assert np.allclose(
            clim[f"{name}_time_mean"].values, time_mean[c], rtol=2e-6, atol=1e-6 * np.abs(time_mean[c]).max()
        ), name
    assert clim["hour"].values.tolist() == [0, 6, 12, 18] and clim.attrs["years"] == list(YEARS)
    # the days 70 days of data reach (1-100 and, around the year, 337-366) have values, 101-336 not
    assert not np.isnan(clim["t2m"].sel(dayofyear=[1, 100, 337, 366]).values).any()
    assert np.isnan(clim["t2m"].sel(dayofyear=[101, 200, 336]).values).all()
    one = open_store(climatology(stores, tmp_path / "clim2.zarr"), chunks=None)
    assert np.array_equal(one["t2m"].values, clim["t2m"].values, equal_nan=True)
    # 10 parts of 37 days: part boundaries inside the data (days 37/38, 74/75) change nothing
    ten = [climatology_part(stores, k, 10, tmp_path / f"ten{k}.zarr") for k in range(1, 11)]
    by_ten = open_store(combine_climatology(ten, tmp_path / "clim10.zarr"), chunks=None)
    for name in names:
        assert np.array_equal(by_ten[name].values, clim[name].values, equal_nan=True), name


def test_day_blocks_cover_the_year_once():
    for parts in (1, 2, 3, 10, 40, 366):
        blocks = [day_block(k, parts) for k in range(1, parts + 1)]
        assert blocks[0][0] == 1 and blocks[-1][1] == 367
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(blocks, blocks[1:]))
    assert max(b - a for a, b in (day_block(k, 40) for k in range(1, 41))) == 10
    with pytest.raises(InputError, match="part 3 of 2"):
        day_block(3, 2)


def test_combines_refuse_incomplete_parts(six_hourly, tmp_path):
    stores = list(six_hourly)
    c = [climatology_part(stores, k, 3, tmp_path / f"c{k}.zarr") for k in (1, 3)]
    with pytest.raises(Era5InputError, match="do not cover day of year 123"):
        combine_climatology(c, tmp_path / "clim.zarr")
    stats = normalization_stats(stores[:1], tmp_path / "stats.json")
    part = split_part("train", stores[:2], YEARS[0], stats, tmp_path / "p.zarr")
    with pytest.raises(InputError, match=r"parts of years \[2004\] missing"):
        assemble_split("train", stores[:2], [part], stats, tmp_path / "train.zarr")
    # parts normalised with other statistics (the statistics job ran again in between)
    other = normalization_stats(stores[1:2], tmp_path / "other.json")
    second = split_part("train", stores[:2], YEARS[1], stats, tmp_path / "p2.zarr")
    with pytest.raises(InputError, match="normalised with other statistics than .*other.json"):
        assemble_split("train", stores[:2], [part, second], other, tmp_path / "train.zarr")
    assert not (tmp_path / "clim.zarr").exists() and not (tmp_path / "train.zarr").exists()


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_is_flat_in_the_number_of_years(six_hourly, tmp_path):
    """Every job holds a chunk (a shard), not the years: with 4 years as with 2, the climatology
    part of one year's worth, the split part, the assembly (2 years already have a shard
    across their boundary) and the combine peak alike (tracemalloc sees numpy's and zarr's
    buffers)."""
    stores = list(six_hourly)
    stats = normalization_stats(stores, tmp_path / "stats.json")
    peaks = {}
    for n in (2, 4):
        some = stores[:n]
        parts = [tmp_path / f"p{n}_{y}.zarr" for y in YEARS[:n]]
        cparts = [tmp_path / f"c{n}_{k}.zarr" for k in range(1, n + 1)]
        peaks[n] = {
            "climatology_part": _peak(lambda: climatology_part(some, 1, n, cparts[0])),  # noqa: B023
            "split_part": _peak(lambda: split_part("train", some, YEARS[0], stats, parts[0])),  # noqa: B023
        }
        for k in range(2, n + 1):
            climatology_part(some, k, n, cparts[k - 1])
        for y, p in zip(YEARS[1:n], parts[1:]):
            split_part("train", some, y, stats, p)
        peaks[n]["assemble_split"] = _peak(
            lambda: assemble_split("train", some, parts, stats, tmp_path / f"t{n}.zarr")  # noqa: B023
        )
        peaks[n]["combine_climatology"] = _peak(
            lambda: combine_climatology(cparts, tmp_path / f"clim{n}.zarr")  # noqa: B023
        )
    for job in peaks[2]:
        assert peaks[4][job] < 1.3 * peaks[2][job], (job, peaks)


def _near_constant_stores(six_hourly, tmp_path):
    """Copies of two years in which channel lsm is a near-constant field as in ClimaX issue #46
    (mean -0.765, std 6e-7) in the training year, shifted by 1e-4 in the other, and u10 is
    exactly 5."""
    import shutil

    out = []
    rng = np.random.default_rng(0)
    for k, src in enumerate(six_hourly[:2]):
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        data = zarr.open_array(store=str(dst), path="data", mode="r+")
        field = data[:]
        field[:, 6] = -0.765 + 1e-4 * k + 6e-7 * rng.standard_normal(field[:, 6].shape)
        field[:, 5] = 5.0
        data[:] = field
        out.append(dst)
    return out


def test_a_near_constant_channel_is_reported_and_its_std_floored(six_hourly, tmp_path, caplog):
    train, test = _near_constant_stores(six_hourly, tmp_path)
    with caplog.at_level(logging.WARNING, logger="dchag.era5.statistics"):
        stats_file = combine_statistics([year_statistics(train, tmp_path / "s.json")], tmp_path / "stats.json")
    stats = json.loads(stats_file.read_text())
    flagged = {f["channel"]: f for f in stats["near_constant"]}
    assert set(flagged) == {"u10", "lsm"}
    assert flagged["lsm"]["std"] == pytest.approx(6e-7, rel=0.05)
    assert stats["std"][6] == pytest.approx(STD_FLOOR_RATIO * 0.765, rel=1e-4) == flagged["lsm"]["std_used"]
    assert stats["std"][5] == 1.0 and stats["std_measured"][5] == 0.0  # no spread at all: centred, unscaled
    assert stats["std"][:5] == stats["std_measured"][:5]  # the real fields are untouched
    assert any("lsm" in r.getMessage() and "near-constant" in r.getMessage() for r in caplog.records)
    assert any("u10" in r.getMessage() and "constant" in r.getMessage() for r in caplog.records)
    # the other year's shift of 1e-4 (0.013 %) stays about one unit, not 1e-4 / 6e-7 = 170
    split = build_split("test", [test], stats_file, tmp_path / "test.zarr")
    values = zarr.open_array(store=str(split), path="data", mode="r")[:]
    assert 1.0 < np.abs(values[:, 6]).max() < 2.0
    assert np.abs(values[:, 5]).max() == 0.0


# -- the plan: one job per year for every step whose cost grows with the years -------------------
@pytest.mark.parametrize(
    "config, years", [("era5", None), ("paper", None), ("era5", 40)], ids=["config-era5", "config-paper", "40-years"]
)
def test_the_paper_config_plans_one_job_per_year(config, years, tmp_path):
    from support.commands import planned, snakemake, workdir

    cfg = yaml.safe_load((REPO / "config" / f"{config}.yaml").read_text())
    if years:  # the paper's 40 years: 1979-2014 train, 2015-2016 val, 2017-2018 test
        cfg["era5"]["years"] = {"train": list(range(1979, 2015)), "val": [2015, 2016], "test": [2017, 2018]}
    path = tmp_path / "era5.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tmp_path / "w").mkdir()
    cwd = workdir(tmp_path / "w", [path])
    proc = snakemake(cwd, "-n", "--quiet", "rules", "--cores", "4", "--configfile", str(path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    jobs = planned(proc.stdout + proc.stderr)
    train = len(cfg["era5"]["years"]["train"])
    every = sum(len(v) for v in cfg["era5"]["years"].values())
    assert jobs["era5_year"] == every and jobs["era5_split_part"] == every
    assert jobs["era5_year_stats"] == train and jobs["era5_climatology_part"] == train  # climatology_split: train
    assert jobs["era5_stats"] == 1 and jobs["era5_split"] == 3 and jobs["era5_climatology"] == 1
