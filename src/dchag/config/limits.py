"""Bounds on what a config may be: its expanded size (YAML aliases) and the length of one
message quoting it."""

from __future__ import annotations

from typing import Any

from ..errors import DchagError


class ConfigError(DchagError, ValueError):
    """The config is invalid; the message names the key or file at fault."""


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


def check_size(config: Any, source: str) -> None:
    if expanded_size(config) > MAX_BYTES:
        raise ConfigError(
            f"{source}: the config expands to more than {MAX_BYTES} bytes (YAML anchors and aliases "
            "repeated inside each other, or a long string repeated?); a dchag config has a few thousand"
        )


def short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 25] + f" … ({len(text)} characters)"
