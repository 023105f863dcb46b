"""The hyperspectral stores: one Zarr v3 store with a group per split (``train``, ``val``,
``test``), chunked by band groups so a tensor-parallel rank reads only its bands, written
under a temporary name and renamed when complete. The arrays are laid out at their full size
first and filled block by block (an image or tile at a time), so no split is ever held in
memory whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from ..store import compressors
from .bands import BandSelection
from .splits import SPLITS


def band_coords(sel: BandSelection, mean, std, fwhm: np.ndarray | None, bounds=None) -> dict:
    """The per-band coordinates of a store; ``bounds``: the (low, high) percentile clip values
    of the normalisation (hsi.clip_percentiles), None where none was applied."""
    wl = sel.wavelengths if sel.wavelengths is not None else np.full(sel.keep.size, np.nan)
    fw = fwhm if fwhm is not None else np.full(sel.keep.size, np.nan)
    none = "none: the input has no wavelengths"
    return {
        "band": ("band", sel.keep.astype(np.int32), {"description": "0-based index of the band in the input file"}),
        "sensor_band": (
            "band",
            sel.sensor_bands.astype(np.int32),
            {"description": "1-based band number in the sensor's numbering"},
        ),
        "wavelength": ("band", wl, {"units": "nm", "source": sel.wavelength_source or none}),
        "fwhm": ("band", fw, {"units": "nm", "description": "full width at half maximum (NaN: not in the input)"}),
        "mean": ("band", mean),
        "std": ("band", std),
        **(
            {
                "clip_low": ("band", np.asarray(bounds[0]), {"description": "values below were clipped to it"}),
                "clip_high": ("band", np.asarray(bounds[1]), {"description": "values above were clipped to it"}),
            }
            if bounds is not None
            else {}
        ),
    }


def band_attrs(sel: BandSelection, num_input_bands: int) -> dict:
    return {
        "band_selection": sel.how,
        "kept_bands_1based": sel.sensor_bands.tolist(),
        "kept_bands_numbering": "the sensor's band numbers (1-based)",
        "num_input_bands": num_input_bands,
        "wavelength_source": sel.wavelength_source or "none: the input has no wavelengths",
    }


class SplitWriter:
    """Writes ``var`` (sample, band, y, x) float32 and per-sample variables into a split group
    of the store at ``path`` (a temporary path of ``atomic_path``)."""

    def __init__(
        self,
        path: Path,
        var: str,
        sizes: dict[str, int],
        sample_shape: tuple[int, int, int],
        extra: dict[str, np.dtype],
        coords: dict,
        attrs: dict[str, dict],
        band_chunk: int,
    ):
        import dask.array as da

        self.path, self.var, self.extra = path, var, extra
        self.filled = dict.fromkeys(SPLITS, 0)
        self.sizes = sizes
        bands = sample_shape[0]
        for split in SPLITS:
            n = sizes[split]
            rows = max(1, min(n, 256))
            chunks = (rows, min(band_chunk, bands), *sample_shape[1:])
            data = {var: (("sample", "band", "y", "x"), da.zeros((n, *sample_shape), dtype=np.float32, chunks=chunks))}
            for name, dtype in extra.items():
                data[name] = ("sample", da.zeros(n, dtype=dtype, chunks=rows))
            ds = xr.Dataset(data, coords=coords, attrs=attrs[split])
            ds.to_zarr(
                path,
                group=split,
                zarr_format=3,
                consolidated=False,
                compute=False,
                encoding={var: {"chunks": chunks, "compressors": compressors()}},
                mode="a" if Path(path).exists() else "w",
            )

    def write(self, split: str, samples: np.ndarray, **values: np.ndarray) -> None:
        """Append ``samples`` (n, band, y, x) and their per-sample values to ``split``."""
        n = len(samples)
        if n == 0:
            return
        start = self.filled[split]
        data = {self.var: (("sample", "band", "y", "x"), samples.astype(np.float32, copy=False))}
        for name, dtype in self.extra.items():
            data[name] = ("sample", np.asarray(values[name]).astype(dtype))
        xr.Dataset(data).to_zarr(
            self.path, group=split, region={"sample": slice(start, start + n)}, zarr_format=3, consolidated=False
        )
        self.filled[split] = start + n

    def check_complete(self) -> None:
        if self.filled != self.sizes:  # a bug, not a user error: every planned sample is written once
            raise RuntimeError(f"hsi store {self.path}: wrote {self.filled} samples, planned {self.sizes}")
