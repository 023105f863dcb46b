"""ERA5 preprocessing after the regridding, at the paper's scale: peak RSS and wall time of
every job, and the loader workers one training rank needs.

Data: generated per-year stores in the layout `dchag era5-year` writes (data(time, channel,
lat, lon) float32, chunks of 8 steps x all channels, the same coordinates and attributes), 80
channels (5 variables x 16 pressure levels), 6-hourly (1460 / 1464 steps a year), smooth
fields with a seasonal cycle plus noise; labelled synthetic. Each job is the real `dchag`
subcommand the Snakemake rule runs, in its own process started by GNU time (/usr/bin/time),
which reports that process's peak RSS; its wall time is measured around it.

* 5.625 deg, N = 1, 2, 4, 8 years (1979 ...): era5-year-stats (one per year), era5-stats,
  era5-split-part (one per year of an N-year split), era5-split, era5-climatology-part (N of
  them, each one year's worth), era5-climatology.
* 1.40625 deg, one year: the same jobs (15 GB a year: generated, used and deleted in turn).
* The read side, from the loader benchmark's results (benchmarks/loader_benchmark.py,
  benchmarks/results/loader.json: one rank's samples/s on one core, from Zarr and from memory)
  set against the step the cost model (dchag.benefit.costmodel) predicts for the paper's model:
  the loader workers a rank needs on the paper's and a DGX node, and whether 8 ranks' channels
  fit in the node's memory.

    python benchmarks/preprocess_benchmark.py --output benchmarks/results/preprocess

A run of whole years at both grids (or `--report` of one) writes the jobs' memory fit
(dchag.bench.fits.era5_job_mb: fixed MB + MB per unit of data a step, what `dchag.jobs` asks
the scheduler for) to the package's src/dchag/bench/fits.json (`--fits`).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

from dchag.bench import fits, results
from dchag.bench.era5jobs import Run
from dchag.bench.nodes import NODES, STEPS_PER_YEAR, predicted_steps
from dchag.bench.procs import du
from dchag.bench.stores import FIRST_YEAR, write_year

REUSE = {5.625: "coarse_from", 1.40625: "fine_from"}  # grid: the option taking its rows from an earlier run


# -- the whole benchmark ----------------------------------------------------------------------
def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/dchag-preprocess-bench")
    p.add_argument("--output", default="benchmarks/results/preprocess")
    p.add_argument("--years", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument(
        "--split-years",
        type=int,
        nargs="*",
        default=[1, 2, 4, 8],
        help="year counts whose splits are built (a split part is the slowest job: ~100 s a year here)",
    )
    p.add_argument("--skip-fine", action="store_true", help="leave out 1.40625 deg")
    p.add_argument(
        "--fine-days",
        type=int,
        help="generate only these first days of the 1.40625 deg year (times are then scaled to the year)",
    )
    p.add_argument("--coarse-days", type=int, help="generate only these first days of each 5.625 deg year (a test)")
    p.add_argument("--levels", type=int, nargs="+", help="pressure levels (default the 16 of 80 channels; a test)")
    p.add_argument(
        "--coarse-from",
        metavar="JSON",
        help="take the 5.625 deg rows and sizes from an earlier run's JSON (same code) and run only 1.40625 deg",
    )
    p.add_argument(
        "--fine-from",
        metavar="JSON",
        help="take the 1.40625 deg rows and sizes from an earlier run's JSON (same code) and run only 5.625 deg",
    )
    p.add_argument("--report", metavar="JSON", help="only write the report again from a run's JSON")
    p.add_argument(
        "--fits",
        default=str(fits.FITS),
        help="where the jobs' memory fit goes (a run of whole years at both grids and 80 channels; "
        "default: the package's, dchag.jobs reads it)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        doc["predicted"] = predicted_steps()
        finish(doc, Path(args.output), Path(args.fits), Path(args.report))
        return
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows, sizes = [], {}
    reused = {}  # grid: the earlier run's meta, for the grid taken from it
    for grid, key in REUSE.items():
        if earlier_json := getattr(args, key):
            earlier = json.loads(Path(earlier_json).read_text())
            reused[grid] = earlier["meta"]
            rows += [r for r in earlier["rows"] if r["grid"] == grid]
            sizes.update({k: v for k, v in earlier["sizes"].items() if f"_{grid}" in k})
    t_start = time.perf_counter()
    out = Path(args.output)

    def save():
        meta = results.meta(
            None if argv is None else ["benchmarks/preprocess_benchmark.py", *argv],
            total_s=round(time.perf_counter() - t_start, 1),
            fine_days=args.fine_days,
        )
        if args.coarse_days or args.levels:
            meta.update(coarse_days=args.coarse_days, levels=args.levels)
        for grid, earlier_meta in reused.items():
            meta[REUSE[grid]] = {k: earlier_meta[k] for k in ("command", "total_s")}
        doc = {"meta": meta, "rows": rows, "sizes": sizes, "predicted": predicted_steps()}
        results.write(out, doc)
        return doc

    if 5.625 not in reused:  # else: taken from the earlier run
        coarse(work / "5.625", args, rows, sizes, save)
    if not args.skip_fine and 1.40625 not in reused:
        shutil.rmtree(work / "5.625", ignore_errors=True)  # room on disk
        fine(work / "1.40625", args, rows, sizes, save)
    finish(save(), out, Path(args.fits), out.with_suffix(".json"))
    shutil.rmtree(work, ignore_errors=True)


def coarse(work: Path, args, rows: list, sizes: dict, save) -> None:
    """5.625 deg: N years."""
    grid, most = 5.625, max(args.years)
    years = list(range(FIRST_YEAR, FIRST_YEAR + most))
    t0 = time.perf_counter()
    stores = [write_year(work / "years" / f"{y}.zarr", y, grid, args.coarse_days, args.levels) for y in years]
    sizes["generate_5.625_s_per_year"] = (time.perf_counter() - t0) / most
    sizes["year_bytes_5.625"] = du(stores[0])
    kw = dict(save=save, days=args.coarse_days, levels=args.levels)
    partials = Run(work / "stats", grid, years, stores, rows, **kw).year_statistics()
    for n in args.years:
        run = Run(work / f"n{n}", grid, years[:n], stores[:n], rows, **kw)
        stats = run.statistics(partials[:n])
        if n in args.split_years:
            store, _ = run.split(stats)
            sizes["split_bytes_5.625_per_year"] = du(store) / n
            shutil.rmtree(store)
        run.climatology()


def fine(work: Path, args, rows: list, sizes: dict, save) -> None:
    """1.40625 deg: one year, each output deleted once the next job has read it."""
    grid = 1.40625
    t0 = time.perf_counter()
    year = write_year(work / "years" / f"{FIRST_YEAR}.zarr", FIRST_YEAR, grid, args.fine_days, args.levels)
    scale = 1464 / (4 * args.fine_days) if args.fine_days else 1.0  # to a whole (leap) year
    sizes["generate_1.40625_s_per_year"] = (time.perf_counter() - t0) * scale
    sizes["year_bytes_1.40625"] = du(year) * scale
    run = Run(work / "n1", grid, [FIRST_YEAR], [year], rows, save=save, days=args.fine_days, levels=args.levels)
    stats = run.statistics(run.year_statistics())
    store, _ = run.split(stats)
    sizes["split_bytes_1.40625_per_year"] = du(store) * scale
    shutil.rmtree(store)
    run.climatology(drop_years=True)


def finish(doc: dict, out: Path, fits_path: Path, source: Path) -> None:
    """The report beside the JSON, and the jobs' memory fit where the run can give it (whole
    years of 80 channels at both grids)."""
    text = report(doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    print(text)
    meta = doc["meta"]
    whole = not meta.get("coarse_days") and not meta.get("levels")
    if whole and {5.625, 1.40625} <= {r["grid"] for r in doc["rows"] if not r.get("days")}:
        fit = {"source": str(source), "mb": fits.era5_job_mb(doc["rows"])}
        fits.write("era5_job_mb", fit, fits_path)
        print(f"{fits_path}: era5_job_mb {fit['mb']}")


# -- the report -------------------------------------------------------------------------------
PER_YEAR = ("era5-year-stats", "era5-split-part", "era5-climatology-part")
COMBINE = ("era5-stats", "era5-split", "era5-climatology")
NODE_CORES, NODE_MEM_GB = 64, 256  # the "one node" of the 40-year table
TRAIN, VAL, TEST = 36, 2, 2  # the paper's 40 years: 1979-2014, 2015-2016, 2017-2018


def report(doc: dict) -> str:
    # the coarse grid first, whichever run each grid's rows come from
    doc = {
        **doc,
        "rows": sorted(doc["rows"], key=lambda r: -r["grid"]),
    }
    rows, meta = doc["rows"], doc["meta"]
    lines = [
        "# ERA5 preprocessing at the paper's scale: statistics, splits, climatology",
        "",
        f"Command: `{meta['command']}`  ",
        *(
            f"{grid} deg rows from an earlier run of the same code: `{meta[key]['command']}`  "
            for grid, key in REUSE.items()
            if meta.get(key)
        ),
        f"Machine: {meta['machine']}, Python {meta['python']}; total {meta['total_s'] / 60:.0f} min. The machine "
        "may be shared (other work may run meanwhile; the 1-minute load average at each job's end is in the "
        "JSON): wall times are upper bounds, CPU times (user + system) are what a job costs.  ",
        "Data: generated per-year stores in the `era5-year` layout, 80 channels (5 variables x 16 levels), 6-hourly "
        "(1460 / 1464 steps), smooth fields + noise, float32, Blosc zstd. Every job is the `dchag` subcommand its "
        "rule runs, in a fresh process started by GNU time: peak = its peak RSS (about 100 MB of it is the "
        "interpreter with numpy, xarray, zarr and dask imported), times around it.",
        "",
        "## Peak RSS and time per job (measured)",
        "",
        "| grid | job | years | jobs | wall s (max) | CPU s (max) | peak RSS MB (max) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple, list] = {}
    for r in rows:
        key = (r["grid"], r["job"], "each" if r["job"] == "era5-year-stats" else r["years"])
        groups.setdefault(key, []).append(r)
    for (grid, name, n), rs in groups.items():
        label = f"each of {len(rs)}" if n == "each" else n
        if rs[0].get("days"):
            label = f"{label} ({rs[0]['days']} days)"
        lines.append(
            f"| {grid} | {name} | {label} | {len(rs)} | {max(r['seconds'] for r in rs):.1f} | "
            f"{max(r['cpu_s'] for r in rs):.1f} | {max(r['peak_rss_mb'] for r in rs):.0f} |"
        )
    ns = sorted({r["years"] for r in rows if r["grid"] == 5.625 and r["job"] in COMBINE})
    lines += [
        "",
        "Peak RSS against the number of years (5.625 deg; the largest job of each kind; per-year statistics: "
        "the same job whatever N):",
        "",
        "| job | " + " | ".join(f"{n} years MB" for n in ns) + " | largest over 2 years |",
        "|---|" + "---:|" * (len(ns) + 1),
    ]
    for name in PER_YEAR[1:] + COMBINE:
        peak = {
            n: max(
                (r["peak_rss_mb"] for r in rows if r["grid"] == 5.625 and r["job"] == name and r["years"] == n),
                default=None,
            )
            for n in ns
        }
        got = {n: v for n, v in peak.items() if v is not None}
        if 2 in got:
            ratio = f"{got[max(got)] / got[2]:.3f} ({max(got)} y)"
        else:
            ratio = "-"
        lines.append(f"| {name} | " + " | ".join(f"{peak[n]:.0f}" if peak[n] else "-" for n in ns) + f" | {ratio} |")
    # A split's per-year parts do the same work whatever N: the first year's part at each N is
    # one job against the same job; the largest of 8 parts against the largest of 2 also
    # measures how much identical jobs differ (malloc's arenas and threads).
    first = {}
    for n in ns:
        parts = [r for r in rows if r["grid"] == 5.625 and r["job"] == "era5-split-part" and r["years"] == n]
        if parts:
            first[n] = parts[0]["peak_rss_mb"]  # the parts run in year order: the first is 1979's
    if 2 in first:
        spread = [r["peak_rss_mb"] for r in rows if r["grid"] == 5.625 and r["job"] == "era5-split-part"]
        lines += [
            f"| era5-split-part, {FIRST_YEAR}'s part | "
            + " | ".join(f"{first[n]:.0f}" if n in first else "-" for n in ns)
            + f" | {first[max(first)] / first[2]:.3f} ({max(first)} y) |",
            "",
            f"The {len(spread)} split parts measured, each one year's shards whatever N, peaked at "
            f"{min(spread):.0f}-{max(spread):.0f} MB: identical jobs differ by up to "
            f"{max(spread) / min(spread) - 1:.0%}.",
        ]
    lines += ["", *table_40(doc), "", *read_side(doc)]
    return "\n".join(lines) + "\n"


def _fit(rows, name, grid, key="cpu_s"):
    """A combine's cost as a + b * years (least squares over the measured N), or None."""
    pts = [(r["years"], r[key]) for r in rows if r["job"] == name and r["grid"] == grid]
    if len({n for n, _ in pts}) < 2:
        return None
    n, s = np.array(pts, float).T
    b, a = np.polyfit(n, s, 1)
    return max(a, 0.0), max(b, 0.0)


def table_40(doc: dict) -> list[str]:
    """The 40-year estimate from the measured jobs."""
    rows, sizes = doc["rows"], doc["sizes"]
    out = [
        f"## 40 years ({TRAIN} training, {VAL} validation, {TEST} test; climatology from the training years): "
        "extrapolated",
        "",
        "Extrapolated, not measured: a per-year job reads one year whatever N, so it costs its measured CPU time "
        "(the largest measured); a combine costs a + b·N, fitted over the measured N at 5.625 deg, and at 1.40625 "
        "deg its 1-year measurement plus 16 x the 5.625 slope per further year (16 x the grid points). Wall time on "
        "a dedicated core is taken as the CPU time (the jobs are single-threaded; disk bandwidth is not modelled). "
        f"One node: {NODE_CORES} cores and {NODE_MEM_GB} GB, as many jobs at once as both allow. N Slurm jobs: "
        "every per-year job of a stage at once, each on its own core. Statistics then splits run one after the "
        "other; the climatology runs beside them.",
        "",
        "| grid | stage | jobs | core-hours | peak RSS per job GB | wall, one node h | wall, N Slurm jobs h |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for grid in (5.625, 1.40625):
        have = [r for r in rows if r["grid"] == grid]
        if not have:
            continue
        stages = (
            ("statistics", "era5-year-stats", TRAIN, "era5-stats", [TRAIN]),
            ("splits", "era5-split-part", TRAIN + VAL + TEST, "era5-split", [TRAIN, VAL, TEST]),
            ("climatology", "era5-climatology-part", TRAIN, "era5-climatology", [TRAIN]),
        )
        totals = {}
        for label, part, count, combine, combine_years in stages:
            prs = [r for r in have if r["job"] == part]
            crs = [r for r in have if r["job"] == combine]
            if not prs or not crs:  # a stage the run left out (--split-years)
                continue
            # a part of a year's first days only (1.40625 with --fine-days): its time scaled to the year
            t_part = max(r["cpu_s"] * (1464 / (4 * r["days"]) if r.get("days") else 1.0) for r in prs)
            m = max(r["peak_rss_mb"] for r in prs + crs) / 1024
            fit = _fit(rows, combine, 5.625)
            if grid == 5.625 and fit:
                t_comb = [fit[0] + fit[1] * n for n in combine_years]
            else:
                base = max(r["cpu_s"] for r in crs)
                slope = 16 * fit[1] if fit else 0.0
                t_comb = [base + slope * (n - 1) for n in combine_years]
            core_h = (count * t_part + sum(t_comb)) / 3600
            at_once = max(1, min(NODE_CORES, int(NODE_MEM_GB / max(m, 1e-3))))
            node_h = (math.ceil(count / at_once) * t_part + max(t_comb)) / 3600
            slurm_h = (t_part + max(t_comb)) / 3600
            totals[label] = (core_h, node_h, slurm_h)
            out.append(
                f"| {grid} | {label}: {count} x {part}, {len(combine_years)} x {combine} | "
                f"{count + len(combine_years)} | {core_h:.2f} | {m:.2f} | {node_h:.2f} | {slurm_h:.2f} |"
            )
        if len(totals) < len(stages):
            continue
        core = sum(t[0] for t in totals.values())
        node = max(totals["statistics"][1] + totals["splits"][1], totals["climatology"][1])
        slurm = max(totals["statistics"][2] + totals["splits"][2], totals["climatology"][2])
        out.append(f"| {grid} | all three | | {core:.2f} | | {node:.2f} | {slurm:.2f} |")
    partial_year = any(r.get("days") for r in rows if r["grid"] == 1.40625)
    out += [
        "",
        "Disk for 40 years (measured bytes per year x 40; the split parts are hard-linked into the split store, "
        "so they take no room of their own; the climatology parts hold one year's worth of float32 means "
        "between them, as does climatology.zarr"
        + (
            "; at 1.40625 deg from a year's first days, 16 x the 5.625 deg climatology, which holds every day of "
            "the year):"
            if partial_year
            else "):"
        ),
        "",
        "| grid | per-year stores GB | split stores GB | climatology parts GB | climatology.zarr GB |",
        "|---|---:|---:|---:|---:|",
    ]
    coarse_clim = None
    for grid in (5.625, 1.40625):
        if f"year_bytes_{grid}" not in sizes:
            continue
        cparts = sum(
            r.get("bytes", 0)
            for r in rows
            if r["grid"] == grid and r["job"] == "era5-climatology-part" and r["years"] == 1
        )
        clim = max((r.get("bytes", 0) for r in rows if r["grid"] == grid and r["job"] == "era5-climatology"), default=0)
        if grid != 5.625 and any(r.get("days") for r in rows if r["grid"] == grid) and coarse_clim:
            # a year's first days leave most days of the year empty (NaN, compressed away): the
            # climatology holds every day x hour x channel, on 16 x the points of 5.625 deg
            cparts, clim = 16 * coarse_clim[0], 16 * coarse_clim[1]
        if grid == 5.625:
            coarse_clim = (cparts, clim)
        out.append(
            f"| {grid} | {40 * sizes[f'year_bytes_{grid}'] / 1e9:.0f} | "
            f"{40 * sizes.get(f'split_bytes_{grid}_per_year', 0) / 1e9:.0f} | {cparts / 1e9:.1f} | {clim / 1e9:.1f} |"
        )
    return out


LOADER_JSON = Path(__file__).resolve().parent / "results" / "loader.json"  # benchmarks/loader_benchmark.py's


def read_side(doc: dict) -> list[str]:
    """The workers a rank needs, from the loader benchmark's one-core rates (a rank of T = TP)."""
    loader = json.loads(LOADER_JSON.read_text())
    one_core = {(r["grid"], r["tp"]): r for r in loader["rows"] if r["one_core"]}
    pred = doc["predicted"]
    out = [
        "## The read side: the loader workers a rank needs against the step the cost model predicts",
        "",
        "Predicted step (costmodel.predict, D-CHAG-L, peak matmul rate and HBM bandwidth, no launch overheads: "
        "the shortest step, so the highest rate a rank must read):",
        "",
        "| grid | node | TP x replicas | batch per rank | step ms | samples/s a rank needs |",
        "|---|---|---|---:|---:|---:|",
    ]
    for p in pred:
        out.append(
            f"| {p['grid']} | {p['node']} | {p['tp']} x {8 // p['tp']} | {p['batch_per_rank']} | "
            f"{p['step_s'] * 1e3:.0f} | {p['needed_samples_per_s']:.0f} |"
        )
    out += [
        "",
        f"One rank's read rate: `{loader['meta']['command']}` (benchmarks/results/loader.md), one process pinned "
        "to one core (what one DataLoader worker on a core of its own reads), a rank of D-CHAG over T = TP "
        "(its 80 / T channels and the 5 outputs), batches of 32, page-cached; from Zarr (no cache) and "
        "from the rank's channels in memory (train.cache_mb). N workers on N cores of their own read N x "
        "that rate; workers per rank = the most any of the node's layouts needs.",
        "",
        "| grid | source | one core samples/s (TP 8 / TP 4) | node | workers per rank | cores per GPU | "
        "8 ranks' channels in memory GB | node memory GB | keeps up |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for grid in sorted({p["grid"] for p in pred}, reverse=True):
        layouts = [p for p in pred if p["grid"] == grid and (grid, p["tp"]) in one_core]
        if not layouts:
            continue
        tps = sorted({p["tp"] for p in layouts}, reverse=True)
        # every rank holds its channels and the outputs of the training years (cache_mb)
        held = max(8 * one_core[grid, t]["sample_mb"] * STEPS_PER_YEAR * TRAIN / 1024 for t in tps)
        for source, key in (("Zarr", "dchag_cached_w0"), ("in memory", "memory_w0")):
            rates = " / ".join(f"{one_core[grid, t][key]:.0f}" for t in tps)
            for node, spec in NODES.items():
                mine = [p for p in layouts if p["node"] == node]
                workers = max(math.ceil(p["needed_samples_per_s"] / one_core[grid, p["tp"]][key]) for p in mine)
                if workers >= spec.cores_per_gpu:
                    verdict = "no: more workers than cores"
                elif source == "in memory" and held > 0.8 * spec.ram_gb:
                    verdict = "no: the channels do not fit in memory"
                else:
                    verdict = "yes"
                out.append(
                    f"| {grid} | {source} | {rates} | {node} | {workers} | {spec.cores_per_gpu} | "
                    f"{f'{held:.0f}' if source == 'in memory' else '-'} | {spec.ram_gb} | {verdict} |"
                )
    out += [
        "",
        "`workers per rank` < `cores per GPU` leaves a core for the training process; in memory, the "
        f"{TRAIN} training years' channels of the 8 ranks (each rank its channels and the 5 outputs; the "
        "DataLoader's forked workers share them) must fit in 80% of the node's memory. The settings: "
        "`train.num_workers` at least the table's `workers per rank` for the node, `train.prefetch_factor` 2, "
        "and `train.cache_mb` above a rank's share of the channels where they fit (config/paper.yaml: "
        "5.625 deg, 16384 MiB and 6 workers).",
    ]
    return out


if __name__ == "__main__":
    main()
