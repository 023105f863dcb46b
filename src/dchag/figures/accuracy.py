"""The paper's accuracy-parity figure: the hyperspectral MAE loss beside the published curve,
the ERA5 training loss, and the ERA5 7/14/30-day RMSE/ACC %change table, from this pipeline's
training logs and comparison tables."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..paper import published
from .caption import write_table
from .common import read_csv, save
from .paper import COLOR, LABEL


def accuracy(mae_logs: dict[str, str], forecast_logs: dict[str, str], comparisons: list[str], output: str) -> Path:
    """Hyperspectral MAE loss (baseline vs -L, beside the paper's published curve) and the
    ERA5 training loss (baseline, -C, -L) with the 7/14/30-day RMSE/ACC %change table."""
    fig = plt.figure(figsize=(15, 6.5))
    ax_pub = fig.add_axes([0.05, 0.45, 0.27, 0.47])
    ax_mae = fig.add_axes([0.38, 0.45, 0.27, 0.47])
    ax_era = fig.add_axes([0.71, 0.45, 0.27, 0.47])
    ax_tab = fig.add_axes([0.05, 0.02, 0.93, 0.3])
    published_ratio = _published_curve(ax_pub)
    deviation = [
        *_training_losses(ax_mae, mae_logs, "this run: hyperspectral MAE"),
        *_training_losses(ax_era, forecast_logs, "this run: ERA5 forecast"),
        published_ratio,
    ]
    rows = _comparison_rows(comparisons)
    deviation += _change_table(ax_tab, rows)
    fig.suptitle("Accuracy parity: baseline vs D-CHAG", fontsize=10)
    text = (
        "Reproduces the paper's accuracy-parity results: hyperspectral MAE loss "
        "(published: 1-GPU baseline vs -L on 2 GPUs, 500 bands, width 512, depth 8) "
        "and the ERA5 7/14/30-day %change table (baseline, -C, -L). Runs: "
        + ", ".join(Path(p).parent.name for p in [*mae_logs.values(), *forecast_logs.values()])
        + ". "
        + "; ".join(deviation)
    )
    fig.text(0.01, -0.01, "\n".join(textwrap.wrap(text, 190)), ha="left", va="top", fontsize=7)
    write_table(rows or [{"note": "no comparison tables"}], output, text)
    return save(fig, output)


def _published_curve(ax) -> str:
    """The paper's hyperspectral MAE loss per epoch; returns its final -L/baseline phrase."""
    pub = published.MAE_LOSS
    for v, losses in pub.items():
        ax.plot(published.MAE_EPOCHS, losses, "o-", color=COLOR[v], label=LABEL[v])
    ax.set(title="published: hyperspectral MAE loss", xlabel="epoch", ylabel="loss", yscale="log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return f"published MAE final loss D-CHAG-L/baseline {pub['dchag-l'][-1] / pub['baseline'][-1]:.3f}"


def _training_losses(ax, logs: dict[str, str], title: str) -> list[str]:
    """Each run's training loss (line) and validation loss (markers) from its log; returns each
    variant's final training loss over the baseline's, as caption phrases."""
    finals = {}
    for v, path in logs.items():
        df = read_csv(path, "training log")
        ax.plot(df["step"], df["loss"], color=COLOR[v], lw=1.1, label=f"{LABEL[v]} ({Path(path).parent.name})")
        val = df.dropna(subset=["val_loss"]) if "val_loss" in df else df.iloc[:0]
        if len(val):
            ax.plot(val["step"], val["val_loss"], "o--", color=COLOR[v], ms=4, lw=0.7)
        finals[v] = float(df["loss"].tail(max(1, len(df) // 10)).mean())
    ax.set(title=title, xlabel="step", ylabel="training loss (line), validation (markers)", yscale="log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return [
        f"{title.split(': ')[1]} final training loss {LABEL[v]}/baseline {finals[v] / finals['baseline']:.3f}"
        for v in finals
        if v != "baseline" and "baseline" in finals
    ]


def _comparison_rows(comparisons: list[str]) -> list[dict]:
    """The %change rows of every comparison table (candidate vs baseline): RMSE and ACC by
    variable and lead time in days, global, with the table's other columns (the two runs'
    scores, the intervals, the p-value and the verdicts)."""
    rows = []
    for path in comparisons:
        df = read_csv(path, "comparison table")
        carried = [
            c
            for c in df.columns
            if c not in ("variable", "lead_time_hours", "region", "metric", "percent_change", "convention")
        ]
        for _, r in df[df.metric.isin(["rmse", "acc"]) & (df.region == "global")].iterrows():
            rows.append(
                {
                    "comparison": f"{r['candidate']} vs {r['baseline']}, {r['convention']}",
                    "variable": r["variable"],
                    "lead_days": int(r["lead_time_hours"]) // 24,
                    "metric": r["metric"].upper().replace("ACC", "wACC"),
                    "percent_change": r["percent_change"],
                    **{c: r[c] for c in carried},
                }
            )
    return rows


def _change_table(ax, rows: list[dict]) -> list[str]:
    """The %change rows as a table (comparison and metric by variable and lead); returns the
    largest change as a caption phrase (none without rows)."""
    table = pd.DataFrame(rows)
    ax.axis("off")
    if not len(table):
        return []
    wide = table.pivot_table(index=["comparison", "metric"], columns=["variable", "lead_days"], values="percent_change")
    cells = [[f"{v:+.1f}%" if np.isfinite(v) else "" for v in row] for row in wide.values]
    t = ax.table(
        cellText=cells,
        rowLabels=[f"{c} {m}" for c, m in wide.index],
        colLabels=[f"{var} {d}d" for var, d in wide.columns],
        loc="upper center",
        cellLoc="center",
    )
    t.auto_set_font_size(False)
    t.set_fontsize(7)
    t.scale(1, 1.3)
    ax.set_title(
        "ERA5: % change against the baseline (RMSE, wACC) at 7/14/30 days — this run; " + published.ERA5_NOTE,
        fontsize=8,
    )
    worst = table.loc[table.percent_change.abs().idxmax()]
    return [
        f"largest ERA5 |%change| {worst.percent_change:+.1f}% ({worst.comparison}, {worst.variable}, "
        f"{worst.metric}, {worst.lead_days} d)"
    ]
