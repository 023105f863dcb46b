"""dchag: a reproducible pipeline for multi-channel scientific foundation models with D-CHAG."""

__version__ = "0.1.0"
