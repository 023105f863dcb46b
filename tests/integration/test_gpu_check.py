"""The GPU check, rehearsed on the CPU as CI runs it (`gpu_check.sh --dry-run`): it fetches the
wheel set a device call carries (and the same set for this Python), runs in an interpreter that
holds only the GPU image's packages of this environment, installs the wheels the way the GPU
machine does and runs every part at its tiny size; so a package the GPU machine lacks, or a
wheel missing from the set, fails here rather than in the one call a GPU is lent for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from support import REPO


@pytest.mark.minutes(1.5)
def test_gpu_check_rehearses_the_device_run_on_the_cpu(tmp_path):
    device_out = tmp_path / "device_out"  # what $OUT is in a device call
    device_out.mkdir()
    scratch = tmp_path / "scratch"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "900", "OUT": str(device_out)}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "benchmarks" / "gpu_check.sh"),
            "--dry-run",
            "--output",
            str(tmp_path / "out"),
            "--work",
            str(scratch / "work"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert result["complete"] and not result["failures"], result["failures"]
    # It ran in the image's interpreter, which lacks what the wheels bring: they supplied it.
    image_python = scratch / "image" / "bin" / "python"
    assert result["environment"]["executable"] == str(image_python)
    assert not result["environment"]["unmet"], result["environment"]["unmet"]
    assert subprocess.run([image_python, "-c", "import torch, xarray, yaml"], env=env).returncode == 0
    for missing in ("zarr", "dask", "netCDF4", "jsonschema", "spectral"):
        lacks = subprocess.run([image_python, "-c", f"import {missing}"], capture_output=True, env=env)
        assert lacks.returncode != 0, f"the image's interpreter has {missing}: the rehearsal proves nothing"
    assert result["nccl"]["backend"] == "gloo" and result["nccl"]["all_reduce"] == [1.0] * 4
    for run in ("forecast", "mae", "classification"):
        r = result["train"]["runs"][run]
        assert r["returncode"] == 0 and r["rows"] == 12 and r["killed_worker"] and r["resumed"], (run, r)
        assert r["precision"] == "fp32"  # bf16 on a GPU (precision: auto)
    assert result["calibrate"]["backend"] == "gloo"
    variants = {(r["variant"], r["channels"]) for r in result["bench"]}
    token = ("baseline", "D-CHAG-L", "D-CHAG-C")
    assert variants == {(v + f, c) for v in token for f in ("", " fused") for c in (8, 16)}
    assert all(r["forward_flops"] > 0 and r["tflops_per_gpu"] > 0 and r["samples_per_s"] > 0 for r in result["bench"])
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "TFLOPS/GPU" in md and "benchmarks/gpu_check.sh --dry-run --output" in md and "Every part passed." in md
    # A device call brings back $OUT: the results, the console log and the parts' logs.
    assert sorted(os.listdir(device_out)) == ["gpu_check.json", "gpu_check.log", "gpu_check.md", "work_logs.tar.gz"]
    assert json.loads((device_out / "gpu_check.json").read_text()) == result
    assert "Every part passed." in (device_out / "gpu_check.log").read_text()
    with tarfile.open(device_out / "work_logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"train_forecast.log", "bench.log", "hw.yaml", "runs/classification/log.csv"} <= names, names

    # The set that travels (CPython 3.12) was checked too; without one of zarr's dependencies
    # that check fails, naming it.
    wheels = scratch / "wheels-cp312"
    assert len(list(wheels.glob("zarr-*.whl"))) == 1
    partial = tmp_path / "partial"
    shutil.copytree(wheels, partial, ignore=shutil.ignore_patterns("donfig-*"))
    check = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_env.py"), "check", str(partial)],
        capture_output=True,
        text=True,
    )
    assert check.returncode != 0
    assert "zarr-3.1.6-py3-none-any.whl needs donfig>=0.8: neither carried nor in the image" in check.stderr
