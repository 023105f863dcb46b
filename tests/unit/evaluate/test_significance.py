"""The comparison of two runs' scores with its uncertainty: WeatherBench-X's values on recorded
per-init statistics, the rates at which a known difference and none are found, and `dchag
compare-scores` on the files `dchag score` writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as scipy_stats
from support.era5 import LAT, LON, synthetic_truth

from dchag.cli import main
from dchag.evaluate import significance, weather
from dchag.evaluate.compare import compare_hsi, compare_scores
from dchag.figures.scorecard import scorecard
from dchag.store import InputError

REFERENCE = Path(__file__).parents[2] / "data" / "significance" / "weatherbenchx_reference.json"
METRICS = {
    "mse": weather.MSE(),
    "rmse_wb2": weather.RMSE(),
    "rmse_climax": weather.RMSESqrtBeforeTimeAvg(),
    "acc_wb2": weather.ACC(),
    "acc_climax": weather.PooledACC(),
}


def test_intervals_and_p_values_equal_weatherbench_xs():
    ref = json.loads(REFERENCE.read_text())
    cand = {k: np.asarray(v) for k, v in ref["candidate"].items()}
    base = {k: np.asarray(v) for k, v in ref["baseline"].items()}
    alpha, compared = ref["alpha"], 0
    for key, metric in METRICS.items():
        t = significance.compare(metric, cand, base, method="t_test_ar2")
        for quantity in ("difference", "percent"):
            want = ref["t_test_ar2"][f"{key}/{quantity}"]
            got = t[quantity]
            lower, upper = got.interval(alpha)
            assert [got.value, got.standard_error, lower, upper, got.p_value()] == pytest.approx(
                [want[k] for k in ("value", "standard_error", "lower", "upper", "p_value")], rel=1e-9
            ), (key, quantity)
            # the bootstrap: WBX's block length, and its interval on the same resampled times
            want = ref["stationary_bootstrap"][f"{key}/{quantity}"]
            value_c, psi_c = significance.linearise(metric, cand)
            value_b, psi_b = significance.linearise(metric, base)
            value, psi = significance.combine(value_c, value_b, psi_c, psi_b, quantity == "percent")
            block = significance.optimal_block_length(psi)
            assert block == pytest.approx(want["mean_block_length"], rel=1e-9), (key, quantity)
            rng = np.random.default_rng(ref["bootstrap_seed"])
            idx = significance.stationary_indices(psi.size, block, ref["bootstrap_replicates"], rng)
            reps = [metric.of_units(metric.units(s)[idx]) for s in (cand, base)]
            boot = significance.Bootstrap(value, significance.combine(*reps, 0.0, 0.0, quantity == "percent")[0])
            lower, upper = boot.interval(alpha)
            assert [value, lower, upper, boot.p_value()] == pytest.approx(
                [want[k] for k in ("value", "lower", "upper", "p_value")], rel=1e-9, abs=1e-12
            ), (key, quantity)
            compared += 1
    assert compared == 10


def _ar(rng, phi: tuple[float, float], shape: tuple[int, int], burn: int = 50) -> np.ndarray:
    """AR(2) series along the last axis, unit innovations."""
    e = rng.normal(size=(shape[0], shape[1] + burn))
    x = np.zeros_like(e)
    for t in range(2, e.shape[1]):
        x[:, t] = phi[0] * x[:, t - 1] + phi[1] * x[:, t - 2] + e[:, t]
    return x[:, burn:]


def _trials(rng, phi, shift: float, trials: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-init squared errors of a baseline and a candidate over the same weather (a common
    AR series) with AR-correlated differences; the candidate's MSE is (1 + shift) times."""
    weather_noise = _ar(rng, (0.7, 0.1), (trials, n))
    base = np.exp(0.3 * weather_noise) * (1 + 0.02 * _ar(rng, phi, (trials, n)))
    cand = np.exp(0.3 * weather_noise) * (1 + shift + 0.02 * _ar(rng, phi, (trials, n)))
    return cand, base


@pytest.mark.parametrize("phi", [(0.6, 0.0), (0.5, 0.3)], ids=["AR1", "AR2"])
def test_a_small_difference_is_found_and_none_is_not_at_the_stated_rates(phi):
    """400 pairs of forecasts over a year of daily initialisation times with autocorrelated
    errors: with no difference the AR(2)-corrected t-test rejects at about alpha (at most 2
    alpha: it is known to be somewhat optimistic under strong autocorrelation; the naive i.i.d.
    test rejects far more often), with a 1.5 % RMSE difference almost always; the bootstrap
    alike on 30 pairs."""
    rng, alpha, metric = np.random.default_rng(3), 0.05, weather.RMSE()
    rejected = {}
    for shift in (0.0, 0.03):
        cand, base = _trials(rng, phi, shift, 400, 365)
        p = [
            significance.compare(metric, {"squared_error": c}, {"squared_error": b})["difference"].p_value()
            for c, b in zip(cand, base, strict=True)
        ]
        rejected[shift] = np.mean(np.asarray(p) < alpha)
        if shift == 0.0:
            naive = np.mean(scipy_stats.ttest_rel(np.sqrt(cand), np.sqrt(base), axis=1).pvalue < alpha)
        boot = [
            significance.compare(
                metric,
                {"squared_error": c},
                {"squared_error": b},
                method="stationary_bootstrap",
                replicates=200,
                rng=rng,
            )["difference"].p_value()
            for c, b in zip(cand[:30], base[:30], strict=True)
        ]
        rejected[f"boot{shift}"] = np.mean(np.asarray(boot) < alpha)
    assert rejected[0.0] <= 0.1 < 0.2 < naive, (rejected, naive)
    assert rejected[0.03] >= 0.9, rejected
    assert rejected["boot0.0"] <= 0.2 and rejected["boot0.03"] >= 0.8, rejected


def _forecast(truth: xr.Dataset, init, noise: float, seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    leads = np.array([24])
    fc = truth.t2m.sel(time=init + pd.Timedelta(hours=24)).values + rng.normal(
        0, noise, (init.size, LAT.size, LON.size)
    )
    return xr.Dataset(
        {"t2m": (("time", "lead_time", "lat", "lon"), fc[:, None])},
        coords={"time": init, "lead_time": ("lead_time", leads, {"units": "hours"}), "lat": LAT, "lon": LON},
    )


def test_compare_scores_cli_on_the_files_dchag_score_writes(tmp_path):
    times = pd.date_range("2019-01-01", periods=41, freq="D")
    synthetic_truth(times).to_netcdf(tmp_path / "truth.nc")
    truth = xr.load_dataset(tmp_path / "truth.nc")
    init = times[:40]
    for name, noise, seed in (("base", 1.0, 1), ("same", 1.0, 2), ("worse", 1.3, 3)):
        _forecast(truth, init, noise, seed).to_netcdf(tmp_path / f"f_{name}.nc")
        args = ["score", "--forecast", str(tmp_path / f"f_{name}.nc"), "--truth", str(tmp_path / "truth.nc")]
        assert main([*args, "--convention", "climax", "--output", str(tmp_path / f"s_{name}.csv")]) == 0
        assert (tmp_path / f"s_{name}.nc").exists()
    out = {}
    for name in ("same", "worse"):
        args = [
            "compare-scores",
            "--baseline",
            str(tmp_path / "s_base.nc"),
            "--candidate",
            str(tmp_path / f"s_{name}.nc"),
        ]
        args += ["--candidate-name", f"f-{name}", "--equivalence-margin", "5"]
        assert main([*args, "--output", str(tmp_path / f"c_{name}.csv")]) == 0
        out[name] = pd.read_csv(tmp_path / f"c_{name}.csv").set_index(["region", "metric"])
    worse, same = out["worse"].loc[("global", "rmse")], out["same"].loc[("global", "rmse")]
    assert worse.verdict == "worse" and worse.p_value < 0.05 and worse.percent_lower > 0
    change = 100 * (worse.candidate_score - worse.baseline_score) / worse.baseline_score
    assert worse.percent_change == pytest.approx(change)
    scores = pd.read_csv(tmp_path / "s_worse.csv").set_index(["region", "metric"]).value
    assert (worse.candidate, worse.baseline) == ("f-worse", "baseline")
    assert worse.candidate_score == pytest.approx(scores[("global", "rmse")], rel=1e-9)  # the score's own value
    assert same.verdict == "no significant difference" and same.percent_lower < 0 < same.percent_upper
    assert same.equivalence == "within 5%" and worse.equivalence == "not shown within 5%"
    assert out["same"].loc[("global", "acc")].verdict in ("better", "worse", "no significant difference")
    assert set(out["same"].index.get_level_values("region")) == set(weather.REGIONS)
    assert (out["same"].method == "t_test_ar2").all() and (out["same"].n_init == 40).all()
    # the scorecard of both pairs: its cells are the tables', signed so that positive is better
    card_png = tmp_path / "scorecard.png"
    assert (
        main(
            [
                "figure",
                "scorecard",
                str(tmp_path / "c_same.csv"),
                str(tmp_path / "c_worse.csv"),
                "--output",
                str(card_png),
            ]
        )
        == 0
    )
    assert card_png.stat().st_size > 10_000 and card_png.with_suffix(".pdf").exists()
    caption = card_png.with_suffix(".csv").read_text().splitlines()[0]
    assert "AR(2)" in caption and "over 40 common initialisation times" in caption
    card = pd.read_csv(card_png.with_suffix(".csv"), comment="#").set_index(["candidate", "region", "metric"])
    assert card.loc[("f-worse", "global", "rmse")].improvement == pytest.approx(-worse.percent_change)
    assert (
        card.loc[("f-worse", "global", "rmse")].significant and not card.loc[("f-same", "global", "rmse")].significant
    )
    low, high = card.loc[("f-worse", "global", "rmse"), ["improvement_lower", "improvement_upper"]]
    assert (low, high) == pytest.approx((-worse.percent_upper, -worse.percent_lower))
    with pytest.raises(InputError, match=r"s_same.csv is not a table of dchag compare-scores: it lacks baseline"):
        scorecard([str(tmp_path / "s_same.csv")], str(tmp_path / "bad.png"))
    other = tmp_path / "s_wb2.nc"
    xr.load_dataset(tmp_path / "s_base.nc").assign_attrs(convention="wb2").to_netcdf(other)
    with pytest.raises(InputError, match=r"s_base.nc and .*s_wb2.nc differ in convention \(climax and wb2\)"):
        compare_scores(tmp_path / "s_base.nc", other)
    with pytest.raises(InputError, match=r"alpha 0.7: expected .* 0 < alpha < 0.5"):
        compare_scores(tmp_path / "s_base.nc", tmp_path / "s_same.nc", alpha=0.7)


def _classification_map(path: Path, truth: np.ndarray, accuracy: float, seed: int) -> None:
    """A map as `dchag evaluate-classification --map` writes it: test pixels (split 2), classes
    1..K, each predicted right with probability ``accuracy`` and otherwise at random."""
    rng = np.random.default_rng(seed)
    pred = np.where(rng.random(truth.size) < accuracy, truth, rng.integers(5, size=truth.size))
    shape = (60, truth.size // 60)
    np.savez_compressed(
        path,
        truth=(truth + 1).reshape(shape).astype(np.int16),
        pred=(pred + 1).reshape(shape).astype(np.int16),
        split=np.full(shape, 2, np.int8),
        class_names=np.asarray([f"c{k}" for k in range(5)]),
    )


def test_a_baseline_scoring_zero_has_no_percent_change_but_is_compared(tmp_path):
    """A baseline that predicts one class everywhere (a kappa of 0, as a short run can end):
    the percent change of its kappa is undefined (NaN), the difference and its verdict are not."""
    truth = np.random.default_rng(0).integers(5, size=600)
    _classification_map(tmp_path / "good.npz", truth, 0.8, 1)
    with np.load(tmp_path / "good.npz") as z:
        one_class = {k: z[k] for k in z.files} | {"pred": np.ones_like(z["pred"])}
    np.savez_compressed(tmp_path / "one_class.npz", **one_class)
    table = compare_hsi(tmp_path / "one_class.npz", tmp_path / "good.npz", replicates=200).set_index("metric")
    assert table.loc["kappa", "baseline_score"] == 0 and np.isnan(table.loc["kappa", "percent_change"])
    assert table.loc["kappa", "verdict"] == "better" and table.loc["kappa", "difference"] > 0.5
    assert np.isfinite(table.loc["overall_accuracy", "percent_change"])


def test_hyperspectral_runs_compared_by_a_paired_bootstrap_over_test_samples(tmp_path):
    from dchag.evaluate import classification, recon
    from dchag.evaluate.hsi import tile_errors

    truth = np.random.default_rng(0).integers(5, size=3000)
    for name, accuracy, seed in (("base", 0.8, 1), ("same", 0.8, 2), ("worse", 0.75, 3)):
        _classification_map(tmp_path / f"{name}.npz", truth, accuracy, seed)
    rows = {}
    for name in ("same", "worse"):
        args = [
            "compare-scores",
            "--baseline",
            str(tmp_path / "base.npz"),
            "--candidate",
            str(tmp_path / f"{name}.npz"),
        ]
        assert main([*args, "--candidate-name", name, "--output", str(tmp_path / f"{name}.csv")]) == 0
        rows[name] = pd.read_csv(tmp_path / f"{name}.csv").set_index("metric")
    worse, same = rows["worse"], rows["same"]
    with np.load(tmp_path / "worse.npz") as z:  # the table's scores are the classification scores
        expected = classification.scores(truth, z["pred"].ravel() - 1, [f"c{k}" for k in range(5)])
    for metric in ("overall_accuracy", "average_accuracy", "kappa"):
        assert worse.loc[metric, "candidate_score"] == pytest.approx(expected[metric], rel=1e-9)  # CSV: 10 digits
        assert worse.loc[metric, "verdict"] == "worse" and worse.loc[metric, "p_value"] < 0.01
        assert same.loc[metric, "verdict"] == "no significant difference", same.loc[metric]
        assert (
            worse.loc[metric, "difference_lower"]
            < worse.loc[metric, "difference"]
            < worse.loc[metric, "difference_upper"]
            < 0
        )
    assert (worse.n_samples == 3000).all() and (worse.method == "paired_bootstrap").all()
    # reconstructions: the RMSE pooled over the resampled tiles, masked and full
    rng = np.random.default_rng(1)
    cube = rng.normal(size=(24, 6, 16, 16))
    masks = rng.random((24, 16, 16)) < 0.75
    for name, noise in (("base", 1.0), ("worse", 1.1)):
        np.savez(tmp_path / f"r_{name}.npz", **tile_errors(cube, cube + rng.normal(0, noise, cube.shape), masks))
    table = compare_hsi(tmp_path / "r_base.npz", tmp_path / "r_worse.npz").set_index("region")
    pred = cube + np.random.default_rng(99).normal(0, 1.1, cube.shape)
    errors = tile_errors(cube, pred, masks)
    got = np.sqrt(errors["tile_masked_se"].sum() / errors["tile_masked_count"].sum())
    assert got == pytest.approx(recon.masked_and_full(cube, pred, masks)["masked"]["rmse"], rel=1e-12)
    assert table.loc["masked", "verdict"] == "worse" and table.loc["full", "verdict"] == "worse"
    assert 5 < table.loc["full", "percent_change"] < 15 and table.loc["full", "percent_lower"] > 0
    with pytest.raises(InputError, match="not results on the same test samples"):
        compare_hsi(tmp_path / "r_base.npz", tmp_path / "base.npz")
