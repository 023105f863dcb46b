"""The train step on one process: channel-subset rotation trains only the active groups and
leaves the idle groups' tokenizer rows, their Adam moments and their partial aggregators as
they were."""

from __future__ import annotations

import torch

from dchag.config import run_settings, validate
from dchag.model import ChannelViT
from dchag.model.build import model_config_of
from dchag.train.step import TrainStep, param_groups, rotation_groups
from dchag.train.tasks import Task


class _Classification(Task):
    """A classification task on in-memory batches (the step only calls ``loss``)."""

    name = "classification"

    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, {})
        self.model_cfg = model_cfg

    def loss(self, model, batch, step, seed, channel_group, active_groups=None):
        x, label = batch
        return torch.nn.functional.cross_entropy(model(x, active_groups=active_groups), label), {}


def test_rotation_keeps_idle_groups_and_their_adam_moments():
    config = validate(
        {
            "name": "t",
            "hsi": {"demo": True, "classification": {"image": "x.mat", "labels": "y.mat"}},
            "model": {"aggregation": "linear", "groups": 4, "embed_dim": 16, "num_heads": 4, "depth": 1},
            "parallel": {"tp": 1, "strategy": "baseline", "data_parallel": "none"},
            "train": {
                "rotation": {"fraction": 0.25, "lr_scale": 2.0},
                "lr": 0.01,
                "warmup_steps": 1,
                "runs": {"r": {"task": "classification"}},
            },
        },
        "test",
        check_files=False,
    )
    cfg = run_settings(config, "r")
    mcfg = model_config_of(
        in_channels=8,
        img_size=(8, 8),
        patch_size=4,
        embed_dim=16,
        depth=1,
        num_heads=4,
        aggregation="linear",
        groups=4,
        task="classification",
        num_classes=3,
    )
    torch.manual_seed(0)
    model = ChannelViT(mcfg)
    opt = torch.optim.AdamW(param_groups(model, cfg, mcfg, 1), lr=0.01)
    assert opt.param_groups[1]["lr"] == 0.02  # the rotated parts' learning rate is scaled
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    step = TrainStep(
        model,
        model,
        _Classification(cfg, mcfg),
        opt,
        sched,
        device=torch.device("cpu"),
        precision="fp32",
        grad_clip=1.0,
        tp_group=None,
        channel_group=None,
        rotation=cfg.train.rotation,
        seed=0,
    )
    g = torch.Generator().manual_seed(1)
    batches = [[torch.randn(4, 8, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)] for _ in range(6)]
    tok = model.tokenizer
    for s, batch in enumerate(batches):
        active = rotation_groups(cfg.train.rotation, 4, s)
        assert active == [s % 4]  # one group of four per step, in turn
        idle = [c for gi, (lo, hi) in enumerate(model.groups) if gi not in active for c in range(lo, hi)]
        busy = [c for gi, (lo, hi) in enumerate(model.groups) if gi in active for c in range(lo, hi)]
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        moments = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in (tok.weight, tok.bias)} if s else {}
        step(batch, s)
        for name in ("weight", "bias"):
            p = getattr(tok, name)
            assert torch.equal(p.detach()[idle], before[f"tokenizer.{name}"][idle]), (s, name)
            assert not torch.equal(p.detach()[busy], before[f"tokenizer.{name}"][busy]), (s, name)
            for k in ("exp_avg", "exp_avg_sq"):
                if s:
                    assert torch.equal(opt.state[p][k][idle], moments[id(p)][k][idle]), (s, name, k)
                    assert not torch.equal(opt.state[p][k][busy], moments[id(p)][k][busy]), (s, name, k)
        for gi in range(4):
            changed = any(
                not torch.equal(p.detach(), before[n])
                for n, p in model.named_parameters()
                if n.startswith(f"partial.{gi}.")
            )
            assert changed == (gi in active), (s, gi)
        assert not torch.equal(model.head.weight.detach(), before["head.weight"])  # the shared parts always train
