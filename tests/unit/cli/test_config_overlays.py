"""Several config files and --set on every subcommand that takes --config: merged as Snakemake
merges `--configfile a b` (its own update_config is the reference), then KEY=VALUE words."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from snakemake.utils import update_config
from support import REPO

from dchag.cli import main
from dchag.config import ConfigError, load_config, validate

BASE = "config/demo.yaml"


def _files(tmp_path):
    from support import REPO

    base = yaml.safe_load((REPO / BASE).read_text())
    over = {
        "model": {"embed_dim": 48, "decoder": {"depth": 2}},
        "train": {"steps": 7, "runs": {"extra": {"task": "forecast", "train": {"nproc": 1}}}},
        "era5": {"years": {"train": [2016]}},
    }
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(base))
    b.write_text(yaml.safe_dump(over))
    return a, b, base, over


def test_files_merge_as_snakemake_merges_them_then_set_wins(tmp_path):
    a, b, base, over = _files(tmp_path)
    expected = copy.deepcopy(base)
    update_config(expected, over)
    expected["train"]["batch_size"] = 3
    expected["model"]["decoder"]["dim"] = 24
    got = load_config([a, b], ["train.batch_size=3", "model.decoder.dim=24"])
    assert got == validate(expected)
    # nested mappings merged key by key, lists and scalars replaced, later files winning
    assert got["model"]["embed_dim"] == 48 and got["model"]["decoder"]["depth"] == 2
    assert got["era5"]["years"]["train"] == [2016] and got["era5"]["years"]["val"] == base["era5"]["years"]["val"]
    assert set(got["train"]["runs"]) == set(base["train"]["runs"]) | {"extra"}
    # values are read as YAML: numbers, booleans, lists
    got = load_config([a], ["train.lr=1.0e-4", "train.tensorboard=false", "train.betas=[0.8, 0.9]"])
    assert got["train"]["lr"] == 1e-4 and got["train"]["tensorboard"] is False and got["train"]["betas"] == [0.8, 0.9]


@pytest.mark.parametrize(
    "item, message",
    [
        ("train.steps", r"--set 'train.steps': expected KEY=VALUE"),
        ("train..steps=3", r"expected KEY=VALUE with a dotted KEY"),
        ("train.steps.x=3", r"--set 'train.steps.x=3': train.steps is not a section"),
        ("train.steps=[1", r"--set 'train.steps=\[1': the value is not valid YAML"),
        ("train.steps=0", r"a.yaml --set train.steps=0 is not a valid dchag config:\n  key 'train.steps'"),
        ("train.stpes=3", r"key 'train': Additional properties are not allowed \('stpes' was unexpected\)"),
    ],
)
def test_a_bad_set_is_one_error_naming_it(tmp_path, item, message):
    a, *_ = _files(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_config([a], [item])


def test_a_subcommand_takes_several_files_and_set(tmp_path, capsys):
    from dchag.checks import block_parameters

    a, b, *_ = _files(tmp_path)
    run = ["describe-model", "--task", "forecast", "--json"]
    assert main([*run, "--config", str(a), str(b), "--set", "model.depth=3"]) == 0
    three = json.loads(capsys.readouterr().out)[0]["backbone"]
    assert main([*run, "--config", str(a), str(b)]) == 0
    two = json.loads(capsys.readouterr().out)[0]["backbone"]
    # one more block of b.yaml's width 48: both files and the --set made the model
    assert three - two == block_parameters(48, load_config([a])["model"]["mlp_ratio"])
    assert main([*run, "--config", str(a), "--set", "model.depth=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set model.depth=0" in err[0] and "model.depth" in err[0], err


def test_check_config_names_the_yaml_line_snakemake_does_not(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("era5:\n  inputs: [resources/era5/era5_{year}.grib]\n")  # a flow mapping in a flow list
    assert main(["check-config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dchag check-config: error: config file") and f'"{bad}", line 2, column' in err
    assert main(["check-config", "--config", str(REPO / "config" / "demo.yaml"), "--set", "train.steps=0"]) == 2
    assert "key 'train.steps': 0 is less than the minimum of 1" in capsys.readouterr().err
    assert main(["check-config", "--config", str(REPO / "config" / "demo.yaml")]) == 0
    assert "valid; results in results/demo/; runs: forecast-baseline (forecast)" in capsys.readouterr().out
