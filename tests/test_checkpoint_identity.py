"""A checkpoint belongs to its run: each records the identity of the run that wrote it (the
result-changing config values, seed and algorithm among them), and ``rayfl resume`` and ``rayfl
fork`` refuse one copied or linked in from another run — one line naming the key that differs,
exit 2, before anything is started or altered — where it would have continued into a model of
neither run, or failed on client-state files it never had. Client-state files carry their run's
seed, algorithm and a digest of the settings a fork keeps, checked the same way."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch

from rayfl import CheckpointError
import rayfl
from rayfl.cli import main
from rayfl.fork import fork
from rayfl.runtime import checkpoint, checkpoint_file
from rayfl.runtime.state_store import StateStore, state_name
from tests.conftest import TINY

INPROCESS = ["runtime.executor=inprocess", "checkpoint.keep=[2]"]


def _run(tiny, name, *extra, max_rounds=None):
    return rayfl.run(TINY, tiny + INPROCESS + [f"name={name}", *extra], quiet=True,
                     max_rounds=max_rounds)


def _snapshot(run_dir) -> dict:
    """Every file under ``run_dir`` (but the lock) and its content's digest."""
    out = {}
    for root, _dirs, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            if name != ".lock":
                with open(path, "rb") as f:
                    out[os.path.relpath(path, run_dir)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rayfl: error: "), err
    return err[0]


def _plant(src, dst, name, link=False) -> None:
    target = os.path.join(dst, name)
    os.remove(target)
    if link:
        os.symlink(os.path.join(src, name), target)
    else:
        shutil.copyfile(os.path.join(src, name), target)


@pytest.mark.parametrize("link", [False, True], ids=["copied", "linked"])
def test_resume_refuses_the_checkpoint_of_another_seed(tiny, tmp_path, capsys, link):
    mine = _run(tiny, "mine", max_rounds=2)
    other = _run(tiny, "other", "seed=1", max_rounds=2)
    _plant(other.run_dir, mine.run_dir, checkpoint.NAME, link)
    before = _snapshot(mine.run_dir)
    line = _refused(capsys, ["resume", mine.run_dir])
    assert "checkpoint.pt: expected a checkpoint of this run (it was written by a run with " \
           "seed = 1, this run's is 0" in line, line
    assert _snapshot(mine.run_dir) == before


def test_fork_refuses_a_kept_checkpoint_of_another_seed(tiny, tmp_path, capsys):
    mine = _run(tiny, "mine", max_rounds=3)
    other = _run(tiny, "other", "seed=1", max_rounds=3)
    _plant(other.run_dir, mine.run_dir, checkpoint.kept_name(2))
    before = _snapshot(mine.run_dir)
    out = tmp_path / "fork"
    line = _refused(capsys, ["fork", mine.run_dir, "--at", "2", "--run-dir", str(out)])
    assert "round-00002.pt: expected a checkpoint of this run (it was written by a run with " \
           "seed = 1, this run's is 0" in line, line
    assert not out.exists() and _snapshot(mine.run_dir) == before


def test_a_scaffold_checkpoint_in_a_fedavg_run_is_named_by_its_algorithm(tiny, capsys):
    mine = _run(tiny, "fedavg", max_rounds=2)
    other = _run(tiny, "scaffold", "algorithm.name=scaffold", max_rounds=2)
    _plant(other.run_dir, mine.run_dir, checkpoint.NAME)
    line = _refused(capsys, ["resume", mine.run_dir])
    assert "a run with algorithm.name = 'scaffold', this run's is 'fedavg'" in line, line
    assert "missing" not in line


def test_another_key_that_shapes_the_run_is_named_and_counted(tiny, capsys):
    mine = _run(tiny, "mine", max_rounds=2)
    other = _run(tiny, "other", "local.lr=0.05", "clients_per_round=4", max_rounds=2)
    _plant(other.run_dir, mine.run_dir, checkpoint.NAME)
    line = _refused(capsys, ["resume", mine.run_dir])
    assert "a run with clients_per_round = 4, this run's is 5; 1 other key(s) differ too" \
        in line, line


def test_runs_alike_but_for_their_name_share_checkpoints(tiny):
    """Their trajectories are the same bytes: a checkpoint of one continues the other."""
    mine = _run(tiny, "mine", max_rounds=2)
    other = _run(tiny, "other", max_rounds=2)
    _plant(other.run_dir, mine.run_dir, checkpoint.NAME)
    resumed = rayfl.resume(mine.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == _run(tiny, "straight").summary["model_sha256"]


def test_a_runs_own_checkpoints_and_a_forks_copy_resume(tiny, tmp_path):
    paused = _run(tiny, "paused", max_rounds=2)
    assert checkpoint.load(paused.run_dir)[checkpoint.IDENTITY]["seed"] == 0
    done = rayfl.resume(paused.run_dir, quiet=True)
    assert done.summary["model_sha256"] == _run(tiny, "straight").summary["model_sha256"]
    branch = fork(done.run_dir, 2, ["local.lr=0.05"], run_dir=str(tmp_path / "branch"),
                  quiet=True, max_rounds=3)
    assert checkpoint.load(branch.run_dir)[checkpoint.IDENTITY]["local.lr"] == 0.05
    assert [r["round"] for r in rayfl.resume(branch.run_dir, quiet=True).metrics.to_pylist()] \
        == [1, 2, 3, 4]


def test_a_checkpoint_without_identity_is_taken_as_it_is(tiny):
    """rayfl 0.2 wrote the same format without it (0.1's: tests/test_legacy_runs.py)."""
    paused = _run(tiny, "old", "seed=1", max_rounds=2)
    path = checkpoint.path_of(paused.run_dir)
    record = torch.load(path, weights_only=True)
    payload = json.loads(record["json"])
    del payload[checkpoint.IDENTITY]
    record["json"] = json.dumps(payload)
    record["sha256"] = checkpoint_file._digest(record["json"], record["tensors"])
    torch.save(record, path)
    assert checkpoint.IDENTITY not in checkpoint.load(paused.run_dir)
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    straight = _run(tiny, "straight", "seed=1")
    assert resumed.summary["model_sha256"] == straight.summary["model_sha256"]


# ----- client-state files ---------------------------------------------------------------------

def _state_files(run_dir) -> list[str]:
    """The client-state files the run's checkpoint refers to (relative to its state folder)."""
    versions = checkpoint.load(run_dir)["versions"]
    return [state_name(int(c), int(versions[c])) for c in np.flatnonzero(versions >= 0)]


def _foreign_state(tiny, mine_dir, *extra):
    """Overwrite the first state file ``mine_dir``'s checkpoint refers to with one of a run
    alike but for ``extra``."""
    other = _run(tiny, "other", "algorithm.name=scaffold", *extra, max_rounds=2)
    name = _state_files(mine_dir)[0]
    shutil.copyfile(os.path.join(other.run_dir, "state", _state_files(other.run_dir)[0]),
                    os.path.join(mine_dir, "state", name))
    return name


def test_resume_refuses_a_client_state_file_of_another_seed(tiny, capsys):
    mine = _run(tiny, "mine", "algorithm.name=scaffold", max_rounds=2)
    name = _foreign_state(tiny, mine.run_dir, "seed=1")
    before = _snapshot(mine.run_dir)
    line = _refused(capsys, ["resume", mine.run_dir])
    assert f"client state {os.path.join(mine.run_dir, 'state', name)}: expected a state file " \
           "of this run (it was written by a run with seed = 1, this run's is 0" in line, line
    assert _snapshot(mine.run_dir) == before


def test_fork_refuses_a_client_state_file_of_other_data(tiny, tmp_path, capsys):
    mine = _run(tiny, "mine", "algorithm.name=scaffold", max_rounds=2)
    _foreign_state(tiny, mine.run_dir, "data.alpha=0.4")
    out = tmp_path / "fork"
    line = _refused(capsys, ["fork", mine.run_dir, "--at", "2", "--run-dir", str(out)])
    assert "a run with other data, model or privacy settings" in line, line
    assert not out.exists()


def test_every_state_file_an_actor_reads_is_checked(tmp_path):
    """Beyond the sample a resume checks: the store refuses a foreign file when it reads it."""
    values = {"seed": 0, "algorithm.name": "scaffold"}
    StateStore(str(tmp_path), 0, checkpoint.state_stamp({**values, "seed": 3})).save(
        7, 1, {"algorithm.c": torch.zeros(3)})
    StateStore(str(tmp_path), 0).save(8, 1, {"algorithm.c": torch.ones(3)})  # as rayfl 0.2 did
    store = StateStore(str(tmp_path), 0, checkpoint.state_stamp(values))
    with pytest.raises(CheckpointError, match="seed = 3, this run's is 0"):
        store.load(7, 1)
    assert set(store.load(8, 1)) == {"algorithm.c"}
    other = StateStore(str(tmp_path), 0, checkpoint.state_stamp({**values, "seed": 3}))
    assert set(other.load(7, 1)) == {"algorithm.c"}  # the stamp is not part of the state
    fedavg = StateStore(str(tmp_path), 0, checkpoint.state_stamp(
        {**values, "seed": 3, "algorithm.name": "fedavg"}))
    with pytest.raises(CheckpointError, match="algorithm.name = 'scaffold', this run's is "
                                              "'fedavg'"):
        fedavg.load(7, 1)


@pytest.mark.parametrize("executor", ["inprocess", "ray"])
def test_a_foreign_state_file_beyond_the_sample_stops_the_run_when_read(
        executor, tiny, tmp_path, capsys, request):
    """Every client trains every round: the last state file (past the eight a resume reads
    first) is read in round 3, and the run stops there in one line, its checkpoint intact."""
    if executor == "ray":
        request.getfixturevalue("ray_local")
    every = ["algorithm.name=scaffold", "clients_per_round=20"]
    mine = _run(tiny, "mine", *every, f"runtime.executor={executor}", max_rounds=2)
    other = _run(tiny, "other", *every, "runtime.executor=inprocess", "seed=1", max_rounds=2)
    name = _state_files(mine.run_dir)[-1]
    assert len(_state_files(mine.run_dir)) == 20 and name == _state_files(other.run_dir)[-1]
    shutil.copyfile(os.path.join(other.run_dir, "state", name),
                    os.path.join(mine.run_dir, "state", name))
    ck = checkpoint.load(mine.run_dir)["round"]
    line = _refused(capsys, ["resume", mine.run_dir])
    assert f"{name}: expected a state file of this run (it was written by a run with seed = 1, " \
           "this run's is 0" in line, line
    assert checkpoint.load(mine.run_dir)["round"] == ck
