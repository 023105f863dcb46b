"""Proofs on CPU with gloo, in 2 and 4 processes: D-CHAG and TP equal the one-device model."""

from __future__ import annotations

import pytest
from support import parallel_checks as checks
from support.distributed import run_distributed

DCHAG_CASES = {
    2: [
        dict(aggregation="linear", groups=2, tree=0),
        dict(aggregation="linear", groups=2, tree=2),
        dict(aggregation="cross", groups=2, tree=0),
        dict(aggregation="cross", groups=2, tree=4),
        # the other tasks, with uneven blocks (4 + 3 channels)
        dict(aggregation="linear", groups=2, in_channels=7, task="mae", out_channels=[]),
        dict(aggregation="cross", groups=2, in_channels=7, task="classification", out_channels=[], num_classes=3),
    ],
    4: [
        dict(aggregation="linear", groups=4, tree=0),
        dict(aggregation="linear", groups=4, tree=2),
        dict(aggregation="cross", groups=4, tree=2),
        dict(aggregation="linear", groups=4, in_channels=10),  # uneven: 3, 3, 2, 2
        dict(aggregation="cross", groups=4, in_channels=10),
        dict(aggregation="linear", groups=4, in_channels=10, task="mae", out_channels=[]),
        dict(aggregation="linear", groups=4, in_channels=10, task="classification", out_channels=[], num_classes=3),
    ],
}


@pytest.mark.parametrize("world", [2, 4])
def test_dchag_equals_one_device_hierarchical_model(world):
    run_distributed(checks.check_tp_matches_one_device, world, "dchag", DCHAG_CASES[world])


@pytest.mark.parametrize("world", [2, 4])
def test_baseline_tp_equals_one_device_model(world):
    run_distributed(
        checks.check_tp_matches_one_device,
        world,
        "baseline",
        [
            dict(aggregation="baseline"),
            dict(aggregation="baseline", task="classification", out_channels=[], num_classes=3),
        ],
    )


@pytest.mark.parametrize("strategy", ["dchag", "baseline"])
def test_communication_per_step(strategy):
    run_distributed(checks.check_communication, 2, strategy)


@pytest.mark.parametrize(
    "world, tp, dp_mode, strategy, frozen",
    [
        (2, 1, "ddp", "baseline", ()),
        (2, 1, "fsdp", "baseline", ()),
        (4, 2, "fsdp", "dchag", ()),
        (2, 1, "ddp", "baseline", ("tokenizer", "aggregation", "blocks")),
        (4, 2, "fsdp", "dchag", ("tokenizer", "aggregation", "blocks")),
    ],
    ids=["ddp", "fsdp", "fsdp x dchag (4 ranks)", "ddp, a linear probe", "fsdp x dchag, a linear probe (4 ranks)"],
)
def test_data_parallel_step_equals_full_batch_step(world, tp, dp_mode, strategy, frozen):
    run_distributed(checks.check_data_parallel_step, world, tp, dp_mode, strategy, frozen)


def test_activation_checkpointing_changes_nothing():
    run_distributed(checks.check_activation_checkpointing, 2)
