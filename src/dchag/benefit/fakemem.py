"""A run's per-rank memory at any scale, measured on one CPU: the run's model built and
parallelized as training builds it, on fake tensors (shapes and dtypes, no storage) and a fake
process group of any size, through forward, backward and two optimizer steps.

What is built is the trainer's: ``ChannelViT`` of the run's model section, ``parallelize_model``
over the run's (dp, tp) mesh (tensor parallelism or D-CHAG, activation checkpointing, FSDP or
DDP over the data-parallel ranks, freezing), the run's AdamW (``step.param_groups``), the
task's own loss under the run's autocast. The step leaves out the gradient clipping and the
finite check (they read values, which fake tensors do not have; they hold a few scalars). Not
counted: DDP's gradient buckets (a copy of the gradients, made in DDP's C++ reducer before the
measurement starts: add the gradients' bytes once more under parallel.data_parallel ddp).

MemTracker follows every tensor's storage: the tensor peak and, at that moment, its split into
parameters (and buffers), gradients, optimizer state, activations (forward's, and
recomputation's) and temporaries (backward's, activation gradients included). Parameters,
gradients and optimizer state are also counted whole (their bytes on this rank, each storage
once), which is what the cost model's state terms are.

``reserved`` estimates what a GPU's caching allocator reserves at its peak (what
``torch.cuda.max_memory_reserved`` reports): :data:`OVERHEAD` applied to the tensor peak.

Fake tensors here live on the CPU (this torch has no CUDA to fake); ``parallel.precision:
auto`` counts as bf16, the GPU's. The fake group lets this process be any rank: rank 0
unless told. A layout that cannot be built fails as the trainer would, with one line.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..bench.fits import fitted
from ..config import ConfigError
from ..errors import DchagError
from ..vocabulary import Aggregation, MeshAxis, Strategy

KINDS = ("parameters", "gradients", "optimizer", "activations", "temporaries")


@dataclass(frozen=True)
class Overhead:
    """reserved = scale x tensor peak + fixed bytes (the allocator's caching and
    fragmentation grow with the tensors; the context, workspaces and communication buffers
    do not)."""

    scale: float
    fixed: float
    fitted: str  # how the constants were found

    def reserved(self, peak: float) -> float:
        return self.scale * peak + self.fixed


# Fitted (least squares, by benchmarks/paper_memory_fake.py) to the paper's published
# max-memory-reserved of its 12 1.7B runs (full-model table and TreeK) against this measurement
# of dchag's model at the same settings;
# on the 9 7B/15B/26B runs it was not fitted to: median |error| 4.0 %, worst 13.6 %
# (benchmarks/results/paper_memory_fake.md). The scale holds more than an allocator's caching:
# the paper's implementation keeps more than dchag's model (its TreeK -L grows with K, dchag's not).
_FIT = fitted("fake_memory_overhead")  # benchmarks/paper_memory_fake.py writes it (dchag.bench.fits.overhead)
OVERHEAD = Overhead(
    _FIT["scale"], _FIT["fixed_gib"] * 2**30, f"fitted to the paper's {_FIT['fitted_on']} runs ({_FIT['source']})"
)


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0):
    """A fake default process group of ``world_size`` ranks with this process as ``rank``;
    device meshes FSDP derives (``DeviceMesh._concatenate``) are built with real tensors, DDP
    does not compare its parameters' shapes across the ranks (all are this one), and DTensor's
    shape propagation runs in a fake mode of its own."""
    import torch.distributed.tensor._sharding_prop as sharding_prop
    import torch.nn.parallel.distributed as ddp_module
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise DchagError(
            "the memory estimate needs a process of its own: torch.distributed is already initialised in this one"
        )
    concatenate = DeviceMesh.__dict__["_concatenate"]

    def real_concatenate(meshes):
        with unset_fake_temporarily():
            return concatenate.__func__(meshes)

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    DeviceMesh._concatenate = staticmethod(real_concatenate)
    verify = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None  # reads the shapes' values
    # DTensor derives each operator's output shape by running it on whole-size fake tensors, in
    # the fake mode it finds active: in ours, MemTracker would count them (a foreach AdamW step
    # over DTensors 4x its parameters, the TP baseline's backward 1.5x). A mode of its own
    # keeps them out of the measurement, as on real tensors.
    detect = sharding_prop.detect_fake_mode
    propagation = FakeTensorMode()
    sharding_prop.detect_fake_mode = lambda *args, **kwargs: propagation
    try:
        yield
    finally:
        DeviceMesh._concatenate = concatenate
        ddp_module._verify_param_shape_across_processes = verify
        sharding_prop.detect_fake_mode = detect
        dist.destroy_process_group()


def _storage_bytes(tensors) -> int:
    """Bytes of the storages under ``tensors`` (a DTensor's local shard), each storage once."""
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t._local_tensor if isinstance(t, DTensor) else t
        storage = t.untyped_storage()
        if storage._cdata not in seen:  # the C++ storage: one however many Python wrappers
            seen.add(storage._cdata)
            total += storage.nbytes()
    return total


class _NoRebuild:
    """DDP's reducer, except that it never re-buckets (re-bucketing reads the bucket order's
    values; the buckets hold the same gradients either way)."""

    def __init__(self, reducer):
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._reducer, name)


def _fake_ddp(model: nn.Module) -> None:
    """DDP on the fake group: the gradient buckets are formed as on a cluster, the collective
    is skipped (the fake group returns nothing to copy back)."""
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

    if getattr(model, "comm_hook_state", None) is None:
        model.register_comm_hook(None, noop_hook)
    model.reducer = _NoRebuild(model.reducer)


def model_of(run, channels: int | None = None, image: tuple[int, int] | None = None, data_root=None):
    """The run's ModelConfig for ``channels`` channels of ``image`` (default: the run's data:
    the ERA5 section's channels and grid, or the hyperspectral store's bands and size)."""

    r = run.settings
    groups = (r.model.groups or r.parallel.tp) if r.model.aggregation != Aggregation.BASELINE else 1
    if channels is not None and channels < groups:
        raise ConfigError(
            f"run {run.name!r}: {channels} channels for {groups} channel groups (model.groups, or one per "
            "tensor-parallel rank under D-CHAG): a group, and under D-CHAG a rank, would hold no channel"
        )
    from ..train.tasks import TASKS, build_task

    shape = TASKS[r.task].shape(r, channels, image)
    if shape is not None:
        return shape

    stores = run.stores(data_root)
    if not Path(stores["train"]).exists():
        raise ConfigError(
            f"run {run.name!r}: give the channels and image size (--channels, --img) or prepare its "
            f"store {stores['train']}"
        )
    return build_task(r, stores).model_cfg


def _check_layout(settings, model_cfg, world_size: int) -> None:
    """What the trainer would refuse, said before anything is built (ConfigError naming the key)."""
    par, m = settings.parallel, model_cfg
    key = f"train.runs.{settings.run}"
    if par.strategy == Strategy.DCHAG and m.aggregation == Aggregation.BASELINE and par.tp > 1:
        raise ConfigError(f"config key '{key}': parallel.strategy dchag needs model.aggregation linear or cross")
    if m.num_heads % par.tp:
        raise ConfigError(
            f"config key '{key}': model.num_heads {m.num_heads} is not divisible by parallel.tp {par.tp} "
            "(tensor parallelism splits the heads)"
        )


def measure_step(r, model_cfg, dims, mesh, batch: int, precision: str, steps: int = 2, fake: bool = False):
    """Build the run's model on ``mesh`` as the trainer does and run ``steps`` training steps
    under MemTracker, on whatever tensors and process group are current (fake: the DDP reducer
    adapted to the fake group). Returns the parameters', gradients' and optimizer state's
    bytes, each kind's bytes at the peak (MemTracker's names) and the model."""
    from ..model import ChannelViT
    from ..parallel.names import unwrap
    from ..parallel.parallelize import autocast, parallelize_model
    from ..train import finetune
    from ..train.memory import step_peak
    from ..train.step import param_groups

    t, device = r.train, torch.device("cpu")
    frozen = finetune.frozen_parts(t)
    torch.manual_seed(t.seed)
    model = parallelize_model(
        ChannelViT(model_cfg),
        dims,
        mesh,
        r.parallel,
        find_unused_parameters=t.rotation is not None,
        freeze=(lambda m: finetune.freeze(m, frozen)) if frozen else None,
    )
    if fake and isinstance(model, nn.parallel.DistributedDataParallel):
        _fake_ddp(model)
    core = unwrap(model)
    groups = param_groups(model, r, model_cfg, dims.tp)
    opt = torch.optim.AdamW(groups, lr=t.lr, weight_decay=t.weight_decay, betas=tuple(t.betas), foreach=True)
    from ..train.tasks import TASKS

    task = TASKS[r.task].synthetic(r, model_cfg)
    channel_group = mesh[MeshAxis.TP].get_group() if core.group_gather is not None and dims.tp > 1 else None
    data = task.synthetic_batch(core.tokenizer.channel_ids.numel(), batch)
    params = list(model.parameters())
    grads = 0
    with step_peak(device, model, opt) as mem:
        for step in range(steps):
            if step:
                mem["new_iteration"]()
            with autocast(device, precision):
                loss, _ = task.loss(model, data, step, t.seed, channel_group)
            loss.backward()
            grads = _storage_bytes(p.grad for p in params)
            opt.step()
            opt.zero_grad(set_to_none=True)
    states = [v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]
    held = {"parameters": _storage_bytes(params), "gradients": grads, "optimizer": _storage_bytes(states)}
    return held, mem["bytes"], core


def estimate(
    run,
    model_cfg,
    batch: int | None = None,
    world_size: int | None = None,
    rank: int = 0,
    steps: int = 2,
    overhead: Overhead = OVERHEAD,
) -> dict:
    """Per-rank memory (bytes) of ``run`` (a dchag.runs.Run) training ``model_cfg`` on a
    micro-batch of ``batch`` (default train.batch_size) on ``world_size`` processes (default
    train.nproc x train.nodes), as rank ``rank`` sees it. Needs a process whose
    torch.distributed is not initialised."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from ..layout import ParallelConfigError
    from ..parallel import ParallelDims
    from ..parallel.parallelize import resolve_precision

    r = run.settings
    par, t = r.parallel, r.train
    world = world_size or t.nproc * t.nodes
    batch = batch or t.batch_size
    _check_layout(r, model_cfg, world)
    try:
        dims = ParallelDims(tp=par.tp, dp_mode=par.data_parallel, world_size=world)
    except ParallelConfigError as err:
        raise ConfigError(f"config key 'train.runs.{r.run}': {err} ({world} processes)") from None
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank}: expected 0 to {world - 1} ({world} processes)")
    precision = resolve_precision(par.precision, torch.device("cuda"))
    with fake_world(world, rank):
        mesh = dims.build_mesh("cpu")  # from real tensors: outside the fake mode
        with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
            held, at_peak, core = measure_step(r, model_cfg, dims, mesh, batch, precision, steps, fake=True)
    peak = float(at_peak.get("Total", sum(at_peak.values())))
    return {
        "run": run.name,
        "rank": rank,
        "world_size": world,
        "tp": dims.tp,
        "dp": dims.dp,
        "data_parallel": dims.dp_mode if dims.dp > 1 else "none",
        "strategy": par.strategy,
        "precision": precision,
        "activation_checkpointing": par.activation_checkpointing,
        "channels": model_cfg.in_channels,
        "rank_channels": int(core.tokenizer.channel_ids.numel()),
        "image": list(model_cfg.img_size),
        "batch": batch,
        "steps": steps,
        **{k: float(v) for k, v in held.items()},
        "activations": float(at_peak.get("Activation", 0)),
        "temporaries": float(at_peak.get("Temp", 0)),
        "peak": peak,
        "reserved": overhead.reserved(peak),
        "overhead": {"scale": overhead.scale, "fixed": overhead.fixed, "fitted": overhead.fitted},
        "at_peak": {k: float(v) for k, v in at_peak.items() if k != "Total"},
    }


def format_table(result: dict) -> str:
    """The estimate as a two-column table (GiB and bytes)."""
    head = (
        f"run {result['run']}: rank {result['rank']} of {result['world_size']} (tp {result['tp']} x dp "
        f"{result['dp']} {result['data_parallel']}, {result['strategy']}, {result['precision']}), "
        f"{result['rank_channels']} of {result['channels']} channels, image {result['image'][0]}x"
        f"{result['image'][1]}, batch {result['batch']}"
    )
    rows = [(k, result[k]) for k in (*KINDS, "peak", "reserved")]
    lines = [head, f"{'':<12} {'GiB':>9} {'bytes':>16}"]
    lines += [f"{name:<12} {v / 2**30:9.3f} {int(v):16d}" for name, v in rows]
    o = result["overhead"]
    lines.append(f"reserved = {o['scale']:.3f} x peak + {o['fixed'] / 2**30:.2f} GiB ({o['fitted']})")
    return "\n".join(lines)
