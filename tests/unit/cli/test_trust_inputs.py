"""Inputs checked before they are believed: every number of the command line in its range,
the no-data conventions of label rasters, the config's size in bytes, and the product
readers' one-line errors (issue 31)."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest
from support import REPO

from dchag import cli
from dchag.cli import common

# Numeric flags left as plain int/float on purpose: any raw value (NaN too) may mark a
# missing pixel; a negative band axis counts from the end (checked against the cubes).
UNRANGED = {
    ("preprocess-hsi", "--nodata"),
    ("score-recon", "--band-axis"),
}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_numeric_flag_has_a_range():
    ranged = {common.positive_int, common.nonneg_int, common.positive_float, common.nonneg_float, common.percentile}
    plain, seen = [], 0
    for name, sp in _subcommands().items():
        for action in sp._actions:
            if action.type in (int, float) and (name, action.option_strings[0]) not in UNRANGED:
                plain.append(f"{name} {action.option_strings[0]}")
            seen += action.type in ranged
    assert not plain, f"numeric flags without a range: {plain}"
    assert seen > 40


@pytest.mark.parametrize(
    "argv, flag, expected",
    [
        (["predict", "--model", "m", "--output", "o.zarr", "--batch-size", "-1"], "--batch-size", "positive integer"),
        (["predict", "--model", "m", "--output", "o.zarr", "--batch-size", "0"], "--batch-size", "positive integer"),
        (["predict", "--model", "m", "--output", "o.zarr", "--batch-size", "-2"], "--batch-size", "positive integer"),
        (["predict", "--model", "m", "--output", "o.zarr", "--lead-hours", "24", "-6"], "--lead-hours", "positive"),
        (
            [
                "advise",
                "--alpha=-0.5",
                "--intra-bw",
                "1e10",
                "--inter-bw",
                "1e9",
                "--gpus",
                "8",
                "--gpus-per-node",
                "4",
                "--gradient-bytes",
                "1e9",
                "--compute-s",
                "0.1",
            ],
            "--alpha",
            "number >= 0",
        ),  # fmt: skip
        (
            [
                "advise",
                "--alpha",
                "1e-5",
                "--intra-bw",
                "1e10",
                "--inter-bw",
                "1e9",
                "--gpus",
                "0",
                "--gpus-per-node",
                "4",
                "--gradient-bytes",
                "1e9",
                "--compute-s",
                "0.1",
            ],
            "--gpus",
            "positive integer",
        ),  # fmt: skip
        (["advise", "--alpha", "nan", "--gpus", "1", "--gpus-per-node", "1"], "--alpha", "number >= 0"),
        (["advise", "--intra-bw", "inf", "--gpus", "1", "--gpus-per-node", "1"], "--intra-bw", "positive number"),
        (
            [
                "advise",
                "--alpha",
                "0",
                "--intra-bw",
                "1e10",
                "--inter-bw",
                "1e9",
                "--gpus",
                "4",
                "--gpus-per-node",
                "4",
                "--gradient-bytes",
                "1e9",
                "--compute-s",
                "0",
            ],
            "--compute-s",
            "positive number",
        ),  # fmt: skip
        (["regrid", "in.nc", "--grid", "-5.625", "--output", "o.nc"], "--grid", "positive number"),
        (
            ["era5-climatology-part", "--config", "c", "--part", "0", "--parts", "4", "--output", "o", "y"],
            "--part",
            "positive integer",
        ),  # fmt: skip
        (
            ["score", "--forecast", "f", "--truth", "t", "--convention", "wb2", "--batch-size", "0", "--output", "o"],
            "--batch-size",
            "positive integer",
        ),  # fmt: skip
        (["figure", "lead-time", "s.csv", "--lead-index", "-1", "--output", "o.png"], "--lead-index", "integer >= 0"),
        (["preprocess-hsi", "x.mat", "--clip", "2", "200", "--output", "o"], "--clip", "percentile from 0 to 100"),
        (["demo-hsi", "--outdir", "d", "--seed", "-3"], "--seed", "integer >= 0"),
        (["describe-model", "--config", "c", "--groups", "0"], "--groups", "positive integer"),
        (
            ["paper-point", "--config", "c", "--point", "p", "--output", "o", "--threads-per-rank", "0"],
            "--threads-per-rank",
            "positive integer",
        ),  # fmt: skip
    ],
)
def test_a_number_out_of_range_is_a_usage_error_naming_the_flag(tmp_path, monkeypatch, capsys, argv, flag, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    last = err.strip().splitlines()[-1]
    assert f"error: argument {flag}: expected a {expected}" in last or f"expected an {expected}" in last, err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_a_hardware_profile_with_a_negative_latency_is_refused(tmp_path, capsys):
    profile = tmp_path / "hw.yaml"
    profile.write_text("alpha: -0.5\nintra_bw: 1.0e+10\ninter_bw: 1.0e+9\n")
    argv = ["advise", "--hardware", str(profile), "--gpus", "8", "--gpus-per-node", "4",
            "--gradient-bytes", "1e9", "--compute-s", "0.1"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dchag advise: error: hardware profile {profile}: alpha = -0.5; expected seconds >= 0"
    profile.write_text("alpha: 5e-6\nintra_bw: 1.0e+10\ninter_bw: 1.0e+9\n")  # YAML reads 5e-6 as a string
    assert cli.main(argv) == 0


def test_a_band_axis_outside_the_cubes_is_one_line(tmp_path, capsys):
    cube = np.random.default_rng(0).random((8, 8, 4))
    np.save(tmp_path / "t.npy", cube)
    np.save(tmp_path / "p.npy", cube)
    argv = ["score-recon", "--truth", str(tmp_path / "t.npy"), "--pred", str(tmp_path / "p.npy"),
            "--band-axis", "5", "--output", str(tmp_path / "s.json")]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dchag score-recon: error: band axis 5: the cubes have 3 axes (shape (8, 8, 4))"
    assert not (tmp_path / "s.json").exists()


# -- the config's size, in bytes ------------------------------------------------------------------
def _one_string_aliased(repeats: int, length: int) -> str:
    """The demo config whose class names are one long string, named once and aliased."""
    text = (REPO / "config" / "demo.yaml").read_text()
    names = "    class_names: [concrete, lichen, red maple, rock]"
    assert names in text
    aliased = f'    class_names: [&s "{"x" * length}"' + ", *s" * (repeats - 1) + "]"
    return text.replace(names, aliased)


def test_the_config_limit_counts_bytes_not_values(tmp_path, capsys):
    from support.commands import snakemake

    from dchag.config import ConfigError, read_yaml

    path = tmp_path / "bomb.yaml"
    path.write_text(_one_string_aliased(100, 20_000))  # 20 kB of YAML, 2 MB once expanded; 100-odd values
    with pytest.raises(ConfigError, match=r"bomb.yaml: the config expands to more than 1000000 bytes"):
        read_yaml(path)
    assert cli.main(["describe-model", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dchag describe-model: error: {path}: the config expands") and "\n" not in err
    work = tmp_path / "work"
    work.mkdir()
    proc = snakemake(work, "-n", configfile=path)
    assert proc.returncode != 0 and "expands to more than 1000000 bytes" in proc.stdout + proc.stderr
    written = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert written < 100_000, written
    path.write_text(_one_string_aliased(4, 20_000))  # long names, but a config's size
    assert len(read_yaml(path)["hsi"]["classification"]["class_names"]) == 4


# -- label rasters: no no-data value becomes a class ----------------------------------------------
rasterio = pytest.importorskip("rasterio")


def _label_file(kind: str, folder, labels: np.ndarray, nodata: float | None = None):
    """``labels`` as a real .mat (scipy), GeoTIFF (rasterio, north-up 30 m) or ENVI (Spectral
    Python) file of their dtype, with the file's own nodata value where given."""
    import scipy.io
    import spectral.io.envi as envi

    if kind == "mat":
        scipy.io.savemat(folder / "gt.mat", {"gt": labels})
        return folder / "gt.mat"
    if kind == "tif":
        profile = {"driver": "GTiff", "dtype": labels.dtype.name, "count": 1, "height": labels.shape[0],
                   "width": labels.shape[1], "crs": "EPSG:32633",
                   "transform": rasterio.Affine(30.0, 0.0, 366000.0, 0.0, -30.0, 5808000.0)}  # fmt: skip
        if nodata is not None:
            profile["nodata"] = nodata
        with rasterio.open(folder / "gt.tif", "w", **profile) as dst:
            dst.write(labels[None])
        return folder / "gt.tif"
    meta = {} if nodata is None else {"data ignore value": nodata}
    envi.save_image(str(folder / "gt.hdr"), labels[:, :, None], dtype=labels.dtype, metadata=meta, force=True)
    return folder / "gt.hdr"


@pytest.mark.parametrize(
    "kind, dtype, background, declared",
    [
        ("mat", "uint16", 65535, None),
        ("tif", "uint16", 65535, None),
        ("envi", "uint16", 65535, None),
        ("tif", "uint8", 255, None),
        ("tif", "uint16", 9999, 9999),  # the file's own nodata value
        ("envi", "uint16", 9999, 9999),
    ],
)
def test_no_data_label_values_are_no_class(tmp_path, kind, dtype, background, declared):
    import scipy.io
    from support.hsi import classify, open_split

    from dchag.hsi import demo

    cube, labels, *_ = demo.scene(32, 32, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"img": cube})
    lab = labels.astype(dtype)
    lab[lab == 0] = background  # the background of a delivered label raster
    lab[:3] = 0  # and a few unlabelled rows
    path = _label_file(kind, tmp_path, lab, declared)
    store = classify(tmp_path / "img.mat", path, tmp_path / "o.zarr", common={"preset": "indian_pines"}, patch=3)
    train = open_split(store, "train")
    present = sorted(set(np.unique(labels).tolist()) - {0})
    assert train.attrs["label_values"] == present, train.attrs["label_values"]
    assert int(train.label.max()) == len(present)


def test_a_label_geotiff_without_georeference_is_read_as_stored(tmp_path):
    from support.hsi_products import write_label_tile

    from dchag.hsi.readers import read_labels

    lab = np.zeros((6, 5), np.uint8)
    lab[0] = 1  # the first row, as stored
    write_label_tile(tmp_path / "l.tif", lab)
    with pytest.warns(rasterio.errors.NotGeoreferencedWarning):
        got = read_labels(str(tmp_path / "l.tif"))
    assert (got.values == lab).all() and not got.georeference


# -- the product readers: one line naming the file ------------------------------------------------
def _preprocess_error(capsys, *argv) -> str:
    assert cli.main(["preprocess-hsi", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_a_truncated_enmap_geotiff_is_one_line(tmp_path, capsys):
    from support.hsi_products import write_enmap

    tif = write_enmap(tmp_path / "enmap")
    tif.write_bytes(tif.read_bytes()[: tif.stat().st_size // 2])
    line = _preprocess_error(capsys, tif, "--tile", "8", "--output", tmp_path / "o.zarr")
    assert line.startswith(f"dchag preprocess-hsi: error: GeoTIFF {tif}: its pixels cannot be read (")
    assert line.endswith("the file is truncated or corrupt, download it again")
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("centres", ["zero", "nan", "absent"])
def test_a_prisma_product_without_band_centres_is_one_line(tmp_path, capsys, centres):
    import h5py
    from support.hsi_products import write_prisma

    from dchag.hsi.readers import HsiInputError, read_image

    he5 = write_prisma(tmp_path / "prisma")
    with h5py.File(he5, "a") as f:
        if centres == "absent":
            del f.attrs["List_Cw_Swir"]
        else:
            f.attrs["List_Cw_Swir"] = np.full(173, 0.0 if centres == "zero" else np.nan, np.float32)
    expected = {
        "zero": "List_Cw_Swir gives no usable band centres (all 173 are 0)",
        "nan": "List_Cw_Swir gives no usable band centres (nan at band 0)",
        "absent": "no file attribute List_Cw_Swir",
    }[centres]
    with pytest.raises(HsiInputError, match=re.escape(f"{he5}: {expected}")):
        read_image(str(he5), detector_overlap="swir")
    line = _preprocess_error(capsys, he5, "--tile", "8", "--output", tmp_path / "o.zarr")
    assert expected in line and not (tmp_path / "o.zarr").exists()


def test_an_unknown_envi_data_type_is_named(tmp_path, capsys):
    import spectral.io.envi as envi

    envi.save_image(str(tmp_path / "x.hdr"), np.ones((8, 8, 3), np.float32), force=True)
    hdr = tmp_path / "x.hdr"
    hdr.write_text(hdr.read_text().replace("data type = 4", "data type = 99"))
    line = _preprocess_error(capsys, hdr, "--tile", "4", "--output", tmp_path / "o.zarr")
    assert line.startswith(f"dchag preprocess-hsi: error: ENVI header {hdr}: data type = 99; expected one of ")
    assert "4 (float32)" in line and "12 (uint16)" in line and not (tmp_path / "o.zarr").exists()


def _classifier_of(tmp_path, image, labels):
    """A seeded (untrained) classifier of the bands of ``image``, from the store the real
    preprocessing made of ``image`` and ``labels``, saved as export writes it."""
    import torch
    from support.hsi import hsi_config

    from dchag.config import run_settings, validate
    from dchag.hsi.preprocess import preprocess_from_config
    from dchag.model import ChannelViT
    from dchag.model import folder as model_folder
    from dchag.predict import export
    from dchag.train.tasks import build_task

    cfg = hsi_config("classification", {"image": str(image), "labels": str(labels), "patch": 3})
    cfg = validate(
        {
            **cfg,
            "model": {"patch_size": 1, "embed_dim": 8, "depth": 1, "num_heads": 2, "aggregation": "linear"},
            "parallel": {"tp": 1, "data_parallel": "none"},
            "train": {"runs": {"r": {"task": "classification"}}},
        }
    )
    store = preprocess_from_config(cfg, "classification", tmp_path / "train.zarr")
    t = build_task(run_settings(cfg, "r"), {"train": store, "val": store})
    torch.manual_seed(0)
    model = export.describe(t, store, ChannelViT(t.model_cfg), {"run": "r"})
    return model_folder.save(model, tmp_path / "model")


@pytest.fixture
def emit_classifier(tmp_path):
    import scipy.io
    from support.hsi_products import write_emit

    nc, _ = write_emit(tmp_path / "emit", rows=24, cols=20)
    labels = np.zeros((24, 20), np.uint8)
    labels[2:12, 2:18], labels[12:22, 2:10], labels[12:22, 10:18] = 1, 2, 3
    scipy.io.savemat(tmp_path / "gt.mat", {"gt": labels})
    return nc, _classifier_of(tmp_path, nc, tmp_path / "gt.mat")


def test_an_emit_product_is_classified(tmp_path, emit_classifier):
    import json

    import xarray as xr

    nc, model = emit_classifier
    out = tmp_path / "map.zarr"
    assert cli.main(["predict", "--model", str(model), "--image", str(nc), "--output", str(out)]) == 0
    got = xr.open_zarr(out)
    assert got.label.shape == (24, 20) and set(np.unique(got.label.values)) <= {0, 1, 2, 3}
    grid = json.loads(got.attrs["georeference"])  # EMIT's map grid (of its lookup table), as numbers
    assert grid["grid_geotransform"] == pytest.approx([-104.6, 0.000542232520256, 0.0, 32.5, 0.0, -0.000542232520256])
    assert grid["grid_crs"].startswith('GEOGCS["WGS 84"')
    # the image is in sensor geometry: no label GeoTIFF on the map grid's transform
    assert (tmp_path / "map.png").exists() and not (tmp_path / "map.tif").exists()


def test_a_bad_emit_geotransform_is_one_line_before_anything_is_written(tmp_path, capsys, emit_classifier):
    import netCDF4

    nc, model = emit_classifier
    with netCDF4.Dataset(nc, "a") as f:
        f.geotransform = "[-104.6 0.00054 0.0]"
    out = tmp_path / "map.zarr"
    assert cli.main(["predict", "--model", str(model), "--image", str(nc), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"dchag predict: error: {nc}: geotransform = '[-104.6 0.00054 0.0]'; expected six finite numbers "
        "in GDAL's order (x0, dx, rx, y0, ry, dy)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emit", "gt.mat", "model", "train.zarr"]


def test_a_classification_map_is_written_whole_or_not_at_all(tmp_path, capsys, monkeypatch, emit_classifier):
    """The image of a georeferenced GeoTIFF: when its label GeoTIFF cannot be written (a full
    disk), the Zarr store and the PNG written before it are removed."""
    import errno

    from dchag.predict import hsi

    nc, model = emit_classifier
    from dchag.hsi.readers import read_image

    img = read_image(str(nc))
    cube = img.read(np.arange(img.shape[2]))
    with rasterio.open(
        tmp_path / "img.tif", "w", driver="GTiff", height=24, width=20, count=cube.shape[2], dtype="float32",
        crs="EPSG:32633", transform=rasterio.Affine(30.0, 0.0, 366000.0, 0.0, -30.0, 5808000.0),
    ) as dst:  # fmt: skip
        dst.write(np.moveaxis(cube, -1, 0))
        for b, w in enumerate(img.wavelengths, start=1):
            dst.update_tags(b, wavelength=f"{w:.4f}", wavelength_units="Nanometers")

    def full_disk(labels, grid, output):
        raise OSError(errno.ENOSPC, "No space left on device", str(output))

    monkeypatch.setattr(hsi, "_geotiff", full_disk)
    out = tmp_path / "geo.zarr"
    assert cli.main(["predict", "--model", str(model), "--image", str(tmp_path / "img.tif"), "--output", str(out)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "geo.png").exists() and not (tmp_path / "geo.tif").exists()


def test_a_reversed_wavelength_range_is_refused(tmp_path, capsys):
    from support.hsi_products import write_emit

    nc, _ = write_emit(tmp_path / "emit", rows=16, cols=16)
    line = _preprocess_error(capsys, nc, "--tile", "8", "--drop-wavelengths", "1450-1340", "--output", tmp_path / "o")
    assert line == (
        "dchag preprocess-hsi: error: hsi.drop_wavelengths [1450, 1340]: expected a range [LO, HI] in nm, 0 <= LO <= HI"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("task", ["classification", "mae"])
def test_a_negative_preprocessing_seed_is_a_config_error(task):
    from dchag.config import ConfigError, validate

    section = {"image": "x.mat", "labels": "y.mat"} if task == "classification" else {"images": ["x.hdr"]}
    with pytest.raises(ConfigError, match=rf"key 'hsi.{task}.seed': -3 is less than the minimum of 0"):
        validate({"name": "t", "hsi": {task: {**section, "seed": -3}}}, "test config", check_files=False)


def test_a_lead_index_beyond_the_forecast_is_one_line(tmp_path, capsys):
    import pandas as pd
    import xarray as xr

    times = pd.date_range("2001-01-01", periods=3, freq="1D")
    lat, lon = np.linspace(-80, 80, 4), np.linspace(0, 270, 4)
    truth = xr.Dataset(
        {"2m_temperature": (("time", "latitude", "longitude"), np.full((6, 4, 4), 280.0, np.float32))},
        coords={"time": pd.date_range("2001-01-01", periods=6, freq="1D"), "latitude": lat, "longitude": lon},
    )
    leads = pd.to_timedelta([24, 48], unit="h")
    forecast = xr.Dataset(
        {"2m_temperature": (("time", "prediction_timedelta", "latitude", "longitude"), np.full((3, 2, 4, 4), 281.0))},
        coords={"time": times, "prediction_timedelta": leads, "latitude": lat, "longitude": lon},
    )
    truth.to_zarr(tmp_path / "truth.zarr")
    forecast.to_zarr(tmp_path / "run.zarr")
    argv = ["figure", "forecast-maps", str(tmp_path / "run.zarr"), "--truth", str(tmp_path / "truth.zarr"),
            "--output", str(tmp_path / "maps.png")]  # fmt: skip
    assert cli.main([*argv, "--lead-index", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dchag figure: error: forecast maps: lead index 2, but {tmp_path / 'run.zarr'} has 2 lead(s)"
    assert not (tmp_path / "maps.png").exists()
    assert cli.main([*argv, "--lead-index", "1"]) == 0 and (tmp_path / "maps.png").exists()


def test_a_grid_finer_than_any_reanalysis_is_refused_before_allocating(tmp_path, capsys):
    import xarray as xr

    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), np.ones((1, 19, 36), np.float32))},
        coords={"time": [0], "latitude": np.linspace(90, -90, 19), "longitude": np.arange(0, 360, 10.0)},
    )
    ds.to_netcdf(tmp_path / "in.nc")
    argv = ["regrid", str(tmp_path / "in.nc"), "--output", str(tmp_path / "out.nc"), "--grid"]
    assert cli.main([*argv, "1e-9"]) == 2  # 1.3 TiB of indices
    assert capsys.readouterr().err.strip() == "dchag regrid: error: grid resolution 1e-09 deg: expected 0.1 to 180 deg"
    assert not (tmp_path / "out.nc").exists()


def test_a_demo_scene_too_large_for_memory_is_refused(tmp_path, capsys):
    assert cli.main(["demo-hsi", "--outdir", str(tmp_path / "d"), "--size", "100000"]) == 2  # 7 TiB
    assert capsys.readouterr().err.strip() == "dchag demo-hsi: error: demo-hsi size 100000: expected 16 to 2048"
    assert not (tmp_path / "d").exists()
