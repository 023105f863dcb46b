"""Tasks and training runs, torch-free. A ``TaskSpec`` is everything the pipeline knows about
a task before any model exists: the config section of its data, its stores, what its channels
are, and the checks only it has; a ``Run`` is one training run resolved once: its name, its
settings (the config with the run's overrides, validated), its task and its paths. The plan
builds each Run once; the rules, the CLI and the trainer take it from there. The torch half of
each task (``dchag.train.tasks``) is named by the same ``Task``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError, RunSettings, Settings, run_settings
from .vocabulary import Task


@dataclass(frozen=True)
class TaskSpec:
    task: Task
    section: str  # the config section of its data
    sub: str | None  # and its part of it (hsi.mae, hsi.classification)
    family: str  # what its channels are: a model reads channels of one family only
    stores: dict[str, str]  # split -> store under a data root (results/<name>)
    masked: bool = False  # masked autoencoding: a decoder, and a mask ratio to check
    classifies: bool = False  # a classifier head (what train.linear_probe trains)

    @property
    def data_key(self) -> str:
        return f"{self.section}.{self.sub}" if self.sub else self.section

    def data(self, s: Settings) -> dict | None:
        """The task's data section of the config, or None where it has none."""
        section = getattr(s, self.section)
        if section is None or self.sub is None:
            return section
        return section.get(self.sub)

    def default_stores(self, data_root: str | Path) -> dict[str, Path]:
        return {split: Path(data_root) / rel for split, rel in self.stores.items()}

    def check(self, s: Settings, r: RunSettings, spec: dict, groups: int, dp: int) -> None:
        """The run's checks that only this task has (ConfigError naming the key)."""
        raise NotImplementedError


class ForecastSpec(TaskSpec):
    def check(self, s: Settings, r: RunSettings, spec: dict, groups: int, dp: int) -> None:
        from .checks import era5_split_steps
        from .era5.source import channel_names, forecast_outputs
        from .grids import weatherbench_grid

        key, m, t, run = f"train.runs.{r.run}", r.model, r.train, r.run
        era5 = s.era5
        names = channel_names(era5)
        unknown = [c for c in (spec.get("channels") or []) if c not in names]
        if unknown:
            raise ConfigError(f"config key '{key}.channels': {unknown} are not era5 channels ({', '.join(names)})")
        if spec.get("channels"):
            names = [n for n in names if n in spec["channels"]]
        if groups > len(names):
            raise ConfigError(f"config key '{key}': {groups} channel groups for the {len(names)} input channels")
        outputs = forecast_outputs(t.forecast.outputs, names)
        unknown = [o for o in outputs if o not in names]
        if unknown or not outputs:
            raise ConfigError(
                f"config key 'train.forecast.outputs' (run {run}): {unknown or outputs} are not input "
                f"channels; the channels are {', '.join(names)}"
            )
        h, w = weatherbench_grid(era5["grid"]).shape
        if h % m.patch_size or w % m.patch_size:
            raise ConfigError(
                f"config key '{key}': model.patch_size {m.patch_size} does not divide the "
                f"{era5['grid']} deg grid ({h} x {w})"
            )
        step = era5["time_step_hours"]
        lo, hi = t.forecast.lead_hours
        if lo > hi or lo % step or hi % step:
            raise ConfigError(
                f"config key 'train.forecast.lead_hours' (run {run}): [{lo}, {hi}] must be multiples "
                f"of era5.time_step_hours {step}, lowest first"
            )
        samples = era5_split_steps(era5, "train") - hi // step
        if samples < t.batch_size * dp:
            raise ConfigError(
                f"config key '{key}': the training years have {max(samples, 0)} samples at lead up to "
                f"{hi} h, fewer than one batch of {t.batch_size} on each of {dp} data-parallel "
                "rank(s); lower train.batch_size or train.forecast.lead_hours, or add years"
            )


@dataclass(frozen=True)
class HsiSpec(TaskSpec):
    size: str = ""  # the key of its images' side in its section (tile, patch)

    def check(self, s: Settings, r: RunSettings, spec: dict, groups: int, dp: int) -> None:
        key, m, t, run = f"train.runs.{r.run}", r.model, r.train, r.run
        if spec.get("channels"):
            raise ConfigError(f"config key '{key}.channels': a channel subset is for forecast runs (ERA5 channels)")
        data = self.data(s)
        if not data["fractions"][1]:
            raise ConfigError(
                f"config key '{self.data_key}.fractions' (run {run}): {data['fractions']} leaves the validation "
                "split empty: the validation loss would be undefined"
            )
        size = data[self.size]
        if size % m.patch_size:
            what = f"{self.data_key}.{self.size}"
            raise ConfigError(f"config key '{key}': model.patch_size {m.patch_size} does not divide {what} {size}")
        if self.masked:
            patches = (size // m.patch_size) ** 2
            keep = max(1, int(round(patches * (1 - t.mae.mask_ratio))))
            if keep >= patches:
                raise ConfigError(
                    f"config key 'train.mae.mask_ratio' (run {run}): {t.mae.mask_ratio} masks none of "
                    f"the {patches} patches of a tile; at least one must be masked and one kept"
                )


_BANDS = "hyperspectral bands"
TASK_SPECS: dict[Task, TaskSpec] = {
    spec.task: spec
    for spec in (
        ForecastSpec(
            Task.FORECAST, "era5", None, "ERA5 channels", {"train": "era5/train.zarr", "val": "era5/val.zarr"}
        ),
        # a hyperspectral store holds every split (its groups)
        HsiSpec(
            Task.MAE, "hsi", "mae", _BANDS, {"train": "hsi/mae.zarr", "val": "hsi/mae.zarr"}, masked=True, size="tile"
        ),
        HsiSpec(
            Task.CLASSIFICATION,
            "hsi",
            "classification",
            _BANDS,
            {"train": "hsi/classification.zarr", "val": "hsi/classification.zarr"},
            classifies=True,
            size="patch",
        ),
    )
}


def task_spec(task: str) -> TaskSpec:
    try:
        return TASK_SPECS[Task(task)]
    except ValueError:
        raise ConfigError(f"task {task!r}: expected one of {', '.join(TASK_SPECS)}") from None


@dataclass(frozen=True)
class RunPaths:
    """Where a training run's files are: ``<results>/train/<name>/`` (``name`` may be a
    Snakemake wildcard, ``{run}``)."""

    results: str
    name: str

    @property
    def dir(self) -> str:
        return f"{self.results}/train/{self.name}"

    @property
    def final(self) -> str:
        """The final checkpoint: there once training has finished."""
        return f"{self.dir}/final"

    @property
    def log(self) -> str:
        return f"{self.dir}/log.csv"

    @property
    def model(self) -> str:
        """The model folder (model.json + model.safetensors)."""
        return f"{self.dir}/model"

    @property
    def model_json(self) -> str:
        return f"{self.model}/model.json"

    @property
    def model_weights(self) -> str:
        return f"{self.model}/model.safetensors"


@dataclass(frozen=True)
class Run:
    name: str
    settings: RunSettings
    spec: TaskSpec
    paths: RunPaths

    def stores(self, data_root: str | Path | None = None) -> dict[str, Path]:
        """The train/val stores under ``data_root`` (default: the pipeline's, results/<name>)."""
        return self.spec.default_stores(data_root or Path(self.paths.results))


def resolve(config: dict, name: str, runs: dict[str, dict] | None = None) -> Run:
    """Run ``name`` of ``config``, settings validated once; ``runs``: the runs to look it up in
    (the plan's include the verification experiment's), default the config's train.runs."""
    if runs is not None:
        config = {**config, "train": {**config.get("train", {}), "runs": runs}}
    r = run_settings(config, name)
    return Run(name, r, task_spec(r.task), RunPaths(f"results/{r.name}", name))
