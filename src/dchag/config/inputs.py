"""Checks of a config the schema cannot express: split years disjoint, channels selected, the
input files there (or inside the working directory, for the demo's generated ones)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .limits import ConfigError


def check_config(config: dict, source: str = "config") -> None:
    """Checks the schema cannot express: split years disjoint, channels present, inputs exist."""
    if config.get("hsi"):
        _check_hsi(config["hsi"], source)
    era5 = config.get("era5")
    if era5:
        import glob

        years = era5["years"]
        seen: dict[int, str] = {}
        for split in ("train", "val", "test"):
            for year in years[split]:
                if year in seen:
                    raise ConfigError(f"{source}: key 'era5.years': {year} is in both '{seen[year]}' and '{split}'")
                seen[year] = split
        ch = era5["channels"]
        if not (ch.get("pressure_level", {}).get("variables") or ch.get("single_level") or ch.get("constants")):
            raise ConfigError(f"{source}: key 'era5.channels' selects no channel")
        pl = ch.get("pressure_level")
        if pl and pl["variables"] and not pl["levels"]:
            raise ConfigError(f"{source}: key 'era5.channels.pressure_level.levels' is empty")
        if era5.get("demo"):
            _check_generated(
                era5["inputs"] + ([era5["constants"]] if era5.get("constants") else []), "era5.inputs", source
            )
        if era5.get("download") and (
            sum("{year}" in p for p in era5["inputs"]) != 1
            or any("{month}" in p or glob.has_magic(p) for p in era5["inputs"] if "{year}" in p)
        ):
            raise ConfigError(
                f"{source}: key 'era5.inputs': with era5.download set, give exactly one path with '{{year}}' "
                "(and no '{month}' or wildcard: a download writes one file per year)"
            )
        if not era5.get("demo", False) and not era5.get("download"):
            missing = list(dict.fromkeys(p for y in sorted(seen) for p in era5_input_paths(era5, y) if not _exists(p)))
            if era5.get("constants") and not _exists(era5["constants"]):
                missing.append(era5["constants"])
            if missing:
                shown = _listed(list(dict.fromkeys(missing)))
                raise ConfigError(
                    f"{source}: key 'era5.inputs': input file(s) not found:\n{shown}\n"
                    "(set era5.download: arco or cds to fetch them, or era5.demo: true for synthetic data)"
                )


# The hyperspectral sections (hsi.<task>) and the keys of the files each reads: a labelled
# scene (or tile set) and its labels, or unlabelled images.
HSI_FILES = {"classification": ("image", "labels"), "mae": ("images",)}


def _check_hsi(hsi: dict, source: str) -> None:
    import glob

    present = [sub for sub in HSI_FILES if sub in hsi]
    if not present:
        raise ConfigError(f"{source}: key 'hsi' needs a {' or '.join(repr(s) for s in HSI_FILES)} section")
    wanted = {}  # section -> the files it names
    for sub in present:
        if not np.isclose(sum(hsi[sub].get("fractions", [1, 0, 0])), 1.0):
            raise ConfigError(f"{source}: key 'hsi.{sub}.fractions' must sum to 1, got {hsi[sub]['fractions']}")
        values = [hsi[sub][key] for key in HSI_FILES[sub]]
        wanted[sub] = [p for v in values for p in (v if isinstance(v, list) else [v])]
    if hsi.get("demo"):  # the demo writes a scene's files where they are named (its images: a rule's folder)
        for sub, paths in wanted.items():
            if "images" not in HSI_FILES[sub]:
                _check_generated(paths, f"hsi.{sub}", source)
        return
    missing = [p for p in dict.fromkeys(p for paths in wanted.values() for p in paths) if not glob.glob(p)]
    if missing:
        raise ConfigError(f"{source}: key 'hsi': input file(s) not found:\n" + _listed(missing))


def _listed(paths: list[str], most: int = 10) -> str:
    """Paths one per line, the first ``most`` of them and how many more (an error stays short)."""
    more = f"\n  … and {len(paths) - most} more" if len(paths) > most else ""
    return "\n".join(f"  {p}" for p in paths[:most]) + more


def _check_generated(paths: list[str], key: str, source: str) -> None:
    """Files the demo writes must lie inside the working directory (relative, no '..')."""
    for path in paths:
        parts = Path(path).parts
        if Path(path).is_absolute() or ".." in parts or "://" in path:
            raise ConfigError(
                f"{source}: key '{key}': {path!r}: the demo writes its inputs here, so the path must lie "
                "inside the working directory (relative, without '..'), e.g. resources/demo/..."
            )


def _exists(path: str) -> bool:
    return "://" in path or Path(path).exists()


def era5_input_paths(era5: dict, year: int) -> list[str]:
    """The input files for ``year``: ``{year}`` filled in, a path with ``{month}`` once for each
    month (01..12), a glob pattern (``*``, ``?``, ``[...]``) expanded to the files it matches,
    sorted (a pattern that matches nothing stays as it is, to be reported missing); other
    paths as they are."""
    import glob

    out: list[str] = []
    for pattern in era5["inputs"]:
        months = [f"{m:02d}" for m in range(1, 13)] if "{month}" in pattern else [None]
        for month in months:
            path = pattern.replace("{year}", str(year))
            if month is not None:
                path = path.replace("{month}", month)
            matches = sorted(glob.glob(path)) if "://" not in path and glob.has_magic(path) else []
            out += matches or [path]
    return list(dict.fromkeys(out))
