"""Figures from result files (PNG, and PDF beside it)."""

from __future__ import annotations

from .common import nonneg_int

KINDS = [
    "loss-curves",
    "lead-time",
    "scorecard",
    "forecast-maps",
    "hsi-reconstruction",
    "classification",
    "foundation",
]


def cmd_figure(args) -> None:
    from ..figures import pipeline as figures
    from ..store import InputError

    if args.kind == "forecast-maps":
        if not args.truth:
            raise InputError("figure forecast-maps needs --truth (the verifying fields' store)")
        variable = args.variables[0] if args.variables else None
        figures.forecast_maps(args.inputs, args.truth, args.output, variable, args.lead_index)
    elif args.kind == "lead-time":
        figures.lead_time_scores(args.inputs, args.output, args.variables)
    elif args.kind == "scorecard":
        from ..figures.scorecard import scorecard

        scorecard(args.inputs, args.output)
    else:
        draw = {
            "loss-curves": figures.loss_curves,
            "hsi-reconstruction": figures.hsi_reconstruction,
            "classification": figures.classification,
            "foundation": figures.foundation,
        }[args.kind]
        draw(args.inputs, args.output)


def register(add) -> None:
    sp = add("figure", cmd_figure, "draw one of the pipeline's figures from result files (PNG, and PDF beside it)")
    sp.add_argument("kind", choices=KINDS)
    sp.add_argument(
        "inputs",
        nargs="+",
        help="log.csv files | score CSVs | comparison CSVs (dchag compare-scores) | forecast stores | "
        "reconstruction .npz | classification map .npz | VARIANT:START=classification scores .json (foundation)",
    )
    sp.add_argument("--truth", help="forecast-maps: the truth store")
    sp.add_argument("--variables", nargs="+", help="lead-time: variables to show; forecast-maps: the variable")
    sp.add_argument("--lead-index", type=nonneg_int, default=0, help="forecast-maps: which lead")
    sp.add_argument("--output", required=True, help=".png")
