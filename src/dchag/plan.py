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

from .checks import check_run, era5_split_steps, init_source, model_mb
from .config import ConfigError, Settings, TrainSettings, run_settings, settings
from .jobs import JobShape, era5_mem_mb, train_mem_mb
from .runs import TASK_SPECS, Run, RunPaths, task_spec
from .vocabulary import Strategy

BASELINE_FORECASTS = ("persistence", "climatology")


def verify_runs(s: Settings) -> dict[str, dict]:
    """The verification experiment (config ``verify``): data parallelism, fixed channel groups,
    compression with bucketing, D-CHAG-L, and D-CHAG-L forming the channel tokens
    (``model.fused_front_end: false``; the others take the model's default, the fused front end,
    so D-CHAG alone, the fused front end alone and both are side by side) — the same task, steps
    and global batch — with
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
    ddp = {"tp": 1, "strategy": "baseline", "data_parallel": "ddp"}
    runs = {
        "verify-dp": {"task": v.task, "model": {"aggregation": "baseline"}, "parallel": ddp, "train": dp_train},
        "verify-fixed-group": {
            "task": v.task,
            "model": {"aggregation": "linear", "groups": v.groups},
            "parallel": ddp,
            "train": dp_train,
        },
        "verify-compress": {
            "task": v.task,
            "model": {"aggregation": "baseline"},
            "parallel": {**ddp, "comm_hook": v.comm_hook, "ddp_bucket_mb": v.bucket_mb},
            "train": dp_train,
        },
        "verify-dchag-l": {
            "task": v.task,
            "model": {"aggregation": "linear"},
            "parallel": {"tp": nproc, "strategy": "dchag", "data_parallel": "none"},
            "train": {**common, "batch_size": batch},
        },
    }
    runs["verify-dchag-l-tokens"] = copy.deepcopy(runs["verify-dchag-l"])
    runs["verify-dchag-l-tokens"]["model"]["fused_front_end"] = False
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
    if task_spec(task).data(s) is None:
        return []
    return [r for r, spec in s.train.runs.items() if spec["task"] == task]


def forecast_runs(s: Settings) -> list[str]:
    runs = runs_of(s, "forecast")
    taken = [r for r in runs if r in BASELINE_FORECASTS]
    if taken:
        raise ConfigError(
            f"config key 'train.runs.{taken[0]}': the name is taken by a reference forecast; rename the run"
        )
    return runs


def comparisons(s: Settings) -> list[tuple[str, str]]:
    """(candidate, baseline) pairs of runs for the comparison tables and the scorecard: every run
    of a task against the task's one run whose parallel.strategy is baseline, unless
    evaluate.compare names the candidate's baselines: runs of its task or, for a forecast run,
    a reference forecast (persistence, climatology)."""
    tasks = {run: spec["task"] for run, spec in s.train.runs.items()}
    by_task = {
        task: forecast_runs(s) if task == "forecast" else runs_of(s, task) for task in dict.fromkeys(tasks.values())
    }
    pairs = []
    for runs in by_task.values():
        baselines = [r for r in runs if run_settings(s.raw, r).parallel.strategy == Strategy.BASELINE]
        if len(baselines) == 1:
            pairs += [(r, baselines[0]) for r in runs if r != baselines[0] and r not in s.evaluate.compare]
    for cand, bases in s.evaluate.compare.items():
        for base in [bases] if isinstance(bases, str) else bases:
            task = tasks.get(cand)
            allowed = [*by_task.get(task, [])] + [*BASELINE_FORECASTS] * (task == "forecast")
            if cand not in by_task.get(task, []) or base not in allowed or cand == base:
                raise ConfigError(
                    f"config key 'evaluate.compare.{cand}': {cand!r} against {base!r}: the candidate must be a "
                    f"run of train.runs whose task has data and the baseline another run of its task "
                    f"({', '.join(r for r in allowed if r != cand) or 'none'})"
                )
            pairs.append((cand, base))
    return list(dict.fromkeys(pairs))


def paper_accuracy(s: Settings) -> dict[str, dict[str, str]]:
    """config paper.accuracy, checked: task -> {variant: run}, every run a training run of
    that task, and each forecast candidate compared against the accuracy baseline (its % change
    table is the figure's)."""
    acc = {task: dict(runs) for task, runs in ((s.paper or {}).get("accuracy") or {}).items() if runs}
    runs = s.train.runs
    for task, by_variant in acc.items():
        for variant, run in by_variant.items():
            if run not in runs:
                raise ConfigError(
                    f"config key 'paper.accuracy.{task}.{variant}': {run!r} is not a run of train.runs "
                    f"({', '.join(runs) or 'none'})"
                )
            if runs[run]["task"] != task:  # the keys are task names (forecast, mae)
                raise ConfigError(
                    f"config key 'paper.accuracy.{task}.{variant}': run {run!r} trains task "
                    f"{runs[run]['task']!r}, expected {task!r}"
                )
        if "baseline" not in by_variant:
            raise ConfigError(f"config key 'paper.accuracy.{task}': needs a baseline run to compare with")
    forecast = acc.get("forecast", {})
    if forecast:
        pairs = comparisons(s)
        for variant, run in forecast.items():
            if variant != "baseline" and (run, forecast["baseline"]) not in pairs:
                raise ConfigError(
                    f"config key 'paper.accuracy.forecast.{variant}': run {run!r} is not compared with "
                    f"{forecast['baseline']!r}; set evaluate.compare: {{{run}: {forecast['baseline']}}}"
                )
    return acc


FOUNDATION_STARTS = {"scratch": "from scratch", "fine_tuned": "fine-tuned from MAE", "linear_probe": "linear probe"}


def foundation(s: Settings) -> dict[str, dict[str, str]]:
    """evaluate.foundation, checked: every run a classification run of train.runs; the fine-tuned
    and linear-probe runs start from an MAE run (init_from), the probe with
    train.linear_probe and the others without; all three at equal steps."""
    out = {}
    runs = s.train.runs
    for variant, by_start in s.evaluate.foundation.items():
        key = f"evaluate.foundation.{variant}"
        for start, run in by_start.items():
            if run not in runs or not task_spec(runs[run]["task"]).classifies:
                raise ConfigError(f"config key '{key}.{start}': {run!r} is not a classification run of train.runs")
        r = {start: run_settings(s.raw, run) for start, run in by_start.items()}
        for start in ("fine_tuned", "linear_probe"):
            src = runs[by_start[start]].get("init_from")
            if src not in runs or not task_spec(runs[src]["task"]).masked:
                raise ConfigError(
                    f"config key '{key}.{start}': run {by_start[start]!r} must start from an mae run (init_from)"
                )
        if r["scratch"].init_from or not r["linear_probe"].train.linear_probe or r["fine_tuned"].train.linear_probe:
            raise ConfigError(
                f"config key '{key}': scratch has no init_from, linear_probe sets train.linear_probe, "
                "fine_tuned does not"
            )
        steps = {start: x.train.steps for start, x in r.items()}
        if len(set(steps.values())) > 1:
            raise ConfigError(f"config key '{key}': the runs train for different steps {steps}; compare at equal steps")
        out[variant] = dict(by_start)
    return out


def run_config(s: Settings, run: str) -> dict:
    """The config a training run's jobs get: its dataset section, model, parallel, and train
    with only this run (adding or changing another run does not retrain this one)."""
    raw = s.raw
    task = task_spec(all_runs(s)[run]["task"])
    sections = [task.section, *(k for k in ("model", "parallel") if k in raw)]
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


# -- the whole plan, as the rules wire it ------------------------------------------------------
ERA5_SPLITS = ("train", "val", "test")


class Plan:
    """Everything the rules wire, from a validated config: built once when the Snakefile is
    read, so a config mistake stops the run there with one message, before any job runs."""

    def __init__(self, config: dict, config_dir: str | Path = ".snakemake/dchag-config"):
        self.settings = s = settings(config)
        self.config_dir = Path(config_dir)
        self.results = f"results/{s.name}"
        self.logs = f"logs/{s.name}"
        self.eval_dir = f"{self.results}/eval"
        self.figures = f"{self.results}/figures"
        self.era5 = s.era5 or {}
        self.hsi = s.hsi or {}
        self.evaluate = s.evaluate
        self.train_runs = s.train.runs
        self.verify_runs = verify_runs(s)
        self.all_runs = all_runs(s)
        self.forecast_runs = forecast_runs(s)
        self.mae_runs = runs_of(s, "mae")
        self.classification_runs = runs_of(s, "classification")
        self.comparisons = comparisons(s)
        self.forecast_comparisons = [pair for pair in self.comparisons if pair[0] in self.forecast_runs]
        self.foundation = foundation(s)
        self.paper = s.paper or {}
        self.paper_accuracy = paper_accuracy(s) if self.paper else {}
        from .paper import sweep

        self.paper_sweeps = sweep.sweeps(self.paper) if self.paper else {}
        self.paper_points = sweep.all_points(self.paper) if self.paper else {}
        self._era5_on_grid: bool | None = None
        # every run resolved and checked once: the rules take its settings and paths from here
        self.runs: dict[str, Run] = {run: check_run(s, run, self.all_runs) for run in self.all_runs}
        if self.forecast_runs:
            self._check_evaluation()

    def _check_evaluation(self) -> None:
        step = self.era5["time_step_hours"]
        bad = [h for h in self.evaluate.lead_hours if h % step]
        if bad:
            raise ConfigError(
                f"config key 'evaluate.lead_hours': {bad} are not multiples of era5.time_step_hours {step}"
            )
        span = era5_split_steps(self.era5, "test") * step
        if max(self.evaluate.lead_hours) >= span:
            raise ConfigError(
                f"config key 'evaluate.lead_hours': {max(self.evaluate.lead_hours)} h is beyond the test "
                f"years' {span} h"
            )
        variable = self.evaluate.map_variable
        if variable is not None and variable not in self.forecast_variables():
            raise ConfigError(
                f"config key 'evaluate.map_variable': {variable!r} is not a forecast output "
                f"({', '.join(self.forecast_variables())})"
            )

    # -- ERA5 -------------------------------------------------------------------------------
    def era5_years(self, split: str | None = None) -> list[int]:
        splits = [split] if split else ERA5_SPLITS
        return sorted(y for sp in splits for y in self.era5["years"][sp])

    def era5_year_store(self, year) -> str:
        return f"{self.results}/era5/years/{year}.zarr"

    def era5_year_stats(self, year) -> str:
        """A training year's partial statistics (count, mean, M2 per channel)."""
        return f"{self.results}/era5/statistics/{year}.json"

    def era5_split_part(self, split: str, year) -> str:
        """Year ``year``'s shards of split ``split`` (temporary: linked into the split store)."""
        return f"{self.results}/era5/split_parts/{split}/{year}.zarr"

    def era5_climatology_parts(self) -> int:
        """Climatology parts: one per climatology year, each a block of days of every year, so
        each reads one year's worth of data."""
        return min(len(self.era5_years(self.era5["climatology_split"])), 366) if self.era5 else 0

    def era5_climatology_part(self, part) -> str:
        return f"{self.results}/era5/climatology_parts/{part}.zarr"

    def era5_mem_mb(self, job: str, floor: int) -> int:
        """Memory (MB) to ask the scheduler for one ERA5 ``job`` (dchag.jobs.era5_mem_mb)."""
        return era5_mem_mb(job, self.era5, floor)

    def era5_inputs(self, year) -> list[str]:
        from .config import era5_input_paths

        paths = era5_input_paths(self.era5, int(year))
        return paths + ([self.era5["constants"]] if self.era5["constants"] else [])

    @property
    def era5_weights(self) -> str | None:
        """The regridding weights file, or None: no ERA5 section, or inputs already on the
        target grid (era5.regrid.inputs_on_grid; auto looks at the first input once, here)."""
        if not self.era5:
            return None
        if self._era5_on_grid is None:
            from .era5.source import inputs_on_target_grid

            self._era5_on_grid = inputs_on_target_grid(self.era5)
        if self._era5_on_grid:
            return None
        return f"{self.results}/era5/weights/{self.era5['regrid']['method']}_{self.era5['grid']}deg.nc"

    def era5_year_inputs(self, year) -> dict[str, list[str] | str]:
        """A year job's inputs: its files and, where the inputs need regridding, the weights."""
        weights = self.era5_weights
        return {"files": self.era5_inputs(year), **({"weights": weights} if weights else {})}

    def forecast_variables(self) -> list[str]:
        """The forecast variables (train.forecast.outputs, or the default five present)."""
        from .era5.source import channel_names, forecast_outputs

        return forecast_outputs(self.settings.train.forecast.outputs, channel_names(self.era5)) if self.era5 else []

    # -- training ---------------------------------------------------------------------------
    def run_train(self, run: str) -> TrainSettings:
        """A run's train settings (top-level with its overrides): processes, nodes, GPUs."""
        return self.runs[run].settings.train

    def run_paths(self, run: str) -> RunPaths:
        """A run's paths; ``run`` may be a wildcard (``{run}``)."""
        return RunPaths(self.results, run)

    def train_shape(self, run: str) -> JobShape:
        r = self.runs[run].settings
        t = r.train
        mem = train_mem_mb(t.nproc, t.num_workers, t.cache_mb, model_mb(r))
        return JobShape(t.nodes, t.nproc, t.gpus_per_node, t.num_workers, mem)

    def run_stores(self, run: str) -> dict[str, str]:
        """The stores a run trains on: train and val."""
        return {split: str(path) for split, path in self.runs[run].stores().items()}

    def init_model(self, run: str) -> str | None:
        """The model folder a run starts from: a source run's ``<run>/model`` (exported
        from its final checkpoint by the export rule), or the config's path."""
        source = init_source(run, self.all_runs)
        if source is None:
            return None
        kind, name = source
        return self.run_paths(name).model if kind == "run" else name

    def run_config_file(self, run: str) -> str:
        """The run's config file: its dataset section, model, parallel and train with only this run."""
        return str(write_config(run_config(self.settings, run), f"run-{run}", self.config_dir))

    def section_config_file(self, *sections: str) -> str:
        """The config sections a rule uses, as a content-addressed JSON file (a rule reruns when
        its own sections change and not when another's do)."""
        return str(write_config(section_config(self.settings, *sections), "+".join(sections), self.config_dir))

    # -- the paper's experiments --------------------------------------------------------------
    def paper_shape(self, point: str) -> JobShape:
        from .paper import sweep

        res = sweep.resources(self.paper_points[point], self.paper["gpus_per_node"])
        return JobShape(res.nodes, res.per_node, res.per_node)

    def paper_point_config_file(self, point: str) -> str:
        from .paper import sweep

        cfg = sweep.point_config(self.settings.name, self.paper, self.paper_points[point])
        return str(write_config(cfg, f"paper-{point}", self.config_dir))

    # -- what `snakemake` builds --------------------------------------------------------------
    def era5_outputs(self) -> list[str]:
        if not self.era5:
            return []
        return [
            *(f"{self.results}/era5/{split}.zarr" for split in ERA5_SPLITS),
            f"{self.results}/era5/climatology.zarr",
        ]

    def hsi_outputs(self) -> list[str]:
        hsi = [t for t in TASK_SPECS.values() if t.section == "hsi" and t.data(self.settings) is not None]
        return sorted({str(store) for t in hsi for store in t.default_stores(self.results).values()})

    def train_outputs(self) -> list[str]:
        if not self.train_runs:
            return []
        return [self.run_paths(run).final for run in self.train_runs] + [f"{self.results}/train/summary.csv"]

    def eval_outputs(self) -> list[str]:
        out = []
        conventions = self.evaluate.conventions
        if self.forecast_runs:
            out += [
                f"{self.eval_dir}/era5/scores_{source}_{conv}.csv"
                for source in [*self.forecast_runs, *BASELINE_FORECASTS]
                for conv in conventions
            ]
            out += [
                f"{self.eval_dir}/era5/comparison_{cand}_vs_{base}_{conv}.csv"
                for cand, base in self.forecast_comparisons
                for conv in conventions
            ]
        if self.mae_runs or self.classification_runs:
            out.append(f"{self.eval_dir}/hsi/scores.csv")
            out += [
                f"{self.eval_dir}/hsi/comparison_{cand}_vs_{base}.csv"
                for cand, base in self.comparisons
                if cand in [*self.mae_runs, *self.classification_runs]
            ]
        return out

    def figure_names(self) -> list[str]:
        figs = []
        if self.train_runs:
            figs.append("loss_curves")
        if self.forecast_runs:
            figs += [f"lead_time_{conv}" for conv in self.evaluate.conventions] + ["forecast_maps"]
        if self.forecast_comparisons:
            figs += [f"scorecard_{conv}" for conv in self.evaluate.conventions]
        if self.mae_runs:
            figs.append("hsi_reconstruction")
        if self.classification_runs:
            figs.append("classification")
        if self.foundation:
            figs.append("foundation")
        return figs

    def figure_outputs(self) -> list[str]:
        return [f"{self.figures}/{name}.png" for name in self.figure_names()]

    def all_outputs(self) -> list[str]:
        return [
            *self.era5_outputs(),
            *self.hsi_outputs(),
            *self.train_outputs(),
            *self.eval_outputs(),
            *self.figure_outputs(),
        ]
