"""Who computes the weights: ESMF through xESMF when it is importable, else this package.

Either way the result is the same sparse matrix in the same file format, applied by the same
code (:class:`~dchag.regrid.weights.RegridWeights`), so the two backends differ only in who
did the geometry. xESMF needs ESMPy, which is on conda-forge only (``envs/preprocess.yaml``).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import xarray as xr

from ..errors import DchagError
from ..grids import LatLonGrid, cell_edges
from .weights import RegridWeights

BACKENDS = ("auto", "xesmf", "builtin")


class BackendUnavailable(DchagError, RuntimeError):
    """The regridding backend asked for is not installed."""


def xesmf_available() -> bool:
    return importlib.util.find_spec("xesmf") is not None and importlib.util.find_spec("esmpy") is not None


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise BackendUnavailable(f"unknown regrid backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "xesmf" if xesmf_available() else "builtin"
    if backend == "xesmf" and not xesmf_available():
        raise BackendUnavailable(
            "regrid backend 'xesmf' requested but xesmf/esmpy are not importable; install them from conda-forge "
            "(conda env create -f envs/preprocess.yaml) or use --backend builtin"
        )
    return backend


def _grid_dataset(grid: LatLonGrid) -> xr.Dataset:
    """Centres, and the cell edges xESMF's conservative method needs."""
    return xr.Dataset(
        coords={
            "lat": ("lat", grid.lat),
            "lon": ("lon", grid.lon),
            "lat_b": ("lat_b", cell_edges(grid.lat, clip_to_poles=True)),
            "lon_b": ("lon_b", cell_edges(grid.lon)),
        }
    )


def xesmf_weights(source: LatLonGrid, target: LatLonGrid, method: str) -> RegridWeights:
    import xesmf  # noqa: PLC0415 - optional dependency

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.nc"
        regridder = xesmf.Regridder(
            _grid_dataset(source), _grid_dataset(target), method, periodic=True, unmapped_to_nan=False
        )
        regridder.to_netcdf(os.fspath(path))
        weights = RegridWeights.from_netcdf(path, source, target, method)
    weights.origin = f"xesmf {xesmf.__version__}"
    return weights


def build_weights(source: LatLonGrid, target: LatLonGrid, method: str, backend: str = "auto") -> RegridWeights:
    chosen = resolve_backend(backend)
    if chosen == "xesmf":
        return xesmf_weights(source, target, method)
    weights = RegridWeights.build(source, target, method)
    weights.origin = "dchag builtin"
    return weights


def load_or_build(
    source: LatLonGrid,
    target: LatLonGrid,
    method: str,
    weights_file: str | os.PathLike | None = None,
    backend: str = "auto",
) -> RegridWeights:
    """Weights for ``source`` -> ``target``: from ``weights_file`` when it exists, else built
    by the backend (and written to ``weights_file`` when one is named)."""
    if weights_file is not None and Path(weights_file).exists():
        return RegridWeights.from_netcdf(weights_file, source, target, method)
    weights = build_weights(source, target, method, backend)
    if weights_file is not None:
        weights.to_netcdf(weights_file)
    return weights
