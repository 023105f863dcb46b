"""Starting a run from a pretrained model (``train.runs.<run>.init_from``), and freezing parts.

The source is a model folder (``dchag export``; the pipeline exports a source run
to ``<run>/model`` first). Its weights go into the one-device model before it is
parallelized, each parameter as far as it fits:

* the tokenizer's per-channel rows (patch weights, bias, learned channel embedding) matched
  by channel name (ERA5) or by band centre (hyperspectral; the nearest source band within
  half the source's band spacing): matched rows are copied, the others keep their fresh
  initialisation (new channels); a patch kernel of another size is resized (area-preserving);
* the position embedding interpolated (bicubic) when the patch grid differs;
* the task's own parts (forecast head and lead-time embedding, MAE decoder, classifier head)
  only from a source of the same task and shape, else re-initialised;
* everything else (wavelength code projection, aggregation, ViT blocks, norms) copied where
  the shape is the same, else new.

:func:`initialise` returns what was loaded, resized and new; the trainer logs it and keeps
it in ``<run>/init.json``. ``train.freeze`` stops the gradient of whole parts; a linear probe
(``train.linear_probe``) freezes everything but the classifier head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import FREEZABLE
from ..errors import DchagError
from ..parallel.names import canonical
from ..runs import task_spec

HEADS = (
    "head.",
    "lead_time_embed.",
    "decoder_embed.",
    "decoder_blocks.",
    "decoder_norm.",
    "mask_token",
    "decoder_pos_embed",
)
PARTS = dict(
    zip(FREEZABLE, [("tokenizer.",), ("partial.", "final."), ("pos_embed", "blocks.", "norm."), HEADS], strict=True)
)
PER_CHANNEL = ("tokenizer.weight", "tokenizer.bias", "tokenizer.channel_embed")


class FineTuneError(DchagError, ValueError):
    """A source model that cannot start this run (another kind of data, nothing in common)."""


def channel_map(target: dict, source: dict) -> list[int | None]:
    """For each target channel, the source channel it takes its rows from (None: new).
    ``target``/``source``: {"names": [...]} (ERA5) or {"wavelengths": [...]} (bands)."""
    if "names" in target:
        if "names" not in source:
            raise FineTuneError("the source model reads bands, this run reads named ERA5 channels")
        where = {n: i for i, n in enumerate(source["names"])}
        return [where.get(n) for n in target["names"]]
    if "wavelengths" not in source:
        raise FineTuneError("the source model reads named ERA5 channels, this run reads bands")
    src = torch.tensor([float("nan") if v is None else v for v in source["wavelengths"]], dtype=torch.float64)
    tgt = [float("nan") if v is None else v for v in target["wavelengths"]]
    known = ~torch.isnan(src)
    if not known.any() and all(v != v for v in tgt):  # no centres anywhere: by position, same count only
        return list(range(len(tgt))) if len(tgt) == src.numel() else [None] * len(tgt)
    # a band without a centre on either side matches nothing (its position says nothing)
    centres = torch.sort(src[known]).values
    spacing = float(torch.diff(centres).abs().median()) if centres.numel() > 1 else 1.0
    d_all = torch.where(known, src, torch.tensor(float("inf"), dtype=torch.float64))
    out = []
    for wl in tgt:
        if wl != wl:
            out.append(None)
            continue
        d = (d_all - wl).abs()
        j = int(d.argmin())
        out.append(j if float(d[j]) <= spacing / 2 else None)
    return out


def _resize_kernel(w: torch.Tensor, p_src: int, p_tgt: int) -> torch.Tensor:
    """(C, D, p_src^2) patch weights -> (C, D, p_tgt^2) responding alike to a constant patch."""
    c, d, _ = w.shape
    k = w.reshape(c * d, 1, p_src, p_src)
    mode = "area" if p_tgt < p_src else "bilinear"
    r = F.interpolate(k, size=(p_tgt, p_tgt), mode=mode, **({} if mode == "area" else {"align_corners": False}))
    return (r * (p_src**2 / p_tgt**2)).reshape(c, d, p_tgt * p_tgt)


def _resize_pos(pos: torch.Tensor, src_grid: tuple[int, int], tgt_grid: tuple[int, int]) -> torch.Tensor:
    d = pos.shape[-1]
    grid = pos.reshape(1, *src_grid, d).permute(0, 3, 1, 2)
    out = F.interpolate(grid, size=tgt_grid, mode="bicubic", align_corners=False)
    return out.permute(0, 2, 3, 1).reshape(1, tgt_grid[0] * tgt_grid[1], d)


def initialise(model: nn.Module, target: dict, source, same_task: bool) -> dict:
    """Load ``source`` (a :class:`dchag.model.folder.Model`) into the one-device ``model``
    as far as it fits; ``target`` describes this run's channels ({"names"} or
    {"wavelengths"}). Returns {"loaded": [...], "resized": [...], "new": [...], "channels":
    {...}}; raises FineTuneError if nothing but fresh parameters would remain."""
    src = {k: v for k, v in source.weights().items()}
    src_cfg, tgt_cfg = source.config, model.cfg
    if "names" in target:
        src_channels = {"names": source.channel_names()}
    else:
        src_channels = {"wavelengths": source.meta["bands"]["wavelength"]}
    rows = channel_map(target, src_channels)
    matched = [(i, j) for i, j in enumerate(rows) if j is not None]
    # an MAE head reconstructs each channel: it fits only the same channels in the same order
    same_outputs = not task_spec(source.task).masked or rows == list(range(source.config.in_channels))
    report = {"loaded": [], "resized": [], "new": []}
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = canonical(name)
            if key.startswith(HEADS) and not same_task:
                report["new"].append(f"{key} (the source is a {source.task} model)")
                continue
            if key.startswith("head.") and not same_outputs:
                report["new"].append(f"{key} (the source reconstructs other channels)")
                continue
            if key in PER_CHANNEL:
                if key not in src:
                    report["new"].append(f"{key} (not in the source)")
                    continue
                value = src[key]
                if key == "tokenizer.weight" and src_cfg.patch_size != tgt_cfg.patch_size:
                    value = _resize_kernel(value, src_cfg.patch_size, tgt_cfg.patch_size)
                    report["resized"].append(f"{key}: patch {src_cfg.patch_size} -> {tgt_cfg.patch_size}")
                if value.shape[1:] != p.shape[1:]:
                    report["new"].append(f"{key} (other width: {tuple(value.shape)} vs {tuple(p.shape)})")
                    continue
                for i, j in matched:
                    p[i].copy_(value[j])
                report["loaded"].append(f"{key}: {len(matched)} of {p.shape[0]} channels")
                continue
            if key not in src:
                report["new"].append(f"{key} (not in the source)")
                continue
            value = src[key]
            if tuple(value.shape) == tuple(p.shape):
                p.copy_(value)
                report["loaded"].append(key)
            elif key == "pos_embed" and value.shape[-1] == p.shape[-1]:
                p.copy_(_resize_pos(value, src_cfg.grid, tgt_cfg.grid))
                report["resized"].append(f"{key}: grid {tuple(src_cfg.grid)} -> {tuple(tgt_cfg.grid)}")
            else:
                report["new"].append(f"{key} (source {tuple(value.shape)}, here {tuple(p.shape)})")
    names = target.get("names") or [f"{w:g} nm" for w in target["wavelengths"]]
    report["channels"] = {
        "matched": len(matched),
        "of": len(rows),
        "by": "name" if "names" in target else "band centre",
        "new": [names[i] for i, j in enumerate(rows) if j is None],
    }
    if not report["loaded"] and not report["resized"]:
        raise FineTuneError(f"{source.source}: no parameter of it fits this model; nothing to start from")
    return report


def freeze(model: nn.Module, parts: list[str]) -> list[str]:
    """Stop the gradient of every parameter of ``parts`` (keys of :data:`PARTS`); returns the
    frozen names."""
    prefixes = tuple(p for part in parts for p in PARTS[part])
    frozen = []
    for name, p in model.named_parameters():
        if canonical(name).startswith(prefixes):
            p.requires_grad_(False)
            frozen.append(canonical(name))
    return frozen


def frozen_parts(train) -> list[str]:
    """The parts a run freezes: train.freeze, or for a linear probe everything but the head."""
    if train.linear_probe:
        return ["tokenizer", "aggregation", "blocks"]
    return list(train.freeze)


def describe(report: dict) -> list[str]:
    ch = report["channels"]
    new = ", ".join(ch["new"][:12]) + (" …" if len(ch["new"]) > 12 else "")
    lines = [
        f"init_from: loaded {len(report['loaded'])}, resized {len(report['resized'])}, new {len(report['new'])} "
        f"tensors; channels by {ch['by']}: {ch['matched']} of {ch['of']} from the source"
        + (f", new: {new}" if ch["new"] else "")
    ]
    lines += [f"  loaded  {x}" for x in report["loaded"]]
    lines += [f"  resized {x}" for x in report["resized"]]
    lines += [f"  new     {x}" for x in report["new"]]
    return lines
