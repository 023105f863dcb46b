"""The words and numbers beside each paper figure: the caption line drawn under it (the paper
figure it reproduces, the setting run, how far the run is from the published values) and the
same numbers as ``<figure>.csv`` beside it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..paper import published
from ..paper.sweep import Point
from ..store import atomic_path

if TYPE_CHECKING:
    from .paper import Run

PAPER_FIGURE = {
    "front_share": "the paper's front-end memory breakdown of the baseline (tokenization, + aggregation, rest)",
    "tokenization": (
        "the paper's tokenization-strategy comparison (1.7B, 1024 channels, TP 8), "
        "with the all-token AllGather ablation"
    ),
    "tree": "the paper's TreeK memory figure (1.7B, 1024 channels, TP 8; Tree0/2/4/8)",
    "full_models": "the paper's full-model memory and TFLOPS/GPU table (1.7B-26B, baseline vs D-CHAG-C/-L)",
    "tp_scaling": "the paper's scaling in TP for a fixed model",
}


def setting_label(width: int, channels: int, tp: int) -> str:
    return f"{published.WIDTH_LABEL.get(width, f'w{width}')}, {channels} ch, TP{tp}"


def run_setting_label(p: Point) -> str:
    return f"w{p.width} d{p.depth}, {p.channels} ch, TP{p.tp}" + (f" x DP{p.dp}" if p.dp > 1 else "")


def draw_caption(fig, figure: str, runs: list[Run], deviation: list[str]) -> str:
    devices = sorted({r.device for r in runs})
    settings = sorted({run_setting_label(r.point) for r in runs})
    text = (
        f"Reproduces {PAPER_FIGURE[figure]}. Run: {'; '.join(settings)} on {', '.join(devices)}"
        f" ({'paper scale' if all(r.at_paper_scale for r in runs) else 'scaled down: compare shapes and ratios'}). "
        f"Published: {published.HARDWARE}. Prediction: dchag's cost model at the paper's scale. "
        + ("From published: " + "; ".join(deviation) if deviation else "No published value at these settings.")
    )
    fig.text(0.01, -0.02, "\n".join(textwrap.wrap(text, 180)), ha="left", va="top", fontsize=7)
    return text


def write_table(rows: list[dict], output: str | Path, caption: str) -> None:
    path = Path(output).with_suffix(".csv")
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(f"# {caption}\n")
            pd.DataFrame(rows).to_csv(f, index=False)


def table_row(
    figure: str,
    r: Run | None,
    p: Point,
    metric: str,
    measured: float | None,
    published_value: float | None,
    predicted: float | None,
    unit: str,
) -> dict:
    return {
        "figure": figure,
        "point": p.name,
        "paper_setting": setting_label(*p.paper_setting),
        "variant": p.variant,
        "tree": p.tree,
        "metric": metric,
        "published": published_value,
        "predicted": predicted,
        "prediction_error": (predicted / published_value - 1) if predicted is not None and published_value else None,
        "measured": measured,
        "measured_unit": unit,
        "device": r.device if r else None,
    }


def ratio_deviation(name: str, measured: float, pub: float) -> str:
    return f"{name} {measured:.2f} here vs {pub:.2f} published ({(measured - pub) * 100:+.0f} points)"
