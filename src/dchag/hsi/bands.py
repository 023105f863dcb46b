"""Which bands to keep: dataset presets, explicit lists, wavelength ranges, the ENVI ``bbl``.

Band numbers in presets and in ``--drop-bands`` are 1-based, as the published lists are
(Indian Pines drops 104-108, 150-163, 220). Internally everything is 0-based. The resulting
band count is asserted against the preset's published count, because public code is known
to get these lists off by one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


class BandError(ValueError):
    pass


@dataclass(frozen=True)
class Preset:
    bands: int | None  # expected input band count (None: any)
    drop_1based: tuple[tuple[int, int], ...] = ()  # inclusive ranges
    keep_nm: tuple[float, float] | None = None  # keep only this wavelength window
    expected: int | None = None  # published band count after removal
    note: str = ""


PRESETS = {
    "indian_pines": Preset(220, ((104, 108), (150, 163), (220, 220)), expected=200,
                           note="AVIRIS Indian Pines: water-absorption bands 104-108, 150-163, 220"),
    "salinas": Preset(224, ((108, 112), (154, 167), (224, 224)), expected=204,
                      note="AVIRIS Salinas: water-absorption bands 108-112, 154-167, 224"),
    "pavia_university": Preset(103, (), expected=103, note="ROSIS Pavia University: 103 bands as distributed"),
    "vnir_400_900": Preset(None, keep_nm=(400.0, 900.0), note="400-900 nm imagers: drop the noisy band edges outside 400-900 nm"),
}


def parse_band_spec(spec: str, num_bands: int) -> list[int]:
    """'104-108,150-163,220' (1-based, inclusive) -> sorted 0-based indices."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise BandError(f"band list {spec!r}: cannot read {part!r}; expected 1-based numbers or ranges like 104-108")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo < 1 or hi > num_bands or lo > hi:
            raise BandError(f"band list {spec!r}: {part} is outside the image's bands 1..{num_bands}")
        out.update(range(lo - 1, hi))
    return sorted(out)


def select_bands(
    num_bands: int,
    wavelengths: np.ndarray | None = None,
    bbl: np.ndarray | None = None,
    preset: str | None = None,
    drop_bands: str | None = None,
    drop_wavelengths: list[list[float]] | None = None,
    source: str = "image",
) -> tuple[np.ndarray, str]:
    """0-based indices of the bands to keep, and how they were chosen.

    Precedence: an ENVI ``bbl`` wins over a preset (it describes this very file); explicit
    ``drop_bands`` / ``drop_wavelengths`` are applied on top of either.
    """
    keep = np.ones(num_bands, bool)
    how = []
    if bbl is not None:
        bbl = np.asarray(bbl).astype(float)
        if bbl.size != num_bands:
            raise BandError(f"{source}: the header's bbl has {bbl.size} entries for {num_bands} bands")
        keep &= bbl > 0
        how.append(f"ENVI bbl ({int((bbl <= 0).sum())} bad bands)")
    elif preset is not None:
        if preset not in PRESETS:
            raise BandError(f"unknown band preset {preset!r}; expected one of {', '.join(sorted(PRESETS))}")
        p = PRESETS[preset]
        if p.bands is not None and p.bands != num_bands:
            raise BandError(f"{source}: preset {preset!r} is for {p.bands} bands, the image has {num_bands}")
        for lo, hi in p.drop_1based:
            keep[lo - 1:hi] = False
        if p.keep_nm is not None:
            if wavelengths is None:
                raise BandError(f"{source}: preset {preset!r} selects by wavelength, but the image has no wavelengths")
            keep &= (wavelengths >= p.keep_nm[0]) & (wavelengths <= p.keep_nm[1])
        how.append(f"preset {preset}: {p.note}")
    if drop_bands:
        keep[parse_band_spec(drop_bands, num_bands)] = False
        how.append(f"dropped bands {drop_bands} (1-based)")
    for lo, hi in drop_wavelengths or []:
        if wavelengths is None:
            raise BandError(f"{source}: drop_wavelengths given, but the image has no wavelengths")
        keep &= ~((wavelengths >= lo) & (wavelengths <= hi))
        how.append(f"dropped {lo:g}-{hi:g} nm")
    indices = np.flatnonzero(keep)
    if indices.size == 0:
        raise BandError(f"{source}: the band selection ({'; '.join(how)}) removes every band")
    if preset in PRESETS and bbl is None and not drop_bands and not drop_wavelengths:
        expected = PRESETS[preset].expected
        if expected is not None and indices.size != expected:
            raise BandError(f"{source}: preset {preset!r} kept {indices.size} bands, the published count is {expected}")
    return indices, "; ".join(how) or "all bands"
