"""The nodes the read side is judged on, and the step the cost model predicts for the paper's
ERA5 model on them (the highest rate a rank must read its samples at)."""

from __future__ import annotations

import math
from typing import NamedTuple

BATCH = 512  # the paper's global batch: under D-CHAG on 8 GPUs (TP 8) every rank reads it
STEPS_PER_YEAR = 1461  # 6-hourly, leap years included


class Node(NamedTuple):
    flops: float  # matmul FLOP/s per GPU
    hbm: float  # HBM B/s per GPU
    link: float  # per-GPU link B/s
    latency: float  # s
    cores_per_gpu: int  # CPU cores for a rank's loader workers
    ram_gb: int  # the node's memory


NODES = {
    # Frontier: 56 of a node's 64 cores run applications (8 are the system's), 8 GCDs, 512 GB;
    # DGX H100: 2 x 56-core Xeon 8480C, 8 GPUs, 2 TB
    "Frontier node, 8 MI250X GCDs (the paper's)": Node(191.5e12, 1.6e12, 50e9, 10e-6, 7, 512),
    "DGX H100, 8 GPUs on NVLink": Node(989e12, 3.35e12, 450e9, 5e-6, 14, 2048),
}


def predicted_steps() -> list[dict]:
    """The paper's ERA5 model (width 512, depth 16, 16 heads, patch 4, 80 channels, 5 outputs,
    bf16) on one 8-GPU node, D-CHAG-L: TP 8 (every rank reads the global batch of 512) and
    TP 4 x 2 replicas (256 each). Peak rates and no launch overheads: the shortest step, so
    the highest read rate a rank needs."""
    from ..benefit.costmodel import predict
    from ..benefit.hardware import Compute, Hardware
    from ..benefit.workload import Workload

    rows = []
    for grid, tokens in ((5.625, (32 // 4) * (64 // 4)), (1.40625, (128 // 4) * (256 // 4))):
        for name, node in NODES.items():
            for tp, batch in ((8, BATCH), (4, BATCH // 2)):
                w = Workload(80, 512, 16, 16, tokens, 4, batch, out_channels=5)
                hw = Hardware(node.latency, node.link, node.link, 8)
                p = predict(w, hw, 8, 8, "dchag-l", Compute(node.flops, node.hbm), tp=tp)
                rows.append(
                    {
                        "grid": grid,
                        "node": name,
                        "tp": tp,
                        "batch_per_rank": batch,
                        "channels_per_rank": math.ceil(80 / tp),
                        "step_s": p.step_s,
                        "needed_samples_per_s": batch / p.step_s,
                    }
                )
    return rows
