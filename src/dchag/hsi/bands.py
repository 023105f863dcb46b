"""Which bands to keep: dataset presets, explicit lists, wavelength ranges, the ENVI ``bbl``.

Band numbers in presets and in ``--drop-bands`` are 1-based, as the published lists are
(Indian Pines drops 104-108, 150-163, 220). Internally everything is 0-based; the stores
record the kept bands in the sensor's numbering (AVIRIS 1..220 for Indian Pines, also when
the file is the 200-band ``_corrected`` one) and their centre wavelengths (the file's, or the
preset's sensor's, with the source named). The resulting
band count is asserted against the preset's published count, because public code is known
to get these lists off by one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DchagError


class BandError(DchagError, ValueError):
    """A band selection does not fit the image or its sensor."""


SENSORS = Path(__file__).parent / "sensors"


def _indian_pines_centres() -> tuple[np.ndarray, str]:
    rows = np.loadtxt(SENSORS / "aviris_indian_pines_1992.txt")
    return rows[:, 0], (
        "AVIRIS band centres of the 1992 Indian Pines flight (92AV3C.spc, MultiSpec / "
        "Purdue, as shipped with Spectral Python)"
    )


def _salinas_centres() -> tuple[np.ndarray, str]:
    return np.linspace(400.0, 2500.0, 224), (
        "nominal AVIRIS sampling: 224 bands evenly over 400-2500 nm (the instrument's specification; "
        "Salinas' .mat files carry no per-band calibration)"
    )


def _pavia_centres() -> tuple[np.ndarray, str]:
    return np.linspace(430.0, 860.0, 103), (
        "nominal ROSIS-03 range: 103 bands evenly over 430-860 nm (the distributed file keeps 103 of "
        "the sensor's 115 bands and names neither which nor their centres)"
    )


@dataclass(frozen=True)
class Preset:
    bands: int | None  # the sensor's band count (None: any)
    drop_1based: tuple[tuple[int, int], ...] = ()  # inclusive ranges, sensor numbering
    keep_nm: tuple[float, float] | None = None  # keep only this wavelength window
    expected: int | None = None  # published band count after removal
    note: str = ""
    centres: Callable[[], tuple[np.ndarray, str]] | None = None  # the sensor's band centres (nm), their source

    def kept_sensor_bands(self) -> np.ndarray:
        """1-based sensor band numbers the preset keeps."""
        keep = np.ones(self.bands, bool)
        for lo, hi in self.drop_1based:
            keep[lo - 1 : hi] = False
        return np.flatnonzero(keep) + 1


PRESETS = {
    "indian_pines": Preset(
        220,
        ((104, 108), (150, 163), (220, 220)),
        expected=200,
        note="AVIRIS Indian Pines: water-absorption bands 104-108, 150-163, 220",
        centres=_indian_pines_centres,
    ),
    "salinas": Preset(
        224,
        ((108, 112), (154, 167), (224, 224)),
        expected=204,
        note="AVIRIS Salinas: water-absorption bands 108-112, 154-167, 224",
        centres=_salinas_centres,
    ),
    "pavia_university": Preset(
        103, (), expected=103, note="ROSIS Pavia University: 103 bands as distributed", centres=_pavia_centres
    ),
    "vnir_400_900": Preset(
        None, keep_nm=(400.0, 900.0), note="400-900 nm imagers: drop the noisy band edges outside 400-900 nm"
    ),
}


@dataclass(frozen=True)
class BandSelection:
    """Which of a file's bands are kept, and what they are."""

    keep: np.ndarray  # 0-based indices into the file's bands
    sensor_bands: np.ndarray  # 1-based numbers of the kept bands in the sensor's numbering
    wavelengths: np.ndarray | None  # centre wavelengths (nm) of the kept bands
    how: str
    wavelength_source: str  # where the wavelengths come from ("" when there are none)


def parse_band_spec(spec: str, num_bands: int) -> list[int]:
    """'104-108,150-163,220' (1-based, inclusive) -> sorted 0-based indices."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise BandError(
                f"band list {spec!r}: cannot read {part!r}; expected 1-based numbers or ranges like 104-108"
            )
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo < 1 or hi > num_bands or lo > hi:
            raise BandError(f"band list {spec!r}: {part} is outside the image's bands 1..{num_bands}")
        out.update(range(lo - 1, hi))
    return sorted(out)


def _drop_explicit(keep: np.ndarray, wavelengths, drop_bands, drop_wavelengths, source: str) -> list[str]:
    """``drop_bands`` (1-based) and ``drop_wavelengths`` (nm ranges) cleared from ``keep``;
    returns how."""
    how = []
    if drop_bands:
        keep[parse_band_spec(drop_bands, keep.size)] = False
        how.append(f"dropped bands {drop_bands} (1-based)")
    for lo, hi in drop_wavelengths or []:
        if not 0 <= lo <= hi:
            raise BandError(f"hsi.drop_wavelengths [{lo:g}, {hi:g}]: expected a range [LO, HI] in nm, 0 <= LO <= HI")
        if wavelengths is None:
            raise BandError(f"{source}: drop_wavelengths given, but the image has no wavelengths")
        keep &= ~((wavelengths >= lo) & (wavelengths <= hi))
        how.append(f"dropped {lo:g}-{hi:g} nm")
    return how


def select_bands(
    num_bands: int,
    wavelengths: np.ndarray | None = None,
    bbl: np.ndarray | None = None,
    preset: str | None = None,
    drop_bands: str | None = None,
    drop_wavelengths: list[list[float]] | None = None,
    source: str = "image",
    bbl_source: str = "ENVI bbl",
    wavelength_source: str = "the file's header",
) -> BandSelection:
    """The bands to keep, their sensor numbers and wavelengths, and how they were chosen.

    Precedence: a bad-band list (an ENVI ``bbl``, a product's bad or unused bands; named by
    ``bbl_source``) wins over a preset's band list (it describes this very file), while a
    preset's wavelength window applies to either; explicit ``drop_bands`` (1-based, the file's
    numbering) / ``drop_wavelengths`` are applied on top. A file that already lacks the
    preset's water-absorption bands (its band count is the published count after removal,
    e.g. ``Indian_pines_corrected.mat``) keeps every band, numbered as the sensor numbers them.
    Wavelengths come from the file where it has them, else from the preset's sensor.
    """
    keep = np.ones(num_bands, bool)
    sensor = np.arange(1, num_bands + 1)  # the file's band i is sensor band sensor[i]
    how = []
    p = None
    if preset is not None:
        if preset not in PRESETS:
            raise BandError(f"unknown band preset {preset!r}; expected one of {', '.join(sorted(PRESETS))}")
        p = PRESETS[preset]
        if p.bands is not None and num_bands not in (p.bands, p.expected):
            raise BandError(
                f"{source}: preset {preset!r} is for {p.bands} bands (the sensor's) or {p.expected} "
                f"(water-absorption bands removed); the image has {num_bands}"
            )
    corrected = p is not None and p.bands is not None and num_bands == p.expected and p.expected != p.bands
    if corrected:
        sensor = p.kept_sensor_bands()
    if bbl is not None:
        bbl = np.asarray(bbl).astype(float)
        if bbl.size != num_bands:
            raise BandError(f"{source}: the bad-band list ({bbl_source}) has {bbl.size} entries for {num_bands} bands")
        keep &= bbl > 0
        how.append(f"{bbl_source} ({int((bbl <= 0).sum())} bad bands)")
    if p is not None and bbl is None:
        if corrected:
            how.append(
                f"preset {preset}: the file already has the water-absorption bands removed "
                f"({num_bands} of the sensor's {p.bands}); kept all, numbered as the sensor's bands"
            )
        else:
            for lo, hi in p.drop_1based:
                keep[lo - 1 : hi] = False
            how.append(f"preset {preset}: {p.note}")
    if p is not None and p.keep_nm is not None:
        if wavelengths is None:
            raise BandError(f"{source}: preset {preset!r} selects by wavelength, but the image has no wavelengths")
        keep &= (wavelengths >= p.keep_nm[0]) & (wavelengths <= p.keep_nm[1])
        if bbl is not None:
            how.append(f"preset {preset}: {p.note}")
    how += _drop_explicit(keep, wavelengths, drop_bands, drop_wavelengths, source)
    indices = np.flatnonzero(keep)
    if indices.size == 0:
        raise BandError(f"{source}: the band selection ({'; '.join(how)}) removes every band")
    if p is not None and bbl is None and not drop_bands and not drop_wavelengths:
        if p.expected is not None and indices.size != p.expected:
            raise BandError(
                f"{source}: preset {preset!r} kept {indices.size} bands, the published count is {p.expected}"
            )
    if wavelengths is not None:
        wl, wl_source = np.asarray(wavelengths, float)[indices], wavelength_source
    elif p is not None and p.centres is not None:
        centres, wl_source = p.centres()
        wl = centres[sensor[indices] - 1]
    else:
        wl, wl_source = None, ""
    return BandSelection(indices, sensor[indices], wl, "; ".join(how) or "all bands", wl_source)


def match_bands(
    model_centres: np.ndarray, image_centres: np.ndarray, model_fwhm: np.ndarray | None = None, source: str = "image"
) -> np.ndarray:
    """The image band (0-based) that serves each of a model's bands, matched by centre
    wavelength (nm): one image band per model band and never one for two, each within half the
    model band's FWHM where it is known, else within half the model's band spacing (its median
    step), so that an image sampled more coarsely than the model is not taken for it. Closest
    pairs are matched first. BandError naming ``source`` when any model band has no image band
    within its tolerance."""
    want = np.asarray(model_centres, np.float64)
    have = np.asarray(image_centres, np.float64)
    steps = np.diff(np.sort(want))
    spacing = float(np.median(steps)) if steps.size else np.inf
    tol = np.full(want.size, spacing / 2)
    if model_fwhm is not None:
        fwhm = np.asarray(model_fwhm, np.float64)
        tol = np.where(np.isfinite(fwhm) & (fwhm > 0), fwhm / 2, tol)
    dist = np.abs(want[:, None] - have[None, :])
    m, i = np.nonzero(dist <= tol[:, None])
    order = np.argsort(dist[m, i], kind="stable")
    out = np.full(want.size, -1, np.int64)
    used = np.zeros(have.size, bool)
    for k in order:
        if out[m[k]] < 0 and not used[i[k]]:
            out[m[k]], used[i[k]] = i[k], True
    lost = np.flatnonzero(out < 0)
    if lost.size:
        j = lost[0]
        nearest = have[np.abs(have - want[j]).argmin()] if have.size else np.nan
        raise BandError(
            f"{source}: {lost.size} of the model's {want.size} bands have no image band of their own within "
            f"tolerance (half the model band's FWHM, or half its band spacing {spacing:g} nm), e.g. "
            f"{want[j]:g} nm (nearest image band {nearest:g} nm, tolerance {tol[j]:g} nm); the image has "
            f"{have.size} bands (sampled more coarsely, or by another sensor, it does not hold the model's bands)"
        )
    return out
