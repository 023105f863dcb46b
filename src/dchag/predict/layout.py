"""Where a prediction runs: one device, or a torchrun group in the layout the model folder
records (``layout``: its run's ``parallel.tp`` and ``parallel.strategy``).

Under torchrun the process group, the ("dp", "tp") mesh and the parallelization are those of
training (:func:`dchag.parallel.dims.init_distributed`, :func:`parallelize_model`): D-CHAG
keeps each rank's channel group, tensor parallelism splits the layers, over groups of ``tp``
ranks; the ``world / tp`` groups share the work (initialisation times, pixel or tile batches)
and rank 0 gathers the results and writes them. Outputs do not depend on the layout (D-CHAG
equals the one-device hierarchical model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..errors import DchagError
from ..model.folder import Model
from ..vocabulary import MeshAxis


class PredictError(DchagError, ValueError):
    """Inputs that a model cannot be applied to (other channels or grid, a bad time range)."""


@dataclass
class Layout:
    net: nn.Module
    rank: int
    world: int
    share_rank: int  # which share of the work this rank's tensor-parallel group does
    shares: int
    channel_ids: torch.Tensor  # the input channels this rank reads (D-CHAG: its group)
    device: torch.device

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def mine(self, n: int) -> np.ndarray:
        """The indices of ``n`` pieces of work (batches, times) this rank computes."""
        return np.arange(n)[self.share_rank :: self.shares]

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The network on ``x`` (every channel; this rank's are taken here), the whole output on the CPU."""
        from torch.distributed.tensor import DTensor

        out = self.net(x[:, self.channel_ids].to(self.device), *args, **kwargs)
        return (out.full_tensor() if isinstance(out, DTensor) else out).cpu()

    def gather(self, part: dict) -> dict | None:
        """Every rank's ``part`` merged on rank 0 (None on the others)."""
        if self.world == 1:
            return part
        import torch.distributed as dist

        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object(part, parts, dst=0)
        return {k: v for p in parts for k, v in p.items()} if self.rank == 0 else None


def lay_out(model: Model) -> Layout:
    """The model on this process's device, in its recorded layout under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world == 1:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        net = model.network.to(device)
        return Layout(net, 0, 1, 0, 1, torch.arange(model.config.in_channels), device)
    import torch.distributed as dist

    from ..config import parallel_settings
    from ..parallel.dims import ParallelDims, build_mesh, init_distributed
    from ..parallel.parallelize import parallelize_model

    tp, strategy = model.layout
    if world % tp:
        raise PredictError(
            f"{model.source} was trained with parallel.tp {tp}: start a multiple of {tp} processes, not {world}"
        )
    _, device = init_distributed()
    net = model.network.to(device)
    mesh = build_mesh(device.type, world // tp, tp)
    # One tensor-parallel group's layout; the world / tp groups share the work without a
    # gradient to synchronise, so no data parallelism is applied.
    settings = parallel_settings(tp=tp, strategy=strategy, data_parallel="none", activation_checkpointing=False)
    net = parallelize_model(net, ParallelDims(tp, "none", tp), mesh, settings)
    return Layout(
        net, dist.get_rank(), world, mesh[MeshAxis.DP].get_local_rank(), world // tp, net.tokenizer.channel_ids, device
    )
