"""Every benchmarks/*.py script run at a tiny size (or, where its measurement is the paper's
scale, its report regenerated from the committed results), and the package's fitted constants
(src/dchag/bench/fits.json) checked against a refit of the committed results by the scripts
that write them. The GPU check runs in tests/integration/test_gpu_check.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from dchag.bench import fits

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def script(name: str):
    """benchmarks/``name``.py as a module (its main(argv) runs it in this process)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_fits_are_the_scripts_refit_of_the_committed_results(tmp_path, monkeypatch):
    """preprocess_benchmark.py and paper_memory_fake.py, reporting the committed runs again,
    write the same fits as the package's fits.json; dchag.jobs and fakemem read that file; the
    fake-memory report comes out as committed."""
    from dchag import jobs
    from dchag.benefit import fakemem

    monkeypatch.chdir(REPO)  # the committed results by their relative names, as fits.json records them
    mine = tmp_path / "fits.json"
    script("preprocess_benchmark").main(
        [
            "--report",
            "benchmarks/results/preprocess.json",
            "--output",
            str(tmp_path / "preprocess"),
            "--fits",
            str(mine),
        ]
    )
    memory = ["--report", "benchmarks/results/paper_memory_fake.json", "--output", str(tmp_path / "paper_memory_fake")]
    script("paper_memory_fake").main([*memory, "--fits", str(mine)])
    assert json.loads(mine.read_text()) == json.loads(fits.FITS.read_text())
    assert jobs.ERA5_JOB_MB == {k: tuple(v) for k, v in fits.fitted("era5_job_mb")["mb"].items()}
    assert set(jobs.ERA5_JOB_MB) == set(fits.ERA5_JOBS)
    overhead = fits.fitted("fake_memory_overhead")
    assert (fakemem.OVERHEAD.scale, fakemem.OVERHEAD.fixed) == (overhead["scale"], overhead["fixed_gib"] * 2**30)
    assert (tmp_path / "paper_memory_fake.md").read_text() == (RESULTS / "paper_memory_fake.md").read_text()
    report = (tmp_path / "preprocess.md").read_text()
    assert "## Peak RSS and time per job (measured)" in report and "## 40 years" in report


def test_the_era5_job_fit_runs_through_both_grids_peaks():
    rows = json.loads((RESULTS / "preprocess.json").read_text())["rows"]
    for job, (fixed, per_unit) in fits.era5_job_mb(rows).items():
        for grid, units in ((5.625, 1), (1.40625, 16)):
            peak = max(r["peak_rss_mb"] for r in rows if r["job"] == job.replace("_", "-") and r["grid"] == grid)
            assert abs(fixed + per_unit * units - peak) <= 0.5 * units + 0.5, (job, grid)
    with pytest.raises(ValueError, match="no whole-year era5-split-part row at 1.40625"):
        fits.era5_job_mb([r for r in rows if r["grid"] == 5.625 or r["job"] != "era5-split-part"])


def test_the_preprocessing_benchmark_runs_the_jobs_under_gnu_time(tmp_path):
    """Two days of 10 channels, one year: the per-year statistics, the combine, the
    climatology's part and combine, each a `dchag` job with its peak RSS; a partial run writes
    no fit."""
    out, mine = tmp_path / "preprocess", tmp_path / "fits.json"
    script("preprocess_benchmark").main(
        ["--workdir", str(tmp_path / "work"), "--output", str(out), "--years", "1", "--split-years"]
        + ["--skip-fine", "--coarse-days", "2", "--levels", "500", "850", "--fits", str(mine)]
    )
    doc = json.loads(out.with_suffix(".json").read_text())
    jobs = [r["job"] for r in doc["rows"]]
    assert jobs == ["era5-year-stats", "era5-stats", "era5-climatology-part", "era5-climatology"]
    assert all(r["peak_rss_mb"] > 50 and r["cpu_s"] > 0 and r["days"] == 2 for r in doc["rows"])
    assert doc["meta"]["command"].startswith("python benchmarks/preprocess_benchmark.py --workdir")
    assert doc["sizes"]["year_bytes_5.625"] > 2 * 4 * 10 * 32 * 64 * 4 * 0.5  # compressed noise: at least half
    assert f"`{doc['meta']['command']}`" in out.with_suffix(".md").read_text()
    assert not mine.exists() and not (tmp_path / "work").exists()


def test_the_loader_and_model_check_reports_come_from_the_committed_runs(tmp_path):
    """The loader's report regenerated from its committed JSON is the committed report; the
    benefit model's check predicts every committed measurement from the committed calibrations
    (one process's profile has no link: infinite bandwidth)."""
    script("loader_benchmark").main(["--report", str(RESULTS / "loader.json"), "--output", str(tmp_path / "loader")])
    assert (tmp_path / "loader.md").read_text() == (RESULTS / "loader.md").read_text()
    for f in RESULTS.glob("benefit_model_check_*"):
        shutil.copy(f, tmp_path / f.name)
    script("benefit_model_check").main(["--from-measured", "--output", str(tmp_path / "benefit_model_check")])
    doc = json.loads((tmp_path / "benefit_model_check.json").read_text())
    measured = json.loads((RESULTS / "benefit_model_check_measured.json").read_text())["rows"]
    assert [(r["variant"], r["channels"], r["tp"]) for r in doc["rows"]] == [
        (r["variant"], r["channels"], r["tp"]) for r in measured
    ]
    assert doc["median_memory_error"] < 0.15  # the memory model holds on this workload


def test_the_model_benchmark_and_the_fused_front_end_at_a_tiny_size(tmp_path):
    """model_benchmark.py under torchrun (one rank), fused_front_end.py in this process: every
    variant's memory and step time; the fused path holds less than the token path."""
    tiny = ["--depth", "1", "--heads", "2", "--steps", "2", "--warmup", "1"]
    out = tmp_path / "model"
    threads = torch.get_num_threads()
    try:
        script("fused_front_end").main(
            ["--channels", "32", "--widths", "32", "--img", "16", "32", "--batch", "2", "--threads", "1", *tiny]
            + ["--output", str(out)]
        )
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["baseline", "D-CHAG-L", "D-CHAG-C"]
    for r in rows:
        assert len(r["token"]["step_seconds_all"]) == 2 and r["token"]["step_seconds"] > 0
        assert r["fused"]["total"] < r["token"]["total"], r  # the fused path never forms the channel tokens
    script("model_benchmark").main(
        [
            "--tp",
            "1",
            "--channels",
            "8",
            "--img",
            "8",
            "16",
            "--width",
            "16",
            "--batch",
            "1",
            *tiny,
            "--output",
            str(out),
        ]
    )
    doc = json.loads(out.with_suffix(".json").read_text())
    assert {r["variant"] for r in doc["rows"]} == {"baseline", "D-CHAG-L Tree0", "D-CHAG-L Tree2", "D-CHAG-C Tree0",
                                                    "D-CHAG-C Tree2"}  # fmt: skip
    for r in doc["rows"]:
        assert r["model"]["max_rank_total"] >= r["model"]["parameters"] > 0 and r["model"]["step_seconds"] > 0
        assert r["model"]["total"] > r["front"]["total"]  # the whole model holds the front end and more
    assert "| 8 | 1 | baseline |" in out.with_suffix(".md").read_text()


def test_the_tp_baseline_memory_compares_two_checkouts(tmp_path):
    """This checkout against itself at T = 1: the same memory on both sides."""
    out = tmp_path / "tp"
    script("tp_baseline_memory").main(
        ["--other", str(REPO / "src"), "--label", "same", "--channels", "8", "--tp", "1", "--output", str(out)]
    )
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["same"] == row["this checkout"] > 0
    assert "| 8 | 1 |" in out.with_suffix(".md").read_text()


def test_the_regrid_and_paper_memory_benchmarks(tmp_path):
    out = tmp_path / "regrid"
    script("regrid_benchmark").main(
        ["--steps", "2", "--methods", "bilinear", "--source-grid", "2.8125", "--channels", "4", "--output", str(out)]
    )
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert {r["variant"] for r in rows} >= {"scipy-floor", "builtin"}
    for r in rows:  # float32 fields against the float64 product of the same weights
        assert r["max_abs_error_vs_float64"] < 1e-5 and r["peak_rss_mb"] > 50 and r["channels"] == 4
    script("paper_memory").main(["--output", str(tmp_path / "paper_memory")])
    doc = json.loads((tmp_path / "paper_memory.json").read_text())
    for r in doc["rows"]:
        assert r["error"] == pytest.approx(r["predicted_gb"] / r["paper_gb"] - 1)
    assert doc["max_abs_error_all"] == max(abs(r["error"]) for r in doc["rows"] if not r["calibration"])
    assert len((tmp_path / "paper_memory.md").read_text().splitlines()) == len(doc["rows"]) + 8


def test_the_gpu_environment_check_names_what_a_wheel_lacks(tmp_path, capsys):
    """A wheel needing a numpy the image does not hold, and a second version of it, are refused."""
    for version in ("1.0", "1.1"):
        with zipfile.ZipFile(tmp_path / f"tinypkg-{version}-py3-none-any.whl", "w") as z:
            z.writestr(
                f"tinypkg-{version}.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\nRequires-Dist: numpy>=99\n\nabout\n",
            )
    with pytest.raises(SystemExit) as stop:
        script("gpu_env").main(["check", str(tmp_path)])
    text = str(stop.value)
    assert "tinypkg-1.1-py3-none-any.whl needs numpy>=99; the image's numpy is" in text
    assert "tinypkg-1.1-py3-none-any.whl: a second version of tinypkg" in text
    assert "dchag needs jsonschema" in text  # dchag's own requirements the image lacks
