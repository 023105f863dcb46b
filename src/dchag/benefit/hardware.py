"""Hardware profiles and collective-communication times (α-β model).

A link moves a message of S bytes in α + S/BW. Ring collectives over n ranks send
2(n-1)/n·S bytes per rank in 2(n-1) steps (all-reduce) or (n-1)/n·S in n-1 steps
(all-gather / reduce-scatter, S = the full output). A group that spans nodes runs
hierarchically, as NCCL does: the intra-node phases on the fast links, and the inter-node
phase on 1/G of the data among the nodes (the seed article's k = fraction of cross-node bytes
left). A profile comes from `dchag calibrate` (measured) or from the command line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..store import InputError, atomic_path


@dataclass
class Compute:
    """What one rank's processor sustains (measured by `dchag calibrate`): matmul FLOP/s,
    streaming memory bandwidth, and the framework's fixed costs — per operator or view launched
    in training (module calls and autograd included), per tensor-parallel linear layer (DTensor
    wrapping and sharding propagation, forward and backward) and per DTensor parameter in the
    optimizer step. A profile without them (only a FLOP rate) gives a FLOP-only model.

    ``efficiency``: the configured model's measured step over the step these rates predict
    for it. Microbenchmarks in a tight loop run hotter (caches, awake threads) than a model's
    mix of operators; this one ratio, measured on one configuration, carries that over to the
    others (1.0: the rates as measured)."""

    flops_per_s: float
    mem_bw: float = float("inf")
    op_s: float = 0.0
    tp_linear_s: float = 0.0
    dtensor_param_s: float = 0.0
    # [(tensor bytes, bytes/s)]: streaming bandwidth into a freshly allocated tensor of that
    # size. It falls with size once tensors leave the caches and (on the CPU) once the
    # allocator hands out new pages for them (glibc mmaps blocks over 32 MB: first-touch page
    # faults on every step), so each component is charged at its own tensors' size.
    mem_curve: list = field(default_factory=list)
    efficiency: float = 1.0

    FIELDS = ("flops_per_s", "mem_bw", "op_s", "tp_linear_s", "dtensor_param_s", "mem_curve", "efficiency")

    def bandwidth(self, size: float) -> float:
        """Bytes/s for tensors of ``size`` bytes: log-linear between the measured sizes."""
        if not self.mem_curve:
            return self.mem_bw
        pts = sorted(self.mem_curve)
        if size <= pts[0][0]:
            return pts[0][1]
        for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
            if size <= s1:
                f = math.log(size / s0) / math.log(s1 / s0)
                return b0 + f * (b1 - b0)
        return pts[-1][1]

    @classmethod
    def from_measured(cls, measured: dict) -> Compute | None:
        c = measured.get("compute") or {}
        if "flops_per_s" not in c:
            return None
        return cls(
            **{
                k: (float(c[k]) if k != "mem_curve" else [list(map(float, p)) for p in c[k]])
                for k in cls.FIELDS
                if k in c
            }
        )


@dataclass
class Hardware:
    alpha: float  # s, per message step
    intra_bw: float  # bytes/s between ranks of one node
    inter_bw: float  # bytes/s between nodes
    gpus_per_node: int = 1
    measured: dict = field(default_factory=dict)  # what calibrate saw (sizes, times, compute)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Hardware:
        if not Path(path).exists():
            raise InputError(f"hardware profile not found: {path} (write one with `dchag calibrate --output {path}`)")
        d = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(d, dict):
            raise InputError(f"hardware profile {path}: expected a mapping of alpha, intra_bw, inter_bw")
        missing = [k for k in ("alpha", "intra_bw", "inter_bw") if k not in d]
        if missing:
            raise InputError(f"hardware profile {path} lacks key(s) {', '.join(missing)}")
        rates = []
        for key in ("alpha", "intra_bw", "inter_bw"):  # seconds >= 0, bytes/s > 0 (inf: one process, no link)
            try:
                value = float(d[key])  # a string too: YAML reads 5e-6 (no dot) as one
            except (TypeError, ValueError):
                value = math.nan
            finite = math.isfinite(value) or (key != "alpha" and value == math.inf)
            if not finite or value < 0 or (value == 0 and key != "alpha"):
                raise InputError(
                    f"hardware profile {path}: {key} = {d[key]!r}; expected "
                    + ("seconds >= 0" if key == "alpha" else "bytes/s > 0")
                )
            rates.append(float(value))
        return cls(*rates, int(d.get("gpus_per_node", 1)), d.get("measured", {}))

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
