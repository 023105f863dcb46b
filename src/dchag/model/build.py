"""From the config's model section and the data's shape to a ModelConfig.

The model package knows nothing of datasets: the caller gives the channels and image size
(the training tasks read them from the stores or the ERA5 channel list, see
``dchag.train.tasks``).
"""

from __future__ import annotations

from ..config import ConfigError, Settings
from .model import ModelConfig


def model_config(cfg: Settings, task: str, in_channels: int, img_size: tuple[int, int],
                 out_channels: list[int] | None = None, num_classes: int = 0,
                 wavelengths: list[float] | None = None) -> ModelConfig:
    """The model of the config's ``model`` section for ``in_channels`` channels of ``img_size``."""
    m = cfg.model
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
