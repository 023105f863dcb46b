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
    DCHAG = f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))} python -m dchag"
else:
    DCHAG = "dchag"


def config_arg(*sections):
    """The config sections a rule uses, as one shell-quoted JSON argument, so a rule reruns
    when its own sections change and not when another's do."""
    cfg = {"name": config["name"], **{s: config[s] for s in sections}}
    quoted = shlex.quote(json.dumps(cfg, sort_keys=True))
    return lambda wildcards: quoted  # a function, so "{year}" inside is not taken as a wildcard


def all_outputs():
    out = []
    if "era5" in config:
        out += era5_outputs()
    return out
