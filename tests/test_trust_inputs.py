"""Inputs checked before they are believed: every number of the command line in its range,
the no-data conventions of label rasters, the config's size in bytes, and the product
readers' one-line errors (issue 31)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from conftest import REPO

from dchag import cli
from dchag.cli import common

# Numeric flags left as plain int/float on purpose: any raw value (NaN too) may mark a
# missing pixel; a negative band axis counts from the end (checked against the cubes);
# launch-train's flags are checked with the rest of that command.
UNRANGED = {
    ("preprocess-hsi", "--nodata"),
    ("score-recon", "--band-axis"),
    ("launch-train", "--nproc"),
    ("launch-train", "--max-restarts"),
    ("launch-train", "--threads-per-rank"),
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
    from test_workflow import snakemake

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
    from test_hsi_products import classify, group

    from dchag.hsi import demo

    cube, labels, *_ = demo.scene(32, 32, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"img": cube})
    lab = labels.astype(dtype)
    lab[lab == 0] = background  # the background of a delivered label raster
    lab[:3] = 0  # and a few unlabelled rows
    path = _label_file(kind, tmp_path, lab, declared)
    train = group(classify(tmp_path / "img.mat", path, tmp_path / "o.zarr"), "train")
    present = sorted(set(np.unique(labels).tolist()) - {0})
    assert train.attrs["label_values"] == present, train.attrs["label_values"]
    assert int(train.label.max()) == len(present)


def test_a_label_geotiff_without_georeference_is_read_as_stored(tmp_path):
    from hsi_products import write_label_tile

    from dchag.hsi.readers import read_labels

    lab = np.zeros((6, 5), np.uint8)
    lab[0] = 1  # the first row, as stored
    write_label_tile(tmp_path / "l.tif", lab)
    with pytest.warns(rasterio.errors.NotGeoreferencedWarning):
        got = read_labels(str(tmp_path / "l.tif"))
    assert (got.values == lab).all() and not got.georeference
