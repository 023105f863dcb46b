"""Applying the parallelizations to a one-device ChannelViT (the torchtitan way).

* Baseline TP (the paper's comparison point): every tensor-parallel rank tokenizes all C
  channels; the aggregation's heads and the ViT are tensor-parallel (Megatron layout:
  q/k/v and fc1 column-parallel, the output projection and fc2 row-parallel).
* D-CHAG: the model must be hierarchical with one channel group per TP rank; rank r keeps
  only group r's channels (tokenizer and channel embedding) and partial aggregator, and
  the groups' tokens meet in one AllGather before the tensor-parallel final cross-attention.
* Data parallelism over the "dp" mesh dimension: FSDP2 (``fully_shard``) or DDP (tp = 1).
* Activation checkpointing of the ViT blocks.

Replicated parameters are broadcast from rank 0 before anything is sharded, so every rank
starts from the same weights whatever its RNG did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

from ..config import ParallelSettings
from ..layout import ParallelConfigError
from ..model.model import ChannelViT
from ..vocabulary import DataParallel, MeshAxis, Strategy
from .collectives import gather_groups
from .dims import ParallelDims
from .names import canonical, holds_channel_block, unwrap

STRATEGIES = tuple(Strategy)


def _attention_plan(prepare_at: str, projections_at: str, inputs: int) -> dict:
    """q and the fused k/v column-parallel, output projection row-parallel. The inputs of ``prepare_at``
    become replicated DTensors once, so their gradient is all-reduced once (at that module's
    boundary), not once per projection."""
    layouts = tuple(Replicate() for _ in range(inputs))
    return {
        prepare_at: PrepareModuleInput(input_layouts=layouts, desired_input_layouts=layouts, use_local_output=False),
        f"{projections_at}.wq": ColwiseParallel(),
        f"{projections_at}.wkv": ColwiseParallel(),  # keys and values of the rank's heads (fused, head by head)
        f"{projections_at}.proj": RowwiseParallel(),
    }


def _check_heads(model: ChannelViT, tp: int) -> None:
    heads = model.cfg.num_heads
    if heads % tp:
        raise ParallelConfigError(f"model.num_heads {heads} is not divisible by the tensor-parallel size {tp}")


def apply_tp(model: ChannelViT, tp_mesh: DeviceMesh) -> None:
    """Tensor-parallel final aggregation and ViT blocks (decoder and heads stay replicated)."""
    _check_heads(model, tp_mesh.size())
    model.fused_final = False  # its heads are split over the ranks: it takes the tokens
    parallelize_module(model.final, tp_mesh, _attention_plan("attn", "attn", inputs=2))
    # each rank's keys and values are 2D/T wide: narrower than the context from T = 3 on (at
    # T = 2 the two layouts hold the same, and re-laying out the context is faster on the CPU)
    model.final.attn.project_in_place = tp_mesh.size() > 2
    for block in model.blocks:
        plan = _attention_plan("attn", "attn.inner", inputs=1)
        plan.update({"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
        parallelize_module(block, tp_mesh, plan)


def apply_dchag(model: ChannelViT, tp_mesh: DeviceMesh) -> None:
    """Keep this rank's channel group and partial aggregator; gather the group tokens once."""
    t = tp_mesh.size()
    if model.partial is None:
        raise ParallelConfigError("D-CHAG needs a hierarchical model: set model.aggregation to linear or cross")
    if len(model.groups) != t:
        raise ParallelConfigError(
            f"D-CHAG needs one channel group per tensor-parallel rank: model.groups={len(model.groups)}, tp={t}"
        )
    rank = tp_mesh.get_local_rank()
    key, lo, hi = model.local_groups[rank]
    model.tokenizer.keep_channels(lo, hi)
    for other in [k for k in model.partial.keys() if k != key]:
        del model.partial[other]
    model.local_groups = [(key, 0, hi - lo)]
    model.group_gather = partial(gather_groups, group=tp_mesh.get_group())
    apply_tp(model, tp_mesh)


def broadcast_parameters(model: nn.Module) -> None:
    """Make every rank's (still unsharded) weights rank 0's."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def apply_activation_checkpointing(model: ChannelViT) -> None:
    """Checkpoint the ViT blocks. The channel aggregation is left alone (the paper also
    checkpoints its final cross-attention): its input must stay for its k/v projection's weight
    gradient either way, and a checkpoint would hold that input until the input's gradient is
    formed, undoing KeyValueProjection's early release — the TP baseline's per-rank peak at
    T = 4 would be 52.4 instead of 44.4 MiB (benchmarks/results/tp_baseline_memory.md's
    workload), while D-CHAG's is the same either way."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block)


def apply_fsdp(
    model: ChannelViT, dp_mesh: DeviceMesh, param_dtype: torch.dtype | None, reshard_after_forward: bool = True
) -> None:
    """FSDP2 per ViT block and at the root. reshard_after_forward=True frees gathered weights
    after forward and gathers them again for backward (ZeRO-3); False keeps them (ZeRO-2-like:
    gradients and optimizer state sharded, weights whole between forward and backward)."""
    mp = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype
        else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)


def parallelize_model(
    model: ChannelViT,
    dims: ParallelDims,
    mesh: DeviceMesh | None,
    parallel: ParallelSettings,
    *,
    param_dtype: torch.dtype | None = None,
    find_unused_parameters: bool = False,
    timed_ddp: bool = False,
    freeze: Callable[[nn.Module], object] | None = None,
) -> nn.Module:
    """Apply the config's ``parallel`` section over ``mesh`` ("dp", "tp"); returns the module to
    train (DDP wraps). ``param_dtype``: FSDP's mixed-precision parameter type (None: the
    parameters' own); ``find_unused_parameters``: DDP's, for channel-subset rotation;
    ``timed_ddp``: time DDP's collectives (train.measure_comm); ``freeze``: stops gradients
    (fine-tuning), applied after tensor parallelism (D-CHAG makes new tokenizer parameters) and
    before FSDP or DDP, which take the trainable parameters as they find them."""
    if parallel.strategy not in STRATEGIES:
        raise ParallelConfigError(f"parallel.strategy {parallel.strategy!r}: expected one of {', '.join(STRATEGIES)}")
    broadcast_parameters(model)
    if mesh is not None and dims.tp > 1:
        (apply_dchag if parallel.strategy == Strategy.DCHAG else apply_tp)(model, mesh[MeshAxis.TP])
    if freeze is not None:
        freeze(model)
    if parallel.activation_checkpointing:
        apply_activation_checkpointing(model)
    comm_hook = parallel.comm_hook
    if mesh is not None and dims.dp > 1:
        if dims.dp_mode == DataParallel.FSDP:
            apply_fsdp(model, mesh[MeshAxis.DP], param_dtype, parallel.fsdp_reshard_after_forward)
        elif dims.dp_mode == DataParallel.DDP:
            ddp = nn.parallel.DistributedDataParallel(
                model,
                process_group=mesh[MeshAxis.DP].get_group(),
                bucket_cap_mb=parallel.ddp_bucket_mb,
                find_unused_parameters=find_unused_parameters,
            )
            if comm_hook != "none" or timed_ddp:
                from .compression import CompressionHook

                hook = CompressionHook(
                    comm_hook if comm_hook != "none" else "allreduce",
                    mesh[MeshAxis.DP].get_group(),
                    parallel.powersgd_rank,
                    timed=timed_ddp,
                )
                ddp.register_comm_hook(hook, CompressionHook.hook)
                ddp.comm_hook_state = hook
                if comm_hook != "none":
                    ddp.compression = hook
            return ddp
    if comm_hook != "none":
        raise ParallelConfigError(
            f"parallel.comm_hook {comm_hook!r} needs parallel.data_parallel: ddp and several data-parallel ranks"
        )
    return model


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` is bf16 on a GPU and fp32 on the CPU; bf16 / fp32 stay as they are."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    """bf16 autocast where asked (the default on GPU); fp32 on the CPU."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def tp_local_parameter(name: str, model: ChannelViT) -> bool:
    """Parameters that differ between tensor-parallel ranks by design: under D-CHAG, each
    rank's channel block of the tokenizer and its own partial aggregator."""
    return holds_channel_block(model) and canonical(name).startswith(("tokenizer.", "partial."))


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, tp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """Clip by the global gradient norm over every parameter of the (parallelized) model,
    each counted once: the squares of DTensor shards' local norms summed per mesh and sharded
    mesh dimension and reduced over it in one all-reduce per group (not one per parameter),
    D-CHAG's rank-local parameters summed over the TP group, replicated ones taken as they are."""
    core = unwrap(model)
    grads, sums = [], {}  # (rank-local?, mesh, its sharded dims) -> sum of squared local norms
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        grads.append(p.grad)
        g, mesh, dims = p.grad, None, ()
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):  # a pending sum: its norm needs the sum
                g = g.redistribute(placements=[Replicate() if pl.is_partial() else pl for pl in g.placements])
            # Every dimension not replicated holds part of the tensor (Shard and FSDP's _StridedShard).
            mesh, dims = g.device_mesh, tuple(i for i, pl in enumerate(g.placements) if not pl.is_replicate())
            g = g.to_local()
        key = (tp_local_parameter(name, core), mesh, dims)
        # Norms stay on the gradients' device: the all-reduces run there (NCCL takes no CPU tensors).
        sums[key] = sums.get(key, 0) + torch.linalg.vector_norm(g, 2.0).double() ** 2
    device = grads[0].device if grads else torch.device("cpu")
    shared = torch.zeros((), dtype=torch.float64, device=device)
    local = torch.zeros((), dtype=torch.float64, device=device)
    # Every rank of a group reduces its sums in the same order: sorted by mesh axes and dims.
    for (is_local, mesh, dims), sq in sorted(sums.items(), key=lambda kv: (_axes(kv[0][1]), kv[0][2], kv[0][0])):
        for dim in dims:
            dist.all_reduce(sq, group=mesh.get_group(dim))
        if is_local:
            local += sq
        else:
            shared += sq
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(local, group=tp_group)
    total = torch.sqrt(shared + local)
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total


def _axes(mesh: DeviceMesh | None) -> tuple[str, ...]:
    return tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
