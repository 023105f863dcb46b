"""Using what was trained: the model folder, `dchag predict` from it alone, and
fine-tuning from a pretrained model (init_from, freeze, linear probe)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
import yaml
from support import BIN, once
from support.commands import run_config, train_in_ranks
from support.distributed import run_distributed
from support.hsi import hsi_model

from dchag.cli import main
from dchag.config import ConfigError, settings
from dchag.model import folder as model_folder
from dchag.model.folder import ModelFolderError
from dchag.plan import check_run

SUBSET = ["z500", "z850", "t500", "t2m", "lsm"]  # of the fixture's z/t at 500/850, t2m, u10, lsm


@pytest.fixture(scope="module")
def trained(data_root, tmp_path_factory):
    """A D-CHAG forecast run on 2 ranks (tensor-parallel, per-rank tokenizer blocks) and a
    baseline one on a channel subset, each 10 steps; both exported. Trained once for all test
    workers (the tests only read them)."""
    root, cfg = data_root
    runs = {
        "full": run_config(cfg, steps=10, runs={"f": {"task": "forecast"}}),
        "subset": run_config(
            cfg,
            steps=10,
            runs={
                "f": {
                    "task": "forecast",
                    "channels": SUBSET,
                    "model": {"aggregation": "baseline"},
                    "parallel": {"strategy": "baseline"},
                }
            },
        ),
    }

    def make(out):
        for name, c in runs.items():
            train_in_ranks(c, out / name, root)
            # exported through an overlay as a user trains through one: the run in its own
            # file over the rest, and the width set on the command line over a wrong one
            base, overlay = out / f"{name}_base.yaml", out / f"{name}_run.yaml"
            wrong = {**c, "model": {**c["model"], "embed_dim": 8}, "train": {**c["train"], "runs": {}}}
            base.write_text(yaml.safe_dump(wrong))
            overlay.write_text(yaml.safe_dump({"train": {"runs": c["train"]["runs"]}}))
            assert (
                main(
                    [
                        "export",
                        "--config",
                        str(base),
                        str(overlay),
                        "--set",
                        f"model.embed_dim={c['model']['embed_dim']}",
                        "--run-name",
                        "f",
                        "--checkpoint",
                        str(out / name / "final"),
                        "--data",
                        str(root / "era5" / "train.zarr"),
                        "--output",
                        str(out / f"{name}_model"),
                    ]
                )
                == 0
            )

    return root, once(tmp_path_factory, "predict_runs", make), runs


def test_the_model_folder_gives_the_runs_outputs(trained):
    from dchag.predict.export import from_run

    root, out, runs = trained
    model = model_folder.load(out / "full_model")  # one CPU, the folder alone
    meta = json.loads((out / "full_model" / "model.json").read_text())
    assert meta["format"] == "dchag-model" and meta["task"] == "forecast" and meta["outputs"] == ["z500", "t2m"]
    names = [c["name"] for c in meta["channels"]]
    assert names == ["z500", "z850", "t500", "t850", "t2m", "u10", "lsm"]
    assert meta["channels"][0] == {"name": "z500", "long_name": "geopotential_500", "units": "m**2 s**-2", "level": 500}
    assert len(meta["grid"]["latitude"]) == 32 and meta["lead_hours"] == {"trained": [24, 48], "time_step_hours": 24}
    assert len(meta["normalisation"]["mean"]) == 7 and meta["provenance"]["run"] == "f"
    assert meta["provenance"]["fingerprint"]["parallel.strategy"] == "dchag"
    assert meta["layout"] == {"tp": 2, "strategy": "dchag"} and model.layout == (2, "dchag")
    assert set(model.constants) == {"lsm"} and model.constants["lsm"].shape == (32, 64)
    from safetensors import safe_open

    with safe_open(str(out / "full_model" / "model.safetensors"), "pt") as f:  # consolidated: no per-rank blocks
        assert "tokenizer.weight" in f.keys() and not any("[" in k for k in f.keys())
        assert f.get_tensor("tokenizer.weight").shape[0] == 7
    ref = from_run(runs["full"], "f", out / "full" / "final", root / "era5" / "train.zarr").network
    x = torch.randn(3, 7, 32, 64, generator=torch.Generator().manual_seed(0))
    lead = torch.tensor([24.0, 36.0, 48.0])
    with torch.no_grad():
        torch.testing.assert_close(model.network(x, lead), ref(x, lead), rtol=0, atol=0)


def _initial_conditions(raw: Path, path: Path) -> None:
    """The fixture's raw ERA5-layout files of 2001 (3.75 deg, CDS short names, the 2024 CDS
    netCDF's valid_time / pressure_level) as one netCDF of four days, without the constants
    (the model folder holds them)."""
    pl = xr.open_dataset(raw / "pressure_levels_2001.nc").load()
    sl = xr.open_dataset(raw / "single_levels_2001.nc").load().rename(time="valid_time")
    xr.merge([pl, sl], compat="override").isel(valid_time=slice(2, 6)).to_netcdf(path)


def test_predict_on_a_fresh_machine_from_the_model_folder_and_an_input_file_alone(trained, tmp_path):
    root, out, _ = trained
    raw = Path(json.loads((out / "full_model" / "model.json").read_text())["data"]["era5"]["inputs"][0]).parent
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copytree(out / "full_model", fresh / "model")
    _initial_conditions(raw, fresh / "ic.nc")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DCHAG", "SNAKEMAKE"))}
    proc = subprocess.run(
        [str(BIN / "dchag"), "predict", "--model", "model", "--input", "ic.nc", "--lead-hours", "24", "48",
         "--output", "forecast.zarr"],
        cwd=fresh, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in fresh.iterdir()) == ["forecast.zarr", "ic.nc", "model"]
    fc = xr.open_zarr(fresh / "forecast.zarr")  # WeatherBench 2's layout, physical units
    assert fc.geopotential.dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert fc.level.values.tolist() == [500] and fc.time.size == 4
    assert 4e4 < float(fc.geopotential.mean()) < 6.5e4 and 200 < float(fc["2m_temperature"].mean()) < 320
    # The input regridded and normalised as in training: the same forecasts as from the
    # pipeline's own regridded year store of those days.
    assert main(
        ["predict", "--model", str(out / "full_model"), "--store", str(root / "y2001.zarr"), "--init-start",
         str(fc.time.values[0]), "--init-end", str(fc.time.values[-1]), "--lead-hours", "24", "48",
         "--output", str(tmp_path / "from_store.zarr")]
    ) == 0  # fmt: skip
    ref = xr.open_zarr(tmp_path / "from_store.zarr")
    np.testing.assert_allclose(fc.geopotential.values, ref.geopotential.values, rtol=1e-5)
    np.testing.assert_allclose(fc["2m_temperature"].values, ref["2m_temperature"].values, rtol=1e-5)


def test_lead_times_are_checked_first_and_an_ensemble_member_is_chosen(trained, tmp_path, capsys):
    root, out, _ = trained
    raw = Path(json.loads((out / "full_model" / "model.json").read_text())["data"]["era5"]["inputs"][0]).parent
    model = str(out / "full_model")
    # A lead time the model cannot make: refused before the (absent) input file is read.
    code = main(["predict", "--model", model, "--input", str(tmp_path / "absent.nc"), "--lead-hours", "36",
                 "--output", str(tmp_path / "x.zarr")])  # fmt: skip
    assert code == 2 and "lead time(s) [36] h" in capsys.readouterr().err
    # Initial conditions as an ensemble of two members (the second 1 unit warmer everywhere).
    _initial_conditions(raw, tmp_path / "ic.nc")
    one = xr.open_dataset(tmp_path / "ic.nc").load()
    with xr.set_options(keep_attrs=True):
        xr.concat([one, one + 1.0], dim="number").assign_coords(number=[0, 1]).to_netcdf(tmp_path / "ens.nc")

    def predict(*extra):
        return main(["predict", "--model", model, "--lead-hours", "24", *extra])

    assert predict("--input", str(tmp_path / "ens.nc"), "--output", str(tmp_path / "e.zarr")) == 2
    assert "ensemble of 2 members" in (err := capsys.readouterr().err) and "--member" in err
    assert predict("--input", str(tmp_path / "ens.nc"), "--member", "0", "--output", str(tmp_path / "m0.zarr")) == 0
    assert predict("--input", str(tmp_path / "ic.nc"), "--output", str(tmp_path / "det.zarr")) == 0
    m0, det = xr.open_zarr(tmp_path / "m0.zarr"), xr.open_zarr(tmp_path / "det.zarr")
    np.testing.assert_array_equal(m0.geopotential.values, det.geopotential.values)
    # From Python: the same forecasts, as a Dataset in memory, from a Dataset or the files
    import dchag

    loaded = dchag.Model.load(model)
    for got in (loaded.forecast(one, [24]), loaded.forecast(tmp_path / "ens.nc", [24], member=0)):
        assert dict(got.sizes) == dict(det.sizes) and sorted(got.data_vars) == sorted(det.data_vars), got
        for name in det.data_vars:
            np.testing.assert_array_equal(got[name].values, det[name].values)


def _forecast_on_ranks(rank, world, model_dir, store, start, end, output):
    from dchag.predict import weather
    from dchag.predict.layout import lay_out

    probe = lay_out(model_folder.load(model_dir))  # the run's layout: D-CHAG over 2 ranks, 2 shares of the times
    assert probe.shares == world // 2 and probe.share_rank == rank // 2
    assert len(probe.channel_ids) < 7 and probe.net.group_gather is not None  # this rank's channel group
    model = model_folder.load(model_dir)
    made = weather.forecast(model, weather.from_store(model, store, start, end), [24, 48], output, batch_size=1)
    assert (made is not None) == (rank == 0)


def test_predict_under_torchrun_runs_in_the_runs_layout(trained, tmp_path):
    """4 ranks: the D-CHAG run's layout (TP 2) twice, each pair forecasting half the times;
    rank 0 writes the same forecasts as one process."""
    root, out, _ = trained
    start, end = "2001-01-02", "2001-01-06"
    args = ["--model", str(out / "full_model"), "--store", str(root / "y2001.zarr"), "--init-start", start]
    args += ["--init-end", end, "--lead-hours", "24", "48"]
    assert main(["predict", *args, "--output", str(tmp_path / "one.zarr")]) == 0
    run_distributed(_forecast_on_ranks, 4, str(out / "full_model"), str(root / "y2001.zarr"), start, end,
                    str(tmp_path / "four.zarr"))  # fmt: skip
    one, four = xr.open_zarr(tmp_path / "one.zarr"), xr.open_zarr(tmp_path / "four.zarr")
    assert four.time.size == 5 and (four.time.values == one.time.values).all()
    # written round by round (2 shares x 1 time a batch): chunks of 2 times, attributes kept
    assert four.geopotential.encoding["chunks"][0] == 2 and four.geopotential.attrs["units"] == "m**2 s**-2"
    assert four.attrs["forecast"] == "model" and four.attrs["model"] == one.attrs["model"]
    for var in ("geopotential", "2m_temperature"):
        np.testing.assert_allclose(four[var].values, one[var].values, rtol=1e-5)


def test_verifiable_keeps_the_times_whose_every_lead_the_store_holds(trained, tmp_path):
    """The pipeline's evaluation forecasts: --verifiable drops the last initialisations, whose
    48 h valid time is past the store's end, and the scores compare over the rest."""
    root, out, _ = trained
    store = root / "y2001.zarr"
    times = xr.open_zarr(store).time.values
    args = ["predict", "--model", str(out / "full_model"), "--store", str(store), "--lead-hours", "24", "48"]
    assert main([*args, "--verifiable", "--output", str(tmp_path / "v.zarr")]) == 0
    kept = xr.open_zarr(tmp_path / "v.zarr").time.values
    assert (kept == times[:-2]).all()  # daily steps: the last two have no 48 h truth
    assert main([*args, "--output", str(tmp_path / "all.zarr")]) == 0
    assert xr.open_zarr(tmp_path / "all.zarr").time.size == len(times)


def test_bad_model_folders_are_one_line_errors(trained, tmp_path, capsys):
    _, out, _ = trained
    good = out / "full_model"

    def broken(name: str, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        edit(d)
        return d

    def crafted(d: Path) -> None:  # a header claiming 2**62 bytes; the hash made to match
        (d / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
        meta = json.loads((d / "model.json").read_text())
        meta["weights"]["sha256"] = model_folder._sha256(d / "model.safetensors")
        (d / "model.json").write_text(json.dumps(meta))

    def other_weights(d: Path) -> None:
        shutil.copy(out / "subset_model" / "model.safetensors", d / "model.safetensors")

    def foreign(d: Path) -> None:
        (d / "model.json").write_text(json.dumps({"architectures": ["BertModel"], "hidden_size": 768}))

    cases = {
        "crafted": (crafted, "not a readable safetensors file"),
        "swapped": (other_weights, "does not fit the model"),  # found from the header, before the hash
        "foreign": (foreign, "does not describe a dchag model"),
        "empty": (lambda d: (d / "model.json").unlink(), "has no model.json"),
    }
    for name, (edit, message) in cases.items():
        with pytest.raises(ModelFolderError, match=message):
            model_folder.load(broken(name, edit))
    code = main(["predict", "--model", str(tmp_path / "crafted"), "--store", "x", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "safetensors" in err
    # mismatched channels: a store without the model's channels
    assert main(["predict", "--model", str(out / "full_model"), "--store", str(out / "nowhere.zarr"),
                 "--lead-hours", "24", "--output", str(tmp_path / "o")]) == 2  # fmt: skip


def _finetune_check(rank, world, cfg, out, stores, source_dir):
    """Build the fine-tuned run (one process) and compare its initial weights with the
    source's; then train it and check the frozen parts did not move."""
    from dchag.parallel.names import unwrap
    from dchag.train.trainer import Trainer

    src = model_folder.load(source_dir)
    trainer = Trainer(cfg, "ft", out, stores, init_from=source_dir)
    model = unwrap(trainer.model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    weights = src.weights()
    names = ["z500", "z850", "t500", "t850", "t2m", "u10", "lsm"]
    for i, name in enumerate(names):
        if name in SUBSET:  # kept: the source's rows
            j = SUBSET.index(name)
            for key in ("tokenizer.weight", "tokenizer.bias", "tokenizer.channel_embed"):
                assert torch.equal(params[key][i], weights[key][j]), (key, name)
        else:  # new: initialised, not the source's
            assert not any(
                torch.equal(params["tokenizer.channel_embed"][i], r) for r in weights["tokenizer.channel_embed"]
            )
    for key in ("final.query", "blocks.0.attn.inner.wq.weight", "pos_embed", "head.0.weight", "lead_time_embed.weight"):
        assert torch.equal(params[key], weights[key]), key
    report = json.loads((Path(out) / "init.json").read_text())
    assert report["channels"] == {"matched": 5, "of": 7, "by": "name", "new": ["t850", "u10"]}
    assert any(x.startswith("tokenizer.weight: 5 of 7") for x in report["loaded"])
    trainer.train()
    after = dict(unwrap(trainer.model).named_parameters())
    assert all(torch.equal(after[k].detach(), params[k]) for k in params if k.startswith("blocks."))  # frozen
    assert not torch.equal(after["tokenizer.weight"].detach(), params["tokenizer.weight"])  # trained
    fingerprint = json.loads((Path(out) / "final" / "fingerprint.json").read_text())
    assert fingerprint["init_from"] == str(source_dir) and fingerprint["train.freeze"] == ["blocks"]
    assert fingerprint["init_from.sha256"] == src.meta["weights"]["sha256"]


def test_a_fine_tuned_run_starts_from_the_pretrained_weights(trained, tmp_path):
    """A model trained on a channel subset fine-tuned on the full set: the kept channels' rows
    and every shared tensor are the source's, the new channels' are fresh, frozen parts stay."""
    root, out, runs = trained
    cfg = run_config(
        {k: v for k, v in runs["full"].items() if k not in ("model", "parallel", "train")},
        steps=4,
        freeze=["blocks"],
        runs={"ft": {"task": "forecast", "init_from": str(out / "subset_model"), "model": {"aggregation": "baseline"},
                     "parallel": {"strategy": "baseline", "tp": 1}}},
    )  # fmt: skip
    stores = {"train": str(root / "era5" / "train.zarr"), "val": str(root / "era5" / "val.zarr")}
    run_distributed(_finetune_check, 1, cfg, str(tmp_path / "ft"), stores, str(out / "subset_model"))


def test_init_from_is_checked_at_plan_time(trained, tmp_path):
    root, out, runs = trained
    base = {k: v for k, v in runs["full"].items() if k != "train"}

    def plan(runs_, **train):
        cfg = copy.deepcopy({**base, "train": {"runs": runs_, **train}})
        for r in runs_:
            check_run(settings(cfg), r, runs_)

    with pytest.raises(ConfigError, match="names no run of train.runs"):
        plan({"a": {"task": "forecast", "init_from": "nothing"}})
    with pytest.raises(ConfigError, match="a cycle: a -> b -> a"):
        plan({"a": {"task": "forecast", "init_from": "b"}, "b": {"task": "forecast", "init_from": "a"}})
    with pytest.raises(ConfigError, match="give init_from"):
        plan({"a": {"task": "forecast"}}, freeze=["blocks"])
    with pytest.raises(ConfigError, match="linear_probe trains a classifier head"):
        plan({"a": {"task": "forecast", "init_from": str(out / "full_model")}}, linear_probe=True)
    mae = tmp_path / "mae_model"
    mae.mkdir()
    (mae / "model.json").write_text(json.dumps({"format": "dchag-model", "task": "mae"}))
    with pytest.raises(ConfigError, match="reads hyperspectral bands, this forecast run reads ERA5 channels"):
        plan({"a": {"task": "forecast", "init_from": str(mae)}})
    plan({"a": {"task": "forecast"}, "b": {"task": "forecast", "init_from": "a", "channels": SUBSET}})  # fine
    with pytest.raises(ConfigError, match="are not era5 channels"):
        plan({"a": {"task": "forecast", "channels": ["z300"]}})


def _hsi_on_ranks(rank, world, model_dir, image, output):
    from dchag.predict import hsi

    model = model_folder.load(model_dir)
    run = hsi.classify_scene if model.task == "classification" else hsi.reconstruct_image
    # small batches, so that each rank gets several (one tile a batch: the MAE masks are drawn per batch)
    made = run(model, image, output, None, 7 if model.task == "classification" else 1)
    assert bool(made) == (rank == 0)


def _in_the_dchag_layout(model, directory):
    """The model saved as if trained with D-CHAG over 2 ranks (what predict lays out)."""
    model.meta["provenance"] = {**(model.meta.get("provenance") or {}),
                                "fingerprint": {"parallel.tp": 2, "parallel.strategy": "dchag"}}  # fmt: skip
    return model_folder.save(model, directory)


def test_a_classification_map_of_a_whole_scene_matches_the_training_patches(tmp_path):
    import rasterio
    import scipy.io
    from rasterio.transform import Affine

    from dchag.hsi import demo

    cube, labels, centres, _ = demo.scene(40, 40, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"indian_pines_gt": labels})
    model, store = hsi_model(
        tmp_path,
        "classification",
        {"image": str(tmp_path / "img.mat"), "labels": str(tmp_path / "gt.mat"), "patch": 5},
        {"patch_size": 1, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2},
        clip_percentiles=[2, 98],  # the training bounds travel in the model folder and clip the new image
    )
    assert len(model.meta["normalisation"]["clip"][0]) == model.config.in_channels
    model_folder.save(model, tmp_path / "model")
    assert main(["predict", "--model", str(tmp_path / "model"), "--image", str(tmp_path / "img.mat"),
                 "--output", str(tmp_path / "map.zarr")]) == 0  # fmt: skip
    out = xr.open_zarr(tmp_path / "map.zarr")
    assert out.label.shape == (40, 40) and out.probability.shape == (4, 40, 40)
    called = model_folder.load(tmp_path / "model").classify(tmp_path / "img.mat")  # from Python: the same map
    assert (called.label.values == out.label.values).all()
    np.testing.assert_allclose(called.probability.values, out.probability.values, atol=1e-6)  # another batching
    assert (tmp_path / "map.png").stat().st_size > 5000 and not (tmp_path / "map.tif").exists()  # no georeference
    # The test patches the preprocessing made, classified by the same network: the map's
    # probabilities at their pixels (the image read and normalised again from the .mat).
    test = xr.open_zarr(store, group="test")
    with torch.no_grad():
        ref = torch.softmax(model.network(torch.from_numpy(test.patches.values)), -1).numpy()
    got = out.probability.values[:, test.row.values, test.col.values].T
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert (out.label.values[test.row.values, test.col.values] == ref.argmax(1) + 1).all()
    # Under torchrun, in a D-CHAG layout: the same map from rank 0, nothing from rank 1.
    run_distributed(_hsi_on_ranks, 2, str(_in_the_dchag_layout(model, tmp_path / "tp2")), str(tmp_path / "img.mat"),
                    str(tmp_path / "map2.zarr"))  # fmt: skip
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "map2.zarr").probability.values, out.probability.values,
                               atol=1e-5)  # fmt: skip
    # A georeferenced GeoTIFF of the scene: the labels as a GeoTIFF on its grid too.
    transform = Affine(30.0, 0, 500000.0, 0, -30.0, 4200000.0)
    with rasterio.open(tmp_path / "img.tif", "w", driver="GTiff", height=40, width=40, count=cube.shape[2],
                       dtype="float32", crs="EPSG:32616", transform=transform) as dst:  # fmt: skip
        dst.write(cube.transpose(2, 0, 1).astype(np.float32))
        for b, wl in enumerate(centres, start=1):
            dst.update_tags(b, wavelength=str(wl), wavelength_units="Nanometers")
    assert main(["predict", "--model", str(tmp_path / "model"), "--image", str(tmp_path / "img.tif"),
                 "--output", str(tmp_path / "geo.zarr")]) == 0  # fmt: skip
    with rasterio.open(tmp_path / "geo.tif") as src:
        assert src.crs.to_string() == "EPSG:32616" and src.transform == transform
        assert (src.read(1) == xr.open_zarr(tmp_path / "geo.zarr").label.values).all()


def test_mae_reconstructions_of_a_new_image(tmp_path):
    from dchag.hsi import demo
    from dchag.hsi.readers import read_image

    images = demo.write_envi(tmp_path / "envi", count=2, rows=32, cols=32)
    model, _ = hsi_model(
        tmp_path,
        "mae",
        {"images": [str(p) for p in images], "tile": 16},
        {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2},
    )
    made = model_folder.save(model, tmp_path / "model")
    new = demo.write_envi(tmp_path / "new", count=1, rows=40, cols=40, seed=7)[0]
    assert main(["predict", "--model", str(made), "--image", str(new), "--output", str(tmp_path / "r.zarr"),
                 "--batch-size", "1"]) == 0  # fmt: skip
    out = xr.open_zarr(tmp_path / "r.zarr")
    assert out.truth.shape == out.reconstruction.shape == (200, 40, 40) and int(out.attrs["tiles"]) == 4
    called = model_folder.load(made).reconstruct(new, batch_size=1)  # from Python: the same reconstructions
    for name in ("truth", "reconstruction", "masked"):
        np.testing.assert_array_equal(called[name].values, out[name].values)
    img = read_image(str(new))
    bands = np.asarray(model.meta["bands"]["band"])
    done = np.isfinite(out.truth.values[0])  # the complete tiles; the last 8 rows and columns are none
    assert done[:32, :32].all() and not done[32:].any()
    raw = img.read(bands).transpose(2, 0, 1)
    np.testing.assert_allclose(out.truth.values[:, :32, :32], raw[:, :32, :32], rtol=1e-4, atol=1e-3)
    assert out.masked.values[:32, :32].mean() == 0.75  # 12 of the 16 patches of each tile masked
    scores = json.loads(out.attrs["scores"])
    assert set(scores) == {"masked", "full"} and scores["masked"]["rmse"] > 0
    # Under torchrun, in a D-CHAG layout, one tile a batch: the same masks and reconstructions.
    run_distributed(_hsi_on_ranks, 2, str(_in_the_dchag_layout(model, tmp_path / "tp2")), str(new),
                    str(tmp_path / "r2.zarr"))  # fmt: skip
    two = xr.open_zarr(tmp_path / "r2.zarr")
    assert (two.masked.values == out.masked.values).all()
    np.testing.assert_allclose(two.reconstruction.values, out.reconstruction.values, rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="not a classification model"):
        from dchag.predict.hsi import classify_scene

        classify_scene(model, str(new), str(tmp_path / "x.zarr"))


def test_initial_conditions_on_another_grid_are_one_error():
    """Same latitudes, other longitudes (a 32 x 128 file for a 32 x 64 model): refused by name."""
    from types import SimpleNamespace

    from dchag.grids import weatherbench_grid
    from dchag.predict.weather import PredictError, _check_grid

    grid = weatherbench_grid(5.625)
    model = SimpleNamespace(
        meta={"grid": {"latitude": grid.lat.tolist(), "longitude": grid.lon.tolist(), "resolution": 5.625}}
    )
    _check_grid(model, grid.lat, grid.lon, "file x.nc")  # the model's own grid
    finer = weatherbench_grid(2.8125)
    with pytest.raises(PredictError, match="file x.nc is on a 32x128 grid, the model on its 32x64"):
        _check_grid(model, grid.lat, finer.lon, "file x.nc")


def test_bands_are_matched_by_centre_and_an_mae_head_only_for_the_same_bands():
    from support.parallel_checks import small_config

    from dchag.model.model import ChannelViT
    from dchag.predict.export import Model
    from dchag.train import finetune

    cmap = finetune.channel_map
    src = {"wavelengths": [400.0, 410.0, 420.0, 430.0]}
    # nearest centre within half the source's spacing; farther is new; order does not matter
    assert cmap({"wavelengths": [431.0, 400.0, 404.9, 999.0]}, src) == [3, 0, 0, None]
    # a band without a centre matches nothing, on either side; no centres at all: by position
    # (410 nm is half the spacing from 400 and 420: the first; never the centre-less band 1)
    assert cmap({"wavelengths": [400.0, 410.0, 999.0]}, {"wavelengths": [400.0, None, 420.0]}) == [0, 0, None]
    assert cmap({"wavelengths": [None, 420.0]}, src) == [None, 2]
    assert cmap({"wavelengths": [None, None]}, {"wavelengths": [None, None]}) == [0, 1]
    assert cmap({"names": ["t2m", "z500", "new"]}, {"names": ["z500", "t2m"]}) == [1, 0, None]
    with pytest.raises(finetune.FineTuneError, match="reads bands"):
        cmap({"names": ["t2m"]}, src)

    def mae(wavelengths, seed):
        torch.manual_seed(seed)
        cfg = small_config(in_channels=4, task="mae", out_channels=[], wavelengths=wavelengths)
        return ChannelViT(cfg)

    source = Model(
        meta={"task": "mae", "bands": {"wavelength": src["wavelengths"]}}, network=mae(src["wavelengths"], 0)
    )
    same = mae(src["wavelengths"], 1)
    report = finetune.initialise(same, src, source, same_task=True)
    assert torch.equal(same.head.weight, source.network.head.weight) and not any("head." in n for n in report["new"])
    shifted = [410.0, 420.0, 430.0, 440.0]  # four bands, but not the same ones
    other = mae(shifted, 1)
    report = finetune.initialise(other, {"wavelengths": shifted}, source, same_task=True)
    assert "head.weight (the source reconstructs other channels)" in report["new"]
    assert not torch.equal(other.head.weight, source.network.head.weight)
    # rows of the tokenizer follow the match: target band 0 (410 nm) is source band 1
    assert torch.equal(other.tokenizer.weight[0], source.network.tokenizer.weight[1])


def test_patch_kernels_and_position_embeddings_are_resized():
    from dchag.train.finetune import _resize_kernel, _resize_pos

    w = torch.randn(3, 5, 16)  # patch 4
    for p in (2, 8):  # smaller and larger patches respond alike to a constant patch
        r = _resize_kernel(w, 4, p)
        assert r.shape == (3, 5, p * p)
        torch.testing.assert_close(r.sum(-1), w.sum(-1), rtol=1e-5, atol=1e-5)
    pos = torch.randn(1, 2 * 4, 6)
    assert torch.equal(_resize_pos(pos, (2, 4), (2, 4)), pos)
    assert _resize_pos(pos, (2, 4), (4, 8)).shape == (1, 32, 6)
