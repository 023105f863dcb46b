"""Samples cut from a cube: patches centred on labelled pixels (classification) and
non-overlapping tiles (masked autoencoding). A patch or tile that would hold a missing pixel
is not a sample."""

from __future__ import annotations

import numpy as np


def complete_windows(missing: np.ndarray, patch: int) -> np.ndarray:
    """True where the patch x patch window around a pixel holds no missing pixel. Patches are
    reflect-padded at the image edge, and the mirrored pixels lie inside the clipped window,
    so the window is taken clipped to the image."""
    from scipy.ndimage import maximum_filter

    if not missing.any():
        return np.ones(missing.shape, bool)
    return ~maximum_filter(missing.astype(np.uint8), size=patch, mode="nearest").astype(bool)


def extract_patches(cube: np.ndarray, centres: np.ndarray, patch: int) -> np.ndarray:
    """(rows, cols, bands) cube, flat centre indices -> (n, bands, patch, patch), reflect-padded."""
    h = patch // 2
    padded = np.pad(cube, ((h, h), (h, h), (0, 0)), mode="reflect")
    r, c = np.divmod(centres, cube.shape[1])
    out = np.empty((centres.size, cube.shape[2], patch, patch), np.float32)
    for i, (ri, ci) in enumerate(zip(r, c)):
        out[i] = padded[ri : ri + patch, ci : ci + patch].transpose(2, 0, 1)
    return out


def tile_grid(shape: tuple[int, ...], tile: int) -> list[tuple[int, int]]:
    """Top-left corners of the non-overlapping tiles of an image, row-major."""
    return [(r, c) for r in range(0, shape[0] - tile + 1, tile) for c in range(0, shape[1] - tile + 1, tile)]


def complete_tiles(missing: np.ndarray, corners: list[tuple[int, int]], tile: int) -> np.ndarray:
    """True for each tile without a missing pixel."""
    return np.array([not missing[r : r + tile, c : c + tile].any() for r, c in corners], bool)
