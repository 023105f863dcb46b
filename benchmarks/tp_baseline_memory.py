"""The TP baseline's per-rank peak memory against T, for this checkout and another (e.g. the
commit before a change), measured side by side in one run with the same harness
(dchag.paper.bench, MemTracker on the CPU): the workload of the side-by-side comparison with
the authors' code (width 64, depth 2, 32 x 64, patch 4, batch 2, fp32, no checkpointing).

    python benchmarks/tp_baseline_memory.py --other /path/to/other/checkout/src \
--output benchmarks/results/tp_baseline_memory

The other checkout needs dchag/paper (copy src/dchag/paper and src/dchag/train/launch.py in).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from dchag.bench import results
from dchag.bench.procs import torchrun

HERE = Path(__file__).resolve().parents[1] / "src"


def measure(src: Path, channels: int, tp: int, out: Path) -> float:
    point = dict(
        width=64,
        depth=2,
        heads=4,
        channels=channels,
        image=[32, 64],
        patch=4,
        batch=2,
        precision="fp32",
        tp=tp,
        dp=1,
        variant="baseline",
        tree=0,
        activation_checkpointing=False,
        stands_for=None,
    )
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    args = ["-m", "dchag.paper.bench", "--point", json.dumps(point), "--steps", "1", "--warmup", "1"]
    subprocess.run(torchrun(tp, *args, "--output", str(out)), check=True, env=env, capture_output=True)
    return json.loads(out.read_text())["memory_mib_max"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="src/ of the checkout to compare with")
    ap.add_argument("--label", default="before", help="name of the other checkout in the table")
    ap.add_argument("--output", default="benchmarks/results/tp_baseline_memory")
    ap.add_argument("--channels", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args(argv)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for channels in args.channels:
        for tp in args.tp:
            mem = {
                label: measure(Path(src), channels, tp, out.with_name(f".{out.name}_{label}.json"))
                for label, src in ((args.label, args.other), ("this checkout", HERE))
            }
            rows.append({"channels": channels, "tp": tp, **mem})
            print(rows[-1], flush=True)
    lines = [
        "# The TP baseline's per-rank peak memory against T",
        "",
        f"Command: `{results.command(None if argv is None else ['benchmarks/tp_baseline_memory.py', *argv])}`  ",
        "Workload: width 64, depth 2, 4 heads, 32 x 64, patch 4, batch 2, fp32, no activation checkpointing; one "
        "training step (AdamW) under MemTracker, the most loaded rank, MiB; both checkouts measured in the same run.",
        "",
        f"| C | T | {args.label} MiB | this checkout MiB | ratio | {args.label}: vs T/2 | this: vs T/2 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        prev = next((p for p in rows if p["channels"] == r["channels"] and p["tp"] * 2 == r["tp"]), None)
        fall = lambda k: f"{r[k] / prev[k] - 1:+.0%}" if prev else ""  # noqa: E731
        lines.append(
            f"| {r['channels']} | {r['tp']} | {r[args.label]:.1f} | {r['this checkout']:.1f} | "
            f"{r['this checkout'] / r[args.label]:.2f} | {fall(args.label)} | {fall('this checkout')} |"
        )
    results.write(out, rows, "\n".join(lines) + "\n")
    for f in out.parent.glob(f".{out.name}_*.json"):
        f.unlink()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
