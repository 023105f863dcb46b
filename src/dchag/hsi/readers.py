"""Hyperspectral readers: ENVI (.hdr + data, via Spectral Python, lazy) and MATLAB .mat
(v5 through scipy, v7.3/HDF5 through h5py), images as (rows, cols, bands)."""

from __future__ import annotations

import glob
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..store import InputError

log = logging.getLogger(__name__)


class HsiInputError(InputError):
    pass


@dataclass
class HyperspectralImage:
    path: str
    shape: tuple[int, int, int]  # rows, cols, bands
    wavelengths: np.ndarray | None = None  # nm
    bbl: np.ndarray | None = None
    _envi: object = field(default=None, repr=False)
    _array: np.ndarray | None = field(default=None, repr=False)

    def read(self, bands: np.ndarray) -> np.ndarray:
        """float32 (rows, cols, len(bands)); an ENVI image reads only those bands."""
        if self._envi is not None:
            try:
                out = self._envi.read_bands([int(b) for b in bands])
            except Exception as err:
                raise HsiInputError(f"cannot read bands of {self.path}: {type(err).__name__}: {err}") from err
            return np.asarray(out, dtype=np.float32)
        return np.asarray(self._array[:, :, bands], dtype=np.float32)


def _to_nm(values, units: str | None) -> np.ndarray:
    wl = np.asarray(values, dtype=np.float64)
    units = (units or "").lower()
    if units.startswith(("micro", "um", "µm")) or (not units and wl.max() < 30):
        wl = wl * 1000.0
    return wl


def read_envi(path: str) -> HyperspectralImage:
    import spectral.io.envi as envi

    hdr = Path(path)
    if hdr.suffix.lower() != ".hdr":
        hdr = hdr.with_suffix(".hdr") if hdr.with_suffix(".hdr").exists() else Path(str(path) + ".hdr")
    if not hdr.exists():
        raise HsiInputError(f"ENVI header not found for {path}")
    try:
        img = envi.open(str(hdr))
    except Exception as err:
        raise HsiInputError(f"cannot open ENVI image {hdr}: {type(err).__name__}: {err}") from err
    meta = img.metadata
    rows, cols, bands = img.shape
    expected = rows * cols * bands * np.dtype(img.dtype).itemsize + int(meta.get("header offset", 0))
    actual = Path(img.filename).stat().st_size
    if actual < expected:
        raise HsiInputError(
            f"ENVI header {hdr} and data {img.filename} disagree: the header describes {rows}x{cols}x{bands} "
            f"{np.dtype(img.dtype).name} ({expected} bytes), the data file has {actual} bytes"
        )
    wl = _to_nm(meta["wavelength"], meta.get("wavelength units")) if "wavelength" in meta else None
    bbl = np.asarray(meta["bbl"], dtype=float) if "bbl" in meta else None
    return HyperspectralImage(str(hdr), (rows, cols, bands), wl, bbl, _envi=img)


def _load_mat(path: str) -> dict:
    import scipy.io

    try:
        return {k: v for k, v in scipy.io.loadmat(path).items() if not k.startswith("__")}
    except NotImplementedError:  # MATLAB v7.3 is HDF5
        import h5py

        try:
            with h5py.File(path, "r") as f:
                # MATLAB stores column-major: h5py sees the dimensions reversed.
                return {k: np.asarray(f[k]).T for k in f.keys() if isinstance(f[k], h5py.Dataset)}
        except OSError as err:
            raise HsiInputError(f"MATLAB v7.3 file {path} is truncated or corrupt ({err}); download it again") from err
    except (ValueError, OSError, IndexError, TypeError) as err:
        size = Path(path).stat().st_size
        raise HsiInputError(f"MATLAB file {path} ({size} bytes) is truncated or corrupt: scipy.io.loadmat failed "
                            f"({type(err).__name__}: {err}); download it again") from err


def _mat_array(path: str, key: str | None, ndim: int) -> np.ndarray:
    """The ``ndim``-D numeric variable ``key`` of a .mat file. Copies that circulate sometimes
    rename the variable (``hyperimg_gt`` for ``paviaU_gt``): a file holding exactly one such
    variable gives it whatever its name, and the log says which."""
    if not Path(path).exists():
        raise HsiInputError(f"file not found: {path}")
    arrays = {k: v for k, v in _load_mat(path).items() if isinstance(v, np.ndarray) and v.ndim == ndim and v.dtype.kind in "uif"}
    if key is not None and key in arrays:
        return arrays[key]
    if len(arrays) == 1:
        name, array = next(iter(arrays.items()))
        if key is not None:
            log.warning("%s has no variable %r; using its only %d-D variable %r", path, key, ndim, name)
        return array
    wanted = f"no {ndim}-D variable {key!r}" if key is not None else f"{len(arrays)} {ndim}-D variables"
    raise HsiInputError(f"{path} has {wanted}; its {ndim}-D variables are {sorted(arrays)}"
                        + ("" if key is not None else "; name one (key)"))


def read_mat(path: str, key: str | None = None) -> HyperspectralImage:
    cube = _mat_array(path, key, 3)
    return HyperspectralImage(path, tuple(cube.shape), _array=cube)


def read_image(path: str, key: str | None = None) -> HyperspectralImage:
    if str(path).lower().endswith(".mat"):
        return read_mat(path, key)
    return read_envi(path)


def read_labels(path: str, key: str | None = None) -> np.ndarray:
    """(rows, cols) integer label map, 0 = unlabelled: a .mat ground truth or an ENVI image."""
    if str(path).lower().endswith(".mat"):
        labels = _mat_array(path, key, 2)
    else:
        img = read_envi(path)
        labels = img.read(np.arange(img.shape[2]))[:, :, 0]
    return np.asarray(labels).astype(np.int64)


def expand_images(patterns: list[str]) -> list[str]:
    """Paths and glob patterns -> sorted existing paths (a collection of many images)."""
    out = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if any(ch in pattern for ch in "*?[") else [pattern]
        if not matches:
            raise HsiInputError(f"no image matches {pattern!r}")
        out += matches
    missing = [p for p in out if not Path(p).exists()]
    if missing:
        raise HsiInputError(f"image file(s) not found: {', '.join(missing)}")
    return out
