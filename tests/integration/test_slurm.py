"""The workflow on a real Slurm cluster (one node, this machine): `snakemake --profile slurm`
with the shipped profile, training as a multi-process torchrun inside a Slurm allocation, a
cancelled training job resubmitted and resumed to the weights of the same run trained here
without Slurm, and a failing job reported with its Slurm log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from support import REPO, slurm_cluster
from support.commands import launch_train_command, snakemake_command, started

RUN = "forecast-dchag"

why_not = slurm_cluster.available()
if why_not and os.environ.get("DCHAG_REQUIRE_SLURM"):
    raise RuntimeError(f"DCHAG_REQUIRE_SLURM is set but a Slurm test cluster cannot start: {why_not}")
pytestmark = [pytest.mark.minutes(2), pytest.mark.skipif(why_not is not None, reason=f"Slurm test cluster: {why_not}")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster.cluster(tmp_path_factory.mktemp("slurm")) as host:
        yield host


def small_config(path: Path) -> Path:
    """The demo, cut to 45 days of three years and one D-CHAG forecast run long enough to
    checkpoint and be cancelled."""
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    cfg.pop("hsi")
    cfg["era5"].update(years={"train": [2016], "val": [2017], "test": [2018]}, demo_days=45)
    cfg["train"].update(steps=40, checkpoint_every=10, val_every=20, runs={RUN: {"task": "forecast"}})
    cfg["evaluate"] = {"lead_hours": [168], "conventions": ["wb2"]}  # no comparison: one forecast run
    path.write_text(yaml.safe_dump(cfg))
    return path


def env_with_profile(tmp_path: Path) -> dict:
    xdg = tmp_path / "xdg"
    env = {**os.environ, "XDG_CONFIG_HOME": str(xdg), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run(
        [sys.executable, "-m", "dchag", "install-profile", "slurm"], env=env, check=True, capture_output=True
    )
    assert (xdg / "snakemake" / "slurm" / "profile.yaml").exists()
    return env


# What the test checks, not `all`: the preprocessing jobs and the training (evaluation's jobs are
# jobs like the preprocessing's, with the default resources: CI's time).
TARGETS = [f"results/demo/train/{RUN}/final"]
SLURM_ARGS = [
    "--profile",
    "slurm",
    "--slurm-status-command",
    "squeue",
    "--slurm-no-account",
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--seconds-between-status-checks",
    "2",
    "--jobs",
    "4",
]


def _final_tensors(run_dir: Path) -> dict:
    """The final checkpoint's weights as one device's model (a forecast model's shape is the
    config's: no store needed)."""
    from dchag.config import load_config
    from dchag.model import ChannelViT
    from dchag.runs import resolve
    from dchag.train import checkpoint as ckpt
    from dchag.train.tasks import build_task

    run = resolve(load_config(str(run_dir.parents[3] / "small.yaml")), RUN)
    model = ChannelViT(build_task(run.settings, {}).model_cfg)
    ckpt.load_weights(model, run_dir / "final")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _reference_run(remote: Path, local: Path, env: dict, log: Path) -> subprocess.Popen:
    """The same training run here without Slurm, uninterrupted: the run's own config file and the
    stores the Slurm jobs made, launched as the train rule launches it (started while the Slurm
    run goes on: its stores are complete once its training has checkpointed)."""
    (run_config,) = (remote / ".snakemake" / "dchag-config").glob(f"run-{RUN}-*.json")
    era5 = remote / "results" / "demo" / "era5"
    out = local / "results" / "demo" / "train" / RUN
    cmd = launch_train_command(run_config, out, era5 / "train.zarr", era5 / "val.zarr", 2, restarts=0, run=RUN)
    return started(cmd, log, env=env)


def _failing_run(config: Path, env: dict, work: Path) -> subprocess.Popen:
    """A workflow whose first job, a Slurm job, fails at run time: its ERA5 files exist (the plan
    refuses a missing one before any job) but are no netCDF. It runs beside the main run, in a
    folder of its own: Snakemake ends some 20 s after a failed job (its status checks' backoff)."""
    cfg = yaml.safe_load(config.read_text())
    cfg["era5"].update(demo=False, inputs=["raw/era5_{year}.nc"])
    del cfg["era5"]["constants"], cfg["era5"]["channels"]["constants"]
    (work / "raw").mkdir(parents=True)
    for year in (2016, 2017, 2018):
        (work / "raw" / f"era5_{year}.nc").write_text("not netCDF")
    (work / "bad.yaml").write_text(yaml.safe_dump(cfg))
    cmd = snakemake_command(work, "era5_weights", *SLURM_ARGS, "--retries", "0", configfile=work / "bad.yaml")
    return started(cmd, work.parent / "failing.log", env=env)


def test_pipeline_on_slurm_equals_local_and_survives_a_cancelled_job(cluster, tmp_path):
    config = small_config(tmp_path / "small.yaml")
    env = env_with_profile(tmp_path)
    local, remote = tmp_path / "local", tmp_path / "slurm"
    for d in (local, remote):
        d.mkdir()
        (d / "small.yaml").write_text(config.read_text())
    failing = _failing_run(config, env, tmp_path / "failing")
    run = started(
        snakemake_command(remote, *TARGETS, *SLURM_ARGS, configfile=config), tmp_path / "slurm_run.log", env=env
    )
    # Cancel the training job once it has written a checkpoint: Slurm ends it, Snakemake
    # resubmits it (profile: retries), the new job resumes from the checkpoint.
    ckpt = remote / "results" / "demo" / "train" / RUN / "checkpoints" / "step_10" / ".metadata"
    cancelled = reference = None
    deadline = time.time() + 1800  # a safety limit, not a timing: under CI's load the run takes ~2 min
    while run.poll() is None and time.time() < deadline:
        if cancelled is None and ckpt.exists():
            jobs = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True, text=True).stdout.split("\n")
            train = [j.split()[0] for j in jobs if "rule_train" in j]
            if train:
                subprocess.run(["scancel", train[0]], check=True)
                cancelled = train[0]
                reference = _reference_run(remote, local, env, tmp_path / "reference.log")
        time.sleep(1)
    if run.poll() is None:
        run.kill()
    out = (tmp_path / "slurm_run.log").read_text()
    assert run.returncode == 0, out[-4000:]
    assert cancelled is not None, "the training job was never seen running with a checkpoint"
    # Rules of seconds run in Snakemake's own process, every other rule as a Slurm job.
    assert "localrule era5_stats:" in out and "localrule era5_demo_year:" in out, out[-4000:]
    assert "\nrule era5_year:" in out and "\nrule train:" in out, out[-4000:]
    # The resubmitted job resumed (the training log says so) and its weights equal those of the
    # same training run here without Slurm, uninterrupted (_reference_run).
    train_log = (remote / "logs" / "demo" / f"train_{RUN}.log").read_text()
    assert "resum" in train_log.lower(), train_log[-2000:]
    assert reference.wait(timeout=900) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    a = _final_tensors(local / "results" / "demo" / "train" / RUN)
    b = _final_tensors(remote / "results" / "demo" / "train" / RUN)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Training ran inside a Slurm allocation: one Slurm log per job, the training job's among them.
    assert list((remote / "logs" / "slurm").rglob("*.log")), "no Slurm job logs"

    # A failing job: Snakemake fails and names the job's Slurm log and the job's error.
    failing.wait(timeout=600)
    text = (tmp_path / "failing.log").read_text()
    assert failing.returncode != 0 and "era5_weights" in text and "logs/slurm" in text, text[-3000:]
    assert "cannot read ERA5 input raw/era5_2016.nc" in text, text[-3000:]
