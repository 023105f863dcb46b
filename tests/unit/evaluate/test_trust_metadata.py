"""Metadata compared before it is believed: the units, times and stores `dchag score` reads,
the band mapping of a hyperspectral image onto a model's bands, and the normalisation a
trained run is exported or applied with against the checkpoint's fingerprint."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from support.era5 import LAT, LON, score_cli

from dchag.cli import main
from dchag.era5.units import GRAVITY


def test_score_converts_units_with_preprocessings_catalogue_or_refuses_them(scored, capsys):
    root, truth = scored
    code, _ = score_cli(capsys, root / "forecast.nc", root / "truth.nc", root / "ref.csv")
    assert code == 0
    ref = pd.read_csv(root / "ref.csv").query("region == 'global'").set_index("variable").value
    assert 0.9 < ref["t2m"] < 1.1 and 0.9 < ref["z500"] < 1.1  # the forecast's noise
    # The same truth as a WeatherBench 2 file would hold it, with geopotential height in gpm and
    # 2 m temperature in degrees Celsius: the same scores (before: RMSE 273 for t2m, thousands for z).
    other = xr.Dataset(
        {
            "geopotential": (
                ("time", "level", "latitude", "longitude"),
                (truth.z500.values / GRAVITY)[:, None],
                {"units": "gpm"},
            ),  # fmt: skip
            "2m_temperature": (("time", "latitude", "longitude"), truth.t2m.values - 273.15, {"units": "degC"}),
        },
        coords={"time": truth.time.values, "level": [500], "latitude": LAT, "longitude": LON},
    )
    other.to_netcdf(root / "wb2.nc")
    code, err = score_cli(capsys, root / "forecast.nc", root / "wb2.nc", root / "wb2.csv")
    assert code == 0, err
    got = pd.read_csv(root / "wb2.csv").query("region == 'global'").set_index("variable").value
    assert got["t2m"] == pytest.approx(ref["t2m"], rel=1e-9) and got["z500"] == pytest.approx(ref["z500"], rel=1e-9)
    # Units that do not convert, or that no one can read: one line naming file, variable and unit.
    for bad in ("m s**-1", "furlongs"):
        other["2m_temperature"].attrs["units"] = bad
        other.to_netcdf(root / "bad.nc")
        code, err = score_cli(capsys, root / "forecast.nc", root / "bad.nc", root / "bad.csv")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "bad.nc" in err and "'t2m'" in err and repr(bad) in err and "'K'" in err
        assert not (root / "bad.csv").exists()
    # A variable outside the catalogue is compared, not converted: other units on each side are refused.
    extra = truth.assign(sst_anomaly=truth.t2m.assign_attrs(units="K"))
    extra.to_netcdf(root / "extra_truth.nc")
    fc = xr.open_dataset(root / "forecast.nc").load()
    fc.assign(sst_anomaly=(fc.t2m - 273.15).assign_attrs(units="degC")).to_netcdf(root / "extra_fc.nc")
    code, err = score_cli(capsys, root / "extra_fc.nc", root / "extra_truth.nc", root / "e.csv")
    assert code == 2 and "'sst_anomaly' is in 'degC' in the forecast" in err and "extra_truth.nc" in err, err
    # The forecast's units are read the same way (a forecast in Celsius against a truth in K).
    fc = xr.open_dataset(root / "forecast.nc").load()
    fc["t2m"] = (fc.t2m - 273.15).assign_attrs(units="degC")
    fc.to_netcdf(root / "fc_celsius.nc")
    code, err = score_cli(capsys, root / "fc_celsius.nc", root / "truth.nc", root / "c.csv")
    assert code == 0, err
    assert pd.read_csv(root / "c.csv").query("region == 'global'").set_index("variable").value["t2m"] == pytest.approx(
        ref["t2m"], rel=1e-6
    )


def test_score_refuses_a_partial_overlap_and_repeated_times(scored, capsys):
    root, truth = scored
    truth.isel(time=slice(0, 12)).to_netcdf(root / "short.nc")  # 12 days for forecasts valid on days 2-31
    code, err = score_cli(capsys, root / "forecast.nc", root / "short.nc", root / "s.csv")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "short.nc lacks 19 of the 30 valid times" in err and "2019-01-13 00:00:00 .. 2019-01-31 00:00:00" in err
    assert not (root / "s.csv").exists()
    # a repeated time, in the truth or in the forecast: one line naming the file and the time
    truth.isel(time=[0, 1, 2, 3, 3, *range(4, 40)]).to_netcdf(root / "twice.nc")
    code, err = score_cli(capsys, root / "forecast.nc", root / "twice.nc", root / "s.csv")
    assert code == 2 and "twice.nc repeats time(s) 2019-01-04 00:00:00" in err and "Traceback" not in err
    fc = xr.open_dataset(root / "forecast.nc").load()
    fc.isel(time=[0, 0, *range(1, 30)]).to_netcdf(root / "fc_twice.nc")
    code, err = score_cli(capsys, root / "fc_twice.nc", root / "truth.nc", root / "s.csv")
    assert code == 2 and "fc_twice.nc repeats time(s) 2019-01-01 00:00:00" in err
    assert not (root / "s.csv").exists()


def test_an_undefined_acc_is_written_nan_and_said(scored, capsys, caplog):
    root, truth = scored
    const = truth.copy(deep=True)
    const["t2m"][:] = 280.0
    const.to_netcdf(root / "const.nc")
    fc = xr.open_dataset(root / "forecast.nc").load()
    fc["t2m"][:] = 281.0
    fc.to_netcdf(root / "fc_const.nc")
    code = main(["score", "--forecast", str(root / "fc_const.nc"), "--truth", str(root / "const.nc"),
                 "--convention", "climax", "--variables", "t2m", "--output", str(root / "c.csv")])  # fmt: skip
    assert code == 0
    assert "acc" in capsys.readouterr().out  # the printed table keeps the column
    lines = (root / "c.csv").read_text().splitlines()
    assert "t2m,24,global,acc,NaN,climax" in lines and "t2m,24,global,rmse,1,climax" in lines  # not an empty cell
    assert "ACC of 't2m' at lead 24 h is undefined and written as NaN" in caplog.text
    assert np.isnan(pd.read_csv(root / "c.csv").query("region == 'global'").set_index("metric").value["acc"])


@pytest.mark.parametrize("damage", ["chunk", "zarr.json"])
def test_a_damaged_truth_store_is_one_line_naming_it(scored, capsys, damage):
    root, truth = scored
    store = root / "truth.zarr"
    truth.to_zarr(store, zarr_format=3, consolidated=False)
    if damage == "chunk":
        chunk = next(p for p in sorted((store / "t2m" / "c").rglob("*")) if p.is_file())
        os.truncate(chunk, chunk.stat().st_size // 2)
    else:
        meta = store / "t2m" / "zarr.json"
        meta.write_text(meta.read_text()[:60])
    code, err = score_cli(capsys, root / "forecast.nc", store, root / "d.csv")
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(store) in err, err
    assert not (root / "d.csv").exists()


# -- hyperspectral band matching -----------------------------------------------------------------
def test_band_matching_is_one_to_one_within_the_models_spacing_or_fwhm():
    from dchag.hsi.bands import BandError, match_bands

    model = np.arange(400.0, 500.0, 10.0)  # ten bands, 10 nm apart
    assert match_bands(model, model[::-1] + 2.0).tolist() == list(range(9, -1, -1))  # shifted 2 nm, any order
    assert match_bands(model, np.arange(395.0, 505.0, 5.0)).tolist() == list(range(1, 21, 2))  # a finer image
    # every third band: 400, 430, ...: six of the model's bands have none within 5 nm
    with pytest.raises(BandError, match=r"coarse.tif: 6 of the model's 10 bands have no image band of their own"):
        match_bands(model, model[::3], source="coarse.tif")
    # one image band never serves two model bands, even within both tolerances
    with pytest.raises(BandError, match="1 of the model's 2 bands"):
        match_bands(np.array([400.0, 410.0]), np.array([405.0]))
    # the FWHM where it is known: 3 nm off is too far for a band 4 nm wide
    with pytest.raises(BandError, match=r"403 nm, tolerance 2 nm"):
        match_bands(model, model + 3.0, model_fwhm=np.full(10, 4.0))
    assert match_bands(model, model + 3.0, model_fwhm=np.full(10, np.nan)).tolist() == list(range(10))


def test_an_image_three_times_coarser_than_the_model_is_refused(tmp_path, capsys):
    import rasterio
    import scipy.io
    from support.hsi import hsi_model

    from dchag.hsi import demo
    from dchag.model import folder as model_folder

    cube, labels, centres, _ = demo.scene(24, 24, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"indian_pines_gt": labels})
    model, _ = hsi_model(
        tmp_path,
        "classification",
        {"image": str(tmp_path / "img.mat"), "labels": str(tmp_path / "gt.mat"), "patch": 5},
        {"patch_size": 1, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2},
    )
    model_folder.save(model, tmp_path / "model")

    def geotiff(path, keep):
        with rasterio.open(path, "w", driver="GTiff", height=24, width=24, count=len(keep), dtype="float32") as dst:
            dst.write(cube[:, :, keep].transpose(2, 0, 1).astype(np.float32))
            for b, wl in enumerate(centres[keep], start=1):
                dst.update_tags(b, wavelength=str(wl), wavelength_units="Nanometers")

    geotiff(tmp_path / "full.tif", np.arange(220))
    predict = ["predict", "--model", str(tmp_path / "model"), "--image"]
    assert main([*predict, str(tmp_path / "full.tif"), "--output", str(tmp_path / "full-map.zarr")]) == 0
    capsys.readouterr()
    geotiff(tmp_path / "coarse.tif", np.arange(0, 220, 3))  # every third AVIRIS band: 74 bands
    code = main([*predict, str(tmp_path / "coarse.tif"), "--output", str(tmp_path / "coarse-map.zarr")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "coarse.tif: 133 of the model's 200 bands have no image band of their own within tolerance" in err
    assert not (tmp_path / "coarse-map.zarr").exists()


# -- export and evaluation --data against the model's training store --------------------------------
def test_export_and_evaluation_refuse_a_store_other_than_the_checkpoints(tmp_path, capsys):
    """A classification run's checkpoint (the trainer's DCP writer and fingerprint) on a store
    the real preprocessing made; the same scene preprocessed with other clipping bounds gives
    other statistics: export and evaluation with it are refused, naming the store and the field."""
    import json

    import scipy.io
    import torch

    from dchag.config import run_settings, validate
    from dchag.hsi import demo
    from dchag.hsi.preprocess import preprocess_from_config
    from dchag.model import ChannelViT
    from dchag.train import checkpoint as ckpt
    from dchag.train.tasks import build_task

    cube, labels, _, _ = demo.scene(24, 24, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"indian_pines_gt": labels})

    def config(**common):
        return {
            "name": "t",
            "hsi": {
                "preset": "indian_pines",
                **common,
                "classification": {"image": str(tmp_path / "img.mat"), "labels": str(tmp_path / "gt.mat"), "patch": 5},
            },  # fmt: skip
            "model": {
                "patch_size": 1,
                "embed_dim": 16,
                "depth": 1,
                "num_heads": 2,
                "aggregation": "linear",
                "groups": 2,
            },  # fmt: skip
            "parallel": {"tp": 1, "data_parallel": "none"},
            "train": {"runs": {"r": {"task": "classification"}}},
        }

    raw = config()
    cfg = validate(raw)
    trained = preprocess_from_config(cfg, "classification", tmp_path / "trained.zarr")
    clipped = validate(config(clip_percentiles=[2, 98]))
    other = preprocess_from_config(clipped, "classification", tmp_path / "other.zarr")
    settings = run_settings(cfg, "r")
    task = build_task(settings, {"train": trained, "val": trained})
    torch.manual_seed(0)
    net = ChannelViT(task.model_cfg)
    record = ckpt.fingerprint(settings, task.data_signature())
    final = ckpt.save({f"model.{k}": v for k, v in net.state_dict().items()}, tmp_path / "run" / "final",
                      {ckpt.FINGERPRINT: json.dumps(record, sort_keys=True, indent=1)})  # fmt: skip
    export = ["export", "--config", json.dumps(raw), "--run-name", "r", "--checkpoint", str(final)]
    assert main([*export, "--data", str(trained), "--output", str(tmp_path / "model")]) == 0
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert [float(f"{v:.7g}") for v in meta["normalisation"]["mean"]] == record["data.mean"]
    capsys.readouterr()
    # the other store: its statistics would go into model.json beside the fingerprint they contradict
    code = main([*export, "--data", str(other), "--output", str(tmp_path / "model2")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"store {other} is not the data checkpoint {final} was trained on: its data.mean[0] is" in err
    assert not (tmp_path / "model2").exists()
    # the model scored on the other store: refused before anything is predicted or written
    out = tmp_path / "scores.json"
    code = main(["evaluate-classification", "--model", str(tmp_path / "model"), "--data", str(other), "--output",
                 str(out), "--per-class", str(tmp_path / "pc.csv"), "--map", str(tmp_path / "map.npz")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{other} is normalised with other statistics than" in err
    assert not out.exists() and not (tmp_path / "map.npz").exists()
    # and on its own store, scored
    scored = ["--output", str(out), "--per-class", str(tmp_path / "pc.csv"), "--map", str(tmp_path / "map.npz")]
    assert main(["evaluate-classification", "--model", str(tmp_path / "model"), "--data", str(trained), *scored]) == 0
    assert json.loads(out.read_text())["run"] == "r"


def test_a_forecast_store_is_compared_by_channels_grid_and_statistics(data_root, tmp_path):
    """The fingerprint a forecast run's checkpoint holds, against the stores the real
    preprocessing made: the run's other split (other times, the training statistics) passes;
    a checkpoint trained on other channels, another grid or other statistics is refused."""
    import json

    from support.commands import run_config

    from dchag.config import run_settings
    from dchag.train import checkpoint as ckpt
    from dchag.train.tasks import build_task

    root, cfg = data_root
    settings = run_settings(run_config(cfg, steps=1, runs={"f": {"task": "forecast"}}), "f")
    train, val = root / "era5" / "train.zarr", root / "era5" / "val.zarr"
    record = ckpt.fingerprint(settings, build_task(settings, {"train": train, "val": val}).data_signature())

    def check(store, **changed):
        final = tmp_path / "final"
        final.mkdir(exist_ok=True)
        (final / ckpt.FINGERPRINT).write_text(json.dumps({**record, **changed}))
        ckpt.check_data(build_task(settings, {"train": store, "val": store}), final, store)

    check(train)
    check(val)  # another period of the same data: the same channels, grid and statistics
    channels = record["data.channels"]
    with pytest.raises(ckpt.CheckpointError, match=rf"store {val} is not the data .* its data.channels\[0\] is"):
        check(val, **{"data.channels": [channels[1], channels[0], *channels[2:]]})
    shape = record["data.shape"]
    with pytest.raises(ckpt.CheckpointError, match=r"its data.shape\[2\] is 32, the checkpoint's fingerprint has 96"):
        check(val, **{"data.shape": [*shape[:2], 96, shape[3]]})
    with pytest.raises(ckpt.CheckpointError, match=r"its data.std\[3\] is"):
        check(val, **{"data.std": [*record["data.std"][:3], 1.0, *record["data.std"][4:]]})
