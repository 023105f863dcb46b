"""The CLI's error contract: every subcommand given a user's mistake (a missing file, an
unknown run, an inconsistent setting) exits with status 2 and one line naming what is at
fault — never a traceback. Any other exception is a bug and keeps its traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO

from dchag import cli
from dchag.errors import DchagError

MISSING = "/nonexistent/dchag-test"
HSI_ONLY = {
    "name": "t",
    "hsi": {"demo": True, "classification": {"image": f"{MISSING}/scene.mat", "labels": f"{MISSING}/gt.mat"}},
}
BAD_MODEL = {**HSI_ONLY, "model": {"embed_dim": 30, "num_heads": 4}}
ERA5 = {
    "name": "t",
    "era5": {
        "demo": True,
        "inputs": [f"{MISSING}/pl_{{year}}.nc"],
        "years": {"train": [2001], "val": [2002], "test": [2003]},
        "channels": {"single_level": ["2m_temperature"]},
    },
}
RUNS = {**HSI_ONLY, "train": {"runs": {"a": {"task": "classification"}}}}


def _cases(tmp):
    cfg = lambda c: json.dumps(c)  # noqa: E731 - inline JSON configs, as the CLI accepts them
    profile = tmp / "profiles"  # holds an installed slurm profile (made by the test)
    return {
        "demo-era5": ["--config", f"{MISSING}/config.yaml", "--outdir", str(tmp)],
        "era5-weights": ["--config", cfg(HSI_ONLY), "--year", "2001", "--output", str(tmp / "w.nc")],
        "era5-year": [
            "--config",
            cfg(ERA5),
            "--year",
            "2001",
            "--weights",
            f"{MISSING}/w.nc",
            "--output",
            str(tmp / "y.zarr"),
        ],
        "era5-year-stats": ["--config", cfg(ERA5), "--output", str(tmp / "s.json"), f"{MISSING}/2001.zarr"],
        "era5-stats": ["--config", cfg(ERA5), "--output", str(tmp / "s.json"), f"{MISSING}/2001.json"],
        "era5-split-part": [
            "--config",
            cfg(ERA5),
            "--split",
            "train",
            "--year",
            "2001",
            "--stats",
            f"{MISSING}/s.json",
            "--output",
            str(tmp / "part.zarr"),
            f"{MISSING}/2001.zarr",
        ],
        "era5-split": [
            "--config",
            cfg(ERA5),
            "--split",
            "train",
            "--stats",
            f"{MISSING}/s.json",
            "--output",
            str(tmp / "train.zarr"),
            "--parts",
            f"{MISSING}/part.zarr",
            "--years",
            f"{MISSING}/2001.zarr",
        ],
        "era5-climatology-part": [
            "--config",
            cfg(ERA5),
            "--part",
            "1",
            "--parts",
            "1",
            "--output",
            str(tmp / "p.zarr"),
            f"{MISSING}/2001.zarr",
        ],
        "era5-climatology": ["--config", cfg(ERA5), "--output", str(tmp / "c.zarr"), f"{MISSING}/1.zarr"],
        "regrid": [f"{MISSING}/in.nc", "--grid", "5.625", "--output", str(tmp / "out.nc")],
        "demo-hsi": ["--outdir", str(tmp / "hsi"), "--size", "8"],  # a range beyond the flag's own
        "preprocess-hsi": [
            f"{MISSING}/Indian_pines_corrected.mat",
            "--labels",
            f"{MISSING}/gt.mat",
            "--output",
            str(tmp / "p.zarr"),
        ],
        "train": ["--config", cfg(RUNS), "--run-name", "nope", "--output", str(tmp / "run")],
        "launch-train": ["--config", cfg(RUNS), "--run-name", "nope", "--output", str(tmp / "run")],
        "train-summary": [f"{MISSING}/log.csv", "--output", str(tmp / "summary.csv")],
        "describe-model": ["--config", cfg(BAD_MODEL), "--task", "classification", "--num-classes", "3"],
        "download-era5": ["--config", cfg(HSI_ONLY), "--year", "2001", "--output", str(tmp / "d.nc")],
        "era5-truth": ["--data", f"{MISSING}/test.zarr", "--variables", "z500", "--output", str(tmp / "truth.zarr")],
        "baseline-forecast": [
            "--kind",
            "persistence",
            "--data",
            f"{MISSING}/test.zarr",
            "--variables",
            "z500",
            "--lead-hours",
            "24",
            "--output",
            str(tmp / "p.zarr"),
        ],
        "score": [
            "--forecast",
            f"{MISSING}/f.zarr",
            "--truth",
            f"{MISSING}/t.zarr",
            "--convention",
            "wb2",
            "--output",
            str(tmp / "s.csv"),
        ],
        "compare-scores": [
            "--baseline",
            f"{MISSING}/a.nc",
            "--candidate",
            f"{MISSING}/b.nc",
            "--output",
            str(tmp / "c.csv"),
        ],
        "score-recon": ["--truth", f"{MISSING}/t.npy", "--pred", f"{MISSING}/p.npy", "--output", str(tmp / "r.json")],
        "evaluate-mae": [
            "--model",
            f"{MISSING}/model",
            "--data",
            f"{MISSING}/mae.zarr",
            "--output",
            str(tmp / "m.json"),
            "--samples",
            str(tmp / "m.npz"),
        ],
        "evaluate-classification": [
            "--model",
            f"{MISSING}/model",
            "--data",
            f"{MISSING}/classification.zarr",
            "--output",
            str(tmp / "c.json"),
            "--per-class",
            str(tmp / "c.csv"),
            "--map",
            str(tmp / "c.npz"),
        ],
        "hsi-scores": [f"{MISSING}/recon.json", "--output", str(tmp / "h.csv")],
        "calibrate": ["--config", f"{MISSING}/config.yaml", "--output", str(tmp / "hw.yaml")],
        "advise": ["--gpus", "8", "--gpus-per-node", "4"],
        "estimate-memory": ["--config", f"{MISSING}/config.yaml", "--run", "f"],
        "verify-report": [f"verify-dp={MISSING}/run", "--output", str(tmp / "v.csv"), "--figure", str(tmp / "v.png")],
        "install-profile": ["slurm", "--dest", str(profile)],
        "figure": ["loss-curves", f"{MISSING}/log.csv", "--output", str(tmp / "f.png")],
        "paper-point": [
            "--config",
            cfg({**RUNS, "paper": {"sweeps": {"tree": [{"variant": "dchag-l"}]}}}),
            "--point",
            "nope",
            "--output",
            str(tmp / "p.json"),
        ],
        "paper-figure": ["tree", f"{MISSING}/point.json", "--output", str(tmp / "t.png")],
        "wb2-climatology": ["--climatology", f"{MISSING}/c.zarr", "--output", str(tmp / "c.zarr")],
        "export": [
            "--config",
            cfg(RUNS),
            "--run-name",
            "nope",
            "--checkpoint",
            f"{MISSING}/final",
            "--output",
            str(tmp / "model"),
        ],
        "predict": ["--model", f"{MISSING}/model", "--image", f"{MISSING}/x.hdr", "--output", str(tmp / "p.zarr")],
        "push-model": ["--model", f"{MISSING}/model", "--repo", "o/m"],  # the folder is loaded before any upload
        "pull-model": ["--repo", "not a repo id!", "--output", str(tmp / "pulled")],  # refused before the network
        "check-config": ["--config", f"{MISSING}/config.yaml"],
    }


def test_every_subcommand_has_a_bad_input_case(tmp_path):
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(_cases(tmp_path))


@pytest.mark.parametrize("command", sorted(_cases(__import__("pathlib").Path("/tmp"))))
def test_a_users_mistake_is_one_line_and_exit_2(command, tmp_path, capsys):
    (tmp_path / "profiles" / "slurm").mkdir(parents=True)
    status = cli.main([command, *_cases(tmp_path)[command]])  # anything but a DchagError raises here
    err = capsys.readouterr().err.strip()
    assert status == 2
    message = err[err.index(f"dchag {command}: error: ") :]  # progress or log lines may come before it
    assert len(message.splitlines()[0]) > len(f"dchag {command}: error: ") + 10, err
    assert "Traceback" not in err


def test_the_installed_command_prints_no_traceback(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dchag",
            "score-recon",
            "--truth",
            f"{MISSING}/t.npy",
            "--pred",
            f"{MISSING}/p.npy",
            "--output",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"dchag score-recon: error: {MISSING}/t.npy: file not found"] or (
        "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    ), out.stderr


@pytest.mark.parametrize("config, status", [("config/demo.yaml", 0), (f"{MISSING}/c.yaml", 2)])
def test_the_program_ends_as_an_exit_does_without_the_teardown(config, status):
    """`dchag` skips the interpreter's teardown (dchag.cli.run), not an exit's duties: a thread
    still running is waited for, exit handlers run, buffered output reaches the pipe, and the
    status is the command's."""
    script = (
        "import atexit, sys, threading, time\n"
        "from dchag.cli import run\n"
        "atexit.register(print, 'exit handler ran')\n"
        "threading.Thread(target=lambda: (time.sleep(1), print('thread finished'))).start()\n"
        "print('x' * 100000, end='')\n"
        "sys.argv[0] = 'dchag'\n"
        "run()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "check-config", "--config", config],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},  # output buffered, as by default
    )
    assert out.returncode == status, out.stderr
    assert out.stdout.startswith("x" * 100000), out.stdout[:300]
    assert out.stdout.endswith("thread finished\nexit handler ran\n"), out.stdout[-300:]
    assert ("config/demo.yaml: valid" in out.stdout) == (status == 0)
    assert len(out.stderr.splitlines()) == (1 if status else 0), out.stderr  # the one-line error


def test_a_bug_keeps_its_traceback(monkeypatch):
    def broken(args):
        raise ZeroDivisionError("a bug")

    from dchag.cli import evaluate

    monkeypatch.setattr(evaluate, "cmd_hsi_scores", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["hsi-scores", "x.json", "--output", "y.csv"])
    assert not issubclass(ZeroDivisionError, DchagError)


def test_help_lists_the_commands_for_people_and_names_the_pipeline_steps_apart(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    listing, steps = text.split("pipeline steps")
    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert set(cli.FOR_PEOPLE) < commands  # every name in the table is a command
    for name in commands:
        if name in cli.FOR_PEOPLE:
            assert f"\n    {name} " in listing or f"\n    {name}\n" in listing, name
        else:  # a step: named once, at the end, and still a command with its own help
            assert f"\n    {name} " not in listing and name in steps.replace("\n", " "), name
    with pytest.raises(SystemExit):
        cli.main(["era5-year", "--help"])
    assert "regrid one year" in capsys.readouterr().out
