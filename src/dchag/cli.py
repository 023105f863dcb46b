"""The ``dchag`` command: one subcommand per pipeline stage.

Each Snakemake rule calls exactly one of these; each is also usable on its own. A user's
mistake (any :class:`dchag.errors.DchagError`) ends the command with one line naming the
file, key or value at fault (exit status 2), never a traceback; ``-v`` shows the traceback.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import __version__
from .config import schema_default


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
    levels = era5["channels"]["pressure_level"]["levels"] if "pressure_level" in era5["channels"] else []
    if args.year is not None:
        years = [args.year]
    if args.constants_only:
        years = []
    for year in years:
        demo.write_year(outdir, year, era5["demo_grid"], levels, era5["time_step_hours"], days=era5["demo_days"])
    if args.year is None:
        demo.write_constants(outdir, era5["demo_grid"])


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

    from .config import settings
    from .model.describe import describe, format_table
    from .train.tasks import era5_model_config

    cfg = settings(_config(args))
    mcfg = era5_model_config(cfg, in_channels=args.channels)  # the config's ERA5 grid and channels
    if args.task != "forecast":
        mcfg = replace(mcfg, task=args.task, out_channels=[], num_classes=args.num_classes or (16 if args.task == "classify" else 0))
    groups = args.groups or cfg.parallel.tp
    rows = describe(mcfg, groups)
    if args.json:
        from . import jsonio

        print(jsonio.dumps(rows, indent=1))
    else:
        print(format_table(rows, mcfg, groups))


def cmd_demo_hsi(args) -> None:
    from .hsi import demo

    from .store import InputError

    for flag, value, least in (("--size", args.size, 16), ("--image-size", args.image_size, 16), ("--images", args.images, 1)):
        if value < least:
            raise InputError(f"demo-hsi {flag} {value}: expected at least {least}")
    outdir = Path(args.outdir)
    demo.write_mat(outdir, args.size, args.size, seed=args.seed)
    demo.write_envi(outdir / "envi", count=args.images, rows=args.image_size, cols=args.image_size, seed=args.seed + 100)


def _parse_fractions(text: str) -> tuple[float, float, float]:
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 3:
        raise argparse.ArgumentTypeError("expected three comma-separated fractions: train,val,test")
    return tuple(parts)


def cmd_preprocess_hsi(args) -> None:
    from .hsi.preprocess import BandOptions, preprocess_classification, preprocess_from_config, preprocess_tiles
    from .store import InputError

    if args.config:
        if not args.task or args.input:
            raise InputError("preprocess-hsi --config takes --task classification|mae and no input files "
                             "(the config's hsi section names them)")
        preprocess_from_config(_config(args), args.task, args.output)
        return
    if not args.input:
        raise InputError("preprocess-hsi needs input file(s), or --config FILE --task classification|mae")

    opts = BandOptions(
        preset=args.preset, drop_bands=args.drop_bands,
        drop_wavelengths=[list(map(float, r.split("-"))) for r in args.drop_wavelengths or []],
        nan_policy=args.nan_policy, clip_percentiles=tuple(args.clip) if args.clip else None,
        band_chunk=args.band_chunk, key=args.key,
    )
    provenance_cfg = {k: v for k, v in vars(args).items() if k != "func"}
    if args.labels:
        preprocess_classification(
            args.input[0], args.labels, args.output, opts, labels_key=args.labels_key, patch=args.patch,
            split=args.split, fractions=args.fractions or schema_default("hsi.classification.fractions"), seed=args.seed, block=args.block,
            class_names=args.class_names.split(",") if args.class_names else None, missing_class=args.missing_class,
            config=provenance_cfg,
        )
    else:
        preprocess_tiles(args.input, args.output, opts, tile=args.tile, fractions=args.fractions or schema_default("hsi.mae.fractions"),
                         seed=args.seed, config=provenance_cfg)


def _stores(args, config: dict, task: str) -> dict[str, str]:
    """The run's train/val stores: as given, else where the pipeline puts them (results/<name>);
    a hyperspectral store holds both groups, so its val store defaults to the training store."""
    from .plan import default_stores

    default = default_stores(config, task)
    train = args.train_data or str(default["train"])
    return {"train": train, "val": args.val_data or (str(default["val"]) if task == "forecast" else train)}


def cmd_train(args) -> None:
    from .train.trainer import main as train_main

    from .config import run_settings

    config = _config(args)
    train_main(config, args.run, args.output, _stores(args, config, run_settings(config, args.run).task))


def cmd_launch_train(args) -> None:
    from .config import run_settings
    from .train.launch import launch

    config = _config(args)
    run = run_settings(config, args.run)  # an unknown run fails here, not in every rank
    train, stores = run.train, _stores(args, config, run.task)
    launch(args.nproc or train.nproc, train.max_restarts if args.max_restarts is None else args.max_restarts,
           ["--config", args.config, "--run-name", args.run, "--output", args.output, "--train-data", stores["train"],
            "--val-data", stores["val"]], args.threads_per_rank)


def cmd_train_summary(args) -> None:
    from .train.summary import summarize

    for r in summarize(args.logs, args.output):
        print(f"{r['run']:22s} loss {r['loss_first']:.4f} -> {r['loss_last']:.4f} ({r['loss_fall_pct']:.0f}% lower); "
              f"val {r['val_loss_last']:.4f} ({r['val_loss_vs_baseline_pct']:+.1f}% vs baseline)")


# -- evaluation ----------------------------------------------------------------------------
def cmd_era5_truth(args) -> None:
    from .evaluate.forecast import write_truth

    write_truth(args.data, args.variables, args.output)


def cmd_forecast(args) -> None:
    from .evaluate.forecast import model_forecast

    model_forecast(_config(args), args.run, args.checkpoint, args.data, args.lead_hours, args.output,
                   batch_size=args.batch_size)


def cmd_baseline_forecast(args) -> None:
    from .evaluate.forecast import baseline_forecast

    baseline_forecast(args.kind, args.data, args.variables, args.lead_hours, args.output, args.climatology)


def cmd_score(args) -> None:
    from .evaluate.score import score_files, write_csv

    df = score_files(args.forecast, args.truth, args.climatology, args.convention, args.batch_size, args.metrics,
                     args.variables, args.lead_hours, args.regrid)
    write_csv(df, args.output)
    print(df.pivot_table(index=["variable", "lead_time_hours"], columns="metric", values="value").to_string())


def cmd_compare_scores(args) -> None:
    from .evaluate.compare import percent_change
    from .evaluate.score import write_csv

    df = percent_change(args.baseline, args.candidate, args.baseline_name, args.candidate_name)
    write_csv(df, args.output)
    print(df.pivot_table(index=["convention", "variable", "lead_time_hours"], columns="metric", values="percent_change").round(2).to_string())


def cmd_score_recon(args) -> None:
    from .evaluate.recon import score_files, write_json

    out = score_files(args.truth, args.pred, args.band_axis, args.data_range)
    write_json(out, args.output)
    print(" ".join(f"{k}={out[k]:.6g}" for k in ("rmse", "psnr", "psnr_band_mean", "ssim", "sam", "ergas")))


def cmd_evaluate_mae(args) -> None:
    from .evaluate.hsi import evaluate_mae

    r = evaluate_mae(_config(args), args.run, args.checkpoint, args.output, args.samples, args.data)
    for region in ("masked", "full"):
        print(region, " ".join(f"{k}={r[region][k]:.4g}" for k in ("rmse", "psnr", "ssim", "sam", "ergas")))


def cmd_evaluate_classify(args) -> None:
    from .evaluate.hsi import evaluate_classification

    r = evaluate_classification(_config(args), args.run, args.checkpoint, args.output, args.per_class, args.map, args.data)
    print(f"OA {r['overall_accuracy']:.4f}  AA {r['average_accuracy']:.4f}  kappa {r['kappa']:.4f}")


def cmd_hsi_scores(args) -> None:
    from .evaluate.compare import hsi_table
    from .evaluate.score import write_csv

    write_csv(hsi_table(args.files), args.output)


def cmd_figure(args) -> None:
    from . import figures

    kind = args.kind
    if kind == "loss-curves":
        figures.loss_curves(args.inputs, args.output)
    elif kind == "lead-time":
        figures.lead_time_scores(args.inputs, args.output, args.variables)
    elif kind == "forecast-maps":
        if not args.truth:
            from .store import InputError

            raise InputError("figure forecast-maps needs --truth (the verifying fields' store)")
        figures.forecast_maps(args.inputs, args.truth, args.output, args.variables[0] if args.variables else None, args.lead_index)
    elif kind == "hsi-reconstruction":
        figures.hsi_reconstruction(args.inputs, args.output)
    elif kind == "classification":
        figures.classification(args.inputs, args.output)


def cmd_install_profile(args) -> None:
    from .profiles import install

    print(install(args.name, args.dest, args.force))


# -- benefit model ---------------------------------------------------------------------------
def cmd_calibrate(args) -> None:
    from .benefit.calibrate import calibrate

    cfg = _config(args) if args.config else None
    hw = calibrate(cfg, args.output, repeats=args.repeats, channels=args.channels, batch=args.batch)
    if hw is not None:
        print(f"alpha {hw.alpha * 1e6:.1f} us, intra {hw.intra_bw / 1e9:.3f} GB/s, inter {hw.inter_bw / 1e9:.3f} GB/s"
              + (", compute {flops_per_s:.3g} FLOP/s, memory {mem_bw:.3g} B/s, {op_s:.2g} s/op; model step {model_step_s:.4f} s "
                 "measured, {microbenchmark_step_s:.4f} s from the microbenchmarks (efficiency {efficiency:.2f})"
                 .format(**hw.measured["compute"]) if "compute" in hw.measured else "")
              + f" -> {args.output}")


def cmd_advise(args) -> None:
    from .benefit import advise as adv
    from .benefit.hardware import Hardware
    from .config import ConfigError

    if args.hardware:
        hw = Hardware.from_yaml(args.hardware)
    elif None not in (args.alpha, args.intra_bw, args.inter_bw):
        hw = Hardware(args.alpha, args.intra_bw, args.inter_bw, args.gpus_per_node)
    else:
        raise ConfigError("give --hardware FILE (from `dchag calibrate`) or all of --alpha, --intra-bw and --inter-bw")
    hw.gpus_per_node = args.gpus_per_node
    if args.gradient_bytes is not None:
        if args.compute_s is None:
            raise ConfigError("--gradient-bytes (the seed article's model) needs --compute-s")
        result = adv.article(args.gradient_bytes, args.compute_s, hw, args.gpus, args.gpus_per_node, args.delta_alpha)
    else:
        from .benefit.calibrate import workload_from_config

        if not args.model:
            raise ConfigError("give --model FILE (a config with a model section), or --gradient-bytes and --compute-s")
        from .config import load_config

        w = workload_from_config(load_config(args.model), args.channels, args.batch, tuple(args.image) if args.image else None)
        from dataclasses import replace

        from .benefit.hardware import Compute

        rate = Compute.from_measured(hw.measured)
        if args.flops_per_s:
            rate = replace(rate, flops_per_s=args.flops_per_s) if rate else Compute(args.flops_per_s)
        if rate is None:
            raise ConfigError("no compute rate: pass --flops-per-s, or a --hardware profile calibrated with --config")
        result = adv.advise(w, hw, args.gpus, args.gpus_per_node, rate, args.gpu_memory_gb * 1e9 if args.gpu_memory_gb else None)
    print(adv.format_table(result))
    if args.output:
        adv.write(result, args.output)


def cmd_verify_report(args) -> None:
    from .benefit import verify

    runs = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        runs[name] = Path(path)
    df = verify.summarize(runs, tolerance=args.tolerance)
    verify.write(df, args.output)
    verify.figure(runs, df, args.figure)
    print(df[["run", "repeats", "step_s", "step_s_min", "step_s_max", "comm_s", "peak_mem_mib_max_rank", "final_val_loss",
              "step_time_change", "verdict"]].to_string(index=False))


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

    def train_data_args(sp):
        sp.add_argument("--train-data", help="training store (default: the task's store under results/<name>: "
                        "era5/train.zarr, hsi/mae.zarr or hsi/classification.zarr)")
        sp.add_argument("--val-data", help="validation store (default: era5/val.zarr under results/<name>; for "
                        "hyperspectral tasks the training store, whose val group is read)")

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

    sp = add("demo-hsi", cmd_demo_hsi, "write the synthetic hyperspectral demo scene (.mat + ground truth, and ENVI images)")
    sp.add_argument("--outdir", required=True)
    sp.add_argument("--size", type=int, default=48, help="classification scene rows = cols")
    sp.add_argument("--images", type=int, default=6, help="ENVI images for masked autoencoding")
    sp.add_argument("--image-size", type=int, default=64, help="rows = cols of each ENVI image")
    sp.add_argument("--seed", type=int, default=0)

    sp = add("preprocess-hsi", cmd_preprocess_hsi,
             "hyperspectral image(s) -> normalised patches (with --labels) or tiles, one Zarr store with train/val/test groups")
    sp.add_argument("input", nargs="*", help="ENVI header(s) or .mat file(s); several (or a glob) for tiles")
    sp.add_argument("--config", help="take the files and every option from this config's hsi section instead (with --task)")
    sp.add_argument("--task", choices=["classification", "mae"], help="with --config: which store to make")
    sp.add_argument("--labels", help="ground-truth map: makes classification patches centred on labelled pixels")
    sp.add_argument("--key", help="variable of the image in a .mat file")
    sp.add_argument("--labels-key", help="variable of the labels in a .mat file")
    which = sp.add_mutually_exclusive_group()
    which.add_argument("--preset", help="band preset: indian_pines, salinas, pavia_university, vnir_400_900")
    which.add_argument("--drop-bands", help="1-based bands to drop, e.g. 104-108,150-163,220")
    sp.add_argument("--drop-wavelengths", nargs="*", help="nm ranges to drop, e.g. 1340-1450 1800-1960")
    # defaults: the config schema's (hsi section)
    sp.add_argument("--patch", type=int, default=schema_default("hsi.classification.patch"))
    sp.add_argument("--split", choices=["stratified", "disjoint"], default=schema_default("hsi.classification.split"))
    sp.add_argument("--block", type=int, help="disjoint split block size (default 2 x patch)")
    sp.add_argument("--missing-class", choices=["error", "warn"], default=schema_default("hsi.classification.missing_class"),
                    help="a class absent from a split stops the run (error) or is reported (warn)")
    sp.add_argument("--tile", type=int, default=schema_default("hsi.mae.tile"), help="tile size for masked autoencoding")
    sp.add_argument("--fractions", type=_parse_fractions, help="train,val,test (default %s patches; %s tiles)" % (
        ",".join(map(str, schema_default("hsi.classification.fractions"))), ",".join(map(str, schema_default("hsi.mae.fractions")))))
    sp.add_argument("--seed", type=int, default=schema_default("hsi.classification.seed"))
    sp.add_argument("--class-names", help="comma-separated, in label order 1..K")
    sp.add_argument("--nan-policy", choices=["fail", "fill"], default=schema_default("hsi.nan_policy"))
    sp.add_argument("--clip", type=float, nargs=2, metavar=("LO", "HI"), help="clip to these percentiles of the training pixels")
    sp.add_argument("--band-chunk", type=int, default=schema_default("hsi.band_chunk"))
    sp.add_argument("--output", required=True)

    sp = add("train", cmd_train, "train one run (the torchrun entry point: torchrun --nproc-per-node N -m dchag train ...)")
    config_arg(sp)
    sp.add_argument("--run-name", dest="run", required=True, help="a run name from the config's train.runs")
    sp.add_argument("--output", required=True, help="run directory: checkpoints/, final/, log.csv, tensorboard/, run.json")
    train_data_args(sp)

    sp = add("launch-train", cmd_launch_train,
             "start `dchag train` under torchrun: standalone, or per node with c10d rendezvous from a Slurm allocation")
    config_arg(sp)
    sp.add_argument("--run-name", dest="run", required=True)
    sp.add_argument("--output", required=True)
    train_data_args(sp)
    sp.add_argument("--nproc", type=int, help="processes per node (default: train.nproc)")
    sp.add_argument("--max-restarts", type=int, help="default: train.max_restarts")
    sp.add_argument("--threads-per-rank", type=int,
                    help="OpenMP/MKL/BLAS threads of each rank (default: the environment's, as torchrun passes them)")

    sp = add("train-summary", cmd_train_summary, "table of losses per run and D-CHAG vs baseline, from training logs")
    sp.add_argument("logs", nargs="+", help="log.csv files of training runs")
    sp.add_argument("--output", required=True)

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
    # -- evaluation
    sp = add("era5-truth", cmd_era5_truth, "write a split's verifying fields in physical units (WeatherBench layout) for scoring")
    sp.add_argument("--data", required=True, help="normalised split store (e.g. results/<name>/era5/test.zarr)")
    sp.add_argument("--variables", nargs="+", required=True)
    sp.add_argument("--output", required=True)

    def trained_run_args(sp, store: bool = True):
        config_arg(sp)
        sp.add_argument("--run-name", dest="run", required=True, help="a run name from the config's train.runs")
        sp.add_argument("--checkpoint", required=True, help="the run's final/ (or checkpoints/step_N) directory")
        if store:
            sp.add_argument("--data", help="the hyperspectral store to score on (its test group; default under results/<name>)")

    sp = add("forecast", cmd_forecast, "run a trained forecast model over a split: a WeatherBench-layout Zarr of forecasts")
    trained_run_args(sp, store=False)
    sp.add_argument("--data", required=True, help="normalised split store to initialise from")
    sp.add_argument("--lead-hours", type=int, nargs="+", required=True)
    sp.add_argument("--batch-size", type=int, default=32)
    sp.add_argument("--output", required=True)

    sp = add("baseline-forecast", cmd_baseline_forecast, "persistence or climatology forecasts in the same layout")
    sp.add_argument("--kind", choices=["persistence", "climatology"], required=True)
    sp.add_argument("--data", required=True, help="normalised split store")
    sp.add_argument("--variables", nargs="+", required=True)
    sp.add_argument("--lead-hours", type=int, nargs="+", required=True)
    sp.add_argument("--climatology", help="day-of-year climatology (needed for --kind climatology)")
    sp.add_argument("--output", required=True)

    sp = add("score", cmd_score, "latitude-weighted RMSE, MSE and ACC of a forecast file against a truth file")
    sp.add_argument("--forecast", required=True, help="netCDF/Zarr: (time, [prediction_timedelta|lead_time,] lat, lon)")
    sp.add_argument("--truth", required=True, help="netCDF/Zarr: (time, lat, lon)")
    sp.add_argument("--climatology", help="netCDF/Zarr: (dayofyear[, hour], lat, lon); required for ACC under wb2")
    sp.add_argument("--convention", choices=["wb2", "climax"], required=True)
    sp.add_argument("--batch-size", type=int, help="climax ACC: samples per batch (default: all in one)")
    sp.add_argument("--metrics", nargs="+", choices=["rmse", "mse", "acc"], help="default: all three")
    sp.add_argument("--variables", nargs="+", help="default: every lat-lon variable of the forecast")
    sp.add_argument("--lead-hours", type=float, nargs="+", help="score only these leads (or the lead of a 3-D forecast)")
    sp.add_argument("--regrid", choices=["bilinear", "conservative"], help="regrid the forecast onto the truth's grid")
    sp.add_argument("--output", required=True, help="CSV: variable, lead_time_hours, metric, value, convention")

    sp = add("compare-scores", cmd_compare_scores, "percent change of one run's scores against another's (the paper's table)")
    sp.add_argument("--baseline", required=True)
    sp.add_argument("--candidate", required=True)
    sp.add_argument("--baseline-name", default="baseline")
    sp.add_argument("--candidate-name", default="dchag")
    sp.add_argument("--output", required=True)

    sp = add("score-recon", cmd_score_recon, "reconstruction scores (RMSE, PSNR, SSIM, SAM, ERGAS) of two .npy cubes")
    sp.add_argument("--truth", required=True, help=".npy cube")
    sp.add_argument("--pred", required=True, help=".npy cube of the same shape")
    sp.add_argument("--band-axis", type=int, default=-1)
    sp.add_argument("--data-range", type=float, help="for PSNR and SSIM (default: the truth's max - min)")
    sp.add_argument("--output", required=True, help="JSON")

    sp = add("evaluate-mae", cmd_evaluate_mae, "reconstruction scores of a masked-autoencoder run on the test tiles")
    trained_run_args(sp)
    sp.add_argument("--output", required=True, help="JSON: masked-patch and full-tile scores")
    sp.add_argument("--samples", required=True, help=".npz of a few reconstructed tiles (for the figure)")

    sp = add("evaluate-classify", cmd_evaluate_classify, "classification scores of a run on the test patches, and its class map")
    trained_run_args(sp)
    sp.add_argument("--output", required=True, help="JSON: OA, AA, kappa, per class, confusion matrix")
    sp.add_argument("--per-class", required=True, help="CSV: per-class table")
    sp.add_argument("--map", required=True, help=".npz: truth, predicted and split maps (for the figure)")

    sp = add("hsi-scores", cmd_hsi_scores, "one CSV of the hyperspectral scores of several runs")
    sp.add_argument("files", nargs="+", help="evaluate-mae / evaluate-classify JSON files")
    sp.add_argument("--output", required=True)

    sp = add("calibrate", cmd_calibrate,
             "measure all-reduce/all-gather (alpha, bandwidth; intra/inter node) and a model's compute: a hardware profile "
             "(run under torchrun)")
    sp.add_argument("--config", help="config whose model's step time is measured (optional)")
    sp.add_argument("--channels", type=int)
    sp.add_argument("--batch", type=int)
    sp.add_argument("--repeats", type=int, default=5)
    sp.add_argument("--output", default="hw.yaml")

    sp = add("advise", cmd_advise, "predict step time, communication and memory per strategy; recommend one")
    sp.add_argument("--hardware", help="profile from `dchag calibrate`")
    sp.add_argument("--alpha", type=float, help="seconds per message step")
    sp.add_argument("--intra-bw", type=float, help="bytes/s within a node")
    sp.add_argument("--inter-bw", type=float, help="bytes/s between nodes")
    sp.add_argument("--model", help="config YAML with the model (and era5 channels/grid)")
    sp.add_argument("--channels", type=int)
    sp.add_argument("--image", type=int, nargs=2, metavar=("H", "W"))
    sp.add_argument("--batch", type=int, help="micro-batch per GPU (default: train.batch_size)")
    sp.add_argument("--gpus", type=int, required=True)
    sp.add_argument("--gpus-per-node", type=int, required=True)
    sp.add_argument("--flops-per-s", type=float, help="sustained matmul FLOP/s per GPU (default: the profile's measured rate; "
                    "without a profile's other rates the model counts FLOPs only)")
    sp.add_argument("--gpu-memory-gb", type=float, help="memory per GPU: strategies that do not fit are not recommended")
    sp.add_argument("--gradient-bytes", type=float, help="the seed article's model: gradient bytes per step (with --compute-s)")
    sp.add_argument("--compute-s", type=float, help="the seed article's model: compute time per step")
    sp.add_argument("--delta-alpha", type=float, default=2e-3, help="the article's added fixed overhead (s)")
    sp.add_argument("--output", help=".json (everything) or .md (the table)")

    sp = add("verify-report", cmd_verify_report, "the verification experiment's verdict table and figure, from its training logs")
    sp.add_argument("runs", nargs="+", help="NAME=RUN_DIR (with log.csv and ranks.csv); verify-dp is the reference")
    sp.add_argument("--tolerance", type=float, default=0.05, help="relative validation-loss rise still counted as no accuracy loss")
    sp.add_argument("--output", required=True, help="verdict CSV")
    sp.add_argument("--figure", required=True, help=".png (a .pdf is written beside it)")

    sp = add("install-profile", cmd_install_profile,
             "copy a shipped Snakemake profile where `snakemake --profile NAME` finds it")
    sp.add_argument("name", choices=["slurm"])
    sp.add_argument("--dest", help="profiles folder (default: $XDG_CONFIG_HOME/snakemake, i.e. ~/.config/snakemake)")
    sp.add_argument("--force", action="store_true", help="replace an installed profile of that name")

    sp = add("paper-point", cmd_paper_point,
             "measure one paper sweep point under torchrun (tp x dp processes): peak memory per rank, its front-end "
             "split, step time, samples/s and TFLOPS per GPU")
    config_arg(sp)
    sp.add_argument("--point", required=True, help="a point name of the config's paper sweeps")
    sp.add_argument("--output", required=True, help="result JSON")
    sp.add_argument("--threads-per-rank", type=int, help="CPU threads of each rank (default: paper.threads_per_rank)")

    sp = add("paper-figure", cmd_paper_figure,
             "draw one of the paper's figures from this pipeline's sweep points and training runs, beside the published values")
    sp.add_argument("kind", choices=["front_share", "tokenization", "tree", "full_models", "tp_scaling", "accuracy"])
    sp.add_argument("inputs", nargs="*", help="point result JSONs (accuracy: comparison CSVs)")
    sp.add_argument("--mae", nargs="*", help="accuracy: VARIANT=log.csv of the hyperspectral MAE runs")
    sp.add_argument("--forecast", nargs="*", help="accuracy: VARIANT=log.csv of the ERA5 forecast runs")
    sp.add_argument("--output", required=True, help=".png (a .pdf and a .csv with the caption's numbers beside it)")

    sp = add("figure", cmd_figure, "draw one of the paper's figures from result files (PNG, and PDF beside it)")
    sp.add_argument("kind", choices=["loss-curves", "lead-time", "forecast-maps", "hsi-reconstruction", "classification"])
    sp.add_argument("inputs", nargs="+", help="log.csv files | score CSVs | forecast stores | "
                    "reconstruction .npz | classification map .npz")
    sp.add_argument("--truth", help="forecast-maps: the truth store")
    sp.add_argument("--variables", nargs="+", help="lead-time: variables to show; forecast-maps: the variable")
    sp.add_argument("--lead-index", type=int, default=0, help="forecast-maps: which lead")
    sp.add_argument("--output", required=True, help=".png")
    return p


def cmd_paper_point(args) -> None:
    import json

    from .paper.sweep import all_points, resources
    from .train.launch import launch

    config = _config(args)
    paper = _paper(config, args.config)
    points = all_points(paper)
    if args.point not in points:
        from .config import ConfigError

        raise ConfigError(f"{args.config}: no paper sweep point named {args.point!r} (the config's points: "
                          f"{', '.join(sorted(points)) or 'none'})")
    point = points[args.point]
    res = resources(point, paper["gpus_per_node"])
    launch(res.per_node, 0, ["--point", json.dumps(point.to_dict()), "--steps", str(paper["steps"]), "--warmup",
                             str(paper["warmup"]), "--output", args.output], args.threads_per_rank or paper["threads_per_rank"],
           module=("dchag.paper.bench",))


def _paper(config: dict, source: str) -> dict:
    from .config import ConfigError, settings

    paper = settings(config).paper
    if paper is None:
        raise ConfigError(f"{source}: has no 'paper' section (the paper's sweeps; see config/paper.yaml)")
    return paper


def cmd_paper_figure(args) -> None:
    from .paper import figures

    if args.kind == "accuracy":
        def pairs(items, what):
            out = {}
            for item in items or []:
                variant, _, path = item.partition("=")
                if not path:
                    from .store import InputError

                    raise InputError(f"--{what} takes VARIANT=LOG pairs, got {item!r}")
                out[variant] = path
            return out

        figures.accuracy(pairs(args.mae, "mae"), pairs(args.forecast, "forecast"), args.inputs, args.output)
    else:
        figures.DRAW[args.kind](args.inputs, args.output)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from .errors import DchagError

    try:
        args.func(args)
    except DchagError as err:
        if args.verbose:
            raise
        print(f"dchag {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
