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


def _read(spec: str | os.PathLike) -> tuple[dict, str]:
    """One config: a YAML/JSON file, or an inline JSON object string; with its name."""
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
    return config, source


def merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` as Snakemake merges its --configfile files: mappings key by
    key, any other value replaced. ``base`` is updated and returned."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def setting(config: dict, item: str) -> None:
    """Apply one ``KEY=VALUE`` of ``--set`` to ``config``: KEY a dotted path (train.steps),
    VALUE read as YAML (30, 1.0e-4, true, [1, 2], a word)."""
    key, sep, text = item.partition("=")
    path = key.split(".")
    if not sep or not all(path):
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted KEY (train.steps=30)")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML: {short(str(err))}") from None
    node = config
    for i, part in enumerate(path[:-1]):
        if not isinstance(node.setdefault(part, {}), dict):
            raise ConfigError(f"--set {item!r}: {'.'.join(path[: i + 1])} is not a section")
        node = node[part]
    node[path[-1]] = value


def load_config(specs: str | os.PathLike | list, sets: list[str] | tuple = ()) -> dict:
    """A validated config: YAML/JSON files or inline JSON objects, merged in order (later ones
    win, key by key, as Snakemake merges ``--configfile a b``), then ``sets`` (``--set``
    KEY=VALUE words) applied."""
    specs = list(specs) if isinstance(specs, list | tuple) else [specs]
    config: dict = {}
    for spec in specs:
        merge(config, _read(spec)[0])
    for item in sets:
        setting(config, item)
    return validate(config, source_name(specs, sets))


def source_name(specs: list, sets: list[str] | tuple = ()) -> str:
    """How a config of ``specs`` and ``sets`` is named in messages."""
    names = ["inline config" if str(s).lstrip().startswith("{") else str(s) for s in specs]
    return ", ".join(names) + "".join(f" --set {item}" for item in sets)
