"""The fused front end against the token path, side by side in one run: per-rank peak memory
and step time of a whole training step (forward, backward, AdamW) on the CPU, for the
baseline aggregation and D-CHAG-L / -C over channels C and widths D, at T = 1 (one rank: the
hierarchical model with one channel group) and under D-CHAG at T = 2, 4 (gloo ranks).

    python benchmarks/fused_front_end.py --channels 80 512 1024 --widths 256 --output benchmarks/results/fused_front_end
    python benchmarks/fused_front_end.py --tp 2 4 --channels 80 512 1024 --widths 256 512 \
        --output benchmarks/results/fused_front_end_tp

At T > 1 the ranks run under torchrun (``--tp``), each point measured by the paper target's own
``dchag.paper.bench.measure`` (the model parallelized by ``parallelize_model``, the training
loop's step): the token path, then the fused path on the same process group. The baseline
under TP splits its aggregation's heads over the ranks and forms the tokens either way, so at
T > 1 only D-CHAG-L / -C have a fused path.

Memory is MemTracker's peak of one step (dchag.train.memory.step_peak: parameters, gradients,
optimizer state, activations and temporaries); time is the median of the timed steps after a
warm-up step. Each (C, D, aggregation) builds the token and the fused path on the same weights
and batch and times their steps in turn (token, fused, token, fused, ...), so a change of the
machine's load (it is shared) hits both alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from pathlib import Path

import torch

from dchag.bench import results
from dchag.bench.procs import torchrun
from dchag.bench.timing import interleaved_medians

AGGREGATIONS = [("baseline", "baseline"), ("D-CHAG-L", "linear"), ("D-CHAG-C", "cross")]


def _stepper(model, x, lead, target):
    """(the modules MemTracker follows, one training step) of ``model``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        ((model(x, lead) - target) ** 2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return [model, opt], step


def _point(args, channels: int, width: int, variant: str, tp: int, fused: bool):
    from dchag.paper.sweep import Point

    return Point(
        width, args.depth, args.heads, channels, tuple(args.img), args.patch, args.batch, "fp32", tp, 1, variant, 0,
        False, fused_front_end=fused,
    )  # fmt: skip


def worker(args) -> None:
    """One rank of a T > 1 run (under torchrun): every (C, D, D-CHAG variant), token then fused."""
    import torch.distributed as dist

    from dchag.paper.bench import measure as measure_point
    from dchag.parallel import init_distributed

    init_distributed()
    torch.set_num_threads(max(1, args.threads // dist.get_world_size()))
    tp, rows = dist.get_world_size(), []
    for channels in args.channels:
        for width in args.widths:
            for label, variant in (("D-CHAG-L", "dchag-l"), ("D-CHAG-C", "dchag-c")):
                row = {"channels": channels, "width": width, "variant": label, "tp": tp}
                for name, fused in (("token", False), ("fused", True)):
                    r = measure_point(_point(args, channels, width, variant, tp, fused), args.steps, args.warmup)
                    worst = max(r["ranks"], key=lambda k: k["memory_mib"])
                    row[name] = {
                        "total": round(r["memory_mib_max"], 1),
                        **{k: round(worst[k], 1) for k in ("parameters", "gradients", "optimizer", "activations")},
                        "step_seconds": round(r["step_s"], 3),
                        "ranks_mib": [round(k["memory_mib"], 1) for k in r["ranks"]],
                    }
                rows.append(row)
                if dist.get_rank() == 0:
                    t, f = row["token"], row["fused"]
                    print(
                        f"T={tp} C={channels:5d} D={width:4d} {label:9s} token {t['total']:8.1f} MiB "
                        f"{t['step_seconds']:7.3f} s | fused {f['total']:8.1f} MiB {f['step_seconds']:7.3f} s",
                        flush=True,
                    )
    if dist.get_rank() == 0:
        Path(args.worker).write_text(json.dumps(rows))
    dist.destroy_process_group()


def ranks_rows(argv: list[str], tp: int) -> list[dict]:
    """The rows of a T = ``tp`` run: this script under torchrun with ``tp`` gloo ranks."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run(torchrun(tp, __file__, *argv, "--worker", str(out)), check=True)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channels", type=int, nargs="+", default=[80, 512])
    ap.add_argument("--widths", type=int, nargs="+", default=[256])
    ap.add_argument("--img", type=int, nargs=2, default=[32, 64])
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tp", type=int, nargs="+", default=[1], help="channel-parallel ranks T (T > 1: gloo ranks)")
    ap.add_argument("--output", default="benchmarks/results/fused_front_end")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # a rank of a T > 1 run: its rows' JSON path
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    torch.set_num_threads(args.threads)

    from dchag.model import ChannelViT
    from dchag.model.build import model_config_of

    rows = []
    for tp in (t for t in args.tp if t > 1):
        rows += ranks_rows(sys.argv[1:] if argv is None else argv, tp)
    for channels in args.channels if 1 in args.tp else []:
        for width in args.widths:
            for label, aggregation in AGGREGATIONS:
                cfg = model_config_of(
                    "forecast",
                    channels,
                    tuple(args.img),
                    out_channels=[0, 1, 2],
                    patch_size=args.patch,
                    embed_dim=width,
                    depth=args.depth,
                    num_heads=args.heads,
                    aggregation=aggregation,
                    groups=1,
                    fused_front_end=False,
                )
                g = torch.Generator().manual_seed(1)
                x = torch.randn(args.batch, channels, *args.img, generator=g)
                lead = torch.full((args.batch,), 24.0)
                target = torch.randn(args.batch, 3, *args.img, generator=g)
                torch.manual_seed(0)
                tokens = ChannelViT(cfg)
                fused = ChannelViT(dataclasses.replace(cfg, fused_front_end=True))
                fused.load_state_dict(tokens.state_dict())
                paths = {
                    "token": _stepper(tokens, x, lead, target),
                    "fused": _stepper(fused, x, lead, target),
                }
                row = {"channels": channels, "width": width, "variant": label, "tp": 1}
                row.update(interleaved_medians(paths, args.warmup, args.steps))
                del paths, tokens, fused
                rows.append(row)
                t, f = row["token"], row["fused"]
                print(
                    f"C={channels:5d} D={width:4d} {label:9s} token {t['total']:8.1f} MiB {t['step_seconds']:7.3f} s"
                    f" | fused {f['total']:8.1f} MiB {f['step_seconds']:7.3f} s",
                    flush=True,
                )
    meta = {
        "command": results.command(None if argv is None else ["benchmarks/fused_front_end.py", *argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} torch threads, CPU",
        "torch": torch.__version__,
        "model": {k: getattr(args, k) for k in ("img", "patch", "depth", "heads", "batch", "warmup", "steps")},
    }
    doc = {"meta": meta, "rows": rows}
    results.write(Path(args.output), doc, table(rows, meta))
    print(table(rows, meta))


def table(rows: list[dict], meta: dict) -> str:
    lines = [
        "# The fused front end against the token path (per-rank peak memory and step time)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}, torch {meta['torch']}; model {meta['model']}  ",
        "A whole training step (forward, backward, AdamW); memory: MemTracker's peak of one step, MiB "
        "(parameters / gradients / optimizer / activations and temporaries); ratios are fused / token. "
        "T = 1: one rank (the hierarchical models have one channel group); time: median (and fastest) of "
        "the timed steps, the two paths' steps taken in turn on the same weights and batch. "
        "T > 1: gloo ranks under torchrun, the model parallelized as training does (dchag.paper.bench.measure): "
        "memory is the largest rank's, time the slowest rank's mean step, the token path measured before the fused "
        "one in the same process group; the T ranks share the machine's cores, so T > 1 times are "
        "for the ratio only. The machine may be shared: every step's time is in the .json.",
        "",
        "| T | C | D | variant | token MiB (p / g / opt / act) | fused MiB (p / g / opt / act) | memory ratio | "
        "token s | fused s | time ratio | fastest token s | fastest fused s | fastest ratio |",
        "|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def mib(m):
        split = " / ".join(f"{m.get(k, 0):.0f}" for k in ("parameters", "gradients", "optimizer", "activations"))
        return f"{m['total']:.1f} ({split})"

    for r in sorted(rows, key=lambda r: r["tp"]):
        t, f = r["token"], r["fused"]
        fastest = "- | - | - |"
        if "step_seconds_all" in t:
            tmin, fmin = min(t["step_seconds_all"]), min(f["step_seconds_all"])
            fastest = f"{tmin:.3f} | {fmin:.3f} | {fmin / tmin:.3f} |"
        lines.append(
            f"| {r['tp']} | {r['channels']} | {r['width']} | {r['variant']} | {mib(t)} | {mib(f)} | "
            f"{f['total'] / t['total']:.3f} | {t['step_seconds']:.3f} | {f['step_seconds']:.3f} | "
            f"{f['step_seconds'] / t['step_seconds']:.3f} | {fastest}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
