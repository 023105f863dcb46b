import functools
import shlex
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from dchag import plan
from dchag.config import ConfigError, check_config, era5_input_paths, settings

# Schema defaults are filled in by validate; an unknown key or wrong type stops here.
CONFIG_SOURCE = (
    ", ".join(map(str, workflow.overwrite_configfiles)) or "config/demo.yaml"
)
validate(config, schema="../schemas/config.schema.yaml")
try:
    check_config(config, CONFIG_SOURCE)
    S = settings(config)  # the typed view: every default from the schema
except ConfigError as err:
    raise WorkflowError(str(err))

RESULTS = f"results/{config['name']}"
LOGS = f"logs/{config['name']}"

# With --use-conda the package runs from this checkout inside the rule's environment.
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    _SRC = f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))}"
    DCHAG = f"{_SRC} python -m dchag"
else:
    DCHAG = "dchag"


CONFIG_DIR = Path(".snakemake") / "dchag-config"


def config_arg(*sections):
    """The config sections a rule uses, as the path of a content-addressed JSON file (a rule
    reruns when its own sections change and not when another's do)."""
    path = shlex.quote(
        str(
            plan.write_config(
                plan.section_config(S, *sections), "+".join(sections), CONFIG_DIR
            )
        )
    )
    return (
        lambda wildcards: path
    )  # a function, so "{year}" inside is not taken as a wildcard


# -- ERA5 ----------------------------------------------------------------------------------
ERA5 = S.era5 or {}
ERA5_SPLITS = ("train", "val", "test")

ERA5_WEIGHTS = (
    f"{RESULTS}/era5/weights/{ERA5['regrid']['method']}_{ERA5['grid']}deg.nc"
    if ERA5
    else None
)


def era5_years(split=None):
    splits = [split] if split else ERA5_SPLITS
    return sorted(y for s in splits for y in ERA5["years"][s])


def era5_year_store(year):
    return f"{RESULTS}/era5/years/{year}.zarr"


def era5_inputs(year):
    paths = era5_input_paths(ERA5, int(year))
    return paths + ([ERA5["constants"]] if ERA5["constants"] else [])


def era5_outputs():
    return [
        *expand(f"{RESULTS}/era5/{{split}}.zarr", split=ERA5_SPLITS),
        f"{RESULTS}/era5/climatology.zarr",
    ]


# -- hyperspectral -------------------------------------------------------------------------
HSI = S.hsi or {}
HSI_DEMO_ENVI = "resources/demo/hsi/envi"


def hsi_mae_inputs():
    """The demo's ENVI folder (made by a rule), or the user's images (globs expanded)."""
    if HSI["demo"]:
        return [HSI_DEMO_ENVI]
    import glob

    return sorted(p for pattern in HSI["mae"]["images"] for p in glob.glob(pattern))


def hsi_outputs():
    return [
        f"{RESULTS}/hsi/{task}.zarr"
        for task in ("classification", "mae")
        if task in HSI
    ]


# -- training ------------------------------------------------------------------------------
try:
    TRAIN_RUNS = S.train.runs
    VERIFY_RUNS = plan.verify_runs(S)
    ALL_RUNS = plan.all_runs(S)
except ConfigError as err:
    raise WorkflowError(str(err))


def verify_inputs(wildcards):
    if not VERIFY_RUNS:
        raise WorkflowError(
            "snakemake verify needs a 'verify' section in the config (e.g. `verify: {}`; keys in "
            "workflow/schemas/config.schema.yaml)"
        )
    return [f"{RESULTS}/train/{run}/log.csv" for run in VERIFY_RUNS]


def run_stores(run):
    """The stores a run trains on: train and val."""
    stores = plan.default_stores(config, ALL_RUNS[run]["task"], RESULTS)
    return {split: str(path) for split, path in stores.items()}


def train_inputs(wildcards):
    return {
        **run_stores(wildcards.run),
        "previous": [
            f"{RESULTS}/train/{r}/log.csv"
            for r in plan.previous_repeat(wildcards.run, VERIFY_RUNS)
        ],
    }


def train_config_arg(wildcards):
    """The run's config file: its dataset section, model, parallel and train with only this run."""
    cfg = plan.run_config(S, wildcards.run)
    return shlex.quote(str(plan.write_config(cfg, f"run-{wildcards.run}", CONFIG_DIR)))


@functools.cache
def run_train(run):
    """The train settings of a run (top-level with its overrides): processes, nodes, GPUs."""
    return plan.run_train_settings(S, run)


def train_resources():
    """Slurm resources of a training job, per run: nodes x processes (GPUs) per node; with
    several nodes, one task per node started by srun (mpi). Site values (partition, account,
    a typed gres) belong in the profile."""
    return {
        "runtime": 240,
        "mem_mb": 8000,
        "nodes": lambda w: run_train(w.run).nodes,
        "tasks": lambda w: run_train(w.run).nodes,
        "gres": lambda w: (
            f"gpu:{run_train(w.run).gpus_per_node}"
            if run_train(w.run).gpus_per_node
            else ""
        ),
        "mpi": lambda w: "srun" if run_train(w.run).nodes > 1 else "",
    }


def train_launcher(wildcards, resources):
    """`dchag` (one node) or `srun -n NODES --ntasks-per-node 1 dchag` (several Slurm nodes)."""
    if run_train(wildcards.run).nodes > 1:
        return f"{resources.mpi} -n {resources.tasks} --ntasks-per-node 1 {DCHAG}"
    return DCHAG


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
    out += eval_outputs()
    out += figure_outputs()
    return out


# -- evaluation and figures ----------------------------------------------------------------
EVAL = config["evaluate"]  # every key defaulted by the schema
EVAL_DIR = f"{RESULTS}/eval"
FIGURES = f"{RESULTS}/figures"
BASELINE_FORECASTS = plan.BASELINE_FORECASTS


try:
    FORECAST_RUNS = plan.forecast_runs(S)
    MAE_RUNS = plan.runs_of(S, "mae")
    CLASSIFY_RUNS = plan.runs_of(S, "classify")
    COMPARISONS = plan.comparisons(S)
except ConfigError as err:
    raise WorkflowError(str(err))


def forecast_outputs():
    """The forecast variables (train.forecast.outputs, or the default five present)."""
    from dchag.era5.source import channel_names, forecast_outputs as outputs_of

    return outputs_of(S.train.forecast.outputs, channel_names(ERA5))


def eval_outputs():
    out = []
    if FORECAST_RUNS:
        sources = [*FORECAST_RUNS, *BASELINE_FORECASTS]
        out += expand(
            f"{EVAL_DIR}/era5/scores_{{source}}_{{convention}}.csv",
            source=sources,
            convention=EVAL["conventions"],
        )
        out += [
            f"{EVAL_DIR}/era5/comparison_{cand}_{conv}.csv"
            for cand in COMPARISONS
            for conv in EVAL["conventions"]
        ]
    if MAE_RUNS or CLASSIFY_RUNS:
        out.append(f"{EVAL_DIR}/hsi/scores.csv")
    return out


def figure_outputs():
    figs = []
    if TRAIN_RUNS:
        figs.append("loss_curves")
    if FORECAST_RUNS:
        figs += [f"lead_time_{conv}" for conv in EVAL["conventions"]]
        figs.append("forecast_maps")
    if MAE_RUNS:
        figs.append("hsi_reconstruction")
    if CLASSIFY_RUNS:
        figs.append("classification")
    return [f"{FIGURES}/{name}.png" for name in figs]


# -- the paper's experiments ---------------------------------------------------------------
PAPER = S.paper or {}
PAPER_DIR = f"{RESULTS}/paper"
try:
    from dchag.paper import sweep as paper_sweep

    PAPER_SWEEPS = paper_sweep.sweeps(PAPER) if PAPER else {}
    PAPER_POINTS = paper_sweep.all_points(PAPER) if PAPER else {}
    PAPER_ACCURACY = plan.paper_accuracy(S) if PAPER else {}
except ConfigError as err:
    raise WorkflowError(str(err))


@functools.cache
def paper_resources(point):
    return paper_sweep.resources(PAPER_POINTS[point], PAPER["gpus_per_node"])


def paper_point_resources():
    """Slurm resources of a point: its GPUs (tp x dp) over nodes, one task per node (srun
    starts one torchrun per node with several)."""
    return {
        "runtime": PAPER.get("runtime", 30),
        "mem_mb": PAPER.get("mem_mb", 16000),
        "nodes": lambda w: paper_resources(w.point).nodes,
        "tasks": lambda w: paper_resources(w.point).nodes,
        "gres": lambda w: f"gpu:{paper_resources(w.point).per_node}",
        "mpi": lambda w: "srun" if paper_resources(w.point).nodes > 1 else "",
    }


def paper_launcher(wildcards, resources):
    if paper_resources(wildcards.point).nodes > 1:
        return f"{resources.mpi} -n {resources.tasks} --ntasks-per-node 1 {DCHAG}"
    return DCHAG


def paper_point_config(wildcards):
    cfg = paper_sweep.point_config(config["name"], PAPER, PAPER_POINTS[wildcards.point])
    return shlex.quote(
        str(plan.write_config(cfg, f"paper-{wildcards.point}", CONFIG_DIR))
    )


def paper_point_files(kind):
    return [f"{PAPER_DIR}/points/{p.name}.json" for p in PAPER_SWEEPS.get(kind, [])]


def paper_accuracy_inputs(wildcards):
    """The accuracy runs' training logs (by variant) and their comparison tables."""
    out = {
        f"{task}_{variant}": f"{RESULTS}/train/{run}/log.csv"
        for task, runs in PAPER_ACCURACY.items()
        for variant, run in runs.items()
    }
    baseline = PAPER_ACCURACY.get("forecast", {}).get("baseline")
    out["comparisons"] = [
        f"{EVAL_DIR}/era5/comparison_{run}_{conv}.csv"
        for variant, run in PAPER_ACCURACY.get("forecast", {}).items()
        if variant != "baseline" and baseline
        for conv in EVAL["conventions"]
    ]
    return out


def paper_outputs(wildcards):
    if not PAPER:
        raise WorkflowError(
            "snakemake paper needs a 'paper' section in the config (see config/paper.yaml, config/paper_cpu.yaml)"
        )
    figs = [f"{FIGURES}/paper/{kind}.png" for kind, pts in PAPER_SWEEPS.items() if pts]
    if PAPER_ACCURACY:
        figs.append(f"{FIGURES}/paper/accuracy.png")
    return figs
