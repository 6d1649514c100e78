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


def _mlflow_run(tmp_path):
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=str(tmp_path / "runs" / "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    rounds = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss"))
    return run.info.status, rounds


def test_a_paused_run_is_killed_until_resumed_and_then_finished(tiny, tmp_path):
    paused = rayfl.run(TINY, tiny + OVERRIDES, quiet=True, max_rounds=2)
    assert _mlflow_run(tmp_path) == ("KILLED", [1, 2])
    rayfl.resume(paused.run_dir, quiet=True)
    assert _mlflow_run(tmp_path) == ("FINISHED", [1, 2, 3, 4])


def test_a_run_that_raises_after_its_first_rounds_is_failed(tiny, tmp_path):
    with pytest.raises(ComponentError, match="broke in round 3"):
        rayfl.run(TINY, tiny + OVERRIDES +
                  [f"aggregation.transforms=[{{name: '{HERE}:BreaksInRoundThree'}}]"],
                  quiet=True)
    assert _mlflow_run(tmp_path) == ("FAILED", [1, 2])
