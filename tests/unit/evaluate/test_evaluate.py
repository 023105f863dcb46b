"""Evaluation: weather scores under both conventions, `dchag score` on real files, the
hyperspectral reconstruction and classification scores, and the one-device export of a
parallel checkpoint."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from pandas.testing import assert_frame_equal
from support import parallel_checks
from support.distributed import run_distributed
from support.era5 import LAT, LON, synthetic_truth

from dchag.cli import main
from dchag.evaluate import classification, perinit, recon, weather
from dchag.evaluate.score import ScoreError, score_files, score_statistics


# -- weather metrics, by hand ---------------------------------------------------------------
def test_rmse_conventions_differ_as_defined():
    # Two times on a 2x2 grid at latitudes +-60: cos = 0.5 at both, so every weight is 1.
    lat = np.array([-60.0, 60.0])
    w = weather.lat_weights(lat)
    assert np.allclose(w, 1.0)
    truth = np.zeros((2, 2, 2))
    fc = np.stack([np.full((2, 2), 1.0), np.full((2, 2), 2.0)])  # spatial MSE 1 and 4
    assert weather.mse(fc, truth, w) == pytest.approx(2.5)
    assert weather.rmse(fc, truth, w, "wb2") == pytest.approx(math.sqrt(2.5))  # 1.5811
    assert weather.rmse(fc, truth, w, "climax") == pytest.approx(1.5)  # (1 + 2) / 2


def test_latitude_weights_by_hand():
    lat = np.array([0.0, 60.0])  # cell bounds -90, 30, 90: areas sin 30 - sin -90 = 1.5 and 0.5
    w = weather.lat_weights(lat)
    assert w.ravel() == pytest.approx([1.5, 0.5])
    assert weather.lat_weights(lat, "climax").ravel() == pytest.approx([4 / 3, 2 / 3])  # cos 1, 0.5
    truth = np.zeros((1, 2, 1))
    fc = np.array([[[3.0], [0.0]]])  # error only at the equator: (1.5 * 9 + 0) / 2
    assert weather.mse(fc, truth, w) == pytest.approx(6.75)


def _wb2_get_lat_weights(lat_deg):
    """WeatherBench 2's metrics.get_lat_weights, as its definition reads: the integral of cos
    between bounds halfway between rows and at the poles, over its mean."""
    x = np.deg2rad(lat_deg)
    bounds = [-math.pi / 2, *((a + b) / 2 for a, b in zip(x[:-1], x[1:])), math.pi / 2]
    area = np.array([math.sin(u) - math.sin(lo) for lo, u in zip(bounds[:-1], bounds[1:])])
    return area / area.mean()


@pytest.mark.parametrize(
    "lat",
    [
        np.arange(-90 + 1.40625 / 2, 90, 1.40625),  # the 1.40625 deg WeatherBench grid (128 rows): no poles
        np.linspace(-90, 90, 121),  # 1.5 deg with both poles (WeatherBench 2's equiangular grids)
        np.array([-80.0, -30.0, 0.0, 10.0, 75.0]),  # uneven rows
    ],
)
def test_wb2_latitude_weights_are_cell_areas_on_any_grid(lat):
    w = weather.lat_weights(lat).ravel()
    assert w == pytest.approx(_wb2_get_lat_weights(lat), rel=1e-12)
    cos = np.cos(np.deg2rad(lat))
    same_as_cos = np.allclose(w, cos / cos.mean(), rtol=1e-9)
    assert same_as_cos == (lat.size == 128)  # equal exactly on the pole-free, evenly spaced grid
    if lat[0] == -90:
        assert w[0] > 0 and cos[0] == pytest.approx(0, abs=1e-15)  # the pole cell has an area
    with pytest.raises(weather.WeatherScoreError, match="increasing"):
        weather.lat_weights(lat[::-1])


def _climax_lat_weighted_acc(pred, y, clim, lat):
    """ClimaX's ``lat_weighted_acc`` (climax/utils/metrics.py) for one variable and one batch, in
    torch as it is written there: clim subtracted, each batch centred by its own mean, one
    pooled cos-weighted correlation."""
    w_lat = np.cos(np.deg2rad(lat))
    w_lat = torch.from_numpy(w_lat / w_lat.mean()).unsqueeze(0).unsqueeze(-1)  # [1, H, 1]
    pred, y = torch.from_numpy(pred) - torch.from_numpy(clim), torch.from_numpy(y) - torch.from_numpy(clim)
    pred_prime = pred - torch.mean(pred)
    y_prime = y - torch.mean(y)
    return float(
        torch.sum(w_lat * pred_prime * y_prime)
        / torch.sqrt(torch.sum(w_lat * pred_prime**2) * torch.sum(w_lat * y_prime**2))
    )


@pytest.mark.parametrize("batch_size", [None, 1, 3])
def test_climax_acc_equals_climax_code(batch_size):
    rng = np.random.default_rng(7)
    lat = np.linspace(-84.375, 84.375, 16)  # 11.25 deg, pole-free
    truth = rng.normal(size=(7, 16, 8)) + 2 * np.cos(np.deg2rad(lat))[:, None]
    fc = truth + rng.normal(scale=0.8, size=truth.shape) + rng.normal(size=(7, 1, 1))  # a per-sample bias
    clim = truth.mean(0)
    size = batch_size or 7
    batches = [(s, min(s + size, 7)) for s in range(0, 7, size)]
    # Lightning's epoch value of a metric logged with batch_size=len(x): the size-weighted mean.
    expected = np.average(
        [_climax_lat_weighted_acc(fc[a:b], truth[a:b], clim, lat) for a, b in batches],
        weights=[b - a for a, b in batches],
    )
    got = weather.acc_climax(fc, truth, clim, weather.lat_weights(lat, "climax"), batch_size)
    assert got == pytest.approx(expected, rel=1e-12)
    if batch_size == 1:  # centring per batch differs from centring over the whole set
        fa, ta = fc - clim, truth - clim
        fa, ta = fa - fa.mean(), ta - ta.mean()
        w = weather.lat_weights(lat, "climax")
        whole = np.mean(
            [(w * fa[i] * ta[i]).sum() / np.sqrt((w * fa[i] ** 2).sum() * (w * ta[i] ** 2).sum()) for i in range(7)]
        )
        assert abs(got - whole) > 1e-3


def test_wb2_acc_by_hand():
    lat = np.array([-60.0, 60.0])
    w = weather.lat_weights(lat)
    clim = np.zeros((2, 2))
    # time 0: forecast anomaly (1, 0, 0, 1), truth (1, 0, 0, 0) -> uncentred corr 1/sqrt(2*1)
    # time 1: identical anomalies (2, 1, 0, 1) -> 1
    f = np.array([[[1, 0], [0, 1]], [[2, 1], [0, 1]]], float)
    t = np.array([[[1, 0], [0, 0]], [[2, 1], [0, 1]]], float)
    wb2 = weather.acc_wb2(f, t, np.broadcast_to(clim, f.shape), w)
    assert wb2 == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert abs(weather.acc_climax(f, t, clim, w) - wb2) > 0.01


@pytest.fixture
def files(tmp_path):
    times = pd.date_range("2019-01-01", periods=40, freq="D")
    truth = synthetic_truth(times)
    truth.to_netcdf(tmp_path / "truth.nc")
    rng = np.random.default_rng(1)
    init = times[:30]
    leads = np.array([24, 72])
    fc = np.stack(
        [
            truth.t2m.sel(time=init + pd.Timedelta(hours=int(h))).values
            + rng.normal(0, 0.5 + h / 100, (30, LAT.size, LON.size))
            for h in leads
        ],
        axis=1,
    )
    # WeatherBench-style names, descending latitude, numeric lead times in hours.
    fds = xr.Dataset(
        {"t2m": (("time", "lead_time", "latitude", "longitude"), fc[:, :, ::-1])},
        coords={
            "time": init,
            "lead_time": ("lead_time", leads, {"units": "hours"}),
            "latitude": LAT[::-1],
            "longitude": LON,
        },
    )
    fds.to_netcdf(tmp_path / "forecast.nc")
    doy = np.arange(1, 367)
    clim = (
        280
        + 10 * np.sin(2 * np.pi * doy / 365.25)[:, None, None]
        + 5 * np.cos(np.deg2rad(LAT))[None, :, None]
        + 0 * LON
    )
    xr.Dataset(
        {"t2m": (("dayofyear", "latitude", "longitude"), clim)},
        coords={"dayofyear": doy, "latitude": LAT, "longitude": LON},
    ).to_zarr(tmp_path / "clim.zarr", zarr_format=3, consolidated=False)
    return tmp_path, truth, fc, init, leads, clim


REGION_ROWS = {  # WeatherBench 2's regions, by latitude (bounds included)
    "global": np.ones(LAT.size, bool),
    "tropics": np.abs(LAT) <= 20,
    "extra-tropics": np.abs(LAT) >= 20,
    "northern-extra-tropics": LAT >= 20,
    "southern-extra-tropics": LAT <= -20,
}


def _reference(truth, fc, init, leads, clim, convention, region="global"):
    """The definitions, written out with explicit loops (independent of dchag.evaluate.weather);
    a region's cells weighted by cos(latitude) normalised over its rows."""
    rows = REGION_ROWS[region]
    w = np.cos(np.deg2rad(LAT[rows]))
    w = w / w.mean()
    out = {}
    for j, h in enumerate(leads):
        mses, accs = [], []
        valid = init + pd.Timedelta(hours=int(h))
        for i, v in enumerate(valid):
            f = fc[i, j][rows]
            t = truth.t2m.sel(time=v).values[rows]
            mses.append(np.mean(w[:, None] * (f - t) ** 2))
            c = clim[v.day_of_year - 1][rows]
            fa, ta = f - c, t - c
            accs.append(
                np.mean(w[:, None] * fa * ta) / np.sqrt(np.mean(w[:, None] * fa**2) * np.mean(w[:, None] * ta**2))
            )
        mses = np.array(mses)
        rmse = np.sqrt(mses.mean()) if convention == "wb2" else np.sqrt(mses).mean()
        out[(h, "rmse")], out[(h, "mse")], out[(h, "acc")] = rmse, mses.mean(), np.mean(accs)
    return out


def test_score_files_wb2_matches_the_definition(files):
    root, truth, fc, init, leads, clim = files
    df = score_files(str(root / "forecast.nc"), str(root / "truth.nc"), str(root / "clim.zarr"), "wb2")
    ref = {r: _reference(truth, fc, init, leads, clim, "wb2", r) for r in REGION_ROWS}
    assert list(df.columns) == ["variable", "lead_time_hours", "region", "metric", "value", "convention"]
    assert (df.convention == "wb2").all() and set(df.variable) == {"t2m"}
    assert set(df.region) == set(REGION_ROWS) and len(df) == 2 * 3 * len(REGION_ROWS)
    for _, row in df.iterrows():
        assert row.value == pytest.approx(ref[row.region][(int(row.lead_time_hours), row.metric)], rel=1e-9)
    # Error grows with lead: RMSE at 72 h above 24 h.
    r = df[(df.metric == "rmse") & (df.region == "global")].set_index("lead_time_hours").value
    assert r[72.0] > r[24.0]


def test_score_cli_climax_differs_from_wb2_and_depends_on_batch_size(files, tmp_path):
    root, truth, fc, init, leads, clim = files
    out, stats = {}, {}
    for conv, extra in (
        ("wb2", ["--climatology", str(root / "clim.zarr")]),
        ("climax", []),
        ("climax5", ["--batch-size", "5"]),
    ):
        path = tmp_path / f"{conv}.csv"
        assert (
            main(
                [
                    "score",
                    "--forecast",
                    str(root / "forecast.nc"),
                    "--truth",
                    str(root / "truth.nc"),
                    *extra,
                    "--convention",
                    conv[:6],
                    "--output",
                    str(path),
                ]
            )
            == 0
        )
        df = pd.read_csv(path)
        out[conv] = df[df.region == "global"].set_index(["lead_time_hours", "metric"]).value
        stats[conv] = perinit.open_statistics(path.with_suffix(".nc"))
        assert_frame_equal(
            perinit.table(stats[conv]), df, check_exact=False, check_dtype=False, rtol=1e-9
        )  # the CSV from the file
    assert out["climax"][(24, "mse")] == pytest.approx(out["wb2"][(24, "mse")])
    assert out["climax"][(24, "rmse")] < out["wb2"][(24, "rmse")]  # mean of roots <= root of mean
    # ClimaX ACC: anomalies against the scored period's time mean, batch-centred and pooled.
    w = weather.lat_weights(LAT, "climax")
    valid = init + pd.Timedelta(hours=24)
    scored = sorted(set(init + pd.Timedelta(hours=24)) | set(init + pd.Timedelta(hours=72)))
    tm = truth.t2m.sel(time=scored).mean("time").values
    f, t = fc[:, 0] - tm, truth.t2m.sel(time=valid).values - tm
    f, t = f - f.mean(), t - t.mean()
    expected = (w * f * t).sum() / np.sqrt((w * f**2).sum() * (w * t**2).sum())
    assert out["climax"][(24, "acc")] == pytest.approx(expected, rel=1e-9)
    assert out["climax5"][(24, "acc")] != pytest.approx(out["climax"][(24, "acc")], rel=1e-6)
    assert abs(out["climax"][(24, "acc")] - out["wb2"][(24, "acc")]) > 1e-3
    _recompute_from_the_statistics(stats, out, init)


def _recompute_from_the_statistics(stats, out, init):
    """RMSE and ACC recomputed by hand from the per-init netCDF equal the CSV's."""
    s = {c: ds.t2m.sel(region="global", lead_time=pd.Timedelta(hours=24)) for c, ds in stats.items()}
    for conv in stats:
        assert s[conv].dims == ("statistic", "init_time") and (s[conv].init_time.values == init.values).all()
    se = s["wb2"].sel(statistic="squared_error").values
    assert out["wb2"][(24, "rmse")] == pytest.approx(np.sqrt(se.mean()), rel=1e-9)
    assert out["climax"][(24, "rmse")] == pytest.approx(np.sqrt(se).mean(), rel=1e-9)
    ap, ff, tt = (
        s["wb2"].sel(statistic=k).values
        for k in ("anomaly_product", "forecast_anomaly_squared", "truth_anomaly_squared")
    )
    assert out["wb2"][(24, "acc")] == pytest.approx(np.mean(ap / np.sqrt(ff * tt)), rel=1e-9)
    for conv, size in (("climax", 30), ("climax5", 5)):
        x = {k: s[conv].sel(statistic=k).values for k in s[conv].statistic.values}
        accs = []
        for b in range(0, 30, size):
            m = {k: v[b : b + size].mean() for k, v in x.items()}
            mf, mt = m["forecast_anomaly_unweighted"], m["truth_anomaly_unweighted"]
            num = m["anomaly_product"] - mt * m["forecast_anomaly"] - mf * m["truth_anomaly"] + mf * mt
            vf = m["forecast_anomaly_squared"] - 2 * mf * m["forecast_anomaly"] + mf**2
            vt = m["truth_anomaly_squared"] - 2 * mt * m["truth_anomaly"] + mt**2
            accs.append(num / np.sqrt(vf * vt))
        assert out[conv][(24, "acc")] == pytest.approx(np.mean(accs), rel=1e-9)


def test_score_errors_name_what_is_wrong(files, tmp_path, capsys):
    root, truth, *_ = files
    fc, tr, cl = str(root / "forecast.nc"), str(root / "truth.nc"), str(root / "clim.zarr")
    out = str(tmp_path / "s.csv")

    def run(*args):
        code = main(["score", *args, "--output", out])
        return code, capsys.readouterr().err

    code, err = run("--forecast", fc, "--truth", tr, "--convention", "wb2")
    assert code == 2 and "climatology" in err
    coarse = truth.isel(lat=slice(None, None, 2), lon=slice(None, None, 2))
    coarse.to_netcdf(root / "coarse.nc")
    code, err = run("--forecast", fc, "--truth", str(root / "coarse.nc"), "--climatology", cl, "--convention", "wb2")
    assert code == 2 and "forecast.nc" in err and "coarse.nc" in err and "--regrid" in err
    late = truth.assign_coords(time=truth.time + np.timedelta64(800, "D"))
    late.to_netcdf(root / "late.nc")
    code, err = run("--forecast", fc, "--truth", str(root / "late.nc"), "--metrics", "rmse", "--convention", "wb2")
    assert code == 2 and "no overlapping valid times" in err
    code, err = run("--forecast", fc, "--truth", tr, "--variables", "z500", "--metrics", "rmse", "--convention", "wb2")
    assert code == 2 and "'z500'" in err and "forecast.nc" in err
    assert not (tmp_path / "s.csv").exists()


def test_climatology_without_the_scored_days_is_an_error_naming_them(files, tmp_path):
    root, *_ = files
    clim = xr.open_zarr(root / "clim.zarr", consolidated=False).load()
    clim["t2m"][9:12] = np.nan  # days 10-12 out of the climatology years' reach
    clim.to_zarr(tmp_path / "gappy.zarr", zarr_format=3, consolidated=False)
    with pytest.raises(ScoreError, match=r"no values for 't2m' on day\(s\) of year \[10, 11, 12\]"):
        score_files(str(root / "forecast.nc"), str(root / "truth.nc"), str(tmp_path / "gappy.zarr"), "wb2")
    # The climatology forecast refuses them too, instead of forecasting NaN.
    from dchag.evaluate.score import _climatology_at

    with pytest.raises(ScoreError, match="day\\(s\\) of year \\[11\\]"):
        _climatology_at(
            clim.rename(latitude="lat", longitude="lon")["t2m"], pd.DatetimeIndex(["2019-01-11"]), "gappy.zarr", "t2m"
        )


def test_score_regrids_the_forecast_when_asked(files, tmp_path):
    root, truth, *_ = files
    # A 2.8125 deg forecast equal to a smooth field; the truth is that field at 5.625 deg.
    lat2 = np.arange(-90 + 2.8125 / 2, 90, 2.8125)
    lon2 = np.arange(0, 360, 2.8125)
    times = truth.time.values[:5]

    def field(la, lo):
        return 280 + 10 * np.cos(np.deg2rad(la))[:, None] + np.sin(np.deg2rad(lo))[None, :]

    xr.Dataset(
        {"t2m": (("time", "lat", "lon"), np.repeat(field(lat2, lon2)[None], 5, 0))},
        coords={"time": times, "lat": lat2, "lon": lon2, "prediction_timedelta": np.timedelta64(0, "h")},
    ).to_netcdf(root / "fine.nc")
    xr.Dataset(
        {"t2m": (("time", "lat", "lon"), np.repeat(field(LAT, LON)[None], 5, 0))},
        coords={"time": times, "lat": LAT, "lon": LON},
    ).to_netcdf(root / "smooth.nc")
    df = score_files(
        str(root / "fine.nc"), str(root / "smooth.nc"), convention="wb2", metrics=["rmse"], regrid="bilinear"
    )
    assert df.value.iloc[0] < 0.05  # bilinear of a smooth field: small interpolation error only


# -- hyperspectral reconstruction -----------------------------------------------------------
def test_reconstruction_scores_match_scikit_image_and_definitions():
    skm = pytest.importorskip("skimage.metrics")
    rng = np.random.default_rng(3)
    truth = rng.uniform(100, 3000, (19, 23, 9))
    truth[0, 0] = 0.0  # a zero spectrum: left out of SAM
    pred = truth * rng.uniform(0.9, 1.1, truth.shape) + rng.normal(0, 30, truth.shape)
    pred[0, 0] = 0.0
    r = recon.scores(truth, pred, band_axis=-1, data_range=3000.0)
    ssim = np.mean(
        [
            skm.structural_similarity(
                truth[..., b],
                pred[..., b],
                data_range=3000.0,
                gaussian_weights=True,
                sigma=1.5,
                use_sample_covariance=False,
            )
            for b in range(9)
        ]
    )
    assert r["ssim"] == pytest.approx(ssim, rel=1e-10)
    assert r["psnr"] == pytest.approx(skm.peak_signal_noise_ratio(truth, pred, data_range=3000.0), rel=1e-10)
    assert r["psnr_band_mean"] == pytest.approx(
        np.mean([skm.peak_signal_noise_ratio(truth[..., b], pred[..., b], data_range=3000.0) for b in range(9)]),
        rel=1e-10,
    )
    assert r["rmse"] == pytest.approx(np.sqrt(np.mean((truth - pred) ** 2)))
    t, p = truth.reshape(-1, 9)[1:], pred.reshape(-1, 9)[1:]
    angles = np.arccos(np.clip((t * p).sum(1) / np.linalg.norm(t, axis=1) / np.linalg.norm(p, axis=1), -1, 1))
    assert r["sam"] == pytest.approx(angles.mean()) and r["sam_pixels_left_out"] == 1
    band_rmse = np.sqrt(((truth - pred) ** 2).mean(axis=(0, 1)))
    assert r["ergas"] == pytest.approx(100 * np.sqrt(np.mean((band_rmse / truth.mean(axis=(0, 1))) ** 2)))


def test_reconstruction_scores_on_a_mask():
    rng = np.random.default_rng(4)
    truth = rng.uniform(1, 2, (2, 5, 16, 16))  # tiles, bands, rows, cols
    pred = truth.copy()
    mask = np.zeros((2, 16, 16), bool)
    mask[:, :8] = True
    pred[:, :, :8] += 0.5  # errors only where masked
    full = recon.scores(truth, pred, band_axis=1, data_range=1.0)
    masked = recon.scores(truth, pred, band_axis=1, data_range=1.0, mask=mask)
    assert masked["rmse"] == pytest.approx(0.5) and full["rmse"] == pytest.approx(0.5 / math.sqrt(2))
    assert masked["psnr"] == pytest.approx(10 * math.log10(1 / 0.25))


def test_score_recon_cli(tmp_path):
    rng = np.random.default_rng(5)
    t = rng.uniform(0, 1, (12, 14, 6)).astype(np.float32)
    np.save(tmp_path / "t.npy", t)
    np.save(tmp_path / "p.npy", t + 0.01)
    assert (
        main(
            [
                "score-recon",
                "--truth",
                str(tmp_path / "t.npy"),
                "--pred",
                str(tmp_path / "p.npy"),
                "--data-range",
                "1",
                "--output",
                str(tmp_path / "s.json"),
            ]
        )
        == 0
    )
    s = json.loads((tmp_path / "s.json").read_text())
    assert set(recon.KEYS) <= set(s) and s["data_range"] == 1.0
    assert s["psnr"] == pytest.approx(40.0, abs=1e-3)
    np.save(tmp_path / "q.npy", t[:, :, :5])
    assert (
        main(
            [
                "score-recon",
                "--truth",
                str(tmp_path / "t.npy"),
                "--pred",
                str(tmp_path / "q.npy"),
                "--output",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )


# -- classification ---------------------------------------------------------------------------
def test_classification_scores_by_hand_and_against_scikit_learn():
    from sklearn.metrics import cohen_kappa_score

    truth = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    pred = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 0])
    s = classification.scores(truth, pred, ["a", "b", "c"])
    assert s["confusion_matrix"] == [[3, 1, 0], [0, 1, 1], [1, 0, 3]]
    assert s["overall_accuracy"] == pytest.approx(0.7)
    assert s["average_accuracy"] == pytest.approx((3 / 4 + 1 / 2 + 3 / 4) / 3)
    assert s["kappa"] == pytest.approx(cohen_kappa_score(truth, pred))
    assert [c["support"] for c in s["per_class"]] == [4, 2, 4]


# -- a parallel checkpoint on one device ------------------------------------------------------
@pytest.mark.parametrize("strategy,kw", [("dchag", {}), ("baseline", {"aggregation": "baseline", "groups": 1})])
def test_parallel_checkpoint_loads_into_the_one_device_model(tmp_path, strategy, kw):
    from dchag.model import ChannelViT
    from dchag.train.checkpoint import load_weights

    run_distributed(parallel_checks.check_checkpoint_exports, 2, strategy, str(tmp_path), kw)
    ref = torch.load(tmp_path / "reference.pt")
    model = ChannelViT(parallel_checks.small_config(**kw))
    load_weights(model, tmp_path / "final")
    with torch.no_grad():
        out = model(ref["x"], ref["lead"])
    torch.testing.assert_close(out, ref["out"], rtol=1e-5, atol=1e-6)


def test_json_outputs_are_strict_json(tmp_path):
    """NaN is not JSON: result files write null, and a strict parser reads them."""
    import json

    from dchag.evaluate.recon import write_json

    out = write_json({"ssim": float("nan"), "per_band": np.array([1.0, np.inf]), "n": np.int64(3)}, tmp_path / "r.json")
    text = out.read_text() if hasattr(out, "read_text") else (tmp_path / "r.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data == {"ssim": None, "per_band": [1.0, None], "n": 3}


# -- WeatherBench 2's layout and its evaluation on the pipeline's files ---------------------------
@pytest.fixture(scope="module")
def pipeline_files(tmp_path_factory):
    """Truth, climatology (in WB2's layout) and the persistence forecast as the pipeline writes
    them, from the real preprocessing of 40-day synthetic years."""
    from support.era5 import small_era5_config

    from dchag.era5 import demo
    from dchag.era5.climatology import climatology
    from dchag.era5.preprocess import make_weights, preprocess_year
    from dchag.era5.split import build_split
    from dchag.era5.statistics import normalization_stats
    from dchag.evaluate.forecast import baseline_forecast, wb2_climatology, write_truth

    raw = tmp_path_factory.mktemp("raw")
    for year in (2001, 2002, 2003):
        demo.write_year(raw, year, 3.75, [500, 850], days=40)
    demo.write_constants(raw, 3.75)
    cfg = small_era5_config(raw)
    root = tmp_path_factory.mktemp("wb2")
    make_weights(cfg["era5"], 2001, root / "w.nc")
    years = {y: preprocess_year(cfg["era5"], y, root / "w.nc", root / f"y{y}.zarr") for y in (2001, 2002, 2003)}
    stats = normalization_stats([years[2001]], root / "stats.json")
    build_split("test", [years[2003]], stats, root / "test.zarr")
    climatology([years[2001], years[2002]], root / "clim_dchag.zarr")
    wb2_climatology(str(root / "clim_dchag.zarr"), str(root / "climatology.zarr"))
    variables = ["z500", "t850", "t2m", "u10"]
    write_truth(str(root / "test.zarr"), variables, str(root / "truth.zarr"))
    baseline_forecast(
        "persistence",
        str(root / "test.zarr"),
        variables,
        [24, 72],
        str(root / "forecast.zarr"),
        str(root / "climatology.zarr"),
    )
    return root


def _wb2_evaluate_by_init(forecast: str, truth: str, climatology: str, region: str = "global") -> dict:
    """WeatherBench 2's evaluate_in_memory on by-init forecasts (evaluation.py,
    metrics.py), as its code reads, for MSE, RMSESqrtBeforeTimeAvg and ACC: open with
    xr.open_zarr's defaults (but no dask), latitude increasing, time -> init_time, prediction_timedelta ->
    lead_time, valid_time = init_time + lead_time, truth at the valid times, the climatology
    at the valid times' day of year (and hour, if it has one) and the forecast's levels,
    spatial means over ``region`` (regions.py) weighted by get_lat_weights, then the mean over
    init_time. Returns
    {(variable, level, lead hours, metric): value}."""

    def increasing(ds):
        return ds.isel(latitude=slice(None, None, -1)) if (np.diff(ds.latitude.values) < 0).all() else ds

    # Without dask (chunks=None): WB2's dask arrays would here be a task per small chunk (the
    # same values and arithmetic; the sums' order differs only in the last bits).
    fc = increasing(xr.open_zarr(forecast, chunks=None))
    obs = increasing(xr.open_zarr(truth, chunks=None))
    clim = increasing(xr.open_zarr(climatology, chunks=None))
    fc = fc.rename(time="init_time", prediction_timedelta="lead_time")
    fc = fc.assign_coords(valid_time=fc.init_time + fc.lead_time)
    obs = obs.sel(time=fc.valid_time)
    x = np.deg2rad(fc.latitude.values)
    bounds = np.concatenate([[-np.pi / 2], (x[:-1] + x[1:]) / 2, [np.pi / 2]])
    area = np.sin(bounds[1:]) - np.sin(bounds[:-1])
    w = xr.DataArray(area / area.mean(), dims="latitude", coords={"latitude": fc.latitude})
    lsm = obs.land_sea_mask
    obs = obs.drop_vars("land_sea_mask")

    def spatial(ds):  # regions.py: SliceRegion slices the data, the others multiply the weights
        data, weights = ds, w
        if region == "tropics":
            data = ds.sel(latitude=slice(-20, 20))
        elif region == "extra-tropics":
            weights = w * (np.abs(ds.latitude) >= 20).astype(float)
        elif region in ("land", "sea"):  # LandRegion(land_sea_mask), LandRegion(1 - land_sea_mask)
            weights = w * (lsm if region == "land" else 1 - lsm)
        return data.weighted(weights).mean(["latitude", "longitude"])

    c = clim[list(fc.data_vars)].sel(level=fc.level) if "level" in fc.dims else clim[list(fc.data_vars)]
    sel = {"dayofyear": fc.valid_time.dt.dayofyear}
    if "hour" in c.coords:
        sel["hour"] = fc.valid_time.dt.hour
    c = c.sel(sel)
    fa, ta = fc - c, obs - c
    results = {
        "mse": spatial((fc - obs) ** 2).mean("init_time"),
        "rmse_sqrt_before_time_avg": np.sqrt(spatial((fc - obs) ** 2)).mean("init_time"),
        "acc": (spatial(fa * ta) / np.sqrt(spatial(fa**2) * spatial(ta**2))).mean("init_time"),
    }
    out = {}
    for metric, ds in results.items():
        ds = ds.compute()
        for var in ds.data_vars:
            da = ds[var]
            for lev in da.level.values if "level" in da.dims else [None]:
                part = da.sel(level=lev) if lev is not None else da
                for lead in part.lead_time.values:
                    value = float(part.sel(lead_time=lead))
                    if not np.isnan(value):  # a level this variable is not forecast at
                        out[(str(var), None if lev is None else int(lev), lead / np.timedelta64(1, "h"), metric)] = (
                            value
                        )
    return out


def test_the_pipelines_files_are_weatherbench2s_layout(pipeline_files):
    import warnings

    root = pipeline_files
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # opened by xr.open_zarr's defaults (consolidated metadata), quietly
        fc, truth, clim = (xr.open_zarr(root / f) for f in ("forecast.zarr", "truth.zarr", "climatology.zarr"))
    assert set(fc.data_vars) == {"geopotential", "temperature", "2m_temperature", "10m_u_component_of_wind"}
    assert fc.geopotential.dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert fc["2m_temperature"].dims == ("time", "prediction_timedelta", "latitude", "longitude")
    assert fc.level.values.tolist() == [500, 850] and fc.prediction_timedelta.dtype.kind == "m"
    # z500 and t850 only: geopotential at 850 hPa is not forecast (NaN, as WB2 merges suffixed names)
    assert fc.geopotential.sel(level=850).isnull().all() and fc.geopotential.sel(level=500).notnull().all()
    assert truth.geopotential.dims == ("time", "level", "latitude", "longitude") and truth.level.size == 2
    assert truth.geopotential.notnull().all()  # every level of the forecast variables
    assert clim.temperature.dims == ("dayofyear", "level", "latitude", "longitude") and clim.dayofyear.size == 366
    assert 4e4 < float(fc.geopotential.sel(level=500).mean()) < 6.5e4  # physical units
    assert fc.geopotential.attrs["units"] == "m**2 s**-2" and fc.level.attrs["units"] == "hPa"


def test_weatherbench2s_evaluation_on_the_pipelines_files_gives_dchags_scores(pipeline_files):
    from dchag.evaluate import wb2

    root = pipeline_files
    paths = [str(root / f) for f in ("forecast.zarr", "truth.zarr", "climatology.zarr")]
    ref = _wb2_evaluate_by_init(*paths)
    stats = {conv: score_statistics(paths[0], paths[1], paths[2], conv) for conv in ("wb2", "climax")}
    # every region, the land and sea of the truth's land-sea mask among them, as WB2 weights it
    table = perinit.table(stats["wb2"]).set_index(["variable", "lead_time_hours", "metric", "region"]).value
    assert set(table.index.get_level_values("region")) == {*weather.REGIONS, "land", "sea"}
    for region in ("extra-tropics", "land", "sea"):
        for (var, lev, lead, metric), value in _wb2_evaluate_by_init(*paths, region).items():
            if metric != "rmse_sqrt_before_time_avg":
                assert table[(wb2.channel_name(var, lev), lead, metric, region)] == pytest.approx(value, rel=1e-6)
    # WB2's layout with levels (z500 and t850 only: geopotential at 850 hPa is not there) round trip
    assert stats["wb2"].geopotential.dims == ("statistic", "region", "lead_time", "init_time", "level")
    written = perinit.open_statistics(perinit.write(stats["wb2"], root / "stats.nc"))
    assert sorted(written.data_vars) == ["t2m", "t850", "u10", "z500"]
    assert_frame_equal(perinit.table(written), perinit.table(stats["wb2"]))
    got = (
        pd.concat([perinit.table(stats[conv]) for conv in ("wb2", "climax")], ignore_index=True)
        .query("region == 'global'")
        .set_index(["variable", "lead_time_hours", "metric", "convention"])
        .value
    )
    compared = 0
    for (var, lev, lead, metric), value in ref.items():
        name = wb2.channel_name(var, lev)
        if metric == "mse":
            assert got[(name, lead, "mse", "wb2")] == pytest.approx(value, rel=1e-6)
            assert got[(name, lead, "rmse", "wb2")] == pytest.approx(
                math.sqrt(value), rel=1e-6
            )  # WB2: RMSE = sqrt(MSE)
        elif metric == "acc":
            assert got[(name, lead, "acc", "wb2")] == pytest.approx(value, rel=1e-6)
        else:
            assert got[(name, lead, "rmse", "climax")] == pytest.approx(value, rel=1e-6)
        compared += 1
    assert compared == 4 * 2 * 3 and {k[0] for k in ref} == {
        "geopotential",
        "temperature",
        "2m_temperature",
        "10m_u_component_of_wind",
    }


def test_channel_names_and_wb2_names_both_ways():
    from dchag.evaluate import wb2

    for name, pair in {
        "z500": ("geopotential", 500),
        "t850": ("temperature", 850),
        "u10": ("10m_u_component_of_wind", None),  # not u at 10 hPa
        "t2m": ("2m_temperature", None),
        "lsm": ("land_sea_mask", None),
        "orography": ("geopotential_at_surface", None),
        "q250": ("specific_humidity", 250),
    }.items():
        assert wb2.split_channel(name) == pair and wb2.channel_name(*pair) == name


def test_metrics_are_objects_chosen_from_each_conventions_table():
    assert set(weather.SCORING) == {"wb2", "climax"}
    lat = np.array([-60.0, 0.0, 60.0])
    assert weather.SCORING["wb2"].weights is weather.cell_area_weights
    assert weather.lat_weights(lat, "climax") == pytest.approx(weather.cos_weights(lat))
    for conv in weather.SCORING.values():
        assert tuple(conv.metrics) == weather.METRICS and all(m.name == k for k, m in conv.metrics.items())
    assert isinstance(weather.convention("climax").metrics["rmse"], weather.RMSESqrtBeforeTimeAvg)
    with pytest.raises(weather.WeatherScoreError, match="bias"):
        weather.convention("wb2").select(["bias"])


def test_wb2_levels_are_read_from_the_attribute_not_the_data(tmp_path):
    """dchag's WB2 files name the levels a variable holds; a foreign file's levels are judged
    by its first field alone (opening a year of 0.25 deg data must not read it)."""
    from dchag.evaluate import wb2

    lat, lon = np.linspace(-80, 80, 4), np.arange(0, 360, 45.0)
    time = pd.date_range("2020-01-01", periods=3, freq="6h")

    def field(seed):
        return xr.DataArray(
            np.random.default_rng(seed).random((3, 4, 8), dtype=np.float32),
            dims=("time", "latitude", "longitude"),
            coords={"time": time, "latitude": lat, "longitude": lon},
        )

    ds = wb2.to_wb2({"z500": field(0), "t850": field(1), "t500": field(2), "t2m": field(3)})
    assert ds.geopotential.attrs[wb2.GIVEN_LEVELS] == [500] and ds.temperature.attrs[wb2.GIVEN_LEVELS] == [500, 850]
    ds.to_zarr(tmp_path / "f.zarr")
    back = wb2.channels(xr.open_zarr(tmp_path / "f.zarr"))
    assert sorted(back.data_vars) == ["t2m", "t500", "t850", "z500"]
    np.testing.assert_array_equal(back.z500.values, field(0).values)
    assert wb2.GIVEN_LEVELS not in back.t850.attrs
    foreign = ds.copy()
    for v in foreign.data_vars.values():
        v.attrs.pop(wb2.GIVEN_LEVELS, None)
    assert sorted(wb2.channels(foreign).data_vars) == ["t2m", "t500", "t850", "z500"]  # z850 is all NaN
