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
    DCHAG = (
        f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))} python -m dchag"
    )
else:
    DCHAG = "dchag"


def config_arg(*sections):
    """The config sections a rule uses, as one shell-quoted JSON argument, so a rule reruns
    when its own sections change and not when another's do."""
    cfg = {"name": config["name"], **{s: config[s] for s in sections}}
    quoted = shlex.quote(json.dumps(cfg, sort_keys=True))
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


def all_outputs():
    out = []
    if "era5" in config:
        out += era5_outputs()
    return out
