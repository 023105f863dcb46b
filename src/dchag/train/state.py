"""The stateful parts of a training run, each giving and taking its own state as a flat dict
of tensors (``state_dict`` / ``load_state_dict``), as torchtitan's parts do: the checkpoint
manager (``dchag.train.checkpoint``) saves and loads the dict of them and knows none of their
insides. Tensors only: a checkpoint holds no pickled object.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..parallel import names


class ModelState:
    """The parameters as they lie (DTensor shards included), by checkpoint key; DCP loads into
    them in place."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(names.named_parameters(self.model))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass  # loaded in place


class OptimizerState:
    """AdamW's per-parameter state (created if still empty: AdamW makes it lazily, and a
    checkpoint must hold it to be loaded into) and each group's current learning rate."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for key, p in names.named_parameters(self.model):
            st = self.optimizer.state[p]
            if not st and p.requires_grad:
                st.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            for k, v in st.items():
                out[f"{key}.{k}"] = v
        for i, group in enumerate(self.optimizer.param_groups):
            out[f"group{i}.lr"] = torch.tensor(float(group["lr"]), dtype=torch.float64)
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            group["lr"] = float(state[f"group{i}.lr"])


def _numbers(state: dict) -> dict[str, int | float | bool]:
    """The numeric entries of a ``state_dict`` (lists flattened as ``key.i``); the rest
    (functions, strings) is no state a checkpoint needs."""
    out = {}
    for k, v in state.items():
        for i, x in enumerate(v) if isinstance(v, list) else [(None, v)]:
            if isinstance(x, (bool, int, float)):
                out[k if i is None else f"{k}.{i}"] = x
    return out


def _tensor(x: int | float | bool) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else torch.int64)


class SchedulerState:
    """A learning-rate scheduler's ``state_dict`` as tensors (its numbers); the schedule's
    functions come from the config, not from the checkpoint."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: _tensor(x) for k, x in _numbers(self.scheduler.state_dict()).items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        restored = self.scheduler.state_dict()
        for k, v in restored.items():
            if isinstance(v, list):
                restored[k] = [type(x)(state[f"{k}.{i}"].item()) if f"{k}.{i}" in state else x for i, x in enumerate(v)]
            elif k in state:
                restored[k] = type(v)(state[k].item())
        self.scheduler.load_state_dict(restored)


class CountersState:
    """Named integer or float counters (the trainer's step, epoch, sampler position, best
    validation loss); the ``optional`` ones keep their value where a checkpoint lacks them."""

    def __init__(self, counters: dict[str, int | float], optional: tuple[str, ...] = ()):
        self.counters = dict(counters)
        self.optional = optional

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: _tensor(v) for k, v in self.counters.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.counters = {k: type(v)(state[k].item()) if k in state else v for k, v in self.counters.items()}


class RngState:
    """This rank's torch RNG: every rank keys its own (a rank new to a checkpoint of fewer
    ranks keeps the state the run's seed gave it)."""

    per_rank = True

    def __init__(self):
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"rank{self.rank}": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if f"rank{self.rank}" in state:
            torch.set_rng_state(state[f"rank{self.rank}"])
