"""`dchag calibrate` on two gloo ranks under torchrun, then `dchag advise` from its profile."""

from __future__ import annotations

import json
import subprocess

import yaml
from support import BIN, REPO

from dchag.benefit.costmodel import STRATEGIES
from dchag.cli import main


def test_calibrate_on_a_gloo_group_then_advise(tmp_path):
    out = tmp_path / "hw.yaml"
    proc = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "dchag",
            "calibrate",
            "--config",
            str(REPO / "config" / "demo.yaml"),
            "--batch",
            "2",
            "--repeats",
            "3",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    prof = yaml.safe_load(out.read_text())
    assert prof["alpha"] > 0 and prof["intra_bw"] > 0 and prof["gpus_per_node"] == 2
    assert prof["measured"]["backend"] == "gloo" and prof["measured"]["compute"]["flops_per_s"] > 1e8
    assert len(prof["measured"]["collectives"]["intra"]["all_reduce"]["points"]) >= 5
    assert (
        main(
            [
                "advise",
                "--hardware",
                str(out),
                "--model",
                str(REPO / "config" / "demo.yaml"),
                "--gpus",
                "2",
                "--gpus-per-node",
                "2",
                "--output",
                str(tmp_path / "a.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "a.json").read_text())["recommendation"] in STRATEGIES
