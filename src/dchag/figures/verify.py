"""The verification experiment's figure: step time split, peak memory, validation curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..benefit.verify import read_logs, repeat_base
from .common import plt, save


def verification(run_dirs: dict[str, Path], df: pd.DataFrame, output: str | Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    names = list(df.run)
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for part, colour in (
        ("data_s", "#8c8c8c"),
        ("forward_s", "#4c72b0"),
        ("backward_s", "#dd8452"),
        ("optimizer_s", "#55a868"),
    ):
        vals = df[part].to_numpy() * 1e3
        axes[0].bar(x, vals, bottom=bottom, color=colour, label=part.removesuffix("_s"))
        bottom += vals
    axes[0].plot(x, df.comm_s.to_numpy() * 1e3, "k_", ms=30, mew=2, label="in collectives (part of the above)")
    if (df.repeats > 1).any():
        step = df.step_s.to_numpy() * 1e3
        axes[0].errorbar(
            x,
            step,
            yerr=[step - df.step_s_min.to_numpy() * 1e3, df.step_s_max.to_numpy() * 1e3 - step],
            fmt="none",
            ecolor="k",
            capsize=4,
            label="step time over the repeats (median, range)",
        )
    axes[0].set(xticks=x, ylabel="ms per step (slowest rank)", title="step time")
    axes[0].set_xticklabels([n.removeprefix("verify-") for n in names], rotation=20)
    axes[0].legend(fontsize=7)
    axes[1].bar(x, df.peak_mem_mib_max_rank, color=[f"C{i}" for i in range(len(names))])
    axes[1].set(xticks=x, ylabel="MiB", title="peak memory, most loaded rank")
    axes[1].set_xticklabels([n.removeprefix("verify-") for n in names], rotation=20)
    first = {}
    for name, d in run_dirs.items():  # repeats train alike: one validation curve per method
        first.setdefault(repeat_base(name), d)
    for i, (name, verdict) in enumerate(zip(df.run, df.verdict)):
        log, _ = read_logs(Path(first[name]))
        val = log.dropna(subset=["val_loss"])
        ref = verdict == "reference"  # dashed and on top: methods that train alike would hide it
        axes[2].plot(
            val.step,
            val.val_loss,
            "o--" if ref else "o-",
            color=f"C{i}",
            zorder=3 if ref else 2,
            label=f"{name.removeprefix('verify-')}: {verdict}",
        )
    axes[2].set(xlabel="step", ylabel="validation loss", title="validation")
    axes[2].legend(fontsize=7)
    fig.suptitle("Verification experiment: does a lighter alternative pay off here?")
    fig.tight_layout()
    return save(fig, output)
