"""Small files in the layouts of today's hyperspectral products, written with the writers the
missions' own tools use (rasterio/GDAL for EnMAP's GeoTIFF, h5py for PRISMA's HDF-EOS5,
netCDF4 with groups for EMIT). Layouts as documented in src/dchag/hsi/products.py; the band
centres are evenly spaced stand-ins over each sensor's ranges (not the flight calibrations),
and the spectra are mixtures of the library spectra shipped with Spectral Python."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dchag.hsi import demo

ENMAP_NAME = "ENMAP01-____L2A-DT0000001867_20220724T104526Z_008_V010302_20230628T165614Z"


def reflectance(rows: int, cols: int, centres: np.ndarray, fwhm: np.ndarray, seed: int) -> np.ndarray:
    """(rows, cols, bands) surface reflectance (0-1): library spectra mixed with smooth abundances."""
    rng = np.random.default_rng(seed)
    em = demo.endmembers(centres, fwhm)
    from scipy.ndimage import gaussian_filter

    logits = np.stack([gaussian_filter(rng.standard_normal((rows, cols)), 3, mode="wrap") for _ in em])
    ab = np.exp(3 * logits / logits.std(axis=(1, 2), keepdims=True))
    ab /= ab.sum(0, keepdims=True)
    return np.einsum("mrc,mb->rcb", ab, em) * (1 + 0.02 * rng.standard_normal((rows, cols, 1)))


# -- EnMAP ---------------------------------------------------------------------------------------
def enmap_bands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centres, fwhm, bad) of 224 EnMAP-like bands, by increasing wavelength: 91 VNIR bands over
    418-993 nm and 133 SWIR bands over 902-2445 nm (gaps at the strongest water absorptions),
    the detectors interleaved where they overlap; 6 bad bands."""
    spacing = np.linspace(4.7, 8.1, 90)
    vnir = 418.4 + np.concatenate([[0], np.cumsum(spacing)])
    swir = np.concatenate([np.linspace(902, 1391, 41), np.linspace(1461, 1760, 28), np.linspace(1939, 2445, 64)])
    centres = np.concatenate([vnir, swir])
    fwhm = np.concatenate([np.full(91, 6.5), np.full(133, 10.0)])
    order = np.argsort(centres, kind="stable")
    centres, fwhm = centres[order], fwhm[order]
    bad = np.zeros(224, bool)
    bad[np.argsort(np.abs(centres - 1380))[:3]] = True
    bad[np.argsort(np.abs(centres - 1945))[:3]] = True
    return centres, fwhm, bad


def enmap_outside(rows: int, cols: int) -> np.ndarray:
    """The no-data corners of a north-up frame around a tilted swath."""
    r, c = np.mgrid[:rows, :cols]
    return (r + c < 6) | ((rows - 1 - r) + (cols - 1 - c) < 6)


def write_enmap(folder: Path, rows: int = 40, cols: int = 48, seed: int = 0, xml: bool = True) -> Path:
    """An EnMAP L2A product: ``-SPECTRAL_IMAGE.TIF`` (int16, reflectance x 10000, -32768 outside
    the scene and in every pixel of the bad bands) and, with ``xml``, ``-METADATA.XML``
    (band characterisation, gain 0.0001, background value). Without it the GeoTIFF carries the
    band centres and widths as GDAL metadata: ENVI-style band items ``wavelength``/``fwhm``/
    ``wavelength_units`` and GDAL's IMAGERY domain, and the gain as the bands' scale."""
    import rasterio

    folder.mkdir(parents=True, exist_ok=True)
    centres, fwhm, bad = enmap_bands()
    dn = np.round(reflectance(rows, cols, centres, fwhm, seed) * 10000).astype(np.int16)
    dn[enmap_outside(rows, cols)] = -32768
    dn[:, :, bad] = -32768
    tif = folder / f"{ENMAP_NAME}-SPECTRAL_IMAGE.TIF"
    profile = {
        "driver": "GTiff",
        "dtype": "int16",
        "count": 224,
        "height": rows,
        "width": cols,
        "nodata": -32768,
        "crs": "EPSG:32633",
        "transform": rasterio.Affine(30.0, 0.0, 366000.0, 0.0, -30.0, 5808000.0),  # 30 m, north-up
        "interleave": "band",
    }
    with rasterio.open(tif, "w", **profile) as dst:
        dst.write(np.moveaxis(dn, -1, 0))
        if not xml:
            for b in range(224):
                dst.update_tags(
                    b + 1, wavelength=f"{centres[b]:.3f}", fwhm=f"{fwhm[b]:.3f}", wavelength_units="Nanometers"
                )
                dst.update_tags(
                    b + 1,
                    ns="IMAGERY",
                    CENTRAL_WAVELENGTH_UM=f"{centres[b] / 1000:.6f}",
                    FWHM_UM=f"{fwhm[b] / 1000:.6f}",
                )
            dst.scales = [0.0001] * 224
            dst.offsets = [0.0] * 224
    if xml:
        bands = "\n".join(
            f'      <bandID number="{b + 1}">\n'
            f"        <wavelengthCenterOfBand>{centres[b]:.3f}</wavelengthCenterOfBand>\n"
            f"        <FWHMOfBand>{fwhm[b]:.3f}</FWHMOfBand>\n"
            "        <GainOfBand>0.0001</GainOfBand>\n"
            "        <OffsetOfBand>0</OffsetOfBand>\n"
            "      </bandID>"
            for b in range(224)
        )
        (folder / f"{ENMAP_NAME}-METADATA.XML").write_text(
            '<?xml version="1.0" encoding="UTF-8"?>\n<level_X>\n  <specific>\n'
            "    <backgroundValue>-32768</backgroundValue>\n"
            f"    <bandCharacterisation>\n{bands}\n    </bandCharacterisation>\n  </specific>\n</level_X>\n"
        )
    return tif


# -- PRISMA --------------------------------------------------------------------------------------
PRISMA_NAME = "PRS_L2D_STD_20230601101010_20230601101014_0001.he5"
PRISMA_SCALE = {"Vnir": (0.0, 1.0), "Swir": (-0.01, 0.8)}  # L2Scale<det>Min, Max


def prisma_bands() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(List_Cw, List_Fwhm) per detector as PRISMA lists them: decreasing wavelength, unused
    bands 0 (VNIR 66 of which 3 unused over 402-1010 nm, SWIR 173 of which 2 over 920-2505)."""
    vnir = np.concatenate([np.zeros(3), np.linspace(1010, 402, 63)])
    swir = np.concatenate([np.linspace(2505, 920, 171), np.zeros(2)])
    return {
        "Vnir": (vnir, np.where(vnir > 0, 12.0, 0.0)),
        "Swir": (swir, np.where(swir > 0, 11.0, 0.0)),
    }


def prisma_outside(rows: int, cols: int) -> np.ndarray:
    r, c = np.mgrid[:rows, :cols]
    return c + r < 5


def write_prisma(folder: Path, rows: int = 32, cols: int = 40, seed: int = 1) -> Path:
    """A PRISMA L2D .he5: VNIR and SWIR cubes (rows, bands, cols) uint16 under
    HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields, geolocation fields, and the file attributes with
    the band lists, scale factors and corner coordinates; DN 0 in every band outside the scene."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PRISMA_NAME
    outside = prisma_outside(rows, cols)
    with h5py.File(path, "w") as f:
        swath = f.create_group("HDFEOS/SWATHS/PRS_L2D_HCO")
        fields = swath.create_group("Data Fields")
        geo = swath.create_group("Geolocation Fields")
        for det, (cw, fw) in prisma_bands().items():
            lo, hi = PRISMA_SCALE[det]
            refl = reflectance(rows, cols, np.where(cw > 0, cw, 1000.0), np.where(fw > 0, fw, 10.0), seed)
            dn = np.clip(np.round((refl - lo) / (hi - lo) * 65535), 1, 65535).astype(np.uint16)
            dn[:, :, cw == 0] = 0
            dn[outside] = 0
            fields.create_dataset(f"{det.upper()}_Cube", data=np.transpose(dn, (0, 2, 1)))  # (rows, bands, cols)
            fields.create_dataset(f"{det.upper()}_PIXEL_L2_ERR_MATRIX", data=np.zeros((rows, cw.size, cols), np.uint8))
            f.attrs[f"List_Cw_{det}"] = cw.astype(np.float32)
            f.attrs[f"List_Fwhm_{det}"] = fw.astype(np.float32)
            f.attrs[f"List_Cw_{det}_Flags"] = (cw > 0).astype(np.int8)
            f.attrs[f"L2Scale{det}Min"] = np.float32(lo)
            f.attrs[f"L2Scale{det}Max"] = np.float32(hi)
        lat, lon = np.mgrid[45.0 : 45.0 - rows * 3e-4 : -3e-4, 9.0 : 9.0 + cols * 4e-4 : 4e-4]
        geo.create_dataset("Latitude", data=lat[:rows, :cols].astype(np.float32))
        geo.create_dataset("Longitude", data=lon[:rows, :cols].astype(np.float32))
        f.attrs["Processing_Level"] = np.bytes_("2D")
        f.attrs["Epsg_Code"] = np.int32(32632)
        f.attrs["Product_ULcorner_easting"] = np.float64(500015.0)
        f.attrs["Product_ULcorner_northing"] = np.float64(4985985.0)
        f.attrs["Product_LRcorner_easting"] = np.float64(500015.0 + 30 * (cols - 1))
        f.attrs["Product_LRcorner_northing"] = np.float64(4985985.0 - 30 * (rows - 1))
    return path


def prisma_reflectance(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Reference: each detector's cube, bands by increasing wavelength with the unused ones left
    out, converted by PRISMA's rule value = Min + DN (Max - Min) / 65535 (computed here
    independently of dchag); returns (centres, reflectance (rows, cols, bands)) of VNIR + SWIR."""
    import h5py

    cws, cubes = [], []
    with h5py.File(path, "r") as f:
        for det in ("Vnir", "Swir"):
            cw = np.asarray(f.attrs[f"List_Cw_{det}"], float)
            dn = np.transpose(f[f"HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields/{det.upper()}_Cube"][:], (0, 2, 1))
            lo, hi = float(f.attrs[f"L2Scale{det}Min"]), float(f.attrs[f"L2Scale{det}Max"])
            order = [i for i in np.argsort(cw) if cw[i] > 0]
            cws.append(cw[order])
            cubes.append(lo + dn[:, :, order].astype(float) * (hi - lo) / 65535)
    return np.concatenate(cws), np.concatenate(cubes, axis=2)


# -- EMIT ----------------------------------------------------------------------------------------
EMIT_NAME = "EMIT_L2A_RFL_001_20230316T045133_2307503_005.nc"


def emit_bands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wavelengths, fwhm, good) of EMIT's 285 bands over 381-2493 nm; bad bands where EMIT's
    own converter marks them when a header has no bbl (1325-1435 and 1770-1962 nm)."""
    wl = np.linspace(381.0, 2493.0, 285)
    good = ~(((wl > 1325) & (wl < 1435)) | ((wl > 1770) & (wl < 1962)))
    return wl, np.full(285, 8.5), good.astype(np.uint8)


def write_emit(folder: Path, rows: int = 36, cols: int = 30, seed: int = 2) -> tuple[Path, np.ndarray]:
    """An EMIT L2A reflectance netCDF4: reflectance(downtrack, crosstrack, bands) with fill
    -9999, the sensor_band_parameters and location groups; returns (path, fill mask)."""
    import netCDF4

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / EMIT_NAME
    wl, fwhm, good = emit_bands()
    refl = reflectance(rows, cols, wl, fwhm, seed).astype(np.float32)
    fill = np.zeros((rows, cols), bool)
    fill[5:8, 20:23] = True  # a few dropped frames' pixels
    refl[fill] = -9999.0
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.createDimension("downtrack", rows)
        nc.createDimension("crosstrack", cols)
        nc.createDimension("bands", wl.size)
        nc.createDimension("ortho_y", rows + 4)
        nc.createDimension("ortho_x", cols + 4)
        nc.title = "EMIT L2A Estimated Surface Reflectance 60 m V001"
        nc.geotransform = np.array([-104.6, 0.000542232520256, 0.0, 32.5, 0.0, -0.000542232520256])
        nc.spatial_ref = 'GEOGCS["WGS 84",DATUM["WGS_1984"]]'
        v = nc.createVariable("reflectance", "f4", ("downtrack", "crosstrack", "bands"), fill_value=-9999.0)
        v.long_name = "Hemispherical-Directional Reflectance Factor"
        v.units = "unitless"
        v[:] = refl
        sbp = nc.createGroup("sensor_band_parameters")
        w = sbp.createVariable("wavelengths", "f4", ("bands",), fill_value=-9999.0)
        w.units = "nm"
        w[:] = wl
        fw = sbp.createVariable("fwhm", "f4", ("bands",), fill_value=-9999.0)
        fw.units = "nm"
        fw[:] = fwhm
        g = sbp.createVariable("good_wavelengths", "u1", ("bands",))
        g.long_name = "Wavelengths where reflectance is useable: 1 = good data, 0 = bad data"
        g[:] = good
        loc = nc.createGroup("location")
        for name in ("lat", "lon", "elev"):
            loc.createVariable(name, "f8", ("downtrack", "crosstrack"), fill_value=-9999.0)[:] = 0.0
        for name in ("glt_x", "glt_y"):
            loc.createVariable(name, "i4", ("ortho_y", "ortho_x"), fill_value=-9999)[:] = 0
    return path, fill


def write_label_tile(path: Path, labels: np.ndarray, like: Path | None = None, nodata: float | None = None) -> Path:
    """A one-band uint8 label GeoTIFF on the grid of the GeoTIFF ``like``."""
    import rasterio

    profile = {"driver": "GTiff", "dtype": "uint8", "count": 1, "height": labels.shape[0], "width": labels.shape[1]}
    if like is not None:
        with rasterio.open(like) as src:
            profile |= {"crs": src.crs, "transform": src.transform}
    if nodata is not None:
        profile["nodata"] = nodata
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(labels.astype(np.uint8)[None])
    return path


def write_image_tile(path: Path, cube: np.ndarray, origin: tuple[float, float], wavelengths: np.ndarray) -> Path:
    """A float32 reflectance GeoTIFF tile with ENVI-style wavelength band items."""
    import rasterio

    profile = {
        "driver": "GTiff",
        "dtype": "float32",
        "count": cube.shape[2],
        "height": cube.shape[0],
        "width": cube.shape[1],
        "crs": "EPSG:32633",
        "transform": rasterio.Affine(30.0, 0.0, origin[0], 0.0, -30.0, origin[1]),
        "nodata": -9999.0,
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.moveaxis(cube.astype(np.float32), -1, 0))
        for b, w in enumerate(wavelengths):
            dst.update_tags(b + 1, wavelength=f"{w:.2f}", wavelength_units="Nanometers")
    return path
