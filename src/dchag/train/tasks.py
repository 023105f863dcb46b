"""The training tasks behind one interface: what differs between forecasting, masked
autoencoding and classification — the stores they read, the model they need, their loss
and their validation metric. The trainer, the evaluation and the benchmarks pick a task by
name from :data:`TASKS` and never branch on it.

A task is built from a run's settings and its stores: ``{"train": path, "val": path}``
(ERA5: two split stores; hyperspectral: one store holding both groups).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..config import ConfigError, RunSettings, Settings
from ..era5.source import channel_names, forecast_outputs
from ..grids import weatherbench_grid
from ..model import ModelConfig, random_masking
from ..model.build import model_config
from .data import ForecastDataset, SampleDataset, open_array, store_info

def era5_model_config(cfg: Settings, in_channels: int | None = None, img_size: tuple[int, int] | None = None) -> ModelConfig:
    """The forecasting model of a config with an ``era5`` section: its channels and grid unless
    given (the cost model and describe-model count other channel numbers and image sizes)."""
    if cfg.era5 is None and (in_channels is None or img_size is None):
        raise ConfigError("cannot tell the model's channels and image size: the config has no era5 section "
                          "(give the channel count and image size)")
    names = channel_names(cfg.era5) if cfg.era5 is not None else []
    shape = weatherbench_grid(cfg.era5["grid"]).shape if cfg.era5 is not None else None
    outputs = [names.index(n) for n in forecast_outputs(cfg.train.forecast.outputs, names) if n in names]
    channels = in_channels or len(names)
    return model_config(cfg, "forecast", channels, img_size or shape, out_channels=[o for o in outputs if o < channels])


def training_lat_weights(lat: np.ndarray) -> torch.Tensor:
    """cos(lat) / mean(cos(lat)), shape (lat, 1): ClimaX's latitude weighting of the training
    loss (the scores use WeatherBench 2's cell areas, equal on the pole-free grids)."""
    w = np.cos(np.deg2rad(np.asarray(lat, dtype=np.float64)))
    return torch.tensor(w / w.mean(), dtype=torch.float32)[:, None]


def patchwise_mse(pred: torch.Tensor, target: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) x2 -> (B, L) mean squared error per patch."""
    d = (pred - target) ** 2
    b, c, h, w = d.shape
    return d.reshape(b, c, h // p, p, w // p, p).mean(dim=(1, 3, 5)).reshape(b, -1)


def gather_channels(x: torch.Tensor, group) -> torch.Tensor:
    """All channels from every TP rank's block (uneven blocks padded for the collective): the
    masked autoencoder reconstructs every channel, while each rank reads only its own. Every
    tensor of the collective lies on ``x``'s device."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    world = dist.get_world_size(group)
    sizes = [torch.zeros((), dtype=torch.long, device=x.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor(x.shape[1], device=x.device), group=group)
    counts = [int(n) for n in sizes]
    padded = x.new_zeros(x.shape[0], max(counts), *x.shape[2:])
    padded[:, : x.shape[1]] = x
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[:, :n] for part, n in zip(parts, counts)], dim=1)


class Task:
    """One training task. Subclasses set ``model_cfg`` and implement :meth:`dataset` and
    :meth:`loss`; ``stores`` maps "train" / "val" to the stores read."""

    name: str = ""

    def __init__(self, cfg: RunSettings, stores: dict[str, Path]):
        self.cfg = cfg
        self.stores = {k: Path(v) for k, v in stores.items()}
        self.model_cfg: ModelConfig

    def dataset(self, split: str, rank_channels: list[int], seed: int) -> torch.utils.data.Dataset:
        raise NotImplementedError

    @property
    def cache_bytes(self) -> int:
        """train.cache_mb in bytes: the datasets' in-memory limit per rank."""
        return int(self.cfg.train.cache_mb * 2**20)

    def loss(self, model, batch: list[torch.Tensor], step: int, seed: int, channel_group,
             active_groups: list[int] | None = None) -> tuple[torch.Tensor, dict]:
        """The loss of ``batch`` and extra validation metrics (name -> float)."""
        raise NotImplementedError


class ForecastTask(Task):
    """ERA5 forecasting: inputs at t, targets at t + lead (lead drawn from
    train.forecast.lead_hours), latitude-weighted MSE on the normalised output fields."""

    name = "forecast"

    def __init__(self, cfg: RunSettings, stores: dict[str, Path]):
        super().__init__(cfg, stores)
        self.channels = channel_names(cfg.era5)
        self.outputs = forecast_outputs(cfg.train.forecast.outputs, self.channels)
        missing = [o for o in self.outputs if o not in self.channels]
        if missing:
            raise ConfigError(f"config key 'train.forecast.outputs': {missing} are not input channels ({', '.join(self.channels)})")
        self.model_cfg = era5_model_config(cfg)
        self._weights: torch.Tensor | None = None

    @property
    def weights(self) -> torch.Tensor:
        if self._weights is None:  # read on first use: loading a trained model needs no store
            self._weights = training_lat_weights(np.asarray(open_array(self.stores["train"], "lat")[:]))
        return self._weights

    def dataset(self, split, rank_channels, seed):
        lead = tuple(self.cfg.train.forecast.lead_hours)
        return ForecastDataset(self.stores[split], self.channels, rank_channels, self.outputs, lead, seed,
                               cache_bytes=self.cache_bytes)

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        x, lead, y = batch
        pred = model(x, lead, active_groups=active_groups)
        return (((pred - y) ** 2) * self.weights.to(pred.device)).mean(), {}


class _HsiTask(Task):
    """Hyperspectral tasks: one store with train/val/test groups of ``var`` (sample, band, y, x)."""

    var = ""

    def __init__(self, cfg: RunSettings, stores: dict[str, Path]):
        super().__init__(cfg, stores)
        store = self.stores["train"]
        self.info = store_info(store, "train")
        _, bands, h, w = open_array(store, f"train/{self.var}").shape
        wavelengths = None
        if cfg.model.channel_embedding == "wavelength":
            meta = np.asarray(open_array(store, "train/wavelength")[:])
            wavelengths = meta.tolist() if np.all(np.isfinite(meta)) else None
        self.class_names = self.info.get("class_names", [])
        self.model_cfg = model_config(cfg, self.name, bands, (h, w), num_classes=self._classes(), wavelengths=wavelengths)

    def _classes(self) -> int:
        return 0

    def dataset(self, split, rank_channels, seed):
        return SampleDataset(self.stores[split], split, self.var, rank_channels, self.model_cfg.in_channels,
                             cache_bytes=self.cache_bytes)


class MaeTask(_HsiTask):
    """Masked autoencoding of image tiles: the same mask on every TP rank (seeded by step),
    MSE per patch on the masked patches (train.mae.loss: masked) or all of them (full)."""

    name, var = "mae", "tiles"

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        (x,) = batch
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)  # same mask on every TP rank
        ids_keep, mask = random_masking(x.shape[0], self.model_cfg.num_patches, self.cfg.train.mae.mask_ratio, g)
        pred = model(x, ids_keep=ids_keep.to(x.device), active_groups=active_groups)
        per_patch = patchwise_mse(pred, gather_channels(x, channel_group), self.model_cfg.patch_size)
        if self.cfg.train.mae.loss == "masked":
            m = mask.to(per_patch.device)
            return (per_patch * m).sum() / m.sum(), {}
        return per_patch.mean(), {}


class ClassifyTask(_HsiTask):
    """Patch classification: cross-entropy; validation accuracy."""

    name, var = "classify", "patches"

    def _classes(self) -> int:
        return len(self.class_names)

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        x, label = batch
        logits = model(x, active_groups=active_groups)
        return torch.nn.functional.cross_entropy(logits, label), {"accuracy": (logits.argmax(-1) == label).float().mean().item()}


TASKS: dict[str, type[Task]] = {t.name: t for t in (ForecastTask, MaeTask, ClassifyTask)}


def build_task(cfg: RunSettings, stores: dict[str, Path]) -> Task:
    return TASKS[cfg.task](cfg, stores)
