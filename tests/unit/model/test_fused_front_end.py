"""The fused front end (dchag.model.fused): the token path's function from the patch pixels,
without (B, C, L, D) tokens, keys or values, on one device and under D-CHAG."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support import parallel_checks as checks
from support.distributed import run_distributed

from dchag.config import model_settings
from dchag.model import ChannelViT, layers, random_masking
from dchag.model import fused as fused_module
from dchag.model.build import model_config_of


def _config(**kw):
    base = dict(
        task="forecast",
        in_channels=12,
        img_size=(8, 16),
        patch_size=4,
        embed_dim=32,
        depth=1,
        num_heads=4,
        aggregation="cross",
        groups=3,
        out_channels=[0, 5],
        fused_front_end=False,
    )
    base.update(kw)
    return model_config_of(**base)


def _pair(**kw):
    """A token-path model with its learned queries and mixing weights moved off their uniform
    start, and a fused model loaded from its state dict."""
    torch.manual_seed(0)
    tokens = ChannelViT(_config(**kw))
    with torch.no_grad():
        for name, p in tokens.named_parameters():
            if name.endswith(("query", "mix.weight", "mix.bias")):
                p.normal_()
    fused = ChannelViT(dataclasses.replace(tokens.cfg, fused_front_end=True))
    fused.load_state_dict(tokens.state_dict())  # strict: the same names and shapes
    return tokens, fused


def _loss(model, x, lead, target):
    task = model.cfg.task
    if task == "forecast":
        out = model(x, lead)
    elif task == "classification":
        out = model(x)
        return out, torch.nn.functional.cross_entropy(out, torch.arange(x.shape[0]) % model.cfg.num_classes)
    else:
        ids_keep, _ = random_masking(x.shape[0], model.cfg.num_patches, 0.5, torch.Generator().manual_seed(3))
        out = model(x, ids_keep=ids_keep)
    return out, ((out - target) ** 2).mean()


def _inputs(model, batch=3):
    g = torch.Generator().manual_seed(1)
    cfg = model.cfg
    x = torch.randn(batch, cfg.in_channels, *cfg.img_size, generator=g)
    lead = torch.rand(batch, generator=g) * 240
    channels = len(cfg.out_channels) if cfg.task == "forecast" else cfg.in_channels
    target = torch.randn(batch, channels, *cfg.img_size, generator=g)
    return x, lead, target


CASES = {
    "baseline": dict(aggregation="baseline"),
    "cross": dict(aggregation="cross"),
    "linear": dict(aggregation="linear"),
    "cross Tree2": dict(aggregation="cross", tree=2),
    "linear Tree2": dict(aggregation="linear", tree=2),
    "cross uneven groups, Tree0": dict(aggregation="cross", in_channels=11, groups=3),
    "wavelengths, baseline": dict(aggregation="baseline", wavelengths=[400.0 + 30 * i for i in range(12)]),
    "wavelengths, linear Tree2": dict(aggregation="linear", tree=2, wavelengths=[400.0 + 30 * i for i in range(12)]),
    "mae, cross Tree4": dict(task="mae", aggregation="cross", groups=1, tree=4, out_channels=[]),
    "classification, linear": dict(task="classification", aggregation="linear", out_channels=[], num_classes=3),
    "one group, 8 heads": dict(aggregation="cross", groups=1, embed_dim=64, num_heads=8),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_fused_front_end_equals_the_token_path(case):
    """Outputs to 1e-5 and every parameter's gradient to 1e-4 relative, in float32."""
    tokens, fused = _pair(**case)
    assert tokens.state_dict().keys() == fused.state_dict().keys()
    x, lead, target = _inputs(tokens)
    out_t, loss_t = _loss(tokens, x, lead, target)
    out_f, loss_f = _loss(fused, x, lead, target)
    checks.close(out_f, out_t, "output", rtol=1e-5)
    loss_t.backward()
    loss_f.backward()
    grads = dict(fused.named_parameters())
    for name, p in tokens.named_parameters():
        if p.grad is None:
            assert grads[name].grad is None, name
            continue
        checks.close(grads[name].grad, p.grad, f"grad of {name}", rtol=1e-4)


def test_the_fused_model_loads_into_the_token_path_and_back():
    tokens, fused = _pair(aggregation="linear", tree=2)
    back = ChannelViT(dataclasses.replace(fused.cfg, fused_front_end=False))
    back.load_state_dict(fused.state_dict())
    x, lead, _ = _inputs(tokens)
    with torch.no_grad():
        checks.close(back(x, lead), fused(x, lead), "token path from the fused model's state dict", rtol=1e-5)


@pytest.mark.parametrize("aggregation", ["baseline", "cross", "linear"])
def test_fused_front_end_under_bf16_autocast(aggregation):
    """Under autocast bf16 the fused path agrees with the token path to bf16's precision, and
    its gradients reach every front-end parameter in the parameters' own dtype."""
    tokens, fused = _pair(aggregation=aggregation)
    x, lead, target = _inputs(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_t, loss_t = _loss(tokens, x, lead, target)
        out_f, loss_f = _loss(fused, x, lead, target)
    checks.close(out_f.float(), out_t.float(), "bf16 output", rtol=3e-2)
    loss_t.backward()
    loss_f.backward()
    grads = dict(fused.named_parameters())
    for name, p in tokens.named_parameters():
        if name.startswith(("tokenizer.", "partial.", "final.")) and p.grad is not None and "wkv.bias" not in name:
            g = grads[name].grad
            assert g.dtype == torch.float32, name
            checks.close(g, p.grad, f"bf16 grad of {name}", rtol=1e-1)


def test_absorbed_attention_backward_is_the_gradient_of_its_forward(monkeypatch):
    """The hand-written backward (pixels too), over several chunks of rows, in float64."""
    monkeypatch.setattr(fused_module, "CHUNK_ELEMENTS", 200)  # 5 rows a chunk in forward
    g = torch.Generator().manual_seed(0)
    n, c, k, h, hd = 13, 5, 4, 2, 3

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    args = (rand(n, c, k), rand(h, c, k), rand(c, h), rand(h, hd, c, k), rand(c, h, hd))
    assert torch.autograd.gradcheck(lambda *a: fused_module._AbsorbedAttention.apply(*a, torch.float64), args)


@pytest.mark.parametrize("aggregation", ["baseline", "cross", "linear"])
def test_chunks_of_rows_change_nothing(monkeypatch, aggregation):
    """Split into chunks of at most MAX_SEQUENCES rows (here 7 of the 32 B*L rows), the fused
    path and the token path's attention (also chunked) give what one chunk gives."""
    tokens, fused = _pair(aggregation=aggregation)
    x, lead, target = _inputs(tokens, batch=2)
    whole = [fused(x, lead), tokens(x, lead)]
    monkeypatch.setattr(fused_module, "MAX_SEQUENCES", 7)
    monkeypatch.setattr(layers, "MAX_SEQUENCES", 7)
    assert [len(range(32)[s]) for s in fused_module.chunks(32, 1)] == [7, 7, 7, 7, 4]
    checks.close(fused(x, lead), whole[0], "fused, in chunks", rtol=1e-6)
    checks.close(tokens(x, lead), whole[1], "token path, in chunks", rtol=1e-6)


def _saved_numels(model, x):
    """Elements of every tensor autograd saves in the front end's forward, each storage once,
    the parameters' own (views of them) left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            storages[ptr] = max(storages.get(ptr, 0), t.untyped_storage().nbytes() // t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.aggregate(x).sum()
    return list(storages.values())


@pytest.mark.parametrize("aggregation", ["baseline", "cross", "linear"])
def test_the_fused_front_end_saves_pixels_and_scores_not_tokens(aggregation):
    """Nothing of (B*L) x C x D is kept for backward: the largest saved tensor is the pixels
    (B*L x C x p^2) or a parameter-sized one, and all of it together is a fraction of one
    token tensor; the token path keeps several."""
    c, d = 64, 128
    tokens, fused = _pair(aggregation=aggregation, in_channels=c, groups=2, embed_dim=d, num_heads=4, img_size=(32, 64))
    x, _, _ = _inputs(tokens, batch=2)
    n = 2 * fused.cfg.num_patches
    token_tensor = n * c * d
    kept_f, kept_t = _saved_numels(fused, x), _saved_numels(tokens, x)
    assert max(kept_f) <= max(n * c * 16, c * 16 * d), kept_f
    assert sum(kept_f) < token_tensor / 2, (sum(kept_f), token_tensor)
    assert sum(kept_t) > token_tensor, (sum(kept_t), token_tensor)


def test_fused_front_end_is_the_default_and_a_setting():
    assert model_settings().fused_front_end is True
    assert model_settings(fused_front_end=False).fused_front_end is False
    assert model_config_of("forecast", 4, (8, 8), aggregation="linear", groups=2).fused_front_end is True


DCHAG_CASES = {
    2: [
        dict(aggregation="linear", groups=2, tree=0, fused_front_end=True),
        dict(aggregation="cross", groups=2, tree=0, fused_front_end=True),
        dict(aggregation="cross", groups=2, tree=2, fused_front_end=True),
        dict(aggregation="linear", groups=2, in_channels=7, task="mae", out_channels=[], fused_front_end=True),
    ],
    4: [
        dict(aggregation="linear", groups=4, tree=2, fused_front_end=True),
        dict(aggregation="cross", groups=4, in_channels=10, fused_front_end=True),
    ],
}


@pytest.mark.parametrize("world", [2, 4])
def test_fused_dchag_equals_the_one_device_token_path(world):
    """Each rank's fused partial aggregation of its channel block, the AllGather and the
    tensor-parallel final aggregation equal the one-device model on the token path: outputs
    and every gradient (gloo ranks)."""
    run_distributed(checks.check_tp_matches_one_device, world, "dchag", DCHAG_CASES[world], False)


def test_fused_tp_baseline_equals_the_one_device_token_path():
    """The TP baseline splits its one aggregation's heads over ranks: it takes the tokens there,
    and equals the one-device model either way."""
    run_distributed(
        checks.check_tp_matches_one_device, 2, "baseline", [dict(aggregation="baseline", fused_front_end=True)], False
    )
