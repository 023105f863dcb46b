"""From the config's model section and the data's shape to a ModelConfig: the one builder.

The model package knows nothing of datasets: the caller gives the channels and image size
(the training tasks read them from the stores; the forecasting model of an ERA5 config is
``dchag.era5.source.forecast_model_config``; the paper's benchmark points build their
settings with ``dchag.config.model_settings``).
"""

from __future__ import annotations

from ..config import ConfigError, ModelSettings, model_settings
from ..vocabulary import Aggregation
from .model import ModelConfig


def model_config(
    model: ModelSettings,
    tp: int,
    task: str,
    in_channels: int,
    img_size: tuple[int, int],
    out_channels: list[int] | None = None,
    num_classes: int = 0,
    wavelengths: list[float] | None = None,
) -> ModelConfig:
    """The model of a ``model`` section for ``in_channels`` channels of ``img_size``; the
    hierarchical aggregation has ``model.groups`` groups, or one per tensor-parallel rank."""
    hierarchical = model.aggregation != Aggregation.BASELINE
    try:
        return ModelConfig(
            in_channels=in_channels,
            img_size=tuple(img_size),
            patch_size=model.patch_size,
            embed_dim=model.embed_dim,
            depth=model.depth,
            num_heads=model.num_heads,
            mlp_ratio=model.mlp_ratio,
            aggregation=model.aggregation,
            groups=(model.groups or tp) if hierarchical else 1,
            tree=model.tree,
            task=task,
            decoder_dim=model.decoder.dim,
            decoder_depth=model.decoder.depth,
            decoder_heads=model.decoder.num_heads,
            fused_front_end=model.fused_front_end,
            out_channels=list(out_channels or []),
            num_classes=num_classes,
            wavelengths=wavelengths,
        )
    except ValueError as err:
        raise ConfigError(f"config key 'model': {err}") from err


def model_config_of(
    task: str,
    in_channels: int,
    img_size: tuple[int, int],
    *,
    tp: int = 1,
    out_channels: list[int] | None = None,
    num_classes: int = 0,
    wavelengths: list[float] | None = None,
    **model,
) -> ModelConfig:
    """:func:`model_config` for a library caller with no config file: ``model`` holds the
    ``model`` section's keys to set (the schema's defaults fill the rest)."""
    return model_config(
        model_settings(**model), tp, task, in_channels, img_size, out_channels, num_classes, wavelengths
    )
