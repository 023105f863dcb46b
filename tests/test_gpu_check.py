"""The GPU check script, rehearsed on the CPU at its tiny size (as CI runs it): every part
runs and writes its results, so the same command runs first time on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.integration
def test_gpu_check_rehearses_on_the_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "900"}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--size", "tiny", "--output", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert result["nccl"]["backend"] == "gloo" and result["nccl"]["all_reduce"] == [1.0] * 4
    for run in ("forecast", "mae", "classify"):
        r = result["train"]["runs"][run]
        assert r["returncode"] == 0 and r["rows"] == 12 and r["killed_worker"] and r["resumed"], (run, r)
        assert r["precision"] == "fp32"  # bf16 on a GPU (precision: auto)
    assert result["calibrate"]["backend"] == "gloo"
    variants = {(r["variant"], r["channels"]) for r in result["bench"]}
    assert variants == {(v, c) for v in ("baseline", "D-CHAG-L", "D-CHAG-C") for c in (8, 16)}
    assert all(r["forward_flops"] > 0 and r["tflops_per_gpu"] > 0 and r["samples_per_s"] > 0 for r in result["bench"])
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "TFLOPS/GPU" in md and "benchmarks/gpu_check.sh --size tiny" in md
