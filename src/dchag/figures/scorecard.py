"""The scorecard: one block per pair of runs (a `dchag compare-scores` table), its cells the
metrics and variables (rows) by region and lead time (columns), coloured by the candidate's
percent improvement on the baseline (lower RMSE and MSE, higher ACC), the significant ones
framed and starred, with the methods and assumptions of the test written under it. The same
cells are written beside it as ``<figure>.csv``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from ..evaluate import weather
from ..evaluate.compare import LOWER_IS_BETTER
from ..store import InputError
from .caption import write_table
from .common import plt, read_csv, save

COLUMNS = [
    "baseline",
    "candidate",
    "variable",
    "lead_time_hours",
    "region",
    "metric",
    "percent_change",
    "percent_lower",
    "percent_upper",
    "p_value",
    "verdict",
    "method",
    "alpha",
    "n_init",
    "equivalence",
]
METHOD = {
    "t_test_ar2": "Student's t-test on the per-initialisation differences, its standard error inflated for AR(2) "
    "autocorrelation between consecutive initialisation times (Geer 2016)",
    "stationary_bootstrap": "the stationary block bootstrap over initialisation times (Politis and Romano 1994), "
    "block length chosen automatically (Politis and White 2004)",
}


def cells(comparisons: list[str]) -> pd.DataFrame:
    """Every comparison table's rows with the scorecard's columns: ``improvement`` (the percent
    change, signed so that positive is better), its interval and ``significant``."""
    parts = []
    for path in comparisons:
        df = read_csv(path, "comparison table")
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise InputError(f"{path} is not a table of dchag compare-scores: it lacks {', '.join(missing)}")
        parts.append(df[COLUMNS])
    if not parts:
        raise InputError("the scorecard needs at least one comparison table")
    out = pd.concat(parts, ignore_index=True)
    sign = np.where(out.metric.isin(LOWER_IS_BETTER), -1.0, 1.0)
    out["improvement"] = sign * out.percent_change
    bounds = np.sort(np.stack([sign * out.percent_lower, sign * out.percent_upper]), axis=0)
    out["improvement_lower"], out["improvement_upper"] = bounds
    out["significant"] = out.verdict.isin(["better", "worse"])
    return out


def scorecard(comparisons: list[str], output: str) -> Path:
    """The scorecard of the comparison tables ``comparisons`` (PNG, PDF and CSV)."""
    table = cells(comparisons)
    pairs = list(dict.fromkeys(zip(table.candidate, table.baseline, strict=True)))
    known = [*weather.REGIONS, *weather.MASK_REGIONS]
    regions = sorted(set(table.region), key=lambda r: (known.index(r) if r in known else len(known), r))
    leads = sorted(table.lead_time_hours.unique())
    rows = sorted({(m, v) for m, v in zip(table.metric, table.variable, strict=True)})
    # the colours saturate at 25 %: a percent change of a near-zero wACC can be thousands
    limit = float(np.clip(np.nanpercentile(np.abs(table.improvement), 90), 1.0, 25.0))
    ncol = len(regions) * len(leads)
    fig, axes = plt.subplots(
        len(pairs),
        1,
        figsize=(max(6.0, 2.0 + 0.6 * ncol), 0.6 + len(pairs) * (1.6 + 0.4 * len(rows))),
        squeeze=False,
        layout="constrained",
    )
    blocks = []
    for ax, (cand, base) in zip(axes[:, 0], pairs, strict=True):
        part = table[(table.candidate == cand) & (table.baseline == base)]
        image = _block(ax, part, rows, regions, leads, limit)
        ax.set_title(f"{cand} against {base}: % improvement (* significant)", fontsize=9)
        blocks.append((ax, part))
    label = "% improvement on the baseline (+: better)"
    fig.colorbar(image, ax=axes[:, 0].tolist(), shrink=0.6, extend="both", label=label)
    text = _caption(table)
    fig.text(0.01, -0.01, "\n".join(textwrap.wrap(text, 160)), ha="left", va="top", fontsize=7)
    write_table(table.to_dict("records"), output, text)

    def labels() -> None:  # inside their cells, added once the layout is fixed
        for ax, part in blocks:
            _labels(ax, part, rows, regions, leads, limit)

    return save(fig, output, add=labels)


def _block(ax, part: pd.DataFrame, rows: list, regions: list, leads: list, limit: float):
    """One pair's cells on ``ax``, coloured and framed (their labels: :func:`_labels`): leads by
    region along the bottom, regions along the top; returns the image (for the colour bar)."""
    grid = np.full((len(rows), len(regions) * len(leads)), np.nan)
    for r in part.itertuples():
        i, j = _cell(r, rows, regions, leads)
        grid[i, j] = r.improvement
        if r.significant:
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
    image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_yticks(range(len(rows)), [f"{v} {m.upper().replace('ACC', 'wACC')}" for m, v in rows], fontsize=7)
    ax.set_xticks(range(grid.shape[1]), [f"{h / 24:g} d" for _ in regions for h in leads], fontsize=6)
    top = ax.secondary_xaxis("top")
    top.set_xticks([(k + 0.5) * len(leads) - 0.5 for k in range(len(regions))], regions, fontsize=7)
    top.tick_params(length=0)
    for k in range(1, len(regions)):
        ax.axvline(k * len(leads) - 0.5, color="black", lw=1)
    return image


def _cell(r, rows: list, regions: list, leads: list) -> tuple[int, int]:
    return rows.index((r.metric, r.variable)), regions.index(r.region) * len(leads) + leads.index(r.lead_time_hours)


def _labels(ax, part: pd.DataFrame, rows: list, regions: list, leads: list, limit: float) -> None:
    """Each cell's percent (bold and starred when significant) over its interval."""
    for r in part.itertuples():
        i, j = _cell(r, rows, regions, leads)
        ink = "white" if abs(r.improvement) > 0.6 * limit else "black"
        label = f"{r.improvement:+.1f}" + ("*" if r.significant else "")
        ax.text(
            j, i - 0.1, label, ha="center", va="center", fontsize=6, color=ink, weight="bold" if r.significant else None
        )
        interval = f"[{r.improvement_lower:+.1f}, {r.improvement_upper:+.1f}]"
        ax.text(j, i + 0.22, interval, ha="center", va="center", fontsize=4, color=ink)


def _caption(table: pd.DataFrame) -> str:
    methods = sorted(set(table.method))
    n_init = sorted({int(n) for n in table.n_init})
    margins = sorted({e.rsplit(" ", 1)[-1] for e in table.equivalence})
    shown = table[table.equivalence.str.startswith("within")]
    levels = ", ".join(f"{100 * (1 - a):g}%" for a in sorted(set(table.alpha)))
    return (
        "Cell: 100 x (candidate - baseline) / |baseline|, signed so that positive is better (lower RMSE and MSE, "
        f"higher wACC), under it its {levels} confidence interval; * and a frame: the difference is significant "
        f"(verdict better or worse), {int(table.significant.sum())} of {len(table)} cells. Test: "
        + "; ".join(METHOD.get(m, m) for m in methods)
        + f", over {', '.join(map(str, n_init))} common initialisation times, delta-method intervals for RMSE, "
        "wACC and the percent change. Assumptions: the initialisation times are evenly spaced and the per-time "
        "differences stationary; no correction for testing many cells, so about alpha (here "
        f"{', '.join(f'{a:g}' for a in sorted(set(table.alpha)))}) of the "
        f"cells with no true difference are starred by chance. Parity (equivalence within {', '.join(margins)}, "
        f"two one-sided tests) shown in {len(shown)} of {len(table)} cells."
    )
