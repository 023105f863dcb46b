"""What can be checked about a training run before any job runs: its data section, its
process layout, tensor parallelism against the model, the model's size against the memory it
implies, the patch against the image, the mask ratio, the forecast outputs and leads, the batch
against the data, a model folder a run starts from (checked as a whole, without its
weights' hash). The plan checks every run when the Snakefile is read (``dchag.plan.Plan``) and
``dchag train`` checks its run again (a run started by hand); torch-free but for a run that
starts from a model folder, so planning stays fast."""

from __future__ import annotations

import json
from pathlib import Path

from .config import ConfigError, RunSettings, Settings
from .runs import TASK_SPECS, Run, resolve, task_spec
from .vocabulary import Aggregation, Strategy


def era5_split_steps(era5: dict, split: str) -> int:
    """Time steps of a split's years (the demo's days per year, else whole years)."""
    import calendar

    per_day = 24 // era5["time_step_hours"]
    days = [
        era5["demo_days"] if era5["demo"] and era5["demo_days"] else 365 + calendar.isleap(y)
        for y in era5["years"][split]
    ]
    return sum(days) * per_day


def check_run(s: Settings, run: str, runs: dict[str, dict] | None = None, world_size: int | None = None) -> Run:
    # ``runs``: the runs to look ``run`` up in (the plan's include the verification runs)
    """Everything about training run ``run`` that can be checked before a job runs: its task's
    data section, the process layout against the parallel section, tensor parallelism against
    the heads and channels, the patch against the image or tile, the mask ratio against the
    patch count, the forecast outputs and leads against the channels and time step, the batch
    against the split's size. ``world_size``: the processes started (default: train.nproc x
    train.nodes). Raises ConfigError naming the key and value; returns the run, resolved."""
    from .layout import ParallelConfigError, data_parallel_size

    runs = runs if runs is not None else s.train.runs
    key = f"train.runs.{run}"
    spec = runs[run]
    task = task_spec(spec["task"])
    if task.data(s) is None:
        raise ConfigError(
            f"config key '{key}': task {task.task.value!r} needs an '{task.data_key}' section (the data it trains on)"
        )
    resolved = resolve(s.raw, run, runs)
    r = resolved.settings
    m, par, t = r.model, r.parallel, r.train
    check_init(s, run, runs, r)
    world = world_size or t.nproc * t.nodes
    try:
        dp = data_parallel_size(par.tp, par.data_parallel, world)
    except ParallelConfigError as err:
        started = f"{world} processes started" if world_size else f"train.nproc {t.nproc} x train.nodes {t.nodes}"
        raise ConfigError(f"config key '{key}': {err} ({started})") from None
    if m.embed_dim % m.num_heads:
        raise ConfigError(
            f"config key '{key}': model.embed_dim {m.embed_dim} is not divisible by model.num_heads {m.num_heads}"
        )
    if par.tp > 1 and m.num_heads % par.tp:
        raise ConfigError(
            f"config key '{key}': model.num_heads {m.num_heads} is not divisible by parallel.tp "
            f"{par.tp} (tensor parallelism splits the heads)"
        )
    hierarchical = m.aggregation != Aggregation.BASELINE
    if par.strategy == Strategy.DCHAG:
        if par.tp > 1 and not hierarchical:
            raise ConfigError(f"config key '{key}': parallel.strategy dchag needs model.aggregation linear or cross")
        if hierarchical and par.tp > 1 and (m.groups or par.tp) != par.tp:
            raise ConfigError(
                f"config key '{key}': D-CHAG needs one channel group per tensor-parallel rank: "
                f"model.groups {m.groups} with parallel.tp {par.tp}"
            )
    groups = (m.groups or par.tp) if hierarchical else 1
    task.check(s, r, spec, groups, dp)
    return resolved


def block_parameters(dim: int, mlp_ratio: float) -> int:
    """Parameters of one ViT block (``dchag.model.layers.Block``): two layer norms, the
    query, key/value and output projections, the MLP."""
    hidden = int(dim * mlp_ratio)
    return 2 * 2 * dim + 4 * (dim * dim + dim) + (dim * hidden + hidden) + (hidden * dim + dim)


def block_weights(r) -> tuple[int, str]:
    """Parameters of a run's ViT blocks (and an MAE's decoder blocks), with the keys that set
    them. ``r``: the run's RunSettings."""
    m = r.model
    blocks = m.depth * block_parameters(m.embed_dim, m.mlp_ratio)
    what = f"model.embed_dim {m.embed_dim}, model.depth {m.depth}"
    if task_spec(r.task).masked:
        blocks += m.decoder.depth * block_parameters(m.decoder.dim, m.mlp_ratio)
        what += f", model.decoder.dim {m.decoder.dim}, model.decoder.depth {m.decoder.depth}"
    return blocks, f"{what} and model.mlp_ratio {m.mlp_ratio}"


def model_mb(r) -> float:
    """MB of the one-device float32 model's blocks, which every process builds before the
    model is parallelized."""
    return block_weights(r)[0] * 4 / 2**20


def check_model_size(key: str, r, limit_mb: float, where: str) -> None:
    """Every process of a node builds the whole one-device model (float32) before it is
    parallelized: its blocks, times the processes of a node, must fit in ``limit_mb`` (the
    memory ``where`` describes). ``r``: the run's RunSettings."""
    blocks, what = block_weights(r)
    mb, nproc = model_mb(r), r.train.nproc
    if mb * nproc > limit_mb:
        raise ConfigError(
            f"config key '{key}': {what} give {blocks:,} parameters in the transformer blocks alone: "
            f"{mb:,.0f} MB in float32 on each of the {nproc} processes of a node, more than the "
            f"{limit_mb:,.0f} MB of {where}"
        )


FREEZABLE = ("tokenizer", "aggregation", "blocks", "head")  # train.freeze's parts (dchag.train.finetune.PARTS)


def init_source(run: str, runs: dict[str, dict]) -> tuple[str, str] | None:
    """("run", name) or ("model", path) of a run's init_from, or None."""
    src = runs[run].get("init_from")
    if src is None:
        return None
    return ("run", src) if src in runs else ("model", src)


def check_init(s: Settings, run: str, runs: dict[str, dict], r: RunSettings) -> None:
    """A run's init_from names a run of train.runs or a model folder, follows no
    cycle, comes from data of the same family (named ERA5 channels, or bands); freezing needs
    a source, a linear probe a classifier."""
    key = f"train.runs.{run}"
    spec = runs[run]
    if (r.train.freeze or r.train.linear_probe) and not spec.get("init_from"):
        raise ConfigError(
            f"config key '{key}': train.freeze / train.linear_probe freeze pretrained parts; give init_from "
            "(a run or a model folder) to start from"
        )
    if r.train.linear_probe and not task_spec(spec["task"]).classifies:
        raise ConfigError(
            f"config key '{key}': train.linear_probe trains a classifier head; this is a {spec['task']} run"
        )
    if r.train.linear_probe and r.train.freeze:
        raise ConfigError(
            f"config key '{key}': train.linear_probe freezes everything but the classifier head; "
            f"train.freeze {list(r.train.freeze)} besides it says otherwise: give one of them"
        )
    if set(r.train.freeze) >= set(FREEZABLE):
        raise ConfigError(
            f"config key '{key}': train.freeze {list(r.train.freeze)} freezes every part of the model "
            "(nothing would be trained); leave at least one part out"
        )
    source = init_source(run, runs)
    if source is None:
        return
    kind, name = source
    if kind == "run":
        seen = [run]
        while kind == "run":
            if name in seen:
                raise ConfigError(f"config key '{key}.init_from': a cycle: {' -> '.join([*seen, name])}")
            seen.append(name)
            nxt = init_source(name, runs)
            if nxt is None:
                break
            kind, name = nxt
        src_task = runs[spec["init_from"]]["task"]
    else:
        meta = Path(name) / "model.json"
        if not meta.is_file():
            raise ConfigError(
                f"config key '{key}.init_from': {name!r} names no run of train.runs ({', '.join(runs)}) and no "
                f"model folder (no {meta})"
            )
        try:
            src_task = json.loads(meta.read_text()).get("task")
        except (ValueError, AttributeError) as err:
            raise ConfigError(f"config key '{key}.init_from': {meta} is not a dchag model description: {err}") from None
        if src_task not in TASK_SPECS:
            raise ConfigError(f"config key '{key}.init_from': {meta} describes no dchag model (task {src_task!r})")
    src_family, family = task_spec(src_task).family, task_spec(spec["task"]).family
    if src_family != family:
        raise ConfigError(
            f"config key '{key}.init_from': a {src_task} model reads {src_family}, this {spec['task']} run "
            f"reads {family}: nothing to match its channels by"
        )
    if kind == "model":  # the whole folder, as loading checks it before hashing: sizes, header, shapes
        from .model.folder import ModelFolderError, check

        try:
            check(name)
        except ModelFolderError as err:
            raise ConfigError(f"config key '{key}.init_from': {err}") from None
