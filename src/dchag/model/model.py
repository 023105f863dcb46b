"""The channel-aggregating ViT, for one device; reads top to bottom like the paper's figure.

    x (B, C, H, W)
      -> ChannelTokenizer            per-channel patch embedding + channel embedding (B, C, L, D)
      -> aggregation
           baseline:     one query cross-attends over all C channels                  (B, L, D)
           hierarchical: G contiguous groups, a partial aggregator per group (-L / -C,
                         Tree0 / TreeK) -> (B, G, L, D), then a final cross-attention  (B, L, D)
      -> + position embedding (+ lead-time embedding for forecasting)
      -> ViT blocks -> norm -> task head (forecast / masked autoencoder / classifier)

D-CHAG is not a second model: ``dchag.parallel`` keeps group r's channels and partial
aggregator on tensor-parallel rank r and sets ``group_gather`` to one AllGather.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..vocabulary import Aggregation, Task
from .layers import Block, ChannelTokenizer, ModelError, PartialAggregator, QueryAggregator, sincos_2d

AGGREGATIONS = tuple(Aggregation)
TASKS = tuple(Task)


@dataclass
class ModelConfig:
    """The model's shape. The settings come from the config's ``model`` section (built by
    ``dchag.model.build.model_config``: no defaults here), the sizes from the data."""

    in_channels: int
    img_size: tuple[int, int]
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    aggregation: str  # dchag.vocabulary.Aggregation
    groups: int  # channel groups of the hierarchical aggregation (= TP size under D-CHAG)
    tree: int  # TreeK inside each group; 0 = flat
    task: str  # dchag.vocabulary.Task
    decoder_dim: int
    decoder_depth: int
    decoder_heads: int
    fused_front_end: bool  # aggregate from the pixels without channel tokens (dchag.model.fused)
    out_channels: list[int] = field(default_factory=list)  # forecast: predicted channel indices (empty: all)
    num_classes: int = 0  # classification
    wavelengths: list[float] | None = None  # band centres (nm), embedded by wavelength when given

    def __post_init__(self):
        self.img_size = tuple(self.img_size)
        h, w = self.img_size
        if h % self.patch_size or w % self.patch_size:
            raise ModelError(f"image size {self.img_size} is not divisible by patch_size {self.patch_size}")
        if self.aggregation not in AGGREGATIONS:
            raise ModelError(f"model.aggregation {self.aggregation!r}: expected one of {', '.join(AGGREGATIONS)}")
        if self.task not in TASKS:
            raise ModelError(f"model.task {self.task!r}: expected one of {', '.join(TASKS)}")
        if self.aggregation != Aggregation.BASELINE and not 1 <= self.groups <= self.in_channels:
            raise ModelError(f"model.groups {self.groups} must be between 1 and the {self.in_channels} input channels")
        HEADS[self.task].check(self)
        if self.wavelengths is not None and len(self.wavelengths) != self.in_channels:
            raise ModelError(f"{len(self.wavelengths)} wavelengths for {self.in_channels} channels")

    @property
    def grid(self) -> tuple[int, int]:
        return (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]


def channel_groups(num_channels: int, groups: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) blocks; the first ``num_channels % groups`` get one more."""
    base, extra = divmod(num_channels, groups)
    bounds, start = [], 0
    for g in range(groups):
        stop = start + base + (g < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


class ChannelViT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.embed_dim
        self.tokenizer = ChannelTokenizer(cfg.in_channels, d, cfg.patch_size, cfg.wavelengths)
        if cfg.aggregation == Aggregation.BASELINE:
            self.groups: list[tuple[int, int]] = []
            self.partial = None
        else:
            self.groups = channel_groups(cfg.in_channels, cfg.groups)
            self.partial = nn.ModuleDict(
                {
                    str(g): PartialAggregator(cfg.aggregation, hi - lo, d, cfg.num_heads, cfg.tree)
                    for g, (lo, hi) in enumerate(self.groups)
                }
            )
        self.final = QueryAggregator(d, cfg.num_heads)
        # Groups this module holds, as (key, start, stop) in the channels it is given; all of
        # them on one device. D-CHAG narrows this to one group and installs the AllGather.
        self.local_groups = [(str(g), lo, hi) for g, (lo, hi) in enumerate(self.groups)]
        self.group_gather: Callable[[torch.Tensor], torch.Tensor] | None = None
        # The baseline's one aggregation absorbs the tokenizer unless tensor parallelism splits
        # its heads over ranks (the TP baseline: it then takes the tokens, as the paper's does).
        self.fused_final = cfg.fused_front_end and self.partial is None

        self.pos_embed = nn.Parameter(sincos_2d(*cfg.grid, d)[None])
        self.blocks = nn.ModuleList([Block(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(d)
        HEADS[cfg.task].build(self, cfg)

    # -- front end: tokenization and channel aggregation --------------------------------------
    def aggregate(self, x: torch.Tensor, active_groups: list[int] | None = None) -> torch.Tensor:
        """(B, C_held, H, W) -> (B, L, D). With ``active_groups`` (channel-subset rotation, one
        device) only those groups' channels are tokenized and aggregated."""
        if active_groups is not None and (self.partial is None or self.group_gather is not None):
            raise ModelError("channel-subset rotation needs a hierarchical model on one device (no D-CHAG gather)")
        b = x.shape[0]
        if self.partial is None:
            if self.fused_final:
                return self.final.absorbed(*self.tokenizer(x, absorbed=True)).reshape(b, -1, self.cfg.embed_dim)
            return self.final(self.tokenizer(x))
        # Each group is tokenized on its own: its tokens are contiguous for its aggregator, and
        # no full-size token tensor is sliced (whose gradient would be zero-filled per group).
        # The fused front end forms no tokens at all: each partial aggregation absorbs the tokenizer.
        parts = torch.stack(
            [
                self.partial[key].absorbed(*self.tokenizer(x[:, lo:hi], slice(lo, hi), absorbed=True), b)
                if self.cfg.fused_front_end
                else self.partial[key](self.tokenizer(x[:, lo:hi], slice(lo, hi)))
                for key, lo, hi in self.local_groups
                if active_groups is None or int(key) in active_groups
            ],
            dim=1,
        )
        if self.group_gather is not None:
            parts = self.group_gather(parts)
        return self.final(parts)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            tokens = block(tokens)
        return self.norm(tokens)

    def unpatchify(self, patches: torch.Tensor, channels: int) -> torch.Tensor:
        """(B, L, channels * p * p) -> (B, channels, H, W)."""
        b = patches.shape[0]
        gh, gw = self.cfg.grid
        p = self.cfg.patch_size
        x = patches.reshape(b, gh, gw, channels, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, channels, gh * p, gw * p)

    # -- tasks ------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        lead_time_hours: torch.Tensor | None = None,
        ids_keep: torch.Tensor | None = None,
        active_groups: list[int] | None = None,
    ):
        tokens = self.aggregate(x, active_groups) + self.pos_embed
        return HEADS[self.cfg.task].forward(self, tokens, lead_time_hours, ids_keep)


# -- the task heads: what each task adds to the encoder (parameters on the model itself, so
# their names are the model's: head.*, lead_time_embed.*, decoder_*) -------------------------
class ForecastHead:
    """Lead-time embedding added to the tokens; an MLP to each output channel's patch pixels."""

    @staticmethod
    def check(cfg: ModelConfig) -> None:
        if not cfg.out_channels:
            cfg.out_channels = list(range(cfg.in_channels))

    @staticmethod
    def build(model: ChannelViT, cfg: ModelConfig) -> None:
        d = cfg.embed_dim
        model.lead_time_embed = nn.Linear(1, d)
        model.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, len(cfg.out_channels) * cfg.patch_size**2))

    @staticmethod
    def forward(model: ChannelViT, tokens, lead_time_hours, ids_keep):
        if lead_time_hours is None:
            raise ModelError("a forecasting model needs lead_time_hours")
        lead = model.lead_time_embed(lead_time_hours.to(tokens.dtype)[:, None] / 100.0)  # ClimaX scaling
        return model.unpatchify(model.head(model.encode(tokens + lead[:, None, :])), len(model.cfg.out_channels))


class MaeHead:
    """Encode the kept patches, decode every patch (MAE's decoder): (B, C, H, W) reconstruction."""

    @staticmethod
    def check(cfg: ModelConfig) -> None:
        pass

    @staticmethod
    def build(model: ChannelViT, cfg: ModelConfig) -> None:
        dd = cfg.decoder_dim
        model.decoder_embed = nn.Linear(cfg.embed_dim, dd)
        model.mask_token = nn.Parameter(torch.zeros(1, 1, dd))
        if not model.mask_token.is_meta:  # shapes only (layers.sincos_1d)
            nn.init.normal_(model.mask_token, std=0.02)
        model.decoder_pos_embed = nn.Parameter(sincos_2d(*cfg.grid, dd)[None], requires_grad=False)
        model.decoder_blocks = nn.ModuleList(
            [Block(dd, cfg.decoder_heads, cfg.mlp_ratio) for _ in range(cfg.decoder_depth)]
        )
        model.decoder_norm = nn.LayerNorm(dd)
        model.head = nn.Linear(dd, cfg.in_channels * cfg.patch_size**2)

    @staticmethod
    def forward(model: ChannelViT, tokens, lead_time_hours, ids_keep):
        b, l, d = tokens.shape
        if ids_keep is None:
            ids_keep = torch.arange(l, device=tokens.device).expand(b, -1)
        kept = torch.gather(tokens, 1, ids_keep[..., None].expand(-1, -1, d))
        latent = model.decoder_embed(model.encode(kept))
        full = model.mask_token.expand(b, l, -1).clone()
        # under bf16 autocast the latent is bf16, the mask token float32: scatter takes one dtype
        full = full.scatter(1, ids_keep[..., None].expand(-1, -1, latent.shape[-1]), latent.to(full.dtype))
        full = full + model.decoder_pos_embed
        for block in model.decoder_blocks:
            full = block(full)
        return model.unpatchify(model.head(model.decoder_norm(full)), model.cfg.in_channels)


class ClassificationHead:
    """The mean of the encoded tokens to class scores."""

    @staticmethod
    def check(cfg: ModelConfig) -> None:
        if cfg.num_classes < 2:
            raise ModelError("a classification model needs num_classes >= 2")

    @staticmethod
    def build(model: ChannelViT, cfg: ModelConfig) -> None:
        model.head = nn.Linear(cfg.embed_dim, cfg.num_classes)

    @staticmethod
    def forward(model: ChannelViT, tokens, lead_time_hours, ids_keep):
        return model.head(model.encode(tokens).mean(dim=1))


HEADS = {Task.FORECAST: ForecastHead, Task.MAE: MaeHead, Task.CLASSIFICATION: ClassificationHead}


def random_masking(
    batch: int, num_patches: int, mask_ratio: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_keep (B, L_keep), mask (B, L) with 1 = masked), drawn from ``generator`` so every
    tensor-parallel rank draws the same mask."""
    keep = max(1, int(round(num_patches * (1 - mask_ratio))))
    noise = torch.rand(batch, num_patches, generator=generator)
    ids_keep = torch.argsort(noise, dim=1)[:, :keep]
    mask = torch.ones(batch, num_patches)
    mask.scatter_(1, ids_keep, 0.0)
    return ids_keep, mask
