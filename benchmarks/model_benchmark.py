"""Per-rank memory and step time: baseline TP vs D-CHAG-L/-C (Tree0, Tree2) over channels C and
tensor-parallel size T, for the front end (tokenization + aggregation) and the whole model.

Driver (launches one torchrun job per T and writes the table):

    python benchmarks/model_benchmark.py --tp 1 2 4 --channels 64 256 512 1024 --output benchmarks/results/model

One job (what the driver runs; the same on a GPU machine, where NCCL and
torch.cuda.max_memory_allocated are used instead of gloo and MemTracker: dchag.train.memory):

    torchrun --standalone --nproc-per-node 4 benchmarks/model_benchmark.py --worker --channels 1024

Memory on the CPU is MemTracker's peak for one training step, split into parameters,
gradients, optimizer state and activations (+ temporaries); time is the mean of the timed
steps, the slowest rank's. Ratios are only compared within one run (shared, noisy machines).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dchag.bench import results
from dchag.bench.procs import json_lines, torchrun

VARIANTS = [
    ("baseline", "baseline", 0),
    ("D-CHAG-L Tree0", "linear", 0),
    ("D-CHAG-L Tree2", "linear", 2),
    ("D-CHAG-C Tree0", "cross", 0),
    ("D-CHAG-C Tree2", "cross", 2),
]


def run_worker(args) -> None:
    from dchag.bench.timing import max_over_ranks, slowest_rank_seconds
    from dchag.config import parallel_settings
    from dchag.model import ChannelViT
    from dchag.model.build import model_config_of
    from dchag.parallel import ParallelDims, init_distributed
    from dchag.parallel.parallelize import parallelize_model
    from dchag.train.memory import step_peak

    backend, device = init_distributed()
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world) if device.type == "cpu" else torch.get_num_threads())
    dims = ParallelDims(tp=world, dp_mode="none", world_size=world)
    mesh = dims.build_mesh(device.type)
    rows = []
    for channels in args.channels:
        for label, aggregation, tree in VARIANTS:
            if tree and (channels // world) % tree:
                continue
            cfg = model_config_of(
                in_channels=channels,
                img_size=tuple(args.img),
                patch_size=args.patch,
                embed_dim=args.width,
                depth=args.depth,
                num_heads=args.heads,
                aggregation=aggregation,
                tree=tree,
                groups=world if aggregation != "baseline" else 1,
                task="forecast",
                out_channels=[0, 1, 2],
                fused_front_end=False,  # the channel tokens formed, as the paper's models (and MemTracker follows)
            )
            torch.manual_seed(0)
            model = ChannelViT(cfg).to(device)
            strategy = "baseline" if aggregation == "baseline" else "dchag"
            model = parallelize_model(model, dims, mesh, parallel_settings(strategy=strategy))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            ids = model.tokenizer.channel_ids
            g = torch.Generator().manual_seed(1)
            x = torch.randn(args.batch, channels, *args.img, generator=g)[:, ids.cpu()].to(device)
            lead = torch.full((args.batch,), 24.0, device=device)
            target = torch.randn(args.batch, 3, *args.img, generator=g).to(device)

            def whole_step():
                loss = ((model(x, lead) - target) ** 2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            def front_step():
                model.aggregate(x).square().mean().backward()
                opt.zero_grad(set_to_none=True)

            result = {"variant": label, "channels": channels, "tp": world, "backend": backend}
            for part, step in (("front", front_step), ("model", whole_step)):
                for _ in range(args.warmup):
                    step()
                with step_peak(device, *([model, opt] if part == "model" else [model])) as mem:
                    step()
                result[part] = {
                    **{k: round(v, 2) for k, v in mem.items() if k != "bytes"},
                    "max_rank_total": round(max_over_ranks(mem["total"], device), 2),
                    "step_seconds": round(slowest_rank_seconds(step, args.steps, device), 4),
                }
            if rank == 0:
                print(json.dumps(result), flush=True)
                rows.append(result)
    dist.destroy_process_group()


def run_driver(args, argv: list[str] | None) -> None:
    rows = []
    sizes = ("img", "patch", "width", "depth", "heads", "batch", "steps", "warmup")
    for tp in args.tp:
        flags = [f for k in sizes for f in (f"--{k}", *map(str, np.atleast_1d(getattr(args, k))))]
        proc = subprocess.run(
            torchrun(tp, __file__, "--worker", "--channels", *map(str, args.channels), *flags),
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            sys.exit(f"torchrun with tp={tp} failed:\n{proc.stderr[-4000:]}")
        for r in json_lines(proc.stdout):
            rows.append(r)
            print(
                f"T={r['tp']} C={r['channels']:5d} {r['variant']:15s} front {r['front']['total']:9.1f} MiB "
                f"{r['front']['step_seconds']:.3f} s | model {r['model']['total']:9.1f} MiB "
                f"{r['model']['step_seconds']:.3f} s",
                flush=True,
            )
    meta = {
        "command": results.command(None if argv is None else ["benchmarks/model_benchmark.py", *argv]),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, {'CUDA' if torch.cuda.is_available() else 'CPU (gloo)'}"
        ),
        "torch": torch.__version__,
        "model": {k: getattr(args, k) for k in ("img", "patch", "width", "depth", "heads", "batch")},
    }
    doc = {"meta": meta, "rows": rows}
    results.write(Path(args.output), doc, table(rows, meta))
    print(table(rows, meta))


def table(rows: list[dict], meta: dict) -> str:
    base = {(r["channels"], r["tp"]): r for r in rows if r["variant"] == "baseline"}
    lines = [
        "# Model benchmark: per-rank peak memory and step time, baseline TP vs D-CHAG",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}, torch {meta['torch']}; model {meta['model']}  ",
        "front = tokenization + aggregation (forward + backward); model = a whole training step (AdamW).",
        "Memory: peak of one step on the most loaded rank, MiB (activations include temporaries). "
        "Ratios are against the baseline of the same C and T, measured in the same run.",
        "",
        "| C | T | variant | front MiB | front vs base | front s | model MiB (params / grads / opt / act) | "
        "model vs base | step s | step vs base |",
        "|---:|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        b = base[(r["channels"], r["tp"])]
        f, m = r["front"], r["model"]
        split = " / ".join(f"{m.get(k, 0):.1f}" for k in ("parameters", "gradients", "optimizer", "activations"))
        lines.append(
            f"| {r['channels']} | {r['tp']} | {r['variant']} | {f['max_rank_total']:.1f} | "
            f"{f['max_rank_total'] / b['front']['max_rank_total']:.2f} | "
            f"{f['step_seconds']:.3f} | {m['max_rank_total']:.1f} ({split}) | "
            f"{m['max_rank_total'] / b['model']['max_rank_total']:.2f} | "
            f"{m['step_seconds']:.3f} | {m['step_seconds'] / b['model']['step_seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help="run as one torchrun job")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--channels", type=int, nargs="+", default=[64, 256, 512, 1024])
    p.add_argument("--img", type=int, nargs=2, default=[32, 64])
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--output", default="benchmarks/results/model")
    args = p.parse_args(argv)
    if args.worker:
        run_worker(args)
    else:
        run_driver(args, argv)


if __name__ == "__main__":
    main()
