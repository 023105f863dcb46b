"""Regridding between regular lat-lon grids: ESMF-compatible bilinear and conservative weights,
stored in ESMF's weights-file format and applied as a sparse matrix."""

from .weights import METHODS, RegridWeights, WeightsError, load_or_build

__all__ = ["METHODS", "RegridWeights", "WeightsError", "load_or_build"]
