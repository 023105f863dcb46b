"""The cost model's per-GPU memory against every published memory number of the paper
(dchag.paper.published: Frontier MI250X, 64 GB per GCD; batch 2, 128 x 256 image, patch 4,
depth 32, bf16, peak reserved on rank 0).

Five of the paper's numbers set the constants of its implementation (benefit.workload.PAPER): the
front-end-only measurements (tokenization of 1024 and of 128 channels, + aggregation) and the
-C minus -L difference at 1.7B / 1024 channels / TP 8. Every other number is a prediction;
TreeK is not modelled (its rows show the error of ignoring it).
"""

from __future__ import annotations

from ..vocabulary import VARIANTS
from . import published
from .predict import predicted_gb
from .sweep import Point

# the published numbers used to set a constant
CALIBRATION = {
    ("full_models", 2048, 1024, 8, "dchag-c", 0),
    ("tokenization", 2048, 1024, 8, "tokenize", 0),
    ("tokenization", 2048, 1024, 8, "tokenize+aggregate", 0),
    ("tokenization", 2048, 1024, 8, "dist-tokenize", 0),
}


def compare(figures: tuple[str, ...] = ("full_models",)) -> list[dict]:
    """One row per published memory number of ``figures`` (full_models: the 15-entry table)."""
    rows = []
    seen = set()
    for n in published.NUMBERS:
        key = (n.width, n.channels, n.tp, n.variant, n.tree)
        if n.metric != "memory_gb" or n.figure not in figures or key in seen:
            continue
        seen.add(key)
        point = Point(
            n.width,
            published.FIXED["depth"],
            max(1, n.width // published.HEADS_PER_WIDTH),
            n.channels,
            published.FIXED["image"],
            published.FIXED["patch"],
            published.FIXED["batch"],
            "bf16",
            n.tp,
            1,
            n.variant,
            n.tree,
            True,
        )
        gb = predicted_gb(point)
        rows.append(
            {
                "figure": n.figure,
                "model": published.WIDTH_LABEL[n.width],
                "width": n.width,
                "channels": n.channels,
                "tp": n.tp,
                "variant": VARIANTS[n.variant].label + (f" Tree{n.tree}" if n.tree else ""),
                "paper_gb": n.value,
                "predicted_gb": gb,
                "error": gb / n.value - 1,
                "calibration": (n.figure, n.width, n.channels, n.tp, n.variant, n.tree) in CALIBRATION,
            }
        )
    return rows
