"""Loading and checking the pipeline config against ``schemas/config.schema.yaml``, and the
typed view of it that the code reads.

Defaults live in the schema only: validation fills every default in, and the dataclasses
below have no defaults of their own, so a key the schema does not default is an error here
rather than a silent fallback somewhere else. The Snakefile validates with Snakemake's
``validate`` (same schema) and then calls :func:`check_config`; the CLI loads files with
:func:`load_config`, which does both; :func:`settings` and :func:`run_settings` give the
typed objects.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import yaml

from .errors import DchagError

SCHEMA_PATH = Path(__file__).parent / "schemas" / "config.schema.yaml"


class ConfigError(DchagError, ValueError):
    """The config is invalid; the message names the key or file at fault."""


@functools.cache
def schema() -> dict:
    """The parsed schema, read once per process (callers must not change it)."""
    with open(SCHEMA_PATH) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def schema_default(dotted: str):
    """The schema's default of a key, e.g. ``hsi.classification.patch`` (for the standalone
    commands' flags: one place for every default)."""
    sch = schema()
    node = sch
    for part in dotted.split("."):
        node = node["properties"][part]
        if "$ref" in node:
            node = sch["$defs"][node["$ref"].rsplit("/", 1)[1]] | {k: v for k, v in node.items() if k != "$ref"}
    if "default" not in node:
        raise KeyError(f"the config schema has no default for {dotted}")
    return copy.deepcopy(node["default"])


def _with_defaults(validator_class):
    """A validator that also fills in schema defaults (as Snakemake's validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, sch):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "$ref" in sub and "default" not in sub:
                    sub = validator.resolver.resolve(sub["$ref"])[1]
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, sch)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


MAX_BYTES = 1_000_000  # a config is small (the shipped ones: under 5 kB as JSON): more is a YAML alias bomb
MAX_MESSAGE = 300  # characters of one schema message (it quotes the value at fault)
MAX_ERRORS = 10


def expanded_size(obj: Any, limit: int = MAX_BYTES) -> int:
    """About how many bytes ``obj`` takes as JSON once YAML aliases are expanded (shared
    sub-objects and strings counted each time they appear), counting up to ``limit``: YAML's
    aliases make a few hundred bytes describe billions of values, or one long string repeated
    a thousand times, which every later traversal (JSON, a message, a file per rule) expands."""
    memo: dict[int, int] = {}

    def size(o) -> int:
        if id(o) in memo:
            return memo[id(o)]
        if isinstance(o, dict):
            n = 2 + sum(size(k) + 2 + size(v) for k, v in o.items())
        elif isinstance(o, (list, tuple)):
            n = 2 + sum(size(v) + 1 for v in o)
        elif isinstance(o, str):
            n = 2 + len(o.encode("utf-8", "surrogatepass"))
        else:  # a number, boolean, null or date
            n = len(str(o))
        memo[id(o)] = n = min(n, limit + 1)
        return n

    return size(obj)


def _check_size(config: Any, source: str) -> None:
    if expanded_size(config) > MAX_BYTES:
        raise ConfigError(
            f"{source}: the config expands to more than {MAX_BYTES} bytes (YAML anchors and aliases "
            "repeated inside each other, or a long string repeated?); a dchag config has a few thousand"
        )


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 25] + f" … ({len(text)} characters)"


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last
    one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys given here override those
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (lines {first} and {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_yaml(path: str | os.PathLike) -> Any:
    """A YAML file's content: safe types only, no key twice, a bounded size."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path) as f:
            content = yaml.load(f, Loader=_UniqueKeyLoader)  # a safe loader
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {_short(str(err))}") from err
    _check_size(content, str(path))
    return content


def validate(config: dict, source: str = "config", check_files: bool = True) -> dict:
    """Validate against the schema (filling defaults, in place) and return ``config``."""
    import warnings

    _check_size(config, source)
    validator_cls = _with_defaults(jsonschema.Draft202012Validator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # RefResolver, used for $ref defaults
        errors = sorted(validator_cls(schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors[:MAX_ERRORS]:
            key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"  key '{key}': {_short(err.message)}")
        if len(errors) > MAX_ERRORS:
            lines.append(f"  … and {len(errors) - MAX_ERRORS} more")
        raise ConfigError(f"{source} is not a valid dchag config:\n" + "\n".join(lines))
    if check_files:
        check_config(config, source)
    return config


def check_config(config: dict, source: str = "config") -> None:
    """Checks the schema cannot express: split years disjoint, channels present, inputs exist."""
    if config.get("hsi"):
        _check_hsi(config["hsi"], source)
    era5 = config.get("era5")
    if era5:
        import glob

        years = era5["years"]
        seen: dict[int, str] = {}
        for split in ("train", "val", "test"):
            for year in years[split]:
                if year in seen:
                    raise ConfigError(f"{source}: key 'era5.years': {year} is in both '{seen[year]}' and '{split}'")
                seen[year] = split
        ch = era5["channels"]
        if not (ch.get("pressure_level", {}).get("variables") or ch.get("single_level") or ch.get("constants")):
            raise ConfigError(f"{source}: key 'era5.channels' selects no channel")
        pl = ch.get("pressure_level")
        if pl and pl["variables"] and not pl["levels"]:
            raise ConfigError(f"{source}: key 'era5.channels.pressure_level.levels' is empty")
        if era5.get("demo"):
            _check_generated(
                era5["inputs"] + ([era5["constants"]] if era5.get("constants") else []), "era5.inputs", source
            )
        if era5.get("download") and (
            sum("{year}" in p for p in era5["inputs"]) != 1
            or any("{month}" in p or glob.has_magic(p) for p in era5["inputs"] if "{year}" in p)
        ):
            raise ConfigError(
                f"{source}: key 'era5.inputs': with era5.download set, give exactly one path with '{{year}}' "
                "(and no '{month}' or wildcard: a download writes one file per year)"
            )
        if not era5.get("demo", False) and not era5.get("download"):
            missing = list(dict.fromkeys(p for y in sorted(seen) for p in era5_input_paths(era5, y) if not _exists(p)))
            if era5.get("constants") and not _exists(era5["constants"]):
                missing.append(era5["constants"])
            if missing:
                shown = _listed(list(dict.fromkeys(missing)))
                raise ConfigError(
                    f"{source}: key 'era5.inputs': input file(s) not found:\n{shown}\n"
                    "(set era5.download: arco or cds to fetch them, or era5.demo: true for synthetic data)"
                )


def _check_hsi(hsi: dict, source: str) -> None:
    import glob

    for task in ("classification", "mae"):
        if task in hsi and not np.isclose(sum(hsi[task].get("fractions", [1, 0, 0])), 1.0):
            raise ConfigError(f"{source}: key 'hsi.{task}.fractions' must sum to 1, got {hsi[task]['fractions']}")
    if "classification" not in hsi and "mae" not in hsi:
        raise ConfigError(f"{source}: key 'hsi' needs a 'classification' or an 'mae' section")
    if hsi.get("demo"):
        if "classification" in hsi:
            _check_generated(
                [hsi["classification"]["image"], hsi["classification"]["labels"]], "hsi.classification", source
            )
        return
    wanted = []
    if "classification" in hsi:
        wanted += [hsi["classification"]["image"], hsi["classification"]["labels"]]
    if "mae" in hsi:
        wanted += hsi["mae"]["images"]
    missing = [p for p in dict.fromkeys(wanted) if not glob.glob(p)]
    if missing:
        raise ConfigError(f"{source}: key 'hsi': input file(s) not found:\n" + _listed(missing))


def _listed(paths: list[str], most: int = 10) -> str:
    """Paths one per line, the first ``most`` of them and how many more (an error stays short)."""
    more = f"\n  … and {len(paths) - most} more" if len(paths) > most else ""
    return "\n".join(f"  {p}" for p in paths[:most]) + more


def _check_generated(paths: list[str], key: str, source: str) -> None:
    """Files the demo writes must lie inside the working directory (relative, no '..')."""
    for path in paths:
        parts = Path(path).parts
        if Path(path).is_absolute() or ".." in parts or "://" in path:
            raise ConfigError(
                f"{source}: key '{key}': {path!r}: the demo writes its inputs here, so the path must lie "
                "inside the working directory (relative, without '..'), e.g. resources/demo/..."
            )


def _exists(path: str) -> bool:
    return "://" in path or Path(path).exists()


def era5_input_paths(era5: dict, year: int) -> list[str]:
    """The input files for ``year``: ``{year}`` filled in, a path with ``{month}`` once for each
    month (01..12), a glob pattern (``*``, ``?``, ``[...]``) expanded to the files it matches,
    sorted (a pattern that matches nothing stays as it is, to be reported missing); other
    paths as they are."""
    import glob

    out: list[str] = []
    for pattern in era5["inputs"]:
        months = [f"{m:02d}" for m in range(1, 13)] if "{month}" in pattern else [None]
        for month in months:
            path = pattern.replace("{year}", str(year))
            if month is not None:
                path = path.replace("{month}", month)
            matches = sorted(glob.glob(path)) if "://" not in path and glob.has_magic(path) else []
            out += matches or [path]
    return list(dict.fromkeys(out))


def load_config(spec: str | os.PathLike) -> dict:
    """A validated config from a YAML/JSON file, or from an inline JSON object string."""
    text = str(spec)
    if text.lstrip().startswith("{"):
        try:
            config: Any = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"inline config is not valid JSON: {err}") from err
        source = "inline config"
    else:
        config = read_yaml(spec)
        source = str(spec)
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(config).__name__}")
    return validate(config, source)


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
    aggregation: str
    groups: int | None
    tree: int
    channel_embedding: str
    fused_front_end: bool
    decoder: Decoder


@dataclass(frozen=True)
class ParallelSettings:
    tp: int
    strategy: str
    data_parallel: str  # fsdp | ddp | none (the degree is the processes over tp)
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
class TrainSettings:
    nproc: int
    nodes: int
    gpus_per_node: int
    max_restarts: int
    runtime: int
    mem_mb: int
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
    compare: dict[str, str]


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
    task: str
    init_from: str | None  # a run name or an exported model folder
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
    c = _complete(config)
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
        raw=config,
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
    merged = run_dict(config, run)
    base = settings(merged)
    return RunSettings(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(Settings)},
        run=run,
        task=merged["train"]["runs"][run]["task"],
        init_from=merged["train"]["runs"][run].get("init_from"),
        channels=merged["train"]["runs"][run].get("channels"),
    )
