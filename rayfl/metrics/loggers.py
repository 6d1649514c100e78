"""Experiment trackers fed with every metrics row: TensorBoard event files and MLflow runs.

Enabled by the ``loggers`` config section. Each logger receives the full row the server appends
to ``metrics.parquet`` (numbers only; ``round``, 1-based, is the step), so what TensorBoard or
MLflow shows is exactly what the Parquet file holds. A resumed run keeps writing to the same
event directory and the same MLflow run (its id is kept in ``<run_dir>/mlflow_run_id``): a run
that ends is FINISHED in MLflow (FAILED when it diverged, stopped early or raised), one paused
is KILLED until ``rayfl resume`` makes it RUNNING again.
"""

from __future__ import annotations

import math
import os
import re
import sys
from unittest import mock
from urllib.parse import urlparse

from rayfl.creatable import check_creatable
from rayfl.schema import ConfigError

TENSORBOARD_DIR = "tensorboard"
MLFLOW_RUN_ID = "mlflow_run_id"


def scalars(row: dict) -> dict[str, float]:
    """The row's finite numeric values except ``round`` (booleans and strings dropped)."""
    out = {}
    for key, value in row.items():
        if key == "round" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def flat_params(raw: dict, prefix: str = "") -> dict[str, str]:
    """A nested config dict as dotted ``key → str(value)`` pairs (MLflow params)."""
    out = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


class TensorBoardLogger:
    """Scalars under ``<run_dir>/tensorboard`` (``tensorboard --logdir RUN_DIR``)."""

    def __init__(self, run_dir: str):
        self.logdir = os.path.join(run_dir, TENSORBOARD_DIR)
        self.writer = None  # opened with the first row: nothing is written before

    def log(self, row: dict) -> None:
        if self.writer is None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(logdir=self.logdir)
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=row["round"])
        self.writer.flush()

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None  # a later row opens a new event file

    interrupt = close


class MLflowLogger:
    """One MLflow run per rayfl run: the resolved config as params, every row as metrics.

    The MLflow run is made with the run's first row (or its end), not before: a run stopped
    before it recorded a round leaves none (its directory is removed too)."""

    def __init__(self, run_dir: str, record):
        """``record``: the run's :class:`~rayfl.metrics.log.RunRecord` (its name, ``loggers``
        section and params)."""
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the local ``mlruns`` store
        self.run_dir, self.record = run_dir, record
        self.client, self.run_id = None, None

    def _run(self) -> str:
        """The MLflow run's id, made (or, on resume, read from the run directory and marked
        RUNNING again) once."""
        if self.run_id is not None:
            return self.run_id
        from mlflow import MlflowClient

        record, run_dir = self.record, self.run_dir
        self.client = MlflowClient(tracking_uri=store_of(record.loggers, run_dir))
        id_path = os.path.join(run_dir, MLFLOW_RUN_ID)
        self.run_id = recorded_run(run_dir)
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            return self.run_id
        name = record.loggers.mlflow_experiment or record.name
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        run = self.client.create_run(experiment, run_name=os.path.basename(run_dir),
                                     tags={"rayfl.run_dir": os.path.abspath(run_dir)})
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in record.params.items()]
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(run.info.run_id, params=params[i:i + 100])
        with open(id_path, "w") as f:
            f.write(run.info.run_id)
        self.run_id = run.info.run_id
        return self.run_id

    def log(self, row: dict) -> None:
        from mlflow.entities import Metric

        run_id = self._run()
        stamp = int(1000 * row.get("elapsed_s", 0.0))
        metrics = [Metric(k, v, stamp, row["round"]) for k, v in scalars(row).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i:i + 1000])

    def close(self, status: str) -> None:
        run_id = self._run()
        self.client.set_terminated(run_id, status=status)

    def interrupt(self, status: str) -> None:
        """End the MLflow run with ``status`` if this process opened it (a run interrupted
        before its first row here leaves the MLflow run as it was); a later row reopens it."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)
            self.run_id = None


def recorded_run(run_dir: str) -> str | None:
    """The id of the MLflow run ``run_dir`` logs to (``mlflow_run_id``); None: none yet."""
    path = os.path.join(run_dir, MLFLOW_RUN_ID)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def store_of(loggers, run_dir: str) -> str:
    """The MLflow tracking URI of the run in ``run_dir``: ``loggers.mlflow_uri``, by default
    the local store beside the run directory (<output_dir>/mlruns), resolved from ``run_dir``
    (absolute: the server actor's working directory need not be the user's)."""
    return loggers.mlflow_uri or os.path.join(os.path.dirname(run_dir), "mlruns")


def check_mlflow(loggers, run_dir: str | None = None) -> None:
    """Before a run starts, creating no store: ``loggers.mlflow_uri`` is a store MLflow takes
    that could hold the run — a local directory (a path or ``file:``) or SQLite file that can
    be made, an HTTP server that answers, a database or Databricks URI (taken as written) —
    and the MLflow run a resumed ``run_dir`` logs to (``mlflow_run_id``) is in its store (the
    default: ``mlruns`` beside the run directory). A ConfigError on ``loggers.mlflow_uri``
    otherwise."""
    if not loggers.mlflow:
        return
    id_path = os.path.join(run_dir, MLFLOW_RUN_ID) if run_dir else ""
    run_id = recorded_run(run_dir) if run_dir else None
    if loggers.mlflow_uri is None and run_id is None:
        return  # a new run's default store, made with its first row
    uri = store_of(loggers, run_dir)
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", uri)
    scheme = match.group(1).lower().split("+")[0] if match else ""
    wanted = "a tracking store MLflow reaches" if run_id is None else (
        f"the store of MLflow run {run_id} (recorded in {id_path}: was the run directory "
        "moved? set loggers.mlflow_uri in its config.yaml to that store, delete mlflow_run_id "
        "to log the rounds to come to a new MLflow run, or set loggers.mlflow to false)")

    def refuse(why: str) -> ConfigError:
        return ConfigError("loggers.mlflow_uri", loggers.mlflow_uri, f"{wanted}; {why}")

    if scheme in ("", "file", "sqlite"):
        path = uri if not scheme else urlparse(uri).path if scheme == "file" \
            else uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path:
            raise refuse("a SQLite URI is sqlite:///PATH")
        if run_id is None:  # made with the run's first row
            check_creatable(path if scheme != "sqlite" else os.path.dirname(path) or ".",
                            "loggers.mlflow_uri")
            return
        if not os.path.exists(path):
            raise refuse(f"{path} does not exist")
    elif scheme not in ("http", "https"):
        if scheme in ("postgresql", "mysql", "mssql", "databricks"):
            return  # reaching one may take minutes of the driver's retries: taken as written
        raise refuse(f"{uri} is not a store MLflow takes (a path, file:, sqlite:, http:, https:, "
                     "postgresql:, mysql:, mssql: or databricks)")
    _reach(uri, run_id, refuse)


def _reach(uri: str, run_id: str | None, refuse) -> None:
    """Ask the store at ``uri`` for the run ``run_id`` (None: for an experiment), once."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow import MlflowClient

        with mock.patch.dict(os.environ, _QUICK):  # a dead server: one try, not minutes
            client = MlflowClient(tracking_uri=uri)
            if run_id is None:
                client.search_experiments(max_results=1)
            else:
                client.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - any failure of the store is the URI's
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise refuse(f"{type(e).__name__}: {first}") from None


#: MLflow's HTTP client settings for the pre-flight's one request
_QUICK = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def end_run(loggers, run_dir: str, status: str) -> None:
    """Mark the MLflow run of ``run_dir`` ``status`` from the driver (a Ray run stopped by
    Ctrl-C, a lost actor or server: the server could not); a warning when it cannot."""
    run_id = recorded_run(run_dir) if loggers.mlflow else None
    if run_id is None:
        return
    try:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=store_of(loggers, run_dir)).set_terminated(run_id,
                                                                             status=status)
    except Exception as e:  # noqa: BLE001 - the run's own stop is the one to report
        print(f"rayfl: warning: the MLflow run could not be marked {status} "
              f"({type(e).__name__}: {e})", file=sys.stderr)


def open_loggers(run_dir: str, record) -> list:
    """The loggers the run's ``loggers`` section enables (none by default); ``record``: the
    run's :class:`~rayfl.metrics.log.RunRecord`."""
    out = []
    if record.loggers.tensorboard:
        out.append(TensorBoardLogger(run_dir))
    if record.loggers.mlflow:
        out.append(MLflowLogger(run_dir, record))
    return out
