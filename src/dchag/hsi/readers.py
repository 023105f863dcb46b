"""Hyperspectral readers, images as (rows, cols, bands): ENVI (.hdr + data, via Spectral
Python, lazy), MATLAB .mat (v5 through scipy, v7.3/HDF5 through h5py), and the products of
today's missions (``products``: EnMAP L2A GeoTIFF, PRISMA L2 HDF5, EMIT L2A netCDF). Each
reader says which raw value marks a missing pixel; :meth:`HyperspectralImage.read_masked`
returns the cube in physical units with those pixels flagged (and zeroed, so no fill value is
ever normalised into a huge number)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from . import products
from .image import HsiInputError, HyperspectralImage, LabelMap, check_band_list, to_nm

log = logging.getLogger(__name__)

# What a file name ends with -> which reader; anything else is an ENVI data file or header.
MAT = (".mat",)
GEOTIFF = (".tif", ".tiff")
HDF5 = (".he5", ".h5", ".hdf5")
NETCDF = (".nc", ".nc4")
KNOWN = (
    "ENVI (.hdr + data), MATLAB .mat, GeoTIFF (.tif: EnMAP L2A or any), PRISMA L2 HDF5 (.he5), EMIT L2A netCDF (.nc)"
)
INTERLEAVES = ("bsq", "bil", "bip")


# -- ENVI --------------------------------------------------------------------------------------
def envi_header(path: str | Path) -> Path | None:
    """The ENVI header of ``path`` (itself, ``x.hdr`` beside ``x.img``, or ``x.img.hdr``), if any."""
    p = Path(path)
    if p.suffix.lower() == ".hdr":
        return p if p.exists() else None
    for cand in (p.with_suffix(".hdr"), Path(str(p) + ".hdr")):
        if cand.exists():
            return cand
    return None


def read_envi(path: str) -> HyperspectralImage:
    import spectral.io.envi as envi

    hdr = envi_header(path)
    if hdr is None:
        raise HsiInputError(f"{path}: not a recognised image ({KNOWN}), and no ENVI header beside it")
    try:
        code = str(envi.read_envi_header(str(hdr)).get("data type", "")).strip()
    except Exception as err:
        raise HsiInputError(f"cannot read ENVI header {hdr}: {type(err).__name__}: {err}") from err
    if code not in envi.envi_to_dtype:
        known = ", ".join(f"{k} ({np.dtype(v).name})" for k, v in envi.envi_to_dtype.items())
        raise HsiInputError(f"ENVI header {hdr}: data type = {code or '(none)'}; expected one of {known}")
    try:
        img = envi.open(str(hdr))
    except Exception as err:
        raise HsiInputError(f"cannot open ENVI image {hdr}: {type(err).__name__}: {err}") from err
    meta = img.metadata
    # Spectral Python reads an unknown interleave as bsq without a word: the cube would be
    # silently scrambled.
    interleave = str(meta.get("interleave", "bsq")).strip().lower()
    if interleave not in INTERLEAVES:
        raise HsiInputError(
            f"ENVI header {hdr}: interleave = {meta.get('interleave')!r}; expected one of {', '.join(INTERLEAVES)}"
        )
    rows, cols, bands = img.shape
    expected = rows * cols * bands * np.dtype(img.dtype).itemsize + int(meta.get("header offset", 0))
    actual = Path(img.filename).stat().st_size
    if actual < expected:
        raise HsiInputError(
            f"ENVI header {hdr} and data {img.filename} disagree: the header describes {rows}x{cols}x{bands} "
            f"{np.dtype(img.dtype).name} ({expected} bytes), the data file has {actual} bytes"
        )
    source = f"ENVI header {hdr}"
    wl = check_band_list(meta.get("wavelength"), "wavelength", bands, source)
    wl = to_nm(wl, meta.get("wavelength units")) if wl is not None else None
    fwhm = check_band_list(meta.get("fwhm"), "fwhm", bands, source)
    fwhm = to_nm(fwhm, meta.get("wavelength units")) if fwhm is not None else None
    bbl = check_band_list(meta.get("bbl"), "bbl", bands, source)
    nodata = None
    if "data ignore value" in meta:
        try:
            nodata = float(meta["data ignore value"])
        except (TypeError, ValueError):
            raise HsiInputError(
                f"{source}: data ignore value = {meta['data ignore value']!r}; expected a number"
            ) from None

    def raw(b: np.ndarray) -> np.ndarray:
        return np.asarray(img.read_bands([int(i) for i in b]))

    return HyperspectralImage(
        str(hdr),
        (rows, cols, bands),
        wl,
        bbl,
        fwhm,
        nodata=nodata,
        meta={"product": "ENVI", "interleave": interleave},
        _raw=raw,
    )


# -- MATLAB ------------------------------------------------------------------------------------
def _load_mat(path: str) -> dict:
    import scipy.io

    size = Path(path).stat().st_size
    if size == 0:
        raise HsiInputError(f"MATLAB file {path} is empty (0 bytes); download it again")
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
    except (ValueError, OSError, IndexError, TypeError, scipy.io.matlab.MatReadError) as err:
        raise HsiInputError(
            f"MATLAB file {path} ({size} bytes) is truncated or corrupt: scipy.io.loadmat failed "
            f"({type(err).__name__}: {err}); download it again"
        ) from err


def _mat_array(path: str, key: str | None, ndim: int) -> np.ndarray:
    """The ``ndim``-D numeric variable ``key`` of a .mat file. Copies that circulate sometimes
    rename the variable (``hyperimg_gt`` for ``paviaU_gt``): a file holding exactly one such
    variable gives it whatever its name, and the log says which."""
    if not Path(path).exists():
        raise HsiInputError(f"file not found: {path}")
    variables = _load_mat(path)
    what = "image (rows x cols x bands)" if ndim == 3 else "label map (rows x cols)"
    if not variables:
        raise HsiInputError(f"MATLAB file {path} holds no variable; expected a {ndim}-D numeric {what}")
    arrays = {
        k: v for k, v in variables.items() if isinstance(v, np.ndarray) and v.ndim == ndim and v.dtype.kind in "uif"
    }
    if key is not None and key in arrays:
        return arrays[key]
    if len(arrays) == 1:
        name, array = next(iter(arrays.items()))
        if key is not None:
            log.warning("%s has no variable %r; using its only %d-D variable %r", path, key, ndim, name)
        return array
    if not arrays:
        raise HsiInputError(
            f"MATLAB file {path} holds no {ndim}-D numeric variable (a {what}); its variables are {sorted(variables)}"
        )
    wanted = f"no {ndim}-D variable {key!r}" if key is not None else f"{len(arrays)} {ndim}-D variables"
    raise HsiInputError(
        f"{path} has {wanted}; its {ndim}-D variables are {sorted(arrays)}"
        + ("" if key is not None else "; name one (key)")
    )


def read_mat(path: str, key: str | None = None) -> HyperspectralImage:
    cube = _mat_array(path, key, 3)
    return HyperspectralImage(
        path, tuple(cube.shape), meta={"product": "MATLAB .mat"}, _raw=lambda b: np.asarray(cube[:, :, b])
    )


# -- dispatch ----------------------------------------------------------------------------------
def kind(path: str | Path) -> str:
    """Which reader a path takes: mat, geotiff, prisma, emit or envi (by its ending)."""
    name = str(path).lower()
    for k, ends in (("mat", MAT), ("geotiff", GEOTIFF), ("prisma", HDF5), ("emit", NETCDF)):
        if name.endswith(ends):
            return k
    return "envi"


def read_image(
    path: str, key: str | None = None, detector_overlap: str | None = None, nodata: float | None = None
) -> HyperspectralImage:
    """The image at ``path``, by its kind. ``key``: the variable of a .mat file;
    ``detector_overlap``: which detector a PRISMA product keeps where VNIR and SWIR overlap;
    ``nodata``: the raw missing-pixel value to use where the file declares none (or another)."""
    k = kind(path)
    if k != "envi" and not Path(path).exists():  # an ENVI image may be named by its header's stem
        raise HsiInputError(f"image file not found: {path}")
    if k == "mat":
        img = read_mat(path, key)
    elif k == "geotiff":
        img = products.read_geotiff(path)
    elif k == "prisma":
        if detector_overlap is None:
            raise ValueError("read_image: a PRISMA product needs detector_overlap (hsi.detector_overlap)")
        img = products.read_prisma(path, detector_overlap)
    elif k == "emit":
        img = products.read_emit(path)
    else:
        img = read_envi(path)
    if nodata is not None:
        if img.nodata is not None and img.nodata != nodata and not (np.isnan(img.nodata) and np.isnan(nodata)):
            log.warning("%s declares nodata %s; using hsi.nodata %s instead", img.path, img.nodata, nodata)
        img.nodata = float(nodata)
    if img.nodata is not None:
        img.meta["nodata"] = img.nodata
    return img


def read_labels(path: str, key: str | None = None) -> LabelMap:
    """(rows, cols) label raster, 0 = unlabelled: a .mat ground truth, a GeoTIFF or an ENVI image."""
    if not Path(path).exists():
        raise HsiInputError(f"label file not found: {path}")
    k = kind(path)
    if k == "mat":
        return LabelMap(path, np.asarray(_mat_array(path, key, 2)))
    if k == "geotiff":
        return products.read_geotiff_labels(path)
    if k in ("prisma", "emit"):
        raise HsiInputError(f"label file {path}: expected a .mat, GeoTIFF or ENVI label map, not a {k} product")
    img = read_envi(path)
    return LabelMap(img.path, np.asarray(img._raw(np.array([0])))[:, :, 0], img.nodata)
