"""The typed view of a validated config that the code reads (no defaults of its own: the
schema's are filled in by validation)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import types
import typing
from dataclasses import dataclass

from ..vocabulary import Aggregation, DataParallel, Strategy, Task
from .limits import ConfigError
from .schema import validate


# -- the typed view ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Decoder:
    dim: int
    depth: int
    num_heads: int


@dataclass(frozen=True)
class ModelSettings:
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    aggregation: Aggregation
    groups: int | None
    tree: int
    channel_embedding: str
    fused_front_end: bool
    decoder: Decoder


@dataclass(frozen=True)
class ParallelSettings:
    tp: int
    strategy: Strategy
    data_parallel: DataParallel  # the degree is the processes over tp
    activation_checkpointing: bool
    precision: str
    fsdp_reshard_after_forward: bool
    ddp_bucket_mb: float
    comm_hook: str
    powersgd_rank: int
    compression_fallback: float


@dataclass(frozen=True)
class ForecastSettings:
    outputs: list[str] | None
    lead_hours: list[int]


@dataclass(frozen=True)
class MaeSettings:
    mask_ratio: float
    loss: str


@dataclass(frozen=True)
class Rotation:
    fraction: float
    lr_scale: float


@dataclass(frozen=True)
class MlflowSettings:
    enabled: bool
    tracking_uri: str | None
    experiment: str | None


@dataclass(frozen=True)
class TrainSettings:
    nproc: int
    nodes: int
    gpus_per_node: int
    max_restarts: int
    seed: int
    steps: int
    batch_size: int
    lr: float
    betas: list[float]
    weight_decay: float
    warmup_steps: int
    min_lr_ratio: float
    grad_clip: float
    checkpoint_every: int
    keep_checkpoints: int | None
    val_every: int
    val_batches: int
    num_workers: int
    prefetch_factor: int
    cache_mb: float
    measure_comm: bool
    measure_memory: bool
    tensorboard: bool
    mlflow: MlflowSettings
    forecast: ForecastSettings
    mae: MaeSettings
    rotation: Rotation | None  # None: no channel-subset rotation
    freeze: list[str]
    linear_probe: bool
    runs: dict[str, dict]


@dataclass(frozen=True)
class EvaluateSettings:
    lead_hours: list[int]
    conventions: list[str]
    climax_batch_size: int | None
    inference_batch_size: int
    map_variable: str | None
    foundation: dict[str, dict[str, str]]
    compare: dict[str, str | list[str]]
    significance: dict


@dataclass(frozen=True)
class VerifySettings:
    task: str
    steps: int | None
    batch_size: int | None
    groups: int
    comm_hook: str
    bucket_mb: float
    tolerance: float
    repeats: int


@dataclass(frozen=True)
class Settings:
    """A validated config, typed. The dataset sections stay mappings (every key defaulted by
    the schema); ``raw`` is the validated dict (provenance records it)."""

    name: str
    era5: dict | None
    hsi: dict | None
    model: ModelSettings
    parallel: ParallelSettings
    train: TrainSettings
    evaluate: EvaluateSettings
    verify: VerifySettings | None
    paper: dict | None  # the paper section (defaults filled); dchag.paper.sweep reads it
    raw: dict


@dataclass(frozen=True)
class RunSettings(Settings):
    """One training run: the top-level sections with the run's overrides merged in."""

    run: str
    task: Task
    init_from: str | None  # a run name or a model folder
    channels: list[str] | None  # forecast runs: a subset of the era5 channels


def _build(cls, value, where: str):
    """``value`` (validated, defaults filled) as dataclass ``cls``; a missing or extra key is a
    schema/dataclass disagreement and says which."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(value) - names
    missing = names - set(value)
    if extra or missing:
        raise ConfigError(
            f"config section '{where}': keys {sorted(missing)} missing, {sorted(extra)} unexpected "
            "(the schema and dchag.config disagree)"
        )
    kwargs = {}
    for name in names:
        hint, v = hints[name], value[name]
        sub = (
            [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
            if isinstance(hint, types.UnionType)
            else []
        )
        target = hint if dataclasses.is_dataclass(hint) else (sub[0] if sub else None)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            kwargs[name] = hint(v)  # a vocabulary value, checked by the schema's enum
            continue
        kwargs[name] = (
            _build(target, v, f"{where}.{name}") if target is not None and v is not None else copy.deepcopy(v)
        )
    return cls(**kwargs)


_SECTIONS = ("model", "parallel", "train")


def _complete(config: dict) -> dict:
    """``config`` with the model/parallel/train sections present (the schema defaults them
    only when given, so a dataset-only file stays minimal)."""
    out = copy.deepcopy(config)
    for key in _SECTIONS:
        out.setdefault(key, {})
    return validate(out, "config", check_files=False)


def settings(config: dict) -> Settings:
    """The typed view of a validated config."""
    return _typed(_complete(config), config)


def _typed(c: dict, raw: dict) -> Settings:
    """The typed view of ``c``, validated with its defaults filled in (``raw``: as given)."""
    return Settings(
        name=c["name"],
        era5=c.get("era5"),
        hsi=c.get("hsi"),
        model=_build(ModelSettings, c["model"], "model"),
        parallel=_build(ParallelSettings, c["parallel"], "parallel"),
        train=_build(TrainSettings, {"runs": {}, "rotation": None, **c["train"]}, "train"),  # optional keys
        evaluate=_build(EvaluateSettings, c["evaluate"], "evaluate"),
        verify=_build(VerifySettings, c["verify"], "verify") if "verify" in c else None,
        paper=c.get("paper"),
        raw=raw,
    )


def model_settings(**overrides) -> ModelSettings:
    """A ``model`` section as the schema makes it from ``overrides`` (``decoder`` a dict)."""
    cfg = validate({"name": "model", "model": overrides}, "model settings", check_files=False)
    return _build(ModelSettings, cfg["model"], "model")


def parallel_settings(**overrides) -> ParallelSettings:
    """A ``parallel`` section as the schema makes it from ``overrides`` (for library callers
    with no config file: tests, benchmarks)."""
    cfg = validate({"name": "parallel", "parallel": overrides}, "parallel settings", check_files=False)
    return _build(ParallelSettings, cfg["parallel"], "parallel")


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def run_dict(config: dict, run: str) -> dict:
    """The config of one training run as a validated dict: the top-level model / parallel /
    train sections with the run's overrides merged in, ``train.runs`` holding only this run."""
    runs = config.get("train", {}).get("runs", {})
    if run not in runs:
        raise ConfigError(f"config key 'train.runs': no run named {run!r}; runs are {', '.join(runs) or 'none'}")
    spec = runs[run]
    merged = {k: copy.deepcopy(v) for k, v in config.items() if k not in _SECTIONS}
    for key in _SECTIONS:
        merged[key] = deep_merge(config.get(key, {}), spec.get(key, {}))
    merged["train"]["runs"] = {run: copy.deepcopy(spec)}
    return _complete(merged)


def run_settings(config: dict, run: str) -> RunSettings:
    """The typed config of one training run (see :func:`run_dict`)."""
    merged = run_dict(config, run)  # validated once
    base = _typed(merged, merged)
    return RunSettings(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(Settings)},
        run=run,
        task=Task(merged["train"]["runs"][run]["task"]),
        init_from=merged["train"]["runs"][run].get("init_from"),
        channels=merged["train"]["runs"][run].get("channels"),
    )
