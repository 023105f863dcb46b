"""How a parallelized model's parameters are named in checkpoints, both ways.

The one-device model names its parameters plainly (``blocks.0.attn.inner.wq.weight``). The
wrappers a parallelization adds (DDP's ``module.``, activation checkpointing's
``_checkpoint_wrapped_module.``) are not part of a name. Under D-CHAG, tensor-parallel rank r
holds channel block [lo, hi) of the tokenizer's per-channel parameters; its entries are keyed
``tokenizer[lo:hi].<name>`` so the blocks of different ranks never collide, and put back side
by side they are the one-device hierarchical model's tokenizer (:func:`consolidation`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch
from torch import nn

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.",)
BLOCK_KEY = re.compile(r"tokenizer\[(\d+):(\d+)\]\.(.+)")
PER_CHANNEL = ("weight", "bias", "channel_embed")  # tokenizer parameters with a leading channel axis


def unwrap(model: nn.Module) -> nn.Module:
    """The model under a DDP wrapper (the model itself otherwise)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def canonical(name: str) -> str:
    """A parameter's name without the wrappers' prefixes."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name.removeprefix("module.")


def holds_channel_block(model: nn.Module) -> bool:
    """True under D-CHAG: the rank's tokenizer holds one block of the channels."""
    return getattr(unwrap(model), "group_gather", None) is not None


def checkpoint_key(name: str, model: nn.Module) -> str:
    """The key of parameter ``name`` of ``model`` in a checkpoint."""
    name = canonical(name)
    if name.startswith("tokenizer.") and holds_channel_block(model):
        ids = unwrap(model).tokenizer.channel_ids
        return f"tokenizer[{int(ids[0])}:{int(ids[-1]) + 1}]." + name.removeprefix("tokenizer.")
    return name


def named_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(checkpoint key, parameter) of every parameter of the (parallelized) model."""
    for name, p in model.named_parameters():
        yield checkpoint_key(name, model), p


def consolidation(saved: dict[str, tuple[int, ...]], model: nn.Module) -> tuple[dict[str, list[str]], list[str]]:
    """How to fill a one-device model from a checkpoint's keys (and their shapes): parameter
    name -> the saved keys to concatenate along the channel axis (one key for everything but
    D-CHAG's per-channel tokenizer blocks); and the problems (missing keys, blocks that do not
    cover the channels)."""
    blocks: dict[str, list[tuple[int, int, str]]] = {}
    for key in saved:
        m = BLOCK_KEY.fullmatch(key)
        if m:
            blocks.setdefault(m.group(3), []).append((int(m.group(1)), int(m.group(2)), key))
    plan: dict[str, list[str]] = {}
    problems = []
    for name, p in model.named_parameters():
        name = canonical(name)
        short = name.removeprefix("tokenizer.")
        if name in saved:
            plan[name] = [name]
        elif name.startswith("tokenizer.") and short in blocks:
            parts = sorted(blocks[short])
            if short not in PER_CHANNEL:
                plan[name] = [parts[0][2]]
                continue
            plan[name] = [k for _, _, k in parts]
            if parts[0][0] != 0 or parts[-1][1] != p.shape[0] or any(a[1] != b[0] for a, b in zip(parts, parts[1:])):
                problems.append(
                    f"{name}: channel blocks {[(lo, hi) for lo, hi, _ in parts]} do not cover 0..{p.shape[0]}"
                )
        else:
            problems.append(f"{name}: not in the checkpoint")
    return plan, problems


def assemble(plan: dict[str, list[str]], loaded: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The one-device parameters from the loaded keys (blocks side by side)."""
    return {
        name: torch.cat([loaded[k] for k in keys]) if len(keys) > 1 else loaded[keys[0]] for name, keys in plan.items()
    }
