import functools
import hashlib
import json
import re
import shlex
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

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


def config_file(cfg, label):
    """``cfg`` written once to a content-addressed JSON file; its quoted path."""
    text = json.dumps(cfg, sort_keys=True, indent=1)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(".snakemake") / "dchag-config" / f"{label}-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return shlex.quote(str(path))


def config_arg(*sections):
    """The config sections a rule uses, written once to a content-addressed JSON file whose
    path is the rule's argument: a rule reruns when its own sections change and not when
    another's do, and the printed commands stay short."""
    quoted = config_file(
        {"name": config["name"], **{s: config[s] for s in sections}}, "+".join(sections)
    )
    return (
        lambda wildcards: quoted
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


def hsi_flags(task):
    """`dchag preprocess-hsi` options from the config's hsi section."""
    sec = HSI[task]
    flags = [
        "--seed",
        sec["seed"],
        "--fractions",
        ",".join(map(str, sec["fractions"])),
    ]
    flags += [
        "--nan-policy",
        HSI["nan_policy"],
        "--band-chunk",
        HSI["band_chunk"],
    ]
    if HSI["preset"]:
        flags += ["--preset", HSI["preset"]]
    if HSI["drop_bands"]:
        flags += ["--drop-bands", HSI["drop_bands"]]
    if HSI["drop_wavelengths"]:
        flags += [
            "--drop-wavelengths",
            *[f"{lo}-{hi}" for lo, hi in HSI["drop_wavelengths"]],
        ]
    if HSI["clip_percentiles"]:
        flags += ["--clip", *HSI["clip_percentiles"]]
    if sec["image_key"]:
        flags += ["--key", sec["image_key"]]
    if task == "classification":
        flags += [
            "--patch",
            sec["patch"],
            "--split",
            sec["split"],
            "--missing-class",
            sec["missing_class"],
        ]
        if sec["block"]:
            flags += ["--block", sec["block"]]
        if sec["labels_key"]:
            flags += ["--labels-key", sec["labels_key"]]
        if sec["class_names"]:
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
TRAIN = config.get("train", {})  # as written (a run's config file carries it)
TRAIN_RUNS = S.train.runs


def verify_runs():
    """The verification experiment (config `verify`): data parallelism, fixed channel groups,
    compression with bucketing and D-CHAG-L, the same task, steps and global batch."""
    v = S.verify
    if v is None:
        return {}
    nproc = S.train.nproc
    batch = v.batch_size or S.train.batch_size
    if batch % nproc:
        raise WorkflowError(
            f"config key 'verify.batch_size': {batch} does not split over {nproc} data-parallel ranks"
        )
    common = {"steps": v.steps or S.train.steps}
    dp_train = {**common, "batch_size": batch // nproc}
    ddp = {"tp": 1, "strategy": "baseline", "dp": "ddp"}
    task = v.task
    runs = {
        "verify-dp": {
            "task": task,
            "model": {"aggregation": "baseline"},
            "parallel": ddp,
            "train": dp_train,
        },
        "verify-fixed-group": {
            "task": task,
            "model": {"aggregation": "linear", "groups": v.groups},
            "parallel": ddp,
            "train": dp_train,
        },
        "verify-compress": {
            "task": task,
            "model": {"aggregation": "baseline"},
            "parallel": {
                **ddp,
                "comm_hook": v.comm_hook,
                "ddp_bucket_mb": v.bucket_mb,
            },
            "train": dp_train,
        },
        "verify-dchag-l": {
            "task": task,
            "model": {"aggregation": "linear"},
            "parallel": {"tp": nproc, "strategy": "dchag", "dp": "none"},
            "train": {**common, "batch_size": batch},
        },
    }
    repeats = v.repeats
    if repeats == 1:
        return runs
    # repeat i of every method runs before repeat i + 1 of any (previous_repeat)
    return {
        f"{name}-r{i}": run for i in range(1, repeats + 1) for name, run in runs.items()
    }


VERIFY_RUNS = verify_runs()


def verify_inputs(wildcards):
    if not VERIFY_RUNS:
        raise WorkflowError(
            "snakemake verify needs a 'verify' section in the config (e.g. `verify: {}`; keys in "
            "workflow/schemas/config.schema.yaml)"
        )
    return [f"{RESULTS}/train/{run}/log.csv" for run in VERIFY_RUNS]


ALL_RUNS = {**TRAIN_RUNS, **VERIFY_RUNS}


def _task_sections(run):
    return ["era5"] if ALL_RUNS[run]["task"] == "forecast" else ["hsi"]


def train_inputs(wildcards):
    task = ALL_RUNS[wildcards.run]["task"]
    if task == "forecast":
        data = [f"{RESULTS}/era5/train.zarr", f"{RESULTS}/era5/val.zarr"]
    else:
        data = [f"{RESULTS}/hsi/{'mae' if task == 'mae' else 'classification'}.zarr"]
    return data + previous_repeat(wildcards.run)


def previous_repeat(run):
    """Verification repeat i of a method waits for repeat i - 1 of every method: the repeats
    interleave, so a slow spell of a shared machine does not fall on one method only."""
    m = re.fullmatch(r"(verify-.+)-r(\d+)", run)
    if not m or int(m.group(2)) == 1:
        return []
    prev = f"-r{int(m.group(2)) - 1}"
    return [
        f"{RESULTS}/train/{name}/log.csv" for name in VERIFY_RUNS if name.endswith(prev)
    ]


def train_config_arg(wildcards):
    """The run's config: its dataset section, model, parallel and train with only this run
    (adding or changing another run does not retrain this one)."""
    sections = [
        *_task_sections(wildcards.run),
        *(s for s in ("model", "parallel") if s in config),
    ]
    cfg = {"name": config["name"], **{s: config[s] for s in sections}}
    cfg["train"] = {**TRAIN, "runs": {wildcards.run: ALL_RUNS[wildcards.run]}}
    return config_file(cfg, "+".join([*sections, "train", wildcards.run]))


@functools.cache
def run_train(run):
    """The train settings of a run (top-level with its overrides): processes, nodes, GPUs."""
    from dchag.config import run_settings

    return run_settings({**config, "train": {**TRAIN, "runs": ALL_RUNS}}, run).train


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
BASELINE_FORECASTS = ("persistence", "climatology")


def runs_of(task):
    return [r for r, spec in TRAIN_RUNS.items() if spec["task"] == task]


def run_strategy(run):
    from dchag.config import run_settings

    return run_settings(config, run).parallel.strategy


FORECAST_RUNS = runs_of("forecast") if "era5" in config else []
MAE_RUNS = runs_of("mae") if "mae" in HSI else []
CLASSIFY_RUNS = runs_of("classify") if "classification" in HSI else []
for _run in FORECAST_RUNS:
    if _run in BASELINE_FORECASTS:
        raise WorkflowError(
            f"config key 'train.runs.{_run}': the name is taken by a reference forecast; rename the run"
        )


def forecast_outputs():
    """The forecast variables (train.forecast.outputs, or the default five present)."""
    from dchag.model.build import era5_shape, forecast_outputs as outputs_of

    return outputs_of(S, era5_shape(S)[0])


def comparisons():
    """candidate forecast run -> baseline run, for the % change tables."""
    if EVAL["compare"]:
        return dict(EVAL["compare"])
    baselines = [r for r in FORECAST_RUNS if run_strategy(r) == "baseline"]
    if len(baselines) != 1:
        return {}
    return {r: baselines[0] for r in FORECAST_RUNS if r != baselines[0]}


def model_benchmark():
    path = Path(EVAL["model_benchmark"])
    return str(
        path if path.is_absolute() or path.exists() else Path(workflow.basedir) / path
    )


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
            for cand in comparisons()
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
    figs.append("memory_throughput")
    if MAE_RUNS:
        figs.append("hsi_reconstruction")
    if CLASSIFY_RUNS:
        figs.append("classification")
    return [f"{FIGURES}/{name}.png" for name in figs]
