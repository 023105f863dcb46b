"""A hyperspectral model applied to a new image, read and normalised as in training.

* Classification: every pixel's window (the training patch size, reflect-padded at the
  edges as the training patches are, ``dchag.hsi.samples``) classified; a Zarr store with
  ``label(y, x)`` (class number 1..K, 0 = missing pixel) and ``probability(class, y, x)``;
  a GeoTIFF of the labels when the image had a georeference; a PNG.
* Masked autoencoding: every complete tile reconstructed from a seeded random (1 - mask
  ratio) of its patches; a Zarr store with ``truth``, ``reconstruction`` (band, y, x, in the
  data's units) and ``masked(y, x)``, the scores of the masked pixels and of the whole
  (``dchag.evaluate.recon``) in its attributes; a PNG.

Bands: the model's bands are found in the new image by their centres when both have
wavelengths, one image band for each model band, within half the model band's FWHM (else half
the model's band spacing) (:func:`dchag.hsi.bands.match_bands`), else by their positions in
the file (the same product as the training images).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

from .. import provenance
from ..hsi.bands import match_bands
from ..model import random_masking
from ..model.folder import Model
from ..store import atomic_path, check_output, write_zarr
from ..vocabulary import Task
from .layout import PredictError, lay_out

log = logging.getLogger(__name__)


def _band_indices(model: Model, img) -> np.ndarray:
    bands = model.meta["bands"]
    centres = np.asarray([np.nan if v is None else v for v in bands["wavelength"]], np.float64)
    if img.wavelengths is not None and np.isfinite(centres).all():
        fwhm = np.asarray([np.nan if v is None else v for v in bands.get("fwhm") or [None] * centres.size], np.float64)
        return match_bands(centres, img.wavelengths, fwhm, str(img.path))
    n = bands.get("num_input_bands")
    if n is not None and img.shape[2] != n:
        raise PredictError(
            f"{img.path} has {img.shape[2]} bands and no wavelengths; the model's bands are positions in files of {n}"
        )
    return np.asarray(bands["band"], np.int64)


def read_scene(model: Model, path: str, key: str | None = None) -> tuple[np.ndarray, np.ndarray, object]:
    """(normalised (rows, cols, bands) float32, missing (rows, cols), the image)."""
    from ..hsi.normalise import normalise, read_checked
    from ..hsi.readers import read_image

    hsi = model.meta["data"]["hsi"]
    norm = model.meta["normalisation"]
    if hsi.get("clip_percentiles") and "clip" not in norm:  # a model folder from before the bounds were kept
        raise PredictError(
            f"{model.source} was trained on values clipped to percentiles and does not hold the bounds: export it again"
        )
    img = read_image(path, key, hsi.get("detector_overlap"), hsi.get("nodata"))
    keep = _band_indices(model, img)
    cube, missing, _ = read_checked(img, keep, hsi.get("nan_policy", "fail"))
    bounds = np.asarray(norm["clip"], np.float32) if "clip" in norm else None
    x = normalise(cube, np.asarray(norm["mean"], np.float32), np.asarray(norm["std"], np.float32), bounds, 2)
    x[missing] = 0.0
    return x, missing, img


def _png(image: np.ndarray, output: Path, title: str, cmap: str, labels: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6 * image.shape[0] / max(image.shape[1], 1) + 0.6))
    if labels:  # one colour per class
        from matplotlib.colors import ListedColormap

        colours = plt.get_cmap(cmap)(np.arange(len(labels)) % 20)
        im = ax.imshow(image, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(labels) - 0.5, interpolation="nearest")
    else:
        im = ax.imshow(image, cmap=cmap, interpolation="nearest")
    ax.set_title(title)
    ax.set_axis_off()
    if labels:
        bar = fig.colorbar(im, ax=ax, ticks=range(len(labels)), fraction=0.046)
        bar.ax.set_yticklabels(labels)
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _label_grid(img) -> dict | None:
    """The CRS and transform of a label GeoTIFF on the image's grid (None: the image has no
    map grid of its own), checked before anything is written."""
    georef = img.meta.get("georeference") or {}
    if not georef.get("geotransform"):
        return None
    import rasterio
    from rasterio.transform import Affine

    try:
        gt = [float(v) for v in georef["geotransform"]]
        transform = Affine.from_gdal(*gt)
        crs = rasterio.crs.CRS.from_user_input(georef["crs"]) if georef.get("crs") else None
    except (TypeError, ValueError, rasterio.errors.CRSError) as err:
        raise PredictError(
            f"{img.path}: georeference {json.dumps(georef)[:200]} is not a CRS and six numbers ({err})"
        ) from None
    return {"crs": crs, "transform": transform}


@contextlib.contextmanager
def _all_or_none(written: list[Path]):
    """The outputs of one call: when writing one of them fails, those already written
    (``written``, appended as each is done) are removed, so no half of a result is left."""
    try:
        yield
    except BaseException:
        for path in written:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise


def _geotiff(labels: np.ndarray, grid: dict, output: Path) -> None:
    import rasterio

    with atomic_path(output) as tmp:
        with rasterio.open(
            tmp,
            "w",
            driver="GTiff",
            height=labels.shape[0],
            width=labels.shape[1],
            count=1,
            dtype="int16",
            nodata=0,
            **grid,
        ) as dst:
            dst.write(labels.astype(np.int16), 1)


def _outputs(output: str, kind: str, image: str, model: Model, beside: tuple[str, ...]) -> Path:
    """The Zarr store ``output`` and the files beside it (``beside``: their suffixes), each
    checked before any work: none is another's path, an input, or a path dchag did not write."""
    out = Path(output)
    for suffix in beside:
        if out.with_suffix(suffix) == out:
            raise PredictError(
                f"--output {out} is the Zarr store, and its {suffix} goes beside it under the same name "
                f"with {suffix}: give the store another name (e.g. {out.with_suffix('.zarr')})"
            )
        check_output(out.with_suffix(suffix), None, (image, model.source))
    check_output(out, kind, (image, model.source))
    return out


# -- the predictions, shared with evaluation (dchag.evaluate.hsi) --------------------------------
def class_probabilities(model: Model, run, n: int, read, batch_size: int, what: str) -> dict[int, np.ndarray] | None:
    """The class probabilities (softmax) of ``n`` normalised patches, ``read(a, b)`` giving
    patches a..b-1 as (k, bands, p, p) float32, in batches shared out over ``run``'s groups:
    {first patch: (k, classes)} on rank 0, None on the others."""
    starts = range(0, n, batch_size)
    part = {}
    with torch.no_grad():
        for b in tqdm(run.mine(len(starts)), desc="classify", unit="batch", mininterval=1, disable=not run.writer):
            a = starts[b]
            logits = run(torch.from_numpy(read(a, min(a + batch_size, n))))
            if not torch.isfinite(logits).all():
                raise PredictError(f"{model.source}: the class scores of {what} {a}.. are not finite")
            part[a] = torch.softmax(logits, -1).numpy()
    return run.gather(part)


def masked_pixels(mask: np.ndarray, grid: tuple[int, int], patch: int) -> np.ndarray:
    """(tiles, rows, cols) bool: the pixels of the masked patches of a (tiles, patches) mask."""
    gh, gw = grid
    return mask.reshape(-1, gh, 1, gw, 1).repeat(patch, 2).repeat(patch, 4).reshape(-1, gh * patch, gw * patch) > 0


def reconstruct_tiles(model: Model, run, n: int, read, batch_size: int, what: str) -> dict | None:
    """Reconstructions of ``n`` normalised tiles (``read(a, b)``: tiles a..b-1 as (k, bands,
    t, t) float32) from a random (1 - mask ratio) of their patches, in batches shared out over
    ``run``'s groups: {first tile: (reconstructions, masked pixels)} on rank 0, None on the
    others. Every batch's mask is drawn in order from the model's seed (``seed`` + 2024) on
    every rank: the same masks in any layout, in evaluation and in predict."""
    cfg = model.config
    g = torch.Generator().manual_seed(int(model.meta.get("seed", 0)) + 2024)
    starts = range(0, n, batch_size)
    masks = [random_masking(min(batch_size, n - a), cfg.num_patches, model.meta["mask_ratio"], g) for a in starts]
    done = {}
    with torch.no_grad():
        for b in tqdm(run.mine(len(starts)), desc="reconstruct", unit="batch", mininterval=1, disable=not run.writer):
            a = starts[b]
            ids_keep, mask = masks[b]
            y = run(torch.from_numpy(read(a, min(a + batch_size, n))), ids_keep=ids_keep.to(run.device)).numpy()
            if not np.isfinite(y).all():
                raise PredictError(f"{model.source}: the reconstruction of {what} {a}.. is not finite")
            done[a] = (y, masked_pixels(mask.numpy(), cfg.grid, cfg.patch_size))
    return run.gather(done)


def classify_scene(
    model: Model, image: str, output: str, key: str | None = None, batch_size: int = 512
) -> dict[str, Path]:
    """The class of every pixel of ``image``: ``output`` (Zarr), beside it ``.png`` and, for a
    georeferenced image, ``.tif``."""
    model.require(Task.CLASSIFICATION)
    out = _outputs(output, "classification", image, model, (".png", ".tif"))
    from ..hsi.samples import extract_patches

    x, missing, img = read_scene(model, image, key)
    grid = _label_grid(img)
    rows, cols = missing.shape
    p = model.meta["sample_size"]
    names = model.meta.get("class_names") or [str(i + 1) for i in range(model.config.num_classes)]
    part = class_probabilities(
        model,
        lay_out(model),
        rows * cols,
        lambda a, b: extract_patches(x, np.arange(a, b), p),
        batch_size,
        f"the pixels of {image} from",
    )
    if part is None:
        return {}
    probs = np.zeros((len(names), rows, cols), np.float32)
    for first, values in part.items():
        probs.reshape(len(names), -1)[:, first : first + len(values)] = values.T
    labels = (probs.argmax(0) + 1).astype(np.int16)
    labels[missing] = 0
    probs[:, missing] = np.nan
    georef = img.meta.get("georeference")
    ds = xr.Dataset(
        {
            "label": (("y", "x"), labels, {"description": "class number 1..K (0: a missing pixel)"}),
            "probability": (("class", "y", "x"), probs, {"description": "softmax of the class scores"}),
        },
        coords={"class": np.arange(1, len(names) + 1)},  # the names in the attributes (strings are no Zarr v3 data)
        attrs={
            "image": str(image),
            "model": model.source,
            "class_names": list(names),
            "label_values": model.meta.get("label_values"),
            "georeference": json.dumps(georef),
            **provenance.as_attrs(provenance.record({"model": model.meta.get("provenance"), "image": str(image)})),
        },
    )
    write_zarr(ds, out, kind="classification", inputs=(image, model.source))
    made = {"zarr": out, "png": out.with_suffix(".png")}
    written = [out]
    with _all_or_none(written):
        _png(np.where(missing, np.nan, labels - 1.0), made["png"], f"classes of {Path(image).name}", "tab20", names)
        written.append(made["png"])
        if grid is not None:
            made["geotiff"] = out.with_suffix(".tif")
            _geotiff(labels, grid, made["geotiff"])
    return made


def _tile_scores(truth: np.ndarray, pred: np.ndarray, masked: np.ndarray, corners, t: int) -> dict:
    """The masked-patch and whole-tile scores of the reconstructed tiles (a note where SSIM's
    window does not fit a tile)."""
    from ..evaluate import recon

    if t < recon.WIN:
        return {"note": f"no scores: tiles of {t} px are smaller than SSIM's {recon.WIN} px window"}
    tiles = [np.stack([a[..., r : r + t, c : c + t] for r, c in corners]) for a in (truth, pred, masked)]
    return recon.masked_and_full(*tiles)


def _write_reconstruction(model: Model, image: str, out: Path, truth, pred, masked, corners, scores) -> None:
    """The store (truth, reconstruction, masked pixels; the scores in its attributes) and a PNG
    of one band (the one nearest 650 nm) beside it."""
    wl = [np.nan if v is None else v for v in model.meta["bands"]["wavelength"]]
    ds = xr.Dataset(
        {
            "truth": (("band", "y", "x"), truth),
            "reconstruction": (("band", "y", "x"), pred),
            "masked": (("y", "x"), masked, {"description": "pixels of the masked patches"}),
        },
        coords={"wavelength": ("band", np.asarray(wl, np.float64), {"units": "nm"})},
        attrs={
            "image": str(image),
            "model": model.source,
            "tiles": len(corners),
            "mask_ratio": model.meta["mask_ratio"],
            "scores": json.dumps(scores),
            **provenance.as_attrs(provenance.record({"model": model.meta.get("provenance"), "image": str(image)})),
        },
    )
    write_zarr(ds, out, kind="reconstruction", inputs=(image, model.source))
    band = int(np.argmin(np.abs(np.asarray(wl) - 650))) if np.isfinite(wl).all() else truth.shape[0] // 2
    side = np.concatenate([truth[band], pred[band]], axis=1)
    with _all_or_none([out]):
        _png(side, out.with_suffix(".png"), f"band {band}: image | reconstruction", "viridis")


def reconstruct_image(
    model: Model, image: str, output: str, key: str | None = None, batch_size: int = 16
) -> dict[str, Path]:
    """Masked-autoencoder reconstructions of every complete tile of ``image``."""
    model.require(Task.MAE)
    out = _outputs(output, "reconstruction", image, model, (".png",))
    from ..hsi.samples import complete_tiles, tile_grid

    x, missing, _ = read_scene(model, image, key)
    t = model.meta["sample_size"]
    grid = tile_grid(missing.shape, t)
    corners = [c for c, ok in zip(grid, complete_tiles(missing, grid, t)) if ok]
    if not corners:
        raise PredictError(f"{image}: no complete {t}x{t} tile without missing pixels to reconstruct")

    def read(a, b):
        return np.stack([x[r : r + t, c : c + t].transpose(2, 0, 1) for r, c in corners[a:b]])

    done = reconstruct_tiles(model, lay_out(model), len(corners), read, batch_size, f"the tiles of {image} from")
    if done is None:
        return {}
    mean = np.asarray(model.meta["normalisation"]["mean"], np.float32)[:, None, None]
    std = np.asarray(model.meta["normalisation"]["std"], np.float32)[:, None, None]
    truth = np.full((x.shape[2], *missing.shape), np.nan, np.float32)
    pred = np.full_like(truth, np.nan)
    masked = np.zeros(missing.shape, bool)
    for first, (y, m) in done.items():
        for k, (r, c) in enumerate(corners[first : first + len(y)]):
            truth[:, r : r + t, c : c + t] = x[r : r + t, c : c + t].transpose(2, 0, 1) * std + mean
            pred[:, r : r + t, c : c + t] = y[k] * std + mean
            masked[r : r + t, c : c + t] = m[k]
    scores = _tile_scores(truth, pred, masked, corners, t)
    _write_reconstruction(model, image, out, truth, pred, masked, corners, scores)
    return {"zarr": out, "png": out.with_suffix(".png"), "scores": scores}
