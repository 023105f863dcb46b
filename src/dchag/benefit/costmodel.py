"""Per-step compute, communication and memory of each parallel strategy, per GPU: the cost
equations over the workload's per-component counts (workload.py).

* compute: the workload's Work of the components each rank steps (workload.compute_seconds);
* communication: the collectives each strategy issues (hardware.py's α-β model), split into
  intra-node and inter-node time;
* memory: the parameters, gradients and optimizer state each rank holds, plus its activations.

Strategies: dp, fsdp-zero2, fsdp-zero3, compress-fp16, compress-int8-ef (DDP with bucketing
and a communication hook), tp (baseline tensor parallelism), dchag-l, dchag-c (D-CHAG,
TreeK), fixed-group (hierarchical aggregation with fixed groups, no TP), rotation (a rotating
subset of channel groups per step).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError
from ..vocabulary import MODEL_VARIANTS, VARIANTS, Strategy
from . import hardware as hwm
from .hardware import Compute, Hardware
from .workload import Workload, compute_seconds


@dataclass
class Prediction:
    strategy: str
    tp: int
    compute_s: float
    comm_intra_s: float
    comm_inter_s: float
    memory_bytes: float
    note: str = ""

    @property
    def comm_s(self) -> float:
        return self.comm_intra_s + self.comm_inter_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s


GRAD_BYTES = 4.0  # fp32 gradient reduction (DDP / FSDP reduce_dtype)


def _reduce_gradients(
    w: Workload, hw: Hardware, params: float, n: int, per_node: int, bytes_per: float = GRAD_BYTES
) -> tuple[float, float]:
    """(intra, inter) seconds of a bucketed all-reduce of ``params`` gradients over ``n`` ranks."""
    size = params * bytes_per
    buckets = max(1, int(-(-size // w.bucket_bytes)))
    intra, inter = hwm.all_reduce(size, n, hw, per_node)
    # every bucket pays the per-message latency again
    extra = (buckets - 1) * 2 * (n - 1) * hw.alpha if n > 1 else 0.0
    return intra + (extra if inter == 0 else 0.0), inter + (extra if inter else 0.0)


@dataclass(frozen=True)
class Replicated:
    """Data parallelism: every GPU steps the whole model on its share of the batch and the
    gradients are reduced over all GPUs — by all-reduce, compressed (``fp16``, ``int8_ef``:
    8-bit gathered, with its error-feedback residual), or sharded with FSDP (``zero2``: weights
    gathered once, ``zero3``: for forward and backward). ``grouped``: the model aggregates fixed
    channel groups (linear); ``rotation``: only a fraction of them per step."""

    name: str
    reduction: str = "allreduce"
    grouped: bool = False
    rotation: bool = False

    def predict(self, w: Workload, hw: Hardware, gpus: int, g: int, t: int, rate) -> Prediction:
        c = w.channels
        agg, groups, front_channels = ("linear", w.fixed_groups, c) if self.grouped else ("baseline", 1, c)
        active = groups
        if self.rotation:
            front_channels = max(1, int(round(c * w.rotation_fraction)))
            active = max(1, int(round(groups * w.rotation_fraction)))
        params = w.params(agg, groups)
        fsdp = gpus if self.reduction in ("zero2", "zero3") else 1
        work = w.step_work(front_channels, agg, active, 1, active, params, fsdp=fsdp)
        # rotation: the idle groups' tokenizer gradients are zero and not reduced
        reduced = params - (w.front_params(c, agg, groups) - w.front_params(front_channels, agg, groups))
        act = w.front_activations(front_channels, agg, groups) + w.backbone_activations(1)
        state = params * w.state_bytes
        note = f"trains {w.rotation_fraction:.0%} of the channel groups per step" if self.rotation else ""
        if self.reduction in ("zero2", "zero3"):
            rs = hwm.all_gather(params * GRAD_BYTES, gpus, hw, g)
            ag = hwm.all_gather(params * 2, gpus, hw, g)
            gathers = 1 if self.reduction == "zero2" else 2  # zero3: weights gathered for forward and backward
            intra, inter = rs[0] + gathers * ag[0], rs[1] + gathers * ag[1]
            if self.reduction == "zero2":
                state = params * (4 + 12 / gpus)  # bf16 weights + grads whole, fp32 master and moments sharded
            else:
                state = params * w.state_bytes / gpus + 2 * w.backbone_params() / w.depth * 2  # + one block whole
        elif self.reduction == "fp16":
            intra, inter = _reduce_gradients(w, hw, reduced, gpus, g, 2.0)
        elif self.reduction == "int8_ef":
            # int8 values cannot be summed in 8 bits: every rank's quantised gradient is gathered
            intra, inter = hwm.all_gather(reduced * 1.0 * gpus, gpus, hw, g)
            act += reduced * 4  # the error-feedback residual, fp32
            note = "quantised gradients all-gathered (sum in 8 bit overflows)"
        else:
            intra, inter = _reduce_gradients(w, hw, reduced, gpus, g)
        return Prediction(
            self.name, 1, compute_seconds(work, rate), intra, inter, state + act + w.runtime_overhead, note
        )


@dataclass(frozen=True)
class TensorParallel:
    """Tensor parallelism in groups of T GPUs (data parallelism across the groups): the ViT
    and the final aggregation split by heads; ``distributed``: D-CHAG — each rank tokenizes
    and partially aggregates its channel group, one AllGather of the group tokens."""

    name: str
    aggregation: str
    distributed: bool

    def predict(self, w: Workload, hw: Hardware, gpus: int, g: int, t: int, rate) -> Prediction:
        if gpus % t:
            raise ConfigError(f"{gpus} GPUs do not divide into tensor-parallel groups of {t}")
        u = w.unit()
        replicas = gpus // t
        agg = self.aggregation
        held = -(-w.channels // t) if self.distributed else w.channels
        params = w.tp_params(held, agg, t)
        work = w.step_work(held, agg, 1, t, t, params)
        # per block: two all-reduces of (B, L, D) forward, two backward; the final aggregation: one each
        ar = hwm.all_reduce(u, t, hw, g)
        intra = (4 * w.depth + 2) * ar[0]
        inter = (4 * w.depth + 2) * ar[1]
        act = w.front_activations(held, agg, 1, t) + w.backbone_activations(t)
        if self.distributed:
            ag = hwm.all_gather(t * u, t, hw, g)  # the one AllGather of the group tokens
            gr = hwm.all_reduce(t * u, t, hw, g)  # its input gradient in backward
            intra += ag[0] + gr[0]
            inter += ag[1] + gr[1]
            act += 2 * t * u  # the gathered group tokens and their gradient
        if replicas > 1:  # data parallelism across TP groups: one rank per group and node slot
            dpi, dpe = _reduce_gradients(w, hw, params, replicas, max(1, g // t))
            intra, inter = intra + dpi, inter + dpe
        return Prediction(
            self.name, t, compute_seconds(work, rate), intra, inter, params * w.state_bytes + act + w.runtime_overhead
        )


def _tensor_parallel(variant: str) -> TensorParallel:
    v = VARIANTS[variant]
    return TensorParallel(v.cost_model, v.aggregation, v.strategy == Strategy.DCHAG)


MODELS = {
    m.name: m
    for m in (
        Replicated("dp"),
        Replicated("fsdp-zero2", "zero2"),
        Replicated("fsdp-zero3", "zero3"),
        Replicated("compress-fp16", "fp16"),
        Replicated("compress-int8-ef", "int8_ef"),
        *(_tensor_parallel(v) for v in MODEL_VARIANTS),
        Replicated("fixed-group", grouped=True),
        Replicated("rotation", grouped=True, rotation=True),
    )
}
STRATEGIES = tuple(MODELS)


def predict(
    w: Workload,
    hw: Hardware,
    gpus: int,
    gpus_per_node: int,
    strategy: str,
    rate: Compute | float,
    tp: int | None = None,
) -> Prediction:
    """One strategy's per-GPU step on ``gpus`` GPUs; ``rate``: the processor's measured rates
    (hardware.Compute) or only a sustained FLOP/s per GPU."""
    if strategy not in MODELS:
        raise ConfigError(f"strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    return MODELS[strategy].predict(w, hw, gpus, gpus_per_node, tp or min(gpus_per_node, gpus), rate)


def article_ratio(
    gradient_bytes: float, compute_s: float, hw: Hardware, gpus: int, gpus_per_node: int, delta_alpha: float
) -> dict:
    """The seed article's benefit ratio of a hierarchical (cross-node-reducing) all-reduce against
    a flat ring: R = (T_comm_base - T_comm_new) / T_comp, with T_comm_new paying Δα extra."""
    flat_hw = Hardware(hw.alpha, hw.intra_bw, hw.inter_bw, gpus_per_node)
    base = hwm.flat_all_reduce(gradient_bytes, gpus, flat_hw)
    intra, inter = hwm.all_reduce(gradient_bytes, gpus, flat_hw, gpus_per_node)
    new = intra + inter + delta_alpha
    nodes = -(-gpus // gpus_per_node)
    k = (1 / gpus_per_node) if nodes > 1 else 0.0
    return {
        "gpus": gpus,
        "gpus_per_node": gpus_per_node,
        "inter_bw": hw.inter_bw,
        "t_comm_base_s": base,
        "t_comm_new_s": new,
        "k_cross_node_bytes_left": k,
        "R": (base - new) / compute_s,
    }
