"""`dchag advise`: which parallel strategy pays off on this cluster, and why.

For each strategy the cost model (costmodel.py) predicts per-GPU compute, intra- and
inter-node communication and memory; the benefit ratio against data parallelism is
R = (T_step_dp - T_step) / T_comp_dp — the seed article's (T_comm_base - T_comm_new) /
T_comp_step when the strategy leaves compute unchanged. The regime is read off the
data-parallel step: compute-bound when communication is under 10 % of compute; otherwise
latency-bound when the per-message latency part of the communication exceeds the bandwidth
part, else communication-bound. The recommendation is the fastest strategy that fits in
memory, adopted only if it beats data parallelism by more than 5 % (the verification
experiment's rule); otherwise stay with data parallelism.

Every strategy is predicted with the channel tokens and with the fused front end
(``model.fused_front_end``; the TP baseline takes the tokens either way), so the table shows
D-CHAG, the fused front end without it (one model per GPU) and both together.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from .. import jsonio
from ..store import atomic_path
from ..vocabulary import VARIANTS, Strategy
from .costmodel import STRATEGIES, Prediction, article_ratio, predict
from .hardware import Compute, Hardware
from .workload import Workload

ADOPT_THRESHOLD = 0.05
LOSSY = {
    "rotation": "a subset of the channel groups per step",
    "compress-int8-ef": "8-bit gradients",
    "compress-fp16": "16-bit gradients",
    "fixed-group": "another aggregation than the model's",
}


def regime(dp: Prediction, latency_s: float) -> str:
    if dp.comm_s < 0.1 * dp.compute_s:
        return "compute-bound"
    return "latency-bound" if latency_s > dp.comm_s - latency_s else "communication-bound"


def advise(
    w: Workload,
    hw: Hardware,
    gpus: int,
    gpus_per_node: int,
    rate: Compute | float,
    memory_bytes: float | None = None,
    strategies: tuple[str, ...] = STRATEGIES,
) -> dict:
    rows = _predictions(w, hw, gpus, gpus_per_node, rate, strategies)
    w = replace(w, fused=False)  # data parallelism as it is usually run: the reference
    dp = next(r for r, fused in rows if r.strategy == "dp" and not fused)
    latency_only = predict(
        w, replace(hw, intra_bw=float("inf"), inter_bw=float("inf")), gpus, gpus_per_node, "dp", rate
    )
    reg = regime(dp, latency_only.comm_s)
    table = [_table_row(r, fused, dp, memory_bytes) for r, fused in rows]
    reasons = [
        f"data parallelism: compute {dp.compute_s * 1e3:.1f} ms, communication {dp.comm_s * 1e3:.1f} ms "
        f"({dp.comm_inter_s * 1e3:.1f} ms between nodes) per step: {reg}"
    ]
    reasons += _front_end_comparison(table, memory_bytes)
    chosen = _choose(table, memory_bytes, reasons)
    choice = chosen["strategy"] if chosen else None
    if choice in LOSSY:
        check = "a run with train.rotation set" if choice == "rotation" else "`snakemake verify`"
        reasons.append(
            f"{choice} changes what each step computes ({LOSSY[choice]}): compare its validation loss with "
            f"data parallelism's ({check}) before adopting it"
        )
    if reg == "latency-bound":
        reasons.append(
            "latency-bound: fewer synchronisations help most (larger buckets, gradient accumulation, local SGD)"
        )
    return {
        "regime": reg,
        "recommendation": choice,
        "fused_front_end": bool(chosen and chosen["front_end"] == "fused"),  # model.fused_front_end for it
        "reasons": reasons,
        "table": table,
        "inputs": {
            "gpus": gpus,
            "gpus_per_node": gpus_per_node,
            "alpha_s": hw.alpha,
            "intra_bw": hw.intra_bw,
            "inter_bw": hw.inter_bw,
            "compute": asdict(rate) if isinstance(rate, Compute) else {"flops_per_s": rate},
            "memory_gb": memory_bytes / 1e9 if memory_bytes else None,
            "workload": w.__dict__,
        },
    }


def _predictions(
    w: Workload, hw: Hardware, gpus: int, gpus_per_node: int, rate, strategies: tuple[str, ...]
) -> list[tuple[Prediction, bool]]:
    """Each strategy's prediction with the token front end and (but tp's) the fused one; a
    layout that cannot be built is a row of NaNs with the reason as its note."""
    rows = []
    for s in strategies:
        for fused in (False, True) if s != "tp" else (False,):
            try:
                rows.append((predict(replace(w, fused=fused), hw, gpus, gpus_per_node, s, rate), fused))
            except ValueError as err:
                nan = float("nan")
                rows.append((Prediction(s, 0, nan, nan, nan, nan, str(err)), fused))
    return rows


def _table_row(r: Prediction, fused: bool, dp: Prediction, memory_bytes: float | None) -> dict:
    """A prediction as a row of the advice's table, its benefit R against data parallelism."""
    return {
        "strategy": r.strategy,
        "front_end": "fused" if fused else "tokens",
        "tp": r.tp,
        "compute_s": r.compute_s,
        "comm_intra_s": r.comm_intra_s,
        "comm_inter_s": r.comm_inter_s,
        "step_s": r.step_s,
        "memory_gb": r.memory_bytes / 1e9,
        "R_vs_dp": (dp.step_s - r.step_s) / dp.compute_s,
        "fits": memory_bytes is None or r.memory_bytes <= memory_bytes,
        "note": r.note,
    }


def _choose(table: list[dict], memory_bytes: float | None, reasons: list[str]) -> dict | None:
    """The row to recommend: the fastest that fits where it beats data parallelism by more than
    ADOPT_THRESHOLD (or data parallelism does not fit), else data parallelism; appends why."""
    candidates = [t for t in table if t["fits"] and t["step_s"] == t["step_s"]]
    best = min(candidates, key=lambda t: t["step_s"]) if candidates else None
    # the fused front end computes the same function: data parallelism with it is still plain
    # data parallelism, and the reference a strategy has to beat when it is the faster
    dp_rows = [t for t in table if t["strategy"] == "dp" and t["step_s"] == t["step_s"]]
    dp_row = min([t for t in dp_rows if t["fits"]] or dp_rows[:1], key=lambda t: t["step_s"])
    if not dp_row["fits"]:
        reasons.append(
            f"data parallelism needs {dp_row['memory_gb']:.1f} GB per GPU, "
            f"more than the {memory_bytes / 1e9:.1f} GB available"
        )
    if best is None:
        reasons.append("no strategy fits in memory: use more GPUs, FSDP across more ranks, or a smaller model/batch")
        return None
    if best is not dp_row and (
        not dp_row["fits"] or (dp_row["step_s"] - best["step_s"]) / dp_row["step_s"] > ADOPT_THRESHOLD
    ):
        gain = (dp_row["step_s"] - best["step_s"]) / dp_row["step_s"]
        reasons.append(
            f"{_layout(best)} is the fastest that fits: step {best['step_s'] * 1e3:.1f} ms vs "
            f"{dp_row['step_s'] * 1e3:.1f} ms for {_layout(dp_row)} ({gain:+.0%} time saved), R = {best['R_vs_dp']:.3f}"
        )
        return best
    chosen = dp_row if dp_row["fits"] else best
    reasons.append(f"no strategy beats data parallelism by more than {ADOPT_THRESHOLD:.0%}: keep {_layout(chosen)}")
    return chosen


def _layout(row: dict) -> str:
    return row["strategy"] + (" with the fused front end" if row["front_end"] == "fused" else "")


def _front_end_comparison(table: dict, memory_bytes: float | None) -> list[str]:
    """One line: the fastest D-CHAG layout with channel tokens, the fused front end without
    D-CHAG, and both together — step time, memory, whether it fits."""
    dchag = {v.cost_model for v in VARIANTS.values() if v.strategy == Strategy.DCHAG and v.cost_model}
    groups = {
        "D-CHAG": [t for t in table if t["strategy"] in dchag and t["front_end"] == "tokens"],
        "the fused front end without D-CHAG": [
            t for t in table if t["strategy"] not in dchag | {"tp"} and t["front_end"] == "fused" and not t["note"]
        ],
        "both": [t for t in table if t["strategy"] in dchag and t["front_end"] == "fused"],
    }
    parts = []
    for name, rows in groups.items():
        rows = [t for t in rows if t["step_s"] == t["step_s"]]
        if not rows:
            continue
        fit = [t for t in rows if t["fits"]]
        t = min(fit or rows, key=lambda t: t["step_s"])
        room = "" if memory_bytes is None else (" (fits)" if t["fits"] else " (does not fit)")
        parts.append(f"{name}: {t['strategy']}, {t['step_s'] * 1e3:.1f} ms, {t['memory_gb']:.1f} GB{room}")
    return ["; ".join(parts)] if parts else []


def article(
    gradient_bytes: float, compute_s: float, hw: Hardware, gpus: int, gpus_per_node: int, delta_alpha: float
) -> dict:
    r = article_ratio(gradient_bytes, compute_s, hw, gpus, gpus_per_node, delta_alpha)
    latency = 2 * (gpus - 1) * hw.alpha
    reg = (
        "compute-bound"
        if r["t_comm_base_s"] < 0.1 * compute_s
        else "latency-bound"
        if latency > r["t_comm_base_s"] - latency
        else "communication-bound"
    )
    verdict = "adopt" if r["R"] > ADOPT_THRESHOLD else "not worth it"
    return {
        **r,
        "regime": reg,
        "recommendation": "hierarchical" if r["R"] > ADOPT_THRESHOLD else "flat",
        "reasons": [
            f"R = {r['R']:.3f} ({verdict}: threshold {ADOPT_THRESHOLD})",
            f"flat all-reduce {r['t_comm_base_s'] * 1e3:.1f} ms vs hierarchical {r['t_comm_new_s'] * 1e3:.1f} ms "
            f"(incl. Δα) against {compute_s * 1e3:.0f} ms of compute: {reg}",
        ],
    }


def hardware(
    profile: str | Path | None,
    alpha: float | None,
    intra_bw: float | None,
    inter_bw: float | None,
    gpus_per_node: int,
) -> Hardware:
    """The cluster: a profile from `dchag calibrate`, or its three numbers given by hand."""
    from ..config import ConfigError

    if profile:
        hw = Hardware.from_yaml(profile)
    elif None not in (alpha, intra_bw, inter_bw):
        hw = Hardware(alpha, intra_bw, inter_bw, gpus_per_node)
    else:
        raise ConfigError("give --hardware FILE (from `dchag calibrate`) or all of --alpha, --intra-bw and --inter-bw")
    hw.gpus_per_node = gpus_per_node
    return hw


def advise_config(
    model_config: str | Path,
    hw: Hardware,
    gpus: int,
    gpus_per_node: int,
    channels: int | None = None,
    batch: int | None = None,
    image: tuple[int, int] | None = None,
    flops_per_s: float | None = None,
    memory_bytes: float | None = None,
) -> dict:
    """:func:`advise` for the model of a config file, at the profile's measured rates (the
    matmul rate ``flops_per_s`` instead, where given)."""
    from ..config import ConfigError, load_config
    from .calibrate import workload_from_config

    w = workload_from_config(load_config(model_config), channels, batch, image)
    rate = Compute.from_measured(hw.measured)
    if flops_per_s:
        rate = replace(rate, flops_per_s=flops_per_s) if rate else Compute(flops_per_s)
    if rate is None:
        raise ConfigError("no compute rate: pass --flops-per-s, or a --hardware profile calibrated with --config")
    return advise(w, hw, gpus, gpus_per_node, rate, memory_bytes)


def format_table(result: dict) -> str:
    if "table" not in result:
        return "\n".join(
            [
                f"R = {result['R']:.4f}  regime: {result['regime']}  recommendation: {result['recommendation']}",
                *result["reasons"],
            ]
        )
    lines = [
        "| strategy | front end | TP | compute ms | comm intra ms | comm inter ms | step ms | memory GB/GPU | R vs DP "
        "| fits |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in result["table"]:
        lines.append(
            f"| {t['strategy']} | {t['front_end']} | {t['tp']} | {t['compute_s'] * 1e3:.2f} | "
            f"{t['comm_intra_s'] * 1e3:.2f} | "
            f"{t['comm_inter_s'] * 1e3:.2f} | {t['step_s'] * 1e3:.2f} | {t['memory_gb']:.2f} | {t['R_vs_dp']:+.3f} | "
            f"{'yes' if t['fits'] else 'no'}{' (' + t['note'] + ')' if t['note'] else ''} |"
        )
    lines += [
        "",
        "Front end: `tokens` forms the (B, C, L, D) channel tokens, as the paper's models do; `fused` is "
        "`model.fused_front_end: true`, the same function without them (the TP baseline splits its aggregation's "
        "heads and takes the tokens either way).",
        "",
        f"Regime: {result['regime']}. Recommendation: {result['recommendation']}"
        f"{' with model.fused_front_end: true' if result['fused_front_end'] else ''}.",
        *[f"- {r}" for r in result["reasons"]],
    ]
    return "\n".join(lines)


def write(result: dict, output: str | Path) -> Path:
    output = Path(output)
    with atomic_path(output) as tmp:
        if output.suffix == ".json":
            tmp.write_text(jsonio.dumps(result, indent=1))
        else:
            tmp.write_text(format_table(result) + "\n")
    return output
