"""Reconstruction scores for hyperspectral cubes.

Arrays are (..., bands, rows, cols) after moving the band axis; leading axes (tiles) are
pooled. Every score takes the data range explicitly (default: the truth's max - min, which is
returned with the scores so a reader knows what the PSNR and SSIM mean).

- rmse: over every value.
- psnr: 10 log10(R^2 / MSE) of the whole cube; psnr_band_mean: the mean over bands of the
  per-band PSNR (same R).
- ssim: per band and image, Gaussian window (sigma 1.5, truncated at 3.5 sigma: 11 x 11),
  K1 = 0.01, K2 = 0.03, population covariances, reflected borders, the map averaged after
  cropping the 5-pixel border — scikit-image's ``structural_similarity(gaussian_weights=True,
  use_sample_covariance=False)``; averaged over bands (and images).
- sam: spectral angle in radians per pixel, mean over pixels; pixels whose truth or
  reconstruction spectrum is all zero are left out (their angle is undefined).
- ergas: 100 * ratio * sqrt(mean over bands of (RMSE_b / mean_b)^2), ratio = 1 for a
  same-resolution reconstruction; only meaningful on unnormalised (non-negative) data.

With a ``mask`` (rows, cols or broadcastable to the leading and spatial axes; True = scored)
every score is restricted to those pixels; the SSIM map is then averaged over the masked
pixels inside the cropped area.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.ndimage import gaussian_filter

from .. import jsonio
from ..store import InputError, atomic_path

SIGMA, TRUNCATE, K1, K2 = 1.5, 3.5, 0.01, 0.03
WIN = 2 * int(TRUNCATE * SIGMA + 0.5) + 1
KEYS = ("rmse", "psnr", "psnr_band_mean", "ssim", "sam", "ergas")


class ReconError(InputError):
    pass


def _prepare(truth, pred, band_axis: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(truth, dtype=np.float64)
    p = np.asarray(pred, dtype=np.float64)
    if t.shape != p.shape:
        raise ReconError(f"truth and reconstruction differ in shape: {t.shape} vs {p.shape}")
    if t.ndim < 3:
        raise ReconError(f"expected a cube with a band axis and two spatial axes, got shape {t.shape}")
    if not -t.ndim <= band_axis < t.ndim:
        raise ReconError(f"band axis {band_axis}: the cubes have {t.ndim} axes (shape {t.shape})")
    t, p = np.moveaxis(t, band_axis, -3), np.moveaxis(p, band_axis, -3)
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(p))):
        raise ReconError("truth or reconstruction contains NaN or infinite values")
    return t, p


def _pixel_mask(mask, t: np.ndarray) -> np.ndarray:
    """Boolean (..., 1, rows, cols) broadcast to the cube's leading and spatial axes."""
    if mask is None:
        return np.ones((*t.shape[:-3], 1, *t.shape[-2:]), dtype=bool)
    m = np.asarray(mask, dtype=bool)
    m = np.broadcast_to(m[..., None, :, :], (*t.shape[:-3], 1, *t.shape[-2:]))
    if not m.any():
        raise ReconError("the mask selects no pixels")
    return m


def ssim_maps(t: np.ndarray, p: np.ndarray, data_range: float) -> np.ndarray:
    """SSIM map of every 2-D image in (..., rows, cols)."""
    if min(t.shape[-2:]) < WIN:
        raise ReconError(
            f"SSIM with a Gaussian window of sigma {SIGMA} needs images of at least {WIN}x{WIN} pixels, "
            f"got {t.shape[-2]}x{t.shape[-1]}"
        )
    sigma = (0,) * (t.ndim - 2) + (SIGMA, SIGMA)

    def f(x):
        return gaussian_filter(x, sigma=sigma, truncate=TRUNCATE, mode="reflect")

    ux, uy = f(t), f(p)
    vx = f(t * t) - ux * ux
    vy = f(p * p) - uy * uy
    vxy = f(t * p) - ux * uy
    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    return ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))


def scores(truth, pred, band_axis: int = -1, data_range: float | None = None, mask=None) -> dict:
    t, p = _prepare(truth, pred, band_axis)
    m = _pixel_mask(mask, t)
    if data_range is None:
        data_range = float(t.max() - t.min())
    if not data_range > 0:
        raise ReconError(f"data range must be positive, got {data_range} (pass --data-range)")
    bands = t.shape[-3]
    mb = np.broadcast_to(m, t.shape)
    sq = (t - p) ** 2
    mse_total = float(sq[mb].mean())
    band_axes = tuple(i for i in range(t.ndim) if i != t.ndim - 3)
    count_b = mb.sum(axis=band_axes)
    mse_b = np.where(mb, sq, 0).sum(axis=band_axes) / count_b
    mean_b = np.where(mb, t, 0).sum(axis=band_axes) / count_b
    with np.errstate(divide="ignore"):  # a perfect reconstruction: PSNR is infinite (scikit-image's too)
        psnr = float(10 * np.log10(np.float64(data_range) ** 2 / np.float64(mse_total)))
        psnr_b = 10 * np.log10(data_range**2 / mse_b)
    # SSIM: the map per (image, band), cropped, averaged over the scored pixels.
    pad = (WIN - 1) // 2
    smap = ssim_maps(t, p, data_range)[..., pad:-pad, pad:-pad]
    sm = np.broadcast_to(m[..., pad:-pad, pad:-pad], smap.shape)
    ssim = float(smap[sm].mean()) if sm.any() else float("nan")
    # SAM over pixels (spectra along the band axis).
    dot = (t * p).sum(axis=-3)
    norms = np.sqrt((t * t).sum(axis=-3) * (p * p).sum(axis=-3))
    valid = m[..., 0, :, :] & (norms > 0)
    cos = np.clip(dot[valid] / norms[valid], -1.0, 1.0)
    sam = float(np.arccos(cos).mean()) if cos.size else float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        ergas = float(100.0 * np.sqrt(np.mean(mse_b / mean_b**2)))
    return {
        "rmse": float(np.sqrt(mse_total)),
        "psnr": psnr,
        "psnr_band_mean": float(np.mean(psnr_b)),
        "ssim": ssim,
        "sam": sam,
        "ergas": ergas,
        "data_range": float(data_range),
        "bands": int(bands),
        "sam_pixels_left_out": int((m[..., 0, :, :] & ~(norms > 0)).sum()),
    }


def masked_and_full(truth: np.ndarray, pred: np.ndarray, masked: np.ndarray) -> dict:
    """A masked autoencoder's scores: on the pixels of the masked patches (``masked``,
    (tiles, rows, cols)) and on the whole tiles, of (tiles, bands, rows, cols) cubes in the
    data's units, over one data range (the truth's max - min)."""
    rng = float(np.nanmax(truth) - np.nanmin(truth))
    return {
        "masked": scores(truth, pred, band_axis=1, data_range=rng, mask=masked),
        "full": scores(truth, pred, band_axis=1, data_range=rng),
    }


def score_files(truth: str, pred: str, band_axis: int = -1, data_range: float | None = None) -> dict:
    arrays = []
    for what, path in (("truth", truth), ("reconstruction", pred)):
        if not Path(path).exists():
            raise ReconError(f"{what} file not found: {path}")
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except (ValueError, OSError) as err:
            raise ReconError(f"cannot read {what} {path} as a .npy array: {err}") from err
    out = scores(arrays[0], arrays[1], band_axis, data_range)
    return {
        **out,
        "truth": str(truth),
        "reconstruction": str(pred),
        "band_axis": band_axis,
        "shape": list(arrays[0].shape),
    }


def write_json(data: dict, output: str | Path) -> Path:
    with atomic_path(output) as tmp:
        tmp.write_text(jsonio.dumps(data, indent=1))
    return Path(output)
