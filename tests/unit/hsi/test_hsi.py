"""Hyperspectral preprocessing on files written by the real writers (spectral's ENVI writer,
scipy.io.savemat, h5py for MATLAB v7.3)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import spectral.io.envi as envi
import xarray as xr
from support.hsi import classify, make_tiles, open_split

from dchag.config import ConfigError
from dchag.hsi import demo
from dchag.hsi.bands import SENSORS, BandError, select_bands
from dchag.hsi.readers import HsiInputError, read_image, read_labels
from dchag.hsi.splits import disjoint_split, disjoint_split_placing_classes, stratified_split


@pytest.fixture(scope="module")
def scene():
    cube, labels, centres, fwhm = demo.scene(40, 40, seed=3)
    return cube, labels, centres, fwhm


@pytest.fixture
def mat_files(tmp_path, scene):
    cube, labels, *_ = scene
    scipy.io.savemat(tmp_path / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"indian_pines_gt": labels})
    return tmp_path / "img.mat", tmp_path / "gt.mat"


def write_mat73(path, name, array):
    """A MATLAB v7.3 file: HDF5 with MATLAB's 512-byte header, arrays stored column-major."""
    import h5py

    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset(name, data=np.ascontiguousarray(array.T))
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    with open(path, "r+b") as f:
        f.write(header.ljust(116, b" ") + b"\0" * 8 + b"\x00\x02" + b"IM")


# -- readers ------------------------------------------------------------------------------------
def test_readers_agree_across_formats(tmp_path, scene, mat_files):
    cube, labels, centres, fwhm = scene
    envi.save_image(
        str(tmp_path / "img.hdr"),
        cube,
        dtype=np.uint16,
        metadata={"wavelength": list(centres / 1000), "wavelength units": "micrometers"},
    )
    write_mat73(tmp_path / "img73.mat", "indian_pines", cube)
    bands = np.array([0, 50, 219])
    from_envi = read_image(str(tmp_path / "img.hdr"))
    assert from_envi.shape == (40, 40, 220)
    assert np.allclose(from_envi.wavelengths, centres, atol=1e-3)  # micrometres converted to nm
    for img in (from_envi, read_image(str(mat_files[0])), read_image(str(tmp_path / "img73.mat"), "indian_pines")):
        assert np.array_equal(img.read(bands), cube[:, :, bands].astype(np.float32)), img.path
    assert np.array_equal(read_labels(str(mat_files[1])).values, labels)


def test_envi_header_and_data_disagree(tmp_path, scene):
    cube = scene[0]
    envi.save_image(str(tmp_path / "img.hdr"), cube, dtype=np.uint16)
    data = tmp_path / "img.img"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(HsiInputError, match=r"img.hdr and data .*img.img disagree.*40x40x220"):
        read_image(str(tmp_path / "img.hdr"))


# -- band bookkeeping ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "preset, bands, kept, dropped0",
    [
        ("indian_pines", 220, 200, [*range(103, 108), *range(149, 163), 219]),
        ("salinas", 224, 204, [*range(107, 112), *range(153, 167), 223]),
        ("pavia_university", 103, 103, []),
    ],
)
def test_presets_give_the_published_bands(preset, bands, kept, dropped0):
    keep = select_bands(bands, preset=preset).keep
    assert keep.size == kept
    assert sorted(set(range(bands)) - set(keep.tolist())) == dropped0


def test_bbl_wins_and_explicit_lists_and_wavelengths():
    bbl = np.ones(220)
    bbl[[0, 5]] = 0
    sel = select_bands(220, bbl=bbl, preset="indian_pines")
    assert sel.keep.size == 218 and "bbl" in sel.how
    keep = select_bands(10, drop_bands="1-3, 10").keep
    assert keep.tolist() == [3, 4, 5, 6, 7, 8]
    wl = np.linspace(380, 1000, 32)
    sel = select_bands(32, wavelengths=wl, preset="vnir_400_900")
    assert wl[sel.keep].min() >= 400 and wl[sel.keep].max() <= 900
    assert np.array_equal(sel.wavelengths, wl[sel.keep]) and sel.wavelength_source == "the file's header"
    keep = select_bands(32, wavelengths=wl, drop_wavelengths=[[700, 800]]).keep
    assert not np.any((wl[keep] >= 700) & (wl[keep] <= 800))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_bands=10, drop_bands="9-12"), r"9-12 is outside the image's bands 1..10"),
        (dict(num_bands=10, drop_bands="1-10"), "removes every band"),
        (dict(num_bands=220, preset="indain_pines"), "unknown band preset 'indain_pines'"),
        (
            dict(num_bands=199, preset="indian_pines"),
            r"preset 'indian_pines' is for 220 bands \(the sensor's\) or 200 .* the image has 199",
        ),
    ],
)
def test_band_errors(kw, match):
    with pytest.raises(BandError, match=match):
        select_bands(**kw)


# -- splits -------------------------------------------------------------------------------------
def _windows(centres, cols, patch, shape):
    h = patch // 2
    cells = set()
    for r, c in zip(*np.divmod(centres, cols)):
        for dr in range(-h, h + 1):
            for dc in range(-h, h + 1):
                rr, cc = r + dr, c + dc
                # reflect padding reads mirrored pixels, which lie inside the window anyway
                rr = -rr if rr < 0 else (2 * (shape[0] - 1) - rr if rr >= shape[0] else rr)
                cc = -cc if cc < 0 else (2 * (shape[1] - 1) - cc if cc >= shape[1] else cc)
                cells.add((rr, cc))
    return cells


def test_disjoint_split_windows_never_overlap(scene):
    labels = scene[1]
    splits, dropped = disjoint_split(labels, (0.4, 0.2, 0.4), seed=1, block=10, patch=5)
    wins = {s: _windows(v, labels.shape[1], 5, labels.shape) for s, v in splits.items()}
    assert all(len(v) for v in splits.values())
    assert not wins["train"] & wins["test"] and not wins["train"] & wins["val"] and not wins["val"] & wins["test"]
    assert dropped > 0  # centres near block borders of another split are given up
    # The random pixel split, by contrast, leaks: that is why the disjoint one exists.
    strat = stratified_split(labels, (0.4, 0.2, 0.4), seed=1)
    assert _windows(strat["train"], 40, 5, labels.shape) & _windows(strat["test"], 40, 5, labels.shape)


def test_stratified_split_has_every_class_in_training(scene):
    labels = scene[1]
    s = stratified_split(labels, (0.1, 0.1, 0.8), seed=0)
    flat = labels.ravel()
    for cls in np.unique(flat[flat > 0]):
        n = (flat == cls).sum()
        assert (flat[s["train"]] == cls).sum() == max(1, round(0.1 * n))
    # every labelled pixel in exactly one split, none unlabelled
    together = np.concatenate(list(s.values()))
    assert together.size == np.unique(together).size == (flat > 0).sum()
    assert set(together.tolist()) == set(np.flatnonzero(flat > 0).tolist())
    # and the same seed gives the same split, another seed another
    assert all(
        np.array_equal(a, b) for a, b in zip(s.values(), stratified_split(labels, (0.1, 0.1, 0.8), seed=0).values())
    )
    assert not np.array_equal(s["train"], stratified_split(labels, (0.1, 0.1, 0.8), seed=1)["train"])


# -- stores -------------------------------------------------------------------------------------
def test_classification_store(tmp_path, scene, mat_files):
    cube, labels, *_ = scene
    out = classify(
        mat_files[0], mat_files[1], tmp_path / "c.zarr", {"preset": "indian_pines", "band_chunk": 50}, patch=5
    )
    train, test = open_split(out, "train"), open_split(out, "test")
    assert train.patches.shape[1:] == (200, 5, 5) and train.patches.encoding["chunks"][1] == 50
    assert train.attrs["kept_bands_1based"][103] == 109  # 104-108 removed
    # Normalised with the training pixels' statistics: the training centre pixels have mean 0, std 1.
    centres = train.patches.values[:, :, 2, 2]
    assert np.allclose(centres.mean(0), 0, atol=1e-4) and np.allclose(centres.std(0), 1, atol=1e-3)
    # A patch is the normalised neighbourhood of its labelled pixel, in the original bands.
    i = 7
    r, c = int(test.row[i]), int(test.col[i])
    raw = cube[r, c, test.band.values].astype(np.float64)
    assert np.allclose(test.patches.values[i, :, 2, 2], (raw - test["mean"].values) / test["std"].values, atol=1e-4)
    assert int(test.label[i]) == labels[r, c] > 0


def test_tiles_store_from_envi_collection(tmp_path):
    paths = demo.write_envi(tmp_path / "imgs", count=2, rows=32, cols=32, seed=5)
    out = make_tiles(
        [tmp_path / "imgs" / "*.hdr"],
        tmp_path / "t.zarr",
        {"preset": "indian_pines"},
        tile=16,
        fractions=[0.5, 0.25, 0.25],
    )
    sizes = {s: open_split(out, s).sizes["sample"] for s in ("train", "val", "test")}
    assert sum(sizes.values()) == 8 and sizes["train"] == 4
    train = open_split(out, "train")
    assert np.isfinite(train.wavelength.values).all() and train.tiles.shape[1:] == (200, 16, 16)
    assert len(paths) == 2
    # the training dataset over it: a rank's band block, read from memory or from Zarr alike
    from dchag.train.data import SampleDataset

    zarr_read = SampleDataset(out, "train", "tiles", list(range(50, 100)), 200)
    cached = SampleDataset(out, "train", "tiles", list(range(50, 100)), 200, cache_bytes=2**20)
    assert zarr_read.x_mem is None and cached.x_mem is not None
    expected = train.tiles.values[:, 50:100]
    for ds in (zarr_read, cached):
        batch = ds.__getitems__([3, 0, 0])
        assert [np.array_equal(b[0].numpy(), expected[i]) for b, i in zip(batch, (3, 0, 0))] == [True] * 3
        assert np.array_equal(ds[2][0].numpy(), expected[2])


@pytest.mark.parametrize("case", ["labels shape", "nan", "patch too large", "unknown preset", "band out of range"])
def test_bad_inputs_leave_nothing(tmp_path, scene, mat_files, case):
    cube, labels, *_ = scene
    img, gt = str(mat_files[0]), str(mat_files[1])
    opts = {"preset": "indian_pines"}
    kw = dict(patch=5)
    exc, match = HsiInputError, None
    if case == "labels shape":
        scipy.io.savemat(tmp_path / "gt2.mat", {"gt": labels[:30]})
        gt, match = str(tmp_path / "gt2.mat"), r"label map .*gt2.mat is 30x40, the image .* is 40x40"
    elif case == "nan":
        bad = cube.astype(np.float32)
        bad[3, 4, 10] = np.nan
        bad[5, 6, 20] = np.inf
        scipy.io.savemat(tmp_path / "nan.mat", {"x": bad})
        img, match = str(tmp_path / "nan.mat"), r"2 NaN/inf pixel value\(s\), first at row 3, col 4"
    elif case == "patch too large":
        kw, match = dict(patch=41), "patch 41x41 is larger than the image"
    elif case == "unknown preset":  # the schema refuses it before any file is read
        opts, exc, match = {"preset": "nope"}, ConfigError, "key 'hsi.preset': 'nope' is not one of"
    else:
        opts, exc, match = {"drop_bands": "219-221"}, BandError, "outside the image's bands 1..220"
    with pytest.raises(exc, match=match):
        classify(img, gt, tmp_path / "o.zarr", opts, **kw)
    assert not (tmp_path / "o.zarr").exists() and not list(tmp_path.glob(".o.zarr*"))


def test_nan_fill_reports_the_count(tmp_path, scene, mat_files):
    bad = scene[0].astype(np.float32)
    bad[3, 4, 10] = np.nan
    scipy.io.savemat(tmp_path / "nan.mat", {"x": bad})
    out = classify(
        tmp_path / "nan.mat",
        mat_files[1],
        tmp_path / "o.zarr",
        {"preset": "indian_pines", "nan_policy": "fill"},
        patch=5,
    )
    train = open_split(out, "train")
    assert train.attrs["nan_filled"] == 1 and np.isfinite(train.patches.values).all()


# -- the demo scene -----------------------------------------------------------------------------
def test_demo_scene_is_grounded_in_real_bands_and_spectra(scene):
    cube, labels, centres, fwhm = scene
    assert cube.shape[2] == 220 and centres[0] == pytest.approx(400.02, abs=0.01)
    water = np.zeros(220, bool)
    water[[*range(103, 108), *range(149, 163), 219]] = True
    assert cube[..., water].mean() < 0.1 * cube[..., ~water].mean()  # absorption bands are mostly noise
    assert set(np.unique(labels)) <= {0, 1, 2, 3, 4} and (labels > 0).mean() > 0.5
    em = demo.endmembers(centres, fwhm)
    veg = em[2]  # red maple: the red edge between ~680 and ~780 nm
    assert veg[np.argmin(abs(centres - 800))] > 2 * veg[np.argmin(abs(centres - 670))]


# -- the published files as people have them ------------------------------------------------------
AVIRIS_IP = np.loadtxt(SENSORS / "aviris_indian_pines_1992.txt")[:, 0]
IP_KEPT = [*range(1, 104), *range(109, 150), *range(164, 220)]  # AVIRIS numbering, published


def test_corrected_indian_pines_keeps_every_band_numbered_as_the_sensor(tmp_path):
    """Indian_pines_corrected.mat (key indian_pines_corrected, 145x145x200) with the config's
    preset: nothing more is removed, bands are recorded as AVIRIS 1..220 numbers, wavelengths
    are the 1992 flight's band centres; the uncorrected 220-band file gives the same bands."""
    rng = np.random.default_rng(0)
    full = rng.integers(1000, 5000, (145, 145, 220)).astype(np.uint16)
    labels = np.zeros((145, 145), np.uint8)
    labels[10:60, 10:60], labels[80:140, 20:70], labels[20:130, 90:140] = 1, 2, 3
    scipy.io.savemat(
        tmp_path / "Indian_pines_corrected.mat", {"indian_pines_corrected": full[:, :, np.array(IP_KEPT) - 1]}
    )
    scipy.io.savemat(tmp_path / "Indian_pines.mat", {"indian_pines": full})
    scipy.io.savemat(tmp_path / "Indian_pines_gt.mat", {"indian_pines_gt": labels})
    stores = {}
    for name, key in (("Indian_pines_corrected", "indian_pines_corrected"), ("Indian_pines", "indian_pines")):
        out = classify(
            tmp_path / f"{name}.mat",
            tmp_path / "Indian_pines_gt.mat",
            tmp_path / f"{name}.zarr",
            {"preset": "indian_pines"},
            image_key=key,
            labels_key="indian_pines_gt",
            patch=5,
        )
        stores[name] = open_split(out, "train")
    corrected, full_store = stores["Indian_pines_corrected"], stores["Indian_pines"]
    assert corrected.attrs["kept_bands_1based"] == IP_KEPT == full_store.attrs["kept_bands_1based"]
    assert corrected.sensor_band.values.tolist() == IP_KEPT
    assert corrected.band.values.tolist() == list(range(200))  # the file's own band indices
    assert np.allclose(corrected.wavelength.values, AVIRIS_IP[np.array(IP_KEPT) - 1])
    assert corrected.wavelength.values[0] == pytest.approx(400.02, abs=0.01)
    assert (
        "92AV3C" in corrected.attrs["wavelength_source"]
        and "already has the water-absorption" in corrected.attrs["band_selection"]
    )
    assert np.array_equal(corrected.patches.values, full_store.patches.values)


@pytest.mark.parametrize(
    "preset, bands, first_nm, last_nm", [("salinas", 204, 400.0, 2500.0), ("pavia_university", 103, 430.0, 860.0)]
)
def test_presets_fill_wavelengths_for_mat_files(preset, bands, first_nm, last_nm):
    sel = select_bands(bands, preset=preset)
    assert sel.wavelengths is not None and np.all(np.diff(sel.wavelengths) > 0) and sel.wavelength_source
    assert sel.wavelengths[0] == pytest.approx(first_nm) and sel.wavelengths[-1] <= last_nm
    if preset == "salinas":  # the corrected file: AVIRIS bands 1..224 less 108-112, 154-167, 224
        assert sel.sensor_bands[107] == 113 and sel.sensor_bands[-1] == 223


def test_ground_truth_under_another_name(tmp_path, caplog):
    """Copies of PaviaU_gt.mat that call the variable hyperimg_gt: the only 2-D variable is used
    and the log says so; with two candidates the error lists them."""
    labels = np.zeros((30, 20), np.uint8)
    labels[2:10, 2:10] = 1
    scipy.io.savemat(tmp_path / "PaviaU_gt.mat", {"hyperimg_gt": labels})
    with caplog.at_level("WARNING"):
        got = read_labels(str(tmp_path / "PaviaU_gt.mat"), "paviaU_gt").values
    assert np.array_equal(got, labels) and "hyperimg_gt" in caplog.text and "paviaU_gt" in caplog.text
    scipy.io.savemat(tmp_path / "two.mat", {"a_gt": labels, "b_gt": labels})
    with pytest.raises(
        HsiInputError, match=r"two.mat has no 2-D variable 'paviaU_gt'; its 2-D variables are \['a_gt', 'b_gt'\]"
    ):
        read_labels(str(tmp_path / "two.mat"), "paviaU_gt")


def test_truncated_mat_file_is_named_as_such(tmp_path, mat_files):
    data = mat_files[0].read_bytes()
    cut = tmp_path / "cut.mat"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(HsiInputError, match=r"cut.mat \(\d+ bytes\) is truncated or corrupt"):
        read_image(str(cut))


def field_scene(rng) -> np.ndarray:
    """A 145x145 label map of fields, as agricultural scenes are: large and small rectangles,
    one class in a single small field."""
    labels = np.zeros((145, 145), np.int64)
    k = 1
    for r0 in range(0, 140, 28):
        for c0 in range(0, 140, 35):
            h, w = rng.integers(18, 27), rng.integers(20, 34)
            labels[r0 : r0 + h, c0 : c0 + w] = k % 9 + 1
            k += 1
    labels[100:105, 60:64] = 10  # 20 pixels in one place, like Oats
    return labels


def test_disjoint_split_keeps_every_class_that_fits(tmp_path):
    """Blocks placed per class: every class with room for a whole window in three places is in
    every split, windows never overlap, and counts per class and split are stored; a class that
    cannot be placed stops the run unless the config says warn."""
    rng = np.random.default_rng(4)
    labels = field_scene(rng)
    for seed in range(2):
        if seed == 0:  # the default 2 x patch blocks are too coarse for this scene: one class misses a split
            coarse, _ = disjoint_split(labels, (0.1, 0.1, 0.8), seed=seed, block=22, patch=11)
            assert min(np.bincount(labels.ravel()[v], minlength=11)[1:10].min() for v in coarse.values()) == 0
        splits, _, block = disjoint_split_placing_classes(labels, (0.1, 0.1, 0.8), seed=seed, patch=11)
        assert 11 <= block < 22
        counts = {s: np.bincount(labels.ravel()[v], minlength=11)[1:] for s, v in splits.items()}
        for k in range(9):
            assert all(counts[s][k] > 0 for s in counts), (seed, k, counts)
        wins = {s: _windows(v, 145, 11, labels.shape) for s, v in splits.items()}
        assert not wins["train"] & wins["test"] and not wins["train"] & wins["val"] and not wins["val"] & wins["test"]
    cube = rng.normal(size=(145, 145, 103)).astype(np.float32)
    scipy.io.savemat(tmp_path / "PaviaU.mat", {"paviaU": cube})
    scipy.io.savemat(tmp_path / "PaviaU_gt.mat", {"paviaU_gt": labels})
    names = [f"c{k}" for k in range(1, 11)]
    common = dict(labels_key="paviaU_gt", patch=11, split="disjoint", class_names=names)
    pavia = {"preset": "pavia_university"}
    with pytest.raises(
        HsiInputError, match=r"1 class\(es\) cannot be placed in every split: c10 \(20 pixels\): none in"
    ):
        classify(tmp_path / "PaviaU.mat", tmp_path / "PaviaU_gt.mat", tmp_path / "e.zarr", pavia, **common)
    assert not (tmp_path / "e.zarr").exists()
    out = classify(
        tmp_path / "PaviaU.mat", tmp_path / "PaviaU_gt.mat", tmp_path / "w.zarr", pavia, missing_class="warn", **common
    )
    import json

    train = open_split(out, "train")
    stored = json.loads(train.attrs["class_counts"])
    assert all(stored[s][k] > 0 for s in ("train", "val", "test") for k in range(9))
    assert stored["train"] == np.bincount(train.label.values, minlength=11)[1:].tolist()
    assert train.attrs["classes_missing_from_a_split"][0].startswith("c10")
    assert np.isfinite(train.wavelength.values).all()


def test_stores_open_the_default_way_without_warnings(tmp_path, mat_files):
    import warnings

    out = classify(mat_files[0], mat_files[1], tmp_path / "c.zarr", {"preset": "indian_pines"}, patch=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xr.open_zarr(out, group="train").sizes["sample"] > 0
