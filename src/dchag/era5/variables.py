"""ERA5 variables: the names CDS, ARCO-ERA5, WeatherBench 2 and GRIB use for them, units, and
channel names.

ARCO-ERA5, WeatherBench 2 (and the CDS request API) use long names (``geopotential``); netCDF
files from CDS and cfgrib use short names (``z``, ``t2m``); GRIB identifies a field by its
paramId (129), CF files by ``standard_name``. A variable is recognised by any of them.
A channel is one 2-D field: a pressure-level variable at one level (``z500``), a single-level
variable (``t2m``) or a constant (``lsm``).
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
    param_id: int | None = None  # ECMWF GRIB paramId (cfgrib's GRIB_paramId attribute)
    # CF standard names that identify it; none where one would be ambiguous (2 m and 10 m
    # fields share theirs with the pressure-level ones and with 100 m winds)
    standard_names: tuple[str, ...] = ()

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
        Era5Variable(
            "geopotential",
            "z",
            "m**2 s**-2",
            "pressure_level",
            param_id=129,
            standard_names=("geopotential", "geopotential_height"),
        ),
        Era5Variable("temperature", "t", "K", "pressure_level", param_id=130, standard_names=("air_temperature",)),
        Era5Variable(
            "u_component_of_wind", "u", "m s**-1", "pressure_level", param_id=131, standard_names=("eastward_wind",)
        ),
        Era5Variable(
            "v_component_of_wind", "v", "m s**-1", "pressure_level", param_id=132, standard_names=("northward_wind",)
        ),
        Era5Variable(
            "specific_humidity", "q", "kg kg**-1", "pressure_level", param_id=133, standard_names=("specific_humidity",)
        ),
        Era5Variable(
            "relative_humidity", "r", "%", "pressure_level", param_id=157, standard_names=("relative_humidity",)
        ),
        Era5Variable(
            "vertical_velocity",
            "w",
            "Pa s**-1",
            "pressure_level",
            param_id=135,
            standard_names=("lagrangian_tendency_of_air_pressure",),
        ),
        Era5Variable("2m_temperature", "t2m", "K", "single_level", aliases=("2t",), param_id=167),
        Era5Variable("10m_u_component_of_wind", "u10", "m s**-1", "single_level", aliases=("10u",), param_id=165),
        Era5Variable("10m_v_component_of_wind", "v10", "m s**-1", "single_level", aliases=("10v",), param_id=166),
        Era5Variable(
            "mean_sea_level_pressure",
            "msl",
            "Pa",
            "single_level",
            param_id=151,
            standard_names=("air_pressure_at_mean_sea_level", "air_pressure_at_sea_level"),
        ),
        Era5Variable(
            "surface_pressure", "sp", "Pa", "single_level", param_id=134, standard_names=("surface_air_pressure",)
        ),
        Era5Variable(
            "total_precipitation",
            "tp",
            "m",
            "single_level",
            param_id=228,
            standard_names=("lwe_thickness_of_precipitation_amount",),
        ),
        Era5Variable(
            "total_cloud_cover", "tcc", "(0 - 1)", "single_level", param_id=164, standard_names=("cloud_area_fraction",)
        ),
        Era5Variable("toa_incident_solar_radiation", "tisr", "J m**-2", "single_level", param_id=212),
        Era5Variable(
            "land_sea_mask",
            "lsm",
            "(0 - 1)",
            "constant",
            param_id=172,
            standard_names=("land_binary_mask", "land_area_fraction"),
        ),
        # CDS calls the surface geopotential "z" in single-level files; ClimaX calls it orography.
        Era5Variable(
            "geopotential_at_surface",
            "z",
            "m**2 s**-2",
            "constant",
            channel="orography",
            param_id=129,
            standard_names=("surface_geopotential",),
        ),
        Era5Variable("soil_type", "slt", "~", "constant", param_id=43),
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
