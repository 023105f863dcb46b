"""Scoring trained hyperspectral models on their held-out (test) samples: the model folder's
predictions (:mod:`dchag.predict.hsi`, the same code and masks as ``dchag predict``) on the
test group of the task's store, then the scores.

Masked autoencoding: every test tile is reconstructed from a seeded random (1 - mask ratio) of
its patches; the scores are computed in the data's units (the preprocessing's normalisation
undone) on the masked patches and on the full tile separately. A few tiles are kept for the
figures.

Classification: scores on the test patches, and a map of the predicted class of every
labelled pixel (all splits) beside the ground truth, for the figure.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .. import provenance
from ..model.folder import Model
from ..predict.hsi import class_probabilities, reconstruct_tiles
from ..predict.layout import PredictError, lay_out
from ..store import atomic_path
from ..train.data import open_array, store_info
from ..vocabulary import Task
from . import classification, recon


def _band_stats(store: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    mean = np.asarray(open_array(store, f"{split}/mean")[:], np.float64)
    std = np.asarray(open_array(store, f"{split}/std")[:], np.float64)
    return mean, std


def _check_store(model: Model, task: Task, store: str | Path, samples: str) -> None:
    """``store`` is the one ``model`` was trained on: its task, its bands, its normalisation."""
    model.require(task)
    array = open_array(store, f"test/{samples}")
    n, t = model.config.in_channels, model.meta["sample_size"]
    if tuple(array.shape[1:]) != (n, t, t):
        raise PredictError(
            f"{store}: test/{samples} are {tuple(array.shape[1:])}, the model {model.source} reads ({n}, {t}, {t})"
        )
    mean, std = _band_stats(store, "train")
    norm = model.meta["normalisation"]
    if not (np.allclose(mean, norm["mean"], rtol=1e-5, atol=1e-6) and np.allclose(std, norm["std"], rtol=1e-5)):
        raise PredictError(f"{store} is normalised with other statistics than {model.source} was trained on")


def _origin(model: Model, store: str | Path) -> dict:
    return {
        "run": (model.meta.get("provenance") or {}).get("run") or model.source,
        "model": model.source,
        "provenance": provenance.record({"model": model.meta.get("provenance"), "store": str(store)}),
    }


def evaluate_mae(model: Model, store: str | Path, output: str, samples: str, batch_size: int = 16, keep: int = 4):
    """Reconstruction scores of ``model`` on the test tiles of ``store`` (JSON at ``output``)
    and a few reconstructed tiles (``samples``, .npz). Rank 0 writes and returns the scores."""
    _check_store(model, Task.MAE, store, "tiles")
    tiles = open_array(store, "test/tiles")
    if tiles.shape[0] == 0:
        raise recon.ReconError(f"{store} has no test tiles to score")
    done = reconstruct_tiles(
        model, lay_out(model), tiles.shape[0], lambda a, b: np.asarray(tiles[a:b], np.float32), batch_size,
        f"the test tiles of {store} from",
    )  # fmt: skip
    if done is None:
        return None
    mean, std = (s[:, None, None] for s in _band_stats(store, "test"))
    pred = np.concatenate([done[k][0] for k in sorted(done)]) * std + mean
    masks = np.concatenate([done[k][1] for k in sorted(done)])
    truth = np.asarray(tiles[:], np.float32) * std + mean
    result = {
        **_origin(model, store),
        "tiles": int(truth.shape[0]),
        "mask_ratio": model.meta["mask_ratio"],
        "units": "the input data's (normalisation undone)",
        **recon.masked_and_full(truth, pred, masks),
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
                **tile_errors(truth, pred, masks),
            )
    return result


def tile_errors(truth: np.ndarray, pred: np.ndarray, masks: np.ndarray) -> dict[str, np.ndarray]:
    """Per test tile, the sum of squared errors and the number of values, on the masked patches
    and on the whole tile: the RMSEs pool them, and `dchag compare-scores` resamples tiles."""
    sq = (np.asarray(pred, np.float64) - truth) ** 2  # (tiles, bands, rows, cols)
    bands = truth.shape[1]
    return {
        "tile_masked_se": np.einsum("tbrc,trc->t", sq, masks.astype(np.float64)),
        "tile_masked_count": masks.reshape(len(masks), -1).sum(1) * bands,
        "tile_full_se": sq.reshape(len(sq), -1).sum(1),
        "tile_full_count": np.full(len(sq), sq[0].size),
    }


def _labels(model: Model, run, store: str | Path, split: str, batch_size: int) -> np.ndarray | None:
    patches = open_array(store, f"{split}/patches")
    part = class_probabilities(
        model, run, patches.shape[0], lambda a, b: np.asarray(patches[a:b], np.float32), batch_size,
        f"the {split} patches of {store} from",
    )  # fmt: skip
    if part is None:
        return None
    return np.concatenate([part[k].argmax(-1) for k in sorted(part)]) if part else np.empty(0, np.int64)


def evaluate_classification(
    model: Model, store: str | Path, output: str, per_class: str, class_map: str, batch_size: int = 256
):
    """Classification scores of ``model`` on the test patches of ``store`` (JSON at ``output``,
    the per-class table at ``per_class``) and the class map of every labelled pixel
    (``class_map``, .npz). Rank 0 writes and returns the scores."""
    _check_store(model, Task.CLASSIFICATION, store, "patches")
    names = store_info(store, "train").get("class_names") or model.meta.get("class_names")
    run = lay_out(model)
    preds, labels, rows, cols, splits = {}, {}, {}, {}, {}
    for i, split in enumerate(("train", "val", "test")):
        preds[split] = _labels(model, run, store, split, batch_size)
        labels[split] = np.asarray(open_array(store, f"{split}/label")[:], np.int64) - 1
        rows[split] = np.asarray(open_array(store, f"{split}/row")[:])
        cols[split] = np.asarray(open_array(store, f"{split}/col")[:])
        splits[split] = np.full(labels[split].shape, i, np.int8)
    if not run.writer:
        return None
    if labels["test"].size == 0:
        raise recon.ReconError(f"{store} has no test patches to score")
    result = {**_origin(model, store), "split": "test", **classification.scores(labels["test"], preds["test"], names)}
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
