"""Scoring trained hyperspectral models on their held-out (test) samples.

Masked autoencoding: every test tile is reconstructed from a fixed random 25 % (1 - mask
ratio) of its patches; the scores are computed in the data's units (the preprocessing's
normalisation undone) on the masked patches and on the full tile separately. A few tiles
are kept for the figures.

Classification: scores on the test patches, and a map of the predicted class of every
labelled pixel (all splits) beside the ground truth, for the figure.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
import zarr
from tqdm.auto import tqdm

from .. import provenance
from ..model import ChannelViT, random_masking
from ..store import atomic_path
from ..train.data import open_array, store_info
from ..train.loading import load_trained
from . import classification, recon


def _band_stats(store: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    mean = np.asarray(open_array(store, f"{split}/mean")[:], np.float64)
    std = np.asarray(open_array(store, f"{split}/std")[:], np.float64)
    return mean[:, None, None], std[:, None, None]


def evaluate_mae(
    config: dict,
    run: str,
    checkpoint: str,
    output: str,
    samples: str,
    store: str | None = None,
    batch_size: int = 16,
    keep: int = 4,
) -> dict:
    cfg, task, model = load_trained(config, run, checkpoint, "mae", store)
    store = task.stores["train"]
    tiles = open_array(store, "test/tiles")
    if tiles.shape[0] == 0:
        raise recon.ReconError(f"{store} has no test tiles to score")
    mean, std = _band_stats(store, "test")
    ratio = cfg.train.mae.mask_ratio
    p = task.model_cfg.patch_size
    gh, gw = task.model_cfg.grid
    g = torch.Generator().manual_seed(cfg.train.seed + 2024)  # the same masks for every run
    truth, pred, masks = [], [], []
    with torch.no_grad():
        for start in tqdm(range(0, tiles.shape[0], batch_size), desc=f"reconstruct {run}", unit="batch", mininterval=2):
            x = torch.from_numpy(np.asarray(tiles[start : start + batch_size], np.float32))
            ids_keep, mask = random_masking(x.shape[0], task.model_cfg.num_patches, ratio, g)
            y = model(x, ids_keep=ids_keep).numpy()
            if not np.isfinite(y).all():
                raise recon.ReconError(
                    f"run {run}: the reconstruction of test tiles {start}.. has non-finite values "
                    f"(checkpoint {checkpoint})"
                )
            truth.append(x.numpy() * std + mean)
            pred.append(y * std + mean)
            masks.append(
                mask.numpy().reshape(-1, gh, 1, gw, 1).repeat(p, 2).repeat(p, 4).reshape(-1, gh * p, gw * p) > 0
            )
    truth, pred, masks = np.concatenate(truth), np.concatenate(pred), np.concatenate(masks)
    rng = float(truth.max() - truth.min())
    result = {
        "run": run,
        "checkpoint": str(checkpoint),
        "tiles": int(truth.shape[0]),
        "mask_ratio": ratio,
        "units": "the input data's (normalisation undone)",
        "masked": recon.scores(truth, pred, band_axis=1, data_range=rng, mask=masks),
        "full": recon.scores(truth, pred, band_axis=1, data_range=rng),
        "provenance": provenance.record(cfg.raw, checkpoint=str(checkpoint)),
    }
    recon.write_json(result, output)
    wavelength = np.asarray(open_array(store, "test/wavelength")[:], np.float64)
    with atomic_path(samples) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(
                f,
                truth=truth[:keep].astype(np.float32),
                pred=pred[:keep].astype(np.float32),
                mask=masks[:keep],
                wavelength=wavelength,
            )
    return result


def _predict(model: ChannelViT, array: zarr.Array, batch_size: int, desc: str) -> np.ndarray:
    out = []
    with torch.no_grad():
        for start in tqdm(range(0, array.shape[0], batch_size), desc=desc, unit="batch", mininterval=2):
            x = torch.from_numpy(np.asarray(array[start : start + batch_size], np.float32))
            logits = model(x)
            if not torch.isfinite(logits).all():
                raise recon.ReconError(f"{desc}: the class scores of patches {start}.. are not finite")
            out.append(logits.argmax(-1).numpy())
    return np.concatenate(out) if out else np.empty(0, np.int64)


def evaluate_classification(
    config: dict,
    run: str,
    checkpoint: str,
    output: str,
    per_class: str,
    class_map: str,
    store: str | None = None,
    batch_size: int = 256,
) -> dict:
    cfg, task, model = load_trained(config, run, checkpoint, "classification", store)
    store = task.stores["train"]
    names = store_info(store, "train").get("class_names") or task.class_names
    preds, labels, rows, cols, splits = {}, {}, {}, {}, {}
    for i, split in enumerate(("train", "val", "test")):
        preds[split] = _predict(
            model, open_array(store, f"{split}/patches"), batch_size, f"classification {run} ({split})"
        )
        labels[split] = np.asarray(open_array(store, f"{split}/label")[:], np.int64) - 1
        rows[split] = np.asarray(open_array(store, f"{split}/row")[:])
        cols[split] = np.asarray(open_array(store, f"{split}/col")[:])
        splits[split] = np.full(labels[split].shape, i, np.int8)
    if labels["test"].size == 0:
        raise recon.ReconError(f"{store} has no test patches to score")
    result = {
        "run": run,
        "checkpoint": str(checkpoint),
        "split": "test",
        **classification.scores(labels["test"], preds["test"], names),
        "provenance": provenance.record(cfg.raw, checkpoint=str(checkpoint)),
    }
    recon.write_json(result, output)
    with atomic_path(per_class) as tmp:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["class", "name", "support", "accuracy", "precision"])
            w.writeheader()
            w.writerows(result["per_class"])
    r = np.concatenate(list(rows.values()))
    c = np.concatenate(list(cols.values()))
    shape = (int(r.max()) + 1, int(c.max()) + 1)
    truth_map = np.zeros(shape, np.int16)  # 0 = unlabelled, else class number 1..K
    pred_map = np.zeros(shape, np.int16)
    split_map = np.full(shape, -1, np.int8)
    truth_map[r, c] = np.concatenate(list(labels.values())) + 1
    pred_map[r, c] = np.concatenate(list(preds.values())) + 1
    split_map[r, c] = np.concatenate(list(splits.values()))
    with atomic_path(class_map) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(
                f,
                truth=truth_map,
                pred=pred_map,
                split=split_map,
                class_names=np.asarray(names),
                confusion=np.asarray(result["confusion_matrix"]),
            )
    return result
