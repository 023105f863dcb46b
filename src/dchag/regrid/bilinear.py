"""Bilinear regridding weights by ESMF's rule, computed without ESMF.

ESMF (and so xESMF's ``"bilinear"``) interpolates in 3-D, not in lat/lon space:

* grid points are unit vectors on the sphere (the poles exactly (0, 0, +-1));
* a source cell is the flat bilinear patch spanned by its four corner vectors, edges being
  straight chords (ESMF's Cartesian line type);
* a destination point's parametric coordinates (s, t) in its cell are where the ray from the
  centre of the sphere through the point meets that patch (a small Newton solve here);
* the weights are the bilinear shape functions of (s, t).

Collapsed cells at a pole row and the periodic wrap cell are ordinary cells under this rule.
A source grid whose rows stop short of a pole gets ESMF's default artificial pole for
non-conservative methods (``ESMF_POLEMETHOD_ALLAVG``): triangles from the last row to the
pole, the pole's value being the mean of that row, so the pole's share is spread evenly
over the row.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..grids import GridError, LatLonGrid

_NEWTON_ITERATIONS = 30
_INSIDE_TOL = 1e-10


def unit_vectors(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """Points on the unit sphere, shape (..., 3); the poles map exactly to (0, 0, +-1)."""
    lat_deg, lon_deg = np.broadcast_arrays(np.asarray(lat_deg, dtype=np.float64), np.asarray(lon_deg, dtype=np.float64))
    lat = np.deg2rad(lat_deg)
    lon = np.deg2rad(lon_deg)
    cos_lat = np.cos(lat)
    xyz = np.stack([cos_lat * np.cos(lon), cos_lat * np.sin(lon), np.sin(lat)], axis=-1)
    pole = np.abs(np.abs(lat_deg) - 90.0) < 1e-12
    if np.any(pole):
        xyz[pole] = 0.0
        xyz[pole, 2] = np.sign(lat_deg[pole])
    return xyz


def _solve_patch(p00, p10, p01, p11, east, north):
    """(s, t) of the ray through each destination point on the bilinear patch of its cell.

    X(s, t) = p00 + s (p10 - p00) + t (p01 - p00) + s t (p00 - p10 - p01 + p11) meets the ray
    through the point p when X is parallel to p, i.e. when X has no component along the two
    tangent vectors ``east`` and ``north`` of p: two bilinear equations in (s, t).
    """
    b = p10 - p00
    c = p01 - p00
    d = p00 - p10 - p01 + p11
    coef = []
    for e in (east, north):
        coef.append(
            (
                np.einsum("ij,ij->i", p00, e),
                np.einsum("ij,ij->i", b, e),
                np.einsum("ij,ij->i", c, e),
                np.einsum("ij,ij->i", d, e),
            )
        )
    (a1, b1, c1, d1), (a2, b2, c2, d2) = coef
    s = np.full(p00.shape[0], 0.5)
    t = np.full(p00.shape[0], 0.5)
    for _ in range(_NEWTON_ITERATIONS):
        g1 = a1 + b1 * s + c1 * t + d1 * s * t
        g2 = a2 + b2 * s + c2 * t + d2 * s * t
        j11 = b1 + d1 * t
        j12 = c1 + d1 * s
        j21 = b2 + d2 * t
        j22 = c2 + d2 * s
        det = j11 * j22 - j12 * j21
        det = np.where(np.abs(det) < 1e-300, 1e-300, det)
        ds = (g1 * j22 - g2 * j12) / det
        dt = (j11 * g2 - j21 * g1) / det
        s = s - ds
        t = t - dt
        if max(np.max(np.abs(ds), initial=0.0), np.max(np.abs(dt), initial=0.0)) < 1e-15:
            break
    return s, t


def _solve_triangle(a, b, n, p):
    """Barycentric (u, v) of the ray through p on the plane of triangle (a, b, n): a + u(b-a) + v(n-a)."""
    m = np.stack([b - a, n - a, -p], axis=-1)  # (k, 3, 3)
    sol = np.linalg.solve(m, -a[..., None])[..., 0]
    return sol[:, 0], sol[:, 1]


def bilinear_weights(source: LatLonGrid, target: LatLonGrid) -> sp.csr_matrix:
    """Weights W (target.size x source.size) with out_flat = W @ in_flat.

    Both grids are flattened in C order of (lat, lon) as stored. The source must be a global,
    periodic regular lat-lon grid (any latitude order, any longitude origin).
    """
    nlat, nlon = source.shape
    lat_order = np.argsort(source.lat)
    lat_a = source.lat[lat_order]
    lon_mod = np.mod(source.lon, 360.0)
    lon_order = np.argsort(lon_mod)
    lon_a = lon_mod[lon_order]
    if np.any(np.diff(lon_a) <= 0):
        raise GridError("source longitudes repeat modulo 360 deg; drop the duplicated column first")

    def flat(ia, ja):
        return lat_order[ia] * nlon + lon_order[ja]

    tlat2, tlon2 = np.meshgrid(target.lat, target.lon, indexing="ij")
    tlat = tlat2.ravel()
    tlon = np.mod(tlon2.ravel(), 360.0)
    p = unit_vectors(tlat, tlon)
    rlat, rlon = np.deg2rad(tlat), np.deg2rad(tlon)
    east = np.stack([-np.sin(rlon), np.cos(rlon), np.zeros_like(rlon)], axis=-1)
    north = np.stack([-np.sin(rlat) * np.cos(rlon), -np.sin(rlat) * np.sin(rlon), np.cos(rlat)], axis=-1)

    # Longitude cell: meridians are great circles, so the lat-lon search is exact in s.
    j0 = np.searchsorted(lon_a, tlon, side="right") - 1
    j0 = np.where(j0 < 0, nlon - 1, j0)  # west of the first column: the periodic wrap cell
    j1 = (j0 + 1) % nlon
    # Latitude cell: chords bulge poleward of the parallels, so correct the first guess in 3-D.
    i0 = np.clip(np.searchsorted(lat_a, tlat, side="right") - 1, 0, nlat - 2)

    xyz = unit_vectors(lat_a[:, None], lon_a[None, :])  # (nlat, nlon, 3), sorted order
    for _ in range(4):
        s, t = _solve_patch(xyz[i0, j0], xyz[i0, j1], xyz[i0 + 1, j0], xyz[i0 + 1, j1], east, north)
        down = (t < -_INSIDE_TOL) & (i0 > 0)
        up = (t > 1 + _INSIDE_TOL) & (i0 < nlat - 2)
        if not (down.any() or up.any()):
            break
        i0 = i0 - down + up

    rows = [np.arange(tlat.size)] * 4
    cols = [flat(i0, j0), flat(i0, j1), flat(i0 + 1, j0), flat(i0 + 1, j1)]
    vals = [(1 - s) * (1 - t), s * (1 - t), (1 - s) * t, s * t]

    # Beyond the first or last source row: ESMF's artificial pole (ALLAVG).
    for beyond, edge_row, pole_z in (
        ((t > 1 + _INSIDE_TOL) & (i0 == nlat - 2), nlat - 1, 1.0),
        ((t < -_INSIDE_TOL) & (i0 == 0), 0, -1.0),
    ):
        if not beyond.any():
            continue
        if abs(abs(lat_a[edge_row]) - 90.0) < 1e-12:
            raise GridError("destination point beyond a source pole row; check the latitude coordinates")
        k = np.flatnonzero(beyond)
        a = xyz[edge_row, j0[k]]
        b = xyz[edge_row, j1[k]]
        n = np.zeros_like(a)
        n[:, 2] = pole_z
        u, v = _solve_triangle(a, b, n, p[k])
        for w in vals[:4]:  # the quad weights of these points are replaced
            w[k] = 0.0
        rows += [k, k, np.repeat(k, nlon)]
        cols += [flat(edge_row, j0[k]), flat(edge_row, j1[k]), np.tile(flat(edge_row, np.arange(nlon)), k.size)]
        vals += [1 - u - v, u, np.repeat(v / nlon, nlon)]

    w = sp.coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(target.size, source.size),
    ).tocsr()
    w.sum_duplicates()
    w.eliminate_zeros()
    return w
