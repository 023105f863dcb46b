"""What one rank's training step of the channel ViT costs, counted per component: the workload.

The workload is the channel ViT of this package (src/dchag/model): per-channel tokenizer,
channel aggregation (cross-attention; -L / -C partial aggregation under D-CHAG), a ViT of
``depth`` blocks, a head. Counts per GPU and step, micro-batch ``batch`` per GPU:

* compute: per component (tokenizer, partial / final aggregation, each ViT block, head,
  optimizer): FLOPs / matmul rate, plus the bytes all its operators read and write over the
  bandwidth for tensors of its size (no overlap assumed: see Work.seconds), plus fixed costs per
  operator, view, tensor-parallel linear layer and DTensor parameter — the rates `dchag
  calibrate` measures (hardware.Compute), times the profile's efficiency (the configured
  model's measured step over the step the rates predict). Training FLOPs are 3x the forward's. The byte and
  operator counts are this package's implementation's (per channel, per block), counted once
  with benefit/trace.py; tests/unit/benefit/test_benefit.py re-counts them at other sizes;
* memory: parameters, gradients and Adam state (``state_bytes`` per parameter, 16 by default:
  4 fp32 weights, 4 fp32 gradients, 8 fp32 moments; the paper's FSDP mixed precision adds the
  bf16 copies, 20: :data:`PAPER`), plus
  activations: the front end's per-channel token copies (``front_activations``), the ViT
  keeps its block inputs (activation checkpointing) plus one block's working set
  (Korthikanti et al.: s·b·h·(34 + 5·a·s/h) bytes at 16 bit, divided by the TP size).

``fused``: the front end without channel tokens (``model.fused_front_end``,
dchag.model.fused): every aggregation that sees the channels absorbs the tokenizer (the
baseline's on one rank, each D-CHAG rank's partial one, TreeK's first level); the TP
baseline's aggregation, whose heads are split over the ranks, takes the tokens either way.

What each parallel strategy makes of these counts (and its communication) is costmodel.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary import Aggregation
from .hardware import Compute

BYTES_PER_PARAM_STATE = 16


@dataclass
class Work:
    """One component's share of one rank's training step (forward, backward, optimizer)."""

    flops: float = 0.0  # matmul-type FLOPs (matmuls, attention)
    mm_bytes: float = 0.0  # bytes the matmul-type operators read and write
    bytes: float = 0.0  # bytes the other operators read and write
    ops: float = 0.0  # operators launched (not views)
    views: float = 0.0
    tp_linears: float = 0.0  # tensor-parallel (DTensor) linear layers
    dtensor_params: float = 0.0  # DTensor parameters the optimizer steps
    size: float = 0.0  # bytes of its typical (largest) tensor: which bandwidth applies

    def seconds(self, c: Compute) -> float:
        bw = c.bandwidth(self.size)
        # no overlap of arithmetic and memory traffic: on the CPU a large output's first-touch
        # page faults stall the matmul that writes it (measured: the sum predicts the model
        # benchmark better than the roofline's max, benchmarks/results/benefit_model_check.md)
        return (
            self.flops / c.flops_per_s
            + (self.mm_bytes + self.bytes) / bw
            + (self.ops + self.views) * c.op_s
            + self.tp_linears * c.tp_linear_s
            + self.dtensor_params * c.dtensor_param_s
        )


def compute_seconds(parts: list[Work], c: Compute | float) -> float:
    c = c if isinstance(c, Compute) else Compute(float(c))
    return c.efficiency * sum(p.seconds(c) for p in parts)


# Bytes per step in units of one token tensor (B, L, D) per channel (per block for the ViT),
# and operators per step, of this package's implementation (forward + backward), as counted by
# benefit/trace.py: (matmul bytes, other bytes, operators, views).
TOKENIZER = (2.8, 3.05, 14, 25)
LINEAR = {0: (3.0, 0.0, 8, 15), "tree": (3.1, 3.1, 15, 28)}
QUERY = (18.0, 17.0, 20, 52)
# A ViT block: (matmul bytes replicated, split by TP), (other bytes replicated, split), ops, views.
BLOCK = ((21.1, 42.1), (15.0, 47.3), 35, 79)
WEIGHT_PASSES = 3  # a linear layer's fp32 weight is read forward and backward, its gradient written
HEAD = (0.0, 20.0, 50, 50)  # lead-time and position embedding, head, un-patching, loss
ADAM_BYTES_PER_PARAM = 84  # fp32 AdamW, one tensor at a time (torch's for-loop implementation on the CPU)
ADAM_OPS_PER_TENSOR = 10
# The fused front end, per absorbed aggregation (a call: one group, or one TreeK sub-group, with
# its pixel extraction): bytes in multiples of its tensors (W: the per-head weighted pixels
# N·C·p²·H, P: the pixels N·C·p², A: the absorbed weights C·p²·D, U: its output N·D; N = B·L,
# at the activations' width) read and written by matmul-type and by other operators, then
# operators and views per call. Least-squares fits to benefit/trace.py's counts of the real
# model (12 query and 6 linear shapes: C 32-96, D 64-128, H 4-8, B 2-6; within 9 % and 2 %).
FUSED_QUERY = ((3.05, 0.0, 21.5, 25.6), (10.95, 0.33, 22.75, 31.6), 85, 136)
FUSED_LINEAR = ((0.0, 1.81, 2.61, 6.64), (0.0, 2.75, 25.1, 1.96), 20, 35)
BLOCK_TENSORS, BLOCK_TP_TENSORS, BLOCK_TP_LINEARS = 14, 10, 5
QUERY_TENSORS, QUERY_TP_TENSORS, QUERY_TP_LINEARS = 7, 6, 3


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
    token_copies: float | None = None  # None: this package's tokenizer (see front_activations)
    input_copies: float | None = None  # None: p²/D token tensors per channel (see front_activations)
    cross_copies: float = 4.0  # a query aggregation: its keys and values, and their re-laid-out copy
    cross_replicated: float = 0.0  # of those, not split by TP in the baseline
    baseline_cross_copies: float | None = None  # the baseline's aggregation, when implemented differently
    runtime_overhead: float = 0.0  # bytes: CUDA context, allocator cache, workspaces
    state_bytes: float = BYTES_PER_PARAM_STATE  # per parameter: weights, gradients, optimizer state
    fused: bool = False  # the front end without channel tokens (model.fused_front_end)
    final_split: bool = True  # the final aggregation's projections split over the TP ranks (dchag's)

    # -- parameters -------------------------------------------------------------------------
    def backbone_params(self) -> float:
        d = self.embed_dim
        h = self.mlp_ratio * d
        return self.depth * (4 * d * d + 4 * d + 2 * d * h + h + d + 4 * d)

    def front_params(self, channels: int, aggregation: str, groups: int = 1) -> float:
        d, p2 = self.embed_dim, self.patch_size**2
        tok = channels * (d * p2 + 2 * d)
        attn = 4 * d * d + 5 * d
        if aggregation == Aggregation.BASELINE:
            return tok + attn
        partial = groups * attn if aggregation == Aggregation.CROSS else channels + groups
        return tok + partial + attn

    def head_params(self) -> float:
        """The forecast head, the position and lead-time embeddings and the final norm."""
        d, out = self.embed_dim, self.out_channels * self.patch_size**2
        return d * d + d + d * out + out + self.tokens * d + 2 * d + 2 * d

    def params(self, aggregation: str = "baseline", groups: int = 1) -> float:
        return self.backbone_params() + self.front_params(self.channels, aggregation, groups) + self.head_params()

    def tp_params(self, held: int, aggregation: str, tp: int) -> float:
        """Parameters on one rank of a tensor-parallel group of ``tp`` holding ``held`` channels
        (dchag.parallel.parallelize): the ViT blocks' and the final aggregation's projections
        split (q, k/v and fc1 by column, with their biases; the output projection and fc2 by
        row), their layer norms, row-parallel biases and the query token on every rank."""
        d = self.embed_dim
        replicated = self.depth * 6 * d  # per block: 2 layer norms, the proj and fc2 biases
        split = self.backbone_params() - replicated
        attn = 4 * d * d + 5 * d
        if self.final_split:  # all but its proj bias and query token
            split, replicated = split + attn - 2 * d, replicated - attn + 2 * d
        return split / tp + replicated + self.front_params(held, aggregation, 1) + self.head_params()

    # -- forward FLOPs per micro-batch ------------------------------------------------------
    def _attn_flops(self, inputs: int) -> float:
        """Query aggregation over ``inputs`` tokens per patch (K, V projections dominate)."""
        b, l, d = self.batch, self.tokens, self.embed_dim
        return b * l * (4 * inputs * d * d + 4 * inputs * d + 4 * d * d)

    def tokenizer_flops(self, channels: int) -> float:
        return 2 * self.batch * channels * self.tokens * self.embed_dim * self.patch_size**2

    def block_flops(self) -> float:
        """Forward FLOPs of one ViT block (matmuls and self-attention)."""
        b, l, d = self.batch, self.tokens, self.embed_dim
        h = self.mlp_ratio * d
        return b * (2 * l * (4 * d * d + 2 * d * h) + 4 * l * l * d)

    def head_flops(self) -> float:
        d = self.embed_dim
        return 2 * self.batch * self.tokens * (d * d + d * self.out_channels * self.patch_size**2)

    # -- work per rank and step (compute model) ----------------------------------------------
    def tokenizer_work(self, channels: int, calls: int = 1) -> Work:
        """Tokenizing ``channels`` channels in ``calls`` calls (one per channel group)."""
        mm, other, ops, views = TOKENIZER
        ops, views = ops * calls, views * calls
        u = self.unit()
        # the input needs no gradient: forward and the weight gradient only (2x the forward)
        return Work(
            2 * self.tokenizer_flops(channels) * (1 + 1 / self.patch_size**2),
            mm * channels * u,
            other * channels * u,
            ops,
            views,
            size=channels * u,
        )

    def linear_work(self, inputs: int, tree: int = 0) -> Work:
        mm, other, ops, views = LINEAR["tree" if tree else 0]
        u = self.unit()
        return Work(
            6 * self.batch * self.tokens * self.embed_dim * inputs,
            mm * inputs * u,
            other * inputs * u,
            ops,
            views,
            size=inputs * u,
        )

    def query_work(self, inputs: int, tp: int = 1, tree: int = 0, count: int = 1) -> Work:
        """``count`` query aggregations over ``inputs`` tokens each (one module, shared weights);
        under TP its projections are split, the context re-layout is not. TreeK: the module runs
        on K sub-groups of inputs/K tokens (a K-times larger batch), then over the K results."""
        if tree:
            level1 = self.query_work(inputs // tree, tp, 0, count)
            level1.flops *= tree
            level1.mm_bytes *= tree
            level1.bytes *= tree
            level1.size *= tree
            level2 = self.query_work(tree, tp, 0, count)
            return Work(
                level1.flops + level2.flops,
                level1.mm_bytes + level2.mm_bytes,
                level1.bytes + level2.bytes,
                level1.ops + level2.ops,
                level1.views + level2.views,
                level1.tp_linears,
                level1.dtensor_params,
                level1.size,
            )
        mm, other, ops, views = QUERY
        u = self.unit() * inputs * count
        tp_lin = QUERY_TP_LINEARS if tp > 1 else 0
        d = self.embed_dim
        weights = (
            count * WEIGHT_PASSES * 4 * (4 * d * d) / tp
        )  # the projections' weights, read and their gradients written
        return Work(
            3 * count * self._attn_flops(inputs) / tp,
            mm * u / 3 * (1 + 2 / tp) + weights,
            other * u / 5 * (1 + 4 / tp),
            ops * count,
            views * count,
            tp_lin,
            QUERY_TP_TENSORS if tp > 1 else 0,
            size=self.unit() * inputs,
        )

    def block_work(self, tp: int = 1) -> Work:
        (mm_r, mm_s), (o_r, o_s), ops, views = BLOCK
        u = self.unit()
        d = self.embed_dim
        h = self.mlp_ratio * d
        weights = WEIGHT_PASSES * 4 * (4 * d * d + 2 * d * h) / tp
        return Work(
            3 * self.block_flops() / tp,
            (mm_r + mm_s / tp) * u + weights,
            (o_r + o_s / tp) * u,
            ops,
            views,
            BLOCK_TP_LINEARS if tp > 1 else 0,
            BLOCK_TP_TENSORS if tp > 1 else 0,
            size=self.mlp_ratio * u / tp,
        )

    def head_work(self) -> Work:
        mm, other, ops, views = HEAD
        return Work(3 * self.head_flops(), mm * self.unit(), other * self.unit(), ops, views, size=self.unit())

    def optimizer_work(self, params: float, tensors: float, dtensors: float = 0.0) -> Work:
        return Work(
            0.0,
            0.0,
            ADAM_BYTES_PER_PARAM * params,
            ADAM_OPS_PER_TENSOR * (tensors - dtensors),
            0.0,
            0.0,
            dtensors,
            size=4 * params / max(tensors, 1),
        )

    def front_work(self, channels: int, aggregation: str, groups: int, tp: int = 1) -> list[Work]:
        """Tokenize ``channels`` channels and reduce them: baseline = one query over all of them
        (TP-split projections); hierarchical = ``groups`` partial aggregators."""
        if self._fuses(aggregation, tp):
            calls = groups * (self.tree or 1) if aggregation != Aggregation.BASELINE else 1
            parts = [self.fused_work(channels, aggregation, calls)]
            if aggregation != Aggregation.BASELINE and self.tree:  # TreeK's second level takes its K tokens
                level2 = self.linear_work(self.tree * groups) if aggregation == Aggregation.LINEAR else None
                parts.append(level2 or self.query_work(self.tree, 1, 0, count=groups))
            return parts
        if aggregation == Aggregation.BASELINE:
            return [self.tokenizer_work(channels), self.query_work(channels, tp)]
        parts = [self.tokenizer_work(channels, groups)]
        per_group = max(1, channels // groups)
        if aggregation == Aggregation.LINEAR:
            return (
                parts
                + [self.linear_work(channels, self.tree)]
                + [Work(ops=LINEAR[0][2], views=LINEAR[0][3])] * (groups - 1)
            )
        return parts + [self.query_work(per_group, 1, self.tree, count=groups)]

    def _fuses(self, aggregation: str, tp: int) -> bool:
        return self.fused and not (aggregation == Aggregation.BASELINE and tp > 1)

    def fused_work(self, channels: int, aggregation: str, calls: int) -> Work:
        """Tokenizing and aggregating ``channels`` channels in ``calls`` absorbed aggregations
        (dchag.model.fused), forward and backward: the scores and weighted pixels of every head
        (query) or one contraction of the pixels (linear), the absorbed weights formed once."""
        n, k, d, h = self.batch * self.tokens, self.patch_size**2, self.embed_dim, self.num_heads
        ab = self.act_bytes
        if aggregation == Aggregation.LINEAR:
            (mm, other, ops, views), flops = FUSED_LINEAR, 4 * n * channels * k * d + 6 * channels * d
        else:
            (mm, other, ops, views) = FUSED_QUERY
            flops = (
                n * channels * (4 * k * h + 6 * k * d + 6 * d)  # scores, weighted pixels, values
                + 6 * channels * d * (k + 1) * (h + d)  # the absorbed key and value weights
                + 6 * calls * (n * d * d + d * d)  # the output projection, the query
            )
        sizes = (n * channels * k * h * ab, n * channels * k * ab, channels * k * d * ab, calls * n * d * ab)
        return Work(
            flops,
            sum(c * x for c, x in zip(mm, sizes, strict=True)),
            sum(c * x for c, x in zip(other, sizes, strict=True)),
            ops * calls,
            views * calls,
            size=sizes[1] / calls,
        )

    def step_work(
        self, channels: int, aggregation: str, groups: int, tp: int, final_inputs: int, params: float, fsdp: int = 1
    ) -> list[Work]:
        """One rank's step; ``fsdp``: the ranks FSDP shards the optimizer state over (its
        parameters are all DTensors then)."""
        parts = self.front_work(channels, aggregation, groups, tp)
        if aggregation != Aggregation.BASELINE:
            parts.append(self.query_work(final_inputs, tp))
        parts += [self.block_work(tp)] * self.depth + [self.head_work()]
        tensors = (
            3 + 2 + 2 + 4 + 1 + QUERY_TENSORS + BLOCK_TENSORS * self.depth
        )  # tokenizer, lead, norm, head, pos, final, blocks
        tensors += {"baseline": 0, "linear": 2 * groups * (2 if self.tree else 1), "cross": QUERY_TENSORS * groups}[
            aggregation
        ]
        dtensors = tensors if fsdp > 1 else (QUERY_TP_TENSORS + BLOCK_TP_TENSORS * self.depth) if tp > 1 else 0
        return parts + [self.optimizer_work(params / fsdp, tensors, dtensors)]

    # -- activations per GPU ----------------------------------------------------------------
    def unit(self) -> float:
        """Bytes of one token tensor (B, L, D)."""
        return self.batch * self.tokens * self.embed_dim * self.act_bytes

    def backbone_activations(self, tp: int) -> float:
        s, b, h, a = self.tokens, self.batch, self.embed_dim, self.num_heads
        block = s * b * h * (34 + 5 * a * s / h) * self.act_bytes / 2
        return self.depth * self.unit() + block / tp

    def front_activations(self, channels: int, aggregation: str, groups: int, tp: int = 1) -> float:
        """Peak front-end activations, in token tensors (B, L, D) per channel. This package:
        p²/D for the batch as the tokenizer reads it (fitted: MemTracker's peaks of the TP
        baseline at T = 1, 2, 4 in benchmarks/results/tp_baseline_memory.md are 1.52 + 4/T
        per channel), the patch matrix with its column of ones ((p² + 1)/D) and the tokens (1);
        the -L aggregation keeps the tokens for its weight gradient while it forms their
        gradient (+1); a query aggregation (-C, the baseline's) holds its keys and values
        and their re-laid-out copy (``cross_copies``: 4, the width 2D), and releases its input
        before forming the input's gradient (layers.KeyValueProjection). Under TP the
        baseline's aggregation splits its keys and values over T, but its backward holds the
        context's gradient twice (the partial sum and its all-reduced copy): a floor of 2."""
        u = self.unit()
        p2 = self.patch_size**2
        if self._fuses(aggregation, tp):
            return self.fused_activations(channels, aggregation, groups)
        inputs = p2 / self.embed_dim if self.input_copies is None else self.input_copies
        package = self.token_copies is None
        tokens = (
            (p2 + 1) / self.embed_dim + (2 if aggregation == Aggregation.LINEAR else 1)
            if package
            else self.token_copies
        )
        if aggregation == Aggregation.CROSS:
            aggregate = self.cross_copies
        elif aggregation == Aggregation.BASELINE:
            extra = self.cross_copies if self.baseline_cross_copies is None else self.baseline_cross_copies
            kept = min(self.cross_replicated, extra)
            aggregate = kept + (extra - kept) / tp
            if package and tp > 1:  # or, beside the tokens' gradient, its all-reduced copy
                aggregate = max(aggregate, 1.0)
        else:
            aggregate = 0.0
        return (inputs + tokens + aggregate) * channels * u

    def fused_activations(self, channels: int, aggregation: str, groups: int) -> float:
        """Peak front-end memory of the fused front end: what it keeps for backward, the pixels
        and (query) each head's float32 attention weights, the absorbed weights with their
        float32 gradient, and two chunks of working memory per call (at most
        fused.CHUNK_ELEMENTS float32 numbers each). Against MemTracker's peaks in
        benchmarks/results/fused_front_end{,_width512}.md: within 15 % from C = 512 on (the
        token path's 1.3 GiB of activations at C = 512, D = 256 become 0.15); at C = 80 the
        working memory it assumes is up to twice what the step holds."""
        from ..model.fused import CHUNK_ELEMENTS

        n, k, d, h = self.batch * self.tokens, self.patch_size**2, self.embed_dim, self.num_heads
        query = aggregation != Aggregation.LINEAR
        kept = n * channels * (k * self.act_bytes + (4 * h if query else 0))
        weights = channels * k * d * (self.act_bytes + 4)
        calls = groups * (self.tree or 1) if aggregation != Aggregation.BASELINE else 1
        per_call = n * (channels // calls) * k * (h if query else 1)
        return kept + weights + (2 * 4 * min(CHUNK_ELEMENTS, per_call) if query else 0)


# The paper's implementation (its artifact), from its own measurements (docs/method.md, what the paper measured):
# tokenization of 1024 channels alone 50.14 GB, of 128 channels 8.13 GB (1.7B, B 2, L 2048,
# bf16) -> 3.0 U per channel and a 2.13 GiB fixed overhead; its baseline aggregation adds
# 8.23 GB for 1024 channels (0.51 U per channel); its -C partial aggregation holds 5.1 U per
# channel more than -L (1.7B, 1024 channels, TP 8: 24.14 - 13.96 GB).
# Its parameters cost 20 bytes each, not 16: it trains under FSDP with a bf16 mixed-precision
# policy, which keeps the fp32 (flat) parameter and its fp32 gradient — 4 + 4 — and AdamW's two
# fp32 moments — 8 — and, in forward and backward, the bf16 copy of the parameter and its bf16
# gradient — 2 + 2. (16 counted the bf16 copies beside the fp32 master and moments but not the
# fp32 gradient; it left the D-CHAG rows 15-20 % short, the more so the more parameters per GPU.)
PAPER = {
    "token_copies": 3.0,
    "input_copies": 0.0,
    "cross_copies": 5.1,
    "baseline_cross_copies": 0.51,
    "cross_replicated": 5.1,
    "runtime_overhead": 2.13 * 2**30,
    "state_bytes": 20.0,
    # its final aggregation counted whole on every TP rank: the published table is matched within
    # 14 % so, 16 % with dchag's split (4 D^2 (1 - 1/T) parameters a rank: 5 GB at width 8192, TP 16)
    "final_split": False,
}
