"""Evaluation: forecasts (the model's and the reference ones) and their scores, the
hyperspectral reconstruction and classification scores, and the comparison tables."""

from __future__ import annotations

from pathlib import Path

from ..config import schema_default, schema_enum
from ..evaluate.weather import METRICS, SCORING
from ..plan import BASELINE_FORECASTS
from .common import nonneg_float, nonneg_int, positive_float, positive_int


def cmd_era5_truth(args) -> None:
    from ..evaluate.forecast import write_truth

    write_truth(args.data, args.variables, args.output)


def cmd_wb2_climatology(args) -> None:
    from ..evaluate.forecast import wb2_climatology

    wb2_climatology(args.climatology, args.output)


def cmd_baseline_forecast(args) -> None:
    from ..evaluate.forecast import baseline_forecast

    baseline_forecast(args.kind, args.data, args.variables, args.lead_hours, args.output, args.climatology)


def cmd_score(args) -> None:
    from pathlib import Path

    from ..evaluate import perinit
    from ..evaluate.score import score_statistics, write_csv

    stats = score_statistics(
        args.forecast,
        args.truth,
        args.climatology,
        args.convention,
        args.batch_size,
        args.metrics,
        args.variables,
        args.lead_hours,
        args.regrid,
    )
    df = perinit.table(stats)
    perinit.write(stats, args.statistics or Path(args.output).with_suffix(".nc"))
    write_csv(df, args.output)
    table = df[df.region == "global"].pivot_table(
        index=["variable", "lead_time_hours"], columns="metric", values="value", dropna=False
    )
    print(table.to_string())  # an undefined ACC shows as NaN, as in the CSV


def cmd_compare_scores(args) -> None:
    from ..evaluate.compare import compare_hsi, compare_scores
    from ..evaluate.score import write_csv

    names, judged = (args.baseline_name, args.candidate_name), (args.alpha, args.equivalence_margin)
    if Path(args.baseline).suffix == ".npz":  # per-sample hyperspectral results
        df = compare_hsi(args.baseline, args.candidate, *names, *judged, args.replicates, args.seed)
        shown, keys = df, ["task", "region", "metric"]
    else:
        df = compare_scores(args.baseline, args.candidate, *names, args.method, *judged, args.replicates, args.seed)
        shown, keys = df[df.region == "global"], ["convention", "variable", "lead_time_hours", "metric"]
    write_csv(df, args.output)
    table = shown.set_index(keys)
    print(table[["percent_change", "percent_lower", "percent_upper", "p_value", "verdict"]].round(4).to_string())


def cmd_score_recon(args) -> None:
    from ..evaluate.recon import score_files, write_json

    out = score_files(args.truth, args.pred, args.band_axis, args.data_range)
    write_json(out, args.output)
    print(" ".join(f"{k}={out[k]:.6g}" for k in ("rmse", "psnr", "psnr_band_mean", "ssim", "sam", "ergas")))


def cmd_evaluate_mae(args) -> None:
    from ..evaluate.hsi import evaluate_mae
    from ..model.folder import load

    r = evaluate_mae(load(args.model), args.data, args.output, args.samples, args.batch_size)
    for region in ("masked", "full") if r else ():
        print(region, " ".join(f"{k}={r[region][k]:.4g}" for k in ("rmse", "psnr", "ssim", "sam", "ergas")))


def cmd_evaluate_classification(args) -> None:
    from ..evaluate.hsi import evaluate_classification
    from ..model.folder import load

    r = evaluate_classification(
        load(args.model), args.data, args.output, args.per_class, args.map, args.batch_size * 32
    )
    if r:
        print(f"OA {r['overall_accuracy']:.4f}  AA {r['average_accuracy']:.4f}  kappa {r['kappa']:.4f}")


def cmd_hsi_scores(args) -> None:
    from ..evaluate.compare import hsi_table
    from ..evaluate.score import write_csv

    write_csv(hsi_table(args.files), args.output)


def _model_args(sp, task: str) -> None:
    sp.add_argument("--model", required=True, help=f"the {task} run's model folder (dchag export)")
    sp.add_argument("--data", required=True, help=f"the {task} store it was trained on (scored on its test group)")
    sp.add_argument(
        "--batch-size",
        type=positive_int,
        default=schema_default("evaluate.inference_batch_size"),
        help="tiles a batch (default: evaluate.inference_batch_size; classification: 32 times it, in patches)",
    )


def _score_commands(add) -> None:
    """`dchag score` and `dchag compare-scores`."""
    sp = add("score", cmd_score, "latitude-weighted RMSE, MSE and ACC of a forecast file against a truth file")
    sp.add_argument("--forecast", required=True, help="netCDF/Zarr: (time, [prediction_timedelta|lead_time,] lat, lon)")
    sp.add_argument("--truth", required=True, help="netCDF/Zarr: (time, lat, lon)")
    sp.add_argument(
        "--climatology", help="netCDF/Zarr: (dayofyear[, hour], [level], lat, lon); required for ACC under wb2"
    )
    sp.add_argument("--convention", choices=list(SCORING), required=True)
    sp.add_argument("--batch-size", type=positive_int, help="climax ACC: samples per batch (default: all in one)")
    sp.add_argument("--metrics", nargs="+", choices=list(METRICS), help="default: all three")
    sp.add_argument("--variables", nargs="+", help="default: every lat-lon variable of the forecast")
    sp.add_argument(
        "--lead-hours", type=nonneg_float, nargs="+", help="score only these leads (or the lead of a 3-D forecast)"
    )
    sp.add_argument(
        "--regrid", choices=schema_enum("era5.regrid.method"), help="regrid the forecast onto the truth's grid"
    )
    sp.add_argument("--output", required=True, help="CSV: variable, lead_time_hours, region, metric, value, convention")
    sp.add_argument(
        "--statistics",
        help="netCDF of the per-initialisation statistics the scores are computed from "
        "(default: the CSV's path with suffix .nc)",
    )

    sp = add(
        "compare-scores",
        cmd_compare_scores,
        "one run's scores against another's with confidence intervals and p-values (the paper's table)",
    )
    sp.add_argument(
        "--baseline",
        required=True,
        help="the baseline's per-init statistics (dchag score --statistics), or its hyperspectral per-sample results "
        "(.npz: dchag evaluate-classification --map, dchag evaluate-mae --samples; compared by a paired bootstrap)",
    )
    sp.add_argument("--candidate", required=True, help="the candidate's, over the same initialisation times or samples")
    sp.add_argument("--baseline-name", default="baseline")
    sp.add_argument("--candidate-name", default="dchag")
    sig = "evaluate.significance"
    sp.add_argument(
        "--method", choices=schema_enum(f"{sig}.method"), default=schema_default(f"{sig}.method"), help=f"{sig}.method"
    )
    sp.add_argument("--alpha", type=positive_float, default=schema_default(f"{sig}.alpha"), help=f"{sig}.alpha")
    sp.add_argument(
        "--equivalence-margin",
        type=positive_float,
        default=schema_default(f"{sig}.equivalence_margin_percent"),
        help=f"percent ({sig}.equivalence_margin_percent)",
    )
    sp.add_argument(
        "--replicates",
        type=positive_int,
        default=schema_default(f"{sig}.bootstrap_replicates"),
        help=f"{sig}.bootstrap_replicates",
    )
    sp.add_argument("--seed", type=nonneg_int, default=schema_default(f"{sig}.seed"), help=f"{sig}.seed")
    sp.add_argument("--output", required=True, help="CSV: per variable, lead, region and metric")


def register(add) -> None:
    sp = add(
        "era5-truth",
        cmd_era5_truth,
        "write a split's verifying fields in physical units (WeatherBench 2 layout) for scoring",
    )
    sp.add_argument("--data", required=True, help="normalised split store (e.g. results/<name>/era5/test.zarr)")
    sp.add_argument("--variables", nargs="+", required=True)
    sp.add_argument("--output", required=True)

    sp = add(
        "wb2-climatology",
        cmd_wb2_climatology,
        "the pipeline's climatology in WeatherBench 2's layout (long names, level, latitude/longitude)",
    )
    sp.add_argument("--climatology", required=True, help="a store of `dchag era5-climatology`")
    sp.add_argument("--output", required=True, help="Zarr: <variable>(dayofyear[, hour], [level], latitude, longitude)")

    sp = add("baseline-forecast", cmd_baseline_forecast, "persistence or climatology forecasts in the same layout")
    sp.add_argument("--kind", choices=BASELINE_FORECASTS, required=True)
    sp.add_argument("--data", required=True, help="normalised split store")
    sp.add_argument("--variables", nargs="+", required=True)
    sp.add_argument("--lead-hours", type=positive_int, nargs="+", required=True)
    sp.add_argument("--climatology", help="day-of-year climatology (needed for --kind climatology)")
    sp.add_argument("--output", required=True)

    _score_commands(add)

    sp = add("score-recon", cmd_score_recon, "reconstruction scores (RMSE, PSNR, SSIM, SAM, ERGAS) of two .npy cubes")
    sp.add_argument("--truth", required=True, help=".npy cube")
    sp.add_argument("--pred", required=True, help=".npy cube of the same shape")
    sp.add_argument("--band-axis", type=int, default=-1)
    sp.add_argument("--data-range", type=positive_float, help="for PSNR and SSIM (default: the truth's max - min)")
    sp.add_argument("--output", required=True, help="JSON")

    sp = add("evaluate-mae", cmd_evaluate_mae, "reconstruction scores of a masked-autoencoder model on the test tiles")
    _model_args(sp, "mae")
    sp.add_argument("--output", required=True, help="JSON: masked-patch and full-tile scores")
    sp.add_argument("--samples", required=True, help=".npz of a few reconstructed tiles (for the figure)")

    sp = add(
        "evaluate-classification",
        cmd_evaluate_classification,
        "classification scores of a model on the test patches, and its class map",
    )
    _model_args(sp, "classification")
    sp.add_argument("--output", required=True, help="JSON: OA, AA, kappa, per class, confusion matrix")
    sp.add_argument("--per-class", required=True, help="CSV: per-class table")
    sp.add_argument("--map", required=True, help=".npz: truth, predicted and split maps (for the figure)")

    sp = add("hsi-scores", cmd_hsi_scores, "one CSV of the hyperspectral scores of several runs")
    sp.add_argument("files", nargs="+", help="evaluate-mae / evaluate-classification JSON files")
    sp.add_argument("--output", required=True)
