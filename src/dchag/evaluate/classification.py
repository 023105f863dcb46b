"""Classification scores as reported for Indian Pines, Salinas and Pavia: overall accuracy,
average (per-class) accuracy, Cohen's kappa, the per-class table and the confusion matrix."""

from __future__ import annotations

import numpy as np

from ..store import InputError


def confusion_matrix(truth, pred, num_classes: int) -> np.ndarray:
    """counts[i, j] = samples of true class i predicted as class j (classes 0..K-1)."""
    t = np.asarray(truth, dtype=np.int64).ravel()
    p = np.asarray(pred, dtype=np.int64).ravel()
    if t.shape != p.shape:
        raise InputError(f"truth and prediction differ in length: {t.size} vs {p.size}")
    bad = (t < 0) | (t >= num_classes) | (p < 0) | (p >= num_classes)
    if bad.any():
        raise InputError(f"labels outside 0..{num_classes - 1}")
    return np.bincount(t * num_classes + p, minlength=num_classes**2).reshape(num_classes, num_classes)


def scores(truth, pred, class_names: list[str]) -> dict:
    k = len(class_names)
    cm = confusion_matrix(truth, pred, k)
    n = cm.sum()
    support = cm.sum(axis=1)
    correct = np.diag(cm)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = correct / support
        precision = correct / cm.sum(axis=0)
    oa = correct.sum() / n
    pe = float((support * cm.sum(axis=0)).sum()) / n**2
    kappa = (oa - pe) / (1 - pe) if pe < 1 else float("nan")
    per_class = [
        {
            "class": i + 1,
            "name": name,
            "support": int(support[i]),
            "accuracy": float(recall[i]),
            "precision": float(precision[i]),
        }
        for i, name in enumerate(class_names)
    ]
    return {
        "overall_accuracy": float(oa),
        "average_accuracy": float(np.nanmean(recall)),  # classes absent from the truth are left out
        "kappa": float(kappa),
        "samples": int(n),
        "per_class": per_class,
        "confusion_matrix": cm.tolist(),
        "class_names": list(class_names),
    }
