"""Ground-truth values checked and coded into classes 1..K (0 = unlabelled).

A label raster holds non-negative integers; 0 means unlabelled, and so do the file's own
nodata value (GeoTIFF nodata, ENVI data ignore value) and the values of
``hsi.classification.ignore_labels`` (255 and 65535 by default: the usual no-data values of
8- and 16-bit label rasters). The remaining values are the classes. When they are not 1..K without gaps (e.g.
1, 2, 5) they are renumbered in increasing order (``noncontiguous_labels: remap``, the
default; the original value of each class is stored as ``label_values``) or refused
(``error``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .image import HsiInputError, LabelMap


def checked(lm: LabelMap) -> np.ndarray:
    """The label values of ``lm`` as int64, the file's nodata value as 0; NaN, fractional or
    negative values are an error naming the file, the count and the first position."""
    v = np.asarray(lm.values)
    if v.dtype.kind not in "uifb":
        raise HsiInputError(f"label map {lm.path}: values of type {v.dtype}; expected integers (0 = unlabelled)")
    if lm.nodata is not None:
        nod = np.isnan(v) if np.isnan(lm.nodata) else v == lm.nodata
        v = np.where(nod, 0, v)
    if v.dtype.kind == "f":
        for name, bad in (("NaN/inf", ~np.isfinite(v)), ("non-integer", np.isfinite(v) & (v != np.round(v)))):
            if bad.any():
                r, c = np.argwhere(bad)[0]
                raise HsiInputError(
                    f"label map {lm.path}: {int(bad.sum())} {name} value(s), first at row {r}, col {c} "
                    f"({v[r, c]}); expected integer class numbers (0 = unlabelled)"
                )
    bad = v < 0
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise HsiInputError(
            f"label map {lm.path}: {int(bad.sum())} negative value(s), first at row {r}, col {c} ({v[r, c]}); "
            "expected class numbers >= 0 (0 = unlabelled)"
        )
    return v.astype(np.int64)


@dataclass(frozen=True)
class Coding:
    values: list[int]  # original value of class 1..K
    names: list[str]
    ignored: dict[int, int]  # ignored value -> pixel count

    def apply(self, labels: np.ndarray) -> np.ndarray:
        """Original values -> classes 1..K, everything else 0."""
        lut = np.zeros(max(self.values) + 1, np.int64)
        lut[self.values] = np.arange(1, len(self.values) + 1)
        inside = labels <= max(self.values)
        return np.where(inside, lut[np.minimum(labels, max(self.values))], 0)


def coding(maps: list[np.ndarray], source: str, ignore: list[int], noncontiguous: str, names: list[str]) -> Coding:
    """The classes of the checked label maps ``maps`` (of ``source``): ignored values left out,
    renumbered 1..K or refused (``noncontiguous``), named from ``names``: one per value 1..max
    (names of absent values dropped), or one per class present, in increasing value."""
    counts: dict[int, int] = {}
    for m in maps:
        vals, n = np.unique(m[m > 0], return_counts=True)
        for val, k in zip(vals.tolist(), n.tolist()):
            counts[val] = counts.get(val, 0) + k
    ignored = {v: counts.pop(v) for v in sorted(set(ignore)) if v in counts}
    values = sorted(counts)
    if not values:
        extra = f" (ignored values {sorted(ignored)} left none)" if ignored else ""
        raise HsiInputError(
            f"label map {source} has no labelled pixel (0 = unlabelled) with a complete window of valid pixels{extra}"
        )
    contiguous = values == list(range(1, len(values) + 1))
    if not contiguous and noncontiguous == "error":
        raise HsiInputError(
            f"label map {source}: class values {values} are not 1..{len(values)} without gaps; set "
            "hsi.classification.noncontiguous_labels: remap to renumber them, or add a value to ignore_labels"
        )
    if names:
        if len(names) >= values[-1]:
            named = [names[v - 1] for v in values]
        elif len(names) == len(values):
            named = list(names)
        else:
            raise HsiInputError(
                f"{len(names)} class names for the label values {values} of {source}: give one name per value "
                f"1..{values[-1]} or one per class present ({len(values)}), in increasing value"
            )
    else:
        named = [f"class {v}" for v in values]
    return Coding(values, named, ignored)
