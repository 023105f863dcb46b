"""The settings of a validated config's ``hsi`` section as typed objects. Every value comes
from the config (the schema fills in the defaults); nothing is defaulted here."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class BandOptions:
    preset: str | None
    drop_bands: str | None
    drop_wavelengths: list[list[float]]
    nan_policy: str  # fail | fill
    clip_percentiles: tuple[float, float] | None
    band_chunk: int
    key: str | None  # variable of the image in a .mat file
    nodata: float | None  # raw missing-pixel value where the file declares none
    detector_overlap: str  # PRISMA: swir | vnir


def band_options(hsi: dict, task: str) -> BandOptions:
    """The band handling of a validated config's ``hsi`` section, for ``task`` (classification | mae)."""
    return BandOptions(
        preset=hsi["preset"],
        drop_bands=hsi["drop_bands"],
        drop_wavelengths=[list(map(float, r)) for r in hsi["drop_wavelengths"]],
        nan_policy=hsi["nan_policy"],
        clip_percentiles=tuple(hsi["clip_percentiles"]) if hsi["clip_percentiles"] else None,
        band_chunk=hsi["band_chunk"],
        key=hsi[task]["image_key"],
        nodata=hsi["nodata"],
        detector_overlap=hsi["detector_overlap"],
    )


def _from(cls, section: dict):
    return cls(**{f.name: section[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class ClassificationSettings:
    """``hsi.classification``: a scene (or a tile set, when ``image`` and ``labels`` are globs)."""

    image: str
    labels: str
    labels_key: str | None
    class_names: list[str]
    ignore_labels: list[int]
    noncontiguous_labels: str  # remap | error
    patch: int
    split: str  # stratified | disjoint
    fractions: list[float]
    block: int | None
    missing_class: str  # error | warn
    seed: int

    @classmethod
    def of(cls, section: dict) -> ClassificationSettings:
        return _from(cls, section)


@dataclass(frozen=True)
class TileSettings:
    """``hsi.mae``: images cut into tiles for masked autoencoding."""

    images: list[str]
    tile: int
    fractions: list[float]
    seed: int

    @classmethod
    def of(cls, section: dict) -> TileSettings:
        return _from(cls, section)
