"""Tables across runs: the paper's % change of D-CHAG against the baseline per metric and lead
time, and one long table of the hyperspectral scores of every run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import InputError
from .score import COLUMNS

KEYS = ["variable", "lead_time_hours", "region", "metric", "convention"]


def _scores(path: str | Path) -> pd.DataFrame:
    if not Path(path).exists():
        raise InputError(f"score file not found: {path}")
    df = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{path} is not a `dchag score` table: it lacks column(s) {', '.join(missing)}")
    return df


def percent_change(
    baseline: str | Path, candidate: str | Path, baseline_name: str = "baseline", candidate_name: str = "dchag"
) -> pd.DataFrame:
    """100 * (candidate - baseline) / |baseline| for every (variable, lead, region, metric, convention)
    scored in both files. For RMSE and MSE lower is better, for ACC higher."""
    b, c = _scores(baseline), _scores(candidate)
    merged = b.merge(c, on=KEYS, suffixes=("_b", "_c"))
    if merged.empty:
        raise InputError(f"{baseline} and {candidate} share no (variable, lead time, region, metric, convention)")
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = 100.0 * (merged["value_c"] - merged["value_b"]) / merged["value_b"].abs()
    out = merged[KEYS].copy()
    out[baseline_name] = merged["value_b"]
    out[candidate_name] = merged["value_c"]
    out["percent_change"] = pct
    out["better"] = np.where(
        merged["metric"] == "acc", merged["value_c"] > merged["value_b"], merged["value_c"] < merged["value_b"]
    )
    return out.sort_values(["convention", "metric", "variable", "lead_time_hours"]).reset_index(drop=True)


def hsi_table(files: list[str]) -> pd.DataFrame:
    """run, task, region, metric, value from `dchag evaluate-mae` / `evaluate-classification` JSON."""
    rows = []
    for path in files:
        if not Path(path).exists():
            raise InputError(f"score file not found: {path}")
        d = json.loads(Path(path).read_text())
        if "masked" in d:
            for region in ("masked", "full"):
                for k in ("rmse", "psnr", "psnr_band_mean", "ssim", "sam", "ergas"):
                    rows.append({"run": d["run"], "task": "mae", "region": region, "metric": k, "value": d[region][k]})
        elif "overall_accuracy" in d:
            for k in ("overall_accuracy", "average_accuracy", "kappa"):
                rows.append(
                    {
                        "run": d["run"],
                        "task": "classification",
                        "region": d.get("split", "test"),
                        "metric": k,
                        "value": d[k],
                    }
                )
        else:
            raise InputError(f"{path} is neither a reconstruction nor a classification score file")
    return pd.DataFrame(rows, columns=["run", "task", "region", "metric", "value"])
