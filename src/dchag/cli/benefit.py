"""Does D-CHAG pay off on a cluster: measure it (``calibrate``), predict every strategy
(``advise``), and the verification experiment's verdict (``verify-report``)."""

from __future__ import annotations

import dataclasses
import math

from .common import config, config_arg, config_source, nonneg_float, nonneg_int, pairs, positive_float, positive_int

VERIFY_COLUMNS = [
    "run",
    "repeats",
    "step_s",
    "step_s_min",
    "step_s_max",
    "comm_s",
    "peak_mem_mib_max_rank",
    "final_val_loss",
    "step_time_change",
    "verdict",
]


def cmd_calibrate(args) -> None:
    from ..benefit.calibrate import calibrate

    hw = calibrate(
        config(args) if args.config else None,
        args.output,
        repeats=args.repeats,
        channels=args.channels,
        batch=args.batch,
    )
    if hw is None:  # not rank 0
        return
    line = f"alpha {hw.alpha * 1e6:.1f} us, intra {hw.intra_bw / 1e9:.3f} GB/s, inter {hw.inter_bw / 1e9:.3f} GB/s"
    if "compute" in hw.measured:
        line += (
            ", compute {flops_per_s:.3g} FLOP/s, memory {mem_bw:.3g} B/s, {op_s:.2g} s/op; model step "
            "{model_step_s:.4f} s measured, {microbenchmark_step_s:.4f} s from the microbenchmarks "
            "(efficiency {efficiency:.2f})"
        ).format(**hw.measured["compute"])
    print(f"{line} -> {args.output}")


def _numbers(value):
    """Every float in a nested result (dicts, lists, dataclasses)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, float):
        yield value


def cmd_advise(args) -> None:
    from ..benefit import advise
    from ..config import ConfigError

    hw = advise.hardware(args.hardware, args.alpha, args.intra_bw, args.inter_bw, args.gpus_per_node)
    if args.gradient_bytes is not None:
        if args.compute_s is None:
            raise ConfigError("--gradient-bytes (the seed article's model) needs --compute-s")
        result = advise.article(
            args.gradient_bytes, args.compute_s, hw, args.gpus, args.gpus_per_node, args.delta_alpha
        )
    elif args.model:
        result = advise.advise_config(
            args.model,
            hw,
            args.gpus,
            args.gpus_per_node,
            args.channels,
            args.batch,
            tuple(args.image) if args.image else None,
            args.flops_per_s,
            args.gpu_memory_gb * 1e9 if args.gpu_memory_gb else None,
        )
    else:
        raise ConfigError("give --model FILE (a config with a model section), or --gradient-bytes and --compute-s")
    # the results, not the inputs: a rate not given (no profile's bandwidth) is infinite on purpose
    if not all(math.isfinite(v) for v in _numbers({k: v for k, v in result.items() if k != "inputs"})):
        raise ConfigError(
            "the hardware and model numbers given (--alpha, --intra-bw, --inter-bw, --flops-per-s, --compute-s, "
            "--gradient-bytes or the hardware profile) give times that are not finite: check their units"
        )
    print(advise.format_table(result))
    if args.output:
        advise.write(result, args.output)


def cmd_estimate_memory(args) -> None:
    import json

    from ..benefit import fakemem
    from ..checks import check_run
    from ..config import ConfigError, settings

    s = settings(config(args))
    if args.run not in s.train.runs:
        runs = ", ".join(s.train.runs) or "none"
        raise ConfigError(f"{config_source(args)}: no run {args.run!r} in train.runs ({runs})")
    run = check_run(s, args.run, world_size=args.world_size)
    model = fakemem.model_of(run, args.channels, tuple(args.img) if args.img else None)
    result = fakemem.estimate(run, model, args.batch, args.world_size, args.rank)
    print(json.dumps(result, indent=1) if args.json else fakemem.format_table(result))


def cmd_verify_report(args) -> None:
    from pathlib import Path

    from ..benefit import verify
    from ..figures.verify import verification

    runs = {name: Path(path) for name, path in pairs(args.runs, "verify-report").items()}
    df = verify.summarize(runs, tolerance=args.tolerance)
    verify.write(df, args.output)
    verification(runs, df, args.figure)
    print(df[VERIFY_COLUMNS].to_string(index=False))


def register(add) -> None:
    sp = add(
        "calibrate",
        cmd_calibrate,
        "measure all-reduce/all-gather (alpha, bandwidth; intra/inter node) and a model's compute: a hardware profile "
        "(run under torchrun)",
    )
    config_arg(sp, required=False, help_="config whose model's step time is measured (optional)")
    sp.add_argument("--channels", type=positive_int)
    sp.add_argument("--batch", type=positive_int)
    sp.add_argument("--repeats", type=positive_int, default=5)
    sp.add_argument("--output", default="hw.yaml")

    sp = add("advise", cmd_advise, "predict step time, communication and memory per strategy; recommend one")
    sp.add_argument("--hardware", help="profile from `dchag calibrate`")
    sp.add_argument("--alpha", type=nonneg_float, help="seconds per message step")
    sp.add_argument("--intra-bw", type=positive_float, help="bytes/s within a node")
    sp.add_argument("--inter-bw", type=positive_float, help="bytes/s between nodes")
    sp.add_argument("--model", help="config YAML with the model (and era5 channels/grid)")
    sp.add_argument("--channels", type=positive_int)
    sp.add_argument("--image", type=positive_int, nargs=2, metavar=("H", "W"))
    sp.add_argument("--batch", type=positive_int, help="micro-batch per GPU (default: train.batch_size)")
    sp.add_argument("--gpus", type=positive_int, required=True)
    sp.add_argument("--gpus-per-node", type=positive_int, required=True)
    sp.add_argument(
        "--flops-per-s",
        type=positive_float,
        help="sustained matmul FLOP/s per GPU (default: the profile's measured rate; "
        "without a profile's other rates the model counts FLOPs only)",
    )
    sp.add_argument(
        "--gpu-memory-gb", type=positive_float, help="memory per GPU: strategies that do not fit are not recommended"
    )
    sp.add_argument(
        "--gradient-bytes",
        type=positive_float,
        help="the seed article's model: gradient bytes per step (with --compute-s)",
    )
    sp.add_argument("--compute-s", type=positive_float, help="the seed article's model: compute time per step")
    sp.add_argument("--delta-alpha", type=nonneg_float, default=2e-3, help="the article's added fixed overhead (s)")
    sp.add_argument("--output", help=".json (everything) or .md (the table)")

    sp = add(
        "estimate-memory",
        cmd_estimate_memory,
        "a run's per-rank memory at any scale: its model built and parallelized as training does, on fake tensors "
        "and a fake process group, through forward, backward and two optimizer steps",
    )
    config_arg(sp)
    sp.add_argument("--run", required=True, help="the run of train.runs")
    sp.add_argument("--channels", type=positive_int, help="synthetic input channels (default: the run's data)")
    sp.add_argument("--img", type=positive_int, nargs=2, metavar=("H", "W"), help="synthetic image size")
    sp.add_argument("--batch", type=positive_int, help="micro-batch per rank (default: train.batch_size)")
    sp.add_argument("--world-size", type=positive_int, help="processes (default: train.nproc x train.nodes)")
    sp.add_argument("--rank", type=nonneg_int, default=0, help="the rank measured (default 0)")
    sp.add_argument("--json", action="store_true", help="print the result as JSON (bytes)")

    sp = add(
        "verify-report",
        cmd_verify_report,
        "the verification experiment's verdict table and figure, from its training logs",
    )
    sp.add_argument("runs", nargs="+", help="NAME=RUN_DIR (with log.csv and ranks.csv); verify-dp is the reference")
    sp.add_argument(
        "--tolerance",
        type=nonneg_float,
        default=0.05,
        help="relative validation-loss rise still counted as no accuracy loss",
    )
    sp.add_argument("--output", required=True, help="verdict CSV")
    sp.add_argument("--figure", required=True, help=".png (a .pdf is written beside it)")
