"""The pipeline's plan (dchag.plan): run lists, comparisons, the verification design and the
per-rule config files, from configs as users write them."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from support import REPO

from dchag import jobs, plan
from dchag.config import ConfigError, run_settings, settings, validate


def _demo(**edits) -> dict:
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    for key, value in edits.items():
        cfg[key] = value
    return validate(cfg, "demo", check_files=False)


def _demo_with_foundation() -> dict:
    """The demo with config/foundation.yaml's runs and evaluate.foundation added."""
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    foundation = yaml.safe_load((REPO / "config" / "foundation.yaml").read_text())
    cfg["train"]["runs"].update(foundation["train"]["runs"])
    cfg["evaluate"]["foundation"] = foundation["evaluate"]["foundation"]
    return validate(cfg, "demo", check_files=False)


def test_demo_runs_and_comparisons():
    s = settings(_demo_with_foundation())
    assert plan.forecast_runs(s) == ["forecast-baseline", "forecast-dchag", "forecast-subset", "forecast-full-ft"]
    assert plan.runs_of(s, "mae") == ["mae-baseline", "mae-dchag"]
    assert plan.runs_of(s, "classification") == [
        "classification-baseline",
        "classification-dchag",
        "classification-baseline-ft",
        "classification-baseline-probe",
        "classification-dchag-ft",
        "classification-dchag-probe",
    ]
    # classification has three baseline runs here: no default pair; forecast-dchag's are the config's
    assert plan.comparisons(s) == [
        ("mae-dchag", "mae-baseline"),
        ("forecast-dchag", "forecast-baseline"),
        ("forecast-dchag", "persistence"),
    ]
    assert plan.foundation(s)["dchag-l"] == {
        "scratch": "classification-dchag",
        "fine_tuned": "classification-dchag-ft",
        "linear_probe": "classification-dchag-probe",
    }
    p = plan.Plan(_demo_with_foundation())
    assert (
        p.init_model("classification-dchag-ft") == "results/demo/train/mae-dchag/model"
        and p.init_model("mae-dchag") is None
    )
    assert plan.verify_runs(s) == {} and plan.all_runs(s) == s.train.runs


def test_comparisons_need_exactly_one_baseline_or_an_explicit_table():
    cfg = _demo()
    cfg["evaluate"]["compare"] = {}
    cfg["train"]["runs"]["forecast-tp"] = {"task": "forecast", "parallel": {"strategy": "baseline"}}
    hsi = [("mae-dchag", "mae-baseline"), ("classification-dchag", "classification-baseline")]
    assert plan.comparisons(settings(cfg)) == hsi  # several forecast baselines: ambiguous, no pair
    cfg["evaluate"]["compare"] = {"forecast-dchag": "forecast-tp", "forecast-tp": ["climatology", "forecast-baseline"]}
    assert plan.comparisons(settings(cfg)) == [
        *hsi,
        ("forecast-dchag", "forecast-tp"),
        ("forecast-tp", "climatology"),
        ("forecast-tp", "forecast-baseline"),
    ]
    for bad in (
        {"forecast-dchag": "nope"},
        {"persistence": "forecast-dchag"},
        {"forecast-tp": ["forecast-tp"]},
        {"mae-dchag": "persistence"},  # a reference forecast is no baseline of another task
        {"mae-dchag": "classification-baseline"},
    ):
        cfg["evaluate"]["compare"] = bad
        with pytest.raises(ConfigError, match=r"evaluate.compare.* against "):
            plan.comparisons(settings(cfg))


def test_a_run_named_like_a_reference_forecast_is_refused():
    cfg = _demo()
    cfg["train"]["runs"]["persistence"] = {"task": "forecast"}
    with pytest.raises(ConfigError, match="train.runs.persistence"):
        plan.forecast_runs(settings(cfg))


def test_verification_design():
    s = settings(_demo(verify={"batch_size": 8, "steps": 7, "groups": 3, "comm_hook": "fp16", "bucket_mb": 2}))
    runs = plan.verify_runs(s)
    assert list(runs) == [
        "verify-dp",
        "verify-fixed-group",
        "verify-compress",
        "verify-dchag-l",
        "verify-dchag-l-tokens",
    ]
    nproc = s.train.nproc
    for name in runs:
        r = run_settings({**s.raw, "train": {**s.raw["train"], "runs": runs}}, name)
        # the same steps and global batch for every method; instruments on
        assert r.train.steps == 7 and r.train.measure_comm and r.train.measure_memory
        per_rank = r.train.batch_size * (nproc if r.parallel.data_parallel == "ddp" else 1)
        assert per_rank == 8, name
    assert runs["verify-fixed-group"]["model"] == {"aggregation": "linear", "groups": 3}
    assert runs["verify-compress"]["parallel"] == {
        "tp": 1,
        "strategy": "baseline",
        "data_parallel": "ddp",
        "comm_hook": "fp16",
        "ddp_bucket_mb": 2,
    }
    assert runs["verify-dchag-l"]["parallel"] == {"tp": nproc, "strategy": "dchag", "data_parallel": "none"}
    # D-CHAG alone (the tokens formed) beside the fused front end alone (verify-dp) and both
    assert runs["verify-dchag-l-tokens"]["model"] == {"aggregation": "linear", "fused_front_end": False}
    assert runs["verify-dchag-l"]["model"] == {"aggregation": "linear"}
    assert run_settings({**s.raw, "train": {**s.raw["train"], "runs": runs}}, "verify-dp").model.fused_front_end
    with pytest.raises(ConfigError, match="verify.batch_size.*7"):
        plan.verify_runs(settings(_demo(verify={"batch_size": 7})))


def test_verification_repeats_wait_for_the_previous_repeat_of_every_method():
    runs = plan.verify_runs(settings(_demo(verify={"repeats": 3})))
    assert len(runs) == 15
    assert plan.previous_repeat("verify-dp-r1", runs) == []
    assert sorted(plan.previous_repeat("verify-compress-r3", runs)) == sorted(
        f"verify-{m}-r2" for m in ("dp", "fixed-group", "compress", "dchag-l", "dchag-l-tokens")
    )
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
    assert plan.Plan(_demo()).run_train("forecast-dchag").nproc == s.train.nproc


def test_config_files_are_content_addressed(tmp_path):
    a = plan.write_config({"name": "x", "era5": {"grid": 5.625}}, "era5", tmp_path)
    b = plan.write_config({"era5": {"grid": 5.625}, "name": "x"}, "era5", tmp_path)
    c = plan.write_config({"name": "x", "era5": {"grid": 2.8125}}, "era5", tmp_path)
    assert a == b != c and a.exists() and c.exists() and a.name.startswith("era5-")
    assert not list(Path(tmp_path).glob(".*.tmp"))


# -- everything that can be checked before a job runs is checked when the plan is made --------
PLAN_MISTAKES = {
    "tp vs heads": (lambda c: c["model"].update(num_heads=3, embed_dim=63), "not divisible by parallel.tp 2"),
    "patch vs grid": (lambda c: c["model"].update(patch_size=5), "does not divide the 5.625 deg grid (32 x 64)"),
    "patch vs tile": (lambda c: c["hsi"]["mae"].update(tile=18), "does not divide hsi.mae.tile 18"),
    "batch vs years": (lambda c: c["train"].update(batch_size=4000), "fewer than one batch of 4000"),
    "outputs vs channels": (lambda c: c["train"]["forecast"].update(outputs=["z500", "msl"]), "['msl'] are not input"),
    "leads vs time step": (lambda c: c["train"]["forecast"].update(lead_hours=[1, 48]), "multiples of era5.time_step"),
    "no classification data": (lambda c: c["hsi"].pop("classification"), "needs an 'hsi.classification' section"),
    "mask ratio masks nothing": (lambda c: c["train"].update(mae={"mask_ratio": 0.01}), "masks none of the 16 patches"),
    "world vs tp": (lambda c: c["train"].update(nproc=3), "not a multiple of the tensor-parallel size"),
    "map variable": (lambda c: c["evaluate"].update(map_variable="q500"), "'q500' is not a forecast output"),
    "score leads vs step": (lambda c: c["evaluate"].update(lead_hours=[36]), "not multiples of era5.time_step_hours"),
}


@pytest.mark.parametrize("mistake", list(PLAN_MISTAKES))
def test_plan_time_checks_name_key_and_value(mistake):
    edit, message = PLAN_MISTAKES[mistake]
    raw = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    edit(raw)
    cfg = validate(raw, "demo", check_files=False)
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan.Plan(cfg)


def test_the_shipped_configs_make_a_plan():
    for path in sorted((REPO / "config").glob("*.yaml")):
        plan.Plan(validate(yaml.safe_load(path.read_text()), path.name, check_files=False))


def test_the_schema_speaks_the_vocabulary():
    """One name per concept: the schema's enums are dchag.vocabulary's names."""
    from dchag.config import schema
    from dchag.vocabulary import VARIANTS, Aggregation, DataParallel, Strategy, Task

    defs = schema()["$defs"]
    assert defs["model_override"]["properties"]["aggregation"]["enum"] == list(Aggregation)
    assert defs["parallel_override"]["properties"]["strategy"]["enum"] == list(Strategy)
    assert defs["parallel_override"]["properties"]["data_parallel"]["enum"] == list(DataParallel)
    run = defs["train"]["properties"]["runs"]["additionalProperties"]
    assert run["properties"]["task"]["enum"] == list(Task) == defs["verify"]["properties"]["task"]["enum"]
    variant = defs["paper_point"]["properties"]["variant"]["oneOf"][0]["enum"]
    assert variant == list(VARIANTS)


def test_era5_jobs_ask_for_memory_by_grid_and_channels():
    """The per-year jobs' memory follows the data per time step: on both grids it covers 1.4 x
    every peak measured in benchmarks/results/preprocess.json (a 1.40625 deg split part of 80
    channels peaked at 1789 MB, near the 2000 MB asked for every grid before)."""
    import json

    def plan_of(grid):
        cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
        cfg["era5"]["grid"] = grid
        return plan.Plan(validate(cfg, "test", check_files=False))

    coarse, fine = plan_of(5.625), plan_of(1.40625)
    assert coarse.era5_mem_mb("era5_split_part", 2000) == 2000  # the floor: the rule's own value
    measured = json.loads((REPO / "benchmarks" / "results" / "preprocess.json").read_text())["rows"]
    for job in jobs.ERA5_JOB_MB:
        for grid, p in ((5.625, coarse), (1.40625, fine)):
            peak = max(r["peak_rss_mb"] for r in measured if r["grid"] == grid and r["job"] == job.replace("_", "-"))
            assert p.era5_mem_mb(job, 0) >= 1.4 * peak, (job, grid, peak)
    assert fine.era5_mem_mb("era5_split_part", 2000) >= 1.4 * 1789
    rules = (REPO / "workflow" / "rules" / "era5.smk").read_text()
    for job in ("era5_year_stats", "era5_split_part", "era5_climatology_part", "era5_climatology"):
        assert f'P.era5_mem_mb("{job}"' in rules
