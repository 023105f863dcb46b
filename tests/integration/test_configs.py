"""Every shipped config stands alone: it validates, dry-runs with stand-in input files, and
plans only the rules of its own datasets and runs (nothing of the demo is merged in). The
shell commands of the README and of docs/ are run as written (snakemake ones as dry runs)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from support import REPO
from support.commands import planned, snakemake, workdir

from dchag.config import load_config, settings, validate

CONFIGS = sorted((REPO / "config").glob("*.yaml"))
ERA5_RULES = {
    "era5_demo_year",
    "era5_demo_constants",
    "download_era5_year",
    "era5_weights",
    "era5_year",
    "era5_year_stats",
    "era5_stats",
    "era5_split_part",
    "era5_split",
    "era5_climatology_part",
    "era5_climatology",
    "era5_truth",
    "forecast",
    "baseline_forecast",
    "score",
    "compare_scores",
    "fig_lead_time",
    "fig_forecast_maps",
}
HSI_RULES = {
    "hsi_demo",
    "hsi_classification",
    "hsi_mae",
    "evaluate_mae",
    "evaluate_classification",
    "hsi_scores",
    "fig_hsi_reconstruction",
    "fig_classification",
}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_config_validates_and_plans_only_its_own_datasets(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    s = settings(validate(raw, str(path), check_files=False))
    cwd = workdir(tmp_path, [path])
    # one dry run: its job stats (rule -> count) and the shell commands it prints
    proc = snakemake(cwd, "-n", "--printshellcmds", "--cores", "4", "--configfile", f"config/{path.name}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Job stats:" in out, out[-3000:]
    rules = planned(out[out.index("Job stats:") :])
    assert rules, out
    assert ("era5" in raw) == bool(rules.keys() & ERA5_RULES), rules
    assert ("hsi" in raw) == bool(rules.keys() & HSI_RULES), rules
    assert rules.get("train", 0) == len(s.train.runs), rules
    if not raw.get("era5", {}).get("demo") and not raw.get("hsi", {}).get("demo"):
        assert not rules.keys() & {"era5_demo_year", "era5_demo_constants", "hsi_demo"}, rules
    # every result lands under the config's own name
    assert "results/demo/" not in proc.stdout or raw["name"] == "demo"


def test_no_config_given_runs_the_demo(tmp_path):
    cwd = workdir(tmp_path, [])
    proc = snakemake(cwd, "-n", "--quiet", "rules", "--cores", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rules = planned(proc.stdout + proc.stderr)
    assert rules["era5_demo_year"] == 4 and rules["hsi_demo"] == 1 and rules["train"] == 6, rules


def test_a_key_deleted_from_a_dataset_config_is_gone(tmp_path):
    """No demo value comes back for a key the user's file leaves out (the demo sets a preset)."""
    cfg = yaml.safe_load((REPO / "config" / "indian_pines.yaml").read_text())
    del cfg["hsi"]["preset"]
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(cfg))
    (tmp_path / "w").mkdir()
    cwd = workdir(tmp_path / "w", [mine])
    proc = snakemake(cwd, "hsi_classification", "-n", "--printshellcmds", "--cores", "2", "--configfile", str(mine))
    assert proc.returncode == 0, proc.stderr[-3000:]
    command = next(line for line in proc.stdout.splitlines() if "preprocess-hsi" in line).split()
    rule_config = json.loads((cwd / command[command.index("--config") + 1]).read_text())  # what the rule's job reads
    assert rule_config["hsi"].get("preset") is None  # the schema's default, not the demo's indian_pines
    assert rule_config["hsi"]["classification"]["labels"].endswith("Indian_pines_gt.mat")


def test_dataset_only_config_parses_and_plans_preprocessing_only(tmp_path):
    """A file with just `name` and an `hsi` section (or an `era5` one): no model, no runs."""
    cfg = yaml.safe_load((REPO / "config" / "pavia_university.yaml").read_text())
    mine = tmp_path / "pavia_only.yaml"
    mine.write_text(yaml.safe_dump({"name": "p", "hsi": cfg["hsi"]}))
    era5 = yaml.safe_load((REPO / "config" / "era5.yaml").read_text())
    era5_only = tmp_path / "era5_only.yaml"
    era5_only.write_text(yaml.safe_dump({"name": "e", "era5": era5["era5"]}))
    cwd = tmp_path / "w"
    cwd.mkdir()
    workdir(cwd, [mine, era5_only])
    for f, expected in (
        (mine, {"hsi_classification"}),
        (
            era5_only,
            {
                "era5_weights",
                "era5_year",
                "era5_year_stats",
                "era5_stats",
                "era5_split_part",
                "era5_split",
                "era5_climatology_part",
                "era5_climatology",
            },
        ),
    ):
        proc = snakemake(cwd, "-n", "--quiet", "rules", "--cores", "2", "--configfile", str(f))
        assert proc.returncode == 0, proc.stderr[-3000:]
        rules = set(planned(proc.stdout + proc.stderr)) - {"all", "total"}
        assert rules == expected, rules


def test_missing_input_named_once(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "indian_pines.yaml").read_text())
    cfg["hsi"]["mae"] = {"images": [cfg["hsi"]["classification"]["image"]]}
    mine = tmp_path / "c.yaml"
    mine.write_text(yaml.safe_dump(cfg))
    from dchag.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(mine)
    assert str(err.value).count("Indian_pines_corrected.mat") == 1, err.value


# -- the README and docs/ ----------------------------------------------------------------
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_commands() -> list[str]:
    """Every line of every ```bash block of the README and the pages of docs/."""
    cmds = []
    for path in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    cmds.append(line)
    return cmds


def docs_config_files() -> dict[str, str]:
    """The config files the pages have a user write: a ```yaml block whose first line is
    `# FILE.yaml` (the tutorial's own config)."""
    files = {}
    for path in DOCS:
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            first = block.splitlines()[0]
            if re.fullmatch(r"# [\w.-]+\.yaml", first):
                files[first[2:]] = block
    return files


def test_readme_snakemake_commands_dry_run_as_written(tmp_path):
    cmds = readme_commands()
    snake = [c for c in cmds if c.startswith("snakemake")]
    assert len(snake) >= 4, cmds
    (tmp_path / "w").mkdir()
    written = docs_config_files()
    assert "mine.yaml" in written, written  # the tutorial's config, run below as the tutorial runs it
    for name, text in written.items():
        (tmp_path / "w" / name).write_text(text)
    configs = sorted({REPO / m for c in snake for m in re.findall(r"config/[\w.]+\.yaml", c)})
    configs += [tmp_path / "w" / name for name in written]
    cwd = workdir(tmp_path / "w", configs)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    # the profile a user installs first (the Slurm page's block does)
    installed = subprocess.run(
        [sys.executable, "-m", "dchag", "install-profile", "slurm"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert installed.returncode == 0, installed.stderr
    for cmd in snake:
        args = shlex.split(cmd)[1:]
        proc = snakemake(cwd, *args, "-n", env=env)
        assert proc.returncode == 0, f"{cmd}\n{(proc.stdout + proc.stderr)[-3000:]}"


def test_readme_dchag_subcommands_exist():
    from dchag.cli import build_parser

    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    for cmd in readme_commands():
        words = shlex.split(cmd.replace("|", " "))
        for i, w in enumerate(words):
            if w == "dchag" and i + 1 < len(words):
                assert words[i + 1] in subcommands, cmd


@pytest.mark.minutes(0.75)
def test_a_users_own_one_dataset_config_runs_through_training_and_scoring(tmp_path):
    """Another grid (2.8125 deg), another channel set, one run, the user's netCDF files: the
    whole pipeline from `snakemake --configfile mine.yaml`, nothing of the demo built. The
    files lie in a folder whose name has a space, quotes and a command substitution: the jobs
    read them and run nothing."""
    from dchag.era5 import demo
    from dchag.store import open_store

    cwd = tmp_path / "w"
    cwd.mkdir()
    workdir(cwd, [])
    folder = 'my data\'s "x" $(touch PWNED)'
    raw = cwd / folder
    for year in (2001, 2002, 2003):
        demo.write_year(raw, year, 3.75, [500, 850], time_step_hours=24, days=40)
    mine = cwd / "mine.yaml"
    mine.write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "era5": {
                    "inputs": [f"{folder}/pressure_levels_{{year}}.nc", f"{folder}/single_levels_{{year}}.nc"],
                    "years": {"train": [2001], "val": [2002], "test": [2003]},
                    "time_step_hours": 24,
                    "grid": 2.8125,
                    "channels": {
                        "pressure_level": {"variables": ["geopotential", "temperature"], "levels": [500, 850]},
                        "single_level": ["2m_temperature"],
                    },
                },
                "model": {
                    "patch_size": 8,
                    "embed_dim": 32,
                    "depth": 1,
                    "num_heads": 4,
                    "aggregation": "linear",
                    "groups": 2,
                },
                "parallel": {"tp": 1, "strategy": "baseline", "data_parallel": "none"},
                "train": {
                    "nproc": 1,
                    "steps": 6,
                    "batch_size": 4,
                    "warmup_steps": 1,
                    "checkpoint_every": 3,
                    "val_every": 3,
                    "val_batches": 1,
                    "forecast": {"outputs": ["z500", "t850"], "lead_hours": [24, 96]},
                    "runs": {"fc": {"task": "forecast"}},
                },
                "evaluate": {"lead_hours": [24, 48], "conventions": ["wb2"]},
            }
        )
    )
    proc = snakemake(cwd, "--cores", "2", "--configfile", "mine.yaml")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert not list(tmp_path.rglob("PWNED"))
    results = cwd / "results" / "mine"
    assert not (cwd / "results" / "demo").exists() and not (cwd / "resources").exists()
    test = open_store(results / "era5" / "test.zarr")
    assert test.data.shape[1:] == (5, 64, 128) and list(test.channel.values) == ["z500", "z850", "t500", "t850", "t2m"]
    import pandas as pd

    scores = pd.read_csv(results / "eval" / "era5" / "scores_fc_wb2.csv")
    assert set(scores.variable) == {"z500", "t850"} and set(scores.lead_time_hours) == {24, 48}
    assert scores[scores.metric == "rmse"].value.gt(0).all()
    assert (results / "figures" / "lead_time_wb2.png").exists()
