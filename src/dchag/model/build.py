"""From the pipeline config (and the data it describes) to a ModelConfig."""

from __future__ import annotations

from ..config import ConfigError, Settings
from .model import ModelConfig

DEFAULT_FORECAST_OUTPUTS = ("z500", "t850", "t2m", "u10", "v10")


def forecast_outputs(cfg: Settings, names: list[str]) -> list[str]:
    """The forecast variables: train.forecast.outputs, or (null) the default five that are among ``names``."""
    outputs = cfg.train.forecast.outputs
    return list(outputs) if outputs else [n for n in DEFAULT_FORECAST_OUTPUTS if n in names]


def era5_shape(cfg: Settings) -> tuple[list[str], tuple[int, int]]:
    from ..era5.source import channels_from_config
    from ..grids import weatherbench_grid

    names = [c.name for c in channels_from_config(cfg.era5)]
    return names, weatherbench_grid(cfg.era5["grid"]).shape


def model_config(cfg: Settings, task: str = "forecast", in_channels: int | None = None,
                 img_size: tuple[int, int] | None = None, out_channels: list[int] | None = None,
                 num_classes: int = 0, wavelengths: list[float] | None = None) -> ModelConfig:
    """The model of the config's ``model`` section; channels and image size from the arguments
    or, for ERA5, from the config's channel list and grid."""
    m = cfg.model
    if in_channels is None or img_size is None:
        if cfg.era5 is None:
            raise ConfigError("cannot tell the model's channels and image size: the config has no era5 section")
        names, shape = era5_shape(cfg)
        in_channels = in_channels or len(names)
        img_size = img_size or shape
        if task == "forecast" and out_channels is None:
            out_channels = [names.index(n) for n in forecast_outputs(cfg, names) if n in names]
    groups = m.groups or cfg.parallel.tp
    try:
        return ModelConfig(
            in_channels=in_channels,
            img_size=tuple(img_size),
            patch_size=m.patch_size,
            embed_dim=m.embed_dim,
            depth=m.depth,
            num_heads=m.num_heads,
            mlp_ratio=m.mlp_ratio,
            aggregation=m.aggregation,
            groups=groups if m.aggregation != "baseline" else 1,
            tree=m.tree,
            task=task,
            out_channels=list(out_channels or []),
            num_classes=num_classes,
            decoder_dim=m.decoder.dim,
            decoder_depth=m.decoder.depth,
            decoder_heads=m.decoder.num_heads,
            wavelengths=wavelengths,
        )
    except ValueError as err:
        raise ConfigError(f"config key 'model': {err}") from err
