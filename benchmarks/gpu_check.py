"""The GPU check: one command that exercises what only a GPU run shows, in minutes.

    bash benchmarks/gpu_check.sh                 # on a GPU machine: paper-like benchmark sizes
    bash benchmarks/gpu_check.sh --size tiny     # the CPU rehearsal (what CI runs)

1. ``nccl``: a process group on the machine's backend (NCCL with gloo beside it on CUDA) and
   one all-reduce of a device tensor.
2. ``train``: each task (forecast, masked autoencoding, classification) for 30 steps under
   torchrun — bf16 autocast on a GPU (``precision: auto``), activation checkpointing,
   D-CHAG-L layout with T = 1 — with a checkpoint every 10 steps; each run has its worker
   killed past its first checkpoint and must resume from it and finish with one row per
   step (the tiny rehearsal: 12 steps, a checkpoint every 4).
3. ``calibrate``: ``dchag calibrate`` under torchrun with the training config.
4. ``bench``: baseline against D-CHAG-L and -C at T = 1 (one device; the hierarchical model
   with one channel group), recording ``torch.cuda.max_memory_reserved`` (the paper's
   measure), samples/s and TFLOPS per GPU as the paper computes it: 3 x forward FLOPs / step
   time (forward FLOPs counted by torch's FlopCounterMode on one forward).

Results (JSON and Markdown, with the command and the device name) go to ``--output``
(default ``benchmarks/results/gpu/``; the tiny rehearsal to ``benchmarks/_work/gpu_check``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
SIZES = {  # the benchmark's model: paper-like on a GPU (DCHAG.md §4: 128 x 256, patch 4, batch 2)
    "paper": dict(width=1024, depth=8, heads=16, img=(128, 256), patch=4, batch=2, channels=[256, 512, 1024], steps=5,
                  train_steps=30, checkpoint_every=10),
    "tiny": dict(width=32, depth=1, heads=4, img=(32, 64), patch=4, batch=2, channels=[8, 16], steps=2,
                 train_steps=12, checkpoint_every=4),
}
VARIANTS = [("baseline", "baseline"), ("D-CHAG-L", "dchag-l"), ("D-CHAG-C", "dchag-c")]


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


# -- 1. NCCL --------------------------------------------------------------------------------
def part_nccl() -> None:
    import torch.distributed as dist

    from dchag.parallel import init_distributed

    backend, device = init_distributed()
    x = torch.ones(4, device=device) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(json.dumps({"backend": backend, "device": str(device), "device_name": name, "all_reduce": x.tolist()}), flush=True)
    dist.destroy_process_group()


# -- 2. training: data, runs, kill and resume ----------------------------------------------
def _data(work: Path) -> dict:
    """Small ERA5-layout and hyperspectral stores made by the real preprocessing."""
    from dchag.config import validate
    from dchag.era5 import demo as era5_demo
    from dchag.era5.preprocess import build_split, make_weights, normalization_stats, preprocess_year
    from dchag.hsi import demo as hsi_demo
    from dchag.hsi.preprocess import preprocess_from_config

    raw = work / "raw"
    for year in (2001, 2002, 2003):
        era5_demo.write_year(raw, year, 3.75, [500, 850], days=40)
    era5_demo.write_constants(raw, 3.75)
    hsi_demo.write_mat(raw / "hsi", 48, 48)
    hsi_demo.write_envi(raw / "hsi" / "envi", count=4, rows=48, cols=48)
    cfg = validate({
        "name": "gpu_check",
        "era5": {"inputs": [str(raw / "pressure_levels_{year}.nc"), str(raw / "single_levels_{year}.nc")],
                 "constants": str(raw / "constants.nc"), "years": {"train": [2001], "val": [2002], "test": [2003]},
                 "time_step_hours": 24, "grid": 5.625, "regrid": {"method": "bilinear", "backend": "builtin"},
                 "channels": {"pressure_level": {"variables": ["geopotential", "temperature", "u_component_of_wind"],
                                                 "levels": [500, 850]},
                              "single_level": ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind"],
                              "constants": ["land_sea_mask"]}},
        "hsi": {"preset": "indian_pines",
                "classification": {"image": str(raw / "hsi" / "synthetic_scene.mat"), "image_key": "synthetic_scene",
                                   "labels": str(raw / "hsi" / "synthetic_scene_gt.mat"), "labels_key": "synthetic_scene_gt",
                                   "patch": 7},
                "mae": {"images": [str(raw / "hsi" / "envi" / "*.hdr")], "tile": 16}},
    }, "gpu check")
    era5 = work / "era5"
    make_weights(cfg["era5"], 2001, era5 / "w.nc")
    years = {y: preprocess_year(cfg["era5"], y, era5 / "w.nc", era5 / f"{y}.zarr") for y in (2001, 2002)}
    stats = normalization_stats([years[2001]], era5 / "stats.json")
    for split, y in (("train", 2001), ("val", 2002)):
        build_split(split, [years[y]], stats, era5 / f"{split}.zarr")
    preprocess_from_config(cfg, "classification", work / "hsi" / "classification.zarr")
    preprocess_from_config(cfg, "mae", work / "hsi" / "mae.zarr")
    return cfg


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def part_train(work: Path, size: str) -> dict:
    import yaml

    t0 = time.perf_counter()
    cfg = _data(work)
    data_s = time.perf_counter() - t0
    width = 256 if size == "paper" else 32
    steps, every = SIZES[size]["train_steps"], SIZES[size]["checkpoint_every"]
    cfg.update({
        "model": {"patch_size": 4, "embed_dim": width, "depth": 4 if size == "paper" else 1, "num_heads": 8 if size == "paper" else 4,
                  "aggregation": "linear", "decoder": {"dim": 64, "depth": 1, "num_heads": 4}},
        "parallel": {"tp": 1, "strategy": "dchag", "dp": "none", "activation_checkpointing": True, "precision": "auto"},
        "train": {"steps": steps, "batch_size": 4, "lr": 1e-3, "warmup_steps": 3, "checkpoint_every": every, "val_every": every,
                  "val_batches": 2, "max_restarts": 1, "forecast": {"lead_hours": [24, 72]},
                  "runs": {"forecast": {"task": "forecast"}, "mae": {"task": "mae"},
                           "classify": {"task": "classify", "model": {"patch_size": 1}}}},  # 7 x 7 patches
    })
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    stores = {"forecast": (work / "era5" / "train.zarr", work / "era5" / "val.zarr"),
              "mae": (work / "hsi" / "mae.zarr",) * 2, "classify": (work / "hsi" / "classification.zarr",) * 2}
    out = {"data_s": round(data_s, 1), "runs": {}}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for run, (train, val) in stores.items():
        run_dir = work / "runs" / run
        log = open(work / f"train_{run}.log", "w")
        t0 = time.perf_counter()
        proc = subprocess.Popen([_bin("dchag"), "launch-train", "--config", str(config), "--run-name", run, "--output",
                                 str(run_dir), "--train-data", str(train), "--val-data", str(val), "--nproc", "1"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        partial, killed = run_dir / "log.csv.partial", None
        while proc.poll() is None and killed is None:
            if partial.exists() and len(partial.read_text().splitlines()) > every + 2:  # past the first checkpoint
                workers = _children(proc.pid)
                if workers:
                    killed = workers[0]
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        proc.wait(timeout=600)
        text = (work / f"train_{run}.log").read_text()
        rows = (run_dir / "log.csv").read_text().splitlines() if (run_dir / "log.csv").exists() else []
        info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
        out["runs"][run] = {"returncode": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
                            "killed_worker": killed is not None, "resumed": "resuming from" in text, "rows": len(rows) - 1,
                            "precision": info.get("precision"), "backend": info.get("parallel", {}).get("backend"),
                            "final_loss": float(rows[-1].split(",")[2]) if len(rows) > 1 else None}
        ok = proc.returncode == 0 and len(rows) == steps + 1 and (killed is None or "resuming from" in text)
        if not ok:
            raise SystemExit(f"training {run} failed the check: {out['runs'][run]}\n{text[-3000:]}")
    out["config"] = str(config)
    return out


# -- 3. calibrate ---------------------------------------------------------------------------
def part_calibrate(work: Path) -> dict:
    hw = work / "hw.yaml"
    proc = subprocess.run(_torchrun(1, "-m", "dchag", "calibrate", "--config", str(work / "config.yaml"), "--repeats", "2",
                                    "--output", str(hw)), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"dchag calibrate failed:\n{proc.stderr[-3000:]}")
    import yaml

    measured = yaml.safe_load(hw.read_text())
    return {"output": proc.stdout.strip().splitlines()[-1], "backend": measured.get("measured", {}).get("backend")}


# -- 4. the T = 1 benchmark -----------------------------------------------------------------
def part_bench(size: str) -> None:
    """Each variant measured as a paper sweep point (dchag.paper.bench: the same measurement
    the `paper` target makes), on one device."""
    import torch.distributed as dist

    from dchag.paper.bench import measure
    from dchag.paper.sweep import Point
    from dchag.parallel import init_distributed

    init_distributed()
    s = SIZES[size]
    for channels in s["channels"]:
        for label, variant in VARIANTS:
            p = Point(s["width"], s["depth"], s["heads"], channels, tuple(s["img"]), s["patch"], s["batch"], "auto", 1, 1, variant,
                      0, False)
            r = measure(p, s["steps"], warmup=1)
            print(json.dumps({"variant": label, "channels": channels, "precision": r["precision_run"], "step_s": r["step_s"],
                              "samples_per_s": p.batch / r["step_s"], "forward_flops": r["forward_flops"],
                              "tflops_per_gpu": r["tflops_per_gpu"],
                              "max_memory_reserved_mib": r["memory_mib_rank0"] if torch.cuda.is_available() else float("nan"),
                              "peak_allocated_mib": r["ranks"][0]["allocated_mib"]}), flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    dist.destroy_process_group()


def _table(result: dict) -> str:
    lines = ["# GPU check", "", f"Command: `{result['command']}`  ", f"Device: {result['device']}; torch {result['torch']}  ",
             f"Size: {result['size']} ({json.dumps(SIZES[result['size']])})", "",
             f"NCCL / process group: {json.dumps(result['nccl'])}", "", f"## Training ({SIZES[result['size']]['train_steps']} steps, killed once and resumed)", "",
             "| run | precision | backend | seconds | killed | resumed | rows | final loss |", "|---|---|---|---:|---|---|---:|---:|"]
    for run, r in result["train"]["runs"].items():
        lines.append(f"| {run} | {r['precision']} | {r['backend']} | {r['seconds']} | {r['killed_worker']} | {r['resumed']} | "
                     f"{r['rows']} | {r['final_loss']:.4f} |")
    lines += ["", f"Calibrate: {result['calibrate']['output']}", "", "## Baseline vs D-CHAG at T = 1", "",
              "| C | variant | max_memory_reserved MiB | vs base | peak allocated MiB | step s | samples/s | TFLOPS/GPU |",
              "|---:|---|---:|---:|---:|---:|---:|---:|"]
    base = {r["channels"]: r for r in result["bench"] if r["variant"] == "baseline"}
    for r in result["bench"]:
        b = base[r["channels"]]
        ratio = r["max_memory_reserved_mib"] / b["max_memory_reserved_mib"] if b["max_memory_reserved_mib"] == b["max_memory_reserved_mib"] else float("nan")
        lines.append(f"| {r['channels']} | {r['variant']} | {r['max_memory_reserved_mib']:.0f} | {ratio:.2f} | {r['peak_allocated_mib']:.0f} | "
                     f"{r['step_s']:.4f} | {r['samples_per_s']:.1f} | {r['tflops_per_gpu']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="paper" if torch.cuda.is_available() else "tiny")
    p.add_argument("--output", help="results folder (default benchmarks/results/gpu, or benchmarks/_work/gpu_check for tiny)")
    p.add_argument("--work", help="scratch folder (default benchmarks/_work/gpu_check/work)")
    p.add_argument("--part", choices=["nccl", "bench"], help=argparse.SUPPRESS)  # a torchrun worker
    args = p.parse_args()
    if args.part == "nccl":
        return part_nccl()
    if args.part == "bench":
        return part_bench(args.size)
    root = HERE.parent
    out = Path(args.output or (root / "results" / "gpu" if args.size == "paper" else root / "_work" / "gpu_check"))
    work = Path(args.work or root / "_work" / "gpu_check" / "work")
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    result = {"command": "bash benchmarks/gpu_check.sh " + " ".join(sys.argv[1:]), "size": args.size, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"}
    t0 = time.perf_counter()
    proc = subprocess.run(_torchrun(1, str(HERE), "--part", "nccl"), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"process group failed:\n{proc.stderr[-3000:]}")
    result["nccl"] = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    print("process group:", result["nccl"], flush=True)
    result["train"] = part_train(work, args.size)
    print("training:", json.dumps(result["train"]["runs"]), flush=True)
    result["calibrate"] = part_calibrate(work)
    print("calibrate:", result["calibrate"], flush=True)
    proc = subprocess.run(_torchrun(1, str(HERE), "--part", "bench", "--size", args.size), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"benchmark failed:\n{proc.stderr[-3000:]}")
    result["bench"] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    from dchag import jsonio

    (out / "gpu_check.json").write_text(jsonio.dumps(result, indent=1))  # strict JSON: NaN (no GPU) as null
    (out / "gpu_check.md").write_text(_table(result) + f"\nTotal: {result['seconds']} s\n")
    print((out / "gpu_check.md").read_text())


if __name__ == "__main__":
    main()
