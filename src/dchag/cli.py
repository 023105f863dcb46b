"""The ``dchag`` command: one subcommand per pipeline stage.

Each Snakemake rule calls exactly one of these; each is also usable on its own. Errors in
inputs or config end the command with one line naming the file, key or value at fault
(exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import __version__


def _config(args) -> dict:
    from .config import load_config

    return load_config(args.config)


def _era5(args) -> dict:
    cfg = _config(args)
    if "era5" not in cfg:
        from .config import ConfigError

        raise ConfigError(f"{args.config}: no 'era5' section")
    return cfg


# -- subcommands ---------------------------------------------------------------------------
def cmd_demo_era5(args) -> None:
    from .era5 import demo

    cfg = _era5(args)
    era5 = cfg["era5"]
    outdir = Path(args.outdir)
    years = sorted({y for split in era5["years"].values() for y in split})
    levels = era5["channels"].get("pressure_level", {}).get("levels") or [500, 850]
    if args.year is not None:
        years = [args.year]
    if args.constants_only:
        years = []
    for year in years:
        demo.write_year(outdir, year, era5.get("demo_grid", 3.75), levels, era5.get("time_step_hours", 24))
    if args.year is None:
        demo.write_constants(outdir, era5.get("demo_grid", 3.75))


def cmd_era5_weights(args) -> None:
    from .era5.preprocess import make_weights

    cfg = _era5(args)
    make_weights(cfg["era5"], args.year, args.output)


def cmd_era5_year(args) -> None:
    from .era5.preprocess import preprocess_year

    cfg = _era5(args)
    preprocess_year(cfg["era5"], args.year, args.weights, args.output, config=cfg)


def cmd_era5_stats(args) -> None:
    from .era5.preprocess import normalization_stats

    normalization_stats(args.years, args.output, config=_era5(args))


def cmd_era5_split(args) -> None:
    from .era5.preprocess import build_split

    build_split(args.split, args.years, args.stats, args.output, config=_era5(args))


def cmd_era5_climatology(args) -> None:
    from .era5.preprocess import climatology

    climatology(args.years, args.output, config=_era5(args))


def cmd_regrid(args) -> None:
    from .regrid.files import regrid_file

    regrid_file(args.input, args.output, args.grid, args.method, args.weights, args.backend, args.time_chunk)


def cmd_download_era5(args) -> None:
    from .era5.download import download_year

    cfg = _era5(args)
    download_year(cfg["era5"], args.year, args.source, args.output, store=args.store)


def cmd_describe_model(args) -> None:
    from dataclasses import replace

    from .model.build import model_config
    from .model.describe import describe, format_table

    cfg = _config(args)
    mcfg = model_config(cfg, task=args.task, num_classes=args.num_classes or (16 if args.task == "classify" else 0))
    if args.channels:
        mcfg = replace(mcfg, in_channels=args.channels, out_channels=[c for c in mcfg.out_channels if c < args.channels])
    groups = args.groups or cfg.get("parallel", {}).get("tp", 1)
    rows = describe(mcfg, groups)
    if args.json:
        import json

        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows, mcfg, groups))


# -- parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dchag", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dchag {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages and show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_):
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=func)
        return sp

    def config_arg(sp):
        sp.add_argument("--config", required=True, help="config YAML file, or an inline JSON object")

    sp = add("demo-era5", cmd_demo_era5, "write the synthetic ERA5-layout demo inputs (netCDF, labelled synthetic)")
    config_arg(sp)
    sp.add_argument("--outdir", required=True)
    which = sp.add_mutually_exclusive_group()
    which.add_argument("--year", type=int, help="only this year's files (default: every year, and constants.nc)")
    which.add_argument("--constants-only", action="store_true", help="only constants.nc")

    sp = add("era5-weights", cmd_era5_weights, "compute regridding weights from the inputs' grid to the target grid")
    config_arg(sp)
    sp.add_argument("--year", type=int, required=True, help="a year whose input files define the source grid")
    sp.add_argument("--output", required=True, help="weights file (netCDF, ESMF/xESMF layout)")

    sp = add("era5-year", cmd_era5_year, "regrid one year of ERA5 inputs into a Zarr store (physical units)")
    config_arg(sp)
    sp.add_argument("--year", type=int, required=True)
    sp.add_argument("--weights", required=True, help="weights file from era5-weights (or any xESMF weights file)")
    sp.add_argument("--output", required=True)

    sp = add("era5-stats", cmd_era5_stats, "per-channel normalisation statistics from the training years' stores")
    config_arg(sp)
    sp.add_argument("--output", required=True, help="statistics JSON")
    sp.add_argument("years", nargs="+", help="per-year stores of the training years")

    sp = add("era5-split", cmd_era5_split, "concatenate and normalise one split's years into a sharded Zarr store")
    config_arg(sp)
    sp.add_argument("--split", required=True, choices=["train", "val", "test"])
    sp.add_argument("--stats", required=True)
    sp.add_argument("--output", required=True)
    sp.add_argument("years", nargs="+", help="per-year stores of the split")

    sp = add("era5-climatology", cmd_era5_climatology, "day-of-year and time-mean climatologies (for ACC)")
    config_arg(sp)
    sp.add_argument("--output", required=True)
    sp.add_argument("years", nargs="+", help="per-year stores of the climatology years")

    sp = add("regrid", cmd_regrid, "regrid every lat-lon variable of a netCDF file or Zarr store onto a WeatherBench grid")
    sp.add_argument("input")
    sp.add_argument("--grid", type=float, required=True, help="target resolution in degrees (5.625, 2.8125, 1.40625)")
    sp.add_argument("--method", choices=["bilinear", "conservative"], default="bilinear")
    sp.add_argument("--weights", help="weights file: read if it exists, else written there for reuse")
    sp.add_argument("--backend", choices=["auto", "xesmf", "builtin"], default="auto",
                    help="who computes weights: xESMF if importable (auto), or this package (builtin)")
    sp.add_argument("--time-chunk", type=int, default=8, help="steps along the leading dimension per block")
    sp.add_argument("--output", required=True, help="output .nc or .zarr")

    sp = add("describe-model", cmd_describe_model, "parameter counts per part, for the baseline and each D-CHAG variant")
    config_arg(sp)
    sp.add_argument("--task", choices=["forecast", "mae", "classify"], default="forecast")
    sp.add_argument("--channels", type=int, help="count for this many input channels instead of the config's")
    sp.add_argument("--groups", type=int, help="channel groups / TP ranks (default: parallel.tp)")
    sp.add_argument("--num-classes", type=int, default=0)
    sp.add_argument("--json", action="store_true")

    sp = add("download-era5", cmd_download_era5, "download one year of the configured ERA5 channels (ARCO-ERA5 or CDS)")
    config_arg(sp)
    sp.add_argument("--year", type=int, required=True)
    sp.add_argument("--source", choices=["arco", "cds"], default="arco")
    sp.add_argument("--store", help="ARCO-ERA5 Zarr store (default: the public Google Cloud store)")
    sp.add_argument("--output", required=True, help="output netCDF file")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from .config import ConfigError
    from .grids import GridError
    from .regrid.backends import BackendUnavailable
    from .regrid.weights import WeightsError
    from .store import InputError

    try:
        args.func(args)
    except (ConfigError, InputError, GridError, WeightsError, BackendUnavailable) as err:
        if args.verbose:
            raise
        print(f"dchag {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
