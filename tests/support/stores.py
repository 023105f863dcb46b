"""What a test reads back from a Zarr store as written on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

# Arrays that are not float32 fields on purpose: a climatology part's float64 time sum (summed
# over the parts, then divided by the step count; temporary).
NOT_FIELDS = {"time_sum"}


def float_arrays(store: str | Path) -> dict[str, np.dtype]:
    """Every floating-point array of a Zarr store with 2 or more dimensions (a field: not a
    per-channel, per-band or per-sample coordinate), by path, with its dtype on disk."""
    found = {}

    def walk(group: zarr.Group, prefix: str) -> None:
        for name, member in group.members():
            path = f"{prefix}{name}"
            if isinstance(member, zarr.Group):
                walk(member, f"{path}/")
            elif member.dtype.kind == "f" and member.ndim >= 2 and name not in NOT_FIELDS:
                found[path] = member.dtype

    walk(zarr.open_group(store=str(store), mode="r"), "")
    return found
