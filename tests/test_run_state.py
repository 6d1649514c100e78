"""A run's state between rounds is one typed record (:mod:`rayfl.runtime.run_state`): every
piece a checkpoint holds is checked against the run before a resume or a fork starts anything,
and a fork keeps what its continuation needs (the event loop) or starts afresh what it may
change (the selector)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import rayfl
from rayfl.cli import main
from rayfl.config import ConfigError
from rayfl.fork import fork
from rayfl.runtime import checkpoint
from rayfl.runtime.run_state import RunState
from rayfl.runtime.storage import CheckpointError
from rayfl.selection.base import Selector
from tests.conftest import TINY

INPROCESS = ["runtime.executor=inprocess", "rounds=4"]
FEDBUFF = ["aggregation.mode=fedbuff", "aggregation.concurrency=8"]
DP_FTRL = ["privacy.mechanism=dp_ftrl", "privacy.min_separation=2", "privacy.max_participations=1"]


def _paused(tiny, *extra):
    """A run paused after round 2 of 4: its directory."""
    out = rayfl.run(TINY, tiny + INPROCESS + list(extra), quiet=True, max_rounds=2)
    assert out.summary["paused_after_round"] == 1
    return out.run_dir


def _files(run_dir: str) -> dict:
    """Every file under ``run_dir`` and its bytes."""
    out = {}
    for root, _, names in os.walk(run_dir):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.join(root, name)] = f.read()
    return out


def test_the_record_holds_every_entry_a_checkpoint_holds(tiny):
    """What the server writes is the record's fields and the run's identity, nothing beside."""
    run_dir = _paused(tiny, *FEDBUFF)
    ck = checkpoint.load(run_dir)
    fields = set(RunState.__dataclass_fields__)
    assert set(ck) == fields | {checkpoint.IDENTITY}
    assert ck["round"] == 1 and isinstance(ck["asynchronous"], dict)


def _tamper(ck: dict, piece: str, value):
    ck[piece] = value(ck) if callable(value) else value


SYNC_CASES = {  # piece -> what it becomes
    "round": -1,
    "versions": lambda ck: ck["versions"][:-1],  # one client short
    "prev_delta": lambda ck: torch.zeros(3),
    "virtual_time": float("nan"),
    "elapsed": -1.0,
    "asynchronous": lambda ck: {"now": 0.0},  # an event loop in a synchronous run
}


@pytest.mark.parametrize("piece", sorted(SYNC_CASES))
def test_a_checkpoint_piece_that_does_not_fit_the_run_is_refused_before_a_resume_starts(
        tiny, piece):
    run_dir = _paused(tiny)
    ck = checkpoint.load(run_dir)
    _tamper(ck, piece, SYNC_CASES[piece])
    checkpoint.save(run_dir, ck)
    before = _files(run_dir)
    with pytest.raises(CheckpointError) as e:
        rayfl.resume(run_dir, quiet=True)
    assert f"({piece}: expected" in str(e.value) and "checkpoint.pt" in str(e.value)
    assert _files(run_dir) == before  # nothing written, nothing truncated


@pytest.mark.parametrize("edit", [lambda x: x.double(), lambda x: x[:-1],
                                  lambda x: torch.cat([x, x])], ids=["float64", "short", "long"])
def test_a_model_the_runs_model_is_not_is_refused_before_a_resume_starts(tiny, edit):
    """The tree's template is built from the x found: x itself is held to the run's model."""
    run_dir = _paused(tiny)
    ck = checkpoint.load(run_dir)
    ck["state"].fields["x"] = edit(ck["state"].fields["x"])
    checkpoint.save(run_dir, ck)
    before = _files(run_dir)
    with pytest.raises(CheckpointError, match=r"state\.x: expected the model as a vector of \d+ "
                                              r"torch\.float32 parameters"):
        rayfl.resume(run_dir, quiet=True)
    assert _files(run_dir) == before


@pytest.mark.parametrize("extra, piece, value, decided", [
    (FEDBUFF, "asynchronous", None, "aggregation.mode"),
    (FEDBUFF, "asynchronous", lambda ck: {k: v for k, v in ck["asynchronous"].items()
                                          if k != "sent"}, "aggregation.mode"),
    (DP_FTRL, "participation", None, "privacy.mechanism"),
    (DP_FTRL, "participation", lambda ck: {"sizes": ck["participation"]["sizes"][:1],
                                           "clients": ck["participation"]["clients"]},
     "privacy.mechanism"),
], ids=["no-snapshot", "snapshot-short", "no-record", "record-short"])
def test_the_event_loop_and_the_participation_record_are_checked(tiny, extra, piece, value,
                                                                  decided):
    run_dir = _paused(tiny, *extra)
    ck = checkpoint.load(run_dir)
    _tamper(ck, piece, value)
    checkpoint.save(run_dir, ck)
    with pytest.raises(CheckpointError, match=f"{piece}: expected .*, as {decided} decides"):
        rayfl.resume(run_dir, quiet=True)


def test_a_resumed_event_driven_run_ends_with_the_uninterrupted_bytes(tiny, tmp_path):
    """The record round-trips: the event loop's clients in flight continue."""
    run_dir = _paused(tiny, *FEDBUFF, "name=paused")
    resumed = rayfl.resume(run_dir, quiet=True)
    straight = rayfl.run(TINY, tiny + INPROCESS + FEDBUFF + ["name=straight"], quiet=True)
    assert resumed.summary["model_sha256"] == straight.summary["model_sha256"]


def _kept(tiny, *extra):
    return rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "rounds=5",
                                   "checkpoint.keep=[2]", *extra], quiet=True)


def test_an_event_driven_fork_continues_the_clients_in_flight(tiny, tmp_path):
    src = _kept(tiny, *FEDBUFF)
    assert checkpoint.load(src.run_dir, checkpoint.kept_name(2))["asynchronous"]["jobs"]
    out = fork(src.run_dir, 2, run_dir=str(tmp_path / "f"), quiet=True)
    assert out.summary["model_sha256"] == src.summary["model_sha256"]


@pytest.mark.parametrize("source, override", [
    ([], "aggregation.mode=fedbuff"), (FEDBUFF, "aggregation.mode=sync"),
    (FEDBUFF, "aggregation.mode=fedasync")])
def test_a_fork_that_changes_the_aggregation_mode_is_refused_before_anything_is_created(
        tiny, tmp_path, source, override):
    src = _kept(tiny, *source)
    before = _files(src.run_dir)
    with pytest.raises(ConfigError) as e:
        fork(src.run_dir, 2, [override], run_dir=str(tmp_path / "f"), quiet=True)
    assert e.value.key == "aggregation.mode" and "the source run's" in str(e.value)
    assert not (tmp_path / "f").exists() and _files(src.run_dir) == before


class Fresh(Selector):
    """A selector that refuses any state but its own (it keeps none)."""

    def load_state(self, state):
        raise AssertionError(f"handed another selector's state: {state!r}")


def test_a_fork_to_another_selector_starts_it_with_nothing_learnt(tiny, tmp_path):
    src = _kept(tiny, "selection.name=oort")
    assert checkpoint.load(src.run_dir, checkpoint.kept_name(2))["selection"] is not None
    mine = fork(src.run_dir, 2, [f"selection={{name: {__name__}:Fresh}}"],
                run_dir=str(tmp_path / "f"), quiet=True)
    uniform = fork(src.run_dir, 2, ["selection={name: uniform}"], run_dir=str(tmp_path / "u"),
                   quiet=True)
    # Fresh draws as uniform does: the same participants, the same bytes
    assert mine.summary["model_sha256"] == uniform.summary["model_sha256"]
    assert np.array_equal(checkpoint.load(mine.run_dir)["versions"],
                          checkpoint.load(uniform.run_dir)["versions"])


def _cut(path: str) -> None:
    """metrics.parquet keeping its first row only."""
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 1), path)


def _twice(path: str) -> None:
    """metrics.parquet with its second row there twice."""
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table.slice(0, 2), table.slice(1, 1)]), path)


def _flipped(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage, says", [
    (os.remove, "the file is missing"), (_cut, "round 2 is missing"),
    (_twice, "round 2 is there twice"), (_flipped, "readable")],
    ids=["deleted", "cut", "twice", "flipped"])
def test_metrics_that_do_not_cover_the_checkpoint_are_refused_before_a_resume(
        tiny, capsys, damage, says):
    """The checkpoint of round 2 needs rows 1 and 2: a table without them (deleted, cut,
    another run's) would lose or mix rows silently; one that does not read is one line."""
    run_dir = _paused(tiny)
    damage(os.path.join(run_dir, "metrics.parquet"))
    before = _files(run_dir)
    assert main(["resume", run_dir, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics.parquet" in err[0] and says in err[0], err
    assert _files(run_dir) == before


def test_a_damaged_provenance_record_is_refused_before_a_resume(tiny, capsys):
    run_dir = _paused(tiny)
    with open(os.path.join(run_dir, "provenance.json"), "wb") as f:
        f.write(bytes(range(128, 228)))
    before = _files(run_dir)
    assert main(["resume", run_dir, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "provenance.json" in err[0] and "JSON object" in err[0], err
    assert _files(run_dir) == before


def test_a_fork_into_its_source_directory_is_refused(tiny):
    src = _kept(tiny)
    before = _files(src.run_dir)
    with pytest.raises(ConfigError, match="outside the source run") as e:
        fork(src.run_dir, 2, run_dir=os.path.join(src.run_dir, "sub"), quiet=True)
    assert e.value.key == "--run-dir"
    assert _files(src.run_dir) == before and not os.path.exists(os.path.join(src.run_dir, "sub"))


def test_a_fork_of_a_source_whose_metrics_lack_the_kept_rounds_is_refused(tiny, tmp_path):
    src = _kept(tiny)
    _cut(os.path.join(src.run_dir, "metrics.parquet"))
    with pytest.raises(ConfigError, match="round 2 is missing"):
        fork(src.run_dir, 2, run_dir=str(tmp_path / "f"), quiet=True)
    assert not (tmp_path / "f").exists()


def test_a_fork_that_adds_a_privacy_section_names_one_key(tiny, tmp_path):
    """The source has none: every key of the section differs; the error names the first."""
    src = _kept(tiny)
    with pytest.raises(ConfigError) as e:
        fork(src.run_dir, 2, DP_FTRL, run_dir=str(tmp_path / "f"), quiet=True)
    assert e.value.key.startswith("privacy.") and "," not in e.value.key
    assert "other such key(s) differ too" in str(e.value)
    assert not (tmp_path / "f").exists()
