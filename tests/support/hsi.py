"""Small hyperspectral inputs made by the real preprocessing, and a model of them."""

from __future__ import annotations

import torch
import xarray as xr

from dchag.config import run_settings, validate
from dchag.hsi.preprocess import preprocess_from_config
from dchag.model import ChannelViT
from dchag.predict import export
from dchag.train.tasks import build_task


def open_split(path, split) -> xr.Dataset:
    """One split's group of a hyperspectral store."""
    return xr.open_zarr(path, group=split, consolidated=False)


def hsi_config(task: str, section: dict, **common) -> dict:
    """A validated config with this ``hsi`` section: the schema fills in every other setting."""
    return validate({"name": "t", "hsi": {**common, task: section}}, "test config")


def classify(image, labels, output, common: dict | None = None, **section):
    """The classification store of ``image`` and its ``labels``."""
    cfg = hsi_config("classification", {"image": str(image), "labels": str(labels), **section}, **(common or {}))
    return preprocess_from_config(cfg, "classification", output)


def make_tiles(images, output, common: dict | None = None, **section):
    """The MAE tile store of ``images``."""
    cfg = hsi_config("mae", {"images": [str(p) for p in images], **section}, **(common or {}))
    return preprocess_from_config(cfg, "mae", output)


def hsi_model(tmp_path, task: str, section: dict, model: dict, **common):
    """An untrained (seeded) model of ``task`` on a store the real preprocessing made, as
    export.describe gives it (what export writes)."""
    key = "classification" if task == "classification" else "mae"
    cfg = hsi_config(key, section, preset="indian_pines", **common)
    cfg = validate(
        {
            **cfg,
            "model": model,
            "parallel": {"tp": 1, "data_parallel": "none"},
            "train": {"runs": {"r": {"task": task}}},
        }
    )
    store = preprocess_from_config(cfg, key, tmp_path / f"{key}.zarr")
    t = build_task(run_settings(cfg, "r"), {"train": store, "val": store})
    torch.manual_seed(0)
    net = ChannelViT(t.model_cfg)
    return export.describe(t, store, net, {"run": "r"}), store
