"""Regridding between regular lat-lon grids: ESMF-compatible bilinear and conservative weights,
stored in ESMF's weights-file format and applied as a sparse matrix."""

from .backends import load_or_build
from .weights import METHODS, RegridWeights, WeightsError

__all__ = ["METHODS", "RegridWeights", "WeightsError", "load_or_build"]
