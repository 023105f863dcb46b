"""ERA5: reading CDS/ARCO-ERA5 files, regridding to the WeatherBench grid, normalising into Zarr."""
