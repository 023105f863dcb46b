"""One sweep point measured: run under torchrun with ``tp x dp`` processes (one per GPU).

    dchag paper-point --config config/paper.yaml --point NAME --output results/.../NAME.json

Records, per rank, the peak memory of one step — on a GPU ``torch.cuda.max_memory_reserved``
as the paper measures (and the allocator's peak allocated beside it), on the CPU the peak
MemTracker follows (parameters, gradients, optimizer state, activations) — and for a whole
model the front end's share of it (the activation peak of the tokenization + aggregation
forward and backward alone) and the rest; the step time (slowest rank, mean of the timed
steps), samples/s per GPU and TFLOPS per GPU as the paper computes it: 3 x forward FLOPs /
step time, the forward FLOPs being the model's own (counted once by torch's FlopCounterMode on
the one-device model, on the meta device) divided over the TP group's GPUs.

Synthetic data (as the paper's performance runs): a random (B, C, H, W) batch, a forecast head.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..bench.timing import slowest_rank_seconds
from ..config import parallel_settings
from ..model import ChannelViT, ModelConfig
from ..model.build import model_config_of
from ..parallel import ParallelDims, init_distributed
from ..parallel.dims import collective_device
from ..parallel.parallelize import autocast, parallelize_model, resolve_precision
from ..train.memory import KINDS, MIB, step_peak
from ..train.tasks import Task
from ..vocabulary import VARIANTS, MeshAxis
from .sweep import FRONT_VARIANTS, Point

log = logging.getLogger(__name__)

OUTPUTS = 5  # forecast outputs of the synthetic head (the paper's z500, t850, t2m, u10, v10)


def point_model(p: Point) -> ModelConfig:
    """The model a sweep point measures (its variant's aggregation; one channel group per TP
    rank), through the one builder; what a point leaves unset is the schema's default."""
    return model_config_of(
        "forecast",
        p.channels,
        p.image,
        tp=p.tp,
        out_channels=list(range(min(OUTPUTS, p.channels))),
        patch_size=p.patch,
        embed_dim=p.width,
        depth=p.depth,
        num_heads=p.heads,
        aggregation=str(VARIANTS[p.variant].aggregation),
        tree=p.tree,
        fused_front_end=p.fused_front_end,  # the paper's models form the channel tokens (False)
    )


def forward_flops(p: Point) -> float:
    """Forward FLOPs of the one-device model of this point, per sample batch (meta device:
    shapes only, nothing allocated)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = ChannelViT(point_model(p))
        x = torch.empty(p.batch, p.channels, *p.image)
        lead = torch.empty(p.batch)
    with FlopCounterMode(display=False) as counter:
        if p.variant in FRONT_VARIANTS:
            model.aggregate(x) if "aggregate" in p.variant else model.tokenizer(x)
        else:
            model(x, lead)
    return float(counter.get_total_flops())


def _gather_all_tokens(tokens: torch.Tensor, group) -> torch.Tensor:
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(tokens.contiguous(), group=group), dim=1)


class _SyntheticForecast(Task):
    """The benchmark's task: MSE of the forecast of a fixed synthetic batch."""

    name = "forecast"

    def __init__(self, model_cfg: ModelConfig):
        self.model_cfg = model_cfg

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        x, lead, target = batch
        return ((model(x, lead) - target).float() ** 2).mean(), {}


def _training_step(model, core, opt, device, precision, tp_group, batch):
    from ..config import schema_default
    from ..train.step import TrainStep

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    fn = TrainStep(
        model,
        core,
        _SyntheticForecast(core.cfg),
        opt,
        sched,
        device=device,
        precision=precision,
        grad_clip=schema_default("train.grad_clip"),
        tp_group=tp_group,
        channel_group=None,
        rotation=None,
        seed=0,
    )
    counter = iter(range(10**9))
    return lambda: fn(list(batch), next(counter))


def measure(p: Point, steps: int, warmup: int) -> dict:
    """Measure point ``p`` in the initialised process group (world = tp x dp)."""
    device = collective_device()
    world = dist.get_world_size()
    if world != p.gpus:
        raise RuntimeError(f"point {p.name} needs {p.gpus} processes (tp x dp), {world} were started")
    precision = resolve_precision(p.precision, device)
    model, mesh = _parallel_model(p, device, world, precision)
    core = model
    front_only = p.variant in FRONT_VARIANTS
    batch = _synthetic_batch(p, core, mesh, device)
    tp_group = mesh[MeshAxis.TP].get_group() if mesh is not None else None
    opt = None if front_only else torch.optim.AdamW(model.parameters(), lr=1e-4)
    step, front_step = _step_functions(p, model, core, opt, device, precision, tp_group, batch)
    for _ in range(warmup):
        step()
    result = {"point": p.to_dict(), "name": p.name, "precision_run": precision, "world": world}
    per_rank = _peak_memory(p, device, [model, opt] if opt is not None else [model], step, front_step)
    step_s = slowest_rank_seconds(step, steps, device)
    ranks = _every_rank(per_rank, device, world)
    flops = forward_flops(p)
    result.update(
        {
            "ranks": ranks,
            "memory_mib_rank0": ranks[0]["memory_mib"],
            "memory_mib_max": max(r["memory_mib"] for r in ranks),
            "step_s": step_s,
            "samples_per_s_per_gpu": p.batch * p.dp / step_s / p.gpus,
            "forward_flops": flops,
            "tflops_per_gpu": 3 * flops / step_s / p.tp / 1e12,
            "device": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"CPU ({platform.machine()}, {os.cpu_count()} cores, gloo)",
            "memory_measure": "torch.cuda.max_memory_reserved" if device.type == "cuda" else "MemTracker peak (CPU)",
            "torch": torch.__version__,
            "steps": steps,
            "warmup": warmup,
        }
    )
    return result


def _parallel_model(p: Point, device: torch.device, world: int, precision: str):
    """The point's model on ``device``, parallelized over the (tp, dp) mesh (None on one
    process); a front-end ablation without its ViT blocks."""
    dims = ParallelDims(tp=p.tp, dp_mode="fsdp" if p.dp > 1 else "none", world_size=world)
    mesh = dims.build_mesh(device.type) if world > 1 else None
    torch.manual_seed(0)
    model = ChannelViT(point_model(p))
    if p.variant in FRONT_VARIANTS:  # the front end alone: no ViT, no head in memory
        model.blocks = nn.ModuleList()
    model = model.to(device)
    model = parallelize_model(
        model,
        dims,
        mesh,
        parallel_settings(
            strategy=str(VARIANTS[p.variant].strategy), activation_checkpointing=p.activation_checkpointing
        ),
        param_dtype=torch.bfloat16 if precision == "bf16" and p.dp > 1 else None,
    )
    return model, mesh


def _synthetic_batch(p: Point, core, mesh, device: torch.device) -> tuple:
    """(x, lead, target) of this rank: its data-parallel share of a seeded random batch, its
    channels."""
    ids = core.tokenizer.channel_ids.cpu()
    g = torch.Generator().manual_seed(1)
    dp_rank = mesh[MeshAxis.DP].get_local_rank() if mesh is not None else 0
    # drawn on the CPU (the same numbers on any device), then moved to the training device
    x_all = torch.randn(p.batch * p.dp, p.channels, *p.image, generator=g, device="cpu")[
        dp_rank * p.batch : (dp_rank + 1) * p.batch
    ]
    x = x_all[:, ids].to(device)
    lead = torch.full((p.batch,), 24.0, device=device)
    target = torch.randn(p.batch, len(core.cfg.out_channels), *p.image, generator=g, device="cpu").to(device)
    return x, lead, target


def _step_functions(p: Point, model, core, opt, device, precision, tp_group, batch):
    """(step, front_step): one measured step of the point, and the whole model's front end
    alone (forward and backward)."""
    x = batch[0]
    # a whole model trains with the training loop's own step (forward, backward, clipping,
    # the finite check, the optimizer); the front-end ablations only run forward and backward
    train_step = None if opt is None else _training_step(model, core, opt, device, precision, tp_group, batch)

    # The front end's output summed: its gradient is ones, so no loss-sized temporaries are
    # added to what the front end itself holds.
    def front_loss():
        if p.variant == "tokenize" or p.variant == "dist-tokenize":
            return core.tokenizer(x).sum()
        if p.variant == "dist-tokenize+gather-all":
            tokens = core.tokenizer(x)
            if tp_group is not None:
                tokens = _gather_all_tokens(tokens, tp_group)
            return tokens.sum()
        return core.aggregate(x).sum()

    def step():
        if train_step is not None:
            train_step()
            return
        with autocast(device, precision):
            loss = front_loss()
        loss.backward()
        model.zero_grad(set_to_none=True)

    def front_step():
        with autocast(device, precision):
            loss = core.aggregate(x).sum()
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step, front_step


def _peak_memory(p: Point, device: torch.device, tracked: list, step, front_step) -> dict:
    """This rank's peak memory of one step, MiB, and for a whole model without FSDP its front
    end's share: the front end's activation peak (its forward and backward alone; FSDP's root
    unshards the front end's parameters only in the whole model's forward) and the rest."""
    split = p.variant not in FRONT_VARIANTS and p.dp == 1
    if split:
        if device.type == "cuda":
            torch.cuda.synchronize()
            resident = torch.cuda.memory_allocated()
        with step_peak(device, *tracked) as fmem:
            front_step()
        front = fmem["total"] - resident / MIB if device.type == "cuda" else fmem["activations"]
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with step_peak(device, *tracked) as mem:
        step()
    peak = torch.cuda.max_memory_reserved() / MIB if device.type == "cuda" else mem["total"]
    per_rank = {"memory_mib": peak, "allocated_mib": mem["total"]}
    if device.type != "cuda":
        per_rank.update({k: mem[k] for k in KINDS})
    if split:
        per_rank.update(front_mib=front, rest_mib=peak - front)
    return per_rank


def _every_rank(per_rank: dict, device: torch.device, world: int) -> list[dict]:
    """Every rank's numbers, gathered on the training device (NCCL takes no CPU tensors)."""
    keys = sorted(per_rank)
    mine = torch.tensor([float(per_rank[k]) for k in keys], device=device, dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    return [dict(zip(keys, t.tolist())) for t in everyone]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one paper sweep point (run under torchrun)")
    ap.add_argument("--point", required=True, help="the point as JSON (sweep.Point.to_dict)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    point = Point.from_dict(json.loads(args.point))
    init_distributed()
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and not torch.cuda.is_available():
        torch.set_num_threads(int(threads))
    result = measure(point, args.steps, args.warmup)
    if dist.get_rank() == 0:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.partial")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)  # never a complete-looking file from a failed run
        log.info(
            f"{point.name}: {result['memory_mib_rank0']:.1f} MiB on rank 0 (max {result['memory_mib_max']:.1f}), "
            f"{result['step_s']:.4f} s/step, {result['tflops_per_gpu']:.4f} TFLOPS/GPU"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
