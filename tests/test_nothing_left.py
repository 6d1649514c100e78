"""A new run stopped by a user's component breaking its contract before it recorded a round
leaves nothing behind (the pre-flight runs the client half only: the server half's breach is
found in round 1, after the run directory was made); one stopped later keeps what it wrote."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from rayfl.contract import ComponentError
from rayfl.transforms import Transform
from tests.conftest import TINY, s3_keys


class TwoValues(Transform):
    """Its server half returns (aggregate, slot): the contract says three values."""

    def aggregate(self, slot, agg, sums, srv):
        return agg, slot


class BreaksInRoundTwo(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return (agg, slot) if srv.t == 1 else (agg, slot, {})


def _entry(cls: type) -> str:
    return f"aggregation.transforms=[{{name: 'tests.test_nothing_left:{cls.__name__}'}}]"


def _fails(overrides: list[str], **kwargs) -> str:
    import rayfl

    with pytest.raises(ComponentError) as err:
        rayfl.run(TINY, overrides, quiet=True, **kwargs)
    return str(err.value)


@pytest.mark.parametrize("where", [["runtime.executor=inprocess"], ["runtime.num_actors=2"]],
                         ids=["inprocess", "ray"])
def test_a_server_half_breaking_its_contract_in_round_one_creates_nothing(tiny, tmp_path, where,
                                                                         request):
    if "runtime.num_actors=2" in where:
        request.getfixturevalue("ray_local")
    says = _fails(tiny + where + [_entry(TwoValues)])
    assert "TwoValues.aggregate (round 1)" in says
    assert not os.path.exists(tmp_path / "runs")  # output_dir was made for the run: gone too


def test_a_run_directory_given_empty_is_left_empty(tiny, tmp_path):
    mine = tmp_path / "given"
    mine.mkdir()
    _fails(tiny + ["runtime.executor=inprocess", _entry(TwoValues)], run_dir=str(mine))
    assert mine.is_dir() and os.listdir(mine) == []


def test_a_run_stopped_after_recording_a_round_keeps_what_it_wrote(tiny, tmp_path):
    run_dir = tmp_path / "kept"
    says = _fails(tiny + ["runtime.executor=inprocess", "rounds=3",
                          _entry(BreaksInRoundTwo)], run_dir=str(run_dir))
    assert "(round 2)" in says
    assert pq.read_table(run_dir / "metrics.parquet").column("round").to_pylist() == [1]
    assert (run_dir / "config.yaml").is_file()


def test_the_client_state_it_wrote_to_storage_goes_too(s3_server, tiny, tmp_path):
    """SCAFFOLD's clients write their variates in round 1, before the server half fails: kept
    by a run that recorded round 1, gone with one that recorded nothing."""
    uri_for, client = s3_server
    scaffold = tiny + ["runtime.executor=inprocess", "algorithm.name=scaffold", "rounds=3",
                       f"runtime.storage={uri_for('left')}"]
    _fails(scaffold + [_entry(BreaksInRoundTwo)], run_dir=str(tmp_path / "later"))
    assert any(k.startswith("left/later/state/") for k in s3_keys(client, "left/later/"))
    before = s3_keys(client, "")
    fresh = [f"runtime.storage={uri_for('fresh/deeper')}"]  # a prefix that holds nothing yet
    _fails(scaffold + fresh + [_entry(TwoValues)], run_dir=str(tmp_path / "first"))
    assert s3_keys(client, "") == before  # no empty "fresh/deeper/" marker either
    client.put_object(Bucket="rayfl-test", Key="kept/again/mine/", Body=b"")  # an empty folder
    before = s3_keys(client, "")
    _fails(scaffold + [f"runtime.storage={uri_for('kept')}", _entry(TwoValues)],
           run_dir=str(tmp_path / "again"))
    after = s3_keys(client, "")
    assert set(before) <= set(after)  # the folder that existed stays
    assert set(after) - set(before) <= {"kept/again/"}  # at most a marker of a folder there
    assert not os.path.exists(tmp_path / "first")


def test_a_fork_stopped_in_its_first_round_leaves_the_source_as_it_was(tiny, tmp_path):
    import rayfl
    from rayfl.fork import fork

    source = rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "rounds=3",
                                     "checkpoint.keep=[1]"], quiet=True).run_dir
    before = sorted(os.listdir(source))
    with pytest.raises(ComponentError):
        fork(source, 1, [_entry(TwoValues)], run_dir=str(tmp_path / "fork"), quiet=True)
    assert not os.path.exists(tmp_path / "fork")
    assert sorted(os.listdir(source)) == before


def test_local_storage_that_existed_keeps_its_folders_and_one_holding_the_run_dir_is_its_own(
        tiny, tmp_path):
    """A location given with empty folders keeps them; storage whose run location is the run
    directory given empty leaves that directory, empty (it was removed with the storage)."""
    store = tmp_path / "store"
    (store / "given" / "mine").mkdir(parents=True)
    scaffold = tiny + ["runtime.executor=inprocess", "algorithm.name=scaffold",
                       f"runtime.storage={store}", _entry(TwoValues)]
    _fails(scaffold, run_dir=str(tmp_path / "given"))  # its storage: store/given, kept
    assert sorted(p.name for p in (store / "given").rglob("*")) == ["mine"]
    run_dir = store / "given" / "mine"  # given, empty
    inner = tiny + ["runtime.executor=inprocess", "algorithm.name=scaffold",
                    f"runtime.storage={store / 'given'}", _entry(TwoValues)]
    _fails(inner, run_dir=str(run_dir))  # storage/given/mine: the run directory itself
    assert run_dir.is_dir() and os.listdir(run_dir) == []


def test_a_cleanup_that_fails_does_not_hide_why_the_run_stopped(tiny, tmp_path, monkeypatch,
                                                                capsys):
    from rayfl import rundir

    def refuses(run_dir, created):
        raise PermissionError("read-only")

    monkeypatch.setattr(rundir, "unmake", refuses)
    assert "TwoValues.aggregate (round 1)" in _fails(
        tiny + ["runtime.executor=inprocess", _entry(TwoValues)])
    assert "could not all be removed (PermissionError: read-only)" in capsys.readouterr().err
