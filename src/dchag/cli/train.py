"""Training: one run under torchrun (``train``), its launcher (``launch-train``), the summary
of several runs, and the model's parameter counts."""

from __future__ import annotations

from ..vocabulary import Task
from .common import config, config_arg, config_args, nonneg_int, positive_int


def _stores(args, run) -> dict[str, str]:
    """The run's train/val stores: as given, else where the pipeline puts them (results/<name>);
    where one store holds both splits (hyperspectral: its groups), val defaults to the given
    training store."""
    default = run.stores()
    train = args.train_data or str(default["train"])
    same = run.spec.stores["val"] == run.spec.stores["train"]
    return {"train": train, "val": args.val_data or (train if same else str(default["val"]))}


def cmd_train(args) -> None:
    from ..runs import resolve
    from ..train.trainer import main as train_main

    cfg = config(args)
    train_main(cfg, args.run, args.output, _stores(args, resolve(cfg, args.run)), args.init_from)


def cmd_launch_train(args) -> None:
    import os

    from ..runs import resolve
    from ..train.launch import TRAINER_MODULES, launch, node_count
    from ..train.preflight import check_launch

    cfg = config(args)
    run = resolve(cfg, args.run)  # an unknown run fails here, not in every rank
    train, stores = run.settings.train, _stores(args, run)
    nproc, nodes = args.nproc or train.nproc, node_count(os.environ)
    # the config, the stores, a run directory in use: before torchrun starts; the lock on the
    # first node alone (the launchers of the other nodes would meet its check)
    first = nodes == 1 or os.environ.get("SLURM_NODEID", "0") == "0"
    task = check_launch(cfg, args.run, args.output, stores, args.init_from, nproc * nodes, lock=first)
    launch(
        nproc,
        train.max_restarts if args.max_restarts is None else args.max_restarts,
        [
            *config_args(args),
            "--run-name",
            args.run,
            "--output",
            args.output,
            "--train-data",
            stores["train"],
            "--val-data",
            stores["val"],
            *(["--init-from", args.init_from] if args.init_from else []),
        ],
        args.threads_per_rank,
        preload=(*TRAINER_MODULES, *task.rank_modules),
    )


def cmd_train_summary(args) -> None:
    from ..train.summary import summarize

    for r in summarize(args.logs, args.output):
        print(
            f"{r['run']:22s} loss {r['loss_first']:.4f} -> {r['loss_last']:.4f} ({r['loss_fall_pct']:.0f}% lower); "
            f"val {r['val_loss_last']:.4f} ({r['val_loss_vs_baseline_pct']:+.1f}% vs baseline)"
        )


def cmd_describe_model(args) -> None:
    from dataclasses import replace

    from .. import jsonio
    from ..config import ConfigError, settings
    from ..era5.source import forecast_model_config
    from ..model.describe import describe, format_table
    from ..runs import task_spec

    cfg = settings(config(args))
    mcfg = forecast_model_config(cfg, in_channels=args.channels)  # the config's ERA5 grid and channels
    spec = task_spec(args.task)
    if spec.classifies and not args.num_classes:
        raise ConfigError(f"describe-model --task {args.task} needs --num-classes")
    if spec.task != mcfg.task:  # a hyperspectral model of the same shape
        mcfg = replace(mcfg, task=args.task, out_channels=[], num_classes=args.num_classes)
    groups = args.groups or cfg.parallel.tp
    rows = describe(mcfg, groups)
    print(jsonio.dumps(rows, indent=1) if args.json else format_table(rows, mcfg, groups))


def _train_data_args(sp) -> None:
    sp.add_argument(
        "--init-from",
        help="a model folder to start from (the run's init_from; a source run's <run>/model)",
    )
    sp.add_argument(
        "--train-data",
        help="training store (default: the task's store under results/<name>: "
        "era5/train.zarr, hsi/mae.zarr or hsi/classification.zarr)",
    )
    sp.add_argument(
        "--val-data",
        help="validation store (default: era5/val.zarr under results/<name>; for "
        "hyperspectral tasks the training store, whose val group is read)",
    )


def register(add) -> None:
    sp = add(
        "train", cmd_train, "train one run (the torchrun entry point: torchrun --nproc-per-node N -m dchag train ...)"
    )
    config_arg(sp)
    sp.add_argument("--run-name", dest="run", required=True, help="a run name from the config's train.runs")
    sp.add_argument(
        "--output", required=True, help="run directory: checkpoints/, final/, log.csv, tensorboard/, run.json"
    )
    _train_data_args(sp)

    sp = add(
        "launch-train",
        cmd_launch_train,
        "start `dchag train` under torchrun: standalone, or per node with c10d rendezvous from a Slurm allocation",
    )
    config_arg(sp)
    sp.add_argument("--run-name", dest="run", required=True)
    sp.add_argument("--output", required=True)
    _train_data_args(sp)
    sp.add_argument("--nproc", type=positive_int, help="processes per node (default: train.nproc)")
    sp.add_argument("--max-restarts", type=nonneg_int, help="default: train.max_restarts")
    sp.add_argument(
        "--threads-per-rank",
        type=positive_int,
        help="OpenMP/MKL/BLAS threads of each rank (default: the environment's, as torchrun passes them)",
    )

    sp = add("train-summary", cmd_train_summary, "table of losses per run and D-CHAG vs baseline, from training logs")
    sp.add_argument("logs", nargs="+", help="log.csv files of training runs")
    sp.add_argument("--output", required=True)

    sp = add(
        "describe-model", cmd_describe_model, "parameter counts per part, for the baseline and each D-CHAG variant"
    )
    config_arg(sp)
    sp.add_argument("--task", choices=[t.value for t in Task], default=Task.FORECAST.value)
    sp.add_argument("--channels", type=positive_int, help="count for this many input channels instead of the config's")
    sp.add_argument("--groups", type=positive_int, help="channel groups / TP ranks (default: parallel.tp)")
    sp.add_argument(
        "--num-classes", type=nonneg_int, default=0, help="the classifier's classes (--task classification)"
    )
    sp.add_argument("--json", action="store_true")
