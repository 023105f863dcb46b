"""Loading and checking the pipeline config against ``schemas/config.schema.yaml``, and the
typed view of it that the code reads.

Defaults live in the schema only: validation fills every default in, and the dataclasses
of :mod:`.settings` have no defaults of their own, so a key the schema does not default is an
error here rather than a silent fallback somewhere else. The Snakefile validates with
Snakemake's ``validate`` (same schema) and then calls :func:`check_config`; the CLI loads files
with :func:`load_config`, which does both; :func:`settings` and :func:`run_settings` give the
typed objects.

``limits`` (ConfigError, size bounds), ``schema`` (the schema, its defaults, validation),
``inputs`` (what the schema cannot check: years, channels, input files), ``files`` (reading a
YAML file), ``settings`` (the typed view).
"""

from .files import load_config, read_yaml
from .inputs import check_config, era5_input_paths
from .limits import MAX_BYTES, ConfigError, expanded_size
from .schema import SCHEMA_PATH, schema, schema_default, schema_enum, validate
from .settings import (
    Decoder,
    EvaluateSettings,
    ForecastSettings,
    MaeSettings,
    ModelSettings,
    ParallelSettings,
    Rotation,
    RunSettings,
    Settings,
    TrainSettings,
    VerifySettings,
    deep_merge,
    model_settings,
    parallel_settings,
    run_dict,
    run_settings,
    settings,
)

__all__ = [
    "MAX_BYTES",
    "SCHEMA_PATH",
    "ConfigError",
    "Decoder",
    "EvaluateSettings",
    "ForecastSettings",
    "MaeSettings",
    "ModelSettings",
    "ParallelSettings",
    "Rotation",
    "RunSettings",
    "Settings",
    "TrainSettings",
    "VerifySettings",
    "check_config",
    "deep_merge",
    "era5_input_paths",
    "expanded_size",
    "load_config",
    "model_settings",
    "parallel_settings",
    "read_yaml",
    "run_dict",
    "run_settings",
    "schema",
    "schema_default",
    "schema_enum",
    "settings",
    "validate",
]
