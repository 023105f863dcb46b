"""What several stages' subcommands share: the ``--config`` flag and loading it."""

from __future__ import annotations

import argparse


def config_arg(sp: argparse.ArgumentParser, required: bool = True, help_: str | None = None) -> None:
    sp.add_argument("--config", required=required, help=help_ or "config YAML file, or an inline JSON object")


def config(args) -> dict:
    """The validated config of ``--config``."""
    from ..config import load_config

    return load_config(args.config)


def config_with(args, section: str) -> dict:
    """The validated config of ``--config``, which must have ``section``."""
    from ..config import ConfigError

    cfg = config(args)
    if cfg.get(section) is None:
        raise ConfigError(f"{args.config}: no {section!r} section")
    return cfg


def pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    """NAME=VALUE words (``--flag NAME=VALUE ...``) as a dict, in order."""
    from ..errors import DchagError

    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise DchagError(f"{flag} takes NAME=PATH words, got {item!r}")
        out[name] = value
    return out
