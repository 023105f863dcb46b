"""NCCL takes no CPU tensors. This machine has no GPU, so the rule of dchag.parallel.dims —
every tensor handed to a collective lies on the training device, and a CUDA run's default
group also has gloo for torch's own CPU objects — is checked two ways on the CPU: the group a
CUDA run asks for, and every collective call site of the package and its benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from support import REPO

from dchag.parallel import dims

COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "gather",
    "broadcast",
    "reduce_scatter",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce",
    "scatter",
    "all_to_all",
}
FACTORIES = {"tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand", "as_tensor"}


def test_a_cuda_run_asks_for_nccl_with_gloo_beside_it(monkeypatch):
    asked = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: asked.setdefault("set_device", device))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: asked.update(kw))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    backend, device = dims.init_distributed()
    assert device == torch.device("cuda", 1) and asked["set_device"] == device and asked["device_id"] == device
    # NCCL for CUDA tensors, gloo for CPU ones (torch's object collectives): one group takes both
    assert set(asked["backend"].split(",")) == {"cpu:gloo", "cuda:nccl"} and backend == asked["backend"]


def _sources() -> list[Path]:
    return sorted((REPO / "src" / "dchag").rglob("*.py")) + sorted((REPO / "benchmarks").glob("*.py"))


def _calls(node, names):
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in names:
            yield n


def test_every_collective_gets_tensors_made_for_the_training_device():
    """In each function that calls a collective, every tensor made from scratch (torch.tensor,
    zeros, ...) names its device: made without one it lands on the CPU, which NCCL refuses
    (the trainer's validation and per-step gathers, gradient clipping and the MAE gather did)."""
    checked, offenders = 0, []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            collectives = [
                c
                for c in _calls(fn, COLLECTIVES)
                if isinstance(c.func.value, ast.Name) and c.func.value.id in ("dist", "funcol")
            ]
            if not collectives:
                continue
            checked += 1
            moved = {id(n) for to in _calls(fn, {"to"}) for n in ast.walk(to.func.value)}  # torch.randn(...).to(device)
            for call in _calls(fn, FACTORIES):
                if (
                    isinstance(call.func.value, ast.Name)
                    and call.func.value.id == "torch"
                    and id(call) not in moved
                    and not any(k.arg == "device" for k in call.keywords)
                ):
                    offenders.append(
                        f"{path.relative_to(REPO)}:{call.lineno} {fn.name}: torch.{call.func.attr}(...) without device="
                    )
    assert checked >= 8  # the scan sees the call sites (trainer, metrics, clipping, MAE gather, calibrate, ...)
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("world", [2])
def test_the_mae_gather_pads_uneven_blocks_on_its_inputs_device(world):
    from support.distributed import run_distributed

    run_distributed(_gather_check, world)


def _gather_check(rank, world):
    from dchag.parallel.collectives import gather_channels

    group = dist.new_group(list(range(world)))
    width = 3 if rank == 0 else 2  # uneven blocks: 3 + 2 channels
    x = torch.full((2, width, 4, 4), float(rank)).to(torch.float64)
    out = gather_channels(x, group, [3, 2])
    assert out.shape == (2, 5, 4, 4) and out.dtype == x.dtype and out.device == x.device
    assert out[:, :3].eq(0).all() and out[:, 3:].eq(1).all()
