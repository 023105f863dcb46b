"""What produced a result: the config, the package versions and the code revision.

Every store, checkpoint, score file and figure this package writes carries this record
(as attributes or metadata), so a result can be traced back and reproduced.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from . import __version__, jsonio

_PACKAGES = (
    "numpy",
    "scipy",
    "xarray",
    "zarr",
    "dask",
    "netCDF4",
    "h5py",
    "pandas",
    "torch",
    "snakemake",
    "xesmf",
    "esmpy",
    "spectral",
    "scikit-learn",
    "matplotlib",
)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "dchag": __version__}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def code_revision() -> str:
    """git describe of the checkout the package runs from, '+dirty' when it has changes."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"


def record(config: Any = None, **extra: Any) -> dict[str, Any]:
    """The provenance record: JSON-serialisable."""
    rec = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "code_revision": code_revision(),
        "packages": package_versions(),
        "command": " ".join(sys.argv),
        "config": config,
    }
    rec.update(extra)
    return json.loads(jsonio.dumps(rec))


def as_attrs(rec: dict[str, Any]) -> dict[str, str]:
    """Flat string attributes for netCDF/Zarr, which cannot hold nested dicts portably."""
    return {"provenance": json.dumps(rec, sort_keys=True)}
