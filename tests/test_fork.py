"""``rayfl fork``: branching a new run from a kept checkpoint of another run."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

import rayfl
from rayfl.cli import main
from rayfl.config import ConfigError
from rayfl.fork import fork
from rayfl.runtime import checkpoint
from tests.conftest import TINY

INPROCESS = ["runtime.executor=inprocess", "rounds=6", "checkpoint.keep=[2, 4]"]


def _source(tiny, *extra, name="src"):
    return rayfl.run(TINY, tiny + INPROCESS + [f"name={name}", *extra], quiet=True)


PERSONAL = ["data.client_holdout=0.25", "eval.clients=6"]  # scores of the clients' own models


@pytest.mark.parametrize("algorithm", [
    ["algorithm.name=scaffold"], ["algorithm.name=fedrep", "model.name=mlp", *PERSONAL],
    ["algorithm.name=fedproto", "model.name=mlp", *PERSONAL], ["algorithm.name=apfl", *PERSONAL]],
    ids=lambda a: a[0].split("=")[1])
def test_a_fork_without_overrides_ends_with_the_source_bytes(tiny, tmp_path, algorithm):
    """These keep client state (control variates, heads, whole models, personal models): the
    fork needs the versions the kept checkpoint refers to, which the source superseded (and
    would have deleted) since; FedProto's server state holds its prototypes."""
    src = _source(tiny, *algorithm)
    assert checkpoint.kept_rounds(src.run_dir) == [2, 4]
    for at in (2, 4):
        out = fork(src.run_dir, at, run_dir=str(tmp_path / f"f{at}"), quiet=True)
        assert out.summary["model_sha256"] == src.summary["model_sha256"]
        # the shared prefix is copied, not recomputed: rows 1..at are the source's own
        mine, theirs = out.metrics.to_pylist(), src.metrics.to_pylist()
        assert [r["round"] for r in mine] == [1, 2, 3, 4, 5, 6]
        assert mine[:at] == theirs[:at]
        assert json.load(open(os.path.join(out.run_dir, "provenance.json")))["forked_from"] == {
            "run_dir": src.run_dir, "round": at}
        if PERSONAL[1] in algorithm:  # the personal models after the fork are the source's
            mine, theirs = (pq.read_table(os.path.join(r.run_dir, "client_eval.parquet"))
                            .to_pylist() for r in (out, src))
            assert [r for r in mine if r["round"] == 6] == [r for r in theirs if r["round"] == 6]
            assert any(r["personal_accuracy"] != r["accuracy"] for r in mine if r["round"] == 6)


def test_a_paused_and_resumed_source_keeps_what_its_kept_checkpoints_refer_to(tiny, tmp_path):
    """A resume prunes client-state files the latest checkpoint does not reference: those a
    kept checkpoint refers to must survive it."""
    first = rayfl.run(TINY, tiny + INPROCESS + ["name=paused", "algorithm.name=scaffold"],
                      quiet=True, max_rounds=5)
    done = rayfl.resume(first.run_dir, quiet=True)
    straight = _source(tiny, "algorithm.name=scaffold", name="straight")
    assert done.summary["model_sha256"] == straight.summary["model_sha256"]
    out = fork(done.run_dir, 2, run_dir=str(tmp_path / "f"), quiet=True)
    assert out.summary["model_sha256"] == straight.summary["model_sha256"]


def test_an_override_applies_from_the_fork_round_on(tiny, tmp_path):
    src = _source(tiny)
    out = fork(src.run_dir, 4, ["local.lr=0.05"], run_dir=str(tmp_path / "f"), quiet=True)
    assert out.summary["model_sha256"] != src.summary["model_sha256"]
    rows = out.metrics.to_pylist()
    assert [r["lr"] for r in rows] == pytest.approx([0.1] * 4 + [0.05] * 2)


def test_an_ima_fork_equals_the_ima_run_from_scratch(tiny, tmp_path):
    """IMA (t_s = 4, window 2) changes nothing before round index t_s − P + 1 = 3, so a FedAvg
    run forked at round 3 into IMA must give the IMA run's bytes; at round 4 IMA's window would
    need an output the FedAvg checkpoint does not hold, which is refused before anything is
    created."""
    ima = ["wrappers.ima.start=4", "wrappers.ima.window=2"]
    src = _source(tiny, "checkpoint.keep=[3, 4]")
    scratch = _source(tiny, *ima, name="ima")
    out = fork(src.run_dir, 3, ima, run_dir=str(tmp_path / "f"), quiet=True)
    assert out.summary["model_sha256"] == scratch.summary["model_sha256"]
    assert out.summary["model_sha256"] != src.summary["model_sha256"]
    with pytest.raises(ConfigError) as e:
        fork(src.run_dir, 4, ima, run_dir=str(tmp_path / "late"), quiet=True)
    assert e.value.key == "--at" and "fork at a round ≤ 3" in str(e.value)
    assert not (tmp_path / "late").exists()


def test_an_ima_run_forked_with_its_own_settings_keeps_its_window(tiny, tmp_path):
    ima = ["wrappers.ima.start=2", "wrappers.ima.window=3"]
    src = _source(tiny, *ima)
    out = fork(src.run_dir, 4, run_dir=str(tmp_path / "f"), quiet=True)
    assert out.summary["model_sha256"] == src.summary["model_sha256"]


@pytest.mark.parametrize("at, overrides, key", [
    (3, [], "--at"),  # no kept checkpoint of round 3
    (6, [], "--at"),  # the last round: nothing left to run
    (0, [], "--at"),
    (2, ["data.alpha=0.1"], "data.alpha"),
    (2, ["algorithm.name=fedprox"], "algorithm.name"),
    (2, ["seed=1"], "seed"),
    (2, ["rounds=2", "checkpoint.keep=[]"], "rounds"),
    (2, ["local.lr=-1"], "local.lr"),
])
def test_a_bad_fork_is_refused_before_anything_is_created(tiny, tmp_path, at, overrides, key):
    src = _source(tiny)
    before = sorted(os.listdir(src.run_dir))
    with pytest.raises(ConfigError) as e:
        fork(src.run_dir, at, overrides, run_dir=str(tmp_path / "f"), quiet=True)
    assert e.value.key == key
    assert not (tmp_path / "f").exists() and sorted(os.listdir(src.run_dir)) == before


def test_fork_on_the_command_line(tiny, tmp_path, capsys):
    src = _source(tiny)
    assert main(["fork", src.run_dir, "--at", "2", "local.lr=0.05", "--run-dir",
                 str(tmp_path / "f"), "--quiet"]) == 0
    assert pq.read_table(tmp_path / "f" / "metrics.parquet").num_rows == 6
    assert main(["fork", src.run_dir, "--at", "3", "--run-dir", str(tmp_path / "g")]) == 2
    assert "kept: 2, 4" in capsys.readouterr().err


def test_a_fork_on_ray_actors_ends_with_the_source_bytes(ray_local, tiny, tmp_path):
    common = tiny + ["rounds=4", "checkpoint.keep=[2]", "algorithm.name=scaffold"]
    src = rayfl.run(TINY, common, quiet=True)
    out = fork(src.run_dir, 2, run_dir=str(tmp_path / "f"), quiet=True)
    assert out.summary["model_sha256"] == src.summary["model_sha256"]
