"""The paper's memory table from dchag's own model at the paper's scale, measured on fake tensors
(`dchag estimate-memory`'s measurement), and the overhead model from tensor peak to the
allocator's reservation fitted to it.

    python benchmarks/paper_memory_fake.py \
        --output benchmarks/results/paper_memory_fake

Every published memory number of a whole model (the full-model table and the TreeK rows of
src/dchag/paper/published.py; the front-end-alone ablations are not whole training runs and are
left out) is one point: dchag's model at the paper's settings (published.FIXED: depth 32, 128 x
256, patch 4, batch 2, bf16; heads = width / 128; activation checkpointing; the channel tokens
formed, not the fused front end, as the paper's models do; one TP group, rank 0), forward,
backward and two AdamW steps. The overhead model reserved = scale x peak + fixed is fitted by
least squares to the points of ``--fit`` (default: the 1.7B rows) and its error reported on the
rest. Paper numbers are read as GiB, as benchmarks/paper_memory.py reads them. A run of every
point (or ``--report`` of one) writes the fit to the package's src/dchag/bench/fits.json
(``--fits``), which dchag.benefit.fakemem.OVERHEAD reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dchag.bench import fits, results  # noqa: E402
from dchag.benefit import fakemem  # noqa: E402
from dchag.checks import check_run  # noqa: E402
from dchag.config import load_config, settings  # noqa: E402
from dchag.paper import published  # noqa: E402
from dchag.vocabulary import VARIANTS  # noqa: E402

GIB = 2**30
REPO = Path(__file__).resolve().parents[1]


def points() -> list[published.Published]:
    return [
        n
        for n in published.NUMBERS
        if n.metric == "memory_gb" and n.figure in ("full_models", "tree") and not (n.figure == "tree" and n.tree == 0)
    ]


def measure(n: published.Published) -> dict:
    """dchag's model at published point ``n``, rank 0 of one TP group."""
    f, v = published.FIXED, VARIANTS[n.variant]
    cfg = copy.deepcopy(load_config(str(REPO / "config" / "demo.yaml")))  # its era5 section: a forecasting task
    cfg["model"] = {
        "embed_dim": n.width,
        "depth": f["depth"],
        "num_heads": n.width // published.HEADS_PER_WIDTH,
        "patch_size": f["patch"],
        "aggregation": str(v.aggregation),
        "tree": n.tree,
        "fused_front_end": False,
    }
    cfg["parallel"] = {
        "tp": n.tp,
        "strategy": str(v.strategy),
        "data_parallel": "none",
        "precision": f["precision"],
        "activation_checkpointing": True,
    }
    cfg["train"].update(nproc=n.tp, batch_size=f["batch"], mem_mb=10**9, runs={"p": {"task": "forecast"}})
    run = check_run(settings(cfg), "p", world_size=n.tp)
    t0 = time.perf_counter()
    r = fakemem.estimate(run, fakemem.model_of(run, n.channels, f["image"]), f["batch"], n.tp)
    r["seconds"] = time.perf_counter() - t0
    return r


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", default="benchmarks/results/paper_memory_fake")
    ap.add_argument("--fit", default="1.7B", help="the model (published.WIDTH_LABEL) whose rows fit the overhead model")
    ap.add_argument("--limit", type=int, help="measure only the first N points (a quick check)")
    ap.add_argument("--report", metavar="JSON", help="measure nothing: fit and report a run's rows again")
    ap.add_argument(
        "--fits",
        default=str(fits.FITS),
        help="where the overhead fit goes (default: the package's, dchag.benefit.fakemem reads it)",
    )
    args = ap.parse_args(argv)
    out = Path(args.output)
    if args.report:
        earlier = json.loads(Path(args.report).read_text())
        rows, command = earlier["rows"], earlier["command"]
        for r in rows:
            r["fit"] = r["model"] == args.fit
    else:
        rows = [row(n, args.fit) for n in points()[: args.limit]]
        command = results.command(None if argv is None else ["benchmarks/paper_memory_fake.py", *argv])
    summary = fitted(rows, args.fit)
    results.write(out, {"command": command, **summary, "rows": rows}, report(rows, summary, command))
    print(report(rows, summary, command))
    if not args.limit:
        source = Path(args.report) if args.report else out.with_suffix(".json")
        value = {"source": str(source), "fitted_on": args.fit, **fits.rounded_overhead(summary)}
        fits.write("fake_memory_overhead", value, Path(args.fits))


def row(n: published.Published, fit_label: str) -> dict:
    r = measure(n)
    label = published.WIDTH_LABEL[n.width]
    out = {
        "figure": n.figure,
        "model": label,
        "width": n.width,
        "channels": n.channels,
        "tp": n.tp,
        "variant": n.variant,
        "tree": n.tree,
        "paper_gib": n.value,
        "peak_gib": r["peak"] / GIB,
        **{f"{k}_gib": r[k] / GIB for k in fakemem.KINDS},
        "seconds": r["seconds"],
        "fit": label == fit_label,
    }
    print(json.dumps(out), flush=True)
    return out


def fitted(rows: list[dict], fit_label: str) -> dict:
    """The overhead fitted to the rows marked ``fit`` (dchag.bench.fits.overhead), each row's
    reservation and error under it, and the errors' summary."""
    fit = fits.overhead([r for r in rows if r["fit"]])
    for r in rows:
        r["reserved_gib"] = fit["scale"] * r["peak_gib"] + fit["fixed_gib"]
        r["error"] = r["reserved_gib"] / r["paper_gib"] - 1
    held = [abs(r["error"]) for r in rows if not r["fit"]]
    return {
        **fit,
        "fitted_on": fit_label,
        "median_abs_error_held_out": statistics.median(held) if held else None,
        "max_abs_error_held_out": max(held) if held else None,
        "median_abs_error_fit": statistics.median(abs(r["error"]) for r in rows if r["fit"]),
    }


def report(rows: list[dict], summary: dict, command: str) -> str:
    scale, fixed = summary["scale"], summary["fixed_gib"]
    lines = [
        "# The paper's memory table from dchag's model on fake tensors",
        "",
        f"Command: `{command}`  ",
        "Each point: dchag's model at the paper's settings (depth 32, 128x256, patch 4, batch 2, bf16, heads = "
        "width/128, activation checkpointing, channel tokens), one TP group, rank 0, forward + backward + two AdamW "
        "steps on fake tensors (src/dchag/benefit/fakemem.py). Paper: src/dchag/paper/published.py, read as GiB.  ",
        f"Overhead model fitted on the {summary['fitted_on']} rows: reserved = {scale:.3f} x peak + {fixed:.2f} GiB. "
        f"Held-out rows: median |error| {_pct(summary['median_abs_error_held_out'])}, worst "
        f"{_pct(summary['max_abs_error_held_out'])}; fitted rows: median {_pct(summary['median_abs_error_fit'])}.",
        "",
        "| figure | model | channels | TP | variant | tree | params | grads | optim | act | temp | peak | reserved "
        "| paper | error | fit | s |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['figure']} | {r['model']} | {r['channels']} | {r['tp']} | {r['variant']} | {r['tree']} | "
            f"{r['parameters_gib']:.2f} | {r['gradients_gib']:.2f} | {r['optimizer_gib']:.2f} | "
            f"{r['activations_gib']:.2f} | {r['temporaries_gib']:.2f} | {r['peak_gib']:.2f} | "
            f"{r['reserved_gib']:.2f} | {r['paper_gib']:.2f} | {r['error']:+.1%} | {'x' if r['fit'] else ''} | "
            f"{r['seconds']:.0f} |"
        )
    lines.append("")
    lines.append(
        "GiB per rank. params / grads / optim: the rank's whole parameters, gradients, AdamW state; act / temp: "
        "activations and temporaries at the tensor peak."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
