"""The config schema (``schemas/config.schema.yaml``): the one place of every default, and
validation against it, defaults filled in."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import yaml

from .limits import MAX_ERRORS, ConfigError, check_size, short

SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "config.schema.yaml"


@functools.cache
def schema() -> dict:
    """The parsed schema, read once per process (callers must not change it)."""
    with open(SCHEMA_PATH) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _node(dotted: str) -> dict:
    """The schema of a key, e.g. ``hsi.classification.patch`` ($ref resolved)."""
    sch = schema()
    node = sch
    for part in dotted.split("."):
        node = node["properties"][part]
        if "$ref" in node:
            node = sch["$defs"][node["$ref"].rsplit("/", 1)[1]] | {k: v for k, v in node.items() if k != "$ref"}
    return node


def schema_default(dotted: str):
    """The schema's default of a key, e.g. ``hsi.classification.patch`` (for the standalone
    commands' flags: one place for every default)."""
    node = _node(dotted)
    if "default" not in node:
        raise KeyError(f"the config schema has no default for {dotted}")
    return copy.deepcopy(node["default"])


def schema_enum(dotted: str) -> list:
    """The values the schema allows for a key (or for each item of a list), null left out: the
    standalone commands' ``choices``."""
    node = _node(dotted)
    values = node.get("enum", node.get("items", {}).get("enum"))
    if values is None:
        raise KeyError(f"the config schema lists no values for {dotted}")
    return [v for v in values if v is not None]


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


def validate(config: dict, source: str = "config", check_files: bool = True) -> dict:
    """Validate against the schema (filling defaults, in place) and return ``config``."""
    import warnings

    check_size(config, source)
    validator_cls = _with_defaults(jsonschema.Draft202012Validator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # RefResolver, used for $ref defaults
        errors = sorted(validator_cls(schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors[:MAX_ERRORS]:
            key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"  key '{key}': {short(err.message)}")
        if len(errors) > MAX_ERRORS:
            lines.append(f"  … and {len(errors) - MAX_ERRORS} more")
        raise ConfigError(f"{source} is not a valid dchag config:\n" + "\n".join(lines))
    if check_files:
        from .inputs import check_config

        check_config(config, source)
    return config
