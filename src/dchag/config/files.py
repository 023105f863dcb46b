"""Reading a config file: YAML's safe types, no key given twice, a bounded size, validated."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from .limits import ConfigError, check_size, short
from .schema import validate


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
        raise ConfigError(f"config file {path} is not valid YAML: {short(str(err))}") from err
    check_size(content, str(path))
    return content


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
