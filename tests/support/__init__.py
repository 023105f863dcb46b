"""What the tests share (tests/ is on the import path: pyproject.toml's pytest ``pythonpath``):
the checkout's paths here; commands (snakemake, dchag launch-train, dchag) in ``commands``; small inputs
written by the real writers in ``era5``, ``era5_layouts``, ``hsi`` and ``hsi_products``; gloo
ranks in ``distributed``; the Slurm test cluster and the report's browser check."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # this environment's scripts: torchrun, snakemake, dchag
REGRID_DATA = REPO / "tests" / "data" / "regrid"  # real xESMF files (see its README.md)
LEVELS = [500, 850]


def once(tmp_path_factory, name: str, make) -> Path:
    """The folder ``name``, filled by ``make(folder)`` once for the whole test run: the first
    pytest-xdist worker to ask makes it, under a file lock, and every other worker reuses it
    (tests only read it; one that changes it works on a copy)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, shared by its workers
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder
