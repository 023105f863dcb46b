"""From the pipeline config (and the data it describes) to a ModelConfig."""

from __future__ import annotations

from ..config import ConfigError
from .model import ModelConfig

DEFAULT_FORECAST_OUTPUTS = ("z500", "t850", "t2m", "u10", "v10")


def forecast_outputs(config: dict, names: list[str]) -> list[str]:
    """The forecast variables: train.forecast.outputs, or the default five that are among ``names``."""
    outputs = config.get("train", {}).get("forecast", {}).get("outputs")
    return list(outputs) if outputs else [n for n in DEFAULT_FORECAST_OUTPUTS if n in names]


def era5_shape(config: dict) -> tuple[list[str], tuple[int, int]]:
    from ..era5.source import channels_from_config
    from ..grids import weatherbench_grid

    era5 = config["era5"]
    names = [c.name for c in channels_from_config(era5)]
    return names, weatherbench_grid(era5.get("grid", 5.625)).shape


def model_config(config: dict, task: str = "forecast", in_channels: int | None = None,
                 img_size: tuple[int, int] | None = None, out_channels: list[int] | None = None,
                 num_classes: int = 0, wavelengths: list[float] | None = None) -> ModelConfig:
    """The model of ``config['model']``; channels and image size from the arguments or, for
    ERA5, from the config's channel list and grid."""
    m = config.get("model", {})
    par = config.get("parallel", {})
    if in_channels is None or img_size is None:
        if "era5" not in config:
            raise ConfigError("cannot tell the model's channels and image size: the config has no dataset section")
        names, shape = era5_shape(config)
        in_channels = in_channels or len(names)
        img_size = img_size or shape
        if task == "forecast" and out_channels is None:
            out_channels = [names.index(n) for n in DEFAULT_FORECAST_OUTPUTS if n in names]
    dec = m.get("decoder", {})
    groups = m.get("groups") or par.get("tp", 1)
    try:
        return ModelConfig(
            in_channels=in_channels,
            img_size=tuple(img_size),
            patch_size=m.get("patch_size", 4),
            embed_dim=m.get("embed_dim", 128),
            depth=m.get("depth", 4),
            num_heads=m.get("num_heads", 4),
            mlp_ratio=m.get("mlp_ratio", 4.0),
            aggregation=m.get("aggregation", "linear"),
            groups=groups if m.get("aggregation", "linear") != "baseline" else 1,
            tree=m.get("tree", 0),
            task=task,
            out_channels=list(out_channels or []),
            num_classes=num_classes,
            decoder_dim=dec.get("dim", 64),
            decoder_depth=dec.get("depth", 2),
            decoder_heads=dec.get("num_heads", 4),
            wavelengths=wavelengths,
        )
    except ValueError as err:
        raise ConfigError(f"config key 'model': {err}") from err
