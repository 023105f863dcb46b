"""Experiment tracking in MLflow (``train.mlflow``; the optional ``mlflow`` extra).

Rank 0 of a run opens one MLflow run, named after the training run, in the experiment
``train.mlflow.experiment`` (default: the config's name): its params are the run's resolved
config flattened to dotted keys (``train.lr``, ``model.embed_dim``; the whole config is also
the artifact ``config.json``), its tags the provenance (``code_revision``, ``command``,
``version.<package>``), and each step's metrics are those of ``log.csv`` at the step's number,
named as in TensorBoard (``train/loss``, ``val/loss``). Every checkpoint keeps the run's
reference (``mlflow.json``: tracking URI and run id), so a run resumed from it (a torchrun
restart, a rerun after a stop, a longer rerun) continues the same MLflow run; ``dchag export``
logs the model folder to it as the artifact ``model/``.

The store: ``train.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else an SQLite file beside
the runs (``<run>/../mlflow/mlflow.db``, artifacts in ``artifacts/`` beside it): no server, works
offline. MLflow 3 keeps its file store (``./mlruns``) in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is set; a database is what it recommends, and SQLite needs none.
Jobs sharing the file open it one at a time (a lock beside it): MLflow creates its tables on
first use, and two processes doing so at once fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

from .. import provenance
from ..config import ConfigError

log = logging.getLogger(__name__)

RECORD = "mlflow.json"  # in every checkpoint: where its MLflow run is
_LIMITS = {"param": 6000, "tag": 8000}  # MLflow's longest param and tag values
_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def tracking_uri(mlflow_settings, run_dir: str | Path) -> str:
    """The run's tracking URI: the setting, else MLFLOW_TRACKING_URI, else the SQLite file
    ``<run_dir>/../mlflow/mlflow.db``."""
    if mlflow_settings.tracking_uri:
        return mlflow_settings.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{Path(run_dir).resolve().parent / 'mlflow' / 'mlflow.db'}"


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def require(uri: str, run: str) -> None:
    """One line when what ``uri`` needs is not installed: MLflow, and SQLAlchemy and Alembic for a database."""
    needed = ["mlflow", *(["sqlalchemy", "alembic"] if urlparse(uri).scheme.split("+")[0] in _DATABASES else [])]
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"run {run!r}: train.mlflow.enabled is true but {', '.join(missing)} is not installed "
            "(pip install 'dchag[mlflow]')"
        )


def check(cfg, run_dir: str | Path) -> None:
    """Before a launch: what the run's MLflow store needs is installed (nothing when off)."""
    if cfg.train.mlflow.enabled:
        require(tracking_uri(cfg.train.mlflow, run_dir), cfg.run)


def _open(uri: str, experiment: str | None = None):
    """An MlflowClient of ``uri`` and the id of ``experiment`` (made when new; artifacts of an
    SQLite store in ``artifacts/`` beside its file). An SQLite file is opened (its tables made)
    and the experiment made under a lock beside the file."""
    from mlflow import MlflowClient

    path = _sqlite_path(uri)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") if path else contextlib.nullcontext() as lock:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(uri)
        if experiment is None:
            return client, None
        found = client.get_experiment_by_name(experiment)
        location = (path.parent / "artifacts").as_uri() if path is not None else None
        return client, found.experiment_id if found else client.create_experiment(experiment, location)


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            text = v if isinstance(v, str) else json.dumps(v)
            limit = _LIMITS["param"]
            out[f"{prefix}{k}"] = text if len(text) <= limit else text[: limit - 1] + "…"
    return out


def params(cfg) -> dict[str, str]:
    """The run's resolved config (``cfg``: its RunSettings) as MLflow params: the sections with
    the run's overrides and the schema's defaults, less the other runs."""
    raw = {k: v for k, v in cfg.raw.items() if k != "train"}
    train = {k: v for k, v in cfg.raw["train"].items() if k != "runs"}
    spec = {"run": cfg.run, "task": cfg.task.value, "init_from": cfg.init_from, "channels": cfg.channels}
    return _flatten({**raw, "train": train, **spec})


def tags(cfg, world_size: int) -> dict[str, str]:
    """The run's provenance as MLflow tags."""
    rec = provenance.record()
    out = {
        "code_revision": rec["code_revision"],
        "command": rec["command"][: _LIMITS["tag"]],
        "world_size": str(world_size),
        "mlflow.source.name": "dchag train",
        **{f"version.{k}": v for k, v in rec["packages"].items()},
    }
    commit = re.fullmatch(r"([0-9a-f]{7,40})(-dirty)?", rec["code_revision"])
    if commit:
        out["mlflow.source.git.commit"] = commit.group(1)
    return out


def read_record(checkpoint: str | Path | None) -> dict | None:
    """The MLflow run a checkpoint belongs to (None: none recorded)."""
    path = Path(checkpoint) / RECORD if checkpoint is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        log.warning(f"{path} is not readable JSON: its MLflow run is not continued")
        return None


class MlflowRun:
    """Rank 0's MLflow run of one training run: opened by :func:`start`, metrics per step
    (:meth:`log_step`), its reference for the checkpoints (:meth:`record`), ended by :meth:`end`."""

    def __init__(self, client, uri: str, run_id: str):
        self.client, self.uri, self.run_id = client, uri, run_id
        self.failed: list[int] = []

    def log_step(self, step: int, values: dict[str, float]) -> None:
        """One step's metrics; a failure (a busy or unreachable store) is warned about and the
        training goes on (log.csv has every step)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])
        except Exception as err:  # MLflow raises its own and the store's (SQLAlchemy, HTTP) errors
            self.failed.append(step)
            if len(self.failed) == 1:
                log.warning(f"MLflow ({self.uri}) did not take step {step}'s metrics: {str(err).splitlines()[0]}")

    def record(self) -> str:
        return json.dumps({"tracking_uri": self.uri, "run_id": self.run_id})

    def end(self, status: str) -> None:
        """``status``: FINISHED, KILLED (stopped, to be continued) or FAILED. Called as the run
        ends, an exception perhaps in flight: a store that fails now is warned about."""
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as err:  # as in log_step
            log.warning(f"MLflow ({self.uri}) did not take run {self.run_id}'s end ({status}): {err}")
        if self.failed:
            log.warning(
                f"MLflow did not take the metrics of {len(self.failed)} step(s) (the first: {self.failed[0]}); "
                "log.csv has them"
            )


def _continued(client, uri: str, previous: dict | None) -> str | None:
    """The run id to continue: the resumed checkpoint's, when it is in this store."""
    from mlflow.exceptions import MlflowException

    if previous is None:
        return None
    if previous.get("tracking_uri") != uri:
        log.info(f"the checkpoint's MLflow run is in {previous.get('tracking_uri')}, not {uri}: a new run starts")
        return None
    try:
        return client.get_run(previous["run_id"]).info.run_id
    except (MlflowException, KeyError):
        log.warning(f"MLflow run {previous.get('run_id')} is not in {uri}: a new run starts")
        return None


def _log_params(client, run_id: str, wanted: dict[str, str], step: int) -> None:
    """Params MLflow does not hold yet; one it holds with another value (MLflow's params do not
    change: a resumed run with a longer train.steps) becomes the tag ``changed.<key>``."""
    from mlflow.entities import Param, RunTag

    held = client.get_run(run_id).data.params
    new = [Param(k, v) for k, v in wanted.items() if k not in held]
    changed = [
        RunTag(f"changed.{k}", f"{held[k]} -> {v} at step {step}") for k, v in wanted.items() if held.get(k, v) != v
    ]
    for i in range(0, max(len(new), len(changed)), 100):  # MLflow takes 100 params and tags per call
        client.log_batch(run_id, params=new[i : i + 100], tags=changed[i : i + 100])


def start(cfg, run_dir: str | Path, resumed: Path | None, step: int, rank: int, world_size: int) -> MlflowRun | None:
    """Rank 0's MLflow run (None elsewhere, or when train.mlflow is off): the run of the
    resumed checkpoint when it has one in this store, else a new one."""
    settings = cfg.train.mlflow
    if rank != 0 or not settings.enabled:
        return None
    uri = tracking_uri(settings, run_dir)
    require(uri, cfg.run)
    name = settings.experiment or cfg.name
    from mlflow.exceptions import MlflowException

    try:
        client, experiment_id = _open(uri, name)
    except MlflowException as err:  # an unknown scheme, a refused file store, an unreachable server
        raise ConfigError(f"run {cfg.run!r}: train.mlflow cannot open {uri}: {str(err).splitlines()[0]}") from None
    run_id = _continued(client, uri, read_record(resumed))
    if run_id is None:
        run_id = client.create_run(experiment_id, tags=tags(cfg, world_size), run_name=cfg.run).info.run_id
    else:
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, "resumed_at_step", str(step))
    _log_params(client, run_id, params(cfg), step)
    client.log_dict(run_id, json.loads(json.dumps(cfg.raw, default=str)), "config.json")
    log.info(f"MLflow: run {run_id} of experiment {name!r} in {uri}")
    return MlflowRun(client, uri, run_id)


def log_model(config: dict, run: str, checkpoint: str | Path, model_dir: str | Path) -> None:
    """The model folder exported from ``checkpoint``, as the artifact ``model/`` of the
    checkpoint's MLflow run (when the run's train.mlflow is on)."""
    from ..config import run_settings

    if not run_settings(config, run).train.mlflow.enabled:
        return
    record = read_record(checkpoint)
    if record is None:
        log.warning(
            f"checkpoint {checkpoint} has no MLflow run (trained without train.mlflow): the model is not logged"
        )
        return
    require(record["tracking_uri"], run)
    from ..model.folder import META, WEIGHTS

    client, _ = _open(record["tracking_uri"])
    for name in (META, WEIGHTS):  # the folder's files (not the mark of a dchag output)
        client.log_artifact(record["run_id"], str(Path(model_dir) / name), artifact_path="model")
    log.info(f"MLflow: logged {model_dir} to run {record['run_id']} as model/")
