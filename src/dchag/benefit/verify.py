"""The verification experiment's verdict: data parallelism against fixed channel groups,
compression with bucketing and D-CHAG-L, trained for the same steps on the same data.

Per run, from its training logs: median forward, backward and communication time and step
time per step (the first ``warmup`` steps left out; the slowest rank's), peak memory per rank, the
validation curve. The decision rule (seed article): adopt a method only if its step time is
more than 5 % below data parallelism's with no significant accuracy loss — final validation
loss at most ``tolerance`` (relative) above data parallelism's. With ``verify.repeats`` every
run is trained several times: medians over repeats decide, and a step-time change that
crosses the 5 % line within the repeats' range is "inconclusive" rather than a verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import InputError, atomic_path

STEP_GAIN = 0.05


def read_logs(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    for name in ("log.csv", "ranks.csv"):
        if not (run_dir / name).exists():
            raise InputError(f"training log not found: {run_dir / name}")
    return pd.read_csv(run_dir / "log.csv"), pd.read_csv(run_dir / "ranks.csv")


def repeat_base(name: str) -> str:
    """verify-dp-r2 -> verify-dp (config verify.repeats)."""
    return re.sub(r"-r\d+$", "", name)


def _one_run(name: str, d: Path, warmup: int) -> dict:
    log, ranks = read_logs(Path(d))
    ranks_timed = ranks.dropna(subset=["t_forward"])  # the step whose memory was tracked (CPU) has no timings
    timed = ranks_timed[ranks_timed.step > warmup] if (ranks_timed.step > warmup).any() else ranks_timed
    slowest = timed.groupby("step")[["t_data", "t_forward", "t_backward", "t_optimizer", "t_comm"]].max()
    # medians over steps: a shared machine's stalls would otherwise decide the verdict
    step_s = (slowest[["t_data", "t_forward", "t_backward", "t_optimizer"]].sum(axis=1)).median()
    slowest = slowest.median()
    val = log.dropna(subset=["val_loss"])
    return {
        "run": repeat_base(name),
        "steps": int(log.step.max()),
        "step_s": step_s,
        "data_s": slowest.t_data,
        "forward_s": slowest.t_forward,
        "backward_s": slowest.t_backward,
        "comm_s": slowest.t_comm,
        "optimizer_s": slowest.t_optimizer,
        "peak_mem_mib_max_rank": float(ranks.peak_mem_mib.max()),
        "final_val_loss": float(val.val_loss.iloc[-1]) if len(val) else np.nan,
    }


def summarize(
    run_dirs: dict[str, Path], reference: str = "verify-dp", warmup: int = 5, tolerance: float = 0.05
) -> pd.DataFrame:
    """One row per method. With repeats (runs named <method>-r<i>, trained alike), times are
    the median over repeats and ``step_s_min`` / ``step_s_max`` their range; a verdict whose
    step-time change crosses the 5 % line within that range is reported as inconclusive."""
    each = pd.DataFrame([_one_run(name, d, warmup) for name, d in run_dirs.items()])
    grouped = each.groupby("run", sort=False)
    df = grouped.median(numeric_only=True).reset_index()
    df["steps"] = df.steps.astype(int)
    df["peak_mem_mib_max_rank"] = grouped.peak_mem_mib_max_rank.max().to_numpy()
    df["repeats"] = grouped.size().to_numpy()
    df["step_s_min"], df["step_s_max"] = grouped.step_s.min().to_numpy(), grouped.step_s.max().to_numpy()
    if reference not in set(df.run):
        raise InputError(f"the verification needs the reference run {reference!r}; got {', '.join(df.run)}")
    ref = df.set_index("run").loc[reference]
    df["step_time_change"] = df.step_s / ref.step_s - 1
    # the best and worst case over the repeats: this method's fastest against the reference's slowest
    best = df.step_s_min / ref.step_s_max - 1
    worst = df.step_s_max / ref.step_s_min - 1
    df["val_loss_change"] = df.final_val_loss / ref.final_val_loss - 1
    faster = df.step_time_change < -STEP_GAIN
    accurate = df.val_loss_change <= tolerance
    noisy = (df.repeats > 1) & (best < -STEP_GAIN) & (worst >= -STEP_GAIN)
    df["verdict"] = np.where(
        df.run == reference,
        "reference",
        np.where(
            ~accurate,
            f"no: validation loss {tolerance:.0%}+ worse",
            np.where(
                noisy,
                f"inconclusive: the step-time change crosses -{STEP_GAIN:.0%} over the repeats",
                np.where(faster, "adopt", f"no: step time not {STEP_GAIN:.0%} lower"),
            ),
        ),
    )
    return df


def write(df: pd.DataFrame, output: str | Path) -> Path:
    with atomic_path(output) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    return Path(output)
