"""dchag's files: opening inputs (:mod:`.inputs`), writing results atomically and only over
what dchag wrote (:mod:`.outputs`), its Zarr stores' format, writing and reading
(:mod:`.zarrstore`), and a job's memory while Zarr's threads work (:mod:`.malloc`).

Each name loads its module when first used (PEP 562), so that a command that only writes a file
atomically or names a bad input (a figure, a table of scores) does not import xarray and Zarr:
~0.5 CPU-s of each such command."""

import importlib

_NAMES = {
    "inputs": ("InputError", "is_grib", "normalise_layout", "open_any", "open_grib", "select_channels"),
    "malloc": ("bounded_malloc", "release_freed_memory"),
    "outputs": (
        "OWNER_ATTRIBUTE",
        "OutputError",
        "atomic_path",
        "check_inputs",
        "check_output",
        "write_error",
        "write_failure",
    ),
    "zarrstore": (
        "STORE_FORMAT",
        "absent_chunks",
        "channel_chunks",
        "compressors",
        "day_of_year_encoding",
        "open_store",
        "open_zarr",
        "reading",
        "write_zarr",
    ),
}
_MODULE = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_MODULE)


def __getattr__(name: str):
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
