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
import pytest
import zarr
from support.commands import launch_train_command, run_config

from dchag.train.lock import RunLock


def launch_train_to_end(cfg: dict, out: Path, train: Path, val: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    """`dchag launch-train` of run "f" to its end."""
    return subprocess.run(
        launch_train_command(cfg, out, train, val, nproc), capture_output=True, text=True, timeout=300
    )


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
    proc = launch_train_to_end(cfg, tmp_path / "run", train, root / "era5" / "val.zarr", nproc=2)
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
        proc = launch_train_to_end(cfg, out, train, val, nproc=2)
    one_line_error(proc, f"run directory {out} is in use by pid {os.getpid()}")
    assert "dchag train" not in proc.stderr and "torch.distributed" not in proc.stderr

    out = tmp_path / "other"
    proc = launch_train_to_end(cfg, out, tmp_path / "nowhere.zarr", val, nproc=2)
    one_line_error(proc, f"Zarr store not found: {tmp_path / 'nowhere.zarr'}")
    assert "dchag train" not in proc.stderr

    proc = launch_train_to_end(cfg, out, train, val, nproc=1)  # tp 2 in one process
    one_line_error(proc, "world size 1 is not a multiple of the tensor-parallel size tp=2")
    assert "dchag train" not in proc.stderr
    assert not out.exists()  # nothing left


# -- training configs that cannot train, refused before any work ------------------------------------
def _plan(cfg: dict) -> None:
    from dchag.config import settings
    from dchag.plan import check_run

    runs = cfg["train"]["runs"]
    for run in runs:
        check_run(settings(cfg), run, runs)


def _hsi_config(hsi: dict, runs: dict, **train) -> dict:
    from dchag.config import validate

    return validate(
        {
            "name": "t",
            "hsi": {"preset": "indian_pines", **hsi},
            "model": {"patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 4, "aggregation": "baseline"},
            "parallel": {"tp": 1, "strategy": "baseline", "data_parallel": "none"},
            "train": {"nproc": 1, "steps": 2, "batch_size": 2, "val_every": 1, "val_batches": 1, "runs": runs, **train},
        },
        "test config",
        check_files=False,
    )


def test_freezing_every_part_is_refused_by_the_plan(data_root):
    """Every part frozen passed the plan and failed in backward ("element 0 of tensors does not
    require grad"): the plan names the key."""
    from dchag.config import ConfigError

    _, base = data_root
    every = ["tokenizer", "aggregation", "blocks", "head"]
    runs = {"src": {"task": "forecast"}, "ft": {"task": "forecast", "init_from": "src", "train": {"freeze": every}}}
    cfg = run_config(base, runs=runs)
    with pytest.raises(ConfigError, match=r"config key 'train.runs.ft': train.freeze .* freezes every part"):
        _plan(cfg)
    runs["ft"]["train"]["freeze"] = every[:3]  # the head trains: fine
    _plan(run_config(base, runs=runs))


def test_a_linear_probe_with_freeze_is_refused():
    """A linear probe freezes all but the classifier head and ignored train.freeze silently: the
    combination is refused naming both keys."""
    from dchag.config import ConfigError

    hsi = {
        "mae": {"images": ["img.mat"], "tile": 8},
        "classification": {"image": "img.mat", "labels": "gt.mat", "patch": 8},
    }
    runs = {
        "src": {"task": "mae"},
        "probe": {"task": "classification", "init_from": "src", "train": {"linear_probe": True, "freeze": ["head"]}},
    }
    cfg = _hsi_config(hsi, runs)
    with pytest.raises(ConfigError, match=r"'train.runs.probe': train.linear_probe .* train.freeze \['head'\]"):
        _plan(cfg)
    del runs["probe"]["train"]["freeze"]
    _plan(_hsi_config(hsi, runs))


def test_an_empty_validation_split_is_named_before_training(tmp_path):
    """A store whose val group is empty was reported as a NaN validation loss at the first
    validation: `train` and `launch-train` name the split and store before any step; the plan
    refuses split fractions that leave it empty."""
    from support.hsi import make_tiles

    from dchag.config import ConfigError
    from dchag.hsi import demo

    demo.write_envi(tmp_path / "imgs", count=2, rows=32, cols=32, seed=5)
    images = [str(tmp_path / "imgs" / "*.hdr")]
    store = make_tiles(images, tmp_path / "t.zarr", {"preset": "indian_pines"}, tile=16, fractions=[0.5, 0.0, 0.5])
    cfg = _hsi_config({"mae": {"images": images, "tile": 16}}, {"f": {"task": "mae"}})
    message = f"the validation split (group 'val' of {store}) has 0 samples"

    proc = launch_train_to_end(cfg, tmp_path / "run", store, store)
    one_line_error(proc, message)
    assert "dchag train" not in proc.stderr  # before torchrun started

    cmd = [sys.executable, "-m", "dchag", "train", "--config", json.dumps(cfg), "--run-name", "f"]
    proc = subprocess.run([*cmd, "--output", str(tmp_path / "run"), "--train-data", str(store)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "log.csv").exists()

    cfg["hsi"]["mae"]["fractions"] = [0.5, 0.0, 0.5]
    with pytest.raises(ConfigError, match=r"config key 'hsi.mae.fractions' \(run f\): .* the validation split empty"):
        _plan(cfg)


# -- damaged stores named by predict -----------------------------------------------------------------
@pytest.fixture(scope="module")
def forecast_model(data_root, tmp_path_factory):
    """An untrained (seeded) forecast model of the fixture's stores, saved as export writes it."""
    import torch

    from dchag.config import run_settings
    from dchag.model import ChannelViT
    from dchag.model import folder as model_folder
    from dchag.predict import export
    from dchag.train.tasks import build_task

    root, base = data_root
    cfg = run_config(base)
    cfg["parallel"] = {"tp": 1, "strategy": "baseline", "data_parallel": "none"}
    cfg["model"]["aggregation"] = "baseline"
    store = root / "era5" / "train.zarr"
    task = build_task(run_settings(cfg, "f"), {"train": store, "val": root / "era5" / "val.zarr"})
    torch.manual_seed(0)
    model = export.describe(task, store, ChannelViT(task.model_cfg), {"run": "f"})
    return model_folder.save(model, tmp_path_factory.mktemp("model") / "model")


@pytest.mark.parametrize("damage", ["lost shard", "truncated shard", "truncated zarr.json"])
def test_predict_names_a_damaged_store(data_root, forecast_model, tmp_path, capsys, damage):
    """A lost chunk file was reported as "initial conditions not finite", a truncated one or a
    truncated zarr.json as a traceback: one line naming the store (and the missing file)."""
    from dchag.cli import main

    root, _ = data_root
    store = tmp_path / "val.zarr"
    shutil.copytree(root / "era5" / "val.zarr", store)
    shard = next(p for p in (store / "data" / "c").rglob("*") if p.is_file())
    if damage == "lost shard":
        shard.unlink()
        message = f"store {store}: the file(s) data/{shard.relative_to(store / 'data').as_posix()} of variable 'data'"
    else:  # a truncated shard is met by the reader (the training loader's), zarr.json on opening
        victim = shard if damage == "truncated shard" else store / "data" / "zarr.json"
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        truncated = damage == "truncated shard"
        message = f"cannot read array 'data' of {store}: " if truncated else f"cannot read Zarr store {store}: "
    out = tmp_path / "forecast.zarr"
    code = main(["predict", "--model", str(forecast_model), "--store", str(store), "--lead-hours", "24",
                 "--output", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and err[-1].startswith("dchag predict: error: ") and message in err[-1], err
    assert not out.exists()


def test_hub_push_and_pull_end_in_one_line_and_leave_nothing(forecast_model, tmp_path):
    """`dchag push-model` loads the folder before any network call; a Hub that cannot be
    reached (here a closed local port: HF_ENDPOINT) or an invalid repository id is one line
    naming the repository, and a failed pull leaves no folder (the upload and download
    themselves need the Hub, which this machine cannot reach)."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}

    def dchag(*args):
        proc = subprocess.run([sys.executable, "-m", "dchag", *args], capture_output=True, text=True, env=env)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        return proc.stderr

    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    assert f"{not_a_model} is not a dchag model folder" in dchag(
        "push-model", "--model", str(not_a_model), "--repo", "o/m"
    )
    err = dchag("push-model", "--model", str(forecast_model), "--repo", "o/m")
    assert "cannot push to the Hugging Face Hub repository 'o/m'" in err and "Connection refused" in err
    out = tmp_path / "pulled"
    err = dchag("pull-model", "--repo", "o/m", "--output", str(out))
    assert "cannot pull the Hugging Face Hub repository 'o/m'" in err and "Connection refused" in err
    assert "repository 'bad id!'" in dchag("pull-model", "--repo", "bad id!", "--output", str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no folder, no temporary, no cache


LEAK = """
import multiprocessing as mp
import os
import sys


def leak():
    lock = mp.get_context("forkserver").Lock()  # a named semaphore, registered with the tracker
    os._exit(0 if lock else 1)  # no finalizer runs: left to the tracker, as by a rank ended by a signal


if __name__ == "__main__":
    if sys.argv[1] == "launcher":
        from dchag.train.launch import start_quiet_resource_tracker

        start_quiet_resource_tracker()
    p = mp.get_context("forkserver").Process(target=leak)
    p.start()
    p.join()
    print("the launcher's last line", file=sys.stderr)
"""


@pytest.mark.parametrize("started_by", ["launcher", "default"])
def test_a_killed_ranks_semaphores_add_no_line_after_the_launchers(tmp_path, started_by):
    """A forked rank that dies holding a multiprocessing lock (tqdm's, numcodecs' Blosc lock)
    leaves its semaphore to the resource tracker, which warns once the launcher has ended: the
    launcher starts it quiet (else the warning follows its one-line error), and it still removes
    the semaphore."""
    script = tmp_path / "leak.py"
    script.write_text(LEAK)
    shm = Path("/dev/shm")
    before = set(shm.glob("sem.mp-*"))
    proc = subprocess.run([sys.executable, str(script), started_by], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    warned = "leaked semaphore" in proc.stderr
    assert warned == (started_by == "default"), proc.stderr  # the default shows the case is real
    assert proc.stderr.strip().splitlines()[-1 if started_by == "launcher" else 0] == "the launcher's last line"
    assert set(shm.glob("sem.mp-*")) <= before  # removed all the same
