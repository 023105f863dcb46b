"""The benefit model's predictions against measurement on this machine.

One run: for each TP size T, `dchag calibrate` under torchrun with T processes (α, bandwidth,
the processor's rates with T processes sharing the machine, as in the measured jobs, and the
efficiency, set on the one-device model with 128 channels: none of the checked configurations), then
benchmarks/model_benchmark.py's measurements of the baseline TP and D-CHAG-L/-C (Tree0/Tree2)
over channels and TP sizes, then the cost model's prediction of each configuration's step time
and per-rank peak memory beside the measurement, with the relative error and its median.

    python benchmarks/benefit_model_check.py --tp 1 2 4 --channels 64 256 1024 \
--output benchmarks/results/benefit_model_check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dchag.bench import results  # noqa: E402
from dchag.bench.procs import torchrun  # noqa: E402
from dchag.benefit.costmodel import predict  # noqa: E402
from dchag.benefit.hardware import Compute, Hardware  # noqa: E402
from dchag.benefit.workload import Workload  # noqa: E402
from dchag.vocabulary import MODEL_VARIANTS, VARIANTS  # noqa: E402

MIB = 2**20
# the cost model's strategy of each measured variant, by its label
STRATEGY = {VARIANTS[n].label: VARIANTS[n].cost_model for n in MODEL_VARIANTS}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--channels", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    ap.add_argument("--output", default="benchmarks/results/benefit_model_check")
    ap.add_argument(
        "--from-measured",
        action="store_true",
        help="measure nothing: predict against an earlier run's files beside --output (_hw_tp{T}.yaml, _measured.json)",
    )
    args = ap.parse_args(argv)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.from_measured:
        measure(args, out)
    measured = json.loads(out.with_name(out.name + "_measured").with_suffix(".json").read_text())
    tps = sorted({r["tp"] for r in measured["rows"]})
    hws = {t: Hardware.from_yaml(out.with_name(f"{out.name}_hw_tp{t}.yaml")) for t in tps}
    rows = [predicted(r, hws[r["tp"]]) for r in measured["rows"]]
    med_step = statistics.median(abs(r["step_error"]) for r in rows)
    med_mem = statistics.median(abs(r["mem_error"]) for r in rows)
    cmd = results.command(None if argv is None else ["benchmarks/benefit_model_check.py", *argv])
    doc = {
        "command": cmd,
        "median_step_error": med_step,
        "median_memory_error": med_mem,
        "hardware": {t: f"{out.name}_hw_tp{t}.yaml" for t in hws},
        "rows": rows,
    }
    results.write(out, doc, report(doc, hws))
    print(report(doc, hws))


def measure(args, out: Path) -> None:
    """`dchag calibrate` with T processes for each T (``out``_hw_tp{T}.yaml), then the model
    benchmark's measurements (``out``_measured.json)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for t in args.tp:
        hw_file = out.with_name(f"{out.name}_hw_tp{t}.yaml")
        # the demo config's model is the model benchmark's: width 64, depth 2, heads 4, 32x64 image, patch 4;
        # its efficiency is set on 128 channels, data-parallel layout: none of the checked configurations
        calibrate = ["-m", "dchag", "calibrate", "--config", str(REPO / "config" / "demo.yaml"), "--channels", "128"]
        subprocess.run(torchrun(t, *calibrate, "--batch", "2", "--output", str(hw_file)), env=env, check=True)
    bench = [str(REPO / "benchmarks" / "model_benchmark.py"), "--tp", *map(str, args.tp)]
    bench += ["--channels", *map(str, args.channels), "--steps", str(args.steps)]
    bench += ["--output", str(out.with_name(out.name + "_measured"))]
    subprocess.run([sys.executable, *bench], env=env, check=True)


def predicted(r: dict, hw: Hardware) -> dict:
    """The cost model's step time and peak memory of measured row ``r`` beside the measurement."""
    kind, tree = r["variant"].split(" Tree") if " Tree" in r["variant"] else (r["variant"], "0")
    t = r["tp"]
    w = Workload(
        channels=r["channels"],
        embed_dim=64,
        depth=2,
        num_heads=4,
        tokens=128,
        patch_size=4,
        batch=2,
        act_bytes=4,
        out_channels=3,
        tree=int(tree),
    )
    hw_t = Hardware(hw.alpha, hw.intra_bw, hw.inter_bw, gpus_per_node=max(t, 1))
    p = predict(w, hw_t, t, t, STRATEGY[kind], Compute.from_measured(hw.measured), tp=t)
    m_step, m_mem = r["model"]["step_seconds"], r["model"]["max_rank_total"]
    return {
        "variant": r["variant"],
        "channels": r["channels"],
        "tp": t,
        "measured_step_s": m_step,
        "predicted_step_s": p.step_s,
        "predicted_compute_s": p.compute_s,
        "predicted_comm_s": p.comm_s,
        "step_error": p.step_s / m_step - 1,
        "measured_mem_mib": m_mem,
        "predicted_mem_mib": p.memory_bytes / MIB,
        "mem_error": p.memory_bytes / MIB / m_mem - 1,
    }


def report(doc: dict, hws: dict) -> str:
    rows = doc["rows"]
    lines = [
        "# Benefit model vs measurement (this machine: CPU, gloo)",
        "",
        f"Command: `{doc['command']}`  ",
        "Calibration: `dchag calibrate` with T processes for each T (files *_hw_tp{T}.yaml): "
        + "; ".join(
            f"T={t}: α {h.alpha * 1e6:.0f} µs, {h.intra_bw / 1e9:.2f} GB/s, "
            f"{h.measured['compute']['flops_per_s'] / 1e9:.0f} GFLOP/s, "
            f"{h.measured['compute']['mem_bw'] / 1e9:.1f} GB/s "
            f"(largest tensors), {h.measured['compute']['op_s'] * 1e6:.1f} µs/op, efficiency "
            f"{h.measured['compute']['efficiency']:.2f}"
            for t, h in hws.items()
        )
        + "; measurements: benchmarks/model_benchmark.py in the same run.  ",
        f"Median |error|: step time {doc['median_step_error']:.1%}, peak memory per rank "
        f"{doc['median_memory_error']:.1%} ({len(rows)} configurations).",
        "",
        "| variant | C | T | step s measured | predicted (compute + comm) | error | "
        "memory MiB measured | predicted | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['channels']} | {r['tp']} | {r['measured_step_s']:.4f} | "
            f"{r['predicted_step_s']:.4f} ({r['predicted_compute_s']:.4f} + {r['predicted_comm_s']:.4f}) | "
            f"{r['step_error']:+.0%} | {r['measured_mem_mib']:.1f} | {r['predicted_mem_mib']:.1f} | "
            f"{r['mem_error']:+.0%} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
