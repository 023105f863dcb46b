"""Checks that run inside every rank of a gloo process group (see distributed.py).

Each compares a parallelized model with the one-device model holding the same weights.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from dchag.config import parallel_settings
from dchag.model import ChannelViT, ModelConfig
from dchag.model.build import model_config_of
from dchag.parallel import ParallelDims
from dchag.parallel.parallelize import clip_grad_norm_, parallelize_model

RTOL = 1e-5


def small_config(**kw) -> ModelConfig:
    base = dict(
        in_channels=8,
        img_size=(8, 16),
        patch_size=4,
        embed_dim=16,
        depth=2,
        num_heads=4,
        aggregation="linear",
        groups=2,
        task="forecast",
        out_channels=[0, 3],
    )
    base.update(kw)
    return model_config_of(**base)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


ATOL = 1e-7  # for gradients that vanish analytically (e.g. attention key biases: softmax is shift-invariant)


def close(a: torch.Tensor, b: torch.Tensor, what: str, rtol: float = RTOL) -> None:
    a, b = full(a).detach().double(), full(b).detach().double()
    err = (a - b).norm()
    if a.shape != b.shape or not err <= rtol * b.norm() + ATOL * b.numel() ** 0.5:
        rel = float(err / b.norm().clamp_min(1e-30))
        raise AssertionError(
            f"{what}: relative error {rel:.3g}, |ref| {float(b.norm()):.3g} "
            f"(shapes {tuple(a.shape)} vs {tuple(b.shape)})"
        )


def _batch(cfg: ModelConfig, batch: int = 2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cfg.in_channels, *cfg.img_size, generator=g)
    lead = torch.rand(batch, generator=g) * 240
    target = torch.randn(batch, len(cfg.out_channels), *cfg.img_size, generator=g)
    return x, lead, target


def _loss(model, x, lead, target):
    """The task's loss on the model's input ``x`` (a rank's channel block under D-CHAG); the
    targets are whole: the forecast fields, every channel of the input for masked
    autoencoding (as the trainer gathers them), class labels."""
    task = getattr(model, "module", model).cfg.task
    if task == "forecast":
        return ((model(x, lead) - target) ** 2).mean()
    if task == "classification":
        return torch.nn.functional.cross_entropy(model(x), target)
    from dchag.model import random_masking

    ids_keep, mask = random_masking(
        x.shape[0], getattr(model, "module", model).cfg.num_patches, 0.5, torch.Generator().manual_seed(3)
    )
    pred = model(x, ids_keep=ids_keep)
    return ((pred - target) ** 2).mean()


def _targets(cfg: ModelConfig, x, target):
    if cfg.task == "mae":
        return x
    if cfg.task == "classification":
        return torch.arange(x.shape[0]) % cfg.num_classes
    return target


def check_tp_matches_one_device(
    rank: int, world: int, strategy: str, cases: list[dict], reference_fused: bool | None = None
) -> None:
    """TP baseline or D-CHAG on ``world`` ranks == one-device model (same weights): outputs and
    every parameter gradient, and rank r tokenizes exactly its channel block. ``reference_fused``:
    the one-device model's front end (fused or token path; None: the parallel model's)."""
    dims = ParallelDims(tp=world, dp_mode="none", world_size=world)
    mesh = dims.build_mesh("cpu")
    for case in cases:
        cfg = small_config(**case)
        torch.manual_seed(0)
        reference = ChannelViT(cfg)
        if reference_fused is not None:
            # learned queries and mixing weights away from their uniform start, so the
            # attention weights differ between channels
            with torch.no_grad():
                for name, p in reference.named_parameters():
                    if name.endswith(("query", "mix.weight")):
                        p.normal_()
        model = parallelize_model(copy.deepcopy(reference), dims, mesh, parallel_settings(strategy=strategy))
        if reference_fused is not None:
            other = ChannelViT(dataclasses.replace(cfg, fused_front_end=reference_fused))
            other.load_state_dict(reference.state_dict())
            reference = other
        x, lead, target = _batch(cfg)

        ids = model.tokenizer.channel_ids
        if strategy == "dchag":
            lo, hi = reference.groups[rank]
            assert ids.tolist() == list(range(lo, hi)), (
                f"rank {rank} holds channels {ids.tolist()}, expected {lo}..{hi - 1}"
            )
        # The rank's input is chosen by the channel ids its tokenizer holds; a hook proves the
        # tokenizer saw exactly those channels (each channel filled with its own index).
        seen = {}
        hook = model.tokenizer.register_forward_hook(lambda m, inp, out: seen.update(x=inp[0].detach().clone()))
        probe = torch.arange(cfg.in_channels, dtype=torch.float32)[None, :, None, None].expand_as(x)
        model(probe[:, ids], lead)
        hook.remove()
        got = seen["x"].amax(dim=(0, 2, 3)).tolist()
        assert got == [float(c) for c in ids.tolist()], f"rank {rank} tokenized channels {got}"

        y = _targets(cfg, x, target)
        ref_loss = _loss(reference, x, lead, y)
        ref_loss.backward()
        loss = _loss(model, x[:, ids], lead, y)
        loss.backward()
        close(loss, ref_loss, f"{case} loss")
        if cfg.task != "mae":
            close(model(x[:, ids], lead), reference(x, lead), f"{case} output")
        ref_params = dict(reference.named_parameters())
        names = set()
        for name, p in model.named_parameters():
            ref = ref_params[name]
            if not ref.requires_grad:  # the MAE decoder's fixed position embedding
                assert p.grad is None and not p.requires_grad, name
                names.add(name)
                continue
            ref_grad = ref.grad
            if name.startswith("tokenizer.") and strategy == "dchag":
                ref_grad = ref_grad[ids]
            close(p.grad, ref_grad, f"{case} grad of {name}")
            names.add(name)
        expected = {
            n
            for n in ref_params
            if (strategy == "baseline" or not n.startswith("partial.") or n.startswith(f"partial.{rank}."))
            and ref_params[n].requires_grad
        }
        assert names >= expected and all(not ref_params[n].requires_grad for n in names - expected), sorted(
            names ^ expected
        )
        # Clipping by the global norm: the parallel model's norm is the one-device model's
        # (each parameter counted once), and so are the clipped gradients.
        norm = clip_grad_norm_(model, 1e-3, mesh["tp"].get_group())
        ref_norm = torch.nn.utils.clip_grad_norm_([p for p in reference.parameters() if p.grad is not None], 1e-3)
        close(norm, ref_norm.double(), f"{case} gradient norm")
        for name, p in model.named_parameters():
            if p.grad is not None:
                ref_grad = (
                    ref_params[name].grad[ids]
                    if name.startswith("tokenizer.") and strategy == "dchag"
                    else ref_params[name].grad
                )
                close(p.grad, ref_grad, f"{case} clipped grad of {name}")


class CollectiveLog(TorchDispatchMode):
    """Records every functional collective (as DTensor and funcol issue them): op, numel, phase."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.calls: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if "_c10d_functional" in name and "wait" not in name:
            self.calls.append((self.phase, name.split(".")[-1], args[0].numel()))
        return func(*args, **(kwargs or {}))

    def of(self, phase: str, op: str) -> list[int]:
        return [n for p, o, n in self.calls if p == phase and op in o]


def check_communication(rank: int, world: int, strategy: str) -> None:
    """Per training step: D-CHAG gathers B*L*D elements per rank once in forward and nothing
    in backward, and all-reduces the final aggregation's input gradient (B*L*T*D); the
    baseline gathers nothing and all-reduces B*L*C*D."""
    dims = ParallelDims(tp=world, dp_mode="none", world_size=world)
    mesh = dims.build_mesh("cpu")
    cfg = small_config(in_channels=12, groups=world, aggregation="linear" if strategy == "dchag" else "baseline")
    torch.manual_seed(0)
    model = parallelize_model(ChannelViT(cfg), dims, mesh, parallel_settings(strategy=strategy))
    x, lead, target = _batch(cfg, batch=3)
    ids = model.tokenizer.channel_ids
    log = CollectiveLog()
    with log:
        loss = _loss(model, x[:, ids], lead, target)
        log.phase = "backward"
        loss.backward()
    b, l, d, c, t = 3, cfg.num_patches, cfg.embed_dim, cfg.in_channels, world
    gathers_fwd, gathers_bwd = log.of("forward", "all_gather"), log.of("backward", "all_gather")
    reduces_bwd = log.of("backward", "all_reduce")
    if strategy == "dchag":
        assert gathers_fwd == [b * l * d], log.calls
        assert gathers_bwd == [], log.calls
        assert reduces_bwd.count(b * l * t * d) == 1, log.calls
        assert b * l * c * d not in reduces_bwd
    else:
        assert gathers_fwd == [] and gathers_bwd == [], log.calls
        assert reduces_bwd.count(b * l * c * d) == 1, log.calls


def check_data_parallel_step(
    rank: int, world: int, tp: int, dp_mode: str, strategy: str, frozen: tuple[str, ...] = ()
) -> None:
    """One optimizer step with the global batch split over the data-parallel ranks equals a
    single-process step on the whole batch. With ``frozen`` parts (fine-tuning: a linear probe
    freezes all but the head) two steps, the frozen parameters unchanged: DDP and FSDP take the
    trainable parameters as they find them when they wrap, so freezing comes after D-CHAG made
    its tokenizer parameters and before they wrap."""
    from dchag.train.finetune import freeze

    dims = ParallelDims(tp=tp, dp_mode=dp_mode, world_size=world)
    mesh = dims.build_mesh("cpu")
    aggregation = "linear" if strategy == "dchag" else "baseline"
    cfg = small_config(in_channels=8, groups=tp if strategy == "dchag" else 1, aggregation=aggregation)
    torch.manual_seed(0)
    reference = ChannelViT(cfg)
    model = parallelize_model(
        copy.deepcopy(reference),
        dims,
        mesh,
        parallel_settings(strategy=strategy),
        freeze=(lambda m: freeze(m, list(frozen))) if frozen else None,
    )
    freeze(reference, list(frozen))
    before = {k: v.detach().clone() for k, v in reference.named_parameters()}
    core = model.module if hasattr(model, "module") else model
    x, lead, target = _batch(cfg, batch=2 * dims.dp, seed=5)
    dp_rank = mesh["dp"].get_local_rank()
    part = slice(2 * dp_rank, 2 * dp_rank + 2)

    # SGD, not Adam: Adam turns gradients that vanish analytically (attention key biases) into
    # full-size steps of their rounding noise, which no two summation orders share.
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = core.tokenizer.channel_ids
    for _ in range(2 if frozen else 1):
        ref_opt.zero_grad()
        _loss(reference, x, lead, target).backward()
        ref_opt.step()
        opt.zero_grad()
        _loss(model, x[part][:, ids], lead[part], target[part]).backward()
        opt.step()

    # The global gradient norm clipping takes is the full-batch model's (the last step's gradients).

    norm = clip_grad_norm_(model, float("inf"), mesh["tp"].get_group() if tp > 1 else None)
    ref_norm = torch.nn.utils.clip_grad_norm_([p for p in reference.parameters() if p.grad is not None], float("inf"))
    close(norm, ref_norm.double(), f"{dp_mode} tp={tp} {strategy}: gradient norm", rtol=1e-5)
    ref_params = dict(reference.named_parameters())
    moved = 0
    for name, p in core.named_parameters():
        key = name.replace("_fsdp_wrapped_module.", "")
        ref = ref_params[key].detach()
        if key.startswith("tokenizer.") and strategy == "dchag":
            ref = ref[ids]
        close(p.detach(), ref, f"{dp_mode} tp={tp} {strategy}: {key} after the step(s)", rtol=1e-5)
        if frozen:
            assert p.requires_grad == ref_params[key].requires_grad, key
            moved += not torch.equal(ref_params[key].detach(), before[key])
            if not p.requires_grad:
                assert torch.equal(ref_params[key].detach(), before[key]), f"{key} is frozen but moved"
    assert not frozen or moved > 0  # the head trained
    dist.barrier()


def check_activation_checkpointing(rank: int, world: int) -> None:
    """Recomputing the ViT blocks and the final aggregation in backward changes nothing."""
    dims = ParallelDims(tp=world, dp_mode="none", world_size=world)
    mesh = dims.build_mesh("cpu")
    cfg = small_config(groups=world)
    torch.manual_seed(0)
    base = ChannelViT(cfg)
    plain = parallelize_model(copy.deepcopy(base), dims, mesh, parallel_settings(strategy="dchag"))
    recomputed = parallelize_model(
        copy.deepcopy(base), dims, mesh, parallel_settings(strategy="dchag", activation_checkpointing=True)
    )
    x, lead, target = _batch(cfg)
    ids = plain.tokenizer.channel_ids
    for m in (plain, recomputed):
        _loss(m, x[:, ids], lead, target).backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in recomputed.named_parameters()}
    assert any("_checkpoint_wrapped_module" in n for n, _ in recomputed.named_parameters())
    for name, p in plain.named_parameters():
        close(grads[name], p.grad, f"activation checkpointing: grad of {name}", rtol=1e-6)


def check_checkpoint_exports(rank: int, world: int, strategy: str, directory: str, cfg_kw: dict) -> None:
    """Save a parallelized model's training checkpoint and, on rank 0, its output on a fixed
    batch, for the one-device export test."""
    from dchag.train import checkpoint as ckpt
    from dchag.train import state

    cfg = small_config(**cfg_kw)
    dims = ParallelDims(tp=world, dp_mode="none", world_size=world)
    mesh = dims.build_mesh("cpu")
    torch.manual_seed(3)
    model = parallelize_model(ChannelViT(cfg), dims, mesh, parallel_settings(strategy=strategy))
    opt = torch.optim.AdamW(model.parameters())
    ids = model.tokenizer.channel_ids
    x, lead, _ = _batch(cfg)
    with torch.no_grad():
        out = model(x[:, int(ids[0]) : int(ids[-1]) + 1], lead)
    ckpt.save(
        ckpt.flatten({"model": state.ModelState(model), "optim": state.OptimizerState(model, opt)}),
        f"{directory}/final",
    )
    if rank == 0:
        torch.save({"x": x, "lead": lead, "out": full(out)}, f"{directory}/reference.pt")
