"""The process layout: world = dp x tp, as a DeviceMesh with named dimensions, and the
process group it lives on.

Tensor-parallel groups are consecutive ranks (inside a node on a cluster); data-parallel
groups join the ranks with the same tensor-parallel index.

The rule for collectives, everywhere in dchag (training, validation, logging, clipping, the
MAE gather, ``calibrate``, the benchmarks): **every tensor handed to a collective lies on the
training device** — the rank's GPU under NCCL, the CPU under gloo — small bookkeeping tensors
included (:func:`collective_device` says where, for code that has no model at hand). On CUDA
the default group is created as ``cpu:gloo,cuda:nccl``: NCCL carries dchag's collectives, and
gloo is there for what torch itself does with CPU objects (DCP's metadata exchange,
``all_gather_object``), never as a place for dchag's own tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..layout import data_parallel_size
from ..vocabulary import MeshAxis


def init_distributed() -> tuple[str, torch.device]:
    """Initialise the default process group from torchrun's environment (or a single process):
    NCCL for CUDA tensors (with gloo beside it for CPU objects) when CUDA is available, gloo
    otherwise. Returns the backend and this rank's training device."""
    if torch.cuda.is_available():
        backend, device = "cpu:gloo,cuda:nccl", torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    if not dist.is_initialized():
        kwargs = {}
        if "RANK" not in os.environ:  # plain `python`: a group of one, in memory (no port to collide on)
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            kwargs = dict(store=dist.HashStore(), rank=0, world_size=1)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if not kwargs and attempt is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # A group restarted by torchrun (--max-restarts) must not read the addresses its
            # previous attempt left in the agent's store: give each attempt its own key space.
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
            kwargs = dict(
                store=dist.PrefixStore(f"dchag/attempt_{attempt}", store),
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
            )
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None, **kwargs)
    return backend, device


def collective_device() -> torch.device:
    """The device for tensors handed to collectives of the default group: this rank's GPU when
    the group runs NCCL, else the CPU."""
    if dist.is_initialized() and "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class ParallelDims:
    tp: int
    dp_mode: str  # fsdp | ddp | none (parallel.data_parallel)
    world_size: int

    def __post_init__(self):
        data_parallel_size(self.tp, self.dp_mode, self.world_size)

    @property
    def dp(self) -> int:
        return self.world_size // self.tp

    def build_mesh(self, device_type: str) -> DeviceMesh:
        return build_mesh(device_type, self.dp, self.tp)


def build_mesh(device_type: str, dp: int, tp: int) -> DeviceMesh:
    """The ("dp", "tp") mesh of ``dp * tp`` processes: tensor-parallel groups of consecutive ranks."""
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=tuple(a.value for a in MeshAxis))
