"""Per-step compute, communication and memory of each parallel strategy, per GPU.

The workload is the channel ViT of this package (src/dchag/model): per-channel tokenizer,
channel aggregation (cross-attention; -L / -C partial aggregation under D-CHAG), a ViT of
``depth`` blocks, a head. Counts per GPU and step, micro-batch ``batch`` per GPU:

* compute: 3x the forward FLOPs (matmuls and attention) divided by the measured rate
  (`dchag calibrate` times a configured model and records FLOP/s), or the given compute time
  of the data-parallel step scaled by each strategy's FLOPs;
* communication: the collectives each strategy issues (hardware.py's α-β model), split into
  intra-node and inter-node time;
* memory: parameters, gradients and Adam state (16 bytes per parameter: 2 bf16 weights,
  2 bf16 gradients, 4 fp32 master, 8 fp32 moments; 16 for fp32 training as well), plus
  activations: tokens are saved ``TOKEN_COPIES`` times per channel by the tokenizer, the ViT
  keeps its block inputs (activation checkpointing) plus one block's working set
  (Korthikanti et al.: s·b·h·(34 + 5·a·s/h) bytes at 16 bit, divided by the TP size).

Strategies: dp, fsdp-zero2, fsdp-zero3, compress-fp16, compress-int8-ef (DDP with bucketing
and a communication hook), tp (baseline tensor parallelism), dchag-l, dchag-c (D-CHAG,
TreeK), fixed-group (hierarchical aggregation with fixed groups, no TP), rotation (a rotating
subset of channel groups per step).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import hardware as hwm
from .hardware import Hardware

BYTES_PER_PARAM_STATE = 16
STRATEGIES = ("dp", "fsdp-zero2", "fsdp-zero3", "compress-fp16", "compress-int8-ef", "tp", "dchag-l", "dchag-c",
              "fixed-group", "rotation")


@dataclass
class Workload:
    channels: int
    embed_dim: int
    depth: int
    num_heads: int
    tokens: int  # patches per image (L)
    patch_size: int
    batch: int  # per GPU
    mlp_ratio: float = 4.0
    act_bytes: int = 2  # bf16 activations (4 on the CPU, fp32)
    out_channels: int = 5
    tree: int = 0
    rotation_fraction: float = 0.25  # channel groups trained per step under rotation
    fixed_groups: int = 8
    bucket_bytes: float = 25e6  # DDP bucket
    token_copies: float = 2.75
    cross_copies: float = 3.65
    baseline_cross_copies: float | None = None  # the baseline's aggregation, when implemented differently
    runtime_overhead: float = 0.0  # bytes: CUDA context, allocator cache, workspaces

    # -- parameters -------------------------------------------------------------------------
    def backbone_params(self) -> float:
        d = self.embed_dim
        h = self.mlp_ratio * d
        return self.depth * (4 * d * d + 4 * d + 2 * d * h + h + d + 4 * d)

    def front_params(self, channels: int, aggregation: str, groups: int = 1) -> float:
        d, p2 = self.embed_dim, self.patch_size**2
        tok = channels * (d * p2 + 2 * d)
        attn = 4 * d * d + 5 * d
        if aggregation == "baseline":
            return tok + attn
        partial = groups * attn if aggregation == "cross" else channels + groups
        return tok + partial + attn

    def head_params(self) -> float:
        d = self.embed_dim
        return d * d + d + d * self.out_channels * self.patch_size**2

    def params(self, aggregation: str = "baseline", groups: int = 1) -> float:
        return self.backbone_params() + self.front_params(self.channels, aggregation, groups) + self.head_params()

    # -- forward FLOPs per micro-batch ------------------------------------------------------
    def _attn_flops(self, inputs: int) -> float:
        """Query aggregation over ``inputs`` tokens per patch (K, V projections dominate)."""
        b, l, d = self.batch, self.tokens, self.embed_dim
        return b * l * (4 * inputs * d * d + 4 * inputs * d + 4 * d * d)

    def tokenizer_flops(self, channels: int) -> float:
        return 2 * self.batch * channels * self.tokens * self.embed_dim * self.patch_size**2

    def backbone_flops(self) -> float:
        b, l, d = self.batch, self.tokens, self.embed_dim
        h = self.mlp_ratio * d
        return self.depth * b * (2 * l * (4 * d * d + 2 * d * h) + 4 * l * l * d)

    def front_flops(self, channels: int, aggregation: str, groups: int) -> float:
        """Tokenization and aggregation of ``channels`` held channels in ``groups`` groups."""
        tok = self.tokenizer_flops(channels)
        if aggregation == "baseline":
            return tok + self._attn_flops(channels)
        per_group = channels / groups
        if aggregation == "linear":
            partial = 2 * self.batch * self.tokens * self.embed_dim * channels
        else:
            partial = groups * self._attn_flops(int(round(per_group)))
        return tok + partial

    def head_flops(self) -> float:
        return 2 * self.batch * self.tokens * self.head_params()

    # -- activations per GPU ----------------------------------------------------------------
    def unit(self) -> float:
        """Bytes of one token tensor (B, L, D)."""
        return self.batch * self.tokens * self.embed_dim * self.act_bytes

    def backbone_activations(self, tp: int) -> float:
        s, b, h, a = self.tokens, self.batch, self.embed_dim, self.num_heads
        block = s * b * h * (34 + 5 * a * s / h) * self.act_bytes / 2
        return self.depth * self.unit() + block / tp

    def front_activations(self, channels: int, aggregation: str, groups: int) -> float:
        u = self.unit()
        act = self.token_copies * channels * u
        if aggregation == "cross":
            act += self.cross_copies * channels * u
        elif aggregation == "baseline":
            extra = self.cross_copies if self.baseline_cross_copies is None else self.baseline_cross_copies
            act += extra * channels * u
        return act


# The paper's implementation (its artifact), from its own measurements (DCHAG.md section 4):
# tokenization of 1024 channels alone 50.14 GB, of 128 channels 8.13 GB (1.7B, B 2, L 2048,
# bf16) -> 3.0 U per channel and a 2.13 GiB fixed overhead; its baseline aggregation adds
# 8.23 GB for 1024 channels (0.51 U per channel); its -C partial aggregation holds 5.1 U per
# channel more than -L (1.7B, 1024 channels, TP 8: 24.14 - 13.96 GB).
PAPER = {"token_copies": 3.0, "cross_copies": 5.1, "baseline_cross_copies": 0.51, "runtime_overhead": 2.13 * 2**30}


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


def _train_flops(forward: float) -> float:
    return 3.0 * forward


def predict(w: Workload, hw: Hardware, gpus: int, gpus_per_node: int, strategy: str, rate: float,
            tp: int | None = None) -> Prediction:
    """One strategy's per-GPU step on ``gpus`` GPUs; ``rate`` = sustained FLOP/s per GPU."""
    g = gpus_per_node
    t = tp or min(g, gpus)
    c = w.channels
    u = w.unit()
    grad_bytes = 4.0  # fp32 gradient reduction (DDP / FSDP reduce_dtype)

    def dp_allreduce(params: float, n: int, per_node: int, bytes_per: float = grad_bytes) -> tuple[float, float]:
        size = params * bytes_per
        buckets = max(1, int(-(-size // w.bucket_bytes)))
        intra, inter = hwm.all_reduce(size, n, hw, per_node)
        # every bucket pays the per-message latency again
        extra = (buckets - 1) * 2 * (n - 1) * hw.alpha if n > 1 else 0.0
        return intra + (extra if inter == 0 else 0.0), inter + (extra if inter else 0.0)

    if strategy in ("dp", "fsdp-zero2", "fsdp-zero3", "compress-fp16", "compress-int8-ef", "fixed-group", "rotation"):
        agg, groups, front_channels = "baseline", 1, c
        if strategy == "fixed-group":
            agg, groups = "linear", w.fixed_groups
        if strategy == "rotation":
            agg, groups, front_channels = "linear", w.fixed_groups, max(1, int(round(c * w.rotation_fraction)))
        fwd = w.front_flops(front_channels, agg, groups) + w.backbone_flops() + w.head_flops()
        if strategy == "fixed-group" or strategy == "rotation":
            fwd += w._attn_flops(groups)  # the final aggregation over the group tokens
        params = w.params(agg, groups)
        # rotation: the idle groups' tokenizer gradients are zero and not reduced
        reduced = params - (w.front_params(c, agg, groups) - w.front_params(front_channels, agg, groups)) if strategy == "rotation" else params
        act = w.front_activations(front_channels, agg, groups) + w.backbone_activations(1)
        state = params * BYTES_PER_PARAM_STATE
        note = ""
        if strategy == "fsdp-zero2":
            rs = hwm.all_gather(params * grad_bytes, gpus, hw, g)
            ag = hwm.all_gather(params * 2, gpus, hw, g)
            intra, inter = rs[0] + ag[0], rs[1] + ag[1]
            state = params * (4 + 12 / gpus)  # bf16 weights + grads whole, fp32 master and moments sharded
        elif strategy == "fsdp-zero3":
            rs = hwm.all_gather(params * grad_bytes, gpus, hw, g)
            ag = hwm.all_gather(params * 2, gpus, hw, g)
            intra, inter = rs[0] + 2 * ag[0], rs[1] + 2 * ag[1]  # weights gathered for forward and backward
            state = params * BYTES_PER_PARAM_STATE / gpus + 2 * w.backbone_params() / w.depth * 2  # + one block whole
        elif strategy == "compress-fp16":
            intra, inter = dp_allreduce(reduced, gpus, g, 2.0)
        elif strategy == "compress-int8-ef":
            # int8 values cannot be summed in 8 bits: every rank's quantised gradient is gathered
            size = reduced * 1.0
            intra, inter = hwm.all_gather(size * gpus, gpus, hw, g)
            act += reduced * 4  # the error-feedback residual, fp32
            note = "quantised gradients all-gathered (sum in 8 bit overflows)"
        else:
            intra, inter = dp_allreduce(reduced, gpus, g)
        return Prediction(strategy, 1, _train_flops(fwd) / rate, intra, inter, state + act + w.runtime_overhead, note)

    if strategy in ("tp", "dchag-l", "dchag-c"):
        if gpus % t:
            raise ValueError(f"{gpus} GPUs do not divide into tensor-parallel groups of {t}")
        replicas = gpus // t
        agg = {"tp": "baseline", "dchag-l": "linear", "dchag-c": "cross"}[strategy]
        held = c if strategy == "tp" else -(-c // t)
        front = w.front_flops(held, agg, 1)
        if strategy != "tp":
            front += w._attn_flops(t) / t  # final aggregation over T group tokens, tensor-parallel
        fwd = front + w.backbone_flops() / t + w.head_flops()
        # per block: two all-reduces of (B, L, D) forward, two backward; the final aggregation: one each
        ar = hwm.all_reduce(u, t, hw, g)
        intra = (4 * w.depth + 2) * ar[0]
        inter = (4 * w.depth + 2) * ar[1]
        if strategy != "tp":
            ag = hwm.all_gather(t * u, t, hw, g)  # the one AllGather of the group tokens
            gr = hwm.all_reduce(t * u, t, hw, g)  # its input gradient in backward
            intra += ag[0] + gr[0]
            inter += ag[1] + gr[1]
        params = w.backbone_params() / t + w.front_params(held, agg, 1) + w.head_params()
        if replicas > 1:  # data parallelism across TP groups: one rank per group and node slot
            per_node = max(1, g // t)
            dpi, dpe = dp_allreduce(params, replicas, per_node)
            intra, inter = intra + dpi, inter + dpe
        act = w.front_activations(held, agg, 1) + w.backbone_activations(t)
        if strategy != "tp":
            act += 2 * t * u  # the gathered group tokens and their gradient
        return Prediction(strategy, t, _train_flops(fwd) / rate, intra, inter,
                          params * BYTES_PER_PARAM_STATE + act + w.runtime_overhead)
    raise ValueError(f"strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")


def article_ratio(gradient_bytes: float, compute_s: float, hw: Hardware, gpus: int, gpus_per_node: int,
                  delta_alpha: float) -> dict:
    """The seed article's benefit ratio of a hierarchical (cross-node-reducing) all-reduce against
    a flat ring: R = (T_comm_base - T_comm_new) / T_comp, with T_comm_new paying Δα extra."""
    flat_hw = Hardware(hw.alpha, hw.intra_bw, hw.inter_bw, gpus_per_node)
    base = hwm.flat_all_reduce(gradient_bytes, gpus, flat_hw)
    intra, inter = hwm.all_reduce(gradient_bytes, gpus, flat_hw, gpus_per_node)
    new = intra + inter + delta_alpha
    nodes = -(-gpus // gpus_per_node)
    k = (1 / gpus_per_node) if nodes > 1 else 0.0
    return {"gpus": gpus, "gpus_per_node": gpus_per_node, "inter_bw": hw.inter_bw, "t_comm_base_s": base, "t_comm_new_s": new,
            "k_cross_node_bytes_left": k, "R": (base - new) / compute_s}
