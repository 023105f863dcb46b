"""Hyperspectral preprocessing: band removal, per-band standardisation fitted on training
pixels only, and either classification patches or masked-autoencoder tiles, into one Zarr v3
store with a group per split (``train``, ``val``, ``test``), chunked by band groups so a
tensor-parallel rank reads only its bands. Written atomically.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from .. import provenance
from ..store import atomic_path, compressors
from .bands import BandSelection, select_bands
from .readers import HsiInputError, HyperspectralImage, expand_images, read_image, read_labels

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")


@dataclass
class BandOptions:
    preset: str | None = None
    drop_bands: str | None = None
    drop_wavelengths: list[list[float]] | None = None
    nan_policy: str = "fail"  # fail | fill
    clip_percentiles: tuple[float, float] | None = None
    band_chunk: int = 32
    key: str | None = None  # variable in a .mat file
    notes: list[str] = field(default_factory=list)


def _fractions(fractions) -> np.ndarray:
    f = np.asarray(fractions, dtype=float)
    if f.shape != (3,) or np.any(f < 0) or not np.isclose(f.sum(), 1.0):
        raise HsiInputError(f"split fractions {list(fractions)} must be three non-negative numbers summing to 1 (train, val, test)")
    return f


def _open(paths: list[str], opts: BandOptions) -> tuple[list[HyperspectralImage], BandSelection]:
    images = [read_image(p, opts.key) for p in paths]
    first = images[0]
    for img in images[1:]:
        if img.shape[2] != first.shape[2]:
            raise HsiInputError(f"{img.path} has {img.shape[2]} bands, {first.path} has {first.shape[2]}")
    sel = select_bands(first.shape[2], first.wavelengths, first.bbl, opts.preset, opts.drop_bands, opts.drop_wavelengths, first.path)
    return images, sel


def _read_checked(img: HyperspectralImage, keep: np.ndarray, opts: BandOptions) -> tuple[np.ndarray, int]:
    cube = img.read(keep)
    bad = ~np.isfinite(cube)
    count = int(bad.sum())
    if count:
        where = np.argwhere(bad)[0]
        if opts.nan_policy == "fail":
            raise HsiInputError(
                f"{img.path}: {count} NaN/inf pixel value(s), first at row {where[0]}, col {where[1]}, kept band {where[2]}; "
                "set nan_policy: fill to replace them with the band mean"
            )
        band_mean = np.nanmean(np.where(bad, np.nan, cube), axis=(0, 1))
        if not np.all(np.isfinite(band_mean)):
            raise HsiInputError(f"{img.path}: a band has no finite value to fill from")
        cube = np.where(bad, band_mean[None, None, :], cube).astype(np.float32)
        log.warning("%s: filled %d NaN/inf values with band means", img.path, count)
    return cube, count


class _Stats:
    """Per-band running sums over training pixels (float64); optional percentile clipping."""

    def __init__(self, bands: int, clip):
        self.sum = np.zeros(bands)
        self.sq = np.zeros(bands)
        self.n = 0
        self.clip = clip
        self.samples: list[np.ndarray] = []

    def add(self, pixels: np.ndarray) -> None:  # (n, bands)
        if self.clip is not None:
            self.samples.append(pixels[:: max(1, len(pixels) // 20000)])
        self.sum += pixels.sum(0, dtype=np.float64)
        self.sq += (pixels.astype(np.float64) ** 2).sum(0)
        self.n += len(pixels)

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if self.n == 0:
            raise HsiInputError("no training pixels to fit the normalisation on (check the split fractions)")
        bounds = None
        if self.clip is not None:
            allpix = np.concatenate(self.samples)
            bounds = np.percentile(allpix, list(self.clip), axis=0)
            clipped = np.clip(allpix, bounds[0], bounds[1])
            return clipped.mean(0), np.maximum(clipped.std(0), 1e-12), bounds
        mean = self.sum / self.n
        std = np.sqrt(np.maximum(self.sq / self.n - mean**2, 0))
        return mean, np.where(std > 0, std, 1.0), bounds


def _normalise(x: np.ndarray, mean, std, bounds, band_axis: int) -> np.ndarray:
    shape = [1] * x.ndim
    shape[band_axis] = -1
    if bounds is not None:
        x = np.clip(x, bounds[0].reshape(shape), bounds[1].reshape(shape))
    return ((x - mean.reshape(shape)) / std.reshape(shape)).astype(np.float32)


def _band_coords(sel: BandSelection, mean, std) -> dict:
    wl = sel.wavelengths if sel.wavelengths is not None else np.full(sel.keep.size, np.nan)
    return {
        "band": ("band", sel.keep.astype(np.int32), {"description": "0-based index of the band in the input file"}),
        "sensor_band": ("band", sel.sensor_bands.astype(np.int32), {"description": "1-based band number in the sensor's numbering"}),
        "wavelength": ("band", wl, {"units": "nm", "source": sel.wavelength_source or "none: the input has no wavelengths"}),
        "mean": ("band", mean),
        "std": ("band", std),
    }


def _band_attrs(sel: BandSelection, num_input_bands: int) -> dict:
    return {
        "band_selection": sel.how,
        "kept_bands_1based": sel.sensor_bands.tolist(),
        "kept_bands_numbering": "the sensor's band numbers (1-based)",
        "num_input_bands": num_input_bands,
        "wavelength_source": sel.wavelength_source or "none: the input has no wavelengths",
    }


def _write(groups: dict[str, xr.Dataset], output: str | Path, var: str, band_chunk: int) -> Path:
    with atomic_path(output) as tmp:
        for split, ds in groups.items():
            n = ds.sizes["sample"]
            enc = {var: {"chunks": (max(1, min(n, 256)), min(band_chunk, ds.sizes["band"]), *ds[var].shape[2:]), "compressors": compressors()}}
            ds.to_zarr(tmp, group=split, zarr_format=3, consolidated=False, encoding=enc, mode="a" if Path(tmp).exists() else "w")
    return Path(output)


# -- classification ----------------------------------------------------------------------------
def stratified_split(labels: np.ndarray, fractions, seed: int) -> dict[str, np.ndarray]:
    """Per class, shuffled: the first fraction to train, the next to val, the rest to test
    (at least one training pixel per class). Returns flat pixel indices per split."""
    f = _fractions(fractions)
    rng = np.random.default_rng(seed)
    flat = labels.ravel()
    out = {s: [] for s in SPLITS}
    for cls in np.unique(flat[flat > 0]):
        idx = rng.permutation(np.flatnonzero(flat == cls))
        n_train = max(1, int(round(f[0] * idx.size)))
        n_val = int(round(f[1] * idx.size))
        out["train"].append(idx[:n_train])
        out["val"].append(idx[n_train:n_train + n_val])
        out["test"].append(idx[n_train + n_val:])
    return {s: np.sort(np.concatenate(v)) if v else np.array([], int) for s, v in out.items()}


def _pure(id_map: np.ndarray, patch: int) -> np.ndarray:
    """True where the patch x patch window around a pixel (edge-padded, as the patches are
    reflect-padded) holds one value of ``id_map`` only."""
    from scipy.ndimage import maximum_filter, minimum_filter  # separable: O(patch), not O(patch^2), per pixel

    return minimum_filter(id_map, size=patch, mode="nearest") == maximum_filter(id_map, size=patch, mode="nearest")


def class_counts(labels: np.ndarray, splits: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Per split, the number of samples of each class 1..K."""
    flat = labels.ravel()
    k = int(flat.max())
    return {s: np.bincount(flat[idx], minlength=k + 1)[1:].astype(int).tolist() for s, idx in splits.items()}


def disjoint_split(labels: np.ndarray, fractions, seed: int, block: int, patch: int) -> tuple[dict[str, np.ndarray], int]:
    """Square blocks of the image go whole to one split, so train, val and test windows never
    share a pixel: a pixel is a patch centre only if its whole window lies in blocks of its own
    split. Blocks are placed per class, rarest class first, so that every class with a block
    able to hold a whole window gets one in every split; the other blocks then go to the split
    furthest below its fraction of labelled pixels, and unlabelled blocks join their
    neighbours' split (fewer windows cut at block edges). Returns (splits, dropped centres)."""
    f = _fractions(fractions)
    rows, cols = labels.shape
    nbx = -(-cols // block)
    block_id = (np.arange(rows) // block)[:, None] * nbx + (np.arange(cols) // block)[None, :]
    n_blocks = int(block_id.max()) + 1
    labelled = labels > 0
    n_classes = int(labels.max())
    safe = _pure(block_id, patch) & labelled  # a window that stays in its own block
    per_block = np.zeros((n_blocks, n_classes + 1), int)
    np.add.at(per_block, (block_id[labelled], labels[labelled]), 1)
    safe_block = np.zeros((n_blocks, n_classes + 1), int)
    np.add.at(safe_block, (block_id[safe], labels[safe]), 1)
    total = per_block[:, 1:].sum(1)
    rng = np.random.default_rng(seed)
    tiebreak = rng.permutation(n_blocks)
    assign = np.full(n_blocks, -1)
    wanted = [s for s in range(3) if f[s] > 0]
    # 1. every class into every split, rarest class first, each time the smallest fitting block
    for k in np.argsort(per_block[:, 1:].sum(0), kind="stable") + 1:
        for s in wanted:
            if np.any((assign == s) & (safe_block[:, k] > 0)):
                continue
            cands = np.flatnonzero((assign < 0) & (safe_block[:, k] > 0))
            if cands.size:
                assign[cands[np.lexsort((tiebreak[cands], total[cands]))[0]]] = s
    # 2. the other labelled blocks to the split furthest below its share of labelled pixels
    target = f * total.sum()
    filled = np.array([total[assign == s].sum() for s in range(3)], float)
    for b in rng.permutation(n_blocks):
        if assign[b] < 0 and total[b] > 0:
            s = int(np.argmax(np.where(f > 0, target - filled, -np.inf)))
            assign[b] = s
            filled[s] += total[b]
    # 3. unlabelled blocks: the most common split among their assigned neighbours
    grid = assign.reshape(-1, nbx)
    for b in np.flatnonzero(assign < 0):
        by, bx = divmod(b, nbx)
        near = grid[max(0, by - 1):by + 2, max(0, bx - 1):bx + 2].ravel()
        near = near[near >= 0]
        assign[b] = np.bincount(near, minlength=3).argmax() if near.size else int(np.argmax(f))

    def kept(a: np.ndarray) -> np.ndarray:  # (split, class) -> kept centres
        split_map = a[block_id]
        ok = labelled & _pure(split_map, patch)
        return np.stack([np.bincount(labels[ok & (split_map == i)], minlength=n_classes + 1) for i in range(3)])

    # 4. repair: a class still absent from a split (its pixels near block edges only) gets a
    #    block, or a block with its neighbours, moved there if no class leaves another split
    ny = block_id.shape[0] // block + (block_id.shape[0] % block > 0)
    for _ in range(3):
        counts = kept(assign)
        missing = [(k, s) for k in range(1, n_classes + 1) for s in wanted if counts[s, k] == 0 and per_block[:, k].any()]
        if not missing:
            break
        for k, s in missing:
            counts = kept(assign)
            if counts[s, k]:
                continue
            present = counts > 0
            for b in np.flatnonzero(per_block[:, k])[np.argsort(-per_block[per_block[:, k] > 0, k], kind="stable")][:24]:
                by, bx = divmod(int(b), nbx)
                around = [y * nbx + x for y in range(max(0, by - 1), min(ny, by + 2)) for x in range(max(0, bx - 1), min(nbx, bx + 2))]
                moved = False
                for region in ([int(b)], around):
                    trial = assign.copy()
                    trial[region] = s
                    after = kept(trial)
                    if after[s, k] and np.all(after[present] > 0):
                        assign, moved = trial, True
                        break
                if moved:
                    break
    split_map = assign[block_id]
    pure = _pure(split_map, patch)
    out = {s: np.flatnonzero((labelled & pure & (split_map == i)).ravel()) for i, s in enumerate(SPLITS)}
    dropped = int(labelled.sum() - sum(v.size for v in out.values()))
    return out, dropped


def disjoint_split_placing_classes(labels: np.ndarray, fractions, seed: int, patch: int,
                                   block: int | None = None) -> tuple[dict[str, np.ndarray], int, int]:
    """The disjoint split with ``block``, or (None) with the largest block from 2 x patch down
    to patch that puts every class in every split (smaller blocks place more classes and drop
    more centres at block edges); where none does, the one that misses fewest. Returns
    (splits, dropped centres, block)."""
    f = _fractions(fractions)
    present = np.bincount(labels.ravel(), minlength=int(labels.max()) + 1)[1:] > 0
    best = None
    for size in ([block] if block else range(2 * patch, patch - 1, -1)):
        splits, dropped = disjoint_split(labels, fractions, seed, size, patch)
        counts = np.stack([np.bincount(labels.ravel()[splits[s]], minlength=present.size + 1)[1:] for s in SPLITS])
        misses = int(((counts[f > 0] == 0) & present).sum())
        if best is None or misses < best[0]:
            best = (misses, splits, dropped, size)
        if misses == 0:
            break
    return best[1], best[2], best[3]


def missing_classes(counts: dict[str, list[int]], fractions, names: list[str], labels: np.ndarray) -> list[str]:
    """'<class> (<pixels> pixels): none in <splits>' for every labelled class absent from a
    split that has a non-zero fraction."""
    f = _fractions(fractions)
    pixels = np.bincount(labels.ravel(), minlength=len(names) + 1)[1:]
    out = []
    for k, name in enumerate(names):
        if pixels[k] == 0:
            continue
        absent = [s for i, s in enumerate(SPLITS) if f[i] > 0 and counts[s][k] == 0]
        if absent:
            out.append(f"{name} ({pixels[k]} pixels): none in {', '.join(absent)}")
    return out


def format_counts(counts: dict[str, list[int]], names: list[str]) -> str:
    width = max(len(n) for n in names)
    lines = [f"{'class':{width}s} " + " ".join(f"{s:>7s}" for s in SPLITS)]
    lines += [f"{name:{width}s} " + " ".join(f"{counts[s][k]:7d}" for s in SPLITS) for k, name in enumerate(names)]
    return "\n".join(lines)


def extract_patches(cube: np.ndarray, centres: np.ndarray, patch: int) -> np.ndarray:
    """(rows, cols, bands) cube, flat centre indices -> (n, bands, patch, patch), reflect-padded."""
    h = patch // 2
    padded = np.pad(cube, ((h, h), (h, h), (0, 0)), mode="reflect")
    r, c = np.divmod(centres, cube.shape[1])
    out = np.empty((centres.size, cube.shape[2], patch, patch), np.float32)
    for i, (ri, ci) in enumerate(zip(r, c)):
        out[i] = padded[ri:ri + patch, ci:ci + patch].transpose(2, 0, 1)
    return out


def preprocess_classification(
    image: str, labels: str, output: str | Path, opts: BandOptions, *, labels_key: str | None = None,
    patch: int = 11, split: str = "stratified", fractions=(0.1, 0.1, 0.8), seed: int = 0, block: int | None = None,
    class_names: list[str] | None = None, missing_class: str = "error", config: dict | None = None,
) -> Path:
    (img,), sel = _open([image], opts)
    keep = sel.keep
    label_map = read_labels(labels, labels_key)
    if label_map.shape != img.shape[:2]:
        raise HsiInputError(f"label map {labels} is {label_map.shape[0]}x{label_map.shape[1]}, the image {img.path} is {img.shape[0]}x{img.shape[1]}")
    if patch < 1 or patch % 2 == 0:
        raise HsiInputError(f"patch size {patch} must be odd, so the patch is centred on its pixel")
    if patch > min(img.shape[:2]):
        raise HsiInputError(f"patch {patch}x{patch} is larger than the image {img.path} ({img.shape[0]}x{img.shape[1]})")
    if (label_map > 0).sum() == 0:
        raise HsiInputError(f"label map {labels} has no labelled pixel (0 = unlabelled)")
    cube, filled = _read_checked(img, keep, opts)
    if split == "stratified":
        splits, dropped = stratified_split(label_map, fractions, seed), 0
    elif split == "disjoint":
        splits, dropped, block = disjoint_split_placing_classes(label_map, fractions, seed, patch, block)
    else:
        raise HsiInputError(f"split {split!r}: expected stratified or disjoint")
    n_classes = int(label_map.max())
    names = list(class_names) if class_names else [f"class {i}" for i in range(1, n_classes + 1)]
    if len(names) < n_classes:
        raise HsiInputError(f"{len(names)} class names for {n_classes} classes in {labels}")
    names = names[:n_classes]
    counts = class_counts(label_map, splits)
    table = format_counts(counts, names)
    print(f"samples per class and split ({split} split):\n{table}", flush=True)
    absent = missing_classes(counts, fractions, names, label_map)
    if absent:
        hint = (f"a smaller patch (now {patch}; block {block} px) places more classes; "
                if split == "disjoint" else "")
        message = (f"{labels}: {len(absent)} class(es) cannot be placed in every split: " + "; ".join(absent)
                   + f". {hint}set hsi.classification.missing_class: warn to go on without them")
        if missing_class == "error":
            raise HsiInputError(message)
        log.warning("%s", message)
    stats = _Stats(keep.size, opts.clip_percentiles)
    stats.add(cube.reshape(-1, keep.size)[splits["train"]])
    mean, std, bounds = stats.finish()
    cube = _normalise(cube, mean, std, bounds, band_axis=2)
    attrs = {
        "task": "classification",
        "source_image": img.path,
        "source_labels": str(labels),
        **_band_attrs(sel, img.shape[2]),
        "class_names": names,
        "class_counts": json.dumps(counts),
        "classes_missing_from_a_split": absent,
        "label_note": "label = class number as in the ground truth (1..K); 0 (unlabelled) is never a sample",
        "patch": patch,
        "split_method": split,
        "split_fractions": list(map(float, fractions)),
        "split_seed": seed,
        "disjoint_dropped_centres": dropped,
        "disjoint_block": block if split == "disjoint" else None,
        "normalisation": "per band (x - mean) / std, fitted on the training pixels only" + (f", clipped to percentiles {list(opts.clip_percentiles)}" if bounds is not None else ""),
        "nan_filled": filled,
        **({"source_note": "; ".join(opts.notes)} if opts.notes else {}),
        **provenance.as_attrs(provenance.record(config)),
    }
    groups = {}
    for s in tqdm(SPLITS, desc="patches", unit="split"):
        centres = splits[s]
        r, c = np.divmod(centres, img.shape[1])
        groups[s] = xr.Dataset(
            {
                "patches": (("sample", "band", "y", "x"), extract_patches(cube, centres, patch)),
                "label": ("sample", label_map.ravel()[centres].astype(np.int16)),
                "row": ("sample", r.astype(np.int32)),
                "col": ("sample", c.astype(np.int32)),
            },
            coords=_band_coords(sel, mean, std),
            attrs={**attrs, "split": s},
        )
    return _write(groups, output, "patches", opts.band_chunk)


# -- masked autoencoding -------------------------------------------------------------------------
def preprocess_tiles(images: list[str], output: str | Path, opts: BandOptions, *, tile: int = 32,
                     fractions=(0.8, 0.1, 0.1), seed: int = 0, config: dict | None = None) -> Path:
    paths = expand_images(images)
    imgs, sel = _open(paths, opts)
    keep = sel.keep
    f = _fractions(fractions)
    for img in imgs:
        if tile > min(img.shape[:2]):
            raise HsiInputError(f"tile {tile}x{tile} is larger than the image {img.path} ({img.shape[0]}x{img.shape[1]})")
    # Tiles: non-overlapping, row-major per image; a seeded shuffle assigns them to splits.
    tiles = [(i, r, c) for i, img in enumerate(imgs) for r in range(0, img.shape[0] - tile + 1, tile) for c in range(0, img.shape[1] - tile + 1, tile)]
    order = np.random.default_rng(seed).permutation(len(tiles))
    n_train = max(1, int(round(f[0] * len(tiles))))
    n_val = int(round(f[1] * len(tiles)))
    split_of = np.empty(len(tiles), int)
    split_of[order[:n_train]] = 0
    split_of[order[n_train:n_train + n_val]] = 1
    split_of[order[n_train + n_val:]] = 2
    stats = _Stats(keep.size, opts.clip_percentiles)
    filled = 0
    cubes = {}
    for i, img in enumerate(tqdm(imgs, desc="tiles: statistics", unit="image")):
        cube, n = _read_checked(img, keep, opts)
        filled += n
        for k, (ti, r, c) in enumerate(tiles):
            if ti == i and split_of[k] == 0:
                stats.add(cube[r:r + tile, c:c + tile].reshape(-1, keep.size))
        if len(imgs) <= 8:  # small collections stay in memory; large ones are read twice
            cubes[i] = cube
    mean, std, bounds = stats.finish()
    per_split: dict[int, list] = {0: [], 1: [], 2: []}
    meta: dict[int, list] = {0: [], 1: [], 2: []}
    for i, img in enumerate(tqdm(imgs, desc="tiles: write", unit="image")):
        cube = cubes.pop(i) if i in cubes else _read_checked(img, keep, opts)[0]
        cube = _normalise(cube, mean, std, bounds, band_axis=2)
        for k, (ti, r, c) in enumerate(tiles):
            if ti == i:
                per_split[split_of[k]].append(cube[r:r + tile, c:c + tile].transpose(2, 0, 1))
                meta[split_of[k]].append((i, r, c))
    attrs = {
        "task": "mae",
        "source_images": paths,
        **_band_attrs(sel, imgs[0].shape[2]),
        "tile": tile,
        "split_fractions": list(map(float, fractions)),
        "split_seed": seed,
        "normalisation": "per band (x - mean) / std, fitted on the training tiles' pixels only" + (f", clipped to percentiles {list(opts.clip_percentiles)}" if bounds is not None else ""),
        "nan_filled": filled,
        **({"source_note": "; ".join(opts.notes)} if opts.notes else {}),
        **provenance.as_attrs(provenance.record(config)),
    }
    groups = {}
    for idx, s in enumerate(SPLITS):
        arr = np.stack(per_split[idx]) if per_split[idx] else np.empty((0, keep.size, tile, tile), np.float32)
        m = np.asarray(meta[idx], dtype=np.int32).reshape(-1, 3)
        groups[s] = xr.Dataset(
            {
                "tiles": (("sample", "band", "y", "x"), arr),
                "image": ("sample", m[:, 0]),
                "row0": ("sample", m[:, 1]),
                "col0": ("sample", m[:, 2]),
            },
            coords=_band_coords(sel, mean, std),
            attrs={**attrs, "split": s},
        )
    return _write(groups, output, "tiles", opts.band_chunk)


def band_options(hsi: dict, task: str) -> BandOptions:
    """The band handling of a validated config's ``hsi`` section, for ``task`` (classification | mae)."""
    return BandOptions(preset=hsi["preset"], drop_bands=hsi["drop_bands"],
                       drop_wavelengths=[list(map(float, r)) for r in hsi["drop_wavelengths"] or []],
                       nan_policy=hsi["nan_policy"],
                       clip_percentiles=tuple(hsi["clip_percentiles"]) if hsi["clip_percentiles"] else None,
                       band_chunk=hsi["band_chunk"], key=hsi[task]["image_key"])


def preprocess_from_config(config: dict, task: str, output: str | Path) -> Path:
    """The store of ``task`` (classification | mae) as a validated config's ``hsi`` section
    describes it: its files, bands, patches or tiles, split and seed."""
    hsi = config.get("hsi") or {}
    if task not in hsi:
        raise HsiInputError(f"the config has no 'hsi.{task}' section")
    sec, opts = hsi[task], band_options(hsi, task)
    if task == "classification":
        return preprocess_classification(
            sec["image"], sec["labels"], output, opts, labels_key=sec["labels_key"], patch=sec["patch"], split=sec["split"],
            fractions=sec["fractions"], seed=sec["seed"], block=sec["block"], class_names=sec["class_names"],
            missing_class=sec["missing_class"], config=config)
    return preprocess_tiles(sec["images"], output, opts, tile=sec["tile"], fractions=sec["fractions"], seed=sec["seed"],
                            config=config)
