"""Building blocks of the channel-aggregating ViT, each written for one device.

Tensor parallelism is applied to these from outside (``dchag.parallel``): attention uses a
query projection and a fused key/value projection laid out head by head, with a head count
read from the projected width, so column-parallel q and k/v and a row-parallel output
projection give each rank its own heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DchagError
from .fused import MAX_SEQUENCES, absorbed_linear, absorbed_query_attention


class ModelError(DchagError, ValueError):
    """A model setting is inconsistent (sizes, heads, groups, tree); the message names it."""


def sincos_1d(positions: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """(n,) positions -> (n, dim) sin-cos features (dim even)."""
    # A model built on torch's meta device has shapes only: no values to compute, and arithmetic
    # on meta tensors would import torch._dynamo (1.5 CPU-s of each command that checks a model
    # folder's weights against the shapes its description gives, model.folder.expected_state).
    if positions.is_meta:
        return torch.empty(len(positions), dim, device="meta")
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).to(torch.float32)


def sincos_2d(grid_h: int, grid_w: int, dim: int) -> torch.Tensor:
    """(grid_h * grid_w, dim) 2-D sin-cos position embedding (half the width per axis)."""
    ys, xs = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    if ys.is_meta:  # shapes only, as in sincos_1d
        return torch.empty(grid_h * grid_w, dim, device="meta")
    return torch.cat([sincos_1d(ys.reshape(-1), dim // 2), sincos_1d(xs.reshape(-1), dim // 2)], dim=-1)


class ChannelTokenizer(nn.Module):
    """A separate patch embedding for every channel (ClimaX's per-variable Conv2d(1, D, p, p)),
    held as one (C, D, p*p) weight, plus a channel embedding.

    ``channel_ids`` says which global channels this module holds, in order; a parallelization
    that keeps a slice of the channels slices the parameters and the ids together.
    """

    def __init__(self, num_channels: int, embed_dim: int, patch_size: int, wavelengths: list[float] | None = None):
        super().__init__()
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        k = patch_size * patch_size
        self.weight = nn.Parameter(torch.empty(num_channels, embed_dim, k))
        self.bias = nn.Parameter(torch.zeros(num_channels, embed_dim))
        bound = 1 / math.sqrt(k)
        nn.init.uniform_(self.weight, -bound, bound)
        self.register_buffer("channel_ids", torch.arange(num_channels), persistent=False)
        if wavelengths is None:
            # ClimaX: a learned channel embedding initialised with sin-cos of the channel index.
            self.channel_embed = nn.Parameter(sincos_1d(torch.arange(num_channels), embed_dim))
            self.register_buffer("wavelengths", None, persistent=False)
            self.wavelength_proj = None
        else:
            # Hyperspectral: a fixed sin-cos code of the band centre (nm) through a learned
            # projection, so a trained model can take another band set.
            self.channel_embed = None
            self.register_buffer("wavelengths", torch.as_tensor(wavelengths, dtype=torch.float32), persistent=False)
            self.wavelength_proj = nn.Linear(embed_dim, embed_dim)

    def keep_channels(self, start: int, stop: int) -> None:
        """Hold only channels [start, stop) of those held now (D-CHAG's distributed tokenization)."""
        with torch.no_grad():
            self.weight = nn.Parameter(self.weight[start:stop].clone())
            self.bias = nn.Parameter(self.bias[start:stop].clone())
            if self.channel_embed is not None:
                self.channel_embed = nn.Parameter(self.channel_embed[start:stop].clone())
            else:
                self.wavelengths = self.wavelengths[start:stop].clone()
        self.channel_ids = self.channel_ids[start:stop].clone()

    def channel_embedding(self) -> torch.Tensor:
        if self.channel_embed is not None:
            return self.channel_embed
        return self.wavelength_proj(sincos_1d(self.wavelengths, self.embed_dim, max_period=5000.0))

    def forward(self, x: torch.Tensor, channels: slice = slice(None), absorbed: bool = False):
        """(B, C, H, W) -> (B, C, L, D); ``channels`` selects which held channels x holds (all by default).

        With ``absorbed``, no tokens: the patch pixels (B*L, C, p*p), the weight (C, D, p*p)
        and the shift (C, D) of those channels, for an aggregation that absorbs the tokenizer
        (:mod:`dchag.model.fused`)."""
        b, c, h, w = x.shape
        p = self.patch_size
        weight = self.weight[channels]
        if c != weight.shape[0]:
            raise ModelError(f"tokenizer holds {weight.shape[0]} channels here, input has {c}")
        if absorbed:
            pixels = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, p * p)
            return pixels, weight, self.bias[channels] + self.channel_embedding()[channels]
        patches = x.reshape(b, c, h // p, p, w // p, p).permute(0, 1, 2, 4, 3, 5).reshape(b, c, -1, p * p)
        # Bias and channel embedding ride in the matmul as a column of ones: one contiguous
        # batched matmul over (b, c), no separate full-size additions or reductions over them.
        patches = torch.cat([patches, patches.new_ones(*patches.shape[:-1], 1)], dim=-1)
        shift = self.bias[channels] + self.channel_embedding()[channels]
        return torch.matmul(patches, torch.cat([weight, shift[..., None]], dim=-1).transpose(1, 2))


class _WeightGradientFirst(torch.autograd.Function):
    """Identity on ``y = x W^T + b`` (computed without a weight gradient) that adds W's gradient
    in backward, before autograd forms x's: x is released between the two, so x and its
    gradient never both exist."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.weight_dtype = weight.dtype
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        grad_weight = grad.reshape(-1, grad.shape[-1]).transpose(0, 1) @ x.reshape(-1, x.shape[-1]).to(grad.dtype)
        return grad, None, grad_weight.to(ctx.weight_dtype)


class KeyValueProjection(nn.Linear):
    """The fused key/value projection (an nn.Linear, so tensor parallelism splits it as one).

    Its input is the aggregation's context, (B, C, L, D) over all C channel tokens in the TP
    baseline: the largest tensor of the front end. A plain linear layer keeps it until its
    backward has formed both gradients, so the context and its whole gradient coexist on
    every rank; here the weight gradient is formed first and the context released before the
    input gradient (a T-independent (B, C, L, D) less at the backward peak)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(
            device
        ):  # keep what autocast's linear keeps
            x = x.to(torch.get_autocast_dtype(device))
        y = F.linear(x, self.weight.detach(), self.bias)  # saves no x: no weight gradient here
        return _WeightGradientFirst.apply(y, x, self.weight)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA over at most MAX_SEQUENCES sequences a call: GPU attention kernels launch one grid
    row per sequence and fail beyond it (pytorch/pytorch#142228, #146704), which the
    aggregation's B*L sequences exceed on fine grids."""
    if q.shape[0] <= MAX_SEQUENCES:
        return F.scaled_dot_product_attention(q, k, v)
    parts = [slice(i, i + MAX_SEQUENCES) for i in range(0, len(q), MAX_SEQUENCES)]
    return torch.cat([F.scaled_dot_product_attention(q[s], k[s], v[s]) for s in parts])


class CrossAttention(nn.Module):
    """Multi-head attention of ``query`` tokens over ``context`` tokens (no norm, no residual).

    Heads are inferred from the projected width, so under tensor parallelism (q and k/v
    column-parallel, ``proj`` row-parallel) each rank runs its own heads unchanged.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ModelError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.head_dim = dim // num_heads
        self.wq = nn.Linear(dim, dim)
        # Keys and values in one projection, rows ordered head by head ([k_0; v_0; k_1; v_1; ...],
        # Megatron's fused layout): column-parallel splitting gives each rank its heads' keys and
        # values, and the context's gradient comes out of one matmul — one context-sized tensor,
        # not two summed (the peak of the channel aggregation's backward).
        self.wkv = KeyValueProjection(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        # A (B, S, L, D) context is projected in place when the keys and values a device holds
        # are narrower than the context (tensor parallelism sets this: 2D/T < D for T > 2); on
        # one device they are twice as wide, and re-laying out the context is the smaller copy.
        self.project_in_place = False

    def forward(self, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """query (N, Q, D); context (N, S, D), or (B, S, L, D) with N = B * L: a set of S tokens
        at each of L locations -> (N, Q, D).

        With ``project_in_place`` the keys and values are projected in the context's own layout
        and only they (width 2D/T under tensor parallelism) are re-laid out for attention: no
        copy of the whole context exists beside it (the channel aggregation's largest tensor)."""
        if context.dim() == 4 and not self.project_in_place:
            b, s_len, l, d = context.shape
            context = context.permute(0, 2, 1, 3).reshape(b * l, s_len, d)
        if context.dim() == 3:
            context = context.unsqueeze(2)
        b, s_len, l, _ = context.shape
        n, q_len, _ = query.shape
        q = self.wq(query).reshape(n, q_len, -1, self.head_dim).transpose(1, 2)
        # (B, S, L, H, 2, hd) -> k, v (B*L, H, S, hd), one copy of both (a view when L = 1)
        kv = self.wkv(context).reshape(b, s_len, l, -1, 2, self.head_dim).permute(4, 0, 2, 3, 1, 5)
        k, v = kv.reshape(2, b * l, -1, s_len, self.head_dim).unbind(0)
        del kv  # the projection's own output goes once its re-laid-out copy exists
        out = _attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(n, q_len, -1))


class QueryAggregator(nn.Module):
    """One learned query, initialised to zero, cross-attends over a set of tokens at every
    patch location: ClimaX's variable aggregation, D-CHAG's final aggregation, and the -C
    partial aggregator. (B, S, L, D) -> (B, L, D)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(1, 1, dim))
        self.attn = CrossAttention(dim, num_heads)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, s, l, d = tokens.shape
        out = self.attn(self.query.expand(b * l, -1, -1), tokens)
        return out.reshape(b, l, d)

    def absorbed(self, pixels: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """The same from the tokenizer's pixels (N, C, p*p), weight and shift -> (N, D)."""
        return absorbed_query_attention(self, pixels, weight, shift)


class LinearAggregator(nn.Module):
    """D-CHAG's -L partial aggregator: a learned weighted sum over the channels plus a bias
    (one scalar per channel, shared over patches and width). (B, S, L, D) -> (B, L, D)."""

    def __init__(self, num_inputs: int):
        super().__init__()
        self.mix = nn.Linear(num_inputs, 1)
        with torch.no_grad():  # start as the mean, like the zero-query attention does
            self.mix.weight.fill_(1.0 / num_inputs)
            self.mix.bias.zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # (1, S) @ (S, L*D) per sample: reads the tokens in place (an einsum here transposes them)
        b, s, l, d = tokens.shape
        mixed = torch.bmm(self.mix.weight.expand(b, 1, s), tokens.reshape(b, s, l * d))
        return mixed.reshape(b, l, d) + self.mix.bias

    def absorbed(self, pixels: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """The same from the tokenizer's pixels (N, C, p*p), weight and shift -> (N, D)."""
        return absorbed_linear(self, pixels, weight, shift)


class PartialAggregator(nn.Module):
    """Reduces one channel group's tokens to one token per patch: -L or -C, flat (Tree0) or
    as a two-level tree (TreeK): K equal sub-groups, one shared level-1 module reduces each
    to a token, a level-2 module reduces the K tokens to one. For -C both levels are the same
    module (no extra parameters); for -L they are Linear(C_g/K, 1) and Linear(K, 1)."""

    def __init__(self, kind: str, num_channels: int, dim: int, num_heads: int, tree: int = 0):
        super().__init__()
        self.kind = kind
        self.tree = tree
        if tree and num_channels % tree:
            raise ModelError(f"tree {tree} does not divide a group of {num_channels} channels")
        if tree and tree > num_channels:
            raise ModelError(f"tree {tree} is larger than a group of {num_channels} channels")
        if kind == "linear":
            self.level1 = LinearAggregator(num_channels // tree if tree else num_channels)
            self.level2 = LinearAggregator(tree) if tree else None
        elif kind == "cross":
            self.level1 = QueryAggregator(dim, num_heads)
            self.level2 = None
        else:
            raise ModelError(f"unknown partial aggregator {kind!r}; expected 'linear' or 'cross'")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.tree:
            return self.level1(tokens)
        b, s, l, d = tokens.shape
        sub = tokens.reshape(b * self.tree, s // self.tree, l, d)
        level1 = self.level1(sub).reshape(b, self.tree, l, d)
        return (self.level2 or self.level1)(level1)

    def absorbed(self, pixels: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, batch: int) -> torch.Tensor:
        """The same from the tokenizer's pixels (B*L, C, p*p), weight and shift -> (B, L, D):
        only the first level sees the channels; a tree's second level takes its K tokens."""
        n, c, _ = pixels.shape
        if not self.tree:
            return self.level1.absorbed(pixels, weight, shift).reshape(batch, n // batch, -1)
        size = c // self.tree
        level1 = torch.stack(
            [
                self.level1.absorbed(pixels[:, i : i + size], weight[i : i + size], shift[i : i + size])
                for i in range(0, c, size)
            ],
            dim=1,
        )  # (B*L, K, D)
        level1 = level1.reshape(batch, n // batch, self.tree, -1).transpose(1, 2)
        return (self.level2 or self.level1)(level1)


class Attention(nn.Module):
    """Self-attention of a ViT block, tensor-parallel ready (see CrossAttention)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.inner = CrossAttention(dim, num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, x)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block (as timm's ViT block)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))
