"""The pipeline's plan, from a validated config: which training runs exist (the config's and
the verification experiment's), which runs are compared with which, the order the
verification repeats run in, and the per-rule config files. The Snakefile only wires these
to rules; they are plain functions, unit-tested.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

from .config import ConfigError, Settings, TrainSettings, run_settings

BASELINE_FORECASTS = ("persistence", "climatology")
# Where each task's stores are under a data root (results/<name> in the pipeline).
DEFAULT_STORES = {
    "forecast": {"train": "era5/train.zarr", "val": "era5/val.zarr"},
    "mae": {"train": "hsi/mae.zarr", "val": "hsi/mae.zarr"},
    "classify": {"train": "hsi/classification.zarr", "val": "hsi/classification.zarr"},
}


def default_stores(config: dict, task: str, data_root: str | Path | None = None) -> dict[str, Path]:
    """The task's train/val stores under ``data_root`` (default results/<name>)."""
    root = Path(data_root) if data_root else Path("results") / config["name"]
    return {split: root / rel for split, rel in DEFAULT_STORES[task].items()}


def verify_runs(s: Settings) -> dict[str, dict]:
    """The verification experiment (config ``verify``): data parallelism, fixed channel groups,
    compression with bucketing and D-CHAG-L — the same task, steps and global batch — with
    communication timing and memory tracking on (they are off in ordinary training).
    ``verify.repeats: R`` makes R copies of each, suffixed -r1 .. -rR."""
    v = s.verify
    if v is None:
        return {}
    nproc = s.train.nproc
    batch = v.batch_size or s.train.batch_size
    if batch % nproc:
        raise ConfigError(f"config key 'verify.batch_size': {batch} does not split over {nproc} data-parallel ranks")
    common = {"steps": v.steps or s.train.steps, "measure_comm": True, "measure_memory": True}
    dp_train = {**common, "batch_size": batch // nproc}
    ddp = {"tp": 1, "strategy": "baseline", "dp": "ddp"}
    runs = {
        "verify-dp": {"task": v.task, "model": {"aggregation": "baseline"}, "parallel": ddp, "train": dp_train},
        "verify-fixed-group": {"task": v.task, "model": {"aggregation": "linear", "groups": v.groups}, "parallel": ddp,
                               "train": dp_train},
        "verify-compress": {"task": v.task, "model": {"aggregation": "baseline"},
                            "parallel": {**ddp, "comm_hook": v.comm_hook, "ddp_bucket_mb": v.bucket_mb}, "train": dp_train},
        "verify-dchag-l": {"task": v.task, "model": {"aggregation": "linear"},
                           "parallel": {"tp": nproc, "strategy": "dchag", "dp": "none"}, "train": {**common, "batch_size": batch}},
    }
    if v.repeats == 1:
        return runs
    return {f"{name}-r{i}": copy.deepcopy(run) for i in range(1, v.repeats + 1) for name, run in runs.items()}


def previous_repeat(run: str, runs: dict[str, dict]) -> list[str]:
    """The runs that verification repeat i of a method waits for: repeat i - 1 of every method,
    so the repeats interleave and a slow spell of a shared machine does not fall on one method."""
    m = re.fullmatch(r"(verify-.+)-r(\d+)", run)
    if not m or int(m.group(2)) == 1:
        return []
    prev = f"-r{int(m.group(2)) - 1}"
    return [name for name in runs if name.startswith("verify-") and name.endswith(prev)]


def all_runs(s: Settings) -> dict[str, dict]:
    """Every training run the pipeline knows: the config's train.runs and the verification runs."""
    clash = sorted(set(s.train.runs) & set(verify_runs(s)))
    if clash:
        raise ConfigError(f"config key 'train.runs': {clash} are the verification experiment's names; rename them")
    return {**s.train.runs, **verify_runs(s)}


def runs_of(s: Settings, task: str) -> list[str]:
    """The config's runs of ``task`` (only where the config has that task's dataset)."""
    present = {"forecast": s.era5 is not None, "mae": bool(s.hsi and "mae" in s.hsi),
               "classify": bool(s.hsi and "classification" in s.hsi)}
    return [r for r, spec in s.train.runs.items() if spec["task"] == task] if present[task] else []


def forecast_runs(s: Settings) -> list[str]:
    runs = runs_of(s, "forecast")
    taken = [r for r in runs if r in BASELINE_FORECASTS]
    if taken:
        raise ConfigError(f"config key 'train.runs.{taken[0]}': the name is taken by a reference forecast; rename the run")
    return runs


def comparisons(s: Settings) -> dict[str, str]:
    """Candidate forecast run -> baseline run, for the % change tables: evaluate.compare, or
    every forecast run against the one run whose parallel.strategy is baseline."""
    runs = forecast_runs(s)
    if s.evaluate.compare:
        unknown = sorted({r for pair in s.evaluate.compare.items() for r in pair} - set(runs))
        if unknown:
            raise ConfigError(f"config key 'evaluate.compare': {unknown} are not forecast runs ({', '.join(runs) or 'none'})")
        return dict(s.evaluate.compare)
    baselines = [r for r in runs if run_settings(s.raw, r).parallel.strategy == "baseline"]
    if len(baselines) != 1:
        return {}
    return {r: baselines[0] for r in runs if r != baselines[0]}


def paper_accuracy(s: Settings) -> dict[str, dict[str, str]]:
    """config paper.accuracy, checked: task -> {variant: run}, every run a training run of
    that task, and each forecast candidate compared against the accuracy baseline (its % change
    table is the figure's)."""
    acc = {task: dict(runs) for task, runs in ((s.paper or {}).get("accuracy") or {}).items() if runs}
    runs = s.train.runs
    for task, by_variant in acc.items():
        for variant, run in by_variant.items():
            if run not in runs:
                raise ConfigError(f"config key 'paper.accuracy.{task}.{variant}': {run!r} is not a run of train.runs "
                                  f"({', '.join(runs) or 'none'})")
            if runs[run]["task"] != task:  # the keys are task names (forecast, mae)
                raise ConfigError(f"config key 'paper.accuracy.{task}.{variant}': run {run!r} trains task "
                                  f"{runs[run]['task']!r}, expected {task!r}")
        if "baseline" not in by_variant:
            raise ConfigError(f"config key 'paper.accuracy.{task}': needs a baseline run to compare with")
    forecast = acc.get("forecast", {})
    if forecast:
        pairs = comparisons(s)
        for variant, run in forecast.items():
            if variant != "baseline" and pairs.get(run) != forecast["baseline"]:
                raise ConfigError(f"config key 'paper.accuracy.forecast.{variant}': run {run!r} is not compared with "
                                  f"{forecast['baseline']!r}; set evaluate.compare: {{{run}: {forecast['baseline']}}}")
    return acc


def run_train_settings(s: Settings, run: str) -> TrainSettings:
    """A run's train settings (top-level with its overrides): processes, nodes, GPUs."""
    raw = s.raw
    return run_settings({**raw, "train": {**raw.get("train", {}), "runs": all_runs(s)}}, run).train


def run_config(s: Settings, run: str) -> dict:
    """The config a training run's jobs get: its dataset section, model, parallel, and train
    with only this run (adding or changing another run does not retrain this one)."""
    raw = s.raw
    task = all_runs(s)[run]["task"]
    sections = ["era5" if task == "forecast" else "hsi", *(k for k in ("model", "parallel") if k in raw)]
    cfg = {"name": raw["name"], **{k: raw[k] for k in sections}}
    cfg["train"] = {**raw.get("train", {}), "runs": {run: all_runs(s)[run]}}
    return cfg


def section_config(s: Settings, *sections: str) -> dict:
    """The named sections of the config (with its name): what a preprocessing rule depends on."""
    return {"name": s.raw["name"], **{k: s.raw[k] for k in sections if k in s.raw}}


def write_config(cfg: dict, label: str, directory: str | Path) -> Path:
    """``cfg`` written once to a content-addressed JSON file under ``directory``: a rule whose
    config part is unchanged sees the same path (and does not rerun), and the printed
    commands stay short."""
    text = json.dumps(cfg, sort_keys=True, indent=1)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(directory) / f"{label}-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
