"""One training rank's batches from a split store: dchag's ForecastDataset from Zarr (no
in-memory cache), tensorstore's concurrent read of the same chunks, the rank's channels in
memory (train.cache_mb), and zarr-python a chunk per call (the loader before its reads were
concurrent), side by side in one run.

Data: a split store written by the real writers (`dchag.era5.split.build_split`, its layout:
one chunk per time step and channel in shards of 32 steps) from the preprocessing benchmark's
synthetic per-year stores (80 channels, 6-hourly; labelled synthetic), at 5.625 deg and
1.40625 deg (the first days of a year: a rank's read rate does not depend on the length).

A rank of D-CHAG over T = 1, 2, 4, 8 tensor-parallel ranks reads its 80 / T channels and the 5
output channels at t + lead, batches of 32 random samples (ResumableSampler), collated as the
trainer does. Sources, each cold (the store's pages dropped from the page cache with
posix_fadvise, checked with fincore) and page-cached:

* `dchag`: ForecastDataset from Zarr through the trainer's DataLoader with 0, 1 and 2 workers;
* `tensorstore`: one tensorstore read per chunk of the batch (every sample's steps x channels),
  all in flight at once, in the process (0 workers), tensorstore's default spec; it neither
  collates nor makes tensors, as the datasets' rates include;
* `memory`: ForecastDataset with the rank's channels in memory, 0, 1 and 2 workers;
* `zarr-python`: a read per (sample, run of consecutive channels), as the loader did before
  (page-cached, 0 workers).

Each (grid, T) is measured in a process of its own, and again in a process pinned to one core
(`one core`: what one loader worker on a core of its own reads), from which the workers a rank
needs on the preprocessing benchmark's nodes follow.

The chunk layout: the same data written again with one chunk per time step and block of
`CHANNEL_BLOCK` channels (T = 8's block; same 32-step shards), read by tensorstore as the
per-channel layout is: every chunk a rank's batch touches (the blocks that hold its channels
and its outputs), all in flight at once, cold and page-cached.

    python benchmarks/loader_benchmark.py --output benchmarks/results/loader
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dchag.bench import results
from dchag.bench.nodes import NODES, predicted_steps
from dchag.bench.procs import drop_cache, json_lines
from dchag.bench.stores import OUTPUTS, split_store

BATCH = 32
LEADS = (6, 24)  # hours: a target up to a day ahead
GRIDS = {5.625: 120, 1.40625: 48}  # days of the generated year: 480 and 192 steps
WORKERS = (0, 1, 2)
PREFETCH = 2
TENSOR_PARALLEL = (1, 2, 4, 8)
CHANNEL_BLOCK = 10  # the chunk layout compared: one chunk per step and block of channels


def write_blocks(store: Path, out: Path) -> Path:
    """The split store's data array again, one chunk per step and CHANNEL_BLOCK channels in the
    same shards of steps (a Zarr array at ``out``)."""
    import zarr

    from dchag.store import compressors

    src = zarr.open_array(store=str(store), path="data", mode="r")
    t, c, ny, nx = src.shape
    shard = src.shards[0]
    dst = zarr.create_array(
        store=str(out),
        shape=src.shape,
        chunks=(1, CHANNEL_BLOCK, ny, nx),
        shards=(shard, c, ny, nx),
        dtype=np.float32,
        compressors=compressors(),
    )
    for a in range(0, t, shard):
        dst[a : a + shard] = src[a : a + shard]
    return out


# -- one (grid, T) in its own process -------------------------------------------------------------
def measure(store: Path, tp: int, batches: int, one_core: bool, blocks: Path | None = None) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from dchag.train.data import ForecastDataset, collate, store_info

    torch.set_num_threads(1)
    names = store_info(store)["channel_names"]
    rank = list(range(math.ceil(len(names) / tp)))  # rank 0's channel block

    def dataset(cache: int) -> ForecastDataset:
        return ForecastDataset(store, names, rank, OUTPUTS, LEADS, seed=0, cache_bytes=cache)

    ds = dataset(0)
    rng = np.random.default_rng(0)
    # a DataLoader's first batches are its start-up and the ones its workers prefetched meanwhile:
    # the timed batches follow them
    skip = 1 + max(WORKERS) * PREFETCH
    total = (skip + batches) * BATCH
    order = np.concatenate([rng.permutation(len(ds)) for _ in range(math.ceil(total / len(ds)))])[:total].tolist()
    sample_bytes = (len(rank) + len(OUTPUTS)) * int(np.prod(ds.data.shape[2:])) * 4
    out = {"tp": tp, "channels": len(rank), "outputs": len(OUTPUTS), "batch": BATCH, "batches": batches}
    out["sample_mb"] = sample_bytes / 2**20

    def timed(label: str, run, n: int = batches) -> None:
        t0 = time.perf_counter()
        run(n)
        rate = n * BATCH / (time.perf_counter() - t0)
        out[label] = round(rate, 1)
        out[f"{label}_mb_s"] = round(rate * sample_bytes / 2**20, 1)

    def loader(d, workers: int):
        it = iter(
            DataLoader(
                d,
                batch_size=BATCH,
                sampler=order,
                num_workers=workers,
                prefetch_factor=PREFETCH if workers else None,
                collate_fn=collate,
            )
        )
        for _ in range(skip):  # start-up and prefetched batches: the timed ones are the same for every source
            next(it)

        def run(n):
            for _ in range(n):
                next(it)

        return run

    def cold(label: str, make_run) -> None:
        drop_cache(store)
        run = make_run()
        drop_cache(store)  # after the start-up batches
        timed(label, run)

    # DataLoader workers first: a process forked from one that used tensorstore cannot use it
    workers = (0,) if one_core else WORKERS
    for w in workers:
        if w:
            cold(f"dchag_cold_w{w}", lambda w=w: loader(ds, w))
            timed(f"dchag_cached_w{w}", loader(ds, w))
    mem = dataset(2**62)
    for w in workers:
        timed(f"memory_w{w}", loader(mem, w))
    del mem
    cold("dchag_cold_w0", lambda: loader(ds, 0))
    timed("dchag_cached_w0", loader(ds, 0))

    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(store / "data")}}
    array = ts.open(spec, read=True).result()
    chunks = [int(c) for c in ds.in_ids], [int(c) for c in ds.out_ids]

    def tensorstore_reads(n: int) -> None:
        for b in range(skip, skip + n):
            idx = order[b * BATCH : (b + 1) * BATCH]
            steps = ds.anchors[idx], [ds.targets[ds._lead_index(i), i] for i in idx]
            futures = [array[int(t), c].read() for ids, ts_ in zip(chunks, steps) for t in ts_ for c in ids]
            [f.result() for f in futures]

    cold("tensorstore_cold_w0", lambda: tensorstore_reads)
    timed("tensorstore_cached_w0", tensorstore_reads)
    if blocks is not None and not one_core:  # the chunk layout: the blocks the rank's channels lie in
        barray = ts.open({**spec, "kvstore": {"driver": "file", "path": str(blocks)}}, read=True).result()
        touched = [sorted({c // CHANNEL_BLOCK for c in ids}) for ids in chunks]
        out["block_chunks_per_step"] = [len(k) for k in touched]

        def block_reads(n: int) -> None:
            for b in range(skip, skip + n):
                idx = order[b * BATCH : (b + 1) * BATCH]
                steps = ds.anchors[idx], [ds.targets[ds._lead_index(i), i] for i in idx]
                futures = [
                    barray[int(t), k * CHANNEL_BLOCK : (k + 1) * CHANNEL_BLOCK].read()
                    for ks, ts_ in zip(touched, steps)
                    for t in ts_
                    for k in ks
                ]
                [f.result() for f in futures]

        drop_cache(blocks)
        timed("blocks_cold_w0", block_reads)
        timed("blocks_cached_w0", block_reads)
    if not one_core:
        data = ds.data
        runs = [_runs(chunks[0]), _runs(chunks[1])]

        def zarr_python(n: int) -> None:  # the loader before: a zarr call per sample and run
            for b in range(skip, skip + n):
                idx = order[b * BATCH : (b + 1) * BATCH]
                steps = ds.anchors[idx], [ds.targets[ds._lead_index(i), i] for i in idx]
                for rs, ts_ in zip(runs, steps):
                    np.stack([np.concatenate([data[int(t), r] for r in rs]) for t in ts_])

        timed("zarr_python_cached_w0", zarr_python, max(1, batches // 4))
    return out


def _runs(ids: list[int]) -> list[slice]:
    runs: list[slice] = []
    for i in ids:
        if runs and runs[-1].stop == i:
            runs[-1] = slice(runs[-1].start, i + 1)
        else:
            runs.append(slice(i, i + 1))
    return runs


# -- the run -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/dchag-loader-bench")
    p.add_argument("--output", default="benchmarks/results/loader")
    p.add_argument("--batches", type=int, default=8, help="timed batches per measurement (1.40625 deg: 3/4)")
    p.add_argument("--quick", action="store_true", help="a smoke test (no measurement): 5.625 deg, 8 days, T = 8")
    p.add_argument("--report", metavar="JSON", help="only write the report again from a run's JSON")
    p.add_argument("--measure", nargs=4, metavar=("STORE", "T", "ONE_CORE", "BLOCKS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        store, tp, one_core = Path(args.measure[0]), int(args.measure[1]), args.measure[2] == "1"
        if one_core:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before any thread starts
        print(json.dumps(measure(store, tp, args.batches, one_core, Path(args.measure[3]))))
        return
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        Path(args.output).with_suffix(".md").write_text(report(doc))
        return

    grids = {5.625: 8} if args.quick else GRIDS
    tps = (8,) if args.quick else TENSOR_PARALLEL
    batches = 2 if args.quick else args.batches
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    t_start = time.perf_counter()
    rows = []
    for grid, days in grids.items():
        store = split_store(work, grid, days)
        blocks = write_blocks(store, store.parent / "blocks.zarr")
        n = batches if grid == 5.625 or args.quick else max(2, batches * 3 // 4)
        for tp in tps:
            for one_core in (False,) if args.quick else (False, True):
                measure_args = ["--measure", str(store), str(tp), str(int(one_core)), str(blocks)]
                proc = subprocess.run(
                    [sys.executable, __file__, "--batches", str(n), *measure_args],
                    capture_output=True,
                    text=True,
                )
                if proc.returncode:
                    sys.exit(f"measuring {store} T={tp}: {proc.stderr.strip()[-3000:]}")
                row = {"grid": grid, "one_core": one_core, "load_avg_1min": round(os.getloadavg()[0], 2)}
                row.update(json_lines(proc.stdout)[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
        shutil.rmtree(store.parent)
    doc = {
        "meta": results.meta(
            None if argv is None else ["benchmarks/loader_benchmark.py", *argv],
            total_s=round(time.perf_counter() - t_start, 1),
            days={str(g): d for g, d in grids.items()},
        ),
        "rows": rows,
        "predicted": predicted_steps(),
    }
    doc["meta"]["machine"] += ", shared with other users"
    results.write(Path(args.output), doc, report(doc))
    print(report(doc))
    shutil.rmtree(work, ignore_errors=True)


# -- the report ------------------------------------------------------------------------------------
def _v(row: dict, key: str) -> str:
    return f"{row[key]:.0f}" if key in row else "-"


def report(doc: dict) -> str:
    meta, rows = doc["meta"], doc["rows"]
    out = [
        "# One rank's batches: dchag's loader beside tensorstore and memory",
        "",
        f"`{meta['command']}` on {meta['machine']} (Python {meta['python']}), {meta['total_s']:.0f} s. "
        "The machine is shared with other busy users (1-minute load average in each row): absolute rates "
        "move with their load; the ratios of sources measured side by side in one process are what counts.",
        "",
        __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0],
        "",
        "## Samples/s (MB/s of float32 samples) with 0 workers, in one process",
        "",
        "| grid | T | channels + outputs | sample MB | load | dchag cold | dchag cached | tensorstore cold | "
        "tensorstore cached | memory | zarr-python cached | dchag / tensorstore (cached) | "
        "dchag / zarr-python (cached) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in (r for r in rows if not r["one_core"]):

        def rate(k, r=r):
            return f"{r[k]:.0f} ({r[k + '_mb_s']:.0f})" if k in r else "-"

        ratio_ts = r["dchag_cached_w0"] / r["tensorstore_cached_w0"]
        ratio_old = r["dchag_cached_w0"] / r["zarr_python_cached_w0"]
        out.append(
            f"| {r['grid']} | {r['tp']} | {r['channels']} + {r['outputs']} | {r['sample_mb']:.3f} | "
            f"{r['load_avg_1min']} | {rate('dchag_cold_w0')} | {rate('dchag_cached_w0')} | "
            f"{rate('tensorstore_cold_w0')} | {rate('tensorstore_cached_w0')} | {rate('memory_w0')} | "
            f"{rate('zarr_python_cached_w0')} | {ratio_ts:.2f} | {ratio_old:.1f} |"
        )
    out += [
        "",
        f"## The chunk layout: a chunk per step and channel, or per step and block of {CHANNEL_BLOCK} channels",
        "",
        "tensorstore's concurrent read of every chunk a rank's batch touches, samples/s (0 workers, in one "
        "process; the same shards of 32 steps). `chunks per step`: the rank's inputs + its outputs.",
        "",
        "| grid | T | chunks per step: per channel | per block | per channel cold | per block cold | "
        "per channel cached | per block cached | per channel / per block (cached) |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in (r for r in rows if not r["one_core"] and "blocks_cached_w0" in r):
        blocks = " + ".join(map(str, r["block_chunks_per_step"]))
        out.append(
            f"| {r['grid']} | {r['tp']} | {r['channels']} + {r['outputs']} | {blocks} | "
            f"{_v(r, 'tensorstore_cold_w0')} | {_v(r, 'blocks_cold_w0')} | {_v(r, 'tensorstore_cached_w0')} | "
            f"{_v(r, 'blocks_cached_w0')} | {r['tensorstore_cached_w0'] / r['blocks_cached_w0']:.2f} |"
        )
    for grid in sorted({r["grid"] for r in rows}, reverse=True):
        ratios = [
            r["tensorstore_cached_w0"] / r["blocks_cached_w0"]
            for r in rows
            if r["grid"] == grid and not r["one_core"] and "blocks_cached_w0" in r
        ]
        if ratios:
            out.append(
                f"\nAt {grid} deg a chunk per step and channel reads at {min(ratios):.2f}-{max(ratios):.2f} times "
                "the block layout's rate (page-cached)."
            )
    out += [
        "",
        "## Samples/s through the trainer's DataLoader with 0, 1, 2 workers (prefetch 2)",
        "",
        "2 cores here: 1 worker has a core of its own beside the training process; 2 compete with it.",
        "",
        "| grid | T | dchag cold w0 | w1 | w2 | dchag cached w0 | w1 | w2 | memory w0 | w1 | w2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in (r for r in rows if not r["one_core"]):
        cells = [_v(r, f"{s}_w{w}") for s in ("dchag_cold", "dchag_cached", "memory") for w in (0, 1, 2)]
        out.append(f"| {r['grid']} | {r['tp']} | " + " | ".join(cells) + " |")
    out += [
        "",
        "## One core: what one loader worker on a core of its own reads, and the workers a rank needs",
        "",
        "The measuring process pinned to one core (tensorstore's threads share it). Needed: the highest "
        "rate a rank of the node's layouts reads at the step the cost model predicts for the paper's model "
        "(`dchag.bench.nodes.predicted_steps`: D-CHAG-L, TP 8 and TP 4 x 2 on one 8-GPU node, peak "
        "rates, the shortest step); workers = needed / one core's page-cached rate of that rank (T = TP).",
        "",
        "| grid | node | TP | batch per rank | needed samples/s | one core: dchag cached | cold | "
        "tensorstore cached | workers per rank | cores per GPU | keeps up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in doc["predicted"]:
        one = next((r for r in rows if r["one_core"] and r["grid"] == p["grid"] and r["tp"] == p["tp"]), None)
        if one is None:
            continue
        workers = math.ceil(p["needed_samples_per_s"] / one["dchag_cached_w0"])
        cores = NODES[p["node"]].cores_per_gpu
        verdict = "yes" if workers < cores else "no: more workers than cores"
        out.append(
            f"| {p['grid']} | {p['node']} | {p['tp']} | {p['batch_per_rank']} | {p['needed_samples_per_s']:.0f} | "
            f"{_v(one, 'dchag_cached_w0')} | {_v(one, 'dchag_cold_w0')} | {_v(one, 'tensorstore_cached_w0')} | "
            f"{workers} | {cores} | {verdict} |"
        )
    out += [
        "",
        "`workers per rank` < `cores per GPU` leaves a core for the training process. Cold reads are the "
        "first epoch's on a node whose page cache does not hold the store (a 36-year 1.40625 deg split is "
        "larger than a node's memory); the page-cached rate assumes it does.",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
