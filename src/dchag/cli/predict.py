"""Using a trained model: ``export`` (the self-describing model folder) and ``predict``
(forecasts, classification maps, reconstructions of new data)."""

from __future__ import annotations

from ..config import schema_default
from ..vocabulary import Task
from .common import a_time, config, config_arg, nonneg_int, positive_int


def _training_store(cfg: dict, run: str, data: str | None) -> str:
    """--data, or where the pipeline puts the run's training store (results/<name>/)."""
    from ..runs import resolve

    return data or str(resolve(cfg, run).stores()["train"])


def cmd_export(args) -> None:
    from ..predict.export import export

    cfg = config(args)
    export(cfg, args.run, args.checkpoint, args.output, _training_store(cfg, args.run, args.data))
    print(f"exported {args.run} to {args.output}")


def _forecast(model, args) -> None:
    from ..errors import DchagError
    from ..predict import weather

    if bool(args.store) == bool(args.input):
        raise DchagError("a forecast starts from --store STORE (a date range of it) or --input FILE ..., one of them")
    if not args.lead_hours:
        raise DchagError("a forecast needs --lead-hours")
    if args.verifiable and not args.store:
        raise DchagError("--verifiable keeps the initialisation times verified by --store STORE: give it")
    if args.member is not None and not args.input:
        raise DchagError("--member picks an ensemble member of --input FILE ...: give the files")
    weather.check_leads(model, args.lead_hours)  # before any input is read
    if args.store:
        verified_at = args.lead_hours if args.verifiable else None
        inputs = weather.from_store(model, args.store, args.init_start, args.init_end, verified_at)
    else:
        inputs = weather.from_files(model, args.input, args.init_start, args.init_end, args.member)
    out = weather.forecast(model, inputs, args.lead_hours, args.output, args.batch_size)
    if out is not None:
        print(f"{len(inputs.times)} forecast(s) at {args.lead_hours} h -> {out}")


def _on_image(apply, batch: int):
    """A hyperspectral model's use: ``apply`` (dchag.predict.hsi) on --image, ``batch`` times
    --batch-size samples a batch."""

    def run(model, args) -> None:
        from ..errors import DchagError

        if not args.image:
            raise DchagError(f"a {model.task} model is applied to an image: give --image FILE")
        made = apply(model, args.image, args.output, args.image_key, args.batch_size * batch)
        if made:  # rank 0 under torchrun
            print(" ".join(f"{k}={v}" for k, v in made.items() if k != "scores"))

    return run


def cmd_predict(args) -> None:
    from ..model.folder import load
    from ..predict import hsi

    model = load(args.model)
    use = {
        Task.FORECAST: _forecast,
        Task.CLASSIFICATION: _on_image(hsi.classify_scene, 32),
        Task.MAE: _on_image(hsi.reconstruct_image, 1),
    }
    use[Task(model.task)](model, args)


def cmd_push_model(args) -> None:
    from ..predict.hub import push

    print(f"pushed {args.model} to {push(args.model, args.repo, args.revision, args.private)}")


def cmd_pull_model(args) -> None:
    from ..predict.hub import pull

    print(f"pulled {args.repo} to {pull(args.repo, args.output, args.revision)}")


def _run_args(sp) -> None:
    config_arg(sp, required=True, help_="the run's config (YAML or JSON)")
    sp.add_argument("--run-name", dest="run", required=True, help="a run of the config's train.runs")
    sp.add_argument("--checkpoint", required=True, help="the run's final/ (or checkpoints/step_N) directory")
    sp.add_argument("--data", help="the run's training store (default: where the pipeline puts it, results/<name>/)")


def register(add) -> None:
    sp = add(
        "export",
        cmd_export,
        "write a trained run as one self-describing model folder (model.safetensors + model.json)",
    )
    _run_args(sp)
    sp.add_argument("--output", required=True, help="the model folder to write")

    sp = add(
        "predict",
        cmd_predict,
        "apply a model folder to new data: forecasts (WeatherBench 2 layout), "
        "a classification map or reconstructions of a hyperspectral image",
    )
    sp.add_argument("--model", required=True, help="a model folder (dchag export)")
    sp.add_argument("--store", help="forecast: a dchag ERA5 store (a split or a year) to start from")
    sp.add_argument(
        "--input", nargs="+", help="forecast: your own initial conditions (netCDF, GRIB, Zarr in an ERA5 layout)"
    )
    sp.add_argument(
        "--init-start", type=a_time, help="forecast: the first initialisation time (default: the first there)"
    )
    sp.add_argument("--init-end", type=a_time, help="forecast: the last initialisation time (default: the last there)")
    sp.add_argument("--lead-hours", type=positive_int, nargs="+", help="forecast: lead times in hours")
    sp.add_argument(
        "--member", type=nonneg_int, help="forecast: the ensemble member to read from --input files that hold several"
    )
    sp.add_argument(
        "--verifiable",
        action="store_true",
        help="forecast: only the initialisation times whose valid time at every lead is in --store too "
        "(what scoring against it needs; the pipeline's evaluation forecasts)",
    )
    sp.add_argument("--image", help="hyperspectral: the image (any kind the hsi readers take)")
    sp.add_argument("--image-key", help="hyperspectral: the image's variable in a .mat file")
    sp.add_argument(
        "--batch-size",
        type=positive_int,
        default=schema_default("evaluate.inference_batch_size"),
        help="samples a batch (default: evaluate.inference_batch_size; hyperspectral classification: 32 times it)",
    )
    sp.add_argument(
        "--output",
        required=True,
        help="Zarr store (a PNG, and a GeoTIFF where the image has a georeference, beside it)",
    )

    sp = add("push-model", cmd_push_model, "upload a model folder to the Hugging Face Hub (extra: hub)")
    sp.add_argument("--model", required=True, help="a model folder (dchag export); it is loaded before the upload")
    sp.add_argument("--repo", required=True, help="the model repository, OWNER/NAME (created if absent)")
    sp.add_argument("--revision", help="a branch (default: main)")
    sp.add_argument("--private", action="store_true", help="create the repository private")
    sp = add("pull-model", cmd_pull_model, "download a model folder from the Hugging Face Hub and check it loads")
    sp.add_argument("--repo", required=True, help="the model repository, OWNER/NAME")
    sp.add_argument("--revision", help="a branch, tag or commit (default: main)")
    sp.add_argument("--output", required=True, help="the model folder to write")
