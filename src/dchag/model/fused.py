"""The channel front end without channel tokens: tokenization and aggregation in one step.

The tokenizer is a per-channel linear map of the patch pixels plus a shift (bias + channel
embedding), x_c = W_c P_c + s_c, and every aggregation is linear in the tokens up to its
softmax, so by associativity (the "weight absorption" of DeepSeek-V2's multi-head latent
attention) the aggregations are computed from the pixels P (B*L, C, p*p) directly:

* cross-attention with one learned query per head (u_h = W_k,h^T q_h / sqrt(hd)):
  score s_hc = P_c . (W_c^T u_h) + s_c . u_h + b_k,h . q_h / sqrt(hd),
  output o_h = sum_c a_hc P_c (W_c^T W_v,h^T) + sum_c a_hc s_c W_v,h^T + b_v,h;
* the linear (-L) aggregation: sum_c w_c x_c + b = P (sum_c w_c W_c^T) + sum_c w_c s_c + b.

Neither forms a (B, C, L, D) token, key or value tensor. The parameters are the token path's
(same modules, same names): a state dict of one path loads into the other.

:class:`_AbsorbedAttention` holds for backward only the pixels and the attention weights
(B*L x C x heads) and recomputes the rest chunk by chunk; chunks are at most
:data:`MAX_SEQUENCES` rows (the launch-grid limit of GPU kernels that run one sequence per
block) and about :data:`CHUNK_ELEMENTS` elements of working memory.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

MAX_SEQUENCES = 65535
CHUNK_ELEMENTS = 2**23


def chunks(n: int, per_row: int):
    """Row slices of ``n`` rows, each at most MAX_SEQUENCES rows and about CHUNK_ELEMENTS /
    ``per_row`` rows (at least one)."""
    step = max(1, min(MAX_SEQUENCES, CHUNK_ELEMENTS // max(1, per_row)))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def _accumulate(dtype: torch.dtype) -> torch.dtype:
    """Softmax and sums over rows in float32 at least."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    device = t.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return t.dtype


def _no_autocast(t: torch.Tensor):
    """Autocast off on ``t``'s device (a device without autocast, such as meta, where the FLOPs
    are counted: nothing to turn off)."""
    device = t.device.type
    return torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else nullcontext()


class _AbsorbedAttention(torch.autograd.Function):
    """o (N, H, hd) = sum_c a (N, C, H) * (M (H, hd, C, k) P (N, C, k) + mv (C, H, hd)) with
    a = softmax_c(A (H, C, k) P + ab (C, H)).

    Saves P and a (and the parameter-sized A, M, mv); the weighted pixels (H, n, C*k) and
    their gradient exist for one chunk of rows at a time. Matmuls run in ``dtype``
    (autocast's), the softmax and the sums over rows in float32 at least."""

    @staticmethod
    def forward(ctx, pixels, a_w, a_b, m_w, m_b, dtype):
        n, c, k = pixels.shape
        heads, hd = m_w.shape[0], m_w.shape[1]
        with _no_autocast(pixels):
            acc = _accumulate(dtype)
            p = pixels.to(dtype)
            a_wt, a_b_ = a_w.to(dtype).permute(1, 2, 0), a_b.to(acc)  # (C, k, H)
            mh = m_w.to(dtype).reshape(heads, hd, c * k).transpose(1, 2)  # (H, C*k, hd)
            mvh = m_b.to(dtype).transpose(0, 1)  # (H, C, hd)
            out = p.new_empty(n, heads, hd)
            attn = torch.empty(n, c, heads, dtype=acc, device=p.device)
            for rows in chunks(n, heads * c * k):
                pc = p[rows]
                scores = torch.bmm(pc.transpose(0, 1), a_wt).transpose(0, 1).to(acc) + a_b_  # (n, C, H)
                ac = torch.softmax(scores, dim=1)
                attn[rows] = ac
                ah = ac.to(dtype).permute(2, 0, 1)  # (H, n, C)
                weighted = (ah[..., None] * pc[None]).reshape(heads, -1, c * k)  # (H, n, C*k)
                out[rows] = (torch.bmm(weighted, mh) + torch.bmm(ah, mvh)).transpose(0, 1)
        ctx.save_for_backward(pixels, attn, a_w, m_w, m_b)
        ctx.dtype, ctx.a_b_dtype = dtype, a_b.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        pixels, attn, a_w, m_w, m_b = ctx.saved_tensors
        dtype = ctx.dtype
        n, c, k = pixels.shape
        heads, hd = m_w.shape[0], m_w.shape[1]
        need_p = ctx.needs_input_grad[0]
        with _no_autocast(pixels):
            acc = _accumulate(dtype)
            p = pixels.to(dtype)
            a_w_ = a_w.to(dtype).transpose(0, 1)  # (C, H, k)
            mh = m_w.to(dtype).reshape(heads, hd, c * k).transpose(1, 2)
            mvh = m_b.to(dtype).transpose(0, 1)
            g = grad_out.to(dtype)
            d_mh = torch.zeros(heads, c * k, hd, dtype=acc, device=p.device)
            d_mvh = torch.zeros(heads, c, hd, dtype=acc, device=p.device)
            d_aw = torch.zeros(c, heads, k, dtype=acc, device=p.device)
            d_ab = torch.zeros(c, heads, dtype=acc, device=p.device)
            d_p = torch.empty_like(pixels) if need_p else None
            for rows in chunks(n, 2 * heads * c * k):
                pc = p[rows]
                ac = attn[rows]  # (n, C, H)
                ah = ac.to(dtype).permute(2, 0, 1)  # (H, n, C)
                gh = g[rows].transpose(0, 1)  # (H, n, hd)
                weighted = (ah[..., None] * pc[None]).reshape(heads, -1, c * k)
                d_mh += torch.bmm(weighted.transpose(1, 2), gh)
                del weighted
                d_mvh += torch.bmm(ah.transpose(1, 2), gh)
                d_weighted = torch.bmm(gh, mh.transpose(1, 2)).reshape(heads, -1, c, k)  # (H, n, C, k)
                d_attn = (d_weighted * pc[None]).sum(-1) + torch.bmm(gh, mvh.transpose(1, 2))  # (H, n, C)
                d_attn = d_attn.to(acc).permute(1, 2, 0)  # (n, C, H)
                d_scores = ac * (d_attn - (ac * d_attn).sum(dim=1, keepdim=True))
                d_ab += d_scores.sum(0)
                ds = d_scores.to(dtype).transpose(0, 1)  # (C, n, H)
                d_aw += torch.bmm(ds.transpose(1, 2), pc.transpose(0, 1))  # (C, H, k)
                if need_p:
                    dpc = (ah[..., None] * d_weighted).sum(0) + torch.bmm(ds, a_w_).transpose(0, 1)
                    d_p[rows] = dpc.to(pixels.dtype)
        d_mw = d_mh.transpose(1, 2).reshape(heads, hd, c, k).to(m_w.dtype)
        d_mb = d_mvh.transpose(0, 1).to(m_b.dtype)
        return d_p, d_aw.transpose(0, 1).to(a_w.dtype), d_ab.to(ctx.a_b_dtype), d_mw, d_mb, None


def absorbed_query_attention(aggregator, pixels: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor):
    """A QueryAggregator over the tokens ``W_c P_c + s_c`` without forming them: pixels
    (N, C, k), tokenizer weight (C, D, k), shift (C, D) -> (N, D)."""
    attn = aggregator.attn
    heads_dim = attn.head_dim
    c, d, k = weight.shape
    q = attn.wq(aggregator.query).reshape(-1, heads_dim)  # (H, hd)
    heads = q.shape[0]
    wkv = attn.wkv.weight.reshape(heads, 2, heads_dim, -1)
    bkv = attn.wkv.bias.reshape(heads, 2, heads_dim)
    scale = 1.0 / math.sqrt(heads_dim)
    u = (q[:, None, :] @ wkv[:, 0]).reshape(heads, -1) * scale  # (H, D): W_k,h^T q_h
    w_v = wkv[:, 1].reshape(heads * heads_dim, -1)  # (D, D), rows head by head
    # one (D, C*k) copy of the weight for both products: a batched matmul over the channels
    # would form a (C, D, D) gradient for the value weight
    weight_t = weight.transpose(0, 1).reshape(d, c * k)
    a_w = (u @ weight_t).reshape(heads, c, k)
    # the key bias adds one constant per head to every score: no effect on the softmax, kept
    # so its (vanishing) gradient is formed as the token path forms it
    a_b = shift @ u.transpose(0, 1) + (bkv[:, 0] * q).sum(-1) * scale
    m_w = (w_v @ weight_t).reshape(heads, heads_dim, c, k)
    m_b = (shift @ w_v.transpose(0, 1)).reshape(c, heads, heads_dim)
    out = _AbsorbedAttention.apply(pixels, a_w, a_b, m_w, m_b, _compute_dtype(pixels))
    out = out.reshape(-1, d) + bkv[:, 1].reshape(d)  # the softmax weights sum to one
    return attn.proj(out)


def absorbed_linear(aggregator, pixels: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """A LinearAggregator over the tokens ``W_c P_c + s_c``: (N, C, k) -> (N, D)."""
    n, c, k = pixels.shape
    w = aggregator.mix.weight[0]  # (C,)
    combined = (w[:, None, None] * weight).transpose(1, 2).reshape(c * k, -1)  # (C*k, D)
    return pixels.reshape(n, c * k) @ combined + (w @ shift + aggregator.mix.bias)
