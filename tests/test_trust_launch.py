"""`dchag launch-train` (the pipeline's path) ends a user's error with one line: what it can
check before torchrun starts, and a worker's own error after; training configs that cannot
train are refused before any work; damaged stores are named by `predict`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr
from test_train import run_config

from dchag.train.lock import RunLock


def launch_train(cfg: dict, out: Path, train: Path, val: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dchag", "launch-train", "--config", json.dumps(cfg), "--run-name", "f"]
    cmd += ["--output", str(out), "--train-data", str(train), "--val-data", str(val), "--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.strip().splitlines()[-1]


def one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert last_line(proc).startswith("dchag launch-train: error: ") and message in last_line(proc), text[-3000:]
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]


def test_a_workers_error_ends_launch_train_in_its_one_line(data_root, tmp_path):
    """A training store with a NaN field: the error only a worker meets (at its first step),
    on both ranks of a 2-process launch; the launcher ends with that line, not torchrun's report."""
    root, base = data_root
    train = tmp_path / "train.zarr"
    shutil.copytree(root / "era5" / "train.zarr", train)
    data = zarr.open_array(store=str(train), path="data", mode="r+")
    data[:, 0] = np.nan
    cfg = run_config(base, steps=2, val_every=2, max_restarts=0)
    proc = launch_train(cfg, tmp_path / "run", train, root / "era5" / "val.zarr", nproc=2)
    one_line_error(proc, "run f: step 1: loss nan, gradient norm nan on this rank")
    assert "dchag train: error:" in proc.stderr  # the worker's own line: the error was met there
    assert str(train) in last_line(proc)
    assert not (tmp_path / "run" / "final").exists()


def test_launch_train_checks_before_torchrun_starts(data_root, tmp_path):
    """A run directory in use, a missing store, a layout the processes cannot form: one line
    each from the launcher itself, no worker started."""
    root, base = data_root
    train, val = root / "era5" / "train.zarr", root / "era5" / "val.zarr"
    cfg = run_config(base, steps=2)
    out = tmp_path / "run"
    with RunLock(out):
        proc = launch_train(cfg, out, train, val, nproc=2)
    one_line_error(proc, f"run directory {out} is in use by pid {os.getpid()}")
    assert "dchag train" not in proc.stderr and "torch.distributed" not in proc.stderr

    proc = launch_train(cfg, out, tmp_path / "nowhere.zarr", val, nproc=2)
    one_line_error(proc, f"Zarr store not found: {tmp_path / 'nowhere.zarr'}")
    assert "dchag train" not in proc.stderr

    proc = launch_train(cfg, out, train, val, nproc=1)  # tp 2 in one process
    one_line_error(proc, "world size 1 is not a multiple of the tensor-parallel size tp=2")
    assert "dchag train" not in proc.stderr
    assert not (out / "log.csv").exists() and not (out / "checkpoints").exists()
