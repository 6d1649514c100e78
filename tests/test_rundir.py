"""Run directories: one writer, no run over a user's files, checks before anything is created,
resume only with the config that made the run, metrics durable before their checkpoint, and
divergence stopped, flagged and reported in strict JSON."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

import rayfl
from rayfl import rundir
from rayfl.cli import main
from tests.conftest import TINY


def _strict_json(path):
    def refuse(token):
        raise AssertionError(f"{path} holds a bare {token}")

    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def test_resource_check_fails_before_the_run_directory_exists(ray_local, tiny, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["run", TINY, *tiny, "runtime.gpus_per_actor=1", f"--run-dir={run_dir}",
                 "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "runtime.gpus_per_actor" in err[0]
    assert not run_dir.exists()
    # the corrected command then runs in that same directory
    assert main(["run", TINY, *tiny, "rounds=1", f"--run-dir={run_dir}", "--quiet"]) == 0


def test_locked_run_refuses_a_second_writer_and_resume_refuses_an_edited_config(
        ray_local, tiny, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    paused = rayfl.run(TINY, tiny + ["rounds=3"], run_dir=run_dir, quiet=True, max_rounds=1)
    assert paused.summary["status"] == "paused"
    assert os.path.isfile(os.path.join(run_dir, rundir.FINGERPRINT))

    held = rundir.Lock(run_dir)  # another process writing it (flock: per open file)
    try:
        assert main(["resume", run_dir, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no other process is writing" in err[0]
    finally:
        held.release()

    path = os.path.join(run_dir, "config.yaml")
    original = open(path).read()
    for edit, keys in [({"seed": 5}, "seed"), ({"local": {"lr": 0.5}}, "local.lr"),
                       ({"algorithm": {"name": "scaffold"}}, "algorithm.name"),
                       ({"runtime": {"logical_shards": 4}}, "runtime.logical_shards")]:
        raw = yaml.safe_load(original)
        for section, value in edit.items():
            raw[section] = {**raw[section], **value} if isinstance(value, dict) else value
        with open(path, "w") as f:
            yaml.safe_dump(raw, f)
        assert main(["resume", run_dir, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"'{keys}" in err[0], err
        assert pq.read_table(os.path.join(run_dir, "metrics.parquet")).num_rows == 1

    raw = yaml.safe_load(original)  # where it runs may change
    raw["runtime"] = {**raw["runtime"], "num_actors": 1, "state_memory_mb": 1.0}
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    resumed = rayfl.resume(run_dir, quiet=True)
    full = rayfl.run(TINY, tiny + ["rounds=3", "runtime.executor=inprocess"], quiet=True)
    assert resumed.summary["model_sha256"] == full.summary["model_sha256"]


def test_name_cannot_escape_output_dir():
    with pytest.raises(rayfl.ConfigError) as err:
        rundir.new_path("/tmp/out", "../x")
    assert err.value.key == "name"


class _Log:
    """Records what the metrics log held when each checkpoint was written."""

    def __init__(self):
        self.rows, self.flushed, self.at_checkpoint = [], 0, []

    def append(self, row):
        self.rows.append(row)

    def flush(self, rows=None):
        self.flushed = len(self.rows if rows is None else rows)

    def finish(self, model, final_round, diverged_at=None, buffers=None, stopped=None,
               extra=None):
        return {"diverged_at_round": diverged_at, "stopped": stopped}

    def interrupt(self, status):
        pass


def _bare_server(rounds: int, losses: list[float], ceiling=1e6):
    """The server's round loop around stand-ins for rounds, evaluation and checkpoints."""
    from types import SimpleNamespace

    from rayfl.runtime.commits import Commits
    from rayfl.runtime.server import Server

    s = object.__new__(Server)
    s.settings = SimpleNamespace(rounds=rounds, loss_ceiling=ceiling,
                                 evaluation=SimpleNamespace(every=1, last_rounds=0),
                                 checkpoint=SimpleNamespace(every=1, keep=()),
                                 max_empty_rounds=10)
    s.log, s.progress_rows = _Log(), []
    s.new_row = threading.Condition()
    s.next_round, s.elapsed_before, s.final_round = 0, 0.0, rounds
    s.begun = True  # its state is the stand-in's below
    s.state = SimpleNamespace(x=torch.zeros(3))
    s.participation = s.canaries = s.account = None  # no privacy: no bound, audit or account
    s.stack = SimpleNamespace(deployed=lambda state, t=None: state.x)
    s.round = lambda t: {"round": t, "completed": 1, "train_loss": losses[t], "round_s": 0.0}
    s.evaluate = lambda t=None: {"test_loss": 1.0, "test_accuracy": 0.5}
    s.client_eval = None  # eval.clients = 0
    s.commits = Commits()
    s._checkpoint = lambda t, elapsed: (
        lambda: s.log.at_checkpoint.append((t, s.log.flushed)), None)
    s._final_model = lambda t: np.zeros(3, dtype=np.float32)
    s._final_buffers = lambda: None  # a model without buffers
    return s


def test_metrics_rows_are_flushed_before_the_checkpoint_that_covers_them():
    s = _bare_server(3, [1.0, 0.9, 0.8])
    s.run()
    assert s.log.at_checkpoint == [(0, 1), (1, 2), (2, 3)]


def test_a_rounds_checkpoint_is_written_while_the_next_round_trains():
    """Round t's checkpoint waits for round t+1 to begin (the wait only guards against a hang:
    written before that round, as it once was, it would find the round not begun); the last
    round's is written before the run returns."""
    s = _bare_server(3, [1.0, 0.9, 0.8])
    began = [threading.Event() for _ in range(4)]
    round_, seen = s.round, []

    def round_began(t):
        began[t].set()
        return round_(t)

    def checkpoint(t, elapsed):
        return (lambda: seen.append((t, began[t + 1].wait(30 if t < 2 else 0))), None)
    s.round, s._checkpoint = round_began, checkpoint
    s.run()
    assert seen == [(0, True), (1, True), (2, False)]


def test_a_checkpoint_that_cannot_be_written_stops_the_run_after_the_round_it_overlapped():
    """The write's error (a full disk) is raised in the server once the round that trained
    meanwhile ends: the run stops there as a failed write, before logging that round."""
    from rayfl.runtime.storage import StorageError

    s = _bare_server(4, [1.0, 0.9, 0.8, 0.7])
    trained = []
    round_ = s.round

    def counted(t):
        trained.append(t)
        return round_(t)

    def disk_full():
        raise OSError(28, "No space left on device", "checkpoint.pt")
    s.round = counted
    s._checkpoint = lambda t, elapsed: (disk_full, None) if t == 1 else (lambda: None, None)
    with pytest.raises(StorageError, match="No space left"):
        s.run()
    assert trained == [0, 1, 2] and [r["round"] for r in s.log.rows] == [0, 1]


@pytest.mark.parametrize("losses, ceiling, stop, why", [
    ([1.0, float("nan"), 0.5], 1e6, 1, "train_loss is nan"),
    ([1.0, float("inf"), 0.5], None, 1, "train_loss is inf"),
    ([1.0, 2.0, 6.8e29], 1e6, 2, "train_loss = 6.8e+29 > loss_ceiling"),
    ([1.0, 50.0, 0.5], 10.0, 1, "train_loss = 50 > loss_ceiling = 10"),
    ([1.0, 6.8e29, 0.5], None, None, None),  # no ceiling: only NaN/inf stop
])
def test_divergence_stops_the_loop_and_flags_the_row(losses, ceiling, stop, why):
    s = _bare_server(3, losses, ceiling)
    summary = s.run()
    assert summary["diverged_at_round"] == stop
    flags = [r["diverged"] for r in s.log.rows]
    if stop is None:
        assert flags == [False] * 3
    else:
        assert flags == [False] * stop + [True] and s.log.rows[-1]["diverged_reason"].startswith(
            why)


def test_nan_model_is_divergence_even_with_a_finite_loss():
    from rayfl.metrics.divergence import reason

    assert reason({"train_loss": 1.0, "completed": 1}, torch.tensor([0.0, float("nan")]),
                  None) == "the model holds NaN/inf"
    assert reason({"train_loss": float("nan"), "completed": 0}, torch.zeros(2), 1.0) is None


def test_diverged_run_exits_3_says_so_when_quiet_and_writes_strict_json(ray_local, tiny,
                                                                        tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["run", TINY, *tiny, "rounds=5", "local.lr=1e4", "loss_ceiling=1e3",
                 f"--run-dir={run_dir}", "--quiet"])
    out = capsys.readouterr()
    assert code == 3
    assert "diverged" in out.err and str(run_dir) in out.err
    summary = _strict_json(run_dir / "summary.json")
    assert summary["diverged"] is True and summary["diverged_at_round"] < 4
    assert "loss" in summary["diverged_reason"] or "NaN" in summary["diverged_reason"]
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [r["diverged"] for r in rows] == [False] * (len(rows) - 1) + [True]
    _strict_json(run_dir / "fingerprint.json")
    _strict_json(run_dir / "actors.json")


def test_write_json_turns_nan_and_inf_into_null(tmp_path):
    from rayfl.metrics.files import write_json

    write_json({"a": float("nan"), "b": [np.float32("inf"), 1.5], "c": {"d": -float("inf")}},
               str(tmp_path / "x.json"))
    assert _strict_json(tmp_path / "x.json") == {"a": None, "b": [None, 1.5], "c": {"d": None}}


@pytest.mark.parametrize("files", [{}, {"summary.json": '{"model_sha'}])
def test_resume_refuses_a_directory_rayfl_did_not_make(files, tmp_path, capsys):
    """config.yaml alone (a user's copy, a half-made directory) is not a run to continue: exit 2
    naming run_dir, nothing written."""
    run_dir = tmp_path / "notarun"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(open(TINY).read())
    for name, text in files.items():
        (run_dir / name).write_text(text)
    before = sorted(os.listdir(run_dir))
    assert main(["resume", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run_dir" in err[0] and "fingerprint.json" in err[0]
    assert sorted(os.listdir(run_dir)) == before


def test_a_ray_that_does_not_start_is_one_line_and_creates_nothing(tmp_path, capsys,
                                                                    monkeypatch):
    """Ray's own start-up timeout (a bare Exception after 30 s on an overloaded machine) ends
    the command with one line, exit 1, and no run directory."""
    import ray

    def slow_start(*_a, **_k):
        raise Exception("The current node timed out during startup. This could happen because "
                        "some of the raylet failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", slow_start)
    runs = tmp_path / "runs"
    code = main(["run", TINY, f"output_dir={runs}", f"data.cache_dir={tmp_path / 'cache'}",
                 "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "did not start" in err[0], err
    assert not runs.exists()
