"""JSON as other tools read it: NaN and infinities are not JSON, so they are written as null."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` with non-finite numbers as null (strict JSON: ``allow_nan=False``)."""
    return json.dumps(_clean(obj), allow_nan=False, default=str, **kwargs)


def read_json(path, what: str = "JSON file") -> Any:
    """A JSON file's content; a missing or unreadable file is a user-facing error naming it."""
    from pathlib import Path

    from .errors import MissingFileError
    from .store import InputError

    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{what} {path} is not readable JSON: {err}") from err
