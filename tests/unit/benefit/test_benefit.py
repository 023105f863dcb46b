"""The benefit model: collective costs by hand, the seed article's worked example, the advice,
and calibration on a real gloo process group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dchag.benefit import hardware as hwm
from dchag.benefit.advise import advise, article
from dchag.benefit.calibrate import fit
from dchag.benefit.costmodel import STRATEGIES
from dchag.benefit.workload import Workload
from dchag.cli import main


def test_ring_collectives_by_hand():
    hw = hwm.Hardware(alpha=1e-5, intra_bw=100e9, inter_bw=10e9, gpus_per_node=4)
    s = 400e6
    # one node of 4: 2(n-1) steps, 2(n-1)/n S bytes per rank
    assert hwm.all_reduce(s, 4, hw) == pytest.approx((6 * 1e-5 + 1.5 * s / 100e9, 0.0))
    assert hwm.all_gather(s, 4, hw) == pytest.approx((3 * 1e-5 + 0.75 * s / 100e9, 0.0))
    # 8 ranks on 2 nodes: reduce-scatter + all-gather inside each node, all-reduce of S/4 across 2 nodes
    intra, inter = hwm.all_reduce(s, 8, hw)
    assert intra == pytest.approx(2 * (3 * 1e-5 + 0.75 * s / 100e9))
    assert inter == pytest.approx(2 * 1e-5 + 1.0 * (s / 4) / 10e9)
    assert hwm.flat_all_reduce(s, 8, hw) == pytest.approx(14 * 1e-5 + 1.75 * s / 10e9)


def test_seed_article_worked_example():
    """S = 200 MB, T_comp = 180 ms, alpha = 50 us, delta-alpha = 2 ms, 200 GB/s in a node; 8 and 16
    GPUs (4 per node); 12.5 GB/s (100 GbE) or 50 GB/s between nodes."""
    r = {}
    for bw in (12.5e9, 50e9):
        for n in (8, 16):
            hw = hwm.Hardware(50e-6, 200e9, bw, 4)
            r[bw, n] = article(200e6, 0.18, hw, n, 4, 2e-3)
    eth8, eth16, fast8, fast16 = r[12.5e9, 8]["R"], r[12.5e9, 16]["R"], r[50e9, 8]["R"], r[50e9, 16]["R"]
    assert eth16 > eth8 > 0.05  # pays off on Ethernet, more at 16 GPUs
    assert 0 < fast8 < 0.05 and 0 < fast16 < 0.05  # small on the fast interconnect
    assert r[12.5e9, 16]["recommendation"] == "hierarchical" and r[50e9, 8]["recommendation"] == "flat"
    assert r[12.5e9, 8]["regime"] == "communication-bound"


def test_article_mode_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "advise",
                "--alpha",
                "50e-6",
                "--intra-bw",
                "200e9",
                "--inter-bw",
                "12.5e9",
                "--gradient-bytes",
                "200e6",
                "--compute-s",
                "0.18",
                "--gpus",
                "16",
                "--gpus-per-node",
                "4",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    d = json.loads(out.read_text())
    assert d["R"] > 0.05 and d["recommendation"] == "hierarchical"
    assert main(["advise", "--alpha", "50e-6", "--gpus", "16", "--gpus-per-node", "4", "--gradient-bytes", "1"]) == 2
    assert "--hardware" in capsys.readouterr().err


def _paper_like() -> Workload:
    # The paper's 1.7B model on ERA5-sized images, 1024 channels, batch 2, bf16.
    return Workload(channels=1024, embed_dim=2048, depth=32, num_heads=16, tokens=2048, patch_size=4, batch=2)


def test_advice_table_regimes_and_memory():
    w = _paper_like()
    eth = hwm.Hardware(50e-6, 200e9, 12.5e9, 8)
    res = advise(w, eth, 16, 8, rate=100e12, memory_bytes=64e9)
    rows = {t["strategy"]: t for t in res["table"] if t["front_end"] == "tokens"}
    fused = {t["strategy"]: t for t in res["table"] if t["front_end"] == "fused"}
    assert set(rows) == set(STRATEGIES) and rows["dp"]["R_vs_dp"] == 0.0
    assert set(fused) == set(STRATEGIES) - {"tp"}  # the TP baseline takes the tokens either way
    # the fused front end holds no channel tokens: one whole model per GPU fits where the token path does not
    assert fused["dp"]["fits"] and fused["dp"]["memory_gb"] < rows["dp"]["memory_gb"] / 2
    assert fused["dchag-l"]["memory_gb"] < rows["dchag-l"]["memory_gb"]
    assert fused["dp"]["compute_s"] < rows["dp"]["compute_s"]
    assert any(r.startswith("D-CHAG: ") and "; both: " in r for r in res["reasons"])
    # 1024 channels x 2048 tokens x 2048 wide do not fit data-parallel in 64 GB; D-CHAG shrinks the front end by T
    assert not rows["dp"]["fits"] and rows["dchag-l"]["memory_gb"] < rows["tp"]["memory_gb"] / 2
    assert res["recommendation"] in {k for k, t in rows.items() if t["fits"]}
    assert rows["dchag-l"]["comm_inter_s"] > 0  # data parallelism between the two nodes
    # A tiny model on a fast network: compute-bound, nothing beats data parallelism by 5 %.
    small = Workload(channels=4, embed_dim=64, depth=2, num_heads=4, tokens=128, patch_size=4, batch=2)
    res = advise(
        small, hwm.Hardware(5e-6, 200e9, 50e9, 8), 8, 8, rate=1e9, strategies=("dp", "fsdp-zero2", "compress-fp16")
    )
    assert res["regime"] == "compute-bound" and res["recommendation"] == "dp"
    # Rotation computes less per step but changes the training: the advice says to check it.
    many = Workload(channels=256, embed_dim=64, depth=2, num_heads=4, tokens=128, patch_size=4, batch=2)
    res = advise(many, hwm.Hardware(5e-6, 200e9, 50e9, 8), 8, 8, rate=1e9, strategies=("dp", "rotation"))
    assert res["recommendation"] == "rotation"
    assert any("compare its validation loss" in r and "train.rotation" in r for r in res["reasons"])


def test_fit_recovers_alpha_and_bandwidth():
    n, alpha, bw = 4, 2e-5, 5e9
    pts = [(s, 2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bw) for s in (1e3, 1e5, 1e6, 1e7)]
    f = fit(pts, n, "all_reduce")
    assert f["alpha"] == pytest.approx(alpha, rel=1e-6) and f["bw"] == pytest.approx(bw, rel=1e-6)
    # 10 % of noise on the two largest messages (2 ms on 20 ms, against a 0.12 ms latency) must not
    # swamp the latency the small messages show: an unweighted fit put it below zero, then at 0.
    noise = {4**12: 0.9, 4**13: 1.1}
    exact = [(4**k, 2 * (n - 1) * alpha + 2 * (n - 1) / n * 4**k / bw) for k in range(5, 14)]
    noisy = [(s, t * noise.get(s, 1)) for s, t in exact]
    f = fit(noisy, n, "all_reduce")
    assert f["alpha"] == pytest.approx(alpha, rel=0.1) and f["bw"] == pytest.approx(bw, rel=0.05)


def test_memory_model_predicts_the_papers_table_within_25_percent():
    from dchag.paper.table import compare

    rows = compare()
    assert len(rows) == 15
    bad = [r for r in rows if abs(r["error"]) > 0.25]
    assert not bad, bad
    # and the qualitative findings: D-CHAG-L below -C below the baseline at TP 8-16, no -C gain at TP 2
    by = {(r["model"], r["channels"], r["tp"], r["variant"]): r["predicted_gb"] for r in rows}
    assert by["1.7B", 1024, 8, "D-CHAG-L"] < by["1.7B", 1024, 8, "D-CHAG-C"] < 0.5 * by["1.7B", 1024, 8, "baseline"]
    assert by["1.7B", 512, 2, "D-CHAG-C"] > 0.9 * by["1.7B", 512, 2, "baseline"]


@pytest.mark.parametrize(
    "aggregation,tree,fused",
    [(a, t, f) for f in (False, True) for a, t in (("baseline", 0), ("linear", 0), ("linear", 2), ("cross", 2))],
)
def test_compute_model_counts_match_the_model_it_describes(aggregation, tree, fused):
    """The cost model's FLOPs, bytes and operators of a training step (forward, backward,
    AdamW) against a count of the real one-device model's operators, at sizes the per-channel
    and per-block counts were not taken at (width 48, 3 blocks, batch 3, 24 channels in 4
    groups), for the token path and the fused front end."""
    import torch

    from dchag.benefit.hardware import Compute
    from dchag.benefit.trace import count
    from dchag.benefit.workload import compute_seconds
    from dchag.model import ChannelViT
    from dchag.model.build import model_config_of

    c, groups, b = 24, (1 if aggregation == "baseline" else 4), 3
    cfg = model_config_of(
        in_channels=c,
        img_size=(16, 48),
        patch_size=4,
        embed_dim=48,
        depth=3,
        num_heads=4,
        aggregation=aggregation,
        groups=groups,
        tree=tree,
        task="forecast",
        out_channels=[0, 1],
        fused_front_end=fused,
    )
    torch.manual_seed(0)
    model = ChannelViT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, lead, target = torch.randn(b, c, 16, 48), torch.full((b,), 24.0), torch.randn(b, 2, 16, 48)

    def step():
        ((model(x, lead) - target) ** 2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW's state exists from here on
    real = count(step)
    w = Workload(
        channels=c,
        embed_dim=48,
        depth=3,
        num_heads=4,
        tokens=cfg.num_patches,
        patch_size=4,
        batch=b,
        act_bytes=4,
        out_channels=2,
        tree=tree,
        fused=fused,
    )
    params = sum(p.numel() for p in model.parameters())
    assert w.params(aggregation, groups) == pytest.approx(params, rel=0.02)
    parts = w.step_work(c, aggregation, groups, 1, groups, params)
    total = {k: sum(getattr(p, k) for p in parts) for k in ("flops", "mm_bytes", "bytes", "ops", "views")}
    assert total["flops"] == pytest.approx(real.flops, rel=0.05)
    assert total["mm_bytes"] == pytest.approx(real.mm_bytes, rel=0.2)
    assert total["bytes"] == pytest.approx(real.bytes, rel=0.15)
    assert total["ops"] == pytest.approx(real.ops, rel=0.1)
    assert total["views"] == pytest.approx(real.views, rel=0.15)
    # and the time adds up those counts at the given rates: FLOP-only when nothing else is known
    assert compute_seconds(parts, 1e9) == pytest.approx(total["flops"] / 1e9)
    rates = Compute(1e12, mem_bw=1e9, op_s=1e-5)
    expected = (
        total["flops"] / 1e12 + (total["mm_bytes"] + total["bytes"]) / 1e9 + (total["ops"] + total["views"]) * 1e-5
    )
    assert compute_seconds(parts, rates) == pytest.approx(expected)


def test_bandwidth_curve_interpolates_by_tensor_size():
    from dchag.benefit.hardware import Compute

    c = Compute(1e12, mem_curve=[[2**20, 40e9], [2**26, 10e9]])
    assert c.bandwidth(1e3) == 40e9 and c.bandwidth(2**30) == 10e9
    assert c.bandwidth(2**23) == pytest.approx(25e9)  # halfway in log size
    assert Compute(1e12, mem_bw=5e9).bandwidth(1e9) == 5e9


def _training_logs(run: Path, step_ms: float, val_loss: float, steps: int = 12) -> None:
    """Logs as the trainer writes them (its CsvLog), two ranks, constant times per step."""
    from dchag.train.metrics import RANK_FIELDS, CsvLog

    run.mkdir(parents=True)
    log = CsvLog(run / "log.csv", ["step", "loss", "val_loss"], 0)
    ranks = CsvLog(run / "ranks.csv", ["step", "rank", *RANK_FIELDS], 0)
    for step in range(1, steps + 1):
        log.append({"step": step, "loss": 1.0, "val_loss": val_loss if step == steps else None})
        for rank in (0, 1):
            t = step_ms / 1e3 / 4
            ranks.append(
                {
                    "step": step,
                    "rank": rank,
                    "samples_per_s": 1.0,
                    "peak_mem_mib": 10.0 + rank,
                    "t_data": t,
                    "t_forward": t,
                    "t_backward": t,
                    "t_optimizer": t,
                    "t_comm": t / 2,
                }
            )


def test_verification_verdicts_with_repeats(tmp_path):
    """Medians over repeats decide; a change that crosses -5 % within the repeats' range is
    inconclusive; a validation loss more than `tolerance` worse is a no whatever the speed."""
    from dchag.benefit.verify import summarize

    plan = {
        "verify-dp": ([100, 100], 1.0),
        "verify-compress": ([80, 82], 1.01),
        "verify-fixed-group": ([96, 98], 1.0),
        "verify-dchag-l": ([90, 99], 1.0),
        "verify-rotation": ([70, 71], 1.2),
    }
    runs = {}
    for name, (times, val) in plan.items():
        for i, ms in enumerate(times, 1):
            _training_logs(tmp_path / f"{name}-r{i}", ms, val)
            runs[f"{name}-r{i}"] = tmp_path / f"{name}-r{i}"
    df = summarize(runs).set_index("run")
    assert list(df.index) == list(plan) and (df.repeats == 2).all() and (df.steps == 12).all()
    assert df.step_s["verify-compress"] == pytest.approx(0.081) and df.step_s_max["verify-dchag-l"] == pytest.approx(
        0.099
    )
    assert df.peak_mem_mib_max_rank["verify-dp"] == 11.0
    assert dict(df.verdict) == {
        "verify-dp": "reference",
        "verify-compress": "adopt",
        "verify-fixed-group": "no: step time not 5% lower",
        "verify-dchag-l": "inconclusive: the step-time change crosses -5% over the repeats",
        "verify-rotation": "no: validation loss 5%+ worse",
    }
    # one repeat: the median rule alone
    single = summarize({k: v for k, v in runs.items() if k.endswith("-r1")}).set_index("run")
    assert single.verdict["verify-dchag-l"] == "adopt" and single.repeats.eq(1).all()
