"""The paper's figures, redrawn from this pipeline's own runs, each beside the published values.

Every memory/throughput figure has three panels side by side: the published value (Frontier,
the paper's scale), the cost model's prediction at the paper's scale, and this run's
measurement (on the hardware that ran it, named in the panel, at the run's own scale). The
figure's caption line (drawn under it, and written as ``<figure>.csv`` beside it) names the
paper figure, the setting run and how far the run is from the published values: where the run
was at the paper's scale, the relative difference of each number; where it was scaled down,
the difference of the scale-free ratios the figure is about (D-CHAG over baseline, a variant
over its reference, the front end's share).

Inputs are the points' JSON files (dchag.paper.bench) and, for accuracy parity, training logs
and comparison tables: nothing is read from a committed results file.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..paper import published
from ..paper.predict import predicted_gb
from ..paper.sweep import Point
from ..store import InputError
from ..vocabulary import VARIANTS
from .caption import draw_caption, ratio_deviation, run_setting_label, setting_label, table_row, write_table
from .common import save

LABEL = {name: v.label for name, v in VARIANTS.items()}
LABEL.update({f"{name}+fused": f"{v.label}, fused front end" for name, v in VARIANTS.items()})
COLOR = {
    "baseline": "#1f77b4",
    "dchag-l": "#d62728",
    "dchag-c": "#ff7f0e",
    "baseline+fused": "#aec7e8",
    "dchag-l+fused": "#ff9896",
    "dchag-c+fused": "#ffbb78",
    "tokenize": "#1f77b4",
    "tokenize+aggregate": "#17becf",
    "dist-tokenize": "#d62728",
    "dist-tokenize+gather-all": "#9467bd",
}


class Run:
    """One measured point (bench.py's JSON)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.exists():
            raise InputError(f"paper point result not found: {path} (run `snakemake paper`)")
        self.data = json.loads(path.read_text())
        self.point = Point.from_dict(self.data["point"])
        self.device = self.data["device"]
        self.on_gpu = self.data["memory_measure"].startswith("torch.cuda")

    def memory(self) -> float:
        """Rank 0's peak (as the paper), GB (2^30 bytes)."""
        return self.data["memory_mib_rank0"] / 1024

    @property
    def at_paper_scale(self) -> bool:
        return self.point.stands_for is None and self.on_gpu


def load(paths: list[str]) -> list[Run]:
    if not paths:
        raise InputError("no paper point results given")
    return [Run(p) for p in paths]


def _model_series(runs: list[Run]) -> list[str]:
    """The whole-model series the runs hold, each variant followed by its fused front end."""
    return [
        s
        for v in ("baseline", "dchag-c", "dchag-l")
        for s in (v, f"{v}+fused")
        if any(r.point.series == s for r in runs)
    ]


def published_value(figure: str, p: Point, tree: int, metric: str = "memory_gb") -> float | None:
    """The published value of ``figure`` at point ``p``'s paper setting, or None: where the paper
    has none, and for the fused front end (the paper's models form the channel tokens)."""
    return None if p.fused_front_end else published.lookup(figure, *p.paper_setting, p.variant, tree, metric)


def _unit(runs: list[Run]) -> tuple[str, float]:
    """Axis unit of the measured panel: GB on a GPU, MiB on the CPU (scaled-down runs)."""
    return ("GB", 1.0) if all(r.on_gpu for r in runs) else ("MiB", 1024.0)


def _bars(ax, groups: list[str], series: list[str], value, title: str, ylabel: str) -> None:
    """Grouped bars: ``value(group, series)`` -> number or None (no bar)."""
    width = 0.8 / max(1, len(series))
    for j, s in enumerate(series):
        xs, ys = [], []
        for i, g in enumerate(groups):
            v = value(g, s)
            if v is not None and np.isfinite(v):
                xs.append(i + (j - (len(series) - 1) / 2) * width)
                ys.append(v)
        # a series with no bar here still shows its colour in the legend (a NaN bar draws nothing)
        ax.bar(xs or [np.nan], ys or [np.nan], width, color=COLOR.get(s, f"C{j}"), label=LABEL.get(s, s))
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.3g}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(groups)), groups, fontsize=7, rotation=20, ha="right")
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")


# -- the memory figures ----------------------------------------------------------------------
TITLE = {
    "front_share": "Front-end share of the baseline's memory",
    "tokenization": "Tokenization strategies: peak memory per GPU",
    "tree": "TreeK: peak memory per GPU",
    "full_models": "Full models at fixed TP: memory and throughput per GPU",
    "tp_scaling": "Scaling in TP for a fixed model",
}


def _memory_panels(axes, figure: str, runs: list[Run], groups_of, series: list[str], reference) -> tuple[list, list]:
    """Three panels of grouped bars (published, predicted, measured); ``groups_of(point)``
    names a point's x group at its paper setting; ``reference(point, key)`` the (group, series)
    a scale-free ratio is taken against. Returns the table rows and the deviation phrases."""
    unit, scale = _unit(runs)
    by_paper: dict[tuple[str, str], Point] = {}
    by_run: dict[tuple[str, str], Run] = {}
    for r in runs:
        key = (groups_of(r.point), r.point.series)
        by_paper[key], by_run[key] = r.point, r
    groups = list(dict.fromkeys(g for g, _ in by_paper))
    pub = {k: published_value(figure, p, p.tree) for k, p in by_paper.items()}
    pred = {k: predicted_gb(p) for k, p in by_paper.items()}
    meas = {k: r.memory() * scale for k, r in by_run.items()}
    _bars(
        axes[0],
        groups,
        series,
        lambda g, s: pub.get((g, s)),
        f"published ({published.HARDWARE.split(' (')[0]})",
        "peak memory per GPU, GB",
    )
    if not any(v is not None for v in pub.values()):
        axes[0].text(
            0.5, 0.5, "no published value\nat these settings", ha="center", va="center", transform=axes[0].transAxes
        )
    _bars(
        axes[1],
        groups,
        series,
        lambda g, s: pred.get((g, s)),
        "cost model, paper scale",
        "predicted memory per GPU, GB",
    )
    devices = ", ".join(sorted({r.device for r in runs}))
    run_groups = [f"{g}\n[{run_setting_label(by_run[next(k for k in by_run if k[0] == g)].point)}]" for g in groups]
    _bars(
        axes[2],
        run_groups,
        series,
        lambda g, s: meas.get((groups[run_groups.index(g)], s)),
        f"this run: {devices}",
        f"peak memory per rank, {unit}",
    )
    axes[0].legend(fontsize=7)
    rows, deviation = [], []
    for k, p in by_paper.items():
        r = by_run[k]
        rows.append(table_row(figure, r, p, "memory", meas[k], pub[k], pred[k], unit))
        if pub[k] is None:
            continue
        name = f"{LABEL.get(p.series, p.series)} {k[0]}"
        deviation.append(f"prediction {name} {pred[k] / pub[k] - 1:+.0%}")
        ref = reference(p, k)
        if r.at_paper_scale:
            deviation.append(f"measured {name} {meas[k] / pub[k] - 1:+.0%}")
        elif ref is not None and ref != k and ref in meas and pub.get(ref):
            deviation.append(
                ratio_deviation(
                    f"{LABEL.get(p.variant, p.variant)}/{LABEL.get(ref[1], ref[1])} at {ref[0]}"
                    + (f" vs {k[0]}" if ref[0] != k[0] else ""),
                    meas[k] / meas[ref],
                    pub[k] / pub[ref],
                )
            )
    return rows, deviation


def _memory_figure(figure: str, runs: list[Run], output: str, groups_of, series: list[str], reference) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    rows, deviation = _memory_panels(axes, figure, runs, groups_of, series, reference)
    fig.suptitle(TITLE[figure], fontsize=10)
    caption = draw_caption(fig, figure, runs, deviation)
    write_table(rows, output, caption)
    return save(fig, output)


def tokenization(paths: list[str], output: str) -> Path:
    runs = load(paths)
    series = [
        v
        for v in ("tokenize", "tokenize+aggregate", "dist-tokenize", "dist-tokenize+gather-all")
        if any(r.point.variant == v for r in runs)
    ]
    return _memory_figure(
        "tokenization", runs, output, lambda p: setting_label(*p.paper_setting), series, lambda p, k: (k[0], "tokenize")
    )


def tree(paths: list[str], output: str) -> Path:
    runs = load(paths)
    series = [v for v in ("dchag-l", "dchag-c") if any(r.point.variant == v for r in runs)]
    return _memory_figure("tree", runs, output, lambda p: f"Tree{p.tree}", series, lambda p, k: ("Tree0", k[1]))


def full_models(paths: list[str], output: str) -> Path:
    """Memory (top row) and TFLOPS/GPU with samples/s per GPU (bottom row) for baseline, -C, -L."""
    runs = load(paths)
    series = _model_series(runs)
    fig, axes = plt.subplots(2, 3, figsize=(14, 8.4))
    rows, deviation = _memory_panels(
        axes[0], "full_models", runs, lambda p: setting_label(*p.paper_setting), series, lambda p, k: (k[0], "baseline")
    )
    by = {(setting_label(*r.point.paper_setting), r.point.series): r for r in runs}
    groups = list(dict.fromkeys(g for g, _ in by))
    pub = {k: published_value("full_models", r.point, 0, "tflops") for k, r in by.items()}
    _bars(
        axes[1][0],
        groups,
        series,
        lambda g, s: pub.get((g, s)),
        "published TFLOPS/GPU (3 x forward FLOPs / step time)",
        "TFLOPS/GPU",
    )
    if not any(v is not None for v in pub.values()):
        axes[1][0].text(
            0.5, 0.5, "no published TFLOPS\nat these settings", ha="center", va="center", transform=axes[1][0].transAxes
        )
    _bars(
        axes[1][1],
        groups,
        series,
        lambda g, s: by[(g, s)].data["tflops_per_gpu"] if (g, s) in by else None,
        "this run: TFLOPS/GPU",
        "TFLOPS/GPU",
    )
    _bars(
        axes[1][2],
        groups,
        series,
        lambda g, s: by[(g, s)].data["samples_per_s_per_gpu"] if (g, s) in by else None,
        "this run: samples/s per GPU (like for like)",
        "samples/s per GPU",
    )
    for k, r in by.items():
        rows.append(
            table_row("full_models", r, r.point, "tflops", r.data["tflops_per_gpu"], pub[k], None, "TFLOPS/GPU")
        )
        ref = (k[0], "baseline")
        if pub[k] is None or k[1] == "baseline" or ref not in by or not pub.get(ref):
            continue
        if r.at_paper_scale:
            deviation.append(f"TFLOPS {LABEL[k[1]]} {k[0]} {r.data['tflops_per_gpu'] / pub[k] - 1:+.0%}")
        else:
            deviation.append(
                ratio_deviation(
                    f"TFLOPS {LABEL[k[1]]}/baseline at {k[0]}",
                    r.data["tflops_per_gpu"] / by[ref].data["tflops_per_gpu"],
                    pub[k] / pub[ref],
                )
            )
    for k, r in by.items():  # the fused front end against the same model forming the tokens
        ref = (k[0], r.point.variant)
        if r.point.fused_front_end and ref in by:
            deviation.append(
                f"{LABEL[k[1]]} {k[0]}: memory fused/token here {r.memory() / by[ref].memory():.2f}, "
                f"predicted {predicted_gb(r.point) / predicted_gb(by[ref].point):.2f}; samples/s fused/token "
                f"{r.data['samples_per_s_per_gpu'] / by[ref].data['samples_per_s_per_gpu']:.2f}"
            )
    deviation.append(
        "TFLOPS: no prediction (the cost model's compute rates are calibrated per machine with dchag calibrate; "
        "none for MI250X)"
    )
    fig.suptitle(TITLE["full_models"], fontsize=10)
    fig.tight_layout()
    caption = draw_caption(fig, "full_models", runs, deviation)
    write_table(rows, output, caption)
    return save(fig, output)


def tp_scaling(paths: list[str], output: str) -> Path:
    """Memory per GPU and samples/s per GPU against TP, for a fixed model."""
    runs = load(paths)
    unit, scale = _unit(runs)
    series = _model_series(runs)
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    rows, deviation = [], []
    for v in series:
        rs = sorted((r for r in runs if r.point.series == v), key=lambda r: r.point.tp)
        tps = [r.point.paper_setting[2] for r in rs]
        pub = [published_value("tp_scaling", r.point, 0) for r in rs]
        pred = [predicted_gb(r.point) for r in rs]
        c = COLOR[v]
        known = [(t, y) for t, y in zip(tps, pub) if y is not None]
        if known:
            axes[0].plot(*zip(*known), "o", color=c, label=LABEL[v])
        axes[1].plot(tps, pred, "s--", color=c, label=LABEL[v])
        axes[2].plot([r.point.tp for r in rs], [r.memory() * scale for r in rs], "o-", color=c, label=LABEL[v])
        axes[3].plot(
            [r.point.tp for r in rs], [r.data["samples_per_s_per_gpu"] for r in rs], "o-", color=c, label=LABEL[v]
        )
        for r, y, yp in zip(rs, pub, pred):
            rows.append(table_row("tp_scaling", r, r.point, "memory", r.memory() * scale, y, yp, unit))
            if y is not None:
                deviation.append(f"prediction {LABEL[v]} TP{r.point.paper_setting[2]} {yp / y - 1:+.0%}")
                if r.at_paper_scale:
                    deviation.append(f"measured {LABEL[v]} TP{r.point.tp} {r.memory() / y - 1:+.0%}")
    # the scale-free shape: memory at the largest TP over memory at the smallest, per variant
    for v in series:
        rs = sorted((r for r in runs if r.point.variant == v), key=lambda r: r.point.tp)
        if len(rs) > 1:
            deviation.append(
                f"{LABEL[v]} memory TP{rs[-1].point.tp}/TP{rs[0].point.tp} here {rs[-1].memory() / rs[0].memory():.2f}"
                f" (predicted at paper scale {predicted_gb(rs[-1].point) / predicted_gb(rs[0].point):.2f})"
            )
    setting = {setting_label(r.point.paper_setting[0], r.point.paper_setting[1], 0).rsplit(",", 1)[0] for r in runs}
    for ax, title, ylabel in zip(
        axes,
        ("published", "cost model, paper scale", f"this run: {runs[0].device}", "this run"),
        ("memory per GPU, GB", "memory per GPU, GB", f"memory per rank, {unit}", "samples/s per GPU"),
    ):
        ax.set(title=title, xlabel="TP", ylabel=ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{TITLE['tp_scaling']} ({'; '.join(sorted(setting))})", fontsize=10)
    caption = draw_caption(fig, "tp_scaling", runs, deviation)
    write_table(rows, output, caption)
    return save(fig, output)


def front_share(paths: list[str], output: str) -> Path:
    """The baseline's memory split: tokenization, + aggregation, the rest (ViT, head,
    optimizer), as shares of the whole model's peak, per model width and channel count."""
    runs = load(paths)
    by = {(r.point.paper_setting, r.point.variant): r for r in runs}
    settings = list(dict.fromkeys(s for s, v in by if v == "baseline"))
    missing = [(s, v) for s in settings for v in ("tokenize", "tokenize+aggregate") if (s, v) not in by]
    if missing:
        raise InputError(
            f"front_share needs tokenize and tokenize+aggregate points beside each baseline point; missing: {missing}"
        )

    def shares(get) -> dict:
        out = {}
        for s in settings:
            whole, tok, agg = get(s, "baseline"), get(s, "tokenize"), get(s, "tokenize+aggregate")
            if None in (whole, tok, agg):
                continue
            out[s] = (tok / whole, (agg - tok) / whole, 1 - agg / whole)
        return out

    def _pub(s, v):
        return published.lookup("front_share", *s, v)

    def _pred(s, v):
        return predicted_gb(by[(s, v)].point)

    def _meas(s, v):
        return by[(s, v)].memory()

    panels = [
        ("published", shares(_pub)),
        ("cost model, paper scale", shares(_pred)),
        (f"this run: {runs[0].device}", shares(_meas)),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    names = ("tokenization", "+ aggregation", "rest (ViT, head, parameters, optimizer)")
    colors = ("#1f77b4", "#17becf", "#bbbbbb")
    for ax, (title, data) in zip(axes, panels):
        labels = [
            setting_label(*s)
            if "run" not in title
            else f"{setting_label(*s)}\n[{run_setting_label(by[(s, 'baseline')].point)}]"
            for s in settings
        ]
        bottom = np.zeros(len(settings))
        for j, name in enumerate(names):
            vals = np.array([data[s][j] if s in data else np.nan for s in settings])
            ax.bar(range(len(settings)), np.nan_to_num(vals), bottom=bottom, color=colors[j], label=name)
            for i, v in enumerate(vals):
                if np.isfinite(v) and v > 0.04:
                    ax.text(i, bottom[i] + v / 2, f"{v:.0%}", ha="center", va="center", fontsize=7)
            bottom += np.nan_to_num(vals)
        ax.set_xticks(range(len(settings)), labels, fontsize=7, rotation=20, ha="right")
        ax.set(title=title, ylabel="share of the baseline's peak memory", ylim=(0, 1.05))
    axes[0].legend(fontsize=7, loc="lower left")
    rows, deviation = [], []
    pub_s, meas_s, pred_s = panels[0][1], panels[2][1], panels[1][1]
    for s in settings:
        for j, name in enumerate(names[:2]):
            p = pub_s.get(s)
            rows.append(
                {
                    "figure": "front_share",
                    "paper_setting": setting_label(*s),
                    "part": name,
                    "published_share": p[j] if p else None,
                    "predicted_share": pred_s[s][j],
                    "measured_share": meas_s[s][j],
                    "device": by[(s, "baseline")].device,
                }
            )
            if p:
                deviation.append(ratio_deviation(f"{name} share at {setting_label(*s)}", meas_s[s][j], p[j]))
                deviation.append(f"predicted {name} share {pred_s[s][j]:.2f}")
    fig.suptitle(TITLE["front_share"], fontsize=10)
    caption = draw_caption(fig, "front_share", runs, deviation)
    write_table(rows, output, caption)
    return save(fig, output)


DRAW = {
    "front_share": front_share,
    "tokenization": tokenization,
    "tree": tree,
    "full_models": full_models,
    "tp_scaling": tp_scaling,
}
