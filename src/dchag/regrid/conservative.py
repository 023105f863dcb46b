"""First-order conservative weights between regular lat-lon grids.

Cells are bounded by parallels and meridians (midway between grid points, clipped at the
poles), and the weight of a source cell in a destination cell is the fraction of the
destination cell's area it covers. On the sphere that area is separable,
(sin lat_hi - sin lat_lo) x (lon_hi - lon_lo), so the weights are a Kronecker product of a
latitude and a longitude overlap matrix. This is what WeatherBench 2 recommends for
coarsening; it conserves the area-weighted global mean exactly.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..grids import LatLonGrid, cell_edges


def _bounds(centres: np.ndarray, clip_to_poles: bool) -> np.ndarray:
    """(n, 2) lower/upper bound of each cell."""
    edges = cell_edges(centres, clip_to_poles)
    return np.sort(np.stack([edges[:-1], edges[1:]], axis=-1), axis=-1)


def _lat_overlap(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    s_dst = np.sin(np.deg2rad(dst))
    s_src = np.sin(np.deg2rad(src))
    lo = np.maximum(s_dst[:, None, 0], s_src[None, :, 0])
    hi = np.minimum(s_dst[:, None, 1], s_src[None, :, 1])
    area = np.clip(hi - lo, 0, None)
    return area / (s_dst[:, 1] - s_dst[:, 0])[:, None]


def _lon_overlap(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    total = np.zeros((dst.shape[0], src.shape[0]))
    for shift in (-720.0, -360.0, 0.0, 360.0, 720.0):
        lo = np.maximum(dst[:, None, 0], src[None, :, 0] + shift)
        hi = np.minimum(dst[:, None, 1], src[None, :, 1] + shift)
        total += np.clip(hi - lo, 0, None)
    return total / (dst[:, 1] - dst[:, 0])[:, None]


def conservative_weights(source: LatLonGrid, target: LatLonGrid) -> sp.csr_matrix:
    """Weights W (target.size x source.size), grids flattened in C order of (lat, lon) as stored."""
    w_lat = sp.csr_matrix(_lat_overlap(_bounds(target.lat, True), _bounds(source.lat, True)))
    w_lon = sp.csr_matrix(_lon_overlap(_bounds(target.lon, False), _bounds(source.lon, False)))
    w_lat.eliminate_zeros()
    w_lon.eliminate_zeros()
    return sp.kron(w_lat, w_lon, format="csr")
