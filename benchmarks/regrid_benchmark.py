"""Regridding speed and peak memory: 80 channels x N time steps of 0.25 deg ERA5-layout fields
to the 5.625 deg WeatherBench grid.

Each variant runs in a fresh process (so its peak RSS is its own), streaming one time step of
all channels at a time, as the preprocessing does:

* ``scipy-floor``   the full weight matrix times the full field, a plain ``scipy.sparse``
                    product: what any sparse-matrix regridder must at least do;
* ``builtin``       dchag's RegridWeights.apply (only the weighted source rows are touched);
* ``xesmf``         xESMF's own regridder with the same weights (only where importable).

Weight generation is timed separately. The input fields are made once per process (not
timed): smooth waves plus noise, float32.

    python benchmarks/regrid_benchmark.py --steps 6 24 48 --output benchmarks/results/regrid
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dchag.bench import results
from dchag.bench.procs import json_lines

CHANNELS = 80


def _fields(nlat: int, nlon: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    lat = np.deg2rad(np.linspace(90, -90, nlat))[:, None]
    lon = np.deg2rad(np.arange(nlon) * 360 / nlon)[None, :]
    out = np.empty((channels, nlat, nlon), np.float32)
    for c in range(channels):
        out[c] = np.cos(lat) * np.sin((c % 7 + 1) * lon + c) + 0.01 * rng.standard_normal((nlat, nlon))
    return out


def run_variant(variant: str, method: str, steps: int, source_grid: float = 0.25, channels: int = CHANNELS) -> dict:
    from dchag.grids import LatLonGrid, weatherbench_grid
    from dchag.regrid.weights import RegridWeights

    nlon = round(360 / source_grid)
    source = LatLonGrid(np.linspace(90, -90, nlon // 2 + 1), np.arange(nlon) * source_grid)
    target = weatherbench_grid(5.625)
    t0 = time.perf_counter()
    weights = RegridWeights.build(source, target, method)
    t_weights = time.perf_counter() - t0
    fields = _fields(*source.shape, channels)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    if variant == "scipy-floor":
        w = weights.matrix.astype(np.float32)

        def regrid(x):
            return (w @ x.reshape(channels, -1).T).T.reshape(channels, *target.shape)

    elif variant == "builtin":
        regrid = weights.apply
    elif variant == "xesmf":
        import tempfile

        import xarray as xr
        import xesmf

        tmp = Path(tempfile.mkdtemp()) / "w.nc"
        weights.to_netcdf(tmp)
        grid_in = xr.Dataset(coords={"lat": source.lat, "lon": source.lon})
        grid_out = xr.Dataset(coords={"lat": target.lat, "lon": target.lon})
        regridder = xesmf.Regridder(grid_in, grid_out, method, periodic=True, weights=str(tmp))

        def regrid(x):
            return regridder(xr.DataArray(x, dims=("channel", "lat", "lon"))).values

    else:
        raise ValueError(variant)

    out = np.empty((steps, channels, *target.shape), np.float32)
    t0 = time.perf_counter()
    for s in range(steps):
        out[s] = regrid(fields)
    elapsed = time.perf_counter() - t0
    exact = (weights.matrix @ fields[3].astype(np.float64).ravel()).reshape(target.shape)
    max_error = float(np.max(np.abs(out[-1, 3] - exact)))
    return {
        "variant": variant,
        "method": method,
        "channels": channels,
        "source_grid": source_grid,
        "steps": steps,
        "seconds": round(elapsed, 6),
        "weights_seconds": round(t_weights, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_before_timing_mb": round(base_rss / 1024, 1),
        "max_abs_error_vs_float64": max_error,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, nargs="+", default=[6, 24, 48])
    p.add_argument("--methods", nargs="+", default=["bilinear", "conservative"])
    p.add_argument("--output", default="benchmarks/results/regrid")
    p.add_argument("--source-grid", type=float, default=0.25, help="the source grid's spacing, deg (a test: coarser)")
    p.add_argument("--channels", type=int, default=CHANNELS)
    p.add_argument("--one", nargs=3, metavar=("VARIANT", "METHOD", "STEPS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_variant(args.one[0], args.one[1], int(args.one[2]), args.source_grid, args.channels)))
        return

    import importlib.util

    variants = ["scipy-floor", "builtin"]
    skipped = []
    if importlib.util.find_spec("xesmf") and importlib.util.find_spec("esmpy"):
        variants.append("xesmf")
    else:
        skipped.append("xesmf (xesmf/esmpy not importable on this machine)")
    sizes = ["--source-grid", str(args.source_grid), "--channels", str(args.channels)]
    rows = []
    for method in args.methods:
        for steps in args.steps:
            for variant in variants:  # interleaved, side by side, on the same machine state
                proc = subprocess.run(
                    [sys.executable, __file__, "--one", variant, method, str(steps), *sizes],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row = json_lines(proc.stdout)[-1]
                rows.append(row)
                print(
                    f"{method:12s} {variant:12s} steps={steps:3d} {row['seconds']:7.2f} s  "
                    f"peak {row['peak_rss_mb']:8.1f} MB",
                    flush=True,
                )

    meta = {
        "command": results.command(None if argv is None else ["benchmarks/regrid_benchmark.py", *argv]),
        "machine": f"{platform.node()} {platform.machine()}, {subprocess.getoutput('nproc')} cores",
        "python": platform.python_version(),
        "skipped": skipped,
    }
    nlon = round(360 / args.source_grid)
    lines = [
        f"# Regridding benchmark: {args.channels} channels x N steps, ERA5 {args.source_grid} deg "
        f"({nlon // 2 + 1}x{nlon}) -> 5.625 deg (32x64)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}, Python {meta['python']}  ",
        "Each row is a fresh process; peak = its peak RSS (input fields of one time step, 332 MB, included).",
        *(f"Not run: {s}" for s in skipped),
        "",
        "| method | variant | steps | seconds | s / step | vs floor | weights (s) | peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    floor = {(r["method"], r["steps"]): r["seconds"] for r in rows if r["variant"] == "scipy-floor"}
    for r in rows:
        ratio = r["seconds"] / floor[(r["method"], r["steps"])]
        lines.append(
            f"| {r['method']} | {r['variant']} | {r['steps']} | {r['seconds']:.2f} | {r['seconds'] / r['steps']:.3f} | "
            f"{ratio:.2f}x | {r['weights_seconds']:.2f} | {r['peak_rss_mb']:.0f} |"
        )
    results.write(Path(args.output), {"meta": meta, "rows": rows}, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
