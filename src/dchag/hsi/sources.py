"""Which files a config's hsi section names: image lists (globs expanded, each image once),
and labelled tile sets (an image glob and a label glob, paired by what the wildcards match)."""

from __future__ import annotations

import glob
import logging
import re
from pathlib import Path

from .image import HsiInputError
from .readers import envi_header, kind

log = logging.getLogger(__name__)
WILDCARDS = "*?["


def has_wildcard(pattern: str) -> bool:
    return any(ch in pattern for ch in WILDCARDS)


def image_identity(path: str) -> str:
    """The file that defines an image: an ENVI image's resolved header (``x.hdr`` and ``x.img``
    are one image), any other file's resolved path."""
    if kind(path) == "envi":
        hdr = envi_header(path)
        if hdr is not None:
            return str(hdr.resolve())
    return str(Path(path).resolve())


def expand_images(patterns: list[str]) -> list[str]:
    """Paths and glob patterns -> existing image paths, sorted per pattern, each image once
    (a glob matching both ``x.hdr`` and ``x.img`` gives ``x.hdr``)."""
    out: dict[str, str] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if has_wildcard(pattern) else [pattern]
        if not matches:
            raise HsiInputError(f"no image matches {pattern!r}")
        for path in matches:
            if not Path(path).exists():
                raise HsiInputError(f"image file not found: {path}")
            ident = image_identity(path)
            if ident in out:
                log.info("%s is the image %s already listed; read once", path, out[ident])
                continue
            hdr = envi_header(path) if kind(path) == "envi" else None
            out[ident] = str(hdr) if hdr is not None else path
    return list(out.values())


def _pattern_regex(pattern: str) -> re.Pattern:
    if "[" in pattern:
        raise HsiInputError(f"tile pattern {pattern!r}: only the wildcards * and ? are supported in tile sets")
    parts = []
    for ch in pattern:
        parts.append("([^/]*)" if ch == "*" else "([^/])" if ch == "?" else re.escape(ch))
    return re.compile("".join(parts))


def tile_pairs(image: str, labels: str) -> list[tuple[str, str]]:
    """(image, label) files of a scene or a tile set. Without wildcards: the one scene. With
    them (e.g. ``tiles/*_image.tif`` and ``tiles/*_label.tif``): every image whose wildcard
    part has a label file with the same part, sorted; an image or label without its partner
    is an error naming it."""
    if not has_wildcard(image) and not has_wildcard(labels):
        return [(image, labels)]
    ri, rl = _pattern_regex(image), _pattern_regex(labels)
    if ri.groups != rl.groups:
        raise HsiInputError(
            f"hsi.classification: image pattern {image!r} has {ri.groups} wildcard(s), labels {labels!r} "
            f"{rl.groups}; a tile set pairs images and labels by what the same wildcards match"
        )

    def keyed(pattern: str, regex: re.Pattern, what: str) -> dict[tuple, str]:
        found = {}
        for path in sorted(glob.glob(pattern)):
            m = regex.fullmatch(path)
            if m is None:
                continue
            found[m.groups()] = path
        if not found:
            raise HsiInputError(f"hsi.classification: no {what} file matches {pattern!r}")
        return found

    images = keyed(image, ri, "image")
    label_files = keyed(labels, rl, "label")
    lonely = [images[k] for k in images if k not in label_files]
    orphans = [label_files[k] for k in label_files if k not in images]
    if lonely or orphans:
        parts = []
        if lonely:
            parts.append(f"image(s) without a label file matching {labels!r}: {', '.join(lonely[:5])}")
        if orphans:
            parts.append(f"label file(s) without an image matching {image!r}: {', '.join(orphans[:5])}")
        raise HsiInputError("hsi.classification tile set: " + "; ".join(parts))
    return [(images[k], label_files[k]) for k in sorted(images)]


def rule_inputs(hsi: dict, task: str) -> list[str]:
    """The files a preprocessing job of ``task`` reads (for the rule's inputs): the scene and
    its labels, every tile and label tile, or the images (each once)."""
    sec = hsi[task]
    if "labels" not in sec:  # unlabelled images (masked autoencoding)
        return expand_images(sec["images"])
    if hsi.get("demo"):
        return [sec["image"], sec["labels"]]
    return [p for pair in tile_pairs(sec["image"], sec["labels"]) for p in pair]
