"""Hyperspectral preprocessing, the steps in order: open the images and choose their bands
(``readers``, ``products``, ``bands``), flag missing pixels and apply the NaN policy
(``normalise.read_checked``), split (``splits``), fit the per-band standardisation on training
pixels only (``normalise.Stats``, streamed image by image), cut patches around labelled
pixels or tiles (``samples``) and write one Zarr v3 store with a group per split (``write``).
Written atomically."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from .. import provenance
from ..store import atomic_path
from ..vocabulary import Task
from . import labels as labelling
from .bands import BandSelection, select_bands
from .image import HsiInputError, HyperspectralImage
from .normalise import Stats, describe, normalise, read_checked
from .options import BandOptions, ClassificationSettings, TileSettings, band_options
from .readers import read_image, read_labels
from .samples import complete_tiles, complete_windows, extract_patches, tile_grid
from .sources import expand_images, has_wildcard, tile_pairs
from .splits import (
    SPLITS,
    class_counts,
    disjoint_split_placing_classes,
    format_counts,
    fractions_of,
    missing_classes,
    stratified_split,
    tile_split,
)
from .write import SplitWriter, band_attrs, band_coords

log = logging.getLogger(__name__)
CACHE_BYTES = 1 << 30  # cubes up to this much in total stay in memory between passes; others are read again


class _Cubes:
    """The checked cubes of a list of images: kept in memory while they fit, read again
    otherwise (the first always stays: one scene is read once)."""

    def __init__(self, images: list[HyperspectralImage], keep: np.ndarray, nan_policy: str):
        self.images, self.keep, self.nan_policy = images, keep, nan_policy
        self.kept: dict[int, np.ndarray] = {}
        self.bytes = 0

    def first_read(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        cube, missing, filled = read_checked(self.images[i], self.keep, self.nan_policy)
        if i == 0 or self.bytes + cube.nbytes <= CACHE_BYTES:
            self.kept[i] = cube
            self.bytes += cube.nbytes
        return cube, missing, filled

    def get(self, i: int) -> np.ndarray:
        if i in self.kept:
            return self.kept[i]
        return read_checked(self.images[i], self.keep, self.nan_policy)[0]


def open_images(paths: list[str], opts: BandOptions) -> tuple[list[HyperspectralImage], BandSelection]:
    """The images and the bands kept of them: the same band count in every image; a band is
    bad if any image's bad-band list says so; the first image's wavelengths stand for all."""
    images = [read_image(p, opts.key, opts.detector_overlap, opts.nodata) for p in paths]
    first = images[0]
    for img in images[1:]:
        if img.shape[2] != first.shape[2]:
            raise HsiInputError(f"{img.path} has {img.shape[2]} bands, {first.path} has {first.shape[2]}")
        if img.wavelengths is not None and first.wavelengths is not None:
            shift = float(np.abs(img.wavelengths - first.wavelengths).max())
            if shift > 1.0:
                log.warning("%s: band centres differ from %s's by up to %.2f nm; the store keeps the first's",
                            img.path, first.path, shift)  # fmt: skip
    lists = [img.bbl > 0 for img in images if img.bbl is not None]
    bbl = np.logical_and.reduce(lists).astype(float) if lists else None
    bbl_source = first.meta.get("bbl_source") or next(
        (img.meta.get("bbl_source") for img in images if img.bbl is not None), "ENVI bbl"
    )
    if len(lists) > 1:
        bbl_source += f" (bad in any of {len(lists)} images)"
    sel = select_bands(
        first.shape[2],
        first.wavelengths,
        bbl,
        opts.preset,
        opts.drop_bands,
        opts.drop_wavelengths,
        first.path,
        bbl_source=bbl_source,
        wavelength_source=first.meta.get("wavelength_source") or "the file's header",
    )
    return images, sel


def _source_attrs(images: list[HyperspectralImage], missing: int) -> dict:
    first = images[0].meta
    out = {
        "source_product": first.get("product", ""),
        "value_scale": first.get("value_scale", "values as stored"),
        "missing_value": first.get("nodata") if first.get("nodata") is not None else "none declared",
        "missing_pixels": int(missing),
        "georeference": json.dumps([img.meta.get("georeference") for img in images]),
    }
    for key in ("band_order", "geometry", "missing_rule"):
        if key in first:
            out[key] = first[key]
    return out


def _kept_fwhm(images: list[HyperspectralImage], sel: BandSelection) -> np.ndarray | None:
    fwhm = images[0].fwhm
    return None if fwhm is None else np.asarray(fwhm, float)[sel.keep]


def _same_grid(img: HyperspectralImage, lm, labels: str) -> None:
    a, b = img.meta.get("georeference") or {}, lm.georeference or {}
    if "geotransform" in a and "geotransform" in b:
        if a.get("crs") != b.get("crs") or not np.allclose(a["geotransform"], b["geotransform"]):
            raise HsiInputError(
                f"label map {labels} and image {img.path} are on different grids: {b.get('crs')} "
                f"{b['geotransform']} vs {a.get('crs')} {a['geotransform']}; expected the label raster of that image"
            )


# -- classification ----------------------------------------------------------------------------
def _label_map(c: ClassificationSettings, img: HyperspectralImage, path: str) -> np.ndarray:
    """The label map of ``img`` read from ``path``, checked against the image and the patch."""
    lm = read_labels(path, c.labels_key)
    if lm.values.shape != img.shape[:2]:
        raise HsiInputError(
            f"label map {path} is {lm.values.shape[0]}x{lm.values.shape[1]}, "
            f"the image {img.path} is {img.shape[0]}x{img.shape[1]}"
        )
    _same_grid(img, lm, path)
    if c.patch > min(img.shape[:2]):
        raise HsiInputError(
            f"patch {c.patch}x{c.patch} is larger than the image {img.path} ({img.shape[0]}x{img.shape[1]})"
        )
    return labelling.checked(lm)


def _split(c: ClassificationSettings, maps: list[np.ndarray], flat: np.ndarray, tiled: bool):
    """(indices of the samples per split, centres dropped, the disjoint block) by the config's method."""
    if not tiled and c.split == "disjoint":
        return disjoint_split_placing_classes(maps[0], c.fractions, c.seed, c.patch, c.block)
    if c.split == "disjoint":
        return tile_split(maps, c.fractions, c.seed), 0, c.block
    if c.split == "stratified":
        return stratified_split(flat, c.fractions, c.seed), 0, c.block
    raise HsiInputError(f"split {c.split!r}: expected stratified or disjoint")


def _check_placed(c: ClassificationSettings, counts, names, flat, tiled: bool, block) -> list[str]:
    """The classes missing from a split: an error, or a warning with hsi.classification.missing_class: warn."""
    absent = missing_classes(counts, c.fractions, names, flat)
    if absent:
        hint = ""
        if c.split == "disjoint":
            hint = (
                "more tiles place more classes; "
                if tiled
                else f"a smaller patch (now {c.patch}; block {block} px) places more classes; "
            )
        message = (
            f"{c.labels}: {len(absent)} class(es) cannot be placed in every split: "
            + "; ".join(absent)
            + f". {hint}set hsi.classification.missing_class: warn to go on without them"
        )
        if c.missing_class == "error":
            raise HsiInputError(message)
        log.warning("%s", message)
    return absent


def _unlabel_incomplete(c: ClassificationSettings, cubes: _Cubes, raw_maps: list[np.ndarray]) -> tuple[int, int, int]:
    """Pass 1: the missing pixels of each image; a labelled pixel whose window holds one is no
    patch centre (set to 0 in ``raw_maps``). Returns the pixels filled, missing and unlabelled."""
    filled = missing_total = dropped = 0
    for i, labels in enumerate(raw_maps):
        _, missing, n = cubes.first_read(i)
        filled += n
        missing_total += int(missing.sum())
        incomplete = (labels > 0) & ~complete_windows(missing, c.patch)
        dropped += int(incomplete.sum())
        labels[incomplete] = 0
    if dropped:
        log.warning("%s: %d labelled pixels have a missing pixel in their window; not used", c.labels, dropped)
    return filled, missing_total, dropped


def _label_attrs(coding, counts, absent: list[str]) -> dict:
    """What a patch store says of its labels: the classes, the ground truth's values, the
    samples per class and split."""
    return {
        "class_names": coding.names,
        "label_values": coding.values,
        "ignored_label_values": json.dumps(coding.ignored),
        "class_counts": json.dumps(counts),
        "classes_missing_from_a_split": absent,
        "label_note": "label = class 1..K; class k has the ground truth's value label_values[k-1]; 0 "
        "(unlabelled), the label file's nodata value and ignored_label_values are never samples",
    }


def _check_patching(c: ClassificationSettings, tiled: bool) -> None:
    if c.patch < 1 or c.patch % 2 == 0:
        raise HsiInputError(f"patch size {c.patch} must be odd, so the patch is centred on its pixel")
    if tiled and c.block is not None:
        raise HsiInputError(
            f"hsi.classification.block {c.block}: a tile set's disjoint split places whole tiles; leave block unset"
        )


def preprocess_classification(
    c: ClassificationSettings, opts: BandOptions, output: str | Path, config: dict | None = None
) -> Path:
    """Patches centred on labelled pixels of one scene, or of every tile of a tile set."""
    tiled = has_wildcard(c.image)
    _check_patching(c, tiled)
    pairs = tile_pairs(c.image, c.labels)
    images, sel = open_images([p for p, _ in pairs], opts)
    nb = sel.keep.size
    raw_maps = [_label_map(c, img, lpath) for img, (_, lpath) in zip(images, pairs)]
    cubes = _Cubes(images, sel.keep, opts.nan_policy)
    filled, missing_total, dropped_missing = _unlabel_incomplete(c, cubes, raw_maps)
    # The classes: the values left with a usable pixel (no class without samples).
    coding = labelling.coding(raw_maps, c.labels, c.ignore_labels, c.noncontiguous_labels, c.class_names)
    if coding.ignored:
        log.info("%s: label values %s taken as unlabelled (hsi.classification.ignore_labels)", c.labels, coding.ignored)
    maps = [coding.apply(m) for m in raw_maps]
    n_classes, names = len(coding.values), coding.names
    flat = np.concatenate([m.ravel() for m in maps])
    splits, dropped, block = _split(c, maps, flat, tiled)
    counts = class_counts(flat, splits, n_classes)
    log.info("samples per class and split (%s split):\n%s", c.split, format_counts(counts, names))
    absent = _check_placed(c, counts, names, flat, tiled, block)
    offsets = np.cumsum([0] + [m.size for m in maps])

    def local(split: str, i: int) -> np.ndarray:
        idx = splits[split]
        return idx[(idx >= offsets[i]) & (idx < offsets[i + 1])] - offsets[i]

    # Pass 2: the statistics, on the training centre pixels only.
    stats = Stats(nb, opts.clip_percentiles)
    for i in range(len(images)):
        stats.add(cubes.get(i).reshape(-1, nb)[local("train", i)])
    mean, std, bounds = stats.finish()
    attrs = {
        "task": "classification",
        **(
            {"source_images": [img.path for img in images], "source_labels": [p for _, p in pairs], "tiles": len(pairs)}
            if tiled
            else {"source_image": images[0].path, "source_labels": str(c.labels)}
        ),
        **band_attrs(sel, images[0].shape[2]),
        **_source_attrs(images, missing_total),
        **_label_attrs(coding, counts, absent),
        "patch": c.patch,
        "split_method": c.split + (" (whole tiles)" if tiled and c.split == "disjoint" else ""),
        "split_fractions": list(map(float, c.fractions)),
        "split_seed": c.seed,
        "disjoint_dropped_centres": dropped,
        "disjoint_block": block if c.split == "disjoint" and not tiled else None,
        "dropped_centres_with_missing_pixels": dropped_missing,
        "normalisation": describe(bounds, opts.clip_percentiles, "training pixels"),
        "nan_filled": filled,
        **provenance.as_attrs(provenance.record(config)),
    }
    sizes = {s: int(splits[s].size) for s in SPLITS}
    extra = {"label": np.int16, "row": np.int32, "col": np.int32} | ({"tile": np.int32} if tiled else {})
    coords = band_coords(sel, mean, std, _kept_fwhm(images, sel), bounds)
    # Pass 3: normalised patches, image by image.
    with atomic_path(output, "hsi-patches") as tmp:
        writer = SplitWriter(
            tmp, "patches", sizes, (nb, c.patch, c.patch), extra, coords,
            {s: {**attrs, "split": s} for s in SPLITS}, opts.band_chunk,
        )  # fmt: skip
        for i, img in enumerate(images):
            cube = normalise(cubes.get(i), mean, std, bounds, band_axis=2)
            for s in SPLITS:
                centres = local(s, i)
                r, col = np.divmod(centres, img.shape[1])
                writer.write(
                    s,
                    extract_patches(cube, centres, c.patch),
                    label=maps[i].ravel()[centres],
                    row=r,
                    col=col,
                    tile=np.full(centres.size, i),
                )
        writer.check_complete()
    return Path(output)


# -- masked autoencoding -------------------------------------------------------------------------
def _tile_splits(n: int, fractions, seed: int) -> np.ndarray:
    """The split (0 train, 1 val, 2 test) of each of ``n`` tiles: a seeded shuffle cut by the
    fractions, at least one training tile."""
    order = np.random.default_rng(seed).permutation(n)
    n_train = max(1, int(round(fractions[0] * n)))
    n_val = int(round(fractions[1] * n))
    split_of = np.empty(n, int)
    split_of[order[:n_train]] = 0
    split_of[order[n_train : n_train + n_val]] = 1
    split_of[order[n_train + n_val :]] = 2
    return split_of


def preprocess_tiles(t: TileSettings, opts: BandOptions, output: str | Path, config: dict | None = None) -> Path:
    """Non-overlapping tiles of every image, those holding a missing pixel left out; a
    seeded shuffle assigns them to splits."""
    paths = expand_images(t.images)
    images, sel = open_images(paths, opts)
    nb = sel.keep.size
    f = fractions_of(t.fractions)
    for img in images:
        if t.tile > min(img.shape[:2]):
            raise HsiInputError(
                f"tile {t.tile}x{t.tile} is larger than the image {img.path} ({img.shape[0]}x{img.shape[1]})"
            )
    # Pass 1: missing pixels, and per-tile sums, so the statistics need no second read.
    cubes = _Cubes(images, sel.keep, opts.nan_policy)
    stats = Stats(nb, opts.clip_percentiles)
    tiles, per_tile = [], []
    filled = missing_total = incomplete = 0
    for i, img in enumerate(images):
        cube, missing, n = cubes.first_read(i)
        filled += n
        missing_total += int(missing.sum())
        corners = tile_grid(img.shape, t.tile)
        whole = complete_tiles(missing, corners, t.tile)
        incomplete += int((~whole).sum())
        for (r, c), ok in zip(corners, whole):
            if ok:
                tiles.append((i, r, c))
                per_tile.append(stats.partial(cube[r : r + t.tile, c : c + t.tile].reshape(-1, nb)))
    if incomplete:
        log.warning("%s: %d tile(s) hold missing pixels; left out", ", ".join(paths[:3]), incomplete)
    if not tiles:
        raise HsiInputError(
            f"no complete {t.tile}x{t.tile} tile: every tile of {', '.join(paths[:3])} has a missing pixel"
        )
    split_of = _tile_splits(len(tiles), f, t.seed)
    for k in range(len(tiles)):
        if split_of[k] == 0:
            stats.add_partial(per_tile[k])
    del per_tile
    mean, std, bounds = stats.finish()
    attrs = {
        "task": "mae",
        "source_images": paths,
        **band_attrs(sel, images[0].shape[2]),
        **_source_attrs(images, missing_total),
        "tile": t.tile,
        "split_fractions": list(map(float, t.fractions)),
        "split_seed": t.seed,
        "dropped_tiles_with_missing_pixels": incomplete,
        "normalisation": describe(bounds, opts.clip_percentiles, "training tiles' pixels"),
        "nan_filled": filled,
        **provenance.as_attrs(provenance.record(config)),
    }
    sizes = {s: int((split_of == i).sum()) for i, s in enumerate(SPLITS)}
    coords = band_coords(sel, mean, std, _kept_fwhm(images, sel), bounds)
    extra = {"image": np.int32, "row0": np.int32, "col0": np.int32}
    with atomic_path(output, "hsi-tiles") as tmp:
        writer = SplitWriter(
            tmp, "tiles", sizes, (nb, t.tile, t.tile), extra, coords,
            {s: {**attrs, "split": s} for s in SPLITS}, opts.band_chunk,
        )  # fmt: skip
        for i in range(len(images)):
            cube = normalise(cubes.get(i), mean, std, bounds, band_axis=2)
            for si, s in enumerate(SPLITS):
                mine = [(k, r, c) for k, (ti, r, c) in enumerate(tiles) if ti == i and split_of[k] == si]
                if not mine:
                    continue
                block = np.stack([cube[r : r + t.tile, c : c + t.tile].transpose(2, 0, 1) for _, r, c in mine])
                writer.write(
                    s,
                    block,
                    image=np.full(len(mine), i),
                    row0=np.array([r for _, r, _ in mine]),
                    col0=np.array([c for _, _, c in mine]),
                )
        writer.check_complete()
    return Path(output)


def preprocess_from_config(config: dict, task: str, output: str | Path) -> Path:
    """The store of ``task`` (classification | mae) as a validated config's ``hsi`` section
    describes it: its files, bands, patches or tiles, split and seed."""
    hsi = config.get("hsi") or {}
    if task not in hsi:
        raise HsiInputError(f"the config has no 'hsi.{task}' section")
    settings, preprocess = {
        Task.CLASSIFICATION: (ClassificationSettings, preprocess_classification),  # labelled pixels' patches
        Task.MAE: (TileSettings, preprocess_tiles),  # unlabelled images' tiles
    }[Task(task)]
    return preprocess(settings.of(hsi[task]), band_options(hsi, task), output, config)
