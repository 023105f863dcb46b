"""Per-band standardisation: the kept bands read with their missing pixels flagged and the
NaN policy applied, running sums over training pixels (streamed: one image at a time), and
the (x - mean) / std transform."""

from __future__ import annotations

import logging

import numpy as np

from .image import HsiInputError, HyperspectralImage

log = logging.getLogger(__name__)


def read_checked(img: HyperspectralImage, keep: np.ndarray, nan_policy: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(cube of the kept bands, missing pixels, NaN/inf values filled). A missing pixel (the
    file's nodata or fill value) is no sample and never counted here; a NaN/inf anywhere else
    stops the run (``nan_policy: fail``) or is replaced by its band's mean (``fill``)."""
    cube, missing = img.read_masked(keep)
    bad = ~np.isfinite(cube)
    bad[missing] = False
    count = int(bad.sum())
    if count:
        where = np.argwhere(bad)[0]
        if nan_policy == "fail":
            raise HsiInputError(
                f"{img.path}: {count} NaN/inf pixel value(s), "
                f"first at row {where[0]}, col {where[1]}, kept band {where[2]}; "
                "set nan_policy: fill to replace them with the band mean (or hsi.nodata if they mark missing pixels)"
            )
        usable = np.where(bad | missing[:, :, None], np.nan, cube)
        with np.errstate(invalid="ignore"):
            band_mean = np.nanmean(usable, axis=(0, 1)) if usable.size else np.array([])
        if not np.all(np.isfinite(band_mean)):
            raise HsiInputError(f"{img.path}: a band has no finite value to fill from")
        cube = np.where(bad, band_mean[None, None, :], cube).astype(np.float32)
        log.warning("%s: filled %d NaN/inf values with band means", img.path, count)
    return cube, missing, count


class Stats:
    """Per-band running sums over training pixels (float64); optional percentile clipping
    (fitted on a subsample of at most ~20 000 pixels per call)."""

    def __init__(self, bands: int, clip):
        self.sum = np.zeros(bands)
        self.sq = np.zeros(bands)
        self.n = 0
        self.clip = clip
        self.samples: list[np.ndarray] = []

    def partial(self, pixels: np.ndarray) -> tuple:
        """The sums of ``pixels`` (n, bands), to be added later with :meth:`add_partial` (the
        result equals :meth:`add` of the same pixels, without keeping them)."""
        sample = pixels[:: max(1, len(pixels) // 20000)].copy() if self.clip is not None else None
        return pixels.sum(0, dtype=np.float64), (pixels.astype(np.float64) ** 2).sum(0), len(pixels), sample

    def add_partial(self, part: tuple) -> None:
        total, sq, n, sample = part
        if not n:
            return
        if self.clip is not None:
            self.samples.append(sample)
        self.sum += total
        self.sq += sq
        self.n += n

    def add(self, pixels: np.ndarray) -> None:  # (n, bands)
        self.add_partial(self.partial(pixels))

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


def normalise(x: np.ndarray, mean, std, bounds, band_axis: int) -> np.ndarray:
    shape = [1] * x.ndim
    shape[band_axis] = -1
    if bounds is not None:
        x = np.clip(x, bounds[0].reshape(shape), bounds[1].reshape(shape))
    return ((x - mean.reshape(shape)) / std.reshape(shape)).astype(np.float32)


def describe(bounds, clip, what: str) -> str:
    return f"per band (x - mean) / std, fitted on the {what} only" + (
        f", clipped to percentiles {list(clip)}" if bounds is not None else ""
    )
