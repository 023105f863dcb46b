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

Results (JSON and Markdown, with the command, the device name and the package versions) go to
``--output`` (default ``benchmarks/results/gpu/``; the tiny sizes to ``benchmarks/_work/gpu_check``)
and to ``$OUT`` when it is set (a device call brings that folder back), rewritten after each
part, so a part that fails or a stop at the time limit still leaves what the earlier parts
found; ``$OUT`` also gets the parts' logs (``work_logs.tar.gz``). Run it through
``gpu_check.sh``, which supplies the packages the machine lacks.
"""

from __future__ import annotations

import argparse
import gc
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
sys.path.insert(0, str(HERE.parents[1] / "src"))  # as gpu_check.sh runs it: the package from this tree

from dchag.bench.procs import kill_once_past, stream_json, torchrun  # noqa: E402
from dchag.bench.results import environment  # noqa: E402
from dchag.vocabulary import MODEL_VARIANTS, VARIANTS  # noqa: E402

SIZES = {  # the benchmark's model: paper-like on a GPU (docs/method.md: 128 x 256, patch 4, batch 2)
    "paper": dict(
        width=1024,
        depth=8,
        heads=16,
        img=(128, 256),
        patch=4,
        batch=2,
        channels=[256, 512, 1024],
        steps=5,
        train_steps=30,
        checkpoint_every=10,
    ),
    "tiny": dict(
        width=32,
        depth=1,
        heads=4,
        img=(32, 64),
        patch=4,
        batch=2,
        channels=[8, 16],
        steps=2,
        train_steps=12,
        checkpoint_every=4,
    ),
}
# (label, paper variant, fused front end): each model forming the channel tokens, then fused
BENCH_VARIANTS = [(VARIANTS[n].label, n, False) for n in MODEL_VARIANTS] + [
    (f"{VARIANTS[n].label} fused", n, True) for n in MODEL_VARIANTS
]


# -- 1. NCCL --------------------------------------------------------------------------------
def part_nccl() -> None:
    import torch.distributed as dist

    from dchag.parallel import init_distributed

    backend, device = init_distributed()
    x = torch.ones(4, device=device) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        json.dumps({"backend": backend, "device": str(device), "device_name": name, "all_reduce": x.tolist()}),
        flush=True,
    )
    dist.destroy_process_group()


# -- 2. training: data, runs, kill and resume ----------------------------------------------
def _data(work: Path) -> dict:
    """Small ERA5-layout and hyperspectral stores made by the real preprocessing."""
    from dchag.config import validate
    from dchag.era5 import demo as era5_demo
    from dchag.era5.preprocess import make_weights, preprocess_year
    from dchag.era5.split import build_split
    from dchag.era5.statistics import normalization_stats
    from dchag.hsi import demo as hsi_demo
    from dchag.hsi.preprocess import preprocess_from_config

    raw = work / "raw"
    for year in (2001, 2002, 2003):
        era5_demo.write_year(raw, year, 3.75, [500, 850], days=40)
    era5_demo.write_constants(raw, 3.75)
    hsi_demo.write_mat(raw / "hsi", 48, 48)
    hsi_demo.write_envi(raw / "hsi" / "envi", count=4, rows=48, cols=48)
    cfg = validate(
        {
            "name": "gpu_check",
            "era5": {
                "inputs": [str(raw / "pressure_levels_{year}.nc"), str(raw / "single_levels_{year}.nc")],
                "constants": str(raw / "constants.nc"),
                "years": {"train": [2001], "val": [2002], "test": [2003]},
                "time_step_hours": 24,
                "grid": 5.625,
                "regrid": {"method": "bilinear", "backend": "builtin"},
                "channels": {
                    "pressure_level": {
                        "variables": ["geopotential", "temperature", "u_component_of_wind"],
                        "levels": [500, 850],
                    },
                    "single_level": ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind"],
                    "constants": ["land_sea_mask"],
                },
            },
            "hsi": {
                "preset": "indian_pines",
                "classification": {
                    "image": str(raw / "hsi" / "synthetic_scene.mat"),
                    "image_key": "synthetic_scene",
                    "labels": str(raw / "hsi" / "synthetic_scene_gt.mat"),
                    "labels_key": "synthetic_scene_gt",
                    "patch": 7,
                },
                "mae": {"images": [str(raw / "hsi" / "envi" / "*.hdr")], "tile": 16},
            },
        },
        "gpu check",
    )
    era5 = work / "era5"
    make_weights(cfg["era5"], 2001, era5 / "w.nc")
    years = {y: preprocess_year(cfg["era5"], y, era5 / "w.nc", era5 / f"{y}.zarr") for y in (2001, 2002)}
    stats = normalization_stats([years[2001]], era5 / "stats.json")
    for split, y in (("train", 2001), ("val", 2002)):
        build_split(split, [years[y]], stats, era5 / f"{split}.zarr")
    preprocess_from_config(cfg, "classification", work / "hsi" / "classification.zarr")
    preprocess_from_config(cfg, "mae", work / "hsi" / "mae.zarr")
    return cfg


def part_train(work: Path, size: str, out: dict) -> None:
    """Fills ``out`` as it goes (the data's time, then each run), so a failure keeps the rest."""
    import yaml

    t0 = time.perf_counter()
    cfg = _data(work)
    out["data_s"] = round(time.perf_counter() - t0, 1)
    width = 256 if size == "paper" else 32
    steps, every = SIZES[size]["train_steps"], SIZES[size]["checkpoint_every"]
    cfg.update(
        {
            "model": {
                "patch_size": 4,
                "embed_dim": width,
                "depth": 4 if size == "paper" else 1,
                "num_heads": 8 if size == "paper" else 4,
                "aggregation": "linear",
                "decoder": {"dim": 64, "depth": 1, "num_heads": 4},
            },
            "parallel": {
                "tp": 1,
                "strategy": "dchag",
                "data_parallel": "none",
                "activation_checkpointing": True,
                "precision": "auto",
            },
            "train": {
                "steps": steps,
                "batch_size": 4,
                "lr": 1e-3,
                "warmup_steps": 3,
                "checkpoint_every": every,
                "val_every": every,
                "val_batches": 2,
                "max_restarts": 1,
                "forecast": {"lead_hours": [24, 72]},
                "runs": {
                    "forecast": {"task": "forecast"},
                    "mae": {"task": "mae"},
                    "classification": {"task": "classification", "model": {"patch_size": 1}},
                },
            },  # 7 x 7 patches
        }
    )
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    stores = {
        "forecast": (work / "era5" / "train.zarr", work / "era5" / "val.zarr"),
        "mae": (work / "hsi" / "mae.zarr",) * 2,
        "classification": (work / "hsi" / "classification.zarr",) * 2,
    }
    out["config"], out["runs"], failed = str(config), {}, []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for run, (train, val) in stores.items():
        run_dir = work / "runs" / run
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "dchag", "launch-train", "--config", str(config), "--run-name", run]
        cmd += ["--output", str(run_dir), "--train-data", str(train), "--val-data", str(val), "--nproc", "1"]
        # the package runs from the tree (PYTHONPATH), with no console script; the worker killed
        # once past its first checkpoint (the header, the rows to it and the validation row)
        code, killed = kill_once_past(cmd, work / f"train_{run}.log", run_dir / "log.csv.partial", every + 2, env)
        text = (work / f"train_{run}.log").read_text()
        rows = (run_dir / "log.csv").read_text().splitlines() if (run_dir / "log.csv").exists() else []
        info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
        out["runs"][run] = {
            "returncode": code,
            "seconds": round(time.perf_counter() - t0, 1),
            "killed_worker": killed,
            "resumed": "resuming from" in text,
            "rows": len(rows) - 1,
            "precision": info.get("precision"),
            "backend": info.get("parallel", {}).get("backend"),
            "final_loss": float(rows[-1].split(",")[2]) if len(rows) > 1 else None,
        }
        ok = code == 0 and len(rows) == steps + 1 and (not killed or "resuming from" in text)
        if not ok:  # the other runs still run: one call of the GPU machine should show every failure
            failed.append(run)
            print(f"training {run} failed the check: {out['runs'][run]}\n{text[-3000:]}", flush=True)
    if failed:
        raise SystemExit(f"training failed the check: {', '.join(failed)} (their logs: train_<run>.log)")


# -- 3. calibrate ---------------------------------------------------------------------------
def part_calibrate(work: Path) -> dict:
    hw = work / "hw.yaml"
    proc = subprocess.run(
        torchrun(
            1, "-m", "dchag", "calibrate", "--config", str(work / "config.yaml"), "--repeats", "2", "--output", str(hw)
        ),
        capture_output=True,
        text=True,
    )
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
        for label, variant, fused in BENCH_VARIANTS:
            p = Point(
                s["width"],
                s["depth"],
                s["heads"],
                channels,
                tuple(s["img"]),
                s["patch"],
                s["batch"],
                "auto",
                1,
                1,
                variant,
                0,
                False,
                fused_front_end=fused,
            )
            try:
                r = measure(p, s["steps"], warmup=1)
            except torch.OutOfMemoryError:  # a finding at this size (the baseline's wall), not a failure
                r = None
            if r is None:
                gc.collect()
                torch.cuda.empty_cache()
                print(json.dumps({"variant": label, "channels": channels, "oom": True}), flush=True)
                continue
            print(
                json.dumps(
                    {
                        "variant": label,
                        "channels": channels,
                        "precision": r["precision_run"],
                        "step_s": r["step_s"],
                        "samples_per_s": p.batch / r["step_s"],
                        "forward_flops": r["forward_flops"],
                        "tflops_per_gpu": r["tflops_per_gpu"],
                        "max_memory_reserved_mib": r["memory_mib_rank0"] if torch.cuda.is_available() else float("nan"),
                        "peak_allocated_mib": r["ranks"][0]["allocated_mib"],
                    }
                ),
                flush=True,
            )
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    dist.destroy_process_group()


def _table(result: dict) -> str:
    size = SIZES[result["size"]]
    lines = [
        "# GPU check",
        "",
        f"Command: `{result['command']}`  ",
        f"Device: {result['device']}; torch {result['torch']}; Python {result['environment']['python']}  ",
        f"Size: {result['size']} ({json.dumps(size)})  ",
        f"Packages: {json.dumps(result['environment']['packages'])}",
        "",
    ]
    if result["environment"]["unmet"]:
        lines += [f"Outside dchag's declared requirements: {'; '.join(result['environment']['unmet'])}", ""]
    if "nccl" in result:
        lines += [f"NCCL / process group: {json.dumps(result['nccl'])}", ""]
    if result.get("train", {}).get("runs"):
        lines += [
            f"## Training ({size['train_steps']} steps, killed once and resumed)",
            "",
            "| run | precision | backend | seconds | killed | resumed | rows | final loss |",
            "|---|---|---|---:|---|---|---:|---:|",
        ]
        for run, r in result["train"]["runs"].items():
            loss = "—" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
            lines.append(
                f"| {run} | {r['precision']} | {r['backend']} | {r['seconds']} | {r['killed_worker']} | "
                f"{r['resumed']} | {r['rows']} | {loss} |"
            )
        lines.append("")
    if "calibrate" in result:
        lines += [f"Calibrate: {result['calibrate']['output']}", ""]
    if result.get("bench"):
        lines += [
            "## Baseline vs D-CHAG at T = 1, forming the channel tokens and fused",
            "",
            "| C | variant | max_memory_reserved MiB | vs base | peak allocated MiB | step s | samples/s "
            "| TFLOPS/GPU |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        base = {r["channels"]: r for r in result["bench"] if r["variant"] == "baseline" and not r.get("oom")}
        for r in result["bench"]:
            if r.get("oom"):
                lines.append(f"| {r['channels']} | {r['variant']} | out of memory | | | | | |")
                continue
            b = base.get(r["channels"], {}).get("max_memory_reserved_mib", float("nan"))
            ratio = r["max_memory_reserved_mib"] / b if b == b else float("nan")
            lines.append(
                f"| {r['channels']} | {r['variant']} | {r['max_memory_reserved_mib']:.0f} | {ratio:.2f} | "
                f"{r['peak_allocated_mib']:.0f} | {r['step_s']:.4f} | {r['samples_per_s']:.1f} | "
                f"{r['tflops_per_gpu']:.2f} |"
            )
        lines.append("")
    lines.append(f"Seconds by part: {json.dumps(result['part_seconds'])}; total {result['seconds']} s  ")
    if result["failures"]:
        lines.append("FAILED: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in result["failures"].items()))
    elif not result["complete"]:
        lines.append("INCOMPLETE: stopped before every part ran")
    else:
        lines.append("Every part passed.")
    return "\n".join(lines) + "\n"


class _Stopped(BaseException):
    """SIGTERM (gpu_check.sh's time limit): stop, keeping what the finished parts found."""


def _stop(signum, frame):
    raise _Stopped(f"stopped by signal {signum} (gpu_check.sh's GPU_CHECK_TIMEOUT)")


def _save(result: dict, dests: list[Path], work: Path) -> None:
    from dchag import jsonio

    for d in dests:
        d.mkdir(parents=True, exist_ok=True)
        (d / "gpu_check.json").write_text(jsonio.dumps(result, indent=1))  # strict JSON: NaN (no GPU) as null
        (d / "gpu_check.md").write_text(_table(result))
    if os.environ.get("OUT"):  # a device call: bring the parts' logs back too (one file: $OUT takes 8)
        import tarfile

        with tarfile.open(Path(os.environ["OUT"]) / "work_logs.tar.gz", "w:gz") as tar:
            for f in sorted(work.glob("*.log")) + sorted(work.glob("*.yaml")) + sorted(work.glob("runs/*/*.json")):
                tar.add(f, arcname=str(f.relative_to(work)))
            for f in sorted(work.glob("runs/*/log.csv*")):
                tar.add(f, arcname=str(f.relative_to(work)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="paper" if torch.cuda.is_available() else "tiny")
    p.add_argument(
        "--output", help="results folder (default benchmarks/results/gpu, or benchmarks/_work/gpu_check for tiny)"
    )
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
    result = {
        "command": os.environ.get("GPU_CHECK_COMMAND", "benchmarks/gpu_check.py " + " ".join(sys.argv[1:])),
        "size": args.size,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
        "environment": environment(),
        "complete": False,
        "failures": {},
        "part_seconds": {},
        "seconds": 0.0,
    }
    print("environment:", json.dumps(result["environment"]), flush=True)
    dests = [out] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    signal.signal(signal.SIGTERM, _stop)

    def nccl():
        stream_json(torchrun(1, str(HERE), "--part", "nccl"), work / "nccl.log", lambda r: result.update(nccl=r))

    def bench():
        def row(r: dict) -> None:
            result["bench"].append(r)
            _save(result, dests, work)

        result["bench"] = []
        stream_json(torchrun(1, str(HERE), "--part", "bench", "--size", args.size), work / "bench.log", row)

    parts = {
        "nccl": nccl,
        "train": lambda: part_train(work, args.size, result.setdefault("train", {})),
        "calibrate": lambda: result.update(calibrate=part_calibrate(work)),
        "bench": bench,
    }
    t0 = time.perf_counter()
    try:
        for name, run in parts.items():  # each part runs whatever an earlier one found
            t = time.perf_counter()
            try:
                run()
                print(f"{name}:", json.dumps(result.get(name)), flush=True)
            except Exception as err:  # recorded; the check fails at the end
                result["failures"][name] = f"{type(err).__name__}: {err}"
            except SystemExit as err:
                result["failures"][name] = str(err.code)
            if name in result["failures"]:
                print(f"{name} FAILED: {result['failures'][name]}", flush=True)
            result["part_seconds"][name] = round(time.perf_counter() - t, 1)
            result["seconds"] = round(time.perf_counter() - t0, 1)
            _save(result, dests, work)
        result["complete"] = True
    except _Stopped as err:
        result["failures"]["stopped"] = str(err)
    finally:
        result["seconds"] = round(time.perf_counter() - t0, 1)
        _save(result, dests, work)
    print((out / "gpu_check.md").read_text(), flush=True)
    if result["failures"]:
        raise SystemExit(124 if "stopped" in result["failures"] else 1)


if __name__ == "__main__":
    main()
