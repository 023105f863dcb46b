"""The one-device model: shapes per task, the paper's parameter counts, bad configurations."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from support import REPO

from dchag.model import ChannelViT, channel_groups, random_masking
from dchag.model.build import model_config_of
from dchag.model.describe import count_parameters


def cfg(**kw):
    base = dict(
        task="forecast",
        in_channels=12,
        img_size=(16, 32),
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=4,
        aggregation="linear",
        groups=3,
    )
    base.update(kw)
    return model_config_of(**base)


@pytest.mark.parametrize("tree, expected", [(0, 257), (2, 132), (4, 70), (8, 42)])
def test_linear_tree_parameter_counts_match_the_paper(tree, expected):
    model = ChannelViT(cfg(in_channels=1024, groups=4, tree=tree, depth=1, embed_dim=16))
    assert sum(p.numel() for p in model.partial["0"].parameters()) == expected
    # -C trees reuse one module at both levels: no extra parameters.
    flat = ChannelViT(cfg(in_channels=1024, groups=4, tree=0, aggregation="cross", depth=1, embed_dim=16))
    deep = ChannelViT(cfg(in_channels=1024, groups=4, tree=tree or 2, aggregation="cross", depth=1, embed_dim=16))
    assert count_parameters(flat)["partial aggregators"] == count_parameters(deep)["partial aggregators"]


def test_channel_groups_are_contiguous_and_uneven_when_needed():
    assert channel_groups(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert channel_groups(8, 2) == [(0, 4), (4, 8)]


@pytest.mark.parametrize("aggregation", ["baseline", "linear", "cross"])
def test_forecast_shapes_and_lead_time_matters(aggregation):
    torch.manual_seed(0)
    model = ChannelViT(cfg(aggregation=aggregation, task="forecast", out_channels=[0, 5]))
    x = torch.randn(2, 12, 16, 32)
    y6 = model(x, torch.tensor([6.0, 6.0]))
    y72 = model(x, torch.tensor([72.0, 72.0]))
    assert y6.shape == (2, 2, 16, 32)
    assert not torch.allclose(y6, y72)


def test_mae_reconstructs_every_channel_and_masks_consistently():
    model = ChannelViT(cfg(task="mae"))
    x = torch.randn(3, 12, 16, 32)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    ids_keep, mask = random_masking(3, model.cfg.num_patches, 0.75, g1)
    assert ids_keep.shape == (3, 8) and mask.sum() == 3 * 24
    assert torch.equal(ids_keep, random_masking(3, model.cfg.num_patches, 0.75, g2)[0])  # same on every rank
    assert model(x, ids_keep=ids_keep).shape == x.shape


def test_classifier_and_wavelength_embedding_take_another_band_set():
    wl = torch.linspace(400, 2500, 12).tolist()
    model = ChannelViT(
        cfg(task="classification", num_classes=5, wavelengths=wl, img_size=(8, 8), aggregation="cross", groups=2)
    )
    assert model(torch.randn(4, 12, 8, 8)).shape == (4, 5)
    other = ChannelViT(
        cfg(
            task="classification",
            num_classes=5,
            wavelengths=torch.linspace(420, 2400, 12).tolist(),
            img_size=(8, 8),
            aggregation="cross",
            groups=2,
        )
    )
    other.load_state_dict(model.state_dict())  # same parameters, different bands: no per-band weights in the embedding
    assert other(torch.randn(4, 12, 8, 8)).shape == (4, 5)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(img_size=(15, 32)), "not divisible by patch_size"),
        (dict(aggregation="tree"), "model.aggregation"),
        (dict(groups=13), "model.groups"),
        (dict(embed_dim=30), "not divisible by num_heads"),
        (dict(tree=3), "tree 3 does not divide"),
    ],
)
def test_bad_model_configs_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        ChannelViT(cfg(**kw))


def test_describe_model_cli():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dchag",
            "describe-model",
            "--config",
            str(REPO / "config" / "demo.yaml"),
            "--channels",
            "1024",
            "--groups",
            "4",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = {
        line.split("  ")[0].strip(): line for line in proc.stdout.splitlines() if "Tree" in line or "baseline" in line
    }
    for tree, n in ((2, 132), (4, 70), (8, 42)):
        assert f" {n} " in lines[f"D-CHAG-L Tree{tree}"]


def _aggregate_step(plain_linear: bool, autocast: bool = False):
    """One forward and backward of a query aggregation over (B, C, L, D) tokens made from a leaf
    by a tokenizer-like op (which keeps none of them), with a plain nn.Linear as the k/v
    projection or the model's own. Returns the peak memory (MiB) during the projection's backward,
    the leaf's gradient and the aggregation's gradients."""
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    from dchag.model.layers import QueryAggregator

    torch.manual_seed(0)
    agg = QueryAggregator(16, 4)
    plain = torch.nn.Linear(16, 32)
    plain.load_state_dict(agg.attn.wkv.state_dict())
    if plain_linear:
        agg.attn.wkv = plain
    with torch.no_grad():
        agg.query.normal_()
    w = torch.randn(64, 16, 17, requires_grad=True)  # (C, D, p*p + 1)
    patches = torch.randn(2, 64, 128, 17)
    tracker = MemTracker()
    tracker.track_external(agg)
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            # the tokens (saved by the matmul: patches and w, not its output) are held by nothing else
            loss = agg(torch.matmul(patches, w.transpose(1, 2))).float().square().sum()
        loss.backward()
    peak = max(
        sum(d["Total"] for d in snap.values())
        for snap in tracker.memory_tracking[agg.attn.wkv].snapshots[_ModState.PEAK_BW]
    )
    return peak / 2**20, w.grad, {k: p.grad for k, p in agg.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True])
def test_key_value_projection_gradients_equal_a_linear_layer(autocast):
    _, w_ref, ref = _aggregate_step(True, autocast)
    _, w_got, got = _aggregate_step(False, autocast)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w_got, w_ref, **tol)
    assert set(got) == set(ref)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], **tol, msg=k)


def test_key_value_projection_releases_the_context_before_its_gradient():
    """The aggregation's context (B, C, L, D) and its gradient never coexist: the projection's
    backward peaks one context (2 x 64 x 128 x 16 fp32 = 1 MiB) lower than a plain linear
    layer's, which keeps the context until both its gradients exist."""
    held_ref, _, _ = _aggregate_step(True)
    held, _, _ = _aggregate_step(False)
    context = 2 * 64 * 128 * 16 * 4 / 2**20
    assert held == pytest.approx(held_ref - context, abs=0.05 * context), (held, held_ref)
