"""One table of what training did: loss at the start and the end of each run, validation
scores, and D-CHAG against the baseline of the same task (the paper's parity check)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from .. import provenance
from ..errors import MissingFileError
from ..store import atomic_path


def _read(log: Path) -> list[dict]:
    if not log.exists():
        raise MissingFileError(f"training log not found: {log}")
    with open(log) as f:
        return list(csv.DictReader(f))


def _mean(rows, key):
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return float(np.mean(vals)) if vals else float("nan")


def summarize(logs: list[str | Path], output: str | Path, window: int = 10) -> list[dict]:
    rows = []
    for log in map(Path, logs):
        run_dir = log.parent
        info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
        entries = _read(log)
        val = [r for r in entries if r.get("val_loss")]
        first, last = _mean(entries[:window], "loss"), _mean(entries[-window:], "loss")
        rows.append(
            {
                "run": run_dir.name,
                "task": info.get("task", ""),
                "aggregation": info.get("model", {}).get("aggregation", ""),
                "strategy": info.get("parallel", {}).get("strategy", ""),
                # fine-tuning: the model it started from and the parts it froze
                "init_from": Path((info.get("init_from") or {}).get("source", "")).parent.name
                if (info.get("init_from") or {}).get("source", "").endswith("/model")
                else (info.get("init_from") or {}).get("source", ""),
                "frozen": "+".join((info.get("init_from") or {}).get("frozen", [])),
                "steps": len(entries),
                "loss_first": first,
                "loss_last": last,
                "loss_fall_pct": 100 * (first - last) / first if first else float("nan"),
                "val_loss_first": float(val[0]["val_loss"]) if val else float("nan"),
                "val_loss_last": float(val[-1]["val_loss"]) if val else float("nan"),
                "val_accuracy_last": float(val[-1]["val_accuracy"])
                if val and val[-1].get("val_accuracy")
                else float("nan"),
            }
        )
    base = {}
    for r in rows:  # the first baseline of each task trained from scratch
        if r["strategy"] == "baseline" and not r["init_from"]:
            base.setdefault(r["task"], r)
    for r in rows:
        b = base.get(r["task"])
        r["val_loss_vs_baseline_pct"] = (
            100 * (r["val_loss_last"] - b["val_loss_last"]) / b["val_loss_last"] if b else float("nan")
        )
        r["loss_last_vs_baseline_pct"] = 100 * (r["loss_last"] - b["loss_last"]) / b["loss_last"] if b else float("nan")
    output = Path(output)
    with atomic_path(output) as tmp:
        with open(tmp, "w", newline="") as f:
            f.write(
                "# "
                f"{json.dumps(provenance.record({'logs': [str(p) for p in logs], 'window': window}), sort_keys=True)}\n"
            )
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return rows
