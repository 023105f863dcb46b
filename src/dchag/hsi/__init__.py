"""Hyperspectral imaging: readers, band selection, normalisation, patches and tiles into Zarr."""
