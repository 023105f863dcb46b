"""dchag: a reproducible pipeline for multi-channel scientific foundation models with D-CHAG."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``dchag.Model``: a model folder from Python (``dchag.Model.load(path)``), imported on
    first use (the pipeline's commands need no torch to start)."""
    if name == "Model":
        from .model.folder import Model

        return Model
    raise AttributeError(f"module 'dchag' has no attribute {name!r}")
