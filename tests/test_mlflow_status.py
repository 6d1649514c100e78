"""The MLflow run says how the rayfl run stands: FINISHED at its end, KILLED while paused,
RUNNING again on resume, FAILED when a round raised — every recorded round kept in one run."""

from __future__ import annotations

import os

import pytest

import rayfl
from rayfl.contract import ComponentError
from rayfl.transforms import Transform
from tests.conftest import TINY

HERE = "tests.test_mlflow_status"
OVERRIDES = ["runtime.executor=inprocess", "rounds=4", "loggers.mlflow=true"]


class BreaksInRoundThree(Transform):
    def aggregate(self, slot, agg, sums, srv):
        if srv.t == 2:
            raise RuntimeError("broke in round 3")
        return agg, slot, {}


def _mlflow_run(parent):
    """(status, rounds logged) of the one MLflow run in the store under ``parent``."""
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=str(parent / "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    rounds = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss"))
    return run.info.status, rounds


def test_a_paused_run_is_killed_until_resumed_and_then_finished(tiny, tmp_path):
    paused = rayfl.run(TINY, tiny + OVERRIDES, quiet=True, max_rounds=2)
    assert _mlflow_run(tmp_path / "runs") == ("KILLED", [1, 2])
    rayfl.resume(paused.run_dir, quiet=True)
    assert _mlflow_run(tmp_path / "runs") == ("FINISHED", [1, 2, 3, 4])


def test_a_run_that_raises_after_its_first_rounds_is_failed(tiny, tmp_path):
    with pytest.raises(ComponentError, match="broke in round 3"):
        rayfl.run(TINY, tiny + OVERRIDES +
                  [f"aggregation.transforms=[{{name: '{HERE}:BreaksInRoundThree'}}]"],
                  quiet=True)
    assert _mlflow_run(tmp_path / "runs") == ("FAILED", [1, 2])


def test_loggers_may_change_on_resume_and_an_older_record_of_them_is_ignored(tiny, tmp_path):
    """Trackers change no result: a resume may switch them (it was refused), and a run whose
    fingerprint and checkpoint recorded them (as rayfl did before) resumes."""
    import json

    from rayfl.runtime import checkpoint

    run_dir = tmp_path / "paused"
    rayfl.run(TINY, tiny + OVERRIDES, run_dir=str(run_dir), quiet=True, max_rounds=2)
    fingerprint = run_dir / "fingerprint.json"
    recorded = json.loads(fingerprint.read_text())
    recorded["values"]["loggers.mlflow"] = True
    fingerprint.write_text(json.dumps(recorded))
    ck = checkpoint.load(str(run_dir))
    ck[checkpoint.IDENTITY]["loggers.mlflow"] = True
    checkpoint.save(str(run_dir), ck)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("mlflow: true", "mlflow: false"))
    resumed = rayfl.resume(str(run_dir), quiet=True)
    plain = rayfl.run(TINY, tiny + OVERRIDES[:-1], run_dir=str(tmp_path / "plain"), quiet=True)
    assert resumed.summary["model_sha256"] == plain.summary["model_sha256"]
    assert _mlflow_run(tmp_path) == ("KILLED", [1, 2])  # no longer logged to


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9"])
def test_a_tracking_store_that_does_not_answer_is_refused_before_anything_is_created(
        tiny, tmp_path, uri):
    """It was a traceback after round 1, and a run directory left behind."""
    from rayfl.schema import ConfigError

    with pytest.raises(ConfigError) as err:
        rayfl.run(TINY, tiny + OVERRIDES + [f"loggers.mlflow_uri={uri}"], quiet=True)
    assert err.value.key == "loggers.mlflow_uri" and "a tracking store MLflow reaches" in \
        str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_run_directory_moved_from_its_store_is_told_where_its_mlflow_run_is(tiny, tmp_path):
    from rayfl.schema import ConfigError

    paused = rayfl.run(TINY, tiny + OVERRIDES, quiet=True, max_rounds=2)
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    os.rename(paused.run_dir, moved)
    with pytest.raises(ConfigError) as err:
        rayfl.resume(str(moved), quiet=True)
    assert err.value.key == "loggers.mlflow_uri" and "was the run directory moved?" in \
        str(err.value)
    assert os.listdir(moved.parent) == ["run"]  # no empty store made beside it
    config = moved / "config.yaml"
    config.write_text(config.read_text().replace(
        "mlflow_uri: null", f"mlflow_uri: {tmp_path / 'runs' / 'mlruns'}"))
    rayfl.resume(str(moved), quiet=True)
    assert _mlflow_run(tmp_path / "runs") == ("FINISHED", [1, 2, 3, 4])


def test_a_ray_run_stopped_by_its_driver_is_killed_in_mlflow(ray_local, tiny, tmp_path):
    """Ctrl-C on Ray kills the server: the driver marks the MLflow run (it stayed RUNNING)."""
    def interrupt(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rayfl.run(TINY, tiny + ["rounds=4", "loggers.mlflow=true"], quiet=True,
                  on_round=interrupt)
    status, rounds = _mlflow_run(tmp_path / "runs")
    assert status == "KILLED" and rounds[:2] == [1, 2]


@pytest.mark.parametrize("uri, says", [
    ("sqlite:///{tmp}/a_file/x.db", "a directory"),
    ("ftp://somewhere", "not a store MLflow takes"),
])
def test_a_store_is_checked_without_being_created(tiny, tmp_path, uri, says):
    from rayfl.schema import ConfigError

    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError) as err:
        rayfl.run(TINY, tiny + OVERRIDES + ["loggers.mlflow_uri=" + uri.format(tmp=tmp_path)],
                  quiet=True)
    assert err.value.key == "loggers.mlflow_uri" and says in str(err.value)
    assert not (tmp_path / "runs").exists() and (tmp_path / "a_file").read_text() == ""
