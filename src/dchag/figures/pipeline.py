"""The pipeline's figures, from result files; each function writes one figure as PNG and PDF.

Every function takes result files (never a model), so `snakemake figures` redraws them all
from existing results without training anything.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from ..store import InputError
from .common import color, load_runs, plt, read_csv, run_name, save


# -- training --------------------------------------------------------------------------------
def loss_curves(logs: list[str], output: str) -> Path:
    """Training loss (line) and validation loss (markers) per step, one panel per task, baseline
    and D-CHAG together: the paper's accuracy-parity figures."""
    runs = {run_name(p): read_csv(p, "training log") for p in logs}
    tasks = sorted({name.split("-")[0] for name in runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, (name, df) in enumerate((n, d) for n, d in runs.items() if n.split("-")[0] == task):
            c = color(name, i)
            ax.plot(df["step"], df["loss"], color=c, lw=1.2, alpha=0.85, label=f"{name} (train)")
            val = df.dropna(subset=["val_loss"]) if "val_loss" in df else df.iloc[:0]
            if len(val):
                ax.plot(val["step"], val["val_loss"], "o--", color=c, ms=5, lw=0.8, label=f"{name} (val)")
        ax.set(title=task, xlabel="step", ylabel="loss")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("Training loss: baseline vs D-CHAG")
    return save(fig, output)


# -- weather ---------------------------------------------------------------------------------
def lead_time_scores(scores: list[str], output: str, variables: list[str] | None = None) -> Path:
    """RMSE and ACC against lead time per variable, one line per forecast (model runs,
    persistence, climatology). Score files are `dchag score` outputs named scores_<source>.csv
    or scores_<source>_<convention>.csv."""
    frames = []
    for path in scores:
        df = read_csv(path, "score file")
        df = df[df["region"] == "global"] if "region" in df.columns else df  # the figure is global
        stem = Path(path).stem.removeprefix("scores_")
        conv = str(df["convention"].iloc[0]) if len(df) else ""
        df["source"] = stem.removesuffix(f"_{conv}") if conv else stem
        frames.append(df)
    df = pd.concat(frames)
    variables = variables or list(dict.fromkeys(df["variable"]))
    metrics = [m for m in ("rmse", "acc") if m in set(df["metric"])]
    fig, axes = plt.subplots(
        len(metrics), len(variables), figsize=(3.2 * len(variables), 2.8 * len(metrics)), squeeze=False
    )
    for i, metric in enumerate(metrics):
        for j, var in enumerate(variables):
            ax = axes[i][j]
            for k, (source, part) in enumerate(
                df[(df.metric == metric) & (df.variable == var)].groupby("source", sort=False)
            ):
                part = part.sort_values("lead_time_hours")
                if part["value"].notna().any():
                    ax.plot(part["lead_time_hours"] / 24, part["value"], "o-", color=color(source, k), label=source)
            ax.set(
                title=var if i == 0 else None,
                xlabel="lead time (days)" if i == len(metrics) - 1 else None,
                ylabel=f"{'wACC' if metric == 'acc' else 'RMSE'}" if j == 0 else None,
            )
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    conv = ", ".join(sorted(set(df["convention"])))
    fig.suptitle(f"Latitude-weighted scores vs lead time ({conv} convention)")
    fig.tight_layout()
    return save(fig, output)


def forecast_maps(
    forecasts: list[str], truth: str, output: str, variable: str | None = None, lead_index: int = 0, time_index: int = 0
) -> Path:
    """One initialisation: the truth, each forecast and its error, for one variable and lead."""
    from ..evaluate.score import open_fields

    t = open_fields(truth, "truth")
    rows = []
    var = variable
    for path in forecasts:
        f = open_fields(path, "forecast")
        var = var or next(iter(f.data_vars))
        if var not in f or var not in t:
            raise InputError(
                f"forecast maps: variable {var!r} is not in {path} and its truth {truth} "
                f"(evaluate.map_variable; they hold {', '.join(map(str, f.data_vars))})"
            )
        leads = f["prediction_timedelta"].values
        if lead_index >= leads.size:
            raise InputError(f"forecast maps: lead index {lead_index}, but {path} has {leads.size} lead(s)")
        lead = leads[lead_index]
        init = f.time.values[time_index]
        fc = f[var].sel(time=init, prediction_timedelta=lead)
        rows.append((run_name(path), fc, t[var].sel(time=init + lead)))
    if not rows:
        raise InputError("forecast maps need at least one forecast file")
    fig, axes = plt.subplots(len(rows), 3, figsize=(12, 2.6 * len(rows)), squeeze=False)
    lo = min(float(min(r[1].min(), r[2].min())) for r in rows)
    hi = max(float(max(r[1].max(), r[2].max())) for r in rows)
    err = max(float(abs(r[1] - r[2]).max()) for r in rows)
    for ax_row, (name, fc, tr) in zip(axes, rows):
        extent = [float(fc.lon.min()), float(fc.lon.max()), float(fc.lat.min()), float(fc.lat.max())]
        for ax, data, title, kw in (
            (ax_row[0], tr, "truth", dict(cmap="viridis", vmin=lo, vmax=hi)),
            (ax_row[1], fc, f"forecast: {name}", dict(cmap="viridis", vmin=lo, vmax=hi)),
            (ax_row[2], fc - tr, "forecast - truth", dict(cmap="RdBu_r", vmin=-err, vmax=err)),
        ):
            im = ax.imshow(data.values, origin="lower", extent=extent, aspect="auto", **kw)
            ax.set(title=title, xlabel="longitude", ylabel="latitude")
            fig.colorbar(im, ax=ax, shrink=0.85)
    lead_days = rows[0][1].prediction_timedelta.values / np.timedelta64(1, "D")
    fig.suptitle(f"{var}: initialised {str(rows[0][1].time.values)[:13]}, lead {lead_days:g} days")
    fig.tight_layout()
    return save(fig, output)


# -- hyperspectral ---------------------------------------------------------------------------
def _rgb_bands(wavelength: np.ndarray, bands: int) -> list[int]:
    """Bands nearest 650/550/450 nm, or evenly spaced ones without wavelengths."""
    if np.all(np.isfinite(wavelength)):
        return [int(np.argmin(np.abs(wavelength - w))) for w in (650, 550, 450)]
    return [int(bands * q) for q in (0.75, 0.5, 0.25)]


def _stretch(cube: np.ndarray, idx: list[int], reference: np.ndarray) -> np.ndarray:
    """(bands, H, W) -> (H, W, 3) false colour, stretched to the 2-98 percentiles of
    ``reference`` (the truth), so reconstructions are shown in the truth's colours."""
    rgb = np.stack([cube[i] for i in idx], axis=-1).astype(np.float64)
    ref = np.stack([reference[i] for i in idx], axis=-1).astype(np.float64)
    lo, hi = np.percentile(ref, 2, axis=(0, 1)), np.percentile(ref, 98, axis=(0, 1))
    return np.clip((rgb - lo) / np.where(hi > lo, hi - lo, 1), 0, 1)


def hsi_reconstruction(samples: list[str], output: str, tile: int = 0) -> Path:
    """For one held-out tile: the true false-colour image, the masked input, each run's
    reconstruction, and spectra at three sample pixels (true vs reconstructed)."""
    runs = load_runs(samples, "reconstruction samples")
    first = next(iter(runs.values()))
    truth, mask, wl = first["truth"][tile], first["mask"][tile], first["wavelength"]
    idx = _rgb_bands(wl, truth.shape[0])
    rgb = _stretch(truth, idx, truth)
    h, w = truth.shape[1:]
    pixels = [(h // 4, w // 4), (h // 2, w // 2), (3 * h // 4, 3 * w // 4)]
    ncol = 2 + len(runs)
    # two rows of their own widths: the images, then the three spectra (one grid would not hold both)
    fig = plt.figure(figsize=(3.2 * ncol, 6.4), layout="constrained")
    images, spectra = fig.subfigures(2, 1)
    ax = images.add_subplot(1, ncol, 1)
    ax.imshow(rgb)
    for k, (r, c) in enumerate(pixels):
        ax.plot(c, r, "x", color="w", ms=8, mew=2)
        ax.annotate(str(k + 1), (c, r), color="w", xytext=(3, 3), textcoords="offset points")
    ax.set(title="truth (false colour)")
    ax = images.add_subplot(1, ncol, 2)
    ax.imshow(np.where(mask[..., None], 0.15, rgb))
    ax.set(title="visible patches")
    for j, (name, d) in enumerate(runs.items()):
        ax = images.add_subplot(1, ncol, 3 + j)
        ax.imshow(_stretch(d["pred"][tile], idx, truth))
        ax.set(title=f"reconstruction: {name}")
    for a in images.axes:
        a.set_xticks([])
        a.set_yticks([])
    x = wl if np.all(np.isfinite(wl)) else np.arange(truth.shape[0])
    for k, (r, c) in enumerate(pixels):
        ax = spectra.add_subplot(1, 3, 1 + k)
        ax.plot(x, truth[:, r, c], "k-", lw=1.5, label="truth")
        for j, (name, d) in enumerate(runs.items()):
            ax.plot(x, d["pred"][tile][:, r, c], "--", color=color(name, j), lw=1.1, label=name)
        ax.set(
            title=f"pixel {k + 1} ({'masked' if mask[r, c] else 'visible'})",
            xlabel="wavelength (nm)" if np.all(np.isfinite(wl)) else "band",
        )
        ax.grid(alpha=0.3)
    spectra.axes[0].legend(fontsize=7)
    fig.suptitle("Masked-autoencoder reconstruction of a held-out tile")
    return save(fig, output)


def classification(maps: list[str], output: str) -> Path:
    """Ground truth, each run's predicted class map (every labelled pixel) and its test-set
    confusion matrix (row-normalised)."""
    runs = load_runs(maps, "classification map")
    first = next(iter(runs.values()))
    names = [str(n) for n in first["class_names"]]
    k = len(names)
    cmap = plt.get_cmap("tab20", k + 1).copy()
    cmap.set_bad("white")  # unlabelled pixels
    n = len(runs)
    fig, axes = plt.subplots(2, n + 1, figsize=(3.6 * (n + 1), 7), squeeze=False)
    axes[0][0].imshow(
        np.ma.masked_equal(first["truth"], 0), cmap=cmap, vmin=-0.5, vmax=k + 0.5, interpolation="nearest"
    )
    axes[0][0].set(title="ground truth")
    split_colours = ["white", "#66c2a5", "#fc8d62", "#8da0cb"]  # unlabelled, train, val, test
    axes[1][0].imshow(
        first["split"] + 1,
        cmap=matplotlib.colors.ListedColormap(split_colours),
        vmin=-0.5,
        vmax=3.5,
        interpolation="nearest",
    )
    axes[1][0].legend(
        [plt.Rectangle((0, 0), 1, 1, color=c) for c in split_colours[1:]],
        ["train", "val", "test"],
        fontsize=7,
        loc="upper right",
    )
    axes[1][0].set(title="split of the labelled pixels")
    for j, (name, d) in enumerate(runs.items()):
        axes[0][j + 1].imshow(
            np.ma.masked_equal(d["pred"], 0), cmap=cmap, vmin=-0.5, vmax=k + 0.5, interpolation="nearest"
        )
        axes[0][j + 1].set(title=f"predicted: {name}")
        cm = d["confusion"].astype(np.float64)
        norm = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
        ax = axes[1][j + 1]
        ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
        for (r, c), v in np.ndenumerate(cm):
            ax.text(c, r, f"{int(v)}", ha="center", va="center", fontsize=7, color="w" if norm[r, c] > 0.5 else "k")
        ax.set(title=f"test confusion: {name}", xlabel="predicted", ylabel="true", xticks=range(k), yticks=range(k))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
        ax.set_yticklabels(names, fontsize=7)
    for ax in (axes[0][0], axes[1][0], *axes[0][1:]):
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i + 1)) for i in range(k)]
    fig.legend(handles, names, loc="lower center", ncol=min(k, 6), fontsize=8)
    fig.suptitle("Hyperspectral classification")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save(fig, output)


def foundation(scores: list[str], output: str) -> Path:
    """The foundation-model experiment: test overall accuracy and kappa of classification
    trained from scratch, fine-tuned from an MAE model and as a linear probe of it, per model
    variant. ``scores``: VARIANT:START=JSON words (evaluate-classification results); the table beside
    the figure (.csv)."""
    import json

    rows = []
    for word in scores:
        label, sep, path = word.partition("=")
        variant, sep2, start = label.partition(":")
        if not sep or not sep2:
            raise InputError(f"figure foundation takes VARIANT:START=SCORES.json words, got {word!r}")
        if not Path(path).exists():
            raise InputError(f"score file not found: {path}")
        d = json.loads(Path(path).read_text())
        rows.append(
            {
                "variant": variant,
                "start": start,
                "run": d["run"],
                "overall_accuracy": d["overall_accuracy"],
                "average_accuracy": d["average_accuracy"],
                "kappa": d["kappa"],
            }
        )
    table = pd.DataFrame(rows)
    starts = list(dict.fromkeys(table.start))
    variants = list(dict.fromkeys(table.variant))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    width = 0.8 / len(starts)
    for ax, metric in zip(axes, ("overall_accuracy", "kappa")):
        for k, start in enumerate(starts):
            part = table[table.start == start].set_index("variant").reindex(variants)
            x = np.arange(len(variants)) + (k - (len(starts) - 1) / 2) * width
            ax.bar(x, part[metric].values, width, label=start, color=color(start, k))
        ax.set_xticks(np.arange(len(variants)), variants)
        ax.set_ylim(0, 1)
        ax.set_title(f"test {metric.replace('_', ' ')}")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("classification: from scratch vs. fine-tuned from MAE vs. linear probe (equal steps)")
    out = Path(output)
    from ..store import atomic_path

    with atomic_path(out.with_suffix(".csv")) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    return save(fig, out)
