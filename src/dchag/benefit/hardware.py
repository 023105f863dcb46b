"""Hardware profiles and collective-communication times (α-β model).

A link moves a message of S bytes in α + S/BW. Ring collectives over n ranks send
2(n-1)/n·S bytes per rank in 2(n-1) steps (all-reduce) or (n-1)/n·S in n-1 steps
(all-gather / reduce-scatter, S = the full output). A group that spans nodes runs
hierarchically, as NCCL does: the intra-node phases on the fast links, and the inter-node
phase on 1/G of the data among the nodes (the seed article's k = fraction of cross-node bytes
left). A profile comes from `dchag calibrate` (measured) or from the command line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..store import InputError, atomic_path


@dataclass
class Hardware:
    alpha: float  # s, per message step
    intra_bw: float  # bytes/s between ranks of one node
    inter_bw: float  # bytes/s between nodes
    gpus_per_node: int = 1
    measured: dict = field(default_factory=dict)  # what calibrate saw (sizes, times, compute)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Hardware":
        if not Path(path).exists():
            raise InputError(f"hardware profile not found: {path} (write one with `dchag calibrate --output {path}`)")
        d = yaml.safe_load(Path(path).read_text()) or {}
        missing = [k for k in ("alpha", "intra_bw", "inter_bw") if k not in d]
        if missing:
            raise InputError(f"hardware profile {path} lacks key(s) {', '.join(missing)}")
        return cls(float(d["alpha"]), float(d["intra_bw"]), float(d["inter_bw"]), int(d.get("gpus_per_node", 1)),
                   d.get("measured", {}))

    def to_yaml(self, path: str | Path) -> Path:
        with atomic_path(path) as tmp:
            tmp.write_text(yaml.safe_dump(asdict(self), sort_keys=False))
        return Path(path)


def _ring(n: int, size: float, bw: float, alpha: float, steps_per_rank: int, volume: float) -> float:
    return steps_per_rank * alpha + volume * size / bw if n > 1 else 0.0


def all_reduce(size: float, n: int, hw: Hardware, gpus_per_node: int | None = None) -> tuple[float, float]:
    """(intra-node seconds, inter-node seconds) of an all-reduce of ``size`` bytes over n ranks."""
    g = min(n, gpus_per_node or hw.gpus_per_node)
    nodes = -(-n // g)
    if nodes == 1:
        return _ring(n, size, hw.intra_bw, hw.alpha, 2 * (n - 1), 2 * (n - 1) / n), 0.0
    # reduce-scatter and all-gather inside the node, all-reduce of the 1/g shards across nodes
    intra = 2 * _ring(g, size, hw.intra_bw, hw.alpha, g - 1, (g - 1) / g)
    inter = _ring(nodes, size / g, hw.inter_bw, hw.alpha, 2 * (nodes - 1), 2 * (nodes - 1) / nodes)
    return intra, inter


def all_gather(size: float, n: int, hw: Hardware, gpus_per_node: int | None = None) -> tuple[float, float]:
    """(intra, inter) seconds of an all-gather whose output is ``size`` bytes (same for reduce-scatter)."""
    g = min(n, gpus_per_node or hw.gpus_per_node)
    nodes = -(-n // g)
    if nodes == 1:
        return _ring(n, size, hw.intra_bw, hw.alpha, n - 1, (n - 1) / n), 0.0
    intra = _ring(g, size / nodes, hw.intra_bw, hw.alpha, g - 1, (g - 1) / g)
    inter = _ring(nodes, size, hw.inter_bw, hw.alpha, nodes - 1, (nodes - 1) / nodes)
    return intra, inter


def flat_all_reduce(size: float, n: int, hw: Hardware) -> float:
    """A flat ring over every rank, bottlenecked by the inter-node link when it spans nodes
    (DDP on a plain ring; the seed article's baseline)."""
    bw = hw.inter_bw if n > hw.gpus_per_node else hw.intra_bw
    return _ring(n, size, bw, hw.alpha, 2 * (n - 1), 2 * (n - 1) / n)
