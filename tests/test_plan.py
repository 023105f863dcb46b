"""The pipeline's plan (dchag.plan): run lists, comparisons, the verification design and the
per-rule config files, from configs as users write them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from dchag import plan
from dchag.config import ConfigError, run_settings, settings, validate


def _demo(**edits) -> dict:
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    for key, value in edits.items():
        cfg[key] = value
    return validate(cfg, "demo", check_files=False)


def test_demo_runs_and_comparisons():
    s = settings(_demo())
    assert plan.forecast_runs(s) == ["forecast-baseline", "forecast-dchag"]
    assert plan.runs_of(s, "mae") == ["mae-baseline", "mae-dchag"]
    assert plan.runs_of(s, "classify") == ["classify-baseline", "classify-dchag"]
    assert plan.comparisons(s) == {"forecast-dchag": "forecast-baseline"}
    assert plan.verify_runs(s) == {} and plan.all_runs(s) == s.train.runs


def test_comparisons_need_exactly_one_baseline_or_an_explicit_table():
    cfg = _demo()
    cfg["train"]["runs"]["forecast-tp"] = {"task": "forecast", "parallel": {"strategy": "baseline"}}
    assert plan.comparisons(settings(cfg)) == {}  # two baselines: ambiguous, no table
    cfg["evaluate"]["compare"] = {"forecast-dchag": "forecast-tp"}
    assert plan.comparisons(settings(cfg)) == {"forecast-dchag": "forecast-tp"}
    cfg["evaluate"]["compare"] = {"forecast-dchag": "nope"}
    with pytest.raises(ConfigError, match=r"evaluate.compare.*\['nope'\]"):
        plan.comparisons(settings(cfg))


def test_a_run_named_like_a_reference_forecast_is_refused():
    cfg = _demo()
    cfg["train"]["runs"]["persistence"] = {"task": "forecast"}
    with pytest.raises(ConfigError, match="train.runs.persistence"):
        plan.forecast_runs(settings(cfg))


def test_verification_design():
    s = settings(_demo(verify={"batch_size": 8, "steps": 7, "groups": 3, "comm_hook": "fp16", "bucket_mb": 2}))
    runs = plan.verify_runs(s)
    assert list(runs) == ["verify-dp", "verify-fixed-group", "verify-compress", "verify-dchag-l"]
    nproc = s.train.nproc
    for name, spec in runs.items():
        r = run_settings({**s.raw, "train": {**s.raw["train"], "runs": runs}}, name)
        # the same steps and global batch for every method; instruments on
        assert r.train.steps == 7 and r.train.measure_comm and r.train.measure_memory
        per_rank = r.train.batch_size * (nproc if r.parallel.dp == "ddp" else 1)
        assert per_rank == 8, name
    assert runs["verify-fixed-group"]["model"] == {"aggregation": "linear", "groups": 3}
    assert runs["verify-compress"]["parallel"] == {"tp": 1, "strategy": "baseline", "dp": "ddp", "comm_hook": "fp16",
                                                   "ddp_bucket_mb": 2}
    assert runs["verify-dchag-l"]["parallel"] == {"tp": nproc, "strategy": "dchag", "dp": "none"}
    with pytest.raises(ConfigError, match="verify.batch_size.*7"):
        plan.verify_runs(settings(_demo(verify={"batch_size": 7})))


def test_verification_repeats_wait_for_the_previous_repeat_of_every_method():
    runs = plan.verify_runs(settings(_demo(verify={"repeats": 3})))
    assert len(runs) == 12
    assert plan.previous_repeat("verify-dp-r1", runs) == []
    assert sorted(plan.previous_repeat("verify-compress-r3", runs)) == sorted(
        f"verify-{m}-r2" for m in ("dp", "fixed-group", "compress", "dchag-l"))
    assert plan.previous_repeat("forecast-dchag", runs) == []


def test_a_runs_config_holds_only_that_run_and_its_dataset():
    s = settings(_demo())
    cfg = plan.run_config(s, "mae-dchag")
    assert set(cfg) == {"name", "hsi", "model", "parallel", "train"} and list(cfg["train"]["runs"]) == ["mae-dchag"]
    assert plan.run_config(s, "forecast-dchag").keys() >= {"era5"} and "hsi" not in plan.run_config(s, "forecast-dchag")
    # another run's change leaves this run's config, hence its file and its job, untouched
    other = copy.deepcopy(s.raw)
    other["train"]["runs"]["mae-baseline"]["train"] = {"lr": 0.5}
    assert plan.run_config(settings(other), "mae-dchag") == cfg
    assert plan.run_train_settings(s, "forecast-dchag").nproc == s.train.nproc


def test_config_files_are_content_addressed(tmp_path):
    a = plan.write_config({"name": "x", "era5": {"grid": 5.625}}, "era5", tmp_path)
    b = plan.write_config({"era5": {"grid": 5.625}, "name": "x"}, "era5", tmp_path)
    c = plan.write_config({"name": "x", "era5": {"grid": 2.8125}}, "era5", tmp_path)
    assert a == b != c and a.exists() and c.exists() and a.name.startswith("era5-")
    assert not list(Path(tmp_path).glob(".*.tmp"))
