"""What several stages' subcommands share: the ``--config`` flag and loading it, and the
argparse types of numeric flags, each with its range (a value outside it is argparse's
one-line usage error naming the flag, before any work)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _ranged(convert: Callable[[str], float], ok: Callable[[float], bool], what: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


positive_int = _ranged(int, lambda v: v > 0, "a positive integer")
nonneg_int = _ranged(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _ranged(float, lambda v: v > 0, "a positive number")
nonneg_float = _ranged(float, lambda v: v >= 0, "a number >= 0")
percentile = _ranged(float, lambda v: 0 <= v <= 100, "a percentile from 0 to 100")


def a_time(text: str) -> str:
    """A date and time as pandas reads it (kept as given)."""
    import pandas as pd

    try:
        ok = not pd.isna(pd.Timestamp(text))
    except (ValueError, TypeError, OverflowError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"expected a date and time such as 2020-01-01T06, got {text!r}")
    return text


def config_arg(sp: argparse.ArgumentParser, required: bool = True, help_: str | None = None) -> None:
    sp.add_argument(
        "--config",
        nargs="+",
        required=required,
        metavar="FILE",
        help=(help_ or "config YAML file, or an inline JSON object")
        + "; several are merged in order, later ones winning key by key (as snakemake --configfile merges them)",
    )
    sp.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value after the files are merged (repeatable): train.steps=300",
    )


def config_source(args) -> str:
    """How the config of ``--config``/``--set`` is named in messages."""
    from ..config.files import source_name

    return source_name(args.config, args.set)


def config_args(args) -> list[str]:
    """``--config``/``--set`` as the words that give a command the same config."""
    return ["--config", *args.config, *(w for item in args.set for w in ("--set", item))]


def config(args) -> dict:
    """The validated config of ``--config`` and ``--set``."""
    from ..config import load_config

    return load_config(args.config, args.set)


def config_with(args, section: str) -> dict:
    """The validated config of ``--config``, which must have ``section``."""
    from ..config import ConfigError

    cfg = config(args)
    if cfg.get(section) is None:
        raise ConfigError(f"{config_source(args)}: no {section!r} section")
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
