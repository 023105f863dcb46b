"""The paper's per-GPU memory (DCHAG.md section 4: Frontier MI250X, 64 GB per GCD; batch 2,
128 x 256 image, patch 4, depth 32, bf16, peak reserved on rank 0) against the cost model.

Five of the paper's numbers set the constants of its implementation (costmodel.PAPER): the
front-end-only measurements (tokenization of 1024 and 128 channels, +aggregation) and the
-C minus -L difference at 1.7B / 1024 channels / TP 8. The table's other numbers are
predictions.
"""

from __future__ import annotations

from .costmodel import PAPER, Workload, predict
from .hardware import Hardware

GIB = 2**30
# (parameters label, width, channels, TP, baseline GB, D-CHAG-C GB, D-CHAG-L GB)
TABLE = [
    ("1.7B", 2048, 1024, 8, 61.95, 24.14, 13.96),
    ("1.7B", 2048, 512, 2, 52.45, 52.83, 32.42),
    ("7B", 4096, 512, 16, 61.04, 24.39, 18.28),
    ("15B", 6144, 256, 16, 62.80, 35.49, 28.42),
    ("26B", 8192, 128, 16, 62.73, 50.61, 43.94),
]
CALIBRATION_ROWS = {("1.7B", 1024, 8, "dchag-c")}  # the one table entry used to set a constant


def compare() -> list[dict]:
    hw = Hardware(alpha=1e-5, intra_bw=1e11, inter_bw=1e10, gpus_per_node=8)  # memory does not depend on these
    rows = []
    for label, width, channels, tp, *measured in TABLE:
        w = Workload(channels=channels, embed_dim=width, depth=32, num_heads=width // 128, tokens=(128 // 4) * (256 // 4),
                     patch_size=4, batch=2, act_bytes=2, **PAPER)
        for strategy, paper_gb in zip(("tp", "dchag-c", "dchag-l"), measured):
            p = predict(w, hw, tp, 8, strategy, rate=1e14, tp=tp)
            gb = p.memory_bytes / GIB
            rows.append({"model": label, "width": width, "channels": channels, "tp": tp,
                         "variant": {"tp": "baseline", "dchag-c": "D-CHAG-C", "dchag-l": "D-CHAG-L"}[strategy],
                         "paper_gb": paper_gb, "predicted_gb": gb, "error": gb / paper_gb - 1,
                         "calibration": (label, channels, tp, strategy) in CALIBRATION_ROWS})
    return rows
