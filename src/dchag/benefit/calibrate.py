"""`dchag calibrate`: measure this cluster's collectives and a model's compute, write a profile.

Run under torchrun (gloo on the CPU, NCCL on GPUs). All-reduce and all-gather are timed over a
range of message sizes on the whole group and, when the group spans nodes, on one node's
ranks (intra) and on one rank per node (inter); each is fitted to T = a + V/BW, V the bytes a
rank sends in the ring algorithm, and a = (ring steps) x α. The compute time of one training
step (forward + backward) of the configured model, on each rank at once, gives the sustained
FLOP/s the cost model divides by.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .costmodel import Workload
from .hardware import Hardware


def workload_from_config(config: dict, channels: int | None = None, batch: int | None = None,
                         image: tuple[int, int] | None = None, act_bytes: int = 2) -> Workload:
    """The cost model's workload for the config's model (forecasting), with the config's ERA5
    channels and grid unless ``channels`` / ``image`` say otherwise."""
    from ..config import ConfigError
    from ..model.build import model_config

    if image is None and "era5" not in config:
        raise ConfigError("the config has no era5 section: pass the image size (--image H W) and --channels")
    cfg = model_config(config, "forecast", in_channels=channels, img_size=image)
    m = config.get("model", {})
    return Workload(channels=cfg.in_channels, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                    tokens=cfg.num_patches, patch_size=cfg.patch_size,
                    batch=batch or int(config.get("train", {}).get("batch_size", 8)), mlp_ratio=cfg.mlp_ratio,
                    act_bytes=act_bytes, out_channels=len(cfg.out_channels) or 5, tree=m.get("tree", 0))


def _time(fn, repeats: int, group=None) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    # the slowest rank decides: take the maximum over ranks of each rank's median
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
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
        out["all_reduce"].append((size, _time(lambda: dist.all_reduce(x, group=group), repeats, group)))
        part = torch.ones(max(1, size // 4 // n), dtype=torch.float32, device=device)
        dest = torch.empty(part.numel() * n, dtype=torch.float32, device=device)
        out["all_gather"].append((size, _time(lambda: _all_gather(dest, part, group), repeats, group)))
    return out


def fit(points: list[tuple[int, float]], n: int, kind: str) -> dict:
    """Least squares of T = a + V/BW over the ring volume V; α = a / ring steps."""
    size = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    steps, vol = (2 * (n - 1), 2 * (n - 1) / n) if kind == "all_reduce" else (n - 1, (n - 1) / n)
    v = size * vol
    slope, intercept = (float(c) for c in np.polyfit(v, t, 1))
    slope = max(slope, 1e-15)
    intercept = max(intercept, 0.0)
    pred = intercept + v * slope
    return {"alpha": float(intercept / steps), "bw": float(1.0 / slope), "median_rel_error": float(np.median(np.abs(pred - t) / t)),
            "points": [[int(s), float(x)] for s, x in points]}


def _compute(config: dict, device: torch.device, channels: int | None, batch: int | None, steps: int) -> dict:
    from ..model import ChannelViT
    from ..model.build import model_config

    cfg = model_config(config, "forecast", in_channels=channels)
    cfg.aggregation, cfg.groups = "baseline", 1  # the data-parallel (one-device) model
    model = ChannelViT(cfg).to(device)
    b = batch or int(config.get("train", {}).get("batch_size", 8))
    x = torch.randn(b, cfg.in_channels, *cfg.img_size, device=device)
    lead = torch.full((b,), 24.0, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x, lead).float().pow(2).mean().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step_s = _time(step, steps)
    w = workload_from_config(config, channels, b, act_bytes=4 if device.type == "cpu" else 2)
    flops = 3 * (w.front_flops(w.channels, "baseline", 1) + w.backbone_flops() + w.head_flops())
    return {"step_s": step_s, "train_flops": flops, "flops_per_s": flops / step_s, "batch": b, "channels": cfg.in_channels,
            "image": list(cfg.img_size), "embed_dim": cfg.embed_dim, "depth": cfg.depth}


def calibrate(config: dict | None, output: str | Path, sizes: list[int] | None = None, repeats: int = 5,
              channels: int | None = None, batch: int | None = None, compute_steps: int = 5) -> Hardware | None:
    from ..parallel import init_distributed

    backend, device = init_distributed()
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if sizes is None:
        top = 26 if backend == "nccl" else 24
        sizes = [2**k for k in range(10, top + 1, 2)]
    measured = {"backend": backend, "world_size": world, "ranks_per_node": local}
    if world < 2:
        raise RuntimeError("calibrate needs at least 2 processes (torchrun --nproc-per-node 2 ...)")
    intra_ranks = list(range(min(local, world)))
    fits = {}
    if len(intra_ranks) >= 2:
        res = _collectives(sizes, intra_ranks, repeats, device)
        fits["intra"] = {k: fit(res[k], len(intra_ranks), k) for k in ("all_reduce", "all_gather")} if res["all_reduce"] else {}
    if world > local:
        res = _collectives(sizes, list(range(0, world, local)), repeats, device)
        fits["inter"] = {k: fit(res[k], len(res["ranks"]), k) for k in ("all_reduce", "all_gather")} if res["all_reduce"] else {}
    measured["collectives"] = fits
    if config is not None:
        measured["compute"] = _compute(config, device, channels, batch, compute_steps)
    if dist.get_rank() != 0:
        return None
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
