"""One name for each concept, as the config writes it. Everything else (labels in figures,
the cost model's strategy names, the paper's variants) is looked up here, never re-spelt.

The convention:

* ``Task``: what a run learns — ``forecast`` (ERA5), ``mae`` (masked autoencoding of
  hyperspectral tiles), ``classification`` (hyperspectral patches). The task's data is the
  config section of the same name (``era5``, ``hsi.mae``, ``hsi.classification``) and its store
  ``era5/train.zarr``, ``hsi/mae.zarr``, ``hsi/classification.zarr``.
* ``Aggregation`` (``model.aggregation``): how the channels' tokens become one token per patch —
  ``baseline`` one query cross-attending over all channels (ClimaX), ``linear`` / ``cross`` the
  hierarchical aggregation with -L / -C partial aggregators.
* ``Strategy`` (``parallel.strategy``): how tensor parallelism places the channels —
  ``baseline`` every rank tokenizes all channels (plain TP, the paper's comparison point),
  ``dchag`` rank r holds channel group r.
* ``DataParallel`` (``parallel.data_parallel``): how the data-parallel replicas share the work;
  their number is a degree (``dp``), the processes over ``parallel.tp``.
* ``Variant``: the paper's names for an aggregation with a strategy — ``baseline`` (baseline
  aggregation, plain TP), ``dchag-l`` / ``dchag-c`` (D-CHAG with -L / -C) — and the front-end
  ablations of its benchmark; each with its label and the cost model's strategy name.

"baseline" is thus an aggregation, a strategy and a variant, always the paper's comparison
point of that concept; a label says which (``VARIANTS[...].label``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Task(StrEnum):
    FORECAST = "forecast"
    MAE = "mae"
    CLASSIFICATION = "classification"


class Aggregation(StrEnum):
    BASELINE = "baseline"
    LINEAR = "linear"
    CROSS = "cross"


class Strategy(StrEnum):
    BASELINE = "baseline"
    DCHAG = "dchag"


class MeshAxis(StrEnum):
    """The device mesh's named dimensions: data-parallel replicas (``dp``) by tensor-parallel
    ranks (``tp``), in that order (a tensor-parallel group is consecutive ranks)."""

    DP = "dp"
    TP = "tp"


class DataParallel(StrEnum):
    FSDP = "fsdp"
    DDP = "ddp"
    NONE = "none"


@dataclass(frozen=True)
class Variant:
    name: str
    aggregation: Aggregation
    strategy: Strategy
    label: str
    cost_model: str | None  # the cost model's strategy (dchag.benefit.costmodel.STRATEGIES)
    front_only: bool = False  # a benchmark ablation of the front end alone (no ViT)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("baseline", Aggregation.BASELINE, Strategy.BASELINE, "baseline", "tp"),
        Variant("dchag-l", Aggregation.LINEAR, Strategy.DCHAG, "D-CHAG-L", "dchag-l"),
        Variant("dchag-c", Aggregation.CROSS, Strategy.DCHAG, "D-CHAG-C", "dchag-c"),
        Variant("tokenize", Aggregation.BASELINE, Strategy.BASELINE, "baseline tokenization", None, True),
        Variant("tokenize+aggregate", Aggregation.BASELINE, Strategy.BASELINE, "+ aggregation", None, True),
        Variant("dist-tokenize", Aggregation.LINEAR, Strategy.DCHAG, "distributed tokenization", None, True),
        Variant(
            "dist-tokenize+gather-all",
            Aggregation.LINEAR,
            Strategy.DCHAG,
            "distributed tokenization + AllGather of all tokens",
            None,
            True,
        ),
    )
}
MODEL_VARIANTS = tuple(n for n, v in VARIANTS.items() if not v.front_only)
FRONT_VARIANTS = tuple(n for n, v in VARIANTS.items() if v.front_only)
