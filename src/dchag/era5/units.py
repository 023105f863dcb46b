"""Units of ERA5 inputs, checked against the variable catalogue and converted to it.

A unit string is reduced to powers of base symbols and a factor ("hPa" -> Pa x 100,
"g kg**-1" -> (dimensionless) x 0.001, "m s-1", "m/s" and "m s**-1" alike), so the many
spellings files use compare equal, and a known alternative converts by a linear map:
geopotential height (gpm, m, dam) to geopotential (x g = 9.80665 m s**-2), degrees Celsius to
kelvin (+ 273.15), hectopascals to pascals, percent to fractions, millimetres (or kg m**-2 of
water) of precipitation to metres. Anything else is refused, naming file, variable and unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import DchagError

GRAVITY = 9.80665  # m s**-2: WMO's standard gravity, ECMWF's g for geopotential height
CELSIUS_OFFSET = 273.15

# symbol -> (base powers, factor to those bases)
_SYMBOLS: dict[str, tuple[dict[str, int], float]] = {
    "m": ({"m": 1}, 1.0),
    "metre": ({"m": 1}, 1.0),
    "meter": ({"m": 1}, 1.0),
    "metres": ({"m": 1}, 1.0),
    "meters": ({"m": 1}, 1.0),
    "gpm": ({"m": 1}, 1.0),  # geopotential metre
    "dam": ({"m": 1}, 10.0),
    "gpdm": ({"m": 1}, 10.0),
    "km": ({"m": 1}, 1000.0),
    "cm": ({"m": 1}, 0.01),
    "mm": ({"m": 1}, 0.001),
    "s": ({"s": 1}, 1.0),
    "sec": ({"s": 1}, 1.0),
    "second": ({"s": 1}, 1.0),
    "seconds": ({"s": 1}, 1.0),
    "min": ({"s": 1}, 60.0),
    "h": ({"s": 1}, 3600.0),
    "hr": ({"s": 1}, 3600.0),
    "hour": ({"s": 1}, 3600.0),
    "kg": ({"kg": 1}, 1.0),
    "g": ({"kg": 1}, 0.001),
    "pa": ({"Pa": 1}, 1.0),
    "hpa": ({"Pa": 1}, 100.0),
    "kpa": ({"Pa": 1}, 1000.0),
    "mbar": ({"Pa": 1}, 100.0),
    "mb": ({"Pa": 1}, 100.0),
    "millibar": ({"Pa": 1}, 100.0),
    "millibars": ({"Pa": 1}, 100.0),
    "j": ({"J": 1}, 1.0),
    "w": ({"J": 1, "s": -1}, 1.0),
    "k": ({"K": 1}, 1.0),
    "kelvin": ({"K": 1}, 1.0),
    "degk": ({"K": 1}, 1.0),
    "deg_k": ({"K": 1}, 1.0),
    "%": ({}, 0.01),
    "percent": ({}, 0.01),
    "kt": ({"m": 1, "s": -1}, 1852.0 / 3600.0),
    "kn": ({"m": 1, "s": -1}, 1852.0 / 3600.0),
    "knots": ({"m": 1, "s": -1}, 1852.0 / 3600.0),
}
# Celsius: kelvin with an offset, only alone (a temperature, not a temperature difference per metre)
_CELSIUS = {"degc", "deg_c", "°c", "celsius", "degree_celsius", "degrees_celsius", "degrees_c", "c"}
_DIMENSIONLESS = {"", "1", "(0 - 1)", "(0-1)", "0-1", "0 - 1", "fraction", "dimensionless", "~", "-", "none"}
_TOKEN = re.compile(r"^([A-Za-z°%_]+)([-+]?\d+)?$")


class UnitsError(DchagError, ValueError):
    """An input variable's units are missing, unreadable, or not convertible to the catalogue's."""


@dataclass(frozen=True)
class Conversion:
    """catalogue value = value x scale + offset."""

    scale: float = 1.0
    offset: float = 0.0
    note: str = ""

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.offset == 0.0


def reduce(units: str) -> tuple[dict[str, int], float, float] | None:
    """(base powers, factor, offset) of a unit string, or None when it cannot be read."""
    text = " ".join(str(units).strip().split())
    if text.lower() in _DIMENSIONLESS:
        return {}, 1.0, 0.0
    if text.lower().replace(" ", "_") in _CELSIUS:
        return {"K": 1}, 1.0, CELSIUS_OFFSET
    powers: dict[str, int] = {}
    factor = 1.0
    # "m/s", "kg/kg", "m s**-1", "m.s-1", "m2 s-2", "m^2/s^2": everything after a '/' is divided
    numerator, *denominators = re.split(r"\s*/\s*", text)
    for sign, part in [(1, numerator)] + [(-1, d) for d in denominators]:
        for token in re.split(r"[\s*.·]+", part.replace("**", "").replace("^", "")):
            if not token:
                continue
            m = _TOKEN.match(token)
            if not m or m.group(1).lower() not in _SYMBOLS:
                return None
            base, f = _SYMBOLS[m.group(1).lower()]
            power = sign * int(m.group(2) or 1)
            factor *= f**power
            for b, p in base.items():
                powers[b] = powers.get(b, 0) + p * power
    return {b: p for b, p in powers.items() if p}, factor, 0.0


DECLARE = "declare the file's units with era5.units if its attribute is wrong"


def conversion(found: str, expected: str, variable: str, where: str, hint: str = DECLARE) -> Conversion:
    """The linear map from ``found`` units to the catalogue's ``expected`` ones for ``variable``
    (a catalogue long name); UnitsError naming ``where`` (file and variable) when there is none,
    ending with ``hint`` (what the user can do about it)."""
    want = reduce(expected)
    got = reduce(found)
    assert want is not None, expected  # the catalogue's own units always parse
    if got is None:
        raise UnitsError(
            f"{where}: units {found!r} are not ones dchag can read; expected {expected!r} for {variable} ({hint})"
        )
    (wp, wf, wo), (gp, gf, go) = want, got
    if gp == wp:
        return Conversion(gf / wf, (go - wo) / wf, f"{found} -> {expected}" if (gf, go) != (wf, wo) else "")
    if variable.startswith("geopotential") and gp == {"m": 1} and wp == {"m": 2, "s": -2}:
        return Conversion(gf * GRAVITY / wf, 0.0, f"geopotential height {found} -> {expected} (x {GRAVITY})")
    if variable == "total_precipitation" and gp == {"kg": 1, "m": -2} and wp == {"m": 1}:
        return Conversion(gf / 1000.0 / wf, 0.0, f"{found} of water -> {expected} (/ 1000 kg m**-3)")
    raise UnitsError(f"{where}: units {found!r} do not convert to {expected!r}, the units of {variable} ({hint})")
