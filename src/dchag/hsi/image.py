"""A hyperspectral image as the readers give it (:class:`HyperspectralImage`: size, band
metadata, how to read bands), a label raster (:class:`LabelMap`), and the band-list helpers
the readers share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..store import InputError


class HsiInputError(InputError):
    pass


@dataclass
class HyperspectralImage:
    """One image: its size, band metadata and how to read bands of it.

    ``nodata`` is the raw value that marks a missing pixel (a pixel is missing when any read
    band holds it); ``zero_is_missing`` marks one whose read bands are all 0 (PRISMA's outside-
    the-scene fill). ``scale``/``offset`` (per band) turn raw values into physical ones.
    ``meta`` is recorded in the stores (product, value units, georeference)."""

    path: str
    shape: tuple[int, int, int]  # rows, cols, bands
    wavelengths: np.ndarray | None = None  # nm
    bbl: np.ndarray | None = None  # 1 = good band, 0 = bad
    fwhm: np.ndarray | None = None  # nm
    nodata: float | None = None
    zero_is_missing: bool = False
    scale: np.ndarray | None = None
    offset: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    _raw: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)

    def read_masked(self, bands: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(float32 (rows, cols, len(bands)) physical values, missing (rows, cols) bool).
        Missing pixels hold 0 in every band."""
        bands = np.asarray(bands, dtype=np.int64)
        try:
            raw = self._raw(bands)
        except HsiInputError:
            raise
        except Exception as err:
            raise HsiInputError(f"cannot read bands of {self.path}: {type(err).__name__}: {err}") from err
        missing = np.zeros(raw.shape[:2], bool)
        if self.nodata is not None:
            hit = np.isnan(raw) if np.isnan(self.nodata) else raw == self.nodata
            missing |= hit.any(axis=2)
        if self.zero_is_missing:
            missing |= (raw == 0).all(axis=2)
        cube = raw.astype(np.float32)
        if self.scale is not None:
            cube *= self.scale[bands].astype(np.float32)
        if self.offset is not None:
            cube += self.offset[bands].astype(np.float32)
        cube[missing] = 0
        return cube, missing

    def read(self, bands: np.ndarray) -> np.ndarray:
        """float32 (rows, cols, len(bands)) in physical units; an ENVI image reads only those bands."""
        return self.read_masked(bands)[0]


def to_nm(values, units: str | None) -> np.ndarray:
    """Wavelengths in nm from values in ``units`` (micrometres when the units say so, or when
    none are given and every value is below 30)."""
    wl = np.asarray(values, dtype=np.float64)
    units = (units or "").lower()
    if units.startswith(("micro", "um", "µm")) or (not units and wl.size and wl.max() < 30):
        wl = wl * 1000.0
    return wl


def check_band_list(values, name: str, bands: int, source: str) -> np.ndarray | None:
    """``values`` as a float array of one entry per band, or an error naming ``source``."""
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size != bands:
        raise HsiInputError(f"{source}: {arr.size} {name} values for {bands} bands; expected one per band")
    return arr


@dataclass
class LabelMap:
    """A ground-truth raster as stored: values not yet checked, the file's own nodata value
    (GeoTIFF nodata, ENVI data ignore value) and georeference where it has them."""

    path: str
    values: np.ndarray  # (rows, cols), the file's dtype
    nodata: float | None = None
    georeference: dict | None = None
