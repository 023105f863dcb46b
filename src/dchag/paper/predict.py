"""The cost model's per-GPU memory at a point's paper setting (benefit/costmodel.py and workload.py with the
constants of the paper's implementation, workload.PAPER), for whole models and for the
front-end ablations.

The paper's fixed performance settings (depth 32, 128 x 256, patch 4, batch 2, bf16, heads =
width / 128) are used whatever the point ran at: a scaled-down point is predicted at the
setting it stands for (``Point.paper_setting``).
"""

from __future__ import annotations

from ..benefit.costmodel import predict
from ..benefit.hardware import Hardware
from ..benefit.workload import PAPER, Workload
from ..vocabulary import VARIANTS
from . import published
from .sweep import Point

GIB = 2**30
_HW = Hardware(alpha=1e-5, intra_bw=1e11, inter_bw=1e10, gpus_per_node=8)  # memory does not depend on these


def workload(width: int, channels: int, tree: int = 0, fused: bool = False) -> Workload:
    f = published.FIXED
    h, w = f["image"]
    return Workload(
        channels=channels,
        embed_dim=width,
        depth=f["depth"],
        num_heads=max(1, width // published.HEADS_PER_WIDTH),
        tokens=(h // f["patch"]) * (w // f["patch"]),
        patch_size=f["patch"],
        batch=f["batch"],
        act_bytes=2,
        tree=tree,
        fused=fused,
        **PAPER,
    )


def front_gb(w: Workload, variant: str, tp: int) -> float:
    """The front end alone (tokenizer and aggregation, no ViT): the per-channel token copies of
    the channels a rank tokenizes, the baseline aggregation's copies, and for the all-token
    gather the gathered tokens held like a whole tokenization (every channel's copies)."""
    u, c = w.unit(), w.channels
    local = -(-c // tp)
    copies = w.token_copies
    if variant == "tokenize":
        act = copies * c * u
    elif variant == "tokenize+aggregate":
        act = w.front_activations(c, "baseline", 1, tp)
    elif variant == "dist-tokenize":
        act = copies * local * u
    elif variant == "dist-tokenize+gather-all":
        act = copies * local * u + copies * c * u
    else:
        raise ValueError(f"not a front-end variant: {variant}")
    return (act + w.runtime_overhead) / GIB


def predicted_gb(p: Point) -> float:
    """Predicted per-GPU memory (GB, 2^30 bytes as the paper's logs) at the point's paper setting."""
    width, channels, tp = p.paper_setting
    w = workload(width, channels, p.tree, p.fused_front_end)
    if VARIANTS[p.variant].cost_model:
        return predict(w, _HW, tp * p.dp, 8, VARIANTS[p.variant].cost_model, rate=1e14, tp=tp).memory_bytes / GIB
    return front_gb(w, p.variant, tp)
