"""Today's hyperspectral products and labelled tile sets, on files written by the real writers
in each product's layout (tests/support/hsi_products.py): EnMAP L2A GeoTIFF (rasterio, with DLR's
METADATA.XML or with GDAL band metadata), PRISMA L2D HDF-EOS5 (h5py), EMIT L2A netCDF4 with
groups, GeoTIFF image/label tile sets. Values are checked against each product's own
definition of its values (EnMAP: DN x GainOfBand; PRISMA: Min + DN (Max - Min) / 65535;
EMIT: as stored), read back independently with rasterio / h5py / netCDF4. Then the bad files
of issues 22 and 23: each a one-line error naming the file and what was expected."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.io
import spectral.io.envi as envi
import xarray as xr
import yaml
from support import REPO
from support.hsi import open_split
from support.hsi_products import (
    enmap_bands,
    enmap_outside,
    prisma_outside,
    prisma_reflectance,
    write_emit,
    write_enmap,
    write_image_tile,
    write_label_tile,
    write_prisma,
)

from dchag import cli
from dchag.config import validate
from dchag.hsi import demo
from dchag.hsi.preprocess import preprocess_from_config
from dchag.hsi.readers import HsiInputError, read_image
from dchag.hsi.sources import expand_images

rasterio = pytest.importorskip("rasterio")


def run(task: str, section: dict, output, **common):
    cfg = validate({"name": "t", "hsi": {**common, task: section}}, "test config")
    return preprocess_from_config(cfg, task, output)


def tiles_of(store) -> dict[str, xr.Dataset]:
    return {s: open_split(store, s) for s in ("train", "val", "test")}


def check_tiles_against(store, physical: np.ndarray, missing: np.ndarray, tile: int, bands: np.ndarray):
    """Every stored tile is the normalised reference cube at its (row0, col0), none holds a
    missing pixel, and mean/std are those of the training tiles' reference pixels."""
    groups = tiles_of(store)
    train = groups["train"]
    ref = physical[:, :, bands]
    pix = np.concatenate(
        [ref[r : r + tile, c : c + tile].reshape(-1, bands.size) for r, c in zip(train.row0.values, train.col0.values)]
    )
    assert np.allclose(train["mean"].values, pix.mean(0), rtol=1e-5, atol=1e-7)
    assert np.allclose(train["std"].values, pix.std(0), rtol=1e-4, atol=1e-7)
    for ds in groups.values():
        for k in range(ds.sizes["sample"]):
            r, c = int(ds.row0[k]), int(ds.col0[k])
            assert not missing[r : r + tile, c : c + tile].any()
            want = (ref[r : r + tile, c : c + tile] - train["mean"].values) / train["std"].values
            assert np.allclose(ds.tiles.values[k], want.transpose(2, 0, 1), atol=2e-4)
        assert np.abs(ds.tiles.values).max() < 50  # no fill value normalised into a huge number
    return groups


# -- EnMAP L2A ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["dlr_xml", "gdal_metadata"])
def test_enmap_l2a_geotiff(tmp_path, layout):
    tif = write_enmap(tmp_path / "enmap", xml=layout == "dlr_xml")
    out = run("mae", {"images": [str(tif)], "tile": 8}, tmp_path / "m.zarr")
    centres, fwhm, bad = enmap_bands()
    with rasterio.open(tif) as src:  # the reference: DN x 0.0001 (EnMAP's GainOfBand), -32768 = no data
        dn = np.moveaxis(src.read(), 0, -1)
    missing = (dn[:, :, ~bad] == -32768).any(2)
    assert np.array_equal(missing, enmap_outside(40, 48))
    groups = check_tiles_against(out, dn * 1e-4, missing, 8, np.flatnonzero(~bad))
    train = groups["train"]
    assert train.sizes["band"] == 218 and np.array_equal(train.band.values, np.flatnonzero(~bad))
    assert np.allclose(train.wavelength.values, centres[~bad], atol=1e-3)
    assert np.allclose(train.fwhm.values, fwhm[~bad], atol=1e-3)
    assert "6 bad bands" in train.attrs["band_selection"] and "fill value" in train.attrs["band_selection"]
    geo = json.loads(train.attrs["georeference"])[0]
    assert geo["crs"] == "EPSG:32633" and geo["geotransform"] == [366000.0, 30.0, 0.0, 5808000.0, 0.0, -30.0]
    assert train.attrs["missing_value"] == -32768 and train.attrs["missing_pixels"] == int(missing.sum())
    # the tiles touching a no-data corner are no samples, the other ones all are
    grid = [(r, c) for r in range(0, 40, 8) for c in range(0, 48, 8)]
    touched = sum(bool(missing[r : r + 8, c : c + 8].any()) for r, c in grid)
    assert touched == 2 and train.attrs["dropped_tiles_with_missing_pixels"] == touched
    assert sum(g.sizes["sample"] for g in groups.values()) == len(grid) - touched
    if layout == "dlr_xml":
        assert train.attrs["source_product"] == "EnMAP L2A" and "GainOfBand" in train.attrs["value_scale"]
    else:
        assert "GDAL band scale" in train.attrs["value_scale"]


def test_enmap_classification_leaves_out_windows_with_missing_pixels(tmp_path):
    """A labelled pixel whose patch window touches the no-data corner is no sample; the rest are."""
    tif = write_enmap(tmp_path / "enmap")
    lab = np.ones((40, 48), np.uint8)
    lab[:, 24:] = 2
    write_label_tile(tmp_path / "gt.tif", lab, like=tif)
    out = run(
        "classification", {"image": str(tif), "labels": str(tmp_path / "gt.tif"), "patch": 5}, tmp_path / "c.zarr"
    )
    outside = enmap_outside(40, 48)
    ok = np.array(
        [[not outside[max(0, r - 2) : r + 3, max(0, c - 2) : c + 3].any() for c in range(48)] for r in range(40)]
    )
    groups = {s: open_split(out, s) for s in ("train", "val", "test")}
    got = np.zeros((40, 48), bool)
    for g in groups.values():
        got[g.row.values, g.col.values] = True
        assert np.abs(g.patches.values).max() < 50
    assert np.array_equal(got, ok)
    assert groups["train"].attrs["dropped_centres_with_missing_pixels"] == int((~ok).sum())


def test_enmap_band_selection_and_a_south_up_tile(tmp_path):
    """drop_bands / drop_wavelengths on a product as on ENVI; a GeoTIFF stored south-up is
    read north-up (its first row is the northernmost), with its georeference adjusted."""
    tif = write_enmap(tmp_path / "enmap")
    centres, _, bad = enmap_bands()
    out = run(
        "mae",
        {"images": [str(tif)], "tile": 8},
        tmp_path / "m.zarr",
        drop_bands="1-10",
        drop_wavelengths=[[1800, 2000]],
    )
    wl = open_split(out, "train").wavelength.values
    keep = ~bad & (np.arange(224) >= 10) & ~((centres >= 1800) & (centres <= 2000))
    assert np.allclose(wl, centres[keep], atol=1e-3)
    # south-up: the same image with its rows reversed and a positive y step
    with rasterio.open(tif) as src:
        data, profile, height = src.read(), src.profile, src.height
    t = profile["transform"]
    profile["transform"] = rasterio.Affine(t.a, 0, t.c, 0, -t.e, t.f + t.e * height)
    (tmp_path / "south").mkdir()
    flipped = tmp_path / "south" / tif.name  # the same product, its XML beside it
    xml = next(tif.parent.glob("*-METADATA.XML"))
    (tmp_path / "south" / xml.name).write_text(xml.read_text())
    with rasterio.open(flipped, "w", **profile) as dst:
        dst.write(data[:, ::-1])
    a, b = read_image(str(tif)), read_image(str(flipped))
    assert np.array_equal(a.read([20, 30]), b.read([20, 30]))
    assert b.meta["georeference"]["geotransform"] == a.meta["georeference"]["geotransform"]


# -- PRISMA L2D -----------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", ["swir", "vnir"])
def test_prisma_l2d_he5(tmp_path, overlap):
    he5 = write_prisma(tmp_path / "prisma")
    out = run("mae", {"images": [str(he5)], "tile": 8}, tmp_path / "p.zarr", detector_overlap=overlap)
    wl, refl = prisma_reflectance(he5)  # VNIR then SWIR, each increasing, unused bands left out
    n_vnir = 63
    vnir, swir = wl[:n_vnir], wl[n_vnir:]
    if overlap == "swir":
        keep = np.concatenate([vnir < swir.min(), np.ones(swir.size, bool)])
    else:
        keep = np.concatenate([np.ones(n_vnir, bool), swir > vnir.max()])
    missing = prisma_outside(32, 40)
    groups = check_tiles_against(out, refl, missing, 8, np.flatnonzero(keep))
    train = groups["train"]
    stored = train.wavelength.values
    assert np.allclose(stored, wl[keep]) and 0 not in stored and stored.size == keep.sum()
    vn = stored[: int(keep[:n_vnir].sum())]
    sw = stored[int(keep[:n_vnir].sum()) :]
    assert np.all(np.diff(vn) > 0) and np.all(np.diff(sw) > 0) and vn.max() < sw.min()  # no overlap left
    assert train.attrs["source_product"] == "PRISMA L2D" and "VNIR/SWIR overlap" in train.attrs["band_selection"]
    assert train.attrs["dropped_tiles_with_missing_pixels"] == 1


def test_prisma_with_a_wavelength_preset(tmp_path):
    he5 = write_prisma(tmp_path / "prisma")
    out = run("mae", {"images": [str(he5)], "tile": 8}, tmp_path / "p.zarr", preset="vnir_400_900")
    wl = open_split(out, "train").wavelength.values
    assert wl.min() >= 400 and wl.max() <= 900 and wl.size == int(((np.linspace(1010, 402, 63)) <= 900).sum())


# -- EMIT L2A -------------------------------------------------------------------------------------
def test_emit_l2a_netcdf(tmp_path):
    import netCDF4

    nc, fill = write_emit(tmp_path / "emit")
    out = run("mae", {"images": [str(nc)], "tile": 6}, tmp_path / "e.zarr")
    with netCDF4.Dataset(nc) as ds:  # the reference, read with netCDF4's own masking
        refl = ds["reflectance"][:]
        good = ds["sensor_band_parameters/good_wavelengths"][:].astype(bool)
        wl = np.asarray(ds["sensor_band_parameters/wavelengths"][:])
    missing = np.ma.getmaskarray(refl).any(2)
    assert np.array_equal(missing, fill)
    groups = check_tiles_against(out, np.ma.filled(refl, 0.0), missing, 6, np.flatnonzero(good))
    train = groups["train"]
    assert np.allclose(train.wavelength.values, wl[good]) and train.sizes["band"] == good.sum() == 244
    assert "good_wavelengths" in train.attrs["band_selection"] and train.attrs["missing_value"] == -9999
    assert "downtrack" in train.attrs["geometry"]
    assert train.attrs["dropped_tiles_with_missing_pixels"] == 2  # the fill block straddles two tiles


# -- labelled tile sets ---------------------------------------------------------------------------
def tile_set(folder, labels_of, n=4, size=16, bands=12, seed=0):
    """``n`` image tiles (float32 reflectance GeoTIFFs) and their label tiles, side by side on
    one UTM grid; ``labels_of(i)`` gives tile i's labels; tile 3's label raster declares
    nodata 254."""
    folder.mkdir(parents=True, exist_ok=True)
    wl = np.linspace(450, 2400, bands)
    rng = np.random.default_rng(seed)
    for i in range(n):
        cube = rng.uniform(0.05, 0.6, (size, size, bands)).astype(np.float32)
        lab = labels_of(i)
        cube += 0.05 * (lab[..., None] % 7)  # classes differ in brightness
        img = write_image_tile(folder / f"t{i:02d}_image.tif", cube, (300000.0 + 30 * size * i, 5800000.0), wl)
        write_label_tile(folder / f"t{i:02d}_label.tif", lab, like=img, nodata=254 if i == 3 else None)


def _labels(i, size=16):
    """Classes 1, 2 and 5 in every tile (field sizes vary), 255 (no data) along the first row;
    tile 3 also has its own nodata value 254 along the last."""
    lab = np.zeros((size, size), np.uint8)
    lab[2:8, 2 : 6 + i] = 1
    lab[2:8, 9:14] = 2
    lab[9:14, 3 : 8 + i] = 5
    lab[0, :] = 255
    if i == 3:
        lab[15, :] = 254
    return lab


def _labelled(i) -> int:
    lab = _labels(i)
    return int(((lab > 0) & (lab < 254)).sum())


@pytest.mark.parametrize("split", ["stratified", "disjoint"])
def test_tile_set_classification(tmp_path, split, monkeypatch):
    tile_set(tmp_path / "tiles", _labels)
    section = {
        "image": str(tmp_path / "tiles" / "*_image.tif"),
        "labels": str(tmp_path / "tiles" / "*_label.tif"),
        "patch": 3,
        "split": split,
        "fractions": [0.5, 0.25, 0.25],
        "class_names": ["one", "two", "three", "four", "five"],
    }
    out = run("classification", section, tmp_path / "c.zarr")
    groups = {s: open_split(out, s) for s in ("train", "val", "test")}
    train = groups["train"]
    # 255 is no class; 1, 2, 5 become classes 1..3, named after their values
    assert train.attrs["label_values"] == [1, 2, 5] and train.attrs["class_names"] == ["one", "two", "five"]
    assert json.loads(train.attrs["ignored_label_values"]) == {"255": 4 * 16}  # 254 is tile 3's own nodata
    assert train.attrs["tiles"] == 4 and len(train.attrs["source_images"]) == 4
    assert sum(g.sizes["sample"] for g in groups.values()) == sum(_labelled(i) for i in range(4))
    for g in groups.values():  # each sample is its tile's labelled pixel, in classes 1..3
        for k in range(0, g.sizes["sample"], 7):
            t, r, c = int(g.tile[k]), int(g.row[k]), int(g.col[k])
            assert {1: 1, 2: 2, 5: 3}[int(_labels(t)[r, c])] == int(g.label[k])
    # the statistics: the training centre pixels of every tile, read back with rasterio
    pix = []
    for t, r, c in zip(train.tile.values, train.row.values, train.col.values):
        with rasterio.open(train.attrs["source_images"][t]) as src:
            pix.append(src.read()[:, r, c])
    assert np.allclose(train["mean"].values, np.mean(pix, 0), rtol=1e-5)
    assert np.allclose(
        train.patches.values[:, :, 1, 1], (np.array(pix) - train["mean"].values) / train["std"].values, atol=1e-4
    )
    if split == "disjoint":  # whole tiles: no tile gives samples to two splits
        owners = {}
        for s, g in groups.items():
            for t in set(g.tile.values.tolist()):
                assert owners.setdefault(t, s) == s
    # re-reading every tile between passes (a set too big for memory) gives the same store
    import dchag.hsi.preprocess as pp

    monkeypatch.setattr(pp, "CACHE_BYTES", 0)
    again = run("classification", section, tmp_path / "c2.zarr")
    assert np.array_equal(open_split(again, "test").patches.values, groups["test"].patches.values)


def test_tile_set_pairs_by_name_and_grid(tmp_path):
    tile_set(tmp_path / "tiles", _labels, n=3)
    (tmp_path / "tiles" / "t01_label.tif").rename(tmp_path / "tiles" / "t09_label.tif")
    section = {"image": str(tmp_path / "tiles" / "*_image.tif"), "labels": str(tmp_path / "tiles" / "*_label.tif")}
    with pytest.raises(
        HsiInputError,
        match=r"image\(s\) without a label file .*t01_image.tif.*label file\(s\) without an image .*t09_label.tif",
    ):
        run("classification", {**section, "patch": 3}, tmp_path / "c.zarr")
    (tmp_path / "tiles" / "t09_label.tif").unlink()
    # tile 1's label raster, but on tile 2's grid
    write_label_tile(tmp_path / "tiles" / "t01_label.tif", _labels(1), like=tmp_path / "tiles" / "t02_image.tif")
    with pytest.raises(
        HsiInputError, match=r"label map .*t01_label.tif and image .*t01_image.tif are on different grids"
    ):
        run("classification", {**section, "patch": 3}, tmp_path / "c.zarr")
    assert not (tmp_path / "c.zarr").exists()


# -- issue 22 item 8 and the hyperspectral cases of item 13 ----------------------------------------
def test_an_envi_glob_matching_header_and_data_reads_each_image_once(tmp_path):
    demo.write_envi(tmp_path / "imgs", count=2, rows=32, cols=32, seed=5)
    assert len(list((tmp_path / "imgs").iterdir())) == 4  # x.hdr and x.img each
    assert [p.endswith(".hdr") for p in expand_images([str(tmp_path / "imgs" / "*")])] == [True, True]
    out = run("mae", {"images": [str(tmp_path / "imgs" / "*")], "tile": 16}, tmp_path / "t.zarr", preset="indian_pines")
    assert sum(open_split(out, s).sizes["sample"] for s in ("train", "val", "test")) == 8  # 2 images x 4 tiles
    assert len(open_split(out, "train").attrs["source_images"]) == 2


def test_envi_interleave_is_validated(tmp_path):
    envi.save_image(str(tmp_path / "x.hdr"), np.zeros((8, 8, 4), np.uint16), interleave="bsq")
    hdr = tmp_path / "x.hdr"
    hdr.write_text(hdr.read_text().replace("interleave = bsq", "interleave = xyz"))
    with pytest.raises(HsiInputError, match=r"ENVI header .*x.hdr: interleave = 'xyz'; expected one of bsq, bil, bip"):
        read_image(str(hdr))


@pytest.fixture
def scene(tmp_path):
    cube, labels, *_ = demo.scene(32, 32, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"img": cube})
    return tmp_path / "img.mat", labels


def classify(image, labels_path, out, **section):
    return run(
        "classification",
        {"image": str(image), "labels": str(labels_path), "patch": 3, **section},
        out,
        preset="indian_pines",
    )


def test_label_255_is_no_class(tmp_path, scene):
    image, labels = scene
    lab = labels.astype(np.uint8)
    lab[:4] = 255
    scipy.io.savemat(tmp_path / "gt.mat", {"gt": lab})
    out = classify(image, tmp_path / "gt.mat", tmp_path / "a.zarr")
    train = open_split(out, "train")
    present = sorted(set(np.unique(lab).tolist()) - {0, 255})
    assert len(train.attrs["class_names"]) == len(present) and train.attrs["label_values"] == present
    assert int(train.label.max()) == len(present)
    # a dataset whose class 255 is real says so
    out = classify(image, tmp_path / "gt.mat", tmp_path / "b.zarr", ignore_labels=[])
    assert open_split(out, "train").attrs["label_values"] == [*present, 255]
    assert open_split(out, "train").attrs["class_names"][-1] == "class 255"


def test_labels_with_gaps_are_remapped_or_refused(tmp_path, scene):
    image, labels = scene
    lab = np.where(labels == 3, 7, labels)  # values 1, 2, 4, 7
    scipy.io.savemat(tmp_path / "gt.mat", {"gt": lab})
    names = [f"n{v}" for v in range(1, 8)]
    out = classify(image, tmp_path / "gt.mat", tmp_path / "a.zarr", class_names=names)
    train = open_split(out, "train")
    values = sorted(set(np.unique(lab).tolist()) - {0})
    assert train.attrs["label_values"] == values and train.attrs["class_names"] == [f"n{v}" for v in values]
    test = open_split(out, "test")
    k = 3
    assert values[int(test.label[k]) - 1] == lab[int(test.row[k]), int(test.col[k])]
    with pytest.raises(HsiInputError, match=r"gt.mat: class values \[1, 2, 4, 7\] are not 1..4 without gaps"):
        classify(image, tmp_path / "gt.mat", tmp_path / "b.zarr", noncontiguous_labels="error")
    with pytest.raises(HsiInputError, match=r"3 class names for the label values \[1, 2, 4, 7\]"):
        classify(image, tmp_path / "gt.mat", tmp_path / "c.zarr", class_names=["a", "b", "c"])
    assert not (tmp_path / "b.zarr").exists() and not (tmp_path / "c.zarr").exists()


def _cli(args, capsys) -> str:
    status = cli.main(["preprocess-hsi", *map(str, args)])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    line = err[err.index("dchag preprocess-hsi: error: ") :]
    assert "\n" not in line and "Traceback" not in err
    return line


@pytest.mark.parametrize(
    "case, match",
    [
        ("nan", r"label map .*gt.mat: 1 NaN/inf value\(s\), first at row 3, col 4 \(nan\); expected integer"),
        ("negative", r"label map .*gt.mat: 2 negative value\(s\), first at row 1, col 1 \(-1\.0\)"),
        ("fraction", r"label map .*gt.mat: 1 non-integer value\(s\), first at row 2, col 2 \(1\.5\)"),
    ],
)
def test_bad_label_values_are_one_line_errors(tmp_path, scene, capsys, case, match):
    image, labels = scene
    lab = labels.astype(np.float64)
    if case == "nan":
        lab[3, 4] = np.nan
    elif case == "negative":
        lab[1, 1] = lab[5, 5] = -1
    else:
        lab[2, 2] = 1.5
    scipy.io.savemat(tmp_path / "gt.mat", {"gt": lab})
    line = _cli([image, "--labels", tmp_path / "gt.mat", "--patch", "3", "--output", tmp_path / "o.zarr"], capsys)
    import re

    assert re.search(match, line), line
    assert not (tmp_path / "o.zarr").exists()


def test_empty_mat_files_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "empty.mat").write_bytes(b"")
    line = _cli([tmp_path / "empty.mat", "--output", tmp_path / "o.zarr"], capsys)
    assert "empty.mat is empty (0 bytes)" in line
    scipy.io.savemat(tmp_path / "none.mat", {})
    line = _cli([tmp_path / "none.mat", "--output", tmp_path / "o.zarr"], capsys)
    assert "none.mat holds no variable; expected a 3-D numeric image" in line


def test_wavelength_count_must_match_the_bands(tmp_path, capsys):
    cube = np.ones((8, 8, 20), np.uint16)
    envi.save_image(str(tmp_path / "x.hdr"), cube, metadata={"wavelength": list(range(400, 419))})
    line = _cli([tmp_path / "x.hdr", "--tile", "4", "--output", tmp_path / "o.zarr"], capsys)
    assert "ENVI header" in line and "x.hdr: 19 wavelength values for 20 bands; expected one per band" in line
    tif = write_enmap(tmp_path / "enmap")
    xml = next((tmp_path / "enmap").glob("*METADATA.XML"))
    text = xml.read_text()
    xml.write_text(
        text[: text.index('      <bandID number="224">')] + "    </bandCharacterisation>\n  </specific>\n</level_X>\n"
    )
    line = _cli([tif, "--tile", "8", "--output", tmp_path / "o.zarr"], capsys)
    assert "METADATA.XML describes 223 bands; its image has 224" in line


def test_product_layout_errors_name_what_was_expected(tmp_path):
    import h5py
    import netCDF4

    with h5py.File(tmp_path / "other.he5", "w") as f:
        f.create_dataset("HDFEOS/SWATHS/OTHER/Data Fields/Cube", data=np.zeros((2, 2, 2)))
    with pytest.raises(HsiInputError, match=r"other.he5: expected one PRISMA hyperspectral swath"):
        read_image(str(tmp_path / "other.he5"), detector_overlap="swir")
    with netCDF4.Dataset(tmp_path / "other.nc", "w") as nc:
        nc.createDimension("x", 2)
        nc.createVariable("radiance", "f4", ("x",))
    with pytest.raises(HsiInputError, match=r"other.nc: no variable 'reflectance'; expected EMIT L2A's reflectance"):
        read_image(str(tmp_path / "other.nc"))


# -- through the pipeline: snakemake --configfile ------------------------------------------------
PIPELINE_CASES = ["enmap", "prisma", "emit", "tiles"]


@pytest.mark.parametrize("source", PIPELINE_CASES)
def test_products_through_snakemake(tmp_path, source):
    """A dataset-only config per source, run by `snakemake --configfile`: the store has the
    product's bands, wavelengths and missing-pixel handling."""
    from support.commands import snakemake, workdir

    cwd = tmp_path / "w"
    cwd.mkdir()
    workdir(cwd, [])
    data = cwd / "data"
    if source == "enmap":
        write_enmap(data)
        hsi = {"mae": {"images": ["data/*-SPECTRAL_IMAGE.TIF"], "tile": 8}}
    elif source == "prisma":
        write_prisma(data)
        hsi = {"mae": {"images": ["data/*.he5"], "tile": 8}}
    elif source == "emit":
        write_emit(data)
        hsi = {"mae": {"images": ["data/EMIT_L2A_RFL_*.nc"], "tile": 6}}
    else:
        tile_set(data, _labels, n=3)
        hsi = {"classification": {"image": "data/*_image.tif", "labels": "data/*_label.tif", "patch": 3}}
    (cwd / "mine.yaml").write_text(yaml.safe_dump({"name": source, "hsi": hsi}))
    proc = snakemake(cwd, "--cores", "1", "--configfile", "mine.yaml")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    task = "mae" if "mae" in hsi else "classification"
    train = open_split(cwd / "results" / source / "hsi" / f"{task}.zarr", "train")
    bands = {"enmap": 218, "prisma": 234 - 10, "emit": 244, "tiles": 12}[source]
    assert train.sizes["band"] == bands and np.isfinite(train.wavelength.values).all()
    assert np.isfinite(train[{"mae": "tiles", "classification": "patches"}[task]].values).all()
    if task == "mae":
        assert train.attrs["dropped_tiles_with_missing_pixels"] > 0
    else:
        assert train.attrs["label_values"] == [1, 2, 5]


def test_every_source_has_a_shipped_config():
    """config/ holds one config per product source (dry-run by tests/integration/test_configs.py)."""
    kinds = set()
    for path in (REPO / "config").glob("*.yaml"):
        hsi = yaml.safe_load(path.read_text()).get("hsi") or {}
        for p in hsi.get("mae", {}).get("images", []) + [hsi.get("classification", {}).get("image", "")]:
            kinds.add(p.rsplit(".", 1)[-1].lower())
    assert {"tif", "he5", "nc", "mat", "hdr"} <= kinds, kinds


def test_an_unpaired_tile_stops_the_plan(tmp_path):
    """`snakemake -n` already names the image tile that has no label tile."""
    from support.commands import snakemake, workdir

    cwd = tmp_path / "w"
    cwd.mkdir()
    workdir(cwd, [])
    tile_set(cwd / "data", _labels, n=2)
    (cwd / "data" / "t01_label.tif").unlink()
    hsi = {"classification": {"image": "data/*_image.tif", "labels": "data/*_label.tif", "patch": 3}}
    (cwd / "mine.yaml").write_text(yaml.safe_dump({"name": "tiles", "hsi": hsi}))
    proc = snakemake(cwd, "-n", "--cores", "1", "--configfile", "mine.yaml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "image(s) without a label file matching 'data/*_label.tif': data/t01_image.tif" in out, out


def test_the_docs_hsi_keys_are_the_schemas():
    """The table of hsi keys in docs/hyperspectral.md lists every key of the schema's hsi section, with the
    schema's default (a row may name two keys: `classification.image`, `.labels`)."""
    import re

    from dchag.config import schema, schema_default

    text = (REPO / "docs" / "hyperspectral.md").read_text()
    table = text[text.index("The `hsi` keys") :]
    table = table[table.index("| key |") :]
    table = table[: table.index("\n\n")]
    listed = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        keys = re.findall(r"`([\w.]+)`", cells[0])
        prefix = keys[0].rsplit(".", 1)[0] + "." if "." in keys[0] else ""
        keys = [keys[0]] + [prefix + k.lstrip(".") for k in keys[1:]]
        listed += keys
        for key in keys:
            if cells[1] != "—":
                assert yaml.safe_load(cells[1].strip("`")) == schema_default(f"hsi.{key}"), key
    hsi = schema()["$defs"]["hsi"]["properties"]
    wanted = [k for k in hsi if k not in ("classification", "mae")]
    wanted += [f"{t}.{k}" for t in ("classification", "mae") for k in hsi[t]["properties"]]
    assert sorted(listed) == sorted(wanted)
