"""Loading and checking the pipeline config against ``schemas/config.schema.yaml``.

The Snakefile validates with Snakemake's ``validate`` (same schema) and then calls
:func:`check_config`; the CLI loads files with :func:`load_config`, which does both.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import yaml

SCHEMA_PATH = Path(__file__).parent / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """The config is invalid; the message names the key or file at fault."""


def schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def _with_defaults(validator_class):
    """A validator that also fills in schema defaults (as Snakemake's validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, sch):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "$ref" in sub:
                    sub = validator.resolver.resolve(sub["$ref"])[1]
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, sch)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def validate(config: dict, source: str = "config") -> dict:
    """Validate against the schema (filling defaults, in place) and return ``config``."""
    import warnings

    validator_cls = _with_defaults(jsonschema.Draft202012Validator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # RefResolver, used for $ref defaults
        errors = sorted(validator_cls(schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"  key '{key}': {err.message}")
        raise ConfigError(f"{source} is not a valid dchag config:\n" + "\n".join(lines))
    check_config(config, source)
    return config


def check_config(config: dict, source: str = "config") -> None:
    """Checks the schema cannot express: split years disjoint, channels present, inputs exist."""
    if config.get("hsi"):
        _check_hsi(config["hsi"], source)
    era5 = config.get("era5")
    if era5:
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
        if era5.get("download") and sum("{year}" in p for p in era5["inputs"]) != 1:
            raise ConfigError(f"{source}: key 'era5.inputs': with era5.download set, give exactly one path with '{{year}}'")
        if not era5.get("demo", False) and not era5.get("download"):
            missing = [p for y in sorted(seen) for p in era5_input_paths(era5, y) if not _exists(p)]
            if era5.get("constants") and not _exists(era5["constants"]):
                missing.append(era5["constants"])
            if missing:
                shown = "\n".join(f"  {p}" for p in dict.fromkeys(missing))
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
        return
    wanted = []
    if "classification" in hsi:
        wanted += [hsi["classification"]["image"], hsi["classification"]["labels"]]
    missing = [p for p in wanted if not Path(p).exists()]
    for pattern in hsi.get("mae", {}).get("images", []):
        if not glob.glob(pattern):
            missing.append(pattern)
    if missing:
        raise ConfigError(f"{source}: key 'hsi': input file(s) not found:\n" + "\n".join(f"  {p}" for p in missing))


def _exists(path: str) -> bool:
    return "://" in path or Path(path).exists()


def era5_input_paths(era5: dict, year: int) -> list[str]:
    """The input files for ``year``: paths with ``{year}`` filled in, others as they are."""
    return [p.format(year=year) if "{year}" in p else p for p in era5["inputs"]]


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
        path = Path(spec)
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        try:
            config = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
        source = str(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(config).__name__}")
    return validate(config, source)
