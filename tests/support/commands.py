"""The commands the tests run as a user types them: snakemake, dchag launch-train, dchag."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from dchag.config import era5_input_paths

from . import BIN, REPO
from .distributed import free_port, run_dchag_ranks

DEMO = REPO / "config" / "demo.yaml"


# -- snakemake ------------------------------------------------------------------------------------
def snakemake_command(cwd: Path, *args: str, configfile: Path | list[Path] | None = None) -> list[str]:
    """``snakemake ARGS`` on this checkout's Snakefile in ``cwd``, on 2 cores unless ARGS say
    (or name a profile, which does)."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(cwd)]
    if not {"--cores", "--profile", "--workflow-profile"} & set(args):
        cmd += ["--cores", "2"]
    cmd += list(args)
    if configfile is not None:
        cmd += ["--configfile", *map(str, configfile if isinstance(configfile, list) else [configfile])]
    return cmd


def command_env(env: dict | None = None) -> dict:
    """The environment a command runs in: this environment's scripts first on PATH."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}


DRY = {"-n", "--dry-run", "--dryrun", "--list-rules", "--list", "-l"}


def snakemake(
    cwd: Path, *args: str, configfile: Path | list[Path] | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``snakemake ARGS`` (see :func:`snakemake_command`) to its end: a dry run (or a rule
    listing) in this process, through Snakemake's own command line entry point (the same
    parsing and planning, without a Python start and Snakemake's imports each time); anything
    else as a process."""
    cmd = snakemake_command(cwd, *args, configfile=configfile)
    if DRY & set(args):
        return _in_process(cmd, cwd, command_env(env))
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=command_env(env))


def _in_process(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``cmd`` (``python -m snakemake ...``) run by ``snakemake.cli.main`` here, with its
    output, exit status, working folder and environment as a process would have them."""
    import contextlib
    import io

    from snakemake import cli

    out, err, code = io.StringIO(), io.StringIO(), 0
    here, environ = os.getcwd(), dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main(cmd[3:])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())


def workdir(tmp: Path, configs: list[Path]) -> Path:
    """A checkout-like folder (the workflow linked in) with stand-in files at every input path
    the configs name: empty files, enough for a dry run."""
    for name in ("Snakefile", "workflow", "profiles", "config", "src", "benchmarks"):
        (tmp / name).symlink_to(REPO / name)
    for path in configs:
        cfg = yaml.safe_load(path.read_text())
        era5, hsi = cfg.get("era5") or {}, cfg.get("hsi") or {}
        wanted = []
        if era5 and not era5.get("demo"):
            years = [y for split in era5["years"].values() for y in split]
            wanted += [p.replace("*", "standin") for y in years for p in era5_input_paths(era5, y)]
            wanted += [era5["constants"]] if era5.get("constants") else []
        if hsi and not hsi.get("demo"):
            if "classification" in hsi:
                wanted += [hsi["classification"]["image"], hsi["classification"]["labels"]]
            wanted += [p.replace("*", "standin") for p in hsi.get("mae", {}).get("images", [])]
        for p in wanted:
            (tmp / p).parent.mkdir(parents=True, exist_ok=True)
            (tmp / p).touch()
    return tmp


def planned(out: str) -> dict[str, int]:
    """rule -> job count from a dry run's "Job stats" table (``snakemake -n``, with or without
    ``--quiet rules``)."""
    if "Job stats:" in out:
        out = out[out.index("Job stats:") :]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", out, re.M) if m.group(1) != "total"}


# -- training under torchrun ----------------------------------------------------------------------
def run_config(cfg: dict, **train) -> dict:
    """A tiny D-CHAG forecast run "f" (tp 2, 30 steps) on ``cfg``'s data; ``train`` overrides."""
    out = {
        **cfg,
        "model": {"patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 4, "aggregation": "linear"},
        "parallel": {"tp": 2, "strategy": "dchag", "data_parallel": "none"},
        "train": {
            "steps": 30,
            "batch_size": 2,
            "lr": 0.003,
            "warmup_steps": 3,
            "checkpoint_every": 10,
            "val_every": 10,
            "val_batches": 2,
            "seed": 3,
            "forecast": {"outputs": ["z500", "t2m"], "lead_hours": [24, 48]},
            "runs": {"f": {"task": "forecast"}},
        },
    }
    out["train"].update(train)
    return out


def short_run(base, **train) -> dict:
    """:func:`run_config` as a run of one process (the checkpoint policy is the same on any layout)."""
    cfg = run_config(base, checkpoint_every=2, val_every=2, keep_checkpoints=2, nproc=1, **train)
    cfg["parallel"] = {"tp": 1, "strategy": "baseline", "data_parallel": "none"}
    return cfg


def store_args(root: Path) -> list[str]:
    return ["--train-data", str(root / "era5" / "train.zarr"), "--val-data", str(root / "era5" / "val.zarr")]


def train_args(cfg: dict, outdir: Path, root: Path) -> list[str]:
    """``dchag train`` arguments of run "f" of ``cfg`` into ``outdir``, on the stores under ``root``."""
    return ["train", "--config", json.dumps(cfg), "--run-name", "f", "--output", str(outdir), *store_args(root)]


def launch_train_command(
    cfg: dict | Path, outdir: Path, train: Path, val: Path, nproc: int, restarts: int | None = None, run: str = "f"
) -> list[str]:
    """``dchag launch-train`` (torchrun's agent; see :mod:`dchag.train.launch`) of ``run`` of
    ``cfg`` (a config, or its file) into ``outdir`` on the ``train``/``val`` stores, ``nproc``
    ranks of one math thread each; ``restarts``: ``--max-restarts`` (the config's when None)."""
    config = str(cfg) if isinstance(cfg, Path) else json.dumps(cfg)
    cmd = [str(BIN / "dchag"), "launch-train", "--config", config, "--run-name", run, "--output", str(outdir)]
    cmd += ["--train-data", str(train), "--val-data", str(val), "--nproc", str(nproc), "--threads-per-rank", "1"]
    return cmd + (["--max-restarts", str(restarts)] if restarts is not None else [])


def started(cmd: list[str], log: Path, **popen) -> subprocess.Popen:
    """``cmd`` started in the background, its stdout and stderr into the file ``log`` (a file,
    not a pipe: a full pipe would block the process)."""
    with open(log, "w") as out:  # the child holds its own copy
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **popen)


def launch_train(cfg: dict, outdir: Path, root: Path, nproc: int = 2, restarts: int = 1) -> subprocess.Popen:
    """:func:`launch_train_command` on the stores under ``root``, started (see :func:`finish`)."""
    outdir.mkdir(parents=True, exist_ok=True)
    train, val = root / "era5" / "train.zarr", root / "era5" / "val.zarr"
    return started(launch_train_command(cfg, outdir, train, val, nproc, restarts), outdir.parent / f"{outdir.name}.out")


def train_in_ranks(cfg: dict, outdir: Path, root: Path, nproc: int = 2) -> str:
    """``dchag train`` of run "f" of ``cfg`` into ``outdir`` on the stores under ``root``, on
    ``nproc`` gloo ranks without torchrun's agent (:func:`support.distributed.run_dchag_ranks`):
    for tests of what the trainer does, not of the launch. Its ranks' console output."""
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        return run_dchag_ranks(train_args(cfg, outdir, root), nproc, outdir.parent / f"{outdir.name}.out")
    except Exception as err:  # the failure with what the ranks printed
        raise AssertionError((outdir.parent / f"{outdir.name}.out").read_text()[-3000:]) from err


def finish(proc: subprocess.Popen, outdir: Path) -> str:
    """Wait for a :func:`launch_train` run; its console output."""
    proc.wait(timeout=300)
    return (outdir.parent / f"{outdir.name}.out").read_text()


def train_once(cfg, tmp_path, root):
    """``dchag train`` of run "f" as one rank without torchrun (the environment torchrun sets)."""
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    return subprocess.run(
        [sys.executable, "-m", "dchag", *train_args(cfg, tmp_path / "run", root)],
        capture_output=True,
        text=True,
        env=env,
    )


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """A run's final checkpoint as one state dict (model and optimizer)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run / "final.pt"
    dcp_to_torch_save(str(run / "final"), str(out))
    return {k: v for k, v in torch.load(out, weights_only=True).items() if k.startswith(("model.", "optim."))}


# -- dchag ---------------------------------------------------------------------------------------
def dchag(*args: str, limit: int | None = None) -> subprocess.CompletedProcess:
    """``dchag ARGS`` in a subprocess; ``limit``: its file size limit in bytes (``ulimit -f``)."""

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "dchag", *args],
        capture_output=True,
        text=True,
        preexec_fn=limited if limit else None,
    )


def one_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    """Exit status 2 and one line of error (after any progress bars) holding ``words``."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and last.startswith("dchag "), proc.stderr[-3000:]
    for w in words:
        assert w in last, proc.stderr[-3000:]


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of every file under ``path`` (or of the file), by relative name."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {
        str(p.relative_to(path) if path.is_dir() else p.name): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


def mount(path: Path, options: str) -> bool:
    """A tmpfs at ``path`` (root only); whether it could be mounted."""
    path.mkdir()
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )
