"""ERA5 preprocessing: demo inputs, downloads, regridding weights, per-year regridding,
statistics, split stores, climatology; and the standalone regridder."""

from __future__ import annotations

from ..config import schema_default, schema_enum
from .common import config_arg, config_with, positive_float, positive_int


def cmd_demo_era5(args) -> None:
    from ..era5 import demo

    demo.write_inputs(config_with(args, "era5")["era5"], args.outdir, args.year, args.constants_only)


def cmd_download_era5(args) -> None:
    from ..era5.download import download_year

    download_year(config_with(args, "era5")["era5"], args.year, args.source, args.output, store=args.store)


def cmd_era5_weights(args) -> None:
    from ..era5.preprocess import make_weights

    make_weights(config_with(args, "era5")["era5"], args.year, args.output)


def cmd_era5_year(args) -> None:
    from ..era5.preprocess import preprocess_year

    cfg = config_with(args, "era5")
    preprocess_year(cfg["era5"], args.year, args.weights, args.output, config=cfg)


def cmd_era5_year_stats(args) -> None:
    from ..era5.statistics import year_statistics

    year_statistics(args.year_store, args.output, config=config_with(args, "era5"))


def cmd_era5_stats(args) -> None:
    from ..era5.statistics import combine_statistics

    combine_statistics(args.partials, args.output, config=config_with(args, "era5"))


def cmd_era5_split_part(args) -> None:
    from ..era5.split import split_part

    split_part(args.split, args.years, args.year, args.stats, args.output, config=config_with(args, "era5"))


def cmd_era5_split(args) -> None:
    from ..era5.split import assemble_split

    assemble_split(args.split, args.years, args.parts, args.stats, args.output, config=config_with(args, "era5"))


def cmd_era5_climatology_part(args) -> None:
    from ..era5.climatology import climatology_part

    climatology_part(args.years, args.part, args.parts, args.output, config=config_with(args, "era5"))


def cmd_era5_climatology(args) -> None:
    from ..era5.climatology import combine_climatology

    combine_climatology(args.parts, args.output, config=config_with(args, "era5"))


def cmd_regrid(args) -> None:
    from ..regrid.files import regrid_file

    regrid_file(args.input, args.output, args.grid, args.method, args.weights, args.backend, args.time_chunk)


def register(add) -> None:
    sp = add("demo-era5", cmd_demo_era5, "write the synthetic ERA5-layout demo inputs (netCDF, labelled synthetic)")
    config_arg(sp)
    sp.add_argument("--outdir", required=True)
    which = sp.add_mutually_exclusive_group()
    which.add_argument(
        "--year", type=positive_int, help="only this year's files (default: every year, and constants.nc)"
    )
    which.add_argument("--constants-only", action="store_true", help="only constants.nc")

    sp = add("era5-weights", cmd_era5_weights, "compute regridding weights from the inputs' grid to the target grid")
    config_arg(sp)
    sp.add_argument("--year", type=positive_int, required=True, help="a year whose input files define the source grid")
    sp.add_argument("--output", required=True, help="weights file (netCDF, ESMF/xESMF layout)")

    sp = add("era5-year", cmd_era5_year, "regrid one year of ERA5 inputs into a Zarr store (physical units)")
    config_arg(sp)
    sp.add_argument("--year", type=positive_int, required=True)
    sp.add_argument(
        "--weights",
        help="weights file from era5-weights (or any xESMF weights file); without it the inputs must be on the "
        "target grid, and are copied",
    )
    sp.add_argument("--output", required=True)

    sp = add(
        "era5-year-stats",
        cmd_era5_year_stats,
        "one training year's partial statistics: per channel count, mean and M2, read a chunk at a time",
    )
    config_arg(sp)
    sp.add_argument("--output", required=True, help="partial statistics JSON")
    sp.add_argument("year_store", help="the year's store (from era5-year)")

    sp = add("era5-stats", cmd_era5_stats, "per-channel normalisation statistics from the per-year partials")
    config_arg(sp)
    sp.add_argument("--output", required=True, help="statistics JSON")
    sp.add_argument("partials", nargs="+", help="per-year statistics of the training years (from era5-year-stats)")

    sp = add("era5-split-part", cmd_era5_split_part, "one year's normalised shards of a split store")
    config_arg(sp)
    sp.add_argument("--split", required=True, choices=schema_enum("era5.climatology_split"))
    sp.add_argument("--year", type=positive_int, required=True, help="the year whose shards this part holds")
    sp.add_argument("--stats", required=True)
    sp.add_argument("--output", required=True)
    sp.add_argument("years", nargs="+", help="per-year stores of the whole split, in time order")

    sp = add("era5-split", cmd_era5_split, "assemble a split store from its per-year parts")
    config_arg(sp)
    sp.add_argument("--split", required=True, choices=schema_enum("era5.climatology_split"))
    sp.add_argument("--stats", required=True)
    sp.add_argument("--output", required=True)
    sp.add_argument("--parts", nargs="+", required=True, help="the split's parts (from era5-split-part), one per year")
    sp.add_argument("--years", nargs="+", required=True, help="per-year stores of the split, in time order")

    sp = add(
        "era5-climatology-part",
        cmd_era5_climatology_part,
        "day-of-year means of one block of days over every climatology year (part K of N)",
    )
    config_arg(sp)
    sp.add_argument("--part", type=positive_int, required=True, help="K, from 1")
    sp.add_argument("--parts", type=positive_int, required=True, help="N: the day blocks the year is cut into")
    sp.add_argument("--output", required=True)
    sp.add_argument("years", nargs="+", help="per-year stores of the climatology years")

    sp = add(
        "era5-climatology", cmd_era5_climatology, "day-of-year and time-mean climatologies (for ACC) from the parts"
    )
    config_arg(sp)
    sp.add_argument("--output", required=True)
    sp.add_argument("parts", nargs="+", help="every part from era5-climatology-part")

    sp = add(
        "regrid", cmd_regrid, "regrid every lat-lon variable of a netCDF file or Zarr store onto a WeatherBench grid"
    )
    sp.add_argument("input")
    sp.add_argument(
        "--grid", type=positive_float, required=True, help="target resolution in degrees (5.625, 2.8125, 1.40625)"
    )
    sp.add_argument("--method", choices=schema_enum("era5.regrid.method"), default=schema_default("era5.regrid.method"))
    sp.add_argument("--weights", help="weights file: read if it exists, else written there for reuse")
    sp.add_argument(
        "--backend",
        choices=schema_enum("era5.regrid.backend"),
        default=schema_default("era5.regrid.backend"),
        help="who computes weights: xESMF if importable (auto), or this package (builtin)",
    )
    sp.add_argument("--time-chunk", type=positive_int, default=8, help="steps along the leading dimension per block")
    sp.add_argument("--output", required=True, help="output .nc or .zarr")

    sp = add("download-era5", cmd_download_era5, "download one year of the configured ERA5 channels (ARCO-ERA5 or CDS)")
    config_arg(sp)
    sp.add_argument("--year", type=positive_int, required=True)
    sp.add_argument("--source", choices=schema_enum("era5.download"), default=schema_enum("era5.download")[0])
    sp.add_argument("--store", help="ARCO-ERA5 Zarr store (default: the public Google Cloud store)")
    sp.add_argument("--output", required=True, help="output netCDF file")
