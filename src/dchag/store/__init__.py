"""dchag's files: opening inputs (:mod:`.inputs`), writing results atomically and only over
what dchag wrote (:mod:`.outputs`), its Zarr stores' format, writing and reading
(:mod:`.zarrstore`), and a job's memory while Zarr's threads work (:mod:`.malloc`)."""

from .inputs import (
    InputError,
    is_grib,
    normalise_layout,
    open_any,
    open_grib,
    select_channels,
)
from .malloc import bounded_malloc, release_freed_memory
from .outputs import (
    OWNER_ATTRIBUTE,
    OutputError,
    atomic_path,
    check_inputs,
    check_output,
    write_error,
    write_failure,
)
from .zarrstore import (
    STORE_FORMAT,
    absent_chunks,
    channel_chunks,
    compressors,
    day_of_year_encoding,
    open_store,
    open_zarr,
    reading,
    write_zarr,
)

__all__ = [
    "InputError",
    "OWNER_ATTRIBUTE",
    "OutputError",
    "STORE_FORMAT",
    "absent_chunks",
    "atomic_path",
    "bounded_malloc",
    "channel_chunks",
    "check_inputs",
    "check_output",
    "compressors",
    "day_of_year_encoding",
    "is_grib",
    "normalise_layout",
    "open_any",
    "open_grib",
    "open_store",
    "open_zarr",
    "reading",
    "release_freed_memory",
    "select_channels",
    "write_error",
    "write_failure",
    "write_zarr",
]
