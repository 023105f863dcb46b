# dchag: config -> preprocess -> Zarr -> train -> checkpoint -> evaluate -> figures.
# Only wiring lives here and in workflow/rules/; every rule calls one `dchag` subcommand.
from snakemake.utils import min_version

min_version("9.19")


# The demo (config/demo.yaml) is the config only when none is given: `--configfile FILE` runs
# exactly what FILE asks for, nothing of the demo is merged under it.
if not workflow.overwrite_configfiles:

    configfile: "config/demo.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


if "era5" in config:

    include: "workflow/rules/era5.smk"


include: "workflow/rules/hsi.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/paper.smk"


rule all:
    """The whole pipeline: preprocessing, training, evaluation and figures."""
    default_target: True
    input:
        P.all_outputs(),
