"""The model, written once for one device (parallelizations live in dchag.parallel)."""

from .model import AGGREGATIONS, TASKS, ChannelViT, ModelConfig, channel_groups, random_masking

__all__ = ["AGGREGATIONS", "TASKS", "ChannelViT", "ModelConfig", "channel_groups", "random_masking"]
