# dchag: config -> preprocess -> Zarr -> train -> checkpoint -> evaluate -> figures.
# Only wiring lives here and in workflow/rules/; every rule calls one `dchag` subcommand.
from snakemake.utils import min_version

min_version("9.19")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/era5.smk"
include: "workflow/rules/hsi.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        all_outputs(),
