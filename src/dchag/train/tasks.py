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

from ..config import ConfigError, RunSettings
from ..era5.source import forecast_model_config, forecast_outputs, run_channels
from ..model import ModelConfig, random_masking
from ..model.build import model_config
from ..model.model import channel_groups
from ..parallel.collectives import gather_channels
from .data import ForecastDataset, SampleDataset, held_in_memory, open_array, store_info


def _rounded(values) -> list:
    """float values for a fingerprint: 7 significant digits (float32's), NaN as None."""
    return [float(f"{v:.7g}") if np.isfinite(v) else None for v in np.asarray(values, dtype=np.float64).ravel()]


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


class Task:
    """One training task. Subclasses set ``model_cfg`` and implement :meth:`dataset` and
    :meth:`loss`; ``stores`` maps "train" / "val" to the stores read."""

    name: str = ""
    # what its ranks import beyond the trainer: a launch's fork server imports them once for all
    rank_modules: tuple[str, ...] = ()

    def __init__(self, cfg: RunSettings, stores: dict[str, Path]):
        self.cfg = cfg
        self.stores = {k: Path(v) for k, v in stores.items()}
        self.model_cfg: ModelConfig

    def dataset(self, split: str, rank_channels: list[int], seed: int, cache: bool = True) -> torch.utils.data.Dataset:
        """``split``'s samples of the channels ``rank_channels``, held in memory up to
        train.cache_mb (``cache``; without it read from the store on use, as a check that only
        counts samples wants)."""
        raise NotImplementedError

    def where(self, split: str) -> str:
        """Where ``split``'s samples are read (for messages)."""
        return str(self.stores[split])

    def data_signature(self) -> dict:
        """What the training store holds, as far as a run's result depends on it (its
        channels or bands, sample shape and count, normalisation): a checkpoint is resumed only
        on the same data, however the config that made the store was written."""
        raise NotImplementedError

    @classmethod
    def synthetic(cls, cfg: RunSettings, model_cfg: ModelConfig) -> Task:
        """The task with its loss and no stores, for synthetic inputs of ``model_cfg``'s shape."""
        task = cls.__new__(cls)
        Task.__init__(task, cfg, {})
        task.model_cfg = model_cfg
        return task

    @classmethod
    def shape(cls, cfg: RunSettings, channels: int | None, image: tuple[int, int] | None) -> ModelConfig | None:
        """The model of ``channels`` channels of ``image`` without reading a store (None: the
        task's model shape is read from its store)."""
        if channels is None or image is None:
            return None
        return model_config(cfg.model, cfg.parallel.tp, cls.name, channels, image, num_classes=2)

    def synthetic_batch(self, channels: int, batch: int) -> list[torch.Tensor]:
        """A random batch for a rank that reads ``channels`` of the inputs."""
        return [torch.randn(batch, channels, *self.model_cfg.img_size)]

    def channel_target(self) -> dict:
        """What this run's input channels are, for matching a source model's (fine-tuning)."""
        raise NotImplementedError

    def fits_head_of(self, source) -> bool:
        """Whether the head of ``source`` (a :class:`dchag.model.folder.Model`) predicts what
        this run's does: the same task (and the same outputs or classes)."""
        return source.task == self.name

    def export_meta(self, store: Path) -> dict:
        """What the model folder of a run of this task records about its data (model.json),
        read from its training ``store``."""
        raise NotImplementedError

    def export_constants(self, store: Path, meta: dict) -> dict[str, np.ndarray]:
        """Fields the model folder holds beside the weights (none but a forecast's constants)."""
        return {}

    @property
    def cache_bytes(self) -> int:
        """train.cache_mb in bytes: the datasets' in-memory limit per rank."""
        return int(self.cfg.train.cache_mb * 2**20)

    def loss(
        self,
        model,
        batch: list[torch.Tensor],
        step: int,
        seed: int,
        channel_group,
        active_groups: list[int] | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """The loss of ``batch`` and extra validation metrics (name -> float)."""
        raise NotImplementedError


class ForecastTask(Task):
    """ERA5 forecasting: inputs at t, targets at t + lead (lead drawn from
    train.forecast.lead_hours), latitude-weighted MSE on the normalised output fields."""

    name = "forecast"
    rank_modules = ("tensorstore",)  # its datasets read with it (ChunkReader): 1.5 CPU-s to import

    def __init__(self, cfg: RunSettings, stores: dict[str, Path]):
        super().__init__(cfg, stores)
        self.channels = run_channels(cfg)
        self.outputs = forecast_outputs(cfg.train.forecast.outputs, self.channels)
        missing = [o for o in self.outputs if o not in self.channels]
        if missing:
            raise ConfigError(
                f"config key 'train.forecast.outputs': {missing} are not input channels ({', '.join(self.channels)})"
            )
        self.model_cfg = forecast_model_config(cfg)
        self._weights: torch.Tensor | None = None

    @property
    def weights(self) -> torch.Tensor:
        if self._weights is None:  # read on first use: loading a trained model needs no store
            self._weights = training_lat_weights(np.asarray(open_array(self.stores["train"], "lat")[:]))
        return self._weights

    def data_signature(self) -> dict:
        from ..store import open_zarr

        with open_zarr(self.stores["train"], chunks=None) as ds:
            times = ds.time.values
            return {
                "channels": list(ds.attrs["channel_names"]),
                "shape": list(ds["data"].shape),
                "times": [str(times[0]), str(times[-1])],
                "mean": _rounded(ds["mean"].values),
                "std": _rounded(ds["std"].values),
            }

    @classmethod
    def shape(cls, cfg, channels, image):
        return forecast_model_config(cfg, channels, image)  # the config's ERA5 channels and grid by default

    @classmethod
    def synthetic(cls, cfg, model_cfg):
        task = super().synthetic(cfg, model_cfg)
        task._weights = torch.ones(model_cfg.img_size[0], 1)  # cos(latitude) weights: their values do not matter
        return task

    def synthetic_batch(self, channels, batch):
        h, w = self.model_cfg.img_size
        lead = torch.full((batch,), float(self.cfg.train.forecast.lead_hours[0]))
        return [torch.randn(batch, channels, h, w), lead, torch.randn(batch, len(self.model_cfg.out_channels), h, w)]

    def channel_target(self) -> dict:
        return {"names": self.channels}

    def fits_head_of(self, source) -> bool:
        return super().fits_head_of(source) and source.meta.get("outputs") == list(self.outputs)

    def export_meta(self, store):
        from ..store import open_store

        ds = open_store(store, chunks=None)
        names = [str(c) for c in ds.channel.values]
        long_names = ds.attrs.get("channel_long_names") or names
        unit = ds.attrs.get("channel_units") or [None] * len(names)
        levels = ds["level"].values
        idx = [names.index(c) for c in self.channels]
        channels = [
            {
                "name": names[i],
                "long_name": long_names[i],
                "units": unit[i],
                "level": None if np.isnan(levels[i]) else int(levels[i]),
            }
            for i in idx
        ]
        era5 = self.cfg.era5
        return {
            "channels": channels,
            "outputs": list(self.outputs),
            "grid": {
                "latitude": ds.lat.values.tolist(),
                "longitude": ds.lon.values.tolist(),
                "resolution": era5["grid"],
            },
            "normalisation": {"mean": ds["mean"].values[idx].tolist(), "std": ds["std"].values[idx].tolist()},
            "lead_hours": {
                "trained": list(self.cfg.train.forecast.lead_hours),
                "time_step_hours": era5["time_step_hours"],
            },
            "data": {"era5": era5},
        }

    def export_constants(self, store, meta):
        """The time-invariant channels' fields (physical units) from the first step of ``store``."""
        from ..era5.source import channels_from_config
        from ..store import open_store

        kinds = {c.name: c.variable.kind for c in channels_from_config(self.cfg.era5)}
        ds = open_store(store, chunks=None)
        out = {}
        for ch in meta["channels"]:
            if kinds.get(ch["name"]) == "constant":
                sel = ds.sel(channel=ch["name"])
                out[ch["name"]] = (sel["data"].isel(time=0) * sel["std"] + sel["mean"]).values.astype(np.float32)
        return out

    def dataset(self, split, rank_channels, seed, cache=True):
        lead = tuple(self.cfg.train.forecast.lead_hours)
        cache_bytes = self.cache_bytes if cache else 0
        return ForecastDataset(
            self.stores[split],
            self.channels,
            rank_channels,
            self.outputs,
            lead,
            seed,
            cache_bytes,
            cache_bytes > 0 and self._workers_read_zarr(rank_channels),
        )

    def _workers_read_zarr(self, rank_channels: list[int]) -> bool:
        """Whether this process's DataLoader workers will read a split from Zarr (with
        tensorstore, which they cannot use if this process used it: its in-memory copies are
        then read with zarr): it has workers, and a split is too large to hold in memory."""
        channels = len(rank_channels) + len(self.outputs)
        return self.cfg.train.num_workers > 0 and not all(
            held_in_memory(open_array(self.stores[s], "data"), channels, self.cache_bytes) for s in ("train", "val")
        )

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
        self.model_cfg = model_config(
            cfg.model, cfg.parallel.tp, self.name, bands, (h, w), num_classes=self._classes(), wavelengths=wavelengths
        )

    def _classes(self) -> int:
        return 0

    def where(self, split: str) -> str:
        return f"group {split!r} of {self.stores[split]}"

    def wavelengths(self) -> list[float | None]:
        """The band centres (nm) of the training store (None where unknown)."""
        values = np.asarray(open_array(self.stores["train"], "train/wavelength")[:], np.float64)
        return [float(v) if np.isfinite(v) else None for v in values]

    def data_signature(self) -> dict:
        store = self.stores["train"]
        out = {
            "shape": list(open_array(store, f"train/{self.var}").shape),
            "val_samples": open_array(store, f"val/{self.var}").shape[0],
        }
        for name in ("mean", "std", "wavelength"):
            out[name] = _rounded(open_array(store, f"train/{name}")[:])
        out.update(
            {k: self.info.get(k) for k in ("kept_bands_1based", "split_method", "split_seed", "split_fractions")}
        )
        return out

    def channel_target(self) -> dict:
        return {"wavelengths": self.wavelengths()}

    def export_meta(self, store):
        info = store_info(store, "train")

        def arr(name):
            return np.asarray(open_array(store, f"train/{name}")[:], np.float64)

        wavelength, fwhm = arr("wavelength"), arr("fwhm")
        normalisation = {"mean": arr("mean").tolist(), "std": arr("std").tolist()}
        if (Path(store) / "train" / "clip_low").exists():  # hsi.clip_percentiles: the training bounds
            normalisation["clip"] = [arr("clip_low").tolist(), arr("clip_high").tolist()]
        return {
            "bands": {
                "wavelength": [None if not np.isfinite(v) else float(v) for v in wavelength],
                "fwhm": [None if not np.isfinite(v) else float(v) for v in fwhm],
                "band": arr("band").astype(int).tolist(),
                "sensor_band": arr("sensor_band").astype(int).tolist(),
                "num_input_bands": info.get("num_input_bands"),
            },
            "normalisation": normalisation,
            "class_names": list(self.class_names),
            "label_values": info.get("label_values"),
            "sample_size": int(self.model_cfg.img_size[0]),
            "mask_ratio": self.cfg.train.mae.mask_ratio,
            "seed": self.cfg.train.seed,
            "data": {"hsi": self.cfg.hsi},
        }

    def dataset(self, split, rank_channels, seed, cache=True):
        return SampleDataset(
            self.stores[split],
            split,
            self.var,
            rank_channels,
            self.model_cfg.in_channels,
            self.cache_bytes if cache else 0,
        )


class MaeTask(_HsiTask):
    """Masked autoencoding of image tiles: the same mask on every TP rank (seeded by step),
    MSE per patch on the masked patches (train.mae.loss: masked) or all of them (full)."""

    name, var = "mae", "tiles"

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        (x,) = batch
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)  # same mask on every TP rank
        ids_keep, mask = random_masking(x.shape[0], self.model_cfg.num_patches, self.cfg.train.mae.mask_ratio, g)
        pred = model(x, ids_keep=ids_keep.to(x.device), active_groups=active_groups)
        cfg = self.model_cfg
        counts = [hi - lo for lo, hi in channel_groups(cfg.in_channels, cfg.groups)]  # a group per TP rank
        per_patch = patchwise_mse(pred, gather_channels(x, channel_group, counts), cfg.patch_size)
        if self.cfg.train.mae.loss == "masked":
            m = mask.to(per_patch.device)
            return (per_patch * m).sum() / m.sum(), {}
        return per_patch.mean(), {}


class ClassificationTask(_HsiTask):
    """Patch classification: cross-entropy; validation accuracy."""

    name, var = "classification", "patches"

    def _classes(self) -> int:
        return len(self.class_names)

    @classmethod
    def shape(cls, cfg, channels, image):
        if channels is None or image is None:
            return None
        classes = len((cfg.hsi or {}).get("classification", {}).get("class_names") or [])
        return model_config(cfg.model, cfg.parallel.tp, cls.name, channels, image, num_classes=max(classes, 2))

    def synthetic_batch(self, channels, batch):
        return [*super().synthetic_batch(channels, batch), torch.zeros(batch, dtype=torch.long)]

    def fits_head_of(self, source) -> bool:
        return super().fits_head_of(source) and source.meta.get("class_names") == list(self.class_names)

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        x, label = batch
        logits = model(x, active_groups=active_groups)
        return torch.nn.functional.cross_entropy(logits, label), {
            "accuracy": (logits.argmax(-1) == label).float().mean().item()
        }


TASKS: dict[str, type[Task]] = {t.name: t for t in (ForecastTask, MaeTask, ClassificationTask)}


def build_task(cfg: RunSettings, stores: dict[str, Path]) -> Task:
    return TASKS[cfg.task](cfg, stores)
