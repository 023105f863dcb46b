"""The paper's experiments: sweeps as jobs, the benchmark of one point under torchrun, the
memory model against every published number, the figures drawn from measured points, and the
GPU config planned under the Slurm profile with one job per point and its GPU count."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO
from dchag.config import ConfigError, settings, validate
from dchag.paper import published, sweep
from dchag.paper.predict import predicted_gb

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def paper(section: dict) -> dict:
    return settings(validate({"name": "t", "paper": section}, "test", check_files=False)).paper


# -- sweeps ----------------------------------------------------------------------------------
def test_a_grid_is_the_product_of_its_lists_and_shared_points_are_one_job():
    p = paper({"defaults": {"width": 64, "heads": 8, "depth": 1, "channels": 64, "image": [16, 32]},
               "sweeps": {"tree": [{"variant": ["dchag-l", "dchag-c"], "tree": [0, 2, 4]}],
                          "full_models": [{"variant": ["baseline", "dchag-l"], "tp": [2, 4]}],
                          "tp_scaling": [{"variant": "dchag-l", "tp": [2, 4]}]}})
    s = sweep.sweeps(p)
    assert [(q.variant, q.tree) for q in s["tree"]] == [(v, t) for v in ("dchag-l", "dchag-c") for t in (0, 2, 4)]
    assert {(q.variant, q.tp) for q in s["full_models"]} == {("baseline", 2), ("baseline", 4), ("dchag-l", 2), ("dchag-l", 4)}
    points = sweep.all_points(p)
    # tp_scaling's two points are full_models' (and tree's Tree0 -L at tp 8 is its own)
    assert len(points) == 6 + 4 + 0 and all(name == q.name for name, q in points.items())
    assert len({q.name for q in points.values()}) == len(points)
    assert all(q.width == 64 and q.depth == 1 and q.image == (16, 32) and q.precision == "bf16" for q in points.values())


def test_stands_for_pairs_with_the_swept_key():
    p = paper({"sweeps": {"front_share": [{"variant": "baseline", "channels": [64, 256], "tp": 2, "width": 64, "heads": 4,
                                           "stands_for": {"width": 2048, "channels": [256, 1024], "tp": 8}}]}})
    assert [(q.channels, q.paper_setting) for q in sweep.sweeps(p)["front_share"]] == [(64, (2048, 256, 8)), (256, (2048, 1024, 8))]


@pytest.mark.parametrize("grid, message", [
    ({"variant": "dchag-x"}, "key 'paper.sweeps.full_models.0.variant'"),
    ({"variant": "dchag-l", "tree": 3}, "tree"),
    ({"variant": "baseline", "heads": 4, "tp": 8}, "heads 4 do not split over tp 8"),
    ({"variant": "baseline", "heads": 12}, "width 2048 is not divisible by heads 12"),
    ({"variant": "dist-tokenize+gather-all", "channels": 1000, "tp": 16, "heads": 16}, "divisible by tp"),
    ({"variant": "tokenize", "dp": 2}, "dp"),
    ({"variant": "baseline", "channels": [64, 128], "stands_for": {"width": 1, "channels": [1], "tp": 1}}, "same length"),
])
def test_a_bad_grid_names_its_key(grid, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        sweep.sweeps(paper({"sweeps": {"full_models": [grid]}}))


def test_resources_put_a_point_on_as_few_nodes_as_hold_it():
    point = sweep.sweeps(paper({"sweeps": {"full_models": [{"tp": [8, 16], "dp": [1, 2]}]}}))["full_models"]
    by = {(q.tp, q.dp): sweep.resources(q, 8) for q in point}
    assert by[(8, 1)] == sweep.Resources(8, 1, 8) and by[(16, 1)] == sweep.Resources(16, 2, 8)
    assert by[(8, 2)] == sweep.Resources(16, 2, 8) and by[(16, 2)] == sweep.Resources(32, 4, 8)
    odd = sweep.sweeps(paper({"sweeps": {"full_models": [{"tp": 4, "dp": 5, "heads": 16}]}}))["full_models"][0]
    with pytest.raises(ConfigError, match="do not spread evenly"):
        sweep.resources(odd, 8)


# -- the memory model against the paper ---------------------------------------------------------
def test_the_memory_model_against_every_published_number():
    """Full-model table within 14 % (the D-CHAG rows within 10 %), the front-end ablations
    within 2 % (four of them set the constants); TreeK is not modelled (the table in
    benchmarks/results/paper_memory.md reports its error)."""
    errors = {}
    for n in published.NUMBERS:
        if n.metric != "memory_gb":
            continue
        q = sweep.Point(n.width, 32, n.width // 128, n.channels, (128, 256), 4, 2, "bf16", n.tp, 1, n.variant, n.tree, True)
        errors[(n.figure, n.width, n.channels, n.tp, n.variant, n.tree)] = predicted_gb(q) / n.value - 1
    full = {k: e for k, e in errors.items() if k[0] == "full_models"}
    assert len(full) == 15 and max(map(abs, full.values())) < 0.14, full
    assert max(abs(e) for k, e in full.items() if k[4] != "baseline") < 0.10, full
    front = [e for k, e in errors.items() if k[0] == "tokenization"]
    assert len(front) == 4 and max(map(abs, front)) < 0.02, front
    # the memory model ordering the paper shows: -L < -C < baseline at every published setting
    for width, channels, tp, *_ in published._FULL:
        pred = {v: predicted_gb(sweep.Point(width, 32, width // 128, channels, (128, 256), 4, 2, "bf16", tp, 1, v, 0, True))
                for v in ("baseline", "dchag-c", "dchag-l")}
        assert pred["dchag-l"] < pred["dchag-c"] and pred["dchag-l"] < pred["baseline"], (width, channels, tp, pred)


# -- measured points and their figures -------------------------------------------------------------
def _measure(tmp_path: Path, name: str, **point) -> dict:
    base = dict(width=64, depth=2, heads=4, channels=128, image=[32, 64], patch=4, batch=2, precision="auto", tp=2, dp=1,
                variant="baseline", tree=0, activation_checkpointing=False, stands_for=[2048, 1024, 8])
    base.update(point)
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={base['tp']}",
                           "-m", "dchag.paper.bench", "--point", json.dumps(base), "--steps", "1", "--warmup", "1",
                           "--output", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _points(tmp: Path) -> dict:
    runs = {
        "base2": dict(variant="baseline", tp=2),
        "base4": dict(variant="baseline", tp=4, stands_for=[2048, 1024, 16]),
        "l2": dict(variant="dchag-l", tp=2),
        "c2": dict(variant="dchag-c", tp=2),
        "l2t2": dict(variant="dchag-l", tp=2, tree=2),
        "c2t2": dict(variant="dchag-c", tp=2, tree=2),
        "tok": dict(variant="tokenize"),
        "agg": dict(variant="tokenize+aggregate"),
        "dist": dict(variant="dist-tokenize"),
        "gather": dict(variant="dist-tokenize+gather-all"),
    }
    return {k: _measure(tmp, k, **v) for k, v in runs.items()}


FIGURE_POINTS = {"tokenization": ["tok", "agg", "dist", "gather"], "tree": ["l2", "l2t2", "c2", "c2t2"],
                 "full_models": ["base2", "c2", "l2"], "tp_scaling": ["base2", "base4", "l2"], "front_share": ["base2", "tok", "agg"]}


@pytest.mark.integration
def test_measured_points_have_the_papers_shape_and_draw_every_figure(tmp_path):
    """One test (the ten points are measured once): what a point records, the shape of the
    run's own numbers, and every figure drawn from them beside the published values."""
    m = _points(tmp_path)
    check_a_point_records_per_rank_memory_its_split_time_and_throughput(m)
    check_the_measured_memory_has_the_papers_shape(m)
    for kind, names in FIGURE_POINTS.items():
        check_the_figure_is_drawn_beside_the_published_values(tmp_path, kind, names)


def check_a_point_records_per_rank_memory_its_split_time_and_throughput(m: dict) -> None:
    r = m["l2"]
    assert r["world"] == 2 and len(r["ranks"]) == 2 and r["memory_measure"].startswith("MemTracker")
    for rank in r["ranks"]:
        assert rank["memory_mib"] > 0 and 0 < rank["front_mib"] < rank["memory_mib"]
        assert rank["rest_mib"] == pytest.approx(rank["memory_mib"] - rank["front_mib"])
    assert r["memory_mib_max"] >= r["memory_mib_rank0"] > 0
    assert r["step_s"] > 0 and r["samples_per_s_per_gpu"] == pytest.approx(2 / r["step_s"] / 2)
    assert r["tflops_per_gpu"] == pytest.approx(3 * r["forward_flops"] / r["step_s"] / 2 / 1e12)
    # the model's own forward FLOPs: the baseline's aggregation over all 128 channels costs more than -L's
    assert m["base2"]["forward_flops"] > m["l2"]["forward_flops"] > 0


def check_the_measured_memory_has_the_papers_shape(m: dict) -> None:
    """The run's own numbers (not the published ones): distributed tokenization holds a
    fraction of the baseline's; gathering all tokens gives the saving back; D-CHAG-L < -C <
    baseline per rank; and the TP baseline's per-rank memory falls with T — from T = 2 to
    T = 4 by 14-15 % here (it fell by 6 % before the aggregation's keys and values were fused;
    the authors' code falls by about a quarter: benchmarks/results/tp_baseline_memory.md)."""
    mem = {k: v["memory_mib_rank0"] for k, v in m.items()}
    assert mem["dist"] < 0.7 * mem["tok"] and mem["gather"] > 1.5 * mem["dist"]
    assert mem["agg"] > mem["tok"]
    assert mem["l2"] < mem["c2"] < mem["base2"]
    assert mem["base4"] < 0.9 * mem["base2"], (mem["base2"], mem["base4"])


def check_the_figure_is_drawn_beside_the_published_values(tmp: Path, kind: str, names: list[str]) -> None:
    out = tmp / f"{kind}.png"
    proc = subprocess.run([sys.executable, "-m", "dchag", "paper-figure", kind, *[str(tmp / f"{n}.json") for n in names],
                           "--output", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.stat().st_size > 20_000 and out.with_suffix(".pdf").exists()
    caption = out.with_suffix(".csv").read_text().splitlines()[0]
    assert caption.startswith("# Reproduces the paper's") and "scaled down" in caption and "CPU" in caption
    assert "published" in caption
    table = pd.read_csv(out.with_suffix(".csv"), comment="#")
    if kind != "front_share":
        memory = table[table.metric == "memory"]  # (full_models adds TFLOPS rows: published and measured, no prediction)
        assert memory.published.notna().any() and memory.predicted.notna().all() and table.measured.notna().all()
        known = memory[memory.published.notna()]
        assert (known.prediction_error.abs() < 0.35).all(), known


def test_a_missing_point_result_is_a_clean_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dchag", "paper-figure", "tree", str(tmp_path / "nope.json"), "--output",
                           str(tmp_path / "t.png")], capture_output=True, text=True)
    assert proc.returncode == 2 and "nope.json" in proc.stderr and "Traceback" not in proc.stderr


# -- the workflow --------------------------------------------------------------------------------
def _workdir(tmp_path: Path) -> Path:
    """The GPU config's inputs: ERA5 years are downloaded by the plan; the hyperspectral
    images are the user's (one real ENVI file written here)."""
    from dchag.hsi import demo

    demo.write_envi(tmp_path / "resources" / "vnir", count=1, rows=16, cols=16)
    return tmp_path


def test_the_gpu_config_plans_one_slurm_job_per_point_with_its_gpus(tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    cwd = _workdir(tmp_path)
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    points = sweep.all_points(settings(validate(cfg, "paper.yaml", check_files=False)).paper)
    proc = subprocess.run([*SNAKEMAKE, "paper", "--directory", str(cwd), "--workflow-profile", "slurm", "-n",
                           "--configfile", str(REPO / "config" / "paper.yaml")], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    jobs = [block for block in out.split("rule paper_point:")[1:]]
    assert len(jobs) == len(points) == 45
    seen = {}
    for block in jobs:
        block = block[:block.index("Shell command")] if "Shell command" in block else block
        name = re.search(r"point=(\S+)", block).group(1)
        res = re.search(r"resources: (.*)", block).group(1)
        seen[name] = res
    for name, q in points.items():
        nodes = -(-q.gpus // 8)
        assert f"nodes={nodes}" in seen[name] and f"gres=gpu:{q.gpus // nodes}" in seen[name], (name, seen[name])
    assert any("nodes=2" in r for r in seen.values())  # TP 16 spans two nodes of 8
    for rule in ("fig_paper", "fig_paper_accuracy"):
        assert f"rule {rule}:" in out
    # the accuracy figure waits on the paper config's own training runs and comparisons
    assert "comparison_forecast-dchag-c_wb2.csv" in out and "train/mae-dchag-l/log.csv" in out


def test_paper_without_a_paper_section_says_so(tmp_path):
    proc = subprocess.run([*SNAKEMAKE, "paper", "--directory", str(tmp_path), "-n", "--cores", "1", "--configfile",
                           str(REPO / "config" / "demo.yaml")], capture_output=True, text=True)
    assert proc.returncode != 0 and "needs a 'paper' section" in proc.stdout + proc.stderr
