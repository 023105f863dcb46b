"""The paper's experiments: one sweep point measured under torchrun, and its figures."""

from __future__ import annotations

from ..paper.sweep import FIGURES
from .common import config, config_arg, pairs, positive_int


def cmd_paper_point(args) -> None:
    from ..paper.sweep import launch_point

    launch_point(config(args), args.point, args.output, args.threads_per_rank, args.config)


def cmd_paper_figure(args) -> None:
    from ..figures import paper as figures
    from ..figures.accuracy import accuracy

    if args.kind == "accuracy":
        accuracy(pairs(args.mae, "--mae"), pairs(args.forecast, "--forecast"), args.inputs, args.output)
    else:
        figures.DRAW[args.kind](args.inputs, args.output)


def register(add) -> None:
    sp = add(
        "paper-point",
        cmd_paper_point,
        "measure one paper sweep point under torchrun (tp x dp processes): peak memory per rank, its front-end "
        "split, step time, samples/s and TFLOPS per GPU",
    )
    config_arg(sp)
    sp.add_argument("--point", required=True, help="a point name of the config's paper sweeps")
    sp.add_argument("--output", required=True, help="result JSON")
    sp.add_argument(
        "--threads-per-rank", type=positive_int, help="CPU threads of each rank (default: paper.threads_per_rank)"
    )

    sp = add(
        "paper-figure",
        cmd_paper_figure,
        "draw one of the paper's figures from this pipeline's sweep points and training runs, beside the "
        "published values",
    )
    sp.add_argument("kind", choices=[*FIGURES, "accuracy"])
    sp.add_argument("inputs", nargs="*", help="point result JSONs (accuracy: comparison CSVs)")
    sp.add_argument("--mae", nargs="*", help="accuracy: VARIANT=log.csv of the hyperspectral MAE runs")
    sp.add_argument("--forecast", nargs="*", help="accuracy: VARIANT=log.csv of the ERA5 forecast runs")
    sp.add_argument("--output", required=True, help=".png (a .pdf and a .csv with the caption's numbers beside it)")
