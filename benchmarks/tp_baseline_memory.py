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
import sys
from pathlib import Path

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
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={tp}",
            "-m",
            "dchag.paper.bench",
            "--point",
            json.dumps(point),
            "--steps",
            "1",
            "--warmup",
            "1",
            "--output",
            str(out),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    return json.loads(out.read_text())["memory_mib_max"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="src/ of the checkout to compare with")
    ap.add_argument("--label", default="before", help="name of the other checkout in the table")
    ap.add_argument("--output", default="benchmarks/results/tp_baseline_memory")
    args = ap.parse_args()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for channels in (256, 1024):
        for tp in (1, 2, 4):
            mem = {
                label: measure(Path(src), channels, tp, out.with_name(f".{out.name}_{label}.json"))
                for label, src in ((args.label, args.other), ("this checkout", HERE))
            }
            rows.append({"channels": channels, "tp": tp, **mem})
            print(rows[-1], flush=True)
    lines = [
        "# The TP baseline's per-rank peak memory against T",
        "",
        f"Command: `python benchmarks/tp_baseline_memory.py --other {args.other} --label '{args.label}'`  ",
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
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    for f in out.parent.glob(f".{out.name}_*.json"):
        f.unlink()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
