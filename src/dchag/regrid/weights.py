"""Regridding weights as a sparse matrix: build, save and load in ESMF/xESMF's file format, apply.

The file format is the one xESMF writes (``Regridder.to_netcdf``) and ESMF's offline weight
generator uses: variables ``S``, ``row``, ``col`` on dimension ``n_s``, 1-based indices into
the target and source grids flattened in C order of (lat, lon) as stored. Files this package
writes also carry the two grids (``src_lat``, ``src_lon``, ``dst_lat``, ``dst_lon``) so a
weights file for another grid is caught on load; xESMF ignores the extra variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import xarray as xr

from .. import provenance
from ..errors import DchagError
from ..grids import GridError, LatLonGrid
from .bilinear import bilinear_weights, unit_vectors
from .conservative import conservative_weights

METHODS = ("bilinear", "conservative")


class WeightsError(DchagError, ValueError):
    """A weights file is unreadable or belongs to other grids."""


@dataclass
class RegridWeights:
    """W (target.size x source.size): out_flat = W @ in_flat."""

    matrix: sp.csr_matrix
    source: LatLonGrid
    target: LatLonGrid
    method: str
    origin: str = "dchag"

    def __post_init__(self) -> None:
        self.matrix = sp.csr_matrix(self.matrix)
        # The source latitude rows the weights touch: for bilinear coarsening a small subset,
        # so reading and multiplying only those rows is most of the speed.
        cols = np.unique(self.matrix.indices)
        self.source_rows = np.unique(cols // self.source.shape[1])
        nlon = self.source.shape[1]
        keep = (self.source_rows[:, None] * nlon + np.arange(nlon)[None, :]).ravel()
        compact = self.matrix[:, keep].tocsr()  # (target.size, rows * nlon)
        # One copy per dtype, so float32 data is multiplied without upcasting the whole field.
        self._compact = {np.dtype(np.float64): compact, np.dtype(np.float32): compact.astype(np.float32)}

    @classmethod
    def build(cls, source: LatLonGrid, target: LatLonGrid, method: str) -> RegridWeights:
        if method == "bilinear":
            matrix = bilinear_weights(source, target)
        elif method == "conservative":
            matrix = conservative_weights(source, target)
        else:
            raise WeightsError(f"unknown regrid method {method!r}; expected one of {', '.join(METHODS)}")
        return cls(matrix, source, target, method)

    def apply_rows(self, rows: np.ndarray) -> np.ndarray:
        """Regrid data holding only ``self.source_rows`` of the source:
        (..., len(rows), nlon) -> (..., nlat_t, nlon_t)."""
        lead = rows.shape[:-2]
        if rows.shape[-2:] != (self.source_rows.size, self.source.shape[1]):
            raise GridError(
                f"expected the {self.source_rows.size} weighted source rows x {self.source.shape[1]} longitudes, "
                f"got trailing shape {rows.shape[-2:]}"
            )
        dtype = np.dtype(np.float32) if rows.dtype.itemsize <= 4 and rows.dtype.kind == "f" else np.dtype(np.float64)
        flat = np.ascontiguousarray(rows.reshape(-1, rows.shape[-2] * rows.shape[-1]), dtype=dtype)
        out = (self._compact[dtype] @ flat.T).T
        return out.reshape(*lead, *self.target.shape)

    def apply(self, data: np.ndarray) -> np.ndarray:
        """Regrid an array whose last two axes are the source (lat, lon) as stored."""
        if data.shape[-2:] != self.source.shape:
            raise GridError(
                f"data grid shape {data.shape[-2:]} does not match the weights' source grid {self.source.shape}"
            )
        if self.source_rows.size == self.source.shape[0]:
            return self.apply_rows(data)  # every row is weighted (e.g. conservative): no gather
        return self.apply_rows(np.take(data, self.source_rows, axis=-2))

    # -- files ------------------------------------------------------------------------------
    def to_netcdf(self, path: str | os.PathLike) -> None:
        """Write atomically in the ESMF/xESMF layout (1-based row/col)."""
        coo = self.matrix.tocoo()
        ds = xr.Dataset(
            {
                "S": ("n_s", coo.data.astype(np.float64)),
                "row": ("n_s", (coo.row + 1).astype(np.int32)),
                "col": ("n_s", (coo.col + 1).astype(np.int32)),
                "src_lat": ("src_lat", self.source.lat),
                "src_lon": ("src_lon", self.source.lon),
                "dst_lat": ("dst_lat", self.target.lat),
                "dst_lon": ("dst_lon", self.target.lon),
            },
            attrs={
                "regrid_method": self.method,
                "periodic": "True",
                "generator": self.origin,
                "index_convention": "row/col are 1-based; row-1 = ilat*nlon_out + ilon of the target, "
                "col-1 = ilat*nlon_in + ilon of the source, both in the (lat, lon) order stored in src_*/dst_*",
                "source_shape_lat_lon": np.array(self.source.shape, dtype=np.int32),
                "target_shape_lat_lon": np.array(self.target.shape, dtype=np.int32),
                **provenance.as_attrs(
                    provenance.record(
                        {"method": self.method, "source": self.source.describe(), "target": self.target.describe()}
                    )
                ),
            },
        )
        from ..store import atomic_path

        with atomic_path(path) as tmp:
            ds.to_netcdf(tmp)

    @classmethod
    def from_netcdf(
        cls,
        path: str | os.PathLike,
        source: LatLonGrid,
        target: LatLonGrid,
        method: str | None = None,
    ) -> RegridWeights:
        """Load an ESMF/xESMF weights file for regridding ``source`` onto ``target``.

        Raises WeightsError naming the file if it was made for other grids: by the grids it
        records, by its shape attributes, or, for a bare xESMF file, by regridding the
        coordinate fields themselves and finding them misplaced.
        """
        path = Path(path)
        if not path.exists():
            raise WeightsError(f"weights file not found: {path}")
        try:
            with xr.open_dataset(path) as ds:
                ds.load()
        except Exception as err:  # netCDF/HDF5 raise many types for a corrupt file
            raise WeightsError(f"cannot read weights file {path}: {err}") from err
        missing = [v for v in ("S", "row", "col") if v not in ds]
        if missing:
            raise WeightsError(f"{path} is not an ESMF/xESMF weights file: missing variable(s) {missing}")
        for attr, grid, which in (
            ("source_shape_lat_lon", source, "source"),
            ("target_shape_lat_lon", target, "target"),
        ):
            if attr in ds.attrs and tuple(np.atleast_1d(ds.attrs[attr]).tolist()) != grid.shape:
                raise WeightsError(
                    f"weights file {path} is for a {which} grid of shape "
                    f"{tuple(np.atleast_1d(ds.attrs[attr]).tolist())}, but the {which} grid here is {grid.describe()}"
                )
        for prefix, grid, which in (("src", source, "source"), ("dst", target, "target")):
            if f"{prefix}_lat" in ds:
                recorded = LatLonGrid(ds[f"{prefix}_lat"].values, ds[f"{prefix}_lon"].values)
                if not recorded.same_as(grid):
                    raise WeightsError(
                        f"weights file {path} was made for the {which} grid {recorded.describe()}, "
                        f"but the {which} grid here is {grid.describe()}"
                    )
        row = ds["row"].values.astype(np.int64) - 1
        col = ds["col"].values.astype(np.int64) - 1
        if row.size and (row.min() < 0 or col.min() < 0 or row.max() >= target.size or col.max() >= source.size):
            raise WeightsError(
                f"weights file {path} indexes a target of >= {row.max() + 1} "
                f"and a source of >= {col.max() + 1} points, "
                f"but the target grid here is {target.describe()} and the source {source.describe()}"
            )
        matrix = sp.coo_matrix((ds["S"].values, (row, col)), shape=(target.size, source.size)).tocsr()
        weights = cls(matrix, source, target, method or str(ds.attrs.get("regrid_method", "unknown")), origin=str(path))
        weights.check_geometry(str(path))
        return weights

    def check_geometry(self, name: str) -> None:
        """Regrid the source's own unit-vector fields; misplaced results mean weights for other grids."""
        src = unit_vectors(*np.meshgrid(self.source.lat, self.source.lon, indexing="ij"))
        dst = unit_vectors(*np.meshgrid(self.target.lat, self.target.lon, indexing="ij"))
        got = self.apply(np.moveaxis(src, -1, 0))
        err = np.max(np.abs(got - np.moveaxis(dst, -1, 0)))
        if not np.isfinite(err) or err > 0.05:
            raise WeightsError(
                f"weights {name} do not map the source grid {self.source.describe()} onto the target grid "
                f"{self.target.describe()}: regridding the coordinate fields misplaces them by up to {err:.3g} "
                "(unit-sphere distance); they were made for other grids"
            )
