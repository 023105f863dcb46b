"""The data path: every store the pipeline writes holds its fields as float32, and the
training datasets read a batch's chunks in one concurrent read, the same values as memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from support.stores import float_arrays


def assert_float32(stores: list[Path]) -> None:
    empty = [str(s) for s in stores if not float_arrays(s)]
    assert not empty, f"no field in {empty}"
    wrong = {f"{s.name}:{k}": str(v) for s in stores for k, v in float_arrays(s).items() if v != np.float32}
    assert not wrong, wrong


def _forecast_model(root: Path, cfg: dict, store: Path):
    """An untrained (seeded) forecasting model described from ``store`` as export does."""
    from support.commands import run_config

    from dchag.config import run_settings, validate
    from dchag.model import ChannelViT
    from dchag.predict import export
    from dchag.train.tasks import build_task

    c = validate(run_config(cfg, steps=1))
    t = build_task(run_settings(c, "f"), {"train": store, "val": store})
    torch.manual_seed(0)
    return export.describe(t, store, ChannelViT(t.model_cfg), {"run": "f"})


def test_every_era5_store_the_pipeline_writes_is_float32(data_root, tmp_path):
    from dchag.era5.climatology import climatology_part, combine_climatology
    from dchag.evaluate.forecast import baseline_forecast, wb2_climatology, write_truth
    from dchag.predict.weather import forecast, from_store

    root, cfg = data_root
    train, val = root / "era5" / "train.zarr", root / "era5" / "val.zarr"
    years = [root / "y2001.zarr", root / "y2002.zarr"]
    parts = [climatology_part(years, k, 2, tmp_path / f"part{k}.zarr") for k in (1, 2)]
    clim = combine_climatology(parts, tmp_path / "climatology.zarr")
    wb2_climatology(str(clim), str(tmp_path / "clim_wb2.zarr"))
    variables = ["z500", "t850", "t2m"]
    write_truth(str(val), variables, str(tmp_path / "truth.zarr"))
    for kind in ("persistence", "climatology"):
        baseline_forecast(kind, str(val), variables, [24, 48], str(tmp_path / f"{kind}_forecast.zarr"), str(clim))
    model = _forecast_model(root, cfg, train)
    forecast(model, from_store(model, str(val)), [24, 48], str(tmp_path / "forecast.zarr"), batch_size=4)
    stores = [
        *years,
        train,
        val,
        *parts,
        clim,
        tmp_path / "clim_wb2.zarr",
        tmp_path / "truth.zarr",
        tmp_path / "persistence_forecast.zarr",
        tmp_path / "climatology_forecast.zarr",
        tmp_path / "forecast.zarr",
    ]
    assert_float32(stores)
    # the climatology: a chunk per day of year (what scoring reads), a variable's days in one shard
    for store in (clim, tmp_path / "clim_wb2.zarr"):
        group = zarr.open_group(str(store), mode="r")
        dims = {n: group[n].metadata.dimension_names for n in group.array_keys()}
        by_day = [group[n] for n, d in dims.items() if "dayofyear" in d and len(d) > 1]  # not the coordinate
        assert len(by_day) >= len(variables), store
        for a in by_day:
            day = a.metadata.dimension_names.index("dayofyear")
            assert a.chunks[day] == 1 and a.shards == a.shape, (store, a.path, a.chunks, a.shards)


def test_every_hyperspectral_store_and_prediction_is_float32(tmp_path):
    import scipy.io
    from support.hsi import hsi_model

    from dchag.hsi import demo
    from dchag.predict.hsi import classify_scene, reconstruct_image

    cube, labels, _, _ = demo.scene(24, 24, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"indian_pines_gt": labels})
    small = {"patch_size": 1, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2}
    scene = {"image": str(tmp_path / "img.mat"), "labels": str(tmp_path / "gt.mat"), "patch": 5}
    classifier, patches = hsi_model(tmp_path, "classification", scene, small)
    images = demo.write_envi(tmp_path / "envi", count=2, rows=32, cols=32)
    section = {"images": [str(p) for p in images], "tile": 16}
    mae, tiles = hsi_model(tmp_path, "mae", section, {**small, "patch_size": 4})
    classify_scene(classifier, str(tmp_path / "img.mat"), str(tmp_path / "map.zarr"))
    reconstruct_image(mae, str(images[0]), str(tmp_path / "recon.zarr"), None, 2)
    assert_float32([Path(patches), Path(tiles), tmp_path / "map.zarr", tmp_path / "recon.zarr"])


# -- the loader: a batch's chunks in one concurrent read ----------------------------------------
def _float64_copy(store: Path, out: Path) -> Path:
    """``store`` as the writers made it before their stores were float32: data float64, same chunks."""
    import xarray as xr

    from dchag.store import channel_chunks, compressors

    ds = xr.open_zarr(store, consolidated=False).load().drop_encoding()
    ds["data"] = ds["data"].astype(np.float64)
    encoding = {"data": {**channel_chunks(ds["data"].shape, 32), "compressors": compressors()}}
    ds.to_zarr(out, zarr_format=3, consolidated=False, encoding=encoding)
    return out


def test_a_batch_from_zarr_is_the_one_from_memory_and_zarrs_own_reads_bit_for_bit(data_root, tmp_path):
    """One D-CHAG rank of 2 (a scattered half of the channels) and the outputs: a batch read in
    one concurrent read equals zarr-python's reads of the same steps and channels and the
    in-memory copy's, repeated samples included; a float64 store of earlier versions reads as
    the same float32 values. The in-memory copy is the same read with tensorstore and, as a
    process that forks loader workers reads it, with zarr."""
    from dchag.store import open_store
    from dchag.train.data import ForecastDataset

    root, _ = data_root
    store = root / "era5" / "train.zarr"
    names = [str(c) for c in open_store(store).channel.values]
    channels = names[::-1]  # the run's order is not the store's
    rank = [0, 2, 3, 5]
    outputs = ["t2m", "z500"]
    array = zarr.open_array(store=str(store), path="data", mode="r")
    assert array.dtype == np.float32
    old = _float64_copy(store, tmp_path / "old.zarr")
    for path in (store, old):
        args = (path, channels, rank, outputs, (24, 48), 5)
        from_zarr, cached = ForecastDataset(*args), ForecastDataset(*args, cache_bytes=2**30)
        assert from_zarr.x_mem is None and cached.x_mem is not None and cached.x_mem.dtype == np.float32
        by_zarr = ForecastDataset(*args, cache_bytes=2**30, workers_read_zarr=True)
        assert np.array_equal(by_zarr.x_mem, cached.x_mem) and np.array_equal(by_zarr.y_mem, cached.y_mem)
        batch = [6, 0, 3, 6, 1]
        want_x = [names.index(channels[r]) for r in rank]
        want_y = [names.index(o) for o in outputs]
        for got, mem in zip(from_zarr.__getitems__(batch), cached.__getitems__(batch)):
            assert all(torch.equal(a, b) and a.dtype == torch.float32 for a, b in zip(got, mem))
        for i, (x, lead, y) in zip(batch, from_zarr.__getitems__(batch)):
            t = int(from_zarr.anchors[i])
            later = t + int(lead) // 24
            assert np.array_equal(x.numpy(), array.get_orthogonal_selection((t, want_x)))
            assert np.array_equal(y.numpy(), array.get_orthogonal_selection((later, want_y)))


@pytest.mark.parametrize(
    "workers, cache_mb, zarr_in_workers", [(0, 0, False), (0, 1024, False), (1, 1024, False), (1, 0, True)]
)
def test_the_in_memory_copies_are_read_with_zarr_only_where_loader_workers_read_zarr(
    data_root, workers, cache_mb, zarr_in_workers
):
    """Loader workers forked from a process that used tensorstore cannot use it: a forecast
    run's in-memory copies are read with zarr only where the run has workers and a split is too
    large to hold in memory (its workers read that split from Zarr, with tensorstore)."""
    from support.commands import run_config

    from dchag.config import run_settings, validate
    from dchag.train.tasks import build_task

    root, base = data_root
    cfg = validate(run_config(base, num_workers=workers, cache_mb=cache_mb))
    stores = {split: root / "era5" / f"{split}.zarr" for split in ("train", "val")}
    task = build_task(run_settings(cfg, "f"), stores)
    assert task._workers_read_zarr([0, 2, 3, 5]) is zarr_in_workers


LOADER_SCRIPT = """
import sys, torch
from torch.utils.data import DataLoader
from dchag.train.data import ForecastDataset, ResumableSampler
from dchag.train.data import collate

store, names = sys.argv[1], sys.argv[2].split(",")
ds = ForecastDataset(store, names, [1, 2, 3], ["z500"], (24, 24), 0)
sampler = ResumableSampler(len(ds), 1, 0, seed=2)

def batches(workers):
    return list(DataLoader(ds, batch_size=3, sampler=sampler, num_workers=workers, collate_fn=collate))

forked = batches(2)  # the workers read with tensorstore
print("read in this process", file=sys.stderr, flush=True)
main = batches(0)
again = batches(2)  # forked after this process read with tensorstore: zarr
assert len(main) == len(forked) == len(again) > 1
for a, b, c in zip(main, forked, again):
    assert all(torch.equal(u, v) and torch.equal(u, w) for u, v, w in zip(a, b, c))
print("same batches")
"""


def test_loader_workers_read_the_batches_the_main_process_reads(data_root):
    """The DataLoader's forked workers read with tensorstore, and give the batches the training
    process reads; workers forked after the training process read with tensorstore (which
    they could not use) read with zarr, say so, and give the same batches."""
    import subprocess
    import sys

    from dchag.store import open_store

    root, _ = data_root
    store = root / "era5" / "train.zarr"
    names = [str(c) for c in open_store(store).channel.values]
    proc = subprocess.run(
        [sys.executable, "-c", LOADER_SCRIPT, str(store), ",".join(names)], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "same batches" in proc.stdout, proc.stderr[-3000:]
    before, after = proc.stderr.split("read in this process")
    assert "read with zarr" not in before and "read with zarr, slowly" in after, proc.stderr


def test_a_damaged_shard_is_one_error_naming_the_store(data_root, tmp_path):
    import shutil

    from dchag.store import open_store
    from dchag.train.data import DataError, ForecastDataset

    root, _ = data_root
    store = tmp_path / "train.zarr"
    shutil.copytree(root / "era5" / "train.zarr", store)
    shard = next(p for p in sorted((store / "data" / "c").rglob("*")) if p.is_file())
    shard.write_bytes(shard.read_bytes()[:-100])
    names = [str(c) for c in open_store(store).channel.values]
    ds = ForecastDataset(store, names, [0, 1], ["z500"], (24, 24), 0)
    with pytest.raises(DataError, match=f"cannot read array 'data' of {store}") as err:
        ds.__getitems__([0, 1, 2])
    assert "\n" not in str(err.value)


def test_the_loader_benchmark_measures_every_source_side_by_side(tmp_path):
    """benchmarks/loader_benchmark.py --quick: its store from the real writers, every source and
    worker count measured in one run, the report from the JSON (numbers of a smoke test, not
    a measurement)."""
    import json
    import subprocess
    import sys

    from support import REPO

    out = tmp_path / "loader"
    cmd = [sys.executable, str(REPO / "benchmarks" / "loader_benchmark.py"), "--quick"]
    proc = subprocess.run(
        [*cmd, "--output", str(out), "--workdir", str(tmp_path / "work")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    for source in ("dchag_cold", "dchag_cached", "memory"):
        for w in (0, 1, 2):
            assert row[f"{source}_w{w}"] > 0 and row[f"{source}_w{w}_mb_s"] > 0
    assert row["tensorstore_cold_w0"] > 0 and row["tensorstore_cached_w0"] > 0 and row["zarr_python_cached_w0"] > 0
    assert (row["grid"], row["tp"], row["channels"], row["outputs"]) == (5.625, 8, 10, 5)
    # the chunk layout compared: rank 0 of 8's channels in one block, its outputs in the blocks they lie in
    assert row["blocks_cold_w0"] > 0 and row["blocks_cached_w0"] > 0 and row["block_chunks_per_step"][0] == 1
    md = out.with_suffix(".md").read_text()
    assert "dchag / tensorstore (cached)" in md and "shared with other" in md and "per block cached" in md
    assert not (tmp_path / "work").exists()


def test_the_committed_loader_benchmark_shows_the_rates_the_readme_states():
    """benchmarks/results/loader.json, measured at both grids: at 5.625 deg every rank's
    batches from Zarr (no cache, page-cached) come at half tensorstore's concurrent read of the
    same chunks or more, and a rank of D-CHAG over 8 (10 channels and the 5 outputs) at 10 times
    zarr-python's reads a chunk per call (the loader before) or more."""
    import json

    from support import REPO

    doc = json.loads((REPO / "benchmarks" / "results" / "loader.json").read_text())
    rows = [r for r in doc["rows"] if not r["one_core"]]
    assert sorted((r["grid"], r["tp"]) for r in rows) == [(g, t) for g in (1.40625, 5.625) for t in (1, 2, 4, 8)]
    coarse = [r for r in rows if r["grid"] == 5.625]
    for r in coarse:
        assert r["dchag_cached_w0"] >= 0.5 * r["tensorstore_cached_w0"], r
    (rank,) = [r for r in coarse if r["tp"] == 8]
    assert (rank["channels"], rank["outputs"]) == (10, 5)
    assert rank["dchag_cached_w0"] >= 10 * rank["zarr_python_cached_w0"], rank


def test_training_from_zarr_with_workers_equals_training_from_memory(data_root, tmp_path):
    """A D-CHAG run on 2 ranks whose batches come from Zarr (cache_mb 0) through a DataLoader
    worker each ends with the weights of the same run read from memory, bit for bit, with a
    worker each (forked after the ranks read their in-memory copies with tensorstore) or none."""
    from support.commands import final_weights, run_config, train_in_ranks

    root, base = data_root
    weights = {}
    for name, extra in (("zarr", {"cache_mb": 0, "num_workers": 1}), ("memory", {}), ("workers", {"num_workers": 1})):
        out = tmp_path / name
        text = train_in_ranks(run_config(base, steps=4, checkpoint_every=4, val_every=4, **extra), out, root)
        assert (out / "final" / ".metadata").exists() and "read with zarr" not in text, text[-3000:]
        weights[name] = final_weights(out)
    for name in ("zarr", "workers"):
        assert weights[name].keys() == weights["memory"].keys()
        assert all(torch.equal(weights[name][k], weights["memory"][k]) for k in weights[name]), name


@pytest.mark.parametrize("before, after", [(2, 4), (4, 3), (3, 1)])
def test_the_sampler_continues_the_epoch_on_another_number_of_ranks(before, after):
    """Rank r of D takes the epoch's samples offset + r, offset + r + D, ...: the ranks of a
    run resumed on another number of ranks take, together, exactly the samples the first
    layout had not, in the same order, each rank as many as the others."""
    size, batch, steps = 53, 2, 3
    from dchag.train.data import ResumableSampler

    old = [ResumableSampler(size, before, r, seed=7) for r in range(before)]
    order = np.random.default_rng([7, 0]).permutation(size)
    consumed = steps * batch * before
    taken = [s.indices(0)[: steps * batch] for s in old]
    assert sorted(sum(taken, [])) == sorted(order[:consumed].tolist())
    new = [ResumableSampler(size, after, r, seed=7) for r in range(after)]
    for s in new:
        s.offset = consumed
    rest = [list(s) for s in new]
    count = (size // after * after - consumed) // after
    assert len({len(r) for r in rest}) == 1 and len(rest[0]) == len(new[0]) == count
    interleaved = [rest[r][k] for k in range(len(rest[0])) for r in range(after)]
    assert interleaved == order[consumed : consumed + after * len(rest[0])].tolist()
