"""ERA5 variables: the names CDS and ARCO-ERA5 use for them, units, and channel names.

ARCO-ERA5 (and the CDS request API) use long names (``geopotential``); netCDF files from CDS
use short names (``z``). A channel is one 2-D field: a pressure-level variable at one level
(``z500``), a single-level variable (``t2m``) or a constant (``lsm``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Era5Variable:
    long_name: str
    short_name: str  # CDS netCDF variable name
    units: str
    kind: str  # "pressure_level", "single_level" or "constant"
    channel: str = ""  # channel name for single-level/constant fields (defaults to short_name)
    aliases: tuple[str, ...] = ()  # other names seen in the wild

    @property
    def names(self) -> tuple[str, ...]:
        return (self.long_name, self.short_name, *self.aliases)

    def channel_name(self, level: int | None = None) -> str:
        if self.kind == "pressure_level":
            return f"{self.short_name}{level}"
        return self.channel or self.short_name


CATALOG: dict[str, Era5Variable] = {
    v.long_name: v
    for v in (
        Era5Variable("geopotential", "z", "m**2 s**-2", "pressure_level"),
        Era5Variable("temperature", "t", "K", "pressure_level"),
        Era5Variable("u_component_of_wind", "u", "m s**-1", "pressure_level"),
        Era5Variable("v_component_of_wind", "v", "m s**-1", "pressure_level"),
        Era5Variable("specific_humidity", "q", "kg kg**-1", "pressure_level"),
        Era5Variable("relative_humidity", "r", "%", "pressure_level"),
        Era5Variable("vertical_velocity", "w", "Pa s**-1", "pressure_level"),
        Era5Variable("2m_temperature", "t2m", "K", "single_level"),
        Era5Variable("10m_u_component_of_wind", "u10", "m s**-1", "single_level"),
        Era5Variable("10m_v_component_of_wind", "v10", "m s**-1", "single_level"),
        Era5Variable("mean_sea_level_pressure", "msl", "Pa", "single_level"),
        Era5Variable("surface_pressure", "sp", "Pa", "single_level"),
        Era5Variable("total_precipitation", "tp", "m", "single_level"),
        Era5Variable("total_cloud_cover", "tcc", "(0 - 1)", "single_level"),
        Era5Variable("toa_incident_solar_radiation", "tisr", "J m**-2", "single_level"),
        Era5Variable("land_sea_mask", "lsm", "(0 - 1)", "constant"),
        # CDS calls the surface geopotential "z" in single-level files; ClimaX calls it orography.
        Era5Variable("geopotential_at_surface", "z", "m**2 s**-2", "constant", channel="orography"),
        Era5Variable("soil_type", "slt", "~", "constant"),
    )
}


def lookup(name: str) -> Era5Variable:
    """The catalog entry for a long or short name (short names of pressure-level and
    single-level variables are unique; ``z`` means geopotential)."""
    if name in CATALOG:
        return CATALOG[name]
    for var in CATALOG.values():
        if name in var.names and var.kind != "constant":
            return var
    for var in CATALOG.values():
        if name in var.names:
            return var
    known = ", ".join(sorted(CATALOG))
    raise KeyError(f"unknown ERA5 variable {name!r}; known long names: {known}")
