"""What every figure shares: matplotlib without a display, the run colours, reading result
files with a named error, and saving a figure as PNG with a PDF beside it, atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..store import InputError, atomic_path  # noqa: E402

DPI = 150
COLORS = {"baseline": "#1f77b4", "dchag": "#d62728", "persistence": "#7f7f7f", "climatology": "#2ca02c"}


def color(name: str, i: int) -> str:
    for key, c in COLORS.items():
        if key in name:
            return c
    return f"C{i + 3}"


def save(fig, output: str | Path, add=None) -> Path:
    """``output`` (.png) and the same name with .pdf, each written atomically, cropped to what the
    figure shows (as ``bbox_inches="tight"``). The layout and the crop are worked out once, on a
    draw that renders nothing, and kept for both files (matplotlib would lay out and measure the
    whole figure again before each). ``add()``, if given, runs after that: artists inside the
    axes that neither needs to measure (a large scorecard's cell labels: most of its drawing)."""
    output = Path(output)
    if output.suffix != ".png":
        raise InputError(f"figure output must end in .png (a .pdf is written beside it): {output}")
    fig.set_dpi(DPI)  # measured at the resolution it is drawn at
    fig.draw_without_rendering()
    crop = fig.get_tightbbox().padded(matplotlib.rcParams["savefig.pad_inches"])
    fig.set_layout_engine(None)  # the axes keep the positions the layout gave them
    if add is not None:
        add()
    for path in (output, output.with_suffix(".pdf")):
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix[1:], dpi=DPI, bbox_inches=crop)
    plt.close(fig)
    return output


def read_csv(path: str | Path, what: str) -> pd.DataFrame:
    if not Path(path).exists():
        raise InputError(f"{what} not found: {path}")
    return pd.read_csv(path)


def load_runs(paths: list[str], what: str) -> dict[str, dict[str, np.ndarray]]:
    """Every array of each run's .npz, by run name."""
    runs = {}
    for path in paths:
        if not Path(path).exists():
            raise InputError(f"{what} not found: {path}")
        with np.load(path) as z:
            runs[run_name(path)] = {k: z[k] for k in z.files}
    return runs


def run_name(path: str | Path) -> str:
    """results/<name>/train/<run>/log.csv -> <run>; other files: the stem after the last '_'."""
    p = Path(path)
    return p.parent.name if p.name == "log.csv" else p.stem.split("_", 1)[-1].removesuffix("_map")
