"""Normalisation statistics of the training years, one job per year and a small combine.

Each year's job (``dchag era5-year-stats``) reads its store one chunk at a time and keeps,
per channel, the count, the mean and the sum of squared deviations M2 (float64), merged
chunk by chunk with Chan, Golub and LeVeque's pairwise update; the combine
(``dchag era5-stats``) merges the years the same way. The result equals the mean and
population standard deviation over all steps and grid points of the training years, to
float64 rounding (no sum of squares minus squared sum, which cancels for fields whose spread
is small next to their mean).

Hygiene: a channel whose spread is tiny next to its mean (a field that is constant to float32
precision, a near-constant mask) would be divided by a std of rounding noise and its
normalised values turn huge (ClimaX issue #46: a regional top-of-atmosphere radiation with
mean -0.77 and std 6e-7). Its std is floored at ``STD_FLOOR_RATIO`` x |mean|, the channel is
named in a warning and recorded in the statistics file; a channel with no spread at all keeps
std 1 (centred, unscaled).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .. import jsonio, provenance
from ..store import atomic_path
from .source import Era5InputError
from .years import YearStore, open_years

log = logging.getLogger(__name__)

# float32 resolves about 6e-8 of a value: a spread under 1e-4 of the mean is at most ~1700
# float32 steps, and a real ERA5 channel's spread is above 1e-2 of its mean (z50, msl)
STD_FLOOR_RATIO = 1e-4


class Moments:
    """Per-channel count, mean and M2 (sum of squared deviations from the mean), float64."""

    def __init__(self, count: np.ndarray, mean: np.ndarray, m2: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        self.count, self.mean, self.m2, self.min, self.max = count, mean, m2, lo, hi

    @classmethod
    def of_block(cls, block: np.ndarray) -> Moments:
        """Moments of a (time, channel, lat, lon) block, two-pass in float64."""
        x = block.astype(np.float64)
        axes = (0, 2, 3)
        mean = x.mean(axis=axes)
        x -= mean[None, :, None, None]
        m2 = np.einsum("tcyx,tcyx->c", x, x)
        count = np.full(block.shape[1], block.shape[0] * block.shape[2] * block.shape[3], np.int64)
        return cls(count, mean, m2, block.min(axis=axes).astype(np.float64), block.max(axis=axes).astype(np.float64))

    def merge(self, other: Moments) -> Moments:
        """Chan et al.'s combination of two disjoint sets' moments (exact up to rounding)."""
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / n)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / n)
        return Moments(n, mean, m2, np.minimum(self.min, other.min), np.maximum(self.max, other.max))

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation (over every step and grid point)."""
        return np.sqrt(self.m2 / self.count)

    def to_json(self) -> dict:
        return {
            "count": self.count.tolist(),
            "mean": self.mean.tolist(),
            "m2": self.m2.tolist(),
            "min": self.min.tolist(),
            "max": self.max.tolist(),
        }

    @classmethod
    def from_json(cls, d: dict, where: str) -> Moments:
        try:
            return cls(*(np.asarray(d[k], dtype=np.int64 if k == "count" else np.float64) for k in FIELDS))
        except (KeyError, TypeError, ValueError) as err:
            raise Era5InputError(
                f"{where} is not a per-year statistics file of `dchag era5-year-stats`: {err!r}"
            ) from None


FIELDS = ("count", "mean", "m2", "min", "max")


def year_moments(year: YearStore) -> Moments:
    """One year's moments, read one store chunk at a time."""
    total = None
    for start, block in year.blocks():
        if not np.isfinite(block).all():
            c = int(np.argwhere(~np.isfinite(block))[0][1])
            raise Era5InputError(
                f"{year.path} holds NaN/inf in channel {year.names[c]!r} near step {start} "
                "(era5.nan_policy: fill fills them when the year is regridded)"
            )
        part = Moments.of_block(block)
        total = part if total is None else total.merge(part)
    if total is None:
        raise Era5InputError(f"{year.path} holds no time steps")
    return total


def year_statistics(year_store: str | Path, output: str | Path, config: dict | None = None) -> Path:
    """The per-year partial statistics (one Snakemake job per training year)."""
    year = YearStore(year_store)
    m = year_moments(year)
    doc = {
        "year": year.year,
        "store": str(year_store),
        "channels": year.names,
        **m.to_json(),
        "provenance": provenance.record(config),
    }
    with atomic_path(output) as tmp:
        tmp.write_text(jsonio.dumps(doc, indent=1))
    return Path(output)


def _read_partial(path: str | Path) -> tuple[dict, Moments]:
    doc = jsonio.read_json(path, "per-year statistics")
    if not isinstance(doc, dict) or "channels" not in doc:
        raise Era5InputError(f"{path} is not a per-year statistics file of `dchag era5-year-stats`")
    return doc, Moments.from_json(doc, str(path))


def floored_std(names: list[str], mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, list[dict]]:
    """The std the split stores divide by, and the channels whose spread was floored."""
    floor = STD_FLOOR_RATIO * np.abs(mean)
    used = std.copy()
    flagged = []
    for c, name in enumerate(names):
        if std[c] == 0:
            used[c] = 1.0
            why = "no spread: centred, unscaled (std 1)"
        elif std[c] <= floor[c]:
            used[c] = floor[c]
            why = f"spread {std[c] / abs(mean[c]):.2g} of |mean|: std floored at {STD_FLOOR_RATIO:g} x |mean|"
        else:
            continue
        flagged.append({"channel": name, "mean": float(mean[c]), "std": float(std[c]), "std_used": float(used[c])})
        if std[c] > 0:
            log.warning(
                "channel %s is near-constant (mean %.6g, std %.3g): %s, so its normalised values stay bounded",
                name,
                mean[c],
                std[c],
                why,
            )
        else:
            log.warning("channel %s is constant (%.6g): %s", name, mean[c], why)
    return used, flagged


def combine_statistics(partials: list[str | Path], output: str | Path, config: dict | None = None) -> Path:
    """normalization.json from the per-year partials: the training years' mean and std per
    channel (the small job after the per-year ones)."""
    docs = [_read_partial(p) for p in partials]
    if not docs:
        raise Era5InputError("no per-year statistics given")
    names = docs[0][0]["channels"]
    for (doc, _), path in zip(docs, partials):
        if doc["channels"] != names:
            raise Era5InputError(f"channels of {path} differ from those of {partials[0]}")
    total = docs[0][1]
    for _, m in docs[1:]:
        total = total.merge(m)
    return _write_statistics(names, total, [d["store"] for d, _ in docs], output, config)


def _write_statistics(names: list[str], m: Moments, stores: list[str], output, config) -> Path:
    std, flagged = floored_std(names, m.mean, m.std)
    stats = {
        "channels": names,
        "mean": m.mean.tolist(),
        "std": std.tolist(),
        "std_measured": m.std.tolist(),
        "min": m.min.tolist(),
        "max": m.max.tolist(),
        "count": int(m.count[0]),
        "std_floor_ratio": STD_FLOOR_RATIO,
        "near_constant": flagged,
        "years": [str(p) for p in stores],
        "provenance": provenance.record(config),
    }
    with atomic_path(output) as tmp:
        tmp.write_text(jsonio.dumps(stats, indent=1))
    return Path(output)


def normalization_stats(train_year_stores: list[str | Path], output: str | Path, config: dict | None = None) -> Path:
    """The per-year jobs and their combine in one process (for scripts and tests)."""
    years = open_years(train_year_stores)
    total = None
    for y in years:
        m = year_moments(y)
        total = m if total is None else total.merge(m)
    return _write_statistics(years[0].names, total, [str(p) for p in train_year_stores], output, config)
