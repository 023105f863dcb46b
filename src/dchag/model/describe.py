"""Parameter counts per part of the model, for the baseline and each D-CHAG variant."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..vocabulary import MODEL_VARIANTS, VARIANTS, Aggregation, Strategy
from .model import ChannelViT, ModelConfig

PARTS = ("tokenizer", "partial aggregators", "final aggregation", "backbone", "head")


def _part(name: str) -> str:
    if name.startswith("tokenizer."):
        return "tokenizer"
    if name.startswith("partial."):
        return "partial aggregators"
    if name.startswith("final."):
        return "final aggregation"
    if name.startswith(("pos_embed", "blocks.", "norm.")):
        return "backbone"
    return "head"


def count_parameters(model: nn.Module) -> dict[str, int]:
    counts = dict.fromkeys(PARTS, 0)
    for name, p in model.named_parameters():
        if p.requires_grad:
            counts[_part(name)] += p.numel()
    counts["total"] = sum(counts[p] for p in PARTS)
    return counts


def variants(cfg: ModelConfig, groups: int) -> list[tuple[str, ModelConfig]]:
    """The baseline and the D-CHAG variants (-L/-C, Tree0 and every TreeK that divides the groups)."""
    out = [("baseline", replace(cfg, aggregation="baseline", groups=1, tree=0))]
    smallest_group = cfg.in_channels // groups
    for v in (VARIANTS[n] for n in MODEL_VARIANTS if VARIANTS[n].strategy == Strategy.DCHAG):
        kind, label = v.aggregation, v.label
        for tree in (0, 2, 4, 8):
            if tree and (smallest_group % tree or cfg.in_channels % groups):
                continue
            out.append((f"{label} Tree{tree}", replace(cfg, aggregation=kind, groups=groups, tree=tree)))
    return out


def describe(cfg: ModelConfig, groups: int) -> list[dict]:
    rows = []
    for label, vcfg in variants(cfg, groups):
        counts = count_parameters(ChannelViT(vcfg))
        per_group = counts["partial aggregators"] // groups if vcfg.aggregation != Aggregation.BASELINE else 0
        rows.append({"variant": label, **counts, "partial aggregator per group": per_group})
    return rows


def format_table(rows: list[dict], cfg: ModelConfig, groups: int) -> str:
    cols = ["variant", *PARTS, "partial aggregator per group", "total"]
    head = (
        f"{cfg.in_channels} channels, {groups} groups (= tensor-parallel ranks under D-CHAG), image {cfg.img_size}, "
        f"patch {cfg.patch_size}, width {cfg.embed_dim}, depth {cfg.depth}, heads {cfg.num_heads}, task {cfg.task}"
    )
    widths = [max(len(c), *(len(f"{r[c]:,}" if isinstance(r[c], int) else r[c]) for r in rows)) for c in cols]
    lines = [head, "", "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    for r in rows:
        lines.append("  ".join((f"{r[c]:,}" if isinstance(r[c], int) else r[c]).rjust(w) for c, w in zip(cols, widths)))
    return "\n".join(lines)
