"""D-CHAG's one collective: gather every rank's partial-aggregation tokens in forward; in
backward return this rank's slice with no communication. That is exact because the final
cross-attention that consumes the gathered tokens is tensor-parallel and all-reduces the
gradient of its input, so every rank already holds the whole gradient."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# all_gather_tensor was renamed all_gather_single in torch 2.13 (the old name warns there).
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


class _GatherGroups(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.rank = dist.get_rank(group)
        ctx.width = local.shape[1]
        world = dist.get_world_size(group)
        # the gather stacks along dim 0; move the rank axis next to the group axis.
        stacked = funcol.wait_tensor(_all_gather(local.contiguous(), gather_dim=0, group=group))
        b = local.shape[0]
        return (
            stacked.reshape(world, b, *local.shape[1:]).transpose(0, 1).reshape(b, world * ctx.width, *local.shape[2:])
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = ctx.rank * ctx.width
        return grad[:, start : start + ctx.width].contiguous(), None


def gather_groups(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, G_local, L, D) on each rank -> (B, G_local * world, L, D), in rank order."""
    return _GatherGroups.apply(local, group)


def gather_channels(x: torch.Tensor, group, counts: list[int]) -> torch.Tensor:
    """All channels from every TP rank's block (``counts``: each rank's channels, in rank
    order; uneven blocks padded for the collective): the masked autoencoder reconstructs every
    channel, while each rank reads only its own. Every tensor of the collective lies on ``x``'s
    device."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    padded = x.new_zeros(x.shape[0], max(counts), *x.shape[2:])
    padded[:, : x.shape[1]] = x
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[:, :n] for part, n in zip(parts, counts)], dim=1)
