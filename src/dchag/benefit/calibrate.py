"""`dchag calibrate`: measure this cluster's collectives and a model's compute, write a profile.

Run under torchrun (gloo on the CPU, NCCL on GPUs). All-reduce and all-gather are timed over a
range of message sizes on the whole group and, when the group spans nodes, on one node's
ranks (intra) and on one rank per node (inter); each is fitted to T = a + V/BW, V the bytes a
rank sends in the ring algorithm, and a = (ring steps) x α. With a config, the processor's
rates the compute model uses (hardware.Compute) are measured on every rank at once: matmul
FLOP/s at the model's MLP shape, streaming bandwidth into fresh tensors by size, the fixed cost
per operator or view (small modules forward and backward), and DTensor's extra cost per
tensor-parallel linear layer and per parameter in the optimizer.
Then one training step (AdamW) of the configured model, data-parallel layout, is timed; its
ratio to the step those rates predict for it (``model_step_s`` / ``microbenchmark_step_s``) is
the profile's ``efficiency``. One process is allowed: no collectives are timed then.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from scipy.optimize import nnls

from ..parallel.dims import collective_device
from .hardware import Compute, Hardware
from .trace import count
from .workload import Workload


def workload_from_config(
    config: dict,
    channels: int | None = None,
    batch: int | None = None,
    image: tuple[int, int] | None = None,
    act_bytes: int = 2,
) -> Workload:
    """The cost model's workload for the config's model (forecasting), with the config's ERA5
    channels and grid unless ``channels`` / ``image`` say otherwise."""
    from ..config import ConfigError, settings
    from ..era5.source import forecast_model_config

    if image is None and "era5" not in config:
        raise ConfigError("the config has no era5 section: pass the image size (--image H W) and --channels")
    s = settings(config)
    cfg = forecast_model_config(s, in_channels=channels, img_size=image)
    return Workload(
        channels=cfg.in_channels,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        tokens=cfg.num_patches,
        patch_size=cfg.patch_size,
        batch=batch or s.train.batch_size,
        mlp_ratio=cfg.mlp_ratio,
        act_bytes=act_bytes,
        out_channels=len(cfg.out_channels) or 5,
        tree=s.model.tree,
        bucket_bytes=s.parallel.ddp_bucket_mb * 2**20,
        **({"rotation_fraction": s.train.rotation.fraction} if s.train.rotation else {}),
    )


def _time(fn, repeats: int, group=None, min_s: float = 0.0) -> float:
    """Seconds per call of ``fn``, every rank at once; calls are repeated inside a sample until
    it lasts ``min_s`` (short calls would otherwise time the wake-up after the barrier)."""
    t0 = time.perf_counter()
    fn()  # warm-up
    inner = max(1, int(min_s / max(time.perf_counter() - t0, 1e-7)))
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    # the slowest rank decides: take the maximum over ranks of each rank's median
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def _all_gather(dest: torch.Tensor, part: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(dest, part, group=group)


def _collectives(sizes: list[int], ranks: list[int], repeats: int, device: torch.device) -> dict:
    group = dist.new_group(ranks) if len(ranks) < dist.get_world_size() else None
    out = {"ranks": ranks, "all_reduce": [], "all_gather": []}
    if dist.get_rank() not in ranks:
        return out
    n = len(ranks)
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        out["all_reduce"].append((size, _time(partial(dist.all_reduce, x, group=group), repeats, group)))
        part = torch.ones(max(1, size // 4 // n), dtype=torch.float32, device=device)
        dest = torch.empty(part.numel() * n, dtype=torch.float32, device=device)
        out["all_gather"].append((size, _time(partial(_all_gather, dest, part, group), repeats, group)))
    return out


def fit(points: list[tuple[int, float]], n: int, kind: str) -> dict:
    """T = a + V/BW over the ring volume V, fitted in relative error (a ≥ 0, 1/BW ≥ 0); α = a / ring steps.

    Sizes span four orders of magnitude: an ordinary least-squares fit is decided by the largest
    messages, where a few per cent of noise outweighs the whole latency and drives ``a`` below zero.
    Weighting each point by 1/T makes the small messages set ``a`` and the large ones ``BW``."""
    size = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    steps, vol = (2 * (n - 1), 2 * (n - 1) / n) if kind == "all_reduce" else (n - 1, (n - 1) / n)
    v = size * vol
    (intercept, slope), _ = nnls(np.stack([1 / t, v / t], axis=1), np.ones_like(t))
    slope = max(float(slope), 1e-15)
    pred = intercept + v * slope
    return {
        "alpha": float(intercept / steps),
        "bw": float(1.0 / slope),
        "median_rel_error": float(np.median(np.abs(pred - t) / t)),
        "points": [[int(s), float(x)] for s, x in points],
    }


def _per_op(fn, n: int = 200) -> float:
    """Seconds per call of a tiny ``fn`` (a fixed cost, not a rate)."""
    for _ in range(10):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _processor(w: Workload, device: torch.device, repeats: int) -> dict:
    """The rates the compute model divides by, measured on every rank at once (they share the
    node's cores and memory as the ranks of a training job do)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    m, k, n = w.batch * w.tokens, w.embed_dim, int(w.mlp_ratio * w.embed_dim)
    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    matmul_s = _time(lambda: (torch.mm(a, b), _sync(device)), repeats, min_s=0.05)

    def stream(size: int) -> float:
        x, y = (torch.ones(size // 4, device=device) for _ in range(2))
        return 3 * size / _time(lambda: (x + y, _sync(device)), repeats, min_s=0.05)  # a fresh output, as in training

    curve = [[size, stream(size)] for size in [2**k for k in range(18, (28 if device.type == "cpu" else 30) + 1, 2)]]
    # Fixed cost per operator (or view) in training: small modules forward and backward, the
    # way a model's operators run (module calls, autograd graph), divided by the operators and
    # views the trace counts in it.
    torch.manual_seed(0)
    chain = torch.nn.Sequential(
        *[m for _ in range(8) for m in (torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())]
    ).to(device)
    small = torch.randn(4, 8, device=device)
    run_chain = lambda: (chain(small).sum().backward(), _sync(device))  # noqa: E731
    counted = count(run_chain)
    op_s = _per_op(run_chain, 50) / (counted.ops + counted.views)
    # Tensor-parallel (DTensor) overheads on a one-rank mesh per rank: no communication, only
    # the wrapping, sharding propagation and per-parameter optimizer cost of DTensor.
    solo = init_device_mesh(device.type, (dist.get_world_size(), 1), mesh_dim_names=("others", "solo"))["solo"]
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)).to(device)
    tp = parallelize_module(
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)).to(device),
        solo,
        {"0": ColwiseParallel(), "1": RowwiseParallel()},
    )
    inp = torch.randn(4, 16, device=device)
    tp_linear_s = max(
        0.0, (_per_op(lambda: tp(inp).sum().backward(), 50) - _per_op(lambda: plain(inp).sum().backward(), 50)) / 2
    )
    opt_plain, opt_tp = torch.optim.AdamW(plain.parameters()), torch.optim.AdamW(tp.parameters())
    dtensor_param_s = max(0.0, (_per_op(opt_tp.step, 50) - _per_op(opt_plain.step, 50)) / 4)
    worst = torch.tensor([matmul_s, op_s, tp_linear_s, dtensor_param_s], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank decides
    matmul_s, op_s, tp_linear_s, dtensor_param_s = worst.tolist()
    bws = torch.tensor([bw for _, bw in curve], dtype=torch.float64, device=device)
    dist.all_reduce(bws, op=dist.ReduceOp.MIN)
    curve = [[size, float(bw)] for (size, _), bw in zip(curve, bws)]
    return {
        "flops_per_s": 2 * m * k * n / matmul_s,
        "matmul": [m, k, n],
        "mem_bw": curve[-1][1],
        "mem_curve": curve,
        "op_s": op_s,
        "tp_linear_s": tp_linear_s,
        "dtensor_param_s": dtensor_param_s,
    }


def _model_step(config: dict, w: Workload, device: torch.device, channels: int | None, steps: int) -> float:
    """Seconds of one training step (AdamW) of the config's data-parallel (one-device) model."""
    from ..config import settings
    from ..era5.source import forecast_model_config
    from ..model import ChannelViT

    # data parallelism's model: the baseline aggregation
    # (on the token path, whose work the cost model counts)
    cfg = replace(
        forecast_model_config(settings(config), in_channels=channels),
        aggregation="baseline",
        groups=1,
        fused_front_end=False,
    )
    model = ChannelViT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(w.batch, cfg.in_channels, *cfg.img_size, device=device)
    lead = torch.full((w.batch,), 24.0, device=device)

    def step():
        model(x, lead).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)

    return _time(step, steps)


def calibrate(
    config: dict | None,
    output: str | Path,
    sizes: list[int] | None = None,
    repeats: int = 5,
    channels: int | None = None,
    batch: int | None = None,
    compute_steps: int = 5,
) -> Hardware | None:
    from ..parallel import init_distributed

    backend, device = init_distributed()
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if sizes is None:
        top = 26 if "nccl" in backend else 24
        sizes = [2**k for k in range(10, top + 1, 2)]
    measured = {"backend": backend, "world_size": world, "ranks_per_node": local}
    intra_ranks = list(range(min(local, world)))
    fits = {}
    if len(intra_ranks) >= 2:
        res = _collectives(sizes, intra_ranks, repeats, device)
        fits["intra"] = (
            {k: fit(res[k], len(intra_ranks), k) for k in ("all_reduce", "all_gather")} if res["all_reduce"] else {}
        )
    if world > local:
        res = _collectives(sizes, list(range(0, world, local)), repeats, device)
        fits["inter"] = (
            {k: fit(res[k], len(res["ranks"]), k) for k in ("all_reduce", "all_gather")} if res["all_reduce"] else {}
        )
    measured["collectives"] = fits
    if config is not None:
        from .costmodel import predict

        w = workload_from_config(config, channels, batch, act_bytes=4 if device.type == "cpu" else 2)
        rates = _processor(w, device, repeats)
        step_s = _model_step(config, w, device, channels, compute_steps)
        # the compute model with the microbenchmarks' rates against the model's measured step:
        # their ratio is the profile's efficiency (hardware.Compute)
        predicted = predict(
            w, Hardware(0.0, float("inf"), float("inf"), 1), 1, 1, "dp", Compute.from_measured({"compute": rates})
        ).compute_s
        measured["compute"] = {
            **rates,
            "efficiency": step_s / predicted,
            "model_step_s": step_s,
            "microbenchmark_step_s": predicted,
            "batch": w.batch,
            "channels": w.channels,
            "embed_dim": w.embed_dim,
            "depth": w.depth,
        }
    if dist.get_rank() != 0:
        return None
    if world == 1:  # one process: the processor only; no collectives to time
        hw = Hardware(alpha=0.0, intra_bw=float("inf"), inter_bw=float("inf"), gpus_per_node=1, measured=measured)
        hw.to_yaml(output)
        return hw
    intra = fits.get("intra") or fits.get("inter")
    inter = fits.get("inter") or intra
    hw = Hardware(
        alpha=float(statistics.mean([intra["all_reduce"]["alpha"], intra["all_gather"]["alpha"]])),
        intra_bw=float(statistics.mean([intra["all_reduce"]["bw"], intra["all_gather"]["bw"]])),
        inter_bw=float(statistics.mean([inter["all_reduce"]["bw"], inter["all_gather"]["bw"]])),
        gpus_per_node=local,
        measured=measured,
    )
    hw.to_yaml(output)
    return hw
