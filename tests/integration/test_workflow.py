"""The Snakemake workflow as a user runs it: the plan, a full demo run, and config errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from support import REPO
from support.commands import DEMO, planned, snakemake

from dchag.store import open_store

DEMO_JOBS = {  # the demo's plan: 3 ERA5 years + constants, 6 training runs (3 tasks x baseline/D-CHAG)
    "era5_demo_constants": 1,
    "era5_demo_year": 4,
    "hsi_demo": 1,
    "era5_weights": 1,
    "hsi_classification": 1,
    "hsi_mae": 1,
    "era5_year": 4,
    "train": 6,
    "era5_climatology_part": 2,
    "era5_year_stats": 2,
    "export_model": 6,  # every run: evaluation reads its model folder
    "era5_climatology": 1,
    "era5_stats": 1,
    "evaluate_classification": 2,
    "evaluate_mae": 2,
    "era5_split_part": 4,
    "fig_classification": 1,
    "fig_hsi_reconstruction": 1,
    "hsi_scores": 1,
    "wb2_climatology": 1,
    "era5_split": 3,
    "baseline_forecast": 2,
    "era5_truth": 1,
    "fig_loss_curves": 1,
    "score": 8,  # 2 runs + persistence + climatology, under 2 conventions
    "train_summary": 1,
    "forecast": 2,
    "fig_forecast_maps": 1,
    "compare_scores": 4,  # forecast-dchag against forecast-baseline and persistence, under 2 conventions
    "fig_lead_time": 2,
    "fig_scorecard": 2,
    "compare_hsi": 2,  # mae-dchag and classification-dchag against their baseline runs
    "all": 1,
}


def test_dry_run_plans_the_demo_dag(tmp_path):
    proc = snakemake(tmp_path, "-n", configfile=DEMO)
    assert proc.returncode == 0, proc.stderr
    assert planned(proc.stdout + proc.stderr) == DEMO_JOBS


DEMO_CI = """
era5: {demo_days: 60}
model: {embed_dim: 32}
train: {steps: 60, batch_size: 4, checkpoint_every: 30, val_every: 30}
"""


def foundation_runs() -> str:
    """config/foundation.yaml's runs and its evaluate.foundation, as an overlay of the demo:
    the demo's pipeline with the foundation-model experiment in it — its D-CHAG variant (CI's
    time: the baseline variant's fine-tuned and probe runs are the same code on another model;
    the channel-subset pair is a run's channel subset, test_train's, and an init_from naming a
    run, the classification pair's here, matched channel by channel, test_predict's)."""
    cfg = yaml.safe_load((REPO / "config" / "foundation.yaml").read_text())
    runs = {
        k: v
        for k, v in cfg["train"]["runs"].items()
        if not k.startswith(("classification-baseline-", "forecast-subset", "forecast-full-ft"))
    }
    foundation = {"dchag-l": cfg["evaluate"]["foundation"]["dchag-l"]}
    return yaml.safe_dump({"train": {"runs": runs}, "evaluate": {"foundation": foundation}})


@pytest.mark.minutes(5.5)
def test_demo_pipeline_produces_normalised_stores(tmp_path):
    """The demo as `make demo` runs it with the foundation-model experiment's runs added
    (config/foundation.yaml's), cut for CI's time (the full demo is timed in
    benchmarks/results/demo_training.md): 60 days of each synthetic year instead of 365, 60
    training steps instead of 150, of a model half as wide on batches half as large; at its
    end, the verification experiment (`snakemake verify`) on its stores."""
    short, foundation = tmp_path / "short.yaml", tmp_path / "foundation.yaml"
    short.write_text(DEMO_CI)
    foundation.write_text(foundation_runs())
    demo = [REPO / "config" / "demo.yaml", foundation, short]
    proc = snakemake(tmp_path, configfile=demo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = tmp_path / "results" / "demo" / "era5"
    for split in ("train", "val", "test"):
        ds = open_store(results / f"{split}.zarr")
        assert ds.data.dims == ("time", "channel", "lat", "lon") and ds.data.shape[1:] == (20, 32, 64)
        assert "synthetic" in ds.attrs["source_note"]
    train = open_store(results / "train.zarr").data.values
    assert np.abs(train.mean(axis=(0, 2, 3))).max() < 1e-3
    assert (tmp_path / "logs" / "demo" / "era5_year_2016.log").exists()
    # No job warned: a warning in a job's log is something its user has to look into.
    warned = [p.name for p in (tmp_path / "logs" / "demo").glob("*.log") if "Warning" in p.read_text()]
    assert not warned, warned
    # Every field the pipeline wrote, in every store under results/, is float32 on disk.
    from support.stores import float_arrays

    stores = [p for p in (tmp_path / "results").rglob("*.zarr") if (p / "zarr.json").exists()]
    wrong = {f"{p}:{k}": str(v) for p in stores for k, v in float_arrays(p).items() if v != np.float32}
    assert len(stores) >= 6 and not wrong, wrong
    # Both hyperspectral stores, read by the .mat (patches) and ENVI (tiles) readers.
    import xarray as xr

    for task, var in (("classification", "patches"), ("mae", "tiles")):
        for split in ("train", "val", "test"):
            ds = xr.open_zarr(tmp_path / "results" / "demo" / "hsi" / f"{task}.zarr", group=split, consolidated=False)
            assert ds[var].shape[1] == 200 and ds.sizes["sample"] > 0
    assert ds.attrs["source_images"][0].endswith(".hdr")
    # Baseline and D-CHAG trained for every task on 2 processes; the loss fell in each run.
    import csv

    with open(tmp_path / "results" / "demo" / "train" / "summary.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    experiment = {f"classification-dchag-{s}" for s in ("ft", "probe")}
    assert {r["run"] for r in rows} == {
        f"{t}-{v}" for t in ("forecast", "mae", "classification") for v in ("baseline", "dchag")
    } | experiment
    for r in rows:
        if not r["run"].endswith("-probe"):  # a linear probe trains a head only
            assert float(r["loss_last"]) < 0.85 * float(r["loss_first"]), r
        assert (tmp_path / "results" / "demo" / "train" / r["run"] / "final" / ".metadata").exists()
    check_foundation_experiment(tmp_path / "results" / "demo", rows)
    # Rerunning does nothing: results are up to date.
    again = snakemake(tmp_path, "-n", configfile=demo)
    assert "Nothing to be done" in again.stdout + again.stderr
    check_a_store_of_an_earlier_format_is_rewritten(tmp_path, demo)
    check_evaluation(tmp_path / "results" / "demo")
    # `snakemake figures` redraws every figure from the results, training nothing.
    redraw = snakemake(tmp_path, "figures", "-n", "--quiet", "rules", "--forcerun", *FIGURE_RULES, configfile=demo)
    assert redraw.returncode == 0, redraw.stderr
    redrawn = set(planned(redraw.stdout + redraw.stderr)) - {"figures"}
    assert redrawn == set(FIGURE_RULES), redrawn
    # The paper target's accuracy figure from the demo's own runs (the measured sweep points
    # are test_paper_sweep_measures_every_point_and_draws_its_figures'); nothing else reruns.
    paper = tmp_path / "paper.yaml"
    paper.write_text(PAPER_ACCURACY_OVERLAY)
    made = snakemake(tmp_path, "paper", configfile=[*demo, paper])
    assert made.returncode == 0, made.stderr[-3000:]
    assert "rule train:" not in made.stdout + made.stderr and "rule forecast:" not in made.stdout + made.stderr
    check_paper_accuracy(tmp_path / "results" / "demo")
    # The report: self-contained, every figure present when opened in a headless browser.
    report = tmp_path / "report.html"
    made = snakemake(tmp_path, "all", "paper", "--report", str(report), configfile=[*demo, paper])
    assert made.returncode == 0, made.stderr[-3000:]
    check_report_in_browser(report, [Path(f).name for f in FIGURES_PNG] + ["accuracy.png"])
    # `snakemake verify` (a named target, not part of `all`) on the demo's stores: its five runs
    # and their verdict, nothing of the demo retrained.
    verify = tmp_path / "verify.yaml"
    verify.write_text("verify:\n  steps: 8\n")
    made = snakemake(tmp_path, "verify", configfile=[*demo, verify])
    assert made.returncode == 0, made.stderr[-3000:]
    assert planned(made.stdout + made.stderr) == {"train": 5, "verify_report": 1, "verify": 1}
    check_verification(tmp_path / "results" / "demo")


@pytest.mark.minutes(2)
def test_paper_sweep_measures_every_point_and_draws_its_figures(tmp_path):
    """The paper target, cut down (CI's CPU sweep): every point one torchrun job, every
    memory/throughput figure drawn from them beside the published values, and the report."""
    paper = tmp_path / "paper.yaml"
    paper.write_text(PAPER_OVERLAY)
    demo = [REPO / "config" / "demo.yaml", paper]
    made = snakemake(tmp_path, "paper", configfile=demo)
    assert made.returncode == 0, made.stderr[-3000:]
    assert not (tmp_path / "resources").exists()  # a benchmark-only sweep needs no dataset
    check_paper(tmp_path / "results" / "demo")
    report = tmp_path / "report.html"
    made = snakemake(tmp_path, "paper", "--report", str(report), configfile=demo)
    assert made.returncode == 0, made.stderr[-3000:]
    check_report_in_browser(report, [f"{k}.png" for k in PAPER_FIGURES if k != "accuracy"])


FIGURE_RULES = [
    "fig_loss_curves",
    "fig_lead_time",
    "fig_scorecard",
    "fig_forecast_maps",
    "fig_hsi_reconstruction",
    "fig_classification",
    "fig_foundation",
]
FIGURES_PNG = [
    "loss_curves.png",
    "lead_time_wb2.png",
    "lead_time_climax.png",
    "scorecard_wb2.png",
    "scorecard_climax.png",
    "forecast_maps.png",
    "hsi_reconstruction.png",
    "classification.png",
    "foundation.png",
]


PAPER_OVERLAY = """
paper:
  gpus_per_node: 4  # one machine: TP 4 in one job, not two "nodes" under srun
  steps: 1
  warmup: 1
  defaults: {width: 32, depth: 1, heads: 4, channels: 32, image: [16, 32], patch: 4, batch: 2, precision: fp32,
             tp: 2, dp: 1, variant: baseline, tree: 0, activation_checkpointing: false}
  sweeps:
    front_share: [{variant: [tokenize, tokenize+aggregate, baseline], stands_for: {width: 2048, channels: 1024, tp: 8}}]
    tokenization:
      - {variant: [tokenize, tokenize+aggregate, dist-tokenize, dist-tokenize+gather-all],
         stands_for: {width: 2048, channels: 1024, tp: 8}}
    tree: [{variant: [dchag-l, dchag-c], tree: [0, 2], stands_for: {width: 2048, channels: 1024, tp: 8}}]
    full_models:
      - {variant: [baseline, dchag-c, dchag-l], stands_for: {width: 2048, channels: 1024, tp: 8}}
      - {variant: dchag-l, fused_front_end: true, stands_for: {width: 2048, channels: 1024, tp: 8}}
    tp_scaling: [{variant: [baseline, dchag-l], tp: [2, 4], stands_for: {width: 2048, channels: 1024, tp: [8, 16]}}]
"""
PAPER_ACCURACY_OVERLAY = """
paper:
  accuracy:
    forecast: {baseline: forecast-baseline, dchag-l: forecast-dchag}
    mae: {baseline: mae-baseline, dchag-l: mae-dchag}
"""
PAPER_FIGURES = ["front_share", "tokenization", "tree", "full_models", "tp_scaling", "accuracy"]


def check_paper(results: Path) -> None:
    """The points the paper target measured, their shape, and every figure beside the
    published values."""
    import pandas as pd

    points = [json.loads(p.read_text()) for p in sorted((results / "paper" / "points").glob("*.json"))]
    # 3 + 2 + 4 + (2 shared) + 1 + 2: shared points measured once
    assert len(points) == 12, [p["name"] for p in points]
    fused = [p for p in points if p["point"]["fused_front_end"]]
    assert [p["name"][-6:] for p in fused] == ["-fused"]
    m = {(p["point"]["variant"], p["point"]["tp"], p["point"]["tree"]): p for p in points if p not in fused}
    # the fused front end forms no channel tokens: less memory than the same model forming them
    assert fused[0]["memory_mib_rank0"] < m[("dchag-l", 2, 0)]["memory_mib_rank0"]
    check_a_point_records_per_rank_memory_its_split_time_and_throughput(m)
    check_the_measured_memory_has_the_papers_shape({k: v["memory_mib_rank0"] for k, v in m.items()})
    for kind in PAPER_FIGURES[:-1]:  # all but accuracy
        png = results / "figures" / "paper" / f"{kind}.png"
        assert png.stat().st_size > 20_000 and png.with_suffix(".pdf").exists(), kind
        caption = png.with_suffix(".csv").read_text().splitlines()[0]
        assert caption.startswith("# Reproduces the paper's"), caption
        assert "scaled down" in caption and "CPU" in caption and "published" in caption, caption
        table = pd.read_csv(png.with_suffix(".csv"), comment="#")
        if kind != "front_share":
            memory = table[
                table.metric == "memory"
            ]  # (full_models adds TFLOPS rows: published and measured, no prediction)
            assert memory.published.notna().any() and memory.predicted.notna().all() and table.measured.notna().all()
            known = memory[memory.published.notna()]
            assert (known.prediction_error.abs() < 0.35).all(), known
    assert not (results / "figures" / "paper" / "accuracy.png").exists()  # no accuracy runs in this config


def check_a_store_of_an_earlier_format_is_rewritten(workdir: Path, configfile: list) -> None:
    """A split store written before the store format changed (dchag.store.STORE_FORMAT: the
    float64 stores) is planned again: the job's recorded parameters, as Snakemake keeps them in
    .snakemake/metadata, lack the format. With the record restored, nothing is to be done."""
    from base64 import urlsafe_b64encode

    from dchag.store import STORE_FORMAT

    record = workdir / ".snakemake" / "metadata" / urlsafe_b64encode(b"results/demo/era5/train.zarr").decode()
    saved = record.read_text()
    meta = json.loads(saved)
    recorded = repr(STORE_FORMAT)  # Snakemake records a parameter's repr
    assert recorded in meta["params"], meta["params"]
    meta["params"].remove(recorded)
    record.write_text(json.dumps(meta))
    try:
        plan = snakemake(workdir, "-n", "--quiet", "rules", configfile=configfile)
        assert {"era5_split", "train", "forecast"} <= set(planned(plan.stdout + plan.stderr)), plan.stdout + plan.stderr
    finally:
        record.write_text(saved)


def check_paper_accuracy(results: Path) -> None:
    import pandas as pd

    png = results / "figures" / "paper" / "accuracy.png"
    assert png.stat().st_size > 20_000 and png.with_suffix(".pdf").exists()
    assert png.with_suffix(".csv").read_text().startswith("# Reproduces the paper's")
    assert not (results / "paper" / "points").exists()  # no sweep in this config: no point measured
    acc = pd.read_csv(png.with_suffix(".csv"), comment="#")
    pairs = {f"forecast-dchag vs forecast-baseline, {conv}" for conv in ("wb2", "climax")}
    assert set(acc.comparison) == pairs and acc.percent_change.notna().all()
    assert set(acc.lead_days) == {7, 14, 30} and set(acc.metric) == {"RMSE", "wACC"}


def check_a_point_records_per_rank_memory_its_split_time_and_throughput(m: dict) -> None:
    r = m[("dchag-l", 2, 0)]
    assert r["world"] == 2 and len(r["ranks"]) == 2 and r["memory_measure"].startswith("MemTracker")
    for rank in r["ranks"]:
        assert rank["memory_mib"] > 0 and 0 < rank["front_mib"] < rank["memory_mib"]
        assert rank["rest_mib"] == pytest.approx(rank["memory_mib"] - rank["front_mib"])
    assert r["memory_mib_max"] >= r["memory_mib_rank0"] > 0
    assert r["step_s"] > 0 and r["samples_per_s_per_gpu"] == pytest.approx(2 / r["step_s"] / 2)
    assert r["tflops_per_gpu"] == pytest.approx(3 * r["forward_flops"] / r["step_s"] / 2 / 1e12)
    # the model's own forward FLOPs: the baseline's aggregation over all channels costs more than -L's
    assert m[("baseline", 2, 0)]["forward_flops"] > r["forward_flops"] > 0


def check_the_measured_memory_has_the_papers_shape(mem: dict) -> None:
    """The run's own numbers (not the published ones): distributed tokenization holds a
    fraction of the baseline's; gathering all tokens gives the saving back; D-CHAG-L < -C <
    baseline per rank; and the TP baseline's per-rank memory falls with T from T = 2 to T = 4:
    by 20 % at this size (13 % before the k/v projection released its input early; 27 % on the
    workload of benchmarks/results/tp_baseline_memory.md, where the authors' code falls by
    about a quarter)."""
    tok, agg = mem[("tokenize", 2, 0)], mem[("tokenize+aggregate", 2, 0)]
    dist, gather = mem[("dist-tokenize", 2, 0)], mem[("dist-tokenize+gather-all", 2, 0)]
    assert dist < 0.7 * tok and gather > 1.5 * dist and agg > tok
    assert mem[("dchag-l", 2, 0)] < mem[("dchag-c", 2, 0)] < mem[("baseline", 2, 0)]
    assert mem[("dchag-l", 2, 2)] < mem[("dchag-c", 2, 2)]
    assert mem[("baseline", 4, 0)] < 0.85 * mem[("baseline", 2, 0)], (mem[("baseline", 2, 0)], mem[("baseline", 4, 0)])


def check_evaluation(results: Path) -> None:
    import pandas as pd
    import xarray as xr
    from pandas.testing import assert_frame_equal

    from dchag.evaluate import perinit
    from dchag.evaluate.weather import MASK_REGIONS, REGIONS

    ev = results / "eval"
    for source in ("forecast-baseline", "forecast-dchag", "persistence", "climatology"):
        for conv in ("wb2", "climax"):
            df = pd.read_csv(ev / "era5" / f"scores_{source}_{conv}.csv")
            assert list(df.columns) == ["variable", "lead_time_hours", "region", "metric", "value", "convention"]
            assert set(df.region) == {*REGIONS, *MASK_REGIONS}  # land and sea: the demo has a land-sea mask
            stats = perinit.open_statistics(ev / "era5" / f"scores_{source}_{conv}.nc")
            assert_frame_equal(perinit.table(stats), df, check_dtype=False, check_exact=False, rtol=1e-9)
            df = df[df.region == "global"]
            assert set(df.variable) == {"z500", "t850", "t2m", "u10", "v10"}
            assert set(df.lead_time_hours) == {168, 336, 720} and (df.convention == conv).all()
            rmse = df[df.metric == "rmse"].value
            assert rmse.notna().all() and (rmse > 0).all()
    fc = xr.open_zarr(ev / "era5" / "forecast_forecast-dchag.zarr")  # WeatherBench 2's layout, default arguments
    assert fc.geopotential.dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert 4e4 < float(fc.geopotential.sel(level=500).mean()) < 6.5e4  # physical units (m2 s-2), not normalised
    table = pd.read_csv(ev / "era5" / "comparison_forecast-dchag_vs_forecast-baseline_wb2.csv")
    assert (table.baseline == "forecast-baseline").all() and (table.candidate == "forecast-dchag").all()
    assert set(table.metric) == {"rmse", "mse", "acc"} and table.percent_change.notna().all()
    assert (
        set(table.verdict) <= {"better", "worse", "no significant difference"}
        and table.p_value.dropna().between(0, 1).all()
    )
    assert (table.percent_lower <= table.percent_change).all() and (table.percent_change <= table.percent_upper).all()
    assert set(table.region) == {*REGIONS, *MASK_REGIONS} and (table.method == "t_test_ar2").all()
    card = pd.read_csv(results / "figures" / "scorecard_wb2.csv", comment="#")
    assert set(zip(card.candidate, card.baseline)) == {
        ("forecast-dchag", "forecast-baseline"),
        ("forecast-dchag", "persistence"),
    }
    assert card.significant.sum() == card.verdict.isin(["better", "worse"]).sum() > 0  # persistence is beaten
    hsi = pd.read_csv(ev / "hsi" / "scores.csv")
    classification = {"classification-baseline"} | {f"classification-dchag{s}" for s in ("", "-ft", "-probe")}
    assert set(hsi.run) == {"mae-baseline", "mae-dchag"} | classification
    assert set(hsi[hsi.task == "mae"].region) == {"masked", "full"}
    for cand, regions in (("mae-dchag", {"masked", "full"}), ("classification-dchag-ft", {"test"})):
        base = cand.split("-")[0] + "-baseline"
        pair = pd.read_csv(ev / "hsi" / f"comparison_{cand}_vs_{base}.csv")
        assert set(pair.region) == regions and (pair.candidate == cand).all() and pair.p_value.between(0, 1).all()
        scores = hsi[hsi.run == cand].set_index(["region", "metric"]).value
        for r in pair.itertuples():  # the bootstrap's point estimates are the runs' own scores
            assert r.candidate_score == pytest.approx(scores[(r.region, r.metric)], rel=1e-6)
    for name in FIGURES_PNG:
        png = results / "figures" / name
        assert png.stat().st_size > 10_000 and png.with_suffix(".pdf").exists(), name


def check_foundation_experiment(results: Path, rows: list[dict]) -> None:
    """MAE pretraining, then classification fine-tuned / probed from it at equal steps: the
    runs started from the MAE runs' weights, the table and the figure hold their test scores."""
    import pandas as pd

    by_run = {r["run"]: r for r in rows}
    assert (
        by_run["classification-dchag-ft"]["init_from"] == "mae-dchag"
        and by_run["classification-dchag-ft"]["frozen"] == ""
    )
    assert by_run["classification-dchag-probe"]["frozen"] == "tokenizer+aggregation+blocks"
    assert (
        len(
            {
                by_run[r]["steps"]
                for r in ("classification-dchag", "classification-dchag-ft", "classification-dchag-probe")
            }
        )
        == 1
    )
    init = json.loads((results / "train" / "classification-dchag-ft" / "init.json").read_text())
    assert init["channels"] == {"matched": 200, "of": 200, "by": "band centre", "new": []}
    assert any(r.startswith("pos_embed: grid (4, 4) -> (7, 7)") for r in init["resized"])
    assert any(n.startswith("head.weight") for n in init["new"])  # another task's head: re-initialised
    table = pd.read_csv(results / "figures" / "foundation.csv")
    assert set(table.start) == {"from scratch", "fine-tuned from MAE", "linear probe"}
    assert set(table.variant) == {"dchag-l"} and table.overall_accuracy.between(0, 1).all()


def check_verification(results: Path) -> None:
    import pandas as pd

    verdict = pd.read_csv(results / "eval" / "verify" / "verdict.csv")
    assert list(verdict.run) == [
        "verify-dp",
        "verify-fixed-group",
        "verify-compress",
        "verify-dchag-l",
        "verify-dchag-l-tokens",
    ]
    assert (verdict.steps == 8).all() and (verdict.step_s > 0).all() and (verdict.peak_mem_mib_max_rank > 0).all()
    assert verdict.set_index("run").verdict["verify-dp"] == "reference"
    assert set(verdict.verdict) <= {
        "reference",
        "adopt",
        "no: step time not 5% lower",
        "no: validation loss 5%+ worse",
        "inconclusive: the step-time change crosses -5% over the repeats",
    }
    assert (verdict.repeats == 1).all() and (verdict.step_s_min <= verdict.step_s_max).all()
    assert (results / "figures" / "verify.png").stat().st_size > 10_000
    info = json.loads(
        (results / "train" / "verify-compress" / "run.json").read_text()
    )  # verify.repeats 1: no -r suffix
    assert info["compression"]["hook"] == "int8_ef"


def check_report_in_browser(report: Path, figures: list[str]) -> None:
    from support.report_browser import figures_shown

    shown = figures_shown(report)
    missing = [f for f in figures if f not in shown]
    assert not missing, f"figures not shown in {report}: {missing} (shown: {shown})"


def test_verification_repeats_interleave(tmp_path):
    """`snakemake verify` plans ERA5's jobs and the experiment's runs only, and needs a `verify`
    section; verify.repeats: every method trained R times, repeat i of each before repeat i + 1
    of any (the experiment itself runs at the end of the demo test)."""
    extra = tmp_path / "verify.yaml"
    extra.write_text("verify:\n  repeats: 3\n")
    proc = snakemake(tmp_path, "verify", "-n", "--printshellcmds", configfile=[REPO / "config" / "demo.yaml", extra])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    methods = ("verify-dp", "verify-fixed-group", "verify-compress", "verify-dchag-l", "verify-dchag-l-tokens")
    rules = planned(out)  # only what the experiment needs: ERA5's jobs, no hyperspectral one
    assert "era5_split" in rules and not {rule for rule in rules if rule.startswith("hsi")}, rules
    missing = snakemake(tmp_path, "verify", "-n", configfile=REPO / "config" / "demo.yaml")
    assert missing.returncode != 0 and "needs a 'verify' section" in missing.stderr + missing.stdout
    launches = [line for line in out.splitlines() if "launch-train" in line]
    # one math-library thread per rank: the job's 2 threads over its 2 ranks (Snakemake exports 2)
    assert all("--nproc 2" in line and "--threads-per-rank 1" in line for line in launches), launches[0]
    runs = [line.split("--run-name ")[1].split()[0] for line in launches]
    assert sorted(runs) == sorted(f"{m}-r{i}" for m in methods for i in (1, 2, 3))
    order = [int(name.rsplit("-r", 1)[1]) for name in runs]
    assert order == sorted(order), runs  # Snakemake lists jobs in a valid order: repeats never overtake


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda c: c["era5"].update(nan_polcy="fill"), "'nan_polcy' was unexpected"),
        (lambda c: c["era5"].update(grid="fine"), "fine"),
        (lambda c: c["era5"].update(demo=False, inputs=["data/nowhere_{year}.nc"]), "data/nowhere_2016.nc"),
        # names become folders, wildcards and words of shell commands: only safe ones pass
        (lambda c: c.update(name="a$(touch PWNED)b"), "does not match"),
        (lambda c: c.update(name=".."), "does not match"),
        (lambda c: c["train"]["runs"].update({"../escape": {"task": "forecast"}}), "does not match"),
        (lambda c: c["train"]["runs"].update({"x;touch PWNED": {"task": "forecast"}}), "does not match"),
        (lambda c: c.update(name="ok\n"), "does not match"),
        (lambda c: c["era5"].update(inputs=["../outside_{year}.nc"]), "inside the working directory"),
    ],
    ids=[
        "misspelled key",
        "wrong type",
        "missing input file",
        "shell in name",
        "dot-dot name",
        "dot-dot run",
        "shell in run",
        "trailing newline",
        "demo writes outside",
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, edit, expected):
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    edit(cfg)
    work = tmp_path / "work"
    work.mkdir()
    path = work / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", configfile=path)
    assert proc.returncode != 0
    assert expected in proc.stderr + proc.stdout
    assert not (work / "results").exists()
    # nothing ran and nothing was written beside the working directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert not list(tmp_path.rglob("PWNED")) and not (REPO / "PWNED").exists()


def test_workflow_is_lint_clean_and_formatted():
    proc = snakemake(REPO, "--lint")
    assert proc.returncode == 0 and "good condition" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    fmt = shutil.which("snakefmt", path=str(Path(sys.executable).parent))
    proc = subprocess.run([fmt, "--check", "Snakefile", "workflow/rules"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # `snakemake --list-rules` describes every rule (its docstring)
    listed = snakemake(REPO, "--list-rules").stdout.splitlines()
    assert len(listed) >= 35 and all(re.fullmatch(r"\w+ \(.+\.\)", line) for line in listed), listed


def _train_job(out: str) -> str:
    train = out[out.index("rule train:") :]
    return train[: train.index("Shell command")]


def test_slurm_profile_plans_the_workflow_with_site_resources(tmp_path):
    """`--workflow-profile slurm` (profiles/slurm) plans a training job with what its config
    implies (CPUs for every rank and its loader workers, the memory of ranks, workers, caches
    and model) and the profile's site values (the time limit); `--set-resources` wins and
    replaces the profile's list. The real cluster run is tests/integration/test_slurm.py."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    loaders = tmp_path / "loaders.yaml"
    loaders.write_text("train: {num_workers: 3, cache_mb: 2000}\n")
    proc = snakemake(tmp_path, "--workflow-profile", "slurm", "-n", configfile=[DEMO, loaders])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "profiles/slurm" in out and "launch-train" in out
    # 1.5 x 2 ranks x (1024 MB a rank + 3 workers x 512 + a 2000 MB cache + a model of < 1 MB)
    train = _train_job(out)
    assert "mem_mb=14000" in train and "runtime=720" in train and "nodes=1" in train, train
    local = snakemake(tmp_path, "-n", "--cores", "16", configfile=[DEMO, loaders])
    assert "threads: 8" in _train_job(local.stdout + local.stderr)  # 2 ranks x (1 + 3 workers)
    given = snakemake(
        tmp_path, "--workflow-profile", "slurm", "-n", "--set-resources", "train:mem_mb=64000", configfile=DEMO
    )
    train = _train_job(given.stdout + given.stderr)
    assert "mem_mb=64000" in train and "runtime=60" in train, train  # the profile's set-resources replaced


# Words of rule shell commands that are never quoted: the command prefix (`dchag`, or srun in
# front of it), and numbers or fixed words the workflow itself chooses.
UNQUOTED = {
    "params.dchag",
    "params.launch",
    "params.year",
    "params.nproc",
    "params.restarts",
    "params.rank_threads",
    "params.batch",
    "params.tolerance",
    "params.parts",
    "wildcards.year",
    "wildcards.part",
    "wildcards.split",
    "wildcards.kind",
    "wildcards.convention",
}


def test_every_value_in_a_rule_shell_command_is_quoted():
    """A value from the config or a path reaches a shell command only as one quoted word
    ({x:q}); the unquoted placeholders are the command prefix and the workflow's own numbers
    and fixed words, constrained by wildcard_constraints."""
    rules = sorted((REPO / "workflow" / "rules").glob("*.smk"))
    found = set()
    for path in rules:
        text = path.read_text()
        for shell in re.findall(r"shell:\n((?:\s+\"[^\n]*\"\n)+)", text):
            for name, spec in re.findall(r"(?<!\{)\{([A-Za-z_.]+)(:q)?\}(?!\})", shell):
                found.add(name)
                assert spec or name in UNQUOTED, f"{path.name}: {{{name}}} in a shell command is not quoted"
    assert {"input", "output", "log", "params.cfg", "wildcards.run"} <= found  # the scan reads the rules


def _alias_bomb() -> str:
    """400-odd bytes of YAML that expand to 9^9 values through nested aliases."""
    lines = ["name: demo", 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\ntrain: {runs: {x: {task: *a8}}}\n"


def _forty_missing_years() -> str:
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    cfg["era5"].update(demo=False, inputs=["/nowhere/pl_{year}.nc", "/nowhere/sl_{year}.nc"])
    cfg["era5"]["years"] = {"train": list(range(1979, 2017)), "val": [2017], "test": [2018]}
    return yaml.safe_dump(cfg)


@pytest.mark.parametrize(
    "text, expected",
    [
        (lambda: (REPO / "config" / "demo.yaml").read_text() + "\nname: again\n", "key 'name' is given twice"),
        (_alias_bomb, "expands to more than 1000000 bytes"),
        (_forty_missing_years, "… and 71 more"),  # 80 inputs and the constants
    ],
    ids=["duplicate key", "alias bomb", "80 missing input files"],
)
def test_config_files_are_read_strictly_with_a_bounded_message(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text())
    proc = snakemake(tmp_path, "-n", configfile=path)
    assert proc.returncode != 0 and expected in proc.stdout + proc.stderr
    assert len(proc.stdout + proc.stderr) < 5000
    cli = subprocess.run(
        [sys.executable, "-m", "dchag", "describe-model", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and expected in cli.stderr and len(cli.stderr) < 1000, cli.stderr[-2000:]


def test_report_captions_insert_only_names_the_schema_constrains():
    """Captions are RST rendered with raw HTML allowed: they may insert only the wildcards
    (run, source, candidate, baseline, convention, kind: constrained names) and the config's name."""
    allowed = re.compile(
        r'snakemake\.wildcards\.(run|source|candidate|baseline|convention|kind)|snakemake\.config\["name"\]'
    )
    used = []
    for path in (REPO / "workflow" / "report").glob("*.rst"):
        for expr in re.findall(r"\{\{(.*?)\}\}|\{%(.*?)%\}", path.read_text()):
            text = "".join(expr).strip()
            used.append(text)
            assert allowed.fullmatch(text), f"{path.name} inserts {text!r}"
    assert "snakemake.wildcards.run" in used
