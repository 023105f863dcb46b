"""Hyperspectral preprocessing: the demo scene, and images to classification patches or
masked-autoencoder tiles."""

from __future__ import annotations

import argparse

from ..config import schema_default, schema_enum
from ..config.inputs import HSI_FILES
from .common import config, config_arg, nonneg_int, percentile, positive_int


def cmd_demo_hsi(args) -> None:
    from ..hsi import demo

    demo.write_demo(args.outdir, size=args.size, images=args.images, image_size=args.image_size, seed=args.seed)


def _fractions(text: str) -> list[float]:
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) != 3:
        raise argparse.ArgumentTypeError("expected three comma-separated fractions: train,val,test")
    return parts


def _integers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _wavelength_range(text: str) -> list[float]:
    try:
        lo, hi = (float(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a range LO-HI in nm, got {text!r}") from None
    return [lo, hi]


def standalone_hsi_section(args) -> tuple[str, dict]:
    """The ``hsi`` config section the standalone flags describe, and its task; the schema
    fills in what a flag leaves unset (one place for every default)."""
    from ..store import InputError

    if not args.input:
        raise InputError("preprocess-hsi needs input file(s), or --config FILE --task classification|mae")
    common = {
        "preset": args.preset,
        "drop_bands": args.drop_bands,
        "drop_wavelengths": args.drop_wavelengths,
        "nan_policy": args.nan_policy,
        "clip_percentiles": args.clip,
        "band_chunk": args.band_chunk,
        "nodata": args.nodata,
        "detector_overlap": args.detector_overlap,
    }
    if args.labels:
        if len(args.input) != 1:
            raise InputError(f"preprocess-hsi --labels takes one image, got {len(args.input)}: {', '.join(args.input)}")
        task = "classification"
        section = {
            "image": args.input[0],
            "image_key": args.key,
            "labels": args.labels,
            "labels_key": args.labels_key,
            "class_names": args.class_names.split(",") if args.class_names else None,
            "ignore_labels": args.ignore_labels,
            "noncontiguous_labels": args.noncontiguous_labels,
            "patch": args.patch,
            "split": args.split,
            "fractions": args.fractions,
            "block": args.block,
            "missing_class": args.missing_class,
            "seed": args.seed,
        }
    else:
        task = "mae"
        section = {
            "images": args.input,
            "image_key": args.key,
            "tile": args.tile,
            "fractions": args.fractions,
            "seed": args.seed,
        }
    hsi = {k: v for k, v in common.items() if v is not None}
    hsi[task] = {k: v for k, v in section.items() if v is not None}
    return task, hsi


def cmd_preprocess_hsi(args) -> None:
    from ..config import validate
    from ..hsi.preprocess import preprocess_from_config
    from ..store import InputError

    if args.config:
        if not args.task or args.input:
            raise InputError(
                "preprocess-hsi --config takes --task classification|mae and no input files "
                "(the config's hsi section names them)"
            )
        preprocess_from_config(config(args), args.task, args.output)
        return
    task, hsi = standalone_hsi_section(args)
    cfg = validate({"name": "preprocess-hsi", "hsi": hsi}, "preprocess-hsi's options")
    preprocess_from_config(cfg, task, args.output)


def register(add) -> None:
    sp = add(
        "demo-hsi", cmd_demo_hsi, "write the synthetic hyperspectral demo scene (.mat + ground truth, and ENVI images)"
    )
    sp.add_argument("--outdir", required=True)
    sp.add_argument("--size", type=positive_int, default=48, help="classification scene rows = cols")
    sp.add_argument("--images", type=positive_int, default=6, help="ENVI images for masked autoencoding")
    sp.add_argument("--image-size", type=positive_int, default=64, help="rows = cols of each ENVI image")
    sp.add_argument("--seed", type=nonneg_int, default=0)

    sp = add(
        "preprocess-hsi",
        cmd_preprocess_hsi,
        "hyperspectral image(s) -> normalised patches (with --labels) or tiles, one Zarr store with train/val/test "
        "groups; an option left out takes the config schema's default (hsi section)",
    )
    sp.add_argument(
        "input",
        nargs="*",
        help="ENVI header(s), .mat, GeoTIFF (EnMAP L2A), PRISMA .he5 or EMIT .nc file(s); several (or a glob) for "
        "tiles; with --labels, an image glob and a label glob make a tile set",
    )
    config_arg(
        sp, required=False, help_="take the files and every option from this config's hsi section instead (with --task)"
    )
    sp.add_argument("--task", choices=list(HSI_FILES), help="with --config: which store to make")
    sp.add_argument("--labels", help="ground-truth map: makes classification patches centred on labelled pixels")
    sp.add_argument("--key", help="variable of the image in a .mat file")
    sp.add_argument("--labels-key", help="variable of the labels in a .mat file")
    which = sp.add_mutually_exclusive_group()
    which.add_argument("--preset", help="band preset: indian_pines, salinas, pavia_university, vnir_400_900")
    which.add_argument("--drop-bands", help="1-based bands to drop, e.g. 104-108,150-163,220")
    sp.add_argument(
        "--drop-wavelengths", nargs="*", type=_wavelength_range, help="nm ranges to drop, e.g. 1340-1450 1800-1960"
    )
    sp.add_argument("--patch", type=positive_int, help="classification patch size (odd)")
    sp.add_argument("--split", choices=schema_enum("hsi.classification.split"))
    sp.add_argument("--block", type=positive_int, help="disjoint split block size (default 2 x patch)")
    sp.add_argument(
        "--missing-class",
        choices=schema_enum("hsi.classification.missing_class"),
        help="a class absent from a split stops the run (error) or is reported (warn)",
    )
    sp.add_argument("--tile", type=positive_int, help="tile size for masked autoencoding")
    sp.add_argument("--fractions", type=_fractions, help="train,val,test")
    sp.add_argument("--seed", type=nonneg_int)
    sp.add_argument("--class-names", help="comma-separated, in label order 1..K")
    sp.add_argument(
        "--ignore-labels",
        type=_integers,
        help="label values that mean 'no label' besides 0 (default: "
        + ",".join(map(str, schema_default("hsi.classification.ignore_labels")))
        + ")",
    )
    sp.add_argument(
        "--noncontiguous-labels",
        choices=schema_enum("hsi.classification.noncontiguous_labels"),
        help="class values with gaps: renumber 1..K or stop",
    )
    sp.add_argument("--nodata", type=float, help="raw value of a missing pixel where the file declares none")
    sp.add_argument(
        "--detector-overlap",
        choices=schema_enum("hsi.detector_overlap"),
        help="PRISMA: the detector kept where they overlap",
    )
    sp.add_argument("--nan-policy", choices=schema_enum("hsi.nan_policy"))
    sp.add_argument(
        "--clip",
        type=percentile,
        nargs=2,
        metavar=("LO", "HI"),
        help="clip to these percentiles of the training pixels",
    )
    sp.add_argument("--band-chunk", type=positive_int)
    sp.add_argument("--output", required=True)
