"""Count what a training step of this package's model does: matmul FLOPs, bytes read and
written by matmul-type and by other operators, operators and views launched.

The cost model's per-component counts (workload.TOKENIZER, LINEAR, QUERY, BLOCK, ...) are this
implementation's; ``count`` recounts them on a real model (any size, one device), so a
change to the model that moves more bytes shows up as a failing test, not as a silently wrong
prediction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

VIEWS = {
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "permute",
    "expand",
    "unsqueeze",
    "squeeze",
    "detach",
    "slice",
    "select",
    "alias",
    "_reshape_alias",
    "as_strided",
    "split",
    "unbind",
    "split_with_sizes",
}
MATMULS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
}


@dataclass
class Counts:
    flops: float = 0.0
    mm_bytes: float = 0.0
    bytes: float = 0.0
    ops: int = 0
    views: int = 0


class _Counter(TorchDispatchMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        c = self.counts
        if name in VIEWS:
            c.views += 1
            return out
        nbytes = sum(
            t.numel() * t.element_size() for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)
        )
        if name in MATMULS:
            c.mm_bytes += nbytes
        else:
            c.bytes += nbytes
        c.ops += 1
        return out


def _cpu_attention_flops() -> dict:
    """torch's FlopCounterMode has formulas for the GPU attention kernels only: count the CPU
    flash-attention kernels the same way."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def forward(q, k, v, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(q, k, v)

    def backward(grad_out, q, k, v, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out, q, k, v)

    return {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }


def count(fn: Callable[[], object]) -> Counts:
    """Run ``fn`` once, counting its operators."""
    counts = Counts()
    flops = FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops())
    with flops, _Counter(counts):
        fn()
    counts.flops = float(flops.get_total_flops())
    return counts
