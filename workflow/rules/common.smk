import hashlib
import json
import shlex
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from dchag.config import ConfigError, check_config, era5_input_paths

# Schema defaults are filled in by validate; an unknown key or wrong type stops here.
validate(config, schema="../schemas/config.schema.yaml")
try:
    check_config(config, "config")
except ConfigError as err:
    raise WorkflowError(str(err))

RESULTS = f"results/{config['name']}"
LOGS = f"logs/{config['name']}"

# With --use-conda the package runs from this checkout inside the rule's environment.
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    _SRC = f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))}"
    DCHAG = f"{_SRC} python -m dchag"
    TORCHRUN = f"{_SRC} torchrun"
else:
    DCHAG = "dchag"
    TORCHRUN = "torchrun"


def config_arg(*sections):
    """The config sections a rule uses, written once to a content-addressed JSON file whose
    path is the rule's argument: a rule reruns when its own sections change and not when
    another's do, and the printed commands stay short."""
    cfg = {"name": config["name"], **{s: config[s] for s in sections}}
    text = json.dumps(cfg, sort_keys=True, indent=1)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(".snakemake") / "dchag-config" / f"{'+'.join(sections)}-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    quoted = shlex.quote(str(path))
    return (
        lambda wildcards: quoted
    )  # a function, so "{year}" inside is not taken as a wildcard


# -- ERA5 ----------------------------------------------------------------------------------
ERA5 = config.get("era5", {})
ERA5_SPLITS = ("train", "val", "test")

ERA5_WEIGHTS = f"{RESULTS}/era5/weights/{ERA5.get('regrid', {}).get('method', 'bilinear')}_{ERA5.get('grid', 5.625)}deg.nc"


def era5_years(split=None):
    splits = [split] if split else ERA5_SPLITS
    return sorted(y for s in splits for y in ERA5["years"][s])


def era5_year_store(year):
    return f"{RESULTS}/era5/years/{year}.zarr"


def era5_inputs(year):
    paths = era5_input_paths(ERA5, int(year))
    return paths + ([ERA5["constants"]] if ERA5.get("constants") else [])


def era5_outputs():
    return [
        *expand(f"{RESULTS}/era5/{{split}}.zarr", split=ERA5_SPLITS),
        f"{RESULTS}/era5/climatology.zarr",
    ]


# -- hyperspectral -------------------------------------------------------------------------
HSI = config.get("hsi", {})
HSI_DEMO_ENVI = "resources/demo/hsi/envi"


def hsi_mae_inputs():
    """The demo's ENVI folder (made by a rule), or the user's images (globs expanded)."""
    if HSI.get("demo"):
        return [HSI_DEMO_ENVI]
    import glob

    return sorted(p for pattern in HSI["mae"]["images"] for p in glob.glob(pattern))


def hsi_flags(task):
    """`dchag preprocess-hsi` options from the config's hsi section."""
    sec = HSI[task]
    flags = [
        "--seed",
        sec.get("seed", 0),
        "--fractions",
        ",".join(map(str, sec["fractions"])),
    ]
    flags += [
        "--nan-policy",
        HSI.get("nan_policy", "fail"),
        "--band-chunk",
        HSI.get("band_chunk", 32),
    ]
    if HSI.get("preset"):
        flags += ["--preset", HSI["preset"]]
    if HSI.get("drop_bands"):
        flags += ["--drop-bands", HSI["drop_bands"]]
    if HSI.get("drop_wavelengths"):
        flags += [
            "--drop-wavelengths",
            *[f"{lo}-{hi}" for lo, hi in HSI["drop_wavelengths"]],
        ]
    if HSI.get("clip_percentiles"):
        flags += ["--clip", *HSI["clip_percentiles"]]
    if sec.get("image_key"):
        flags += ["--key", sec["image_key"]]
    if task == "classification":
        flags += ["--patch", sec["patch"], "--split", sec["split"]]
        if sec.get("block"):
            flags += ["--block", sec["block"]]
        if sec.get("labels_key"):
            flags += ["--labels-key", sec["labels_key"]]
        if sec.get("class_names"):
            flags += ["--class-names", ",".join(sec["class_names"])]
    else:
        flags += ["--tile", sec["tile"]]
    return " ".join(shlex.quote(str(f)) for f in flags)


def hsi_outputs():
    return [
        f"{RESULTS}/hsi/{task}.zarr"
        for task in ("classification", "mae")
        if task in HSI
    ]


# -- training ------------------------------------------------------------------------------
TRAIN = config.get("train", {})
TRAIN_RUNS = TRAIN.get("runs", {})


def _task_sections(run):
    return ["era5"] if TRAIN_RUNS[run]["task"] == "forecast" else ["hsi"]


def train_inputs(wildcards):
    task = TRAIN_RUNS[wildcards.run]["task"]
    if task == "forecast":
        return [f"{RESULTS}/era5/train.zarr", f"{RESULTS}/era5/val.zarr"]
    return [f"{RESULTS}/hsi/{'mae' if task == 'mae' else 'classification'}.zarr"]


def train_config_arg(wildcards):
    sections = [
        *_task_sections(wildcards.run),
        *(s for s in ("model", "parallel", "train") if s in config),
    ]
    return config_arg(*sections)(wildcards)


def train_outputs():
    if not TRAIN_RUNS:
        return []
    return [f"{RESULTS}/train/{run}/final" for run in TRAIN_RUNS] + [
        f"{RESULTS}/train/summary.csv"
    ]


def all_outputs():
    out = []
    if "era5" in config:
        out += era5_outputs()
    if HSI:
        out += hsi_outputs()
    out += train_outputs()
    return out
