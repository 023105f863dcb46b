# The plan (dchag.plan.Plan) and the named functions the rules call. Every value a rule puts
# in a shell command is quoted there ({x:q}); names that become paths are constrained by the
# schema. Only wiring lives here: the logic is in dchag.plan, where the tests reach it.
import re
import shlex
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from dchag.config import ConfigError, read_yaml, schema_enum, validate
from dchag.plan import BASELINE_FORECASTS, ERA5_SPLITS, Plan
from dchag.store import STORE_FORMAT

# The config files are read again strictly (a key given twice, an alias bomb), then validated
# against the schema (workflow/schemas/config.schema.yaml), which fills in its defaults; an
# unknown key or wrong type stops here, and so does every check of the plan
# (dchag.plan.Plan), with a bounded message naming the key.
CONFIG_SOURCE = (
    ", ".join(map(str, workflow.overwrite_configfiles)) or "config/demo.yaml"
)
try:
    for path in workflow.overwrite_configfiles:
        read_yaml(path)
    validate(config, CONFIG_SOURCE)
    P = Plan(config)
except ConfigError as err:
    raise WorkflowError(str(err))

RESULTS, LOGS, EVAL_DIR, FIGURES = P.results, P.logs, P.eval_dir, P.figures
RUN = P.run_paths("{run}")  # a training run's paths, by the wildcard {run}
ERA5, HSI, EVAL = P.era5, P.hsi, config["evaluate"]
HSI_DEMO_ENVI = "resources/demo/hsi/envi"

# With --use-conda the package runs from this checkout inside the rule's environment.
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    DCHAG = (
        f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))} python -m dchag"
    )
else:
    DCHAG = "dchag"


def one_of(names):
    """A wildcard constraint matching exactly these names (none: nothing)."""
    return "|".join(re.escape(str(n)) for n in names) or "NO_NAMES"


def section_config(*sections):
    """A params function: the content-addressed JSON of the config sections a rule uses (a
    function, so "{year}" inside is not taken as a wildcard)."""
    path = P.section_config_file(*sections)

    def config_file(wildcards):
        return path

    return config_file


# -- ERA5 ----------------------------------------------------------------------------------
def era5_year_inputs(wildcards):
    return P.era5_year_inputs(wildcards.year)


def era5_weights_option(wildcards, input):
    return ["--weights", input.weights] if "weights" in input.keys() else []


def era5_weights_year(wildcards):
    return P.era5_years("train")[0]


def era5_split_years(wildcards):
    return [P.era5_year_store(y) for y in P.era5_years(wildcards.split)]


def era5_split_parts(wildcards):
    return [
        P.era5_split_part(wildcards.split, y) for y in P.era5_years(wildcards.split)
    ]


def era5_stats_partials(wildcards):
    return [P.era5_year_stats(y) for y in P.era5_years("train")]


def era5_climatology_years(wildcards):
    return [P.era5_year_store(y) for y in P.era5_years(ERA5["climatology_split"])]


def output_dir(wildcards, output):
    return Path(output[0]).parent


# -- hyperspectral -------------------------------------------------------------------------
def hsi_mae_inputs():
    """The demo's ENVI folder (made by a rule), or the user's images (globs expanded)."""
    if HSI["demo"]:
        return [HSI_DEMO_ENVI]
    import glob

    return sorted(p for pattern in HSI["mae"]["images"] for p in glob.glob(pattern))


def hsi_classification_inputs():
    """The scene and its labels, or every image and label tile of a tile set."""
    from dchag.errors import DchagError
    from dchag.hsi.sources import rule_inputs

    try:
        return rule_inputs(HSI, "classification")
    except DchagError as err:
        raise WorkflowError(str(err))


# -- training and the torchrun jobs --------------------------------------------------------
def torchrun_resources(shape_of, *keys):
    """A torchrun job's Slurm resources (dchag.jobs.JobShape), each a function of the job:
    nodes, tasks, gres, mpi and ``keys``."""

    def resource(key):
        def value(wildcards):
            return shape_of(wildcards).slurm_resources()[key]

        return value

    return {key: resource(key) for key in ("nodes", "tasks", "gres", "mpi", *keys)}


def train_shape(wildcards):
    return P.train_shape(wildcards.run)


def paper_shape(wildcards):
    return P.paper_shape(wildcards.point)


def train_launcher(wildcards):
    return train_shape(wildcards).launcher(DCHAG)


def paper_launcher(wildcards):
    return paper_shape(wildcards).launcher(DCHAG)


def train_threads(wildcards):
    return train_shape(wildcards).cpus


def rank_threads(wildcards, threads):
    """The job's threads over its ranks, less their loader workers' (Snakemake exports
    OMP/MKL/BLAS thread counts = the job's threads, which torchrun would pass to every rank).
    """
    return train_shape(wildcards).rank_threads(threads)


def train_inputs(wildcards):
    from dchag.plan import previous_repeat

    init = P.init_model(wildcards.run)
    return {
        **P.run_stores(wildcards.run),
        "previous": [
            P.run_paths(r).log for r in previous_repeat(wildcards.run, P.verify_runs)
        ],
        # the model folder it starts from (a source run's, made from its final checkpoint)
        "init": [f"{init}/model.json"] if init else [],
    }


def init_option(wildcards, input):
    """--init-from DIR for a run with init_from (the model folder dchag export writes)."""
    return ["--init-from", str(Path(input.init[0]).parent)] if input.init else []


def model_dir(wildcards, output):
    return Path(output.meta).parent


def export_inputs(wildcards):
    return {
        "final": P.run_paths(wildcards.run).final,
        "store": P.run_stores(wildcards.run)["train"],
    }


def run_config(wildcards):
    return P.run_config_file(wildcards.run)


def run_processes(wildcards):
    return P.run_train(wildcards.run).nproc


def run_restarts(wildcards):
    return P.run_train(wildcards.run).max_restarts


def run_dir(wildcards, output):
    return Path(output.log).parent


def verify_inputs(wildcards):
    if not P.verify_runs:
        raise WorkflowError(
            "snakemake verify needs a 'verify' section in the config (e.g. `verify: {}`; keys in "
            "workflow/schemas/config.schema.yaml)"
        )
    return [P.run_paths(run).log for run in P.verify_runs]


def verify_run_dirs(wildcards):
    return [f"{run}={P.run_paths(run).dir}" for run in P.verify_runs]


# -- evaluation and figures ----------------------------------------------------------------
def scored_sources():
    return [*P.forecast_runs, *BASELINE_FORECASTS]


def compared_sources():
    return sorted({run for pair in P.forecast_comparisons for run in pair})


def scorecard_comparisons(wildcards):
    return [
        f"{EVAL_DIR}/era5/comparison_{cand}_vs_{base}_{wildcards.convention}.csv"
        for cand, base in P.forecast_comparisons
    ]


def hsi_samples(role):
    """The per-sample results of the ``role`` run of a hyperspectral comparison."""

    def path(wildcards):
        run = wildcards[role]
        if run in P.mae_runs:
            return f"{EVAL_DIR}/hsi/recon_{run}.npz"
        return f"{EVAL_DIR}/hsi/classification_{run}_map.npz"

    return path


def lead_time_scores(wildcards):
    return [
        f"{EVAL_DIR}/era5/scores_{source}_{wildcards.convention}.csv"
        for source in scored_sources()
    ]


def score_options(wildcards, input):
    """ClimaX scores ACC against the scored period's time mean (in batches, if configured);
    WeatherBench 2 against the day-of-year climatology."""
    if wildcards.convention == "wb2":
        return ["--climatology", input.climatology]
    batch = EVAL["climax_batch_size"]
    return ["--batch-size", batch] if batch else []


def foundation_inputs(wildcards):
    return {
        f"{variant}:{start}": f"{EVAL_DIR}/hsi/classification_{run}.json"
        for variant, starts in P.foundation.items()
        for start, run in starts.items()
    }


def foundation_words(wildcards, input):
    """VARIANT:START=SCORES words of the foundation-model experiment."""
    from dchag.plan import FOUNDATION_STARTS

    return [
        f"{variant}:{FOUNDATION_STARTS[start]}={input[f'{variant}:{start}']}"
        for variant, starts in P.foundation.items()
        for start in starts
    ]


def model_folder(wildcards, input):
    return Path(input.model).parent


def classification_scene(wildcards):
    """The classification scene (one image; a tile set has no one scene)."""
    from dchag.hsi.sources import has_wildcard

    image = HSI.get("classification", {}).get("image")
    if not image or has_wildcard(image):
        raise WorkflowError(
            "predict_scene needs hsi.classification.image to be one scene (not a tile glob)"
        )
    return image


def mae_image(wildcards):
    """The first unlabelled image (the MAE runs' reconstruction target)."""
    from dchag.hsi import demo
    from dchag.hsi.sources import expand_images

    if HSI["demo"]:
        return f"{HSI_DEMO_ENVI}/{demo.envi_name(0)}"
    if not HSI.get("mae", {}).get("images"):
        raise WorkflowError("predict_reconstruction needs hsi.mae.images")
    return expand_images(HSI["mae"]["images"][:1])[0]


def mae_image_input(wildcards):
    """The demo's ENVI folder (made by a rule), or the image itself."""
    return [HSI_DEMO_ENVI] if HSI["demo"] else [mae_image(wildcards)]


def mae_image_key(wildcards):
    key = HSI["mae"].get("image_key")
    return ["--image-key", key] if key else []


def classification_scene_key(wildcards):
    key = HSI["classification"]["image_key"]
    return ["--image-key", key] if key else []


def map_variable():
    if not P.forecast_runs:
        return []
    return [EVAL["map_variable"] or P.forecast_variables()[0]]


# -- the paper's experiments ---------------------------------------------------------------
def paper_point_config(wildcards):
    return P.paper_point_config_file(wildcards.point)


def paper_point_threads(wildcards):
    return paper_shape(wildcards).cpus


def paper_rank_threads(wildcards, threads):
    return P.paper["threads_per_rank"] or paper_shape(wildcards).rank_threads(threads)


def paper_point_files(wildcards):
    return [
        f"{RESULTS}/paper/points/{p.name}.json"
        for p in P.paper_sweeps.get(wildcards.kind, [])
    ]


def paper_accuracy_inputs(wildcards):
    """The accuracy runs' training logs (by variant) and their comparison tables."""
    out = {
        f"{task}_{variant}": P.run_paths(run).log
        for task, runs in P.paper_accuracy.items()
        for variant, run in runs.items()
    }
    forecast = P.paper_accuracy.get("forecast", {})
    out["comparisons"] = [
        f"{EVAL_DIR}/era5/comparison_{run}_vs_{forecast['baseline']}_{conv}.csv"
        for variant, run in forecast.items()
        if variant != "baseline" and "baseline" in forecast
        for conv in EVAL["conventions"]
    ]
    return out


def paper_accuracy_runs(task):
    """VARIANT=LOG words of the accuracy runs of ``task``."""

    def words(wildcards, input):
        return [f"{v}={input[f'{task}_{v}']}" for v in P.paper_accuracy.get(task, {})]

    return words


def paper_outputs(wildcards):
    if not P.paper:
        raise WorkflowError(
            "snakemake paper needs a 'paper' section in the config (see config/paper.yaml, config/paper_cpu.yaml)"
        )
    figs = [
        f"{FIGURES}/paper/{kind}.png" for kind, pts in P.paper_sweeps.items() if pts
    ]
    if P.paper_accuracy:
        figs.append(f"{FIGURES}/paper/accuracy.png")
    if P.paper_accuracy.get("forecast"):  # the accuracy table's runs, with significance
        figs += [f"{FIGURES}/scorecard_{conv}.png" for conv in EVAL["conventions"]]
    return figs
