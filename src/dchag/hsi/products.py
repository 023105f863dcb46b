"""Readers for the products of today's imaging-spectroscopy missions, each in its delivered
layout (the layouts relied on are written beside each reader).

* EnMAP L2A (DLR): ``ENMAP01-____L2A-...-SPECTRAL_IMAGE.TIF`` (or ``_COG.tiff``), a GeoTIFF of
  224 int16 bands, reflectance x 10000, fill value -32768 (outside the scene, and in every
  pixel of the bad bands), beside ``...-METADATA.XML`` with per band
  ``specific/bandCharacterisation/bandID[@number]/{wavelengthCenterOfBand, FWHMOfBand,
  GainOfBand, OffsetOfBand}`` and ``specific/backgroundValue``. Any other GeoTIFF/COG is read
  the same way from its GDAL metadata alone.
* PRISMA L2 (ASI, HDF-EOS5 ``.he5``): ``HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields/{VNIR,SWIR}_Cube``
  stored (rows, bands, cols) uint16, with the file's attributes ``List_Cw_Vnir``/``_Swir``
  (centres, nm, in the cube's band order, 0 for unused bands), ``List_Fwhm_*`` and
  ``L2Scale{Vnir,Swir}{Min,Max}`` (value = Min + DN (Max - Min) / 65535); a pixel whose bands
  are all 0 lies outside the scene.
* EMIT L2A (NASA JPL, LP DAAC netCDF4): ``reflectance(downtrack, crosstrack, bands)`` float32
  with ``_FillValue`` -9999, group ``sensor_band_parameters`` with ``wavelengths``, ``fwhm``
  (nm) and ``good_wavelengths`` (1 good, 0 bad), group ``location`` with the geometry lookup
  table to a map grid (``glt_x``/``glt_y``), which is not applied: the image stays in sensor
  geometry, rows down-track, columns cross-track.

What this relies on: the element and attribute paths that EnMAP-Box's product importers read
(EnMAP L2A METADATA.XML, PRISMA L2D) and that EMIT's own LP DAAC converter writes
(emit-sds/emit-utils ``daac_converter``, emit-sds-l2a ``output_conversion``); the GDAL band
metadata items of GDAL's ENVI driver and of GDAL >= 3.10's IMAGERY domain. No code is taken
from them.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np

from .image import HsiInputError, HyperspectralImage, LabelMap, check_band_list, to_nm

log = logging.getLogger(__name__)


# -- GeoTIFF / EnMAP ---------------------------------------------------------------------------
def _rasterio(path: str):
    try:
        import rasterio
    except ImportError:
        raise HsiInputError(f"reading the GeoTIFF {path} needs rasterio: pip install 'dchag[geotiff]'") from None
    return rasterio


def _open_tiff(path: str):
    rasterio = _rasterio(path)
    try:
        return rasterio.open(path)
    except rasterio.errors.RasterioIOError as err:
        raise HsiInputError(
            f"cannot open the GeoTIFF {path}: {err}; expected a readable (Cloud Optimized) GeoTIFF"
        ) from err


def _read(ds, path: str, **kwargs) -> np.ndarray:
    """``ds.read(**kwargs)``; a file that opens but whose pixels cannot be read (truncated,
    corrupt) is an error naming it."""
    try:
        return ds.read(**kwargs)
    except _rasterio(path).errors.RasterioError as err:
        raise HsiInputError(
            f"GeoTIFF {path}: its pixels cannot be read ({err}); the file is truncated or corrupt, download it again"
        ) from err


def enmap_metadata_xml(path: str | Path) -> Path | None:
    """The EnMAP product's ``-METADATA.XML`` beside its ``-SPECTRAL_IMAGE`` GeoTIFF, if there."""
    p = Path(path)
    m = re.match(r"(.*)-SPECTRAL_IMAGE", p.name, re.IGNORECASE)
    if not m:
        return None
    for suffix in ("-METADATA.XML", "-METADATA.xml"):
        cand = p.with_name(m.group(1) + suffix)
        if cand.exists():
            return cand
    return None


def read_enmap_xml(xml: Path, bands: int) -> dict:
    """Band centres, FWHM, gains, offsets and the background value from an EnMAP METADATA.XML.
    (ElementTree on a current expat refuses entity-expansion bombs.)"""
    try:
        root = ElementTree.parse(xml).getroot()
    except (ElementTree.ParseError, OSError) as err:
        raise HsiInputError(
            f"EnMAP metadata {xml} cannot be parsed ({err}); expected the product's METADATA.XML"
        ) from err
    items = root.findall("specific/bandCharacterisation/bandID")
    if not items:
        raise HsiInputError(f"EnMAP metadata {xml} has no specific/bandCharacterisation/bandID entries")
    items.sort(key=lambda e: int(e.get("number", 0)))
    if len(items) != bands:
        raise HsiInputError(f"EnMAP metadata {xml} describes {len(items)} bands; its image has {bands}")

    def column(tag: str) -> np.ndarray | None:
        texts = [e.findtext(tag) for e in items]
        if any(t is None for t in texts):
            return None
        try:
            return np.array([float(t) for t in texts])
        except ValueError:
            raise HsiInputError(f"EnMAP metadata {xml}: a {tag} is not a number") from None

    out = {k: column(t) for k, t in (("wl", "wavelengthCenterOfBand"), ("fwhm", "FWHMOfBand"))}
    out |= {k: column(t) for k, t in (("gain", "GainOfBand"), ("offset", "OffsetOfBand"))}
    if out["wl"] is None:
        raise HsiInputError(f"EnMAP metadata {xml}: a bandID has no wavelengthCenterOfBand")
    background = root.findtext("specific/backgroundValue")
    out["background"] = float(background) if background not in (None, "") else None
    return out


def _envi_list(text: str | None) -> list[str] | None:
    """'{1, 2, 3}' (GDAL's ENVI metadata domain) -> ['1', '2', '3']."""
    if not text:
        return None
    return [v for v in re.split(r"[,\s]+", text.strip().strip("{}")) if v]


def _band_items(ds, item: str, imagery: str | None) -> tuple[list | None, str | None]:
    """Per-band values of a GDAL metadata item and their units, from the band items
    (``wavelength``/``fwhm``/``bbl`` with ``wavelength_units``, as GDAL's ENVI driver and
    EnMAP-Box write them), the GDAL >= 3.10 IMAGERY domain (``CENTRAL_WAVELENGTH_UM``,
    ``FWHM_UM``), or the dataset's ENVI domain (``wavelength = {...}``)."""
    tags = [ds.tags(b) for b in ds.indexes]
    if all(item in t for t in tags):
        return [t[item] for t in tags], tags[0].get("wavelength_units")
    if imagery:
        im = [ds.tags(b, ns="IMAGERY") for b in ds.indexes]
        if all(imagery in t for t in im):
            return [t[imagery] for t in im], "micrometers"
    envi = ds.tags(ns="ENVI")
    values = _envi_list(envi.get(item) or envi.get(item + "s"))
    if values is not None:
        return values, envi.get("wavelength_units")
    return None, None


def _empty_bands(ds, nodata: float, path: str) -> np.ndarray:
    """True for each band that holds the fill value in every pixel (EnMAP's bad bands), read
    in row blocks of about 64 MB."""
    seen = np.zeros(ds.count, bool)
    from rasterio.windows import Window

    step = max(1, (64 << 20) // max(1, ds.width * ds.count * np.dtype(ds.dtypes[0]).itemsize))
    for r0 in range(0, ds.height, step):
        a = _read(ds, path, window=Window(0, r0, ds.width, min(step, ds.height - r0)))
        valid = ~np.isnan(a) if np.isnan(nodata) else a != nodata
        seen |= valid.reshape(ds.count, -1).any(axis=1)
        if seen.all():
            break
    return ~seen


def _georeference(ds) -> tuple[dict, bool]:
    """CRS and affine transform (x0, dx, rx, y0, ry, dy in GDAL's order) of a rasterio dataset,
    and whether its rows run south to north (then flipped to north-up on reading). A file
    without either (rasterio's identity transform, whose rows would seem to run south to north)
    has no georeference and is read as stored."""
    t = ds.transform
    if ds.crs is None and t.is_identity and not ds.gcps[0]:
        return {}, False
    flip = t.e > 0 and t.b == 0 and t.d == 0
    if flip:  # the first row of the flipped raster is the file's last
        gt = (t.c, t.a, t.b, t.f + t.e * ds.height, t.d, -t.e)
    else:
        gt = (t.c, t.a, t.b, t.f, t.d, t.e)
    crs = ds.crs.to_string() if ds.crs else None
    return {"crs": crs, "geotransform": [float(v) for v in gt], "rows_flipped_to_north_up": flip}, flip


def read_geotiff(path: str) -> HyperspectralImage:
    with _open_tiff(path) as ds:
        rows, cols, count = ds.height, ds.width, ds.count
        source = f"GeoTIFF {path}"
        xml = enmap_metadata_xml(path)
        nodata = ds.nodata
        meta: dict = {"product": "GeoTIFF"}
        scale = offset = fwhm = None
        if xml is not None:
            x = read_enmap_xml(xml, count)
            wl, fwhm, wl_source = x["wl"], x["fwhm"], f"EnMAP metadata {xml.name}"
            if x["gain"] is not None:
                scale, offset = x["gain"], x["offset"] if x["offset"] is not None else np.zeros(count)
            if nodata is None:
                nodata = x["background"]
            meta["product"] = "EnMAP L2A"
            meta["metadata_file"] = str(xml)
        else:
            values, units = _band_items(ds, "wavelength", "CENTRAL_WAVELENGTH_UM")
            wl = check_band_list(values, "wavelength", count, source)
            wl = to_nm(wl, units) if wl is not None else None
            values, f_units = _band_items(ds, "fwhm", "FWHM_UM")
            fwhm = check_band_list(values, "fwhm", count, source)
            fwhm = to_nm(fwhm, f_units or units) if fwhm is not None else None
            wl_source = f"GDAL metadata of {Path(path).name}"
            scales, offsets = np.asarray(ds.scales, float), np.asarray(ds.offsets, float)
            if not (np.all(scales == 1) and np.all(offsets == 0)):
                scale, offset = scales, offsets
        bbl_values, _ = _band_items(ds, "bbl", None)
        bbl = check_band_list(bbl_values, "bbl", count, source)
        bbl_source = f"the bbl items of {Path(path).name}"
        if bbl is None and nodata is not None:
            empty = _empty_bands(ds, nodata, path)
            if empty.any():
                bbl, bbl_source = (~empty).astype(float), f"bands of {Path(path).name} holding only the fill value"
        geo, flip = _georeference(ds)
        dtype = ds.dtypes[0]
    meta |= {
        "georeference": geo,
        "wavelength_source": wl_source if wl is not None else "",
        "bbl_source": bbl_source,
        "stored_dtype": dtype,
        "value_scale": (
            "physical = stored x GainOfBand + OffsetOfBand (EnMAP METADATA.XML)"
            if xml is not None and scale is not None
            else "physical = stored x scale + offset (GDAL band scale/offset)"
            if scale is not None
            else "values as stored (the file gives no scale)"
        ),
    }

    def raw(b: np.ndarray) -> np.ndarray:
        with _open_tiff(path) as src:
            a = _read(src, path, indexes=[int(i) + 1 for i in b])  # (n, rows, cols)
        a = np.moveaxis(a, 0, -1)
        return a[::-1] if flip else a

    return HyperspectralImage(
        path,
        (rows, cols, count),
        wl,
        bbl,
        fwhm,
        nodata=float(nodata) if nodata is not None else None,
        scale=scale,
        offset=offset,
        meta=meta,
        _raw=raw,
    )


def read_geotiff_labels(path: str) -> LabelMap:
    with _open_tiff(path) as ds:
        if ds.count != 1:
            raise HsiInputError(f"label GeoTIFF {path} has {ds.count} bands; expected one band of class numbers")
        geo, flip = _georeference(ds)
        values = _read(ds, path, indexes=1)
        nodata = ds.nodata
    return LabelMap(path, values[::-1] if flip else values, nodata, geo)


# -- PRISMA ------------------------------------------------------------------------------------
PRISMA_SWATH = re.compile(r"PRS_L2[BCD]_HCO")


def _prisma_detector(f, path: str, swath: str, det: str, name: str) -> dict:
    """One detector's cube of a PRISMA file: its key and shape, the file indices of its used
    bands by increasing wavelength, their centres and widths, its scale factors."""
    key = f"HDFEOS/SWATHS/{swath}/Data Fields/{det}_Cube"
    if key not in f:
        raise HsiInputError(f"{path}: no {key}; expected PRISMA's VNIR and SWIR cubes")
    shape = f[key].shape
    if len(shape) != 3:
        raise HsiInputError(f"{path}: {key} has shape {shape}; expected (rows, bands, cols)")
    attrs = {}
    for a in (f"List_Cw_{name}", f"List_Fwhm_{name}", f"L2Scale{name}Min", f"L2Scale{name}Max"):
        if a not in f.attrs:
            raise HsiInputError(f"{path}: no file attribute {a}; expected PRISMA's band list and scale factors")
        attrs[a] = np.asarray(f.attrs[a], dtype=np.float64).ravel()
    cw = check_band_list(attrs[f"List_Cw_{name}"], f"List_Cw_{name}", shape[1], f"{path} {det}_Cube")
    fw = check_band_list(attrs[f"List_Fwhm_{name}"], f"List_Fwhm_{name}", shape[1], f"{path} {det}_Cube")
    lo, hi = float(attrs[f"L2Scale{name}Min"][0]), float(attrs[f"L2Scale{name}Max"][0])
    bad = ~np.isfinite(cw) | (cw < 0)
    if bad.any() or not (cw > 0).any():
        found = f"{cw[bad][0]} at band {np.flatnonzero(bad)[0]}" if bad.any() else f"all {cw.size} are 0"
        raise HsiInputError(
            f"{path}: List_Cw_{name} gives no usable band centres ({found}); expected the {det} "
            "bands' centres in nm (0 for an unused band)"
        )
    used = np.flatnonzero(cw > 0)
    order = used[np.argsort(cw[used], kind="stable")]
    return {
        "key": key,
        "shape": shape,
        "index": order,
        "cw": cw[order],
        "fwhm": fw[order],
        "lo": lo,
        "hi": hi,
    }


def _prisma_bands(v: dict, s: dict, detector_overlap: str) -> tuple[np.ndarray, ...]:
    """Centres, widths, good-band list, scale and offset of the VNIR then SWIR bands; the
    detector not kept is marked bad where the two overlap."""
    wl = np.concatenate([v["cw"], s["cw"]])
    fwhm = np.concatenate([v["fwhm"], s["fwhm"]])
    nv, ns = v["cw"].size, s["cw"].size
    bbl = np.ones(wl.size)
    if detector_overlap == "swir" and ns:
        bbl[:nv][v["cw"] >= s["cw"].min()] = 0
    elif detector_overlap == "vnir" and nv:
        bbl[nv:][s["cw"] <= v["cw"].max()] = 0
    scale = np.concatenate([np.full(nv, (v["hi"] - v["lo"]) / 65535), np.full(ns, (s["hi"] - s["lo"]) / 65535)])
    offset = np.concatenate([np.full(nv, v["lo"]), np.full(ns, s["lo"])])
    return wl, fwhm, bbl, scale, offset


def read_prisma(path: str, detector_overlap: str) -> HyperspectralImage:
    """VNIR then SWIR bands, each by increasing wavelength, unused (0 nm) bands left out; the
    bands of the detector that ``detector_overlap`` does not keep are marked bad where the two
    overlap (``swir``: VNIR bands at or above the first SWIR centre; ``vnir``: SWIR bands at or
    below the last VNIR centre)."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise HsiInputError(f"{path}: not a readable HDF5 file ({err}); expected a PRISMA L2 product (.he5)") from err
    with f:
        swaths = f.get("HDFEOS/SWATHS")
        names = [n for n in (swaths.keys() if isinstance(swaths, h5py.Group) else []) if PRISMA_SWATH.fullmatch(n)]
        if len(names) != 1:
            raise HsiInputError(
                f"{path}: expected one PRISMA hyperspectral swath HDFEOS/SWATHS/PRS_L2D_HCO (or L2B/L2C), found "
                f"{names or 'none'}"
            )
        swath = names[0]
        parts = {det: _prisma_detector(f, path, swath, det, name) for det, name in (("VNIR", "Vnir"), ("SWIR", "Swir"))}
        rows, cols = parts["VNIR"]["shape"][0], parts["VNIR"]["shape"][2]
        if parts["SWIR"]["shape"][0] != rows or parts["SWIR"]["shape"][2] != cols:
            raise HsiInputError(
                f"{path}: VNIR cube {parts['VNIR']['shape']} and SWIR cube {parts['SWIR']['shape']} differ in size"
            )
        geo = {}
        for a in ("Epsg_Code", "Product_ULcorner_easting", "Product_ULcorner_northing",
                  "Product_LRcorner_easting", "Product_LRcorner_northing"):  # fmt: skip
            if a in f.attrs:
                geo[a] = np.asarray(f.attrs[a]).ravel()[0].item()
    v, s = parts["VNIR"], parts["SWIR"]
    nv = v["cw"].size
    wl, fwhm, bbl, scale, offset = _prisma_bands(v, s, detector_overlap)
    detector = np.array(["VNIR"] * nv + ["SWIR"] * s["cw"].size)
    file_index = np.concatenate([v["index"], s["index"]])

    def raw(b: np.ndarray) -> np.ndarray:
        out = np.empty((rows, cols, b.size), np.uint16)
        with h5py.File(path, "r") as h:
            for det in ("VNIR", "SWIR"):
                pos = np.flatnonzero(detector[b] == det)
                if not pos.size:
                    continue
                idx = file_index[b[pos]]
                uniq, inverse = np.unique(idx, return_inverse=True)  # h5py reads increasing indices
                block = h[parts[det]["key"]][:, uniq, :]  # (rows, n, cols)
                out[:, :, pos] = np.transpose(block, (0, 2, 1))[:, :, inverse]
        return out

    overlap = "SWIR kept, VNIR dropped" if detector_overlap == "swir" else "VNIR kept, SWIR dropped"
    return HyperspectralImage(
        path,
        (rows, cols, wl.size),
        wl,
        bbl,
        fwhm,
        zero_is_missing=True,
        scale=scale,
        offset=offset,
        meta={
            "product": f"PRISMA {swath[4:7]}",
            "wavelength_source": f"List_Cw_Vnir / List_Cw_Swir of {Path(path).name}",
            "bbl_source": f"the VNIR/SWIR overlap of {Path(path).name} ({overlap} there)",
            "band_order": f"VNIR {nv} then SWIR {s['cw'].size} bands, each by increasing wavelength; "
            "bands with centre 0 (unused) left out",
            "value_scale": "physical = L2ScaleMin + DN (L2ScaleMax - L2ScaleMin) / 65535, per detector",
            "missing_rule": "a pixel whose bands are all 0 lies outside the scene",
            "georeference": geo,
        },
        _raw=raw,
    )


# -- EMIT --------------------------------------------------------------------------------------
def read_emit(path: str) -> HyperspectralImage:
    import netCDF4

    try:
        nc = netCDF4.Dataset(path)
    except OSError as err:
        raise HsiInputError(f"{path}: not a readable netCDF file ({err}); expected an EMIT L2A product (.nc)") from err
    with nc:
        if "reflectance" not in nc.variables:
            raise HsiInputError(
                f"{path}: no variable 'reflectance'; expected EMIT L2A's reflectance(downtrack, crosstrack, bands)"
            )
        var = nc["reflectance"]
        if var.ndim != 3:
            raise HsiInputError(
                f"{path}: reflectance has dimensions {var.dimensions}; expected (downtrack, crosstrack, bands)"
            )
        rows, cols, bands = var.shape
        group = nc.groups.get("sensor_band_parameters")
        if group is None or "wavelengths" not in group.variables:
            raise HsiInputError(f"{path}: no sensor_band_parameters/wavelengths; expected EMIT L2A's band table")
        source = f"{path} sensor_band_parameters"
        wl = check_band_list(np.asarray(group["wavelengths"][:], float), "wavelengths", bands, source)
        fwhm = (
            check_band_list(np.asarray(group["fwhm"][:], float), "fwhm", bands, source)
            if "fwhm" in group.variables
            else None
        )
        good = group["good_wavelengths"][:] if "good_wavelengths" in group.variables else None
        bbl = check_band_list(np.asarray(good, float), "good_wavelengths", bands, source) if good is not None else None
        fill = getattr(var, "_FillValue", None)
        geo = _emit_grid(nc, path)
        dims = var.dimensions

    def raw(b: np.ndarray) -> np.ndarray:
        uniq, inverse = np.unique(b, return_inverse=True)
        with netCDF4.Dataset(path) as h:
            v = h["reflectance"]
            v.set_auto_maskandscale(False)  # the fill value is handled as a mask, not as NaN
            # one hyperslab of the band range, then the bands in numpy: netCDF4 reads a list of
            # band indices point by point (400 x 400 x 285: 12 s against 0.14 s)
            lo, hi = int(uniq[0]), int(uniq[-1])
            block = np.asarray(v[:, :, lo : hi + 1])[:, :, uniq - lo]
        return block[:, :, inverse]

    return HyperspectralImage(
        path,
        (rows, cols, bands),
        wl,
        bbl,
        fwhm,
        nodata=float(fill) if fill is not None else None,
        meta={
            "product": "EMIT L2A",
            "wavelength_source": f"sensor_band_parameters/wavelengths of {Path(path).name}",
            "bbl_source": f"sensor_band_parameters/good_wavelengths of {Path(path).name}",
            "value_scale": "reflectance as stored (fraction)",
            "geometry": f"sensor geometry: rows {dims[0]}, columns {dims[1]}; the location group's "
            "glt_x/glt_y (map grid lookup) not applied",
            "georeference": geo,
        },
        _raw=raw,
    )


def _emit_grid(nc, path: str) -> dict:
    """EMIT's map grid: the global ``geotransform`` (six numbers in GDAL's order, an array
    attribute or its text) and ``spatial_ref`` (WKT) describe the grid of the location group's
    lookup table, not the sensor-geometry image, so they are kept under names of their own
    (``grid_geotransform``, ``grid_crs``) and no label raster is written on that grid."""
    attrs = nc.ncattrs()
    if "geotransform" not in attrs:
        return {}
    value = nc.geotransform
    text = value if isinstance(value, str) else " ".join(map(str, np.asarray(value).ravel()))
    numbers = re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf", text.strip("[]()"), re.IGNORECASE)
    gt = [float(v) for v in numbers]
    if len(gt) != 6 or not np.isfinite(gt).all() or gt[1] == 0 or gt[5] == 0:
        raise HsiInputError(
            f"{path}: geotransform = {text[:100]!r}; expected six finite numbers in GDAL's order "
            "(x0, dx, rx, y0, ry, dy)"
        )
    grid = {"grid_geotransform": gt, "grid": "the map grid of location/glt_x, glt_y (the image is in sensor geometry)"}
    if "spatial_ref" in attrs:
        grid["grid_crs"] = str(nc.spatial_ref)
    return grid
