"""A corpus of user components that break their contract, and the runs they must not spoil.

Each misbehaving model, selector, availability model or algorithm (tests/components_bad.py)
goes through the command line: exit status 2 and one line naming the component
(``module:Name.method``), the round where it is known and what was wrong, followed only by the
user's own frames. Those the pre-flight catches leave no run directory and never reach Ray. Then
the run-level cases: rounds in which no client completes are counted and a run of them stops
(exit 4); settings that do nothing are refused; a resume never silently starts over; a failure
inside Ray reaches the user as the same one line, with no Ray dump and no process left behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayfl.cli import main
from rayfl.contract import ComponentError
from tests.conftest import ROOT, TINY

BAD = "tests.components_bad"
MODEL, SELECTOR, AVAILABILITY, ALGORITHM = (f"{key}={BAD}:" for key in (
    "model.name", "selection.name", "availability.model", "algorithm.name"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def cli(tmp_path, capsys, cache):
    """``cli(*overrides, command="run")`` -> (exit status, stdout lines, stderr lines) of a
    run of the tiny config in this process (in-process executor), its runs under tmp_path."""
    def call(*overrides, command=None):
        argv = command or ["run", TINY, f"output_dir={tmp_path / 'runs'}",
                           f"data.cache_dir={cache}", "runtime.executor=inprocess", *overrides]
        code = main(argv)
        out = capsys.readouterr()
        return code, out.out.splitlines(), out.err.splitlines()

    return call


def _only_user_frames(lines: list[str]) -> None:
    """Every line after the error is a frame in tests/components_bad.py or its source line."""
    for line in lines:
        assert (line.startswith('  File "') and "components_bad.py" in line) or \
            line.startswith("    "), line


def _one_error(err: list[str], *phrases: str) -> str:
    assert err and err[0].startswith("rayfl: error: "), err
    for phrase in phrases:
        assert phrase in err[0], err[0]
    _only_user_frames(err[1:])
    assert not any("Traceback" in line for line in err), err
    return err[0]


# ----- the pre-flight: refused before anything is written or started --------------------------
PREFLIGHT = [
    # model builders and forwards, on a batch of 2 and on a real batch
    ([MODEL + "string_model"], f"{BAD}:string_model: returned a str; expected a torch.nn.Module"),
    ([MODEL + "none_model"], f"{BAD}:none_model: returned None"),
    ([MODEL + "number_model"], f"{BAD}:number_model: returned an int"),
    ([MODEL + "NoParameters"], f"{BAD}:NoParameters: returned a NoParameters with no trainable"),
    ([MODEL + "FrozenOnly"], "with no trainable parameters"),
    ([MODEL + "TupleOut"], f"{BAD}:TupleOut.forward: returned a tuple of 2 for a batch of 2"),
    ([MODEL + "DictOut"], f"{BAD}:DictOut.forward: returned a dict"),
    ([MODEL + "TwiceTheClasses"], f"{BAD}:TwiceTheClasses.forward: returned scores of shape "
                                  "(2, 8) for a batch of 2; expected (2, 4)"),
    ([MODEL + "IntScores"], f"{BAD}:IntScores.forward: returned an int64 tensor",
     "floating-point"),
    ([MODEL + "NanOnRealData"], f"{BAD}:NanOnRealData.forward: returned non-finite scores",
     "real batch (4 rows of client"),
    ([MODEL + "RaisesKeyError"], f"{BAD}:RaisesKeyError.forward: raised KeyError: 'logits'"),
    # selectors, on round 1 with the real population (20 clients, m = 5)
    ([SELECTOR + "OutOfRange"], f"{BAD}:OutOfRange.select (round 1): returned ids beyond the "
                                "20 clients (10000, 10001"),
    ([SELECTOR + "Negative"], "Negative.select (round 1): returned negative ids (-1, -2"),
    ([SELECTOR + "FloatIds"], "returned a float64 array", "float ids are not rounded"),
    ([SELECTOR + "FloatList"], "returned a list of 5 holding a float", "not rounded"),
    ([SELECTOR + "Repeats"], "Repeats.select (round 1): returned client", "5 times"),
    ([SELECTOR + "TooMany"], "returned 6 ids, more than the m = 5 asked for"),
    ([SELECTOR + "TooFew"], "returned 4 ids, fewer than the m = 5 asked for"),
    ([SELECTOR + "NoneWhileOnline"], "returned no client while 20 are online"),
    ([SELECTOR + "ReturnsNone"], "ReturnsNone.select (round 1): returned None; expected a 1-d"),
    ([SELECTOR + "ReturnsSet"], "returned a set"),
    ([SELECTOR + "TwoDimensional"], "returned an int64 array of shape (1, 5)"),
    ([SELECTOR + "BoolMask"], "returned a bool array"),
    ([SELECTOR + "PicksOffline", AVAILABILITY + "EvenOnly"],
     "PicksOffline.select (round 1): returned 5 clients that are offline in this round"),
    ([SELECTOR + "RaisesInSelect"], f"{BAD}:RaisesInSelect.select (round 1): raised KeyError"),
    ([SELECTOR + "UnencodableState"], "UnencodableState.state (round 1): returned a dict, "
                                      "which a checkpoint cannot hold (set at ['seen'])"),
    ([SELECTOR + "BrokenInit"], f"{BAD}:BrokenInit.__init__: raised AttributeError"),
    ([SELECTOR + "DefaultOutOfBounds"], "config key 'selection.fraction' = 5.0",
     f"the default {BAD}:FractionParams declares"),
    # availability models: a mask of exactly N booleans
    ([AVAILABILITY + "ShortMask"], f"{BAD}:ShortMask.online (round 1): returned a mask of "
                                   "shape (19,); expected exactly 20 booleans"),
    ([AVAILABILITY + "IdsInsteadOfMask"], "returned an int64 array of shape (10,)",
     "mask[ids] = True"),
    ([AVAILABILITY + "ZeroOneInts"], "ZeroOneInts.online (round 1): returned an int64 array"),
    ([AVAILABILITY + "StringMask"], "StringMask.online (round 1): returned a str"),
    ([AVAILABILITY + "RaisesInOnline"], "RaisesInOnline.online (round 1): raised "
                                        "ZeroDivisionError"),
    ([AVAILABILITY + "ShortReportMask"], "ShortReportMask.online_at (round 1): returned a mask "
                                         "of shape (6,); expected exactly 5 booleans"),
    # an algorithm whose client fails: named by the user's frame it raised in
    ([f"algorithm.name={BAD}:ClientRaises"], f"{BAD}:ClientRaises.client_train (round 1, "
                                             "client ", "raised ValueError"),
    # the algorithm's and the wrappers' halves the pre-flight calls, held to their contract
    ([ALGORITHM + "BroadcastWithoutX"], f"{BAD}:BroadcastWithoutX.broadcast (round 1): "
                                        "returned a dict without x"),
    ([ALGORITHM + "NegativeWeights"], f"{BAD}:NegativeWeights.aggregation_weights: returned "
                                      "a float64 array of shape (1,) with min -1.0",
     "finite weights ≥ 0"),
    ([ALGORITHM + "NanWeights"], "NanWeights.aggregation_weights", "with min nan"),
    ([ALGORITHM + "ListState"], f"{BAD}:ListState.server_init: returned a list of 1; expected "
                                "a frozen dataclass instance"),
    ([f"wrappers=[{{name: {BAD}:UploadsNone}}]"], f"{BAD}:UploadsNone.client_apply (round 1, "
                                                 "client ", "the upload it returned is None"),
    ([f"wrappers=[{{name: {BAD}:NegativeRate}}]"], f"{BAD}:NegativeRate.client_lr (round 1): "
                                                  "returned -0.1 as the clients' learning rate"),
    ([MODEL + "RaisesWhileBuilding"], f"{BAD}:RaisesWhileBuilding: raised RuntimeError: no "
                                      "accelerator on this laptop (building it for inputs"),
    # components of the wrong kind, or whose Params the schema cannot read
    ([ALGORITHM + "NotAnAlgorithm"], "config key 'algorithm.name'",
     "expected a subclass of rayfl.algorithms.base.Algorithm"),
    ([SELECTOR + "NotASelector"], "config key 'selection.name'",
     "expected a subclass of rayfl.selection.base.Selector"),
    ([AVAILABILITY + "NotASelector"], "config key 'availability.model'",
     "expected a subclass of rayfl.availability.base.AvailabilityModel"),
    ([ALGORITHM + "UndecoratedParams"], "its Params <class 'tests.components_bad.PlainParams'> "
                                        "is not a dataclass"),
    ([ALGORITHM + "SetParamsAlgorithm"], "config key 'algorithm.name'",
     "unsupported schema type <class 'set'> at algorithm.tags"),
    # settings that would do nothing, or be silently replaced
    (["rounds=2", "rounds=3"], "config key 'rounds'", "rounds=2, then rounds=3"),
    (["local.lr=0.1", "local={lr: 0.2}"], "config key 'local.lr'", "then local="),
    (["eval.finetune_steps=5"], "config key 'eval.finetune_steps' = 5: expected 0 unless "
                                "eval.clients > 0"),
    (["eval.finetune_lr=0.1"], "config key 'eval.finetune_lr'"),
]


@pytest.mark.parametrize("overrides, phrases", [
    pytest.param(c[0], c[1:], id=" ".join(c[0]).replace(f"{BAD}:", "")) for c in PREFLIGHT])
def test_a_broken_contract_is_one_line_before_anything_is_written(overrides, phrases, cli,
                                                                  tmp_path, no_ray):
    code, _, err = cli(*overrides)
    assert code == 2, err
    _one_error(err, *phrases)
    assert not (tmp_path / "runs").exists()


def test_the_user_frames_follow_the_line_of_an_exception_in_user_code(cli, no_ray):
    _, _, err = cli(SELECTOR + "RaisesInSelect")
    assert "components_bad.py" in err[1] and err[2] == '    return {}["clients"]', err


def test_the_corpus_is_large():
    assert len(PREFLIGHT) >= 48


def test_a_list_of_ids_and_a_list_of_booleans_keep_the_contract(cli, tmp_path):
    code, out, err = cli(SELECTOR + "IntList", AVAILABILITY + "EvenOnly", "rounds=2")
    assert code == 0, err
    rows = pq.read_table(os.path.join(out[-1], "metrics.parquet")).to_pylist()
    assert [(r["online"], r["completed"]) for r in rows] == [(10, 5), (10, 5)]  # the even ids


# ----- contracts broken mid-run ------------------------------------------------------------------
def test_a_selector_that_breaks_in_round_three_stops_the_run_there(cli, tmp_path):
    code, _, err = cli(SELECTOR + "FailsInRoundThree", "rounds=5")
    assert code == 2
    _one_error(err, f"{BAD}:FailsInRoundThree.select (round 3): returned client", "5 times")
    assert not any("resume" in line for line in err)  # the same code fails the same way
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert pq.read_table(run_dir / "metrics.parquet").column("round").to_pylist() == [1, 2]


@pytest.mark.parametrize("overrides, round, phrases", [
    ([ALGORITHM + "ShrinksX"], 1, ("ShrinksX.server_update (round 1): its x is a float32 "
                                   "tensor of shape (67,); expected a float tensor of shape "
                                   "(68,)",)),
    ([ALGORITHM + "RaisesInRoundTwo"], 2, ("RaisesInRoundTwo.server_update (round 2): raised "
                                           "RuntimeError: the server rule is broken",)),
    ([ALGORITHM + "StringMetric"], 1, ("StringMetric.server_update (round 1): metric 'note' is "
                                       "a str; expected a real number",)),
    ([ALGORITHM + "DeploysPart"], 1, ("DeploysPart.deployed (round 1): the deployed model is a "
                                      "float32 tensor of shape (5,)",)),
    ([f"wrappers=[{{name: {BAD}:AfterReturnsTwo}}]"], 1, (
        "AfterReturnsTwo.after (round 1): returned a tuple of 2; expected a tuple (x, slot, "
        "metrics)",)),
    ([f"server_opt.name={BAD}:short_step"], 1, (
        f"{BAD}:short_step.<locals>.<lambda> (round 1): its step is a float32 tensor of shape "
        "(67,)",)),
], ids=["server_update shrinks x", "server_update raises", "a string metric", "deployed",
        "wrapper after", "server optimiser"])
def test_a_server_half_that_breaks_its_contract_stops_the_run_in_one_line(overrides, round,
                                                                           phrases, cli,
                                                                           tmp_path):
    """The server halves run only once a round has trained: the run stops there, exit 2, one
    line naming the method and the round, the user's frames after it, no resume advice; a run
    stopped before it recorded a round leaves nothing behind, one stopped later its rounds."""
    code, _, err = cli(*overrides, "rounds=3")
    assert code == 2, err
    _one_error(err, f"rayfl: error: {BAD}:", *phrases)
    assert not any("resume" in line for line in err)
    if round == 1:
        assert not (tmp_path / "runs").exists()
        return
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = pq.read_table(run_dir / "metrics.parquet").column("round").to_pylist()
    assert rows == list(range(1, round))


def test_a_selector_state_a_checkpoint_cannot_hold_is_named_at_the_first_checkpoint(cli):
    code, _, err = cli(SELECTOR + "UnencodableAfterObserve", "rounds=3")
    assert code == 2
    _one_error(err, "UnencodableAfterObserve.state (round 1): returned a dict, which a "
                    "checkpoint cannot hold (object at [")


# ----- rounds in which no client completes -------------------------------------------------------
def _summary(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def _late_trace(tmp_path) -> str:
    path = tmp_path / "late.csv"
    path.write_text("client_id,online_start,online_end\n0,1e9,1.1e9\n1,1e9,1.1e9\n")
    return str(path)


@pytest.mark.parametrize("case", ["nobody", "late trace", "deadline", "dropout"])
def test_a_run_whose_rounds_complete_no_client_stops_with_the_reason(case, cli, tmp_path):
    overrides, reason = {
        "nobody": ([AVAILABILITY + "NobodyOnline"], "no client online"),
        "late trace": (["availability.model=trace",
                        f"availability.trace_path={_late_trace(tmp_path)}"], "no client online"),
        "deadline": (["availability.deadline_s=1e-9"], "of 5 sampled: 5 missed the deadline "
                                                       "(availability.deadline_s = 1e-09 s)"),
        "dropout": (["availability.dropout=0.99999"], "of 5 sampled: 5 dropped out "
                                                      "(availability.dropout = 0.99999)"),
    }[case]
    code, out, err = cli(*overrides, "rounds=8", "availability.max_empty_rounds=3")
    assert code == 4, err
    run_dir = out[-1]
    assert err == [f"rayfl: run stopped in round 3: no client completed in 3 rounds in a row "
                   f"(availability.max_empty_rounds = 3); last: {reason}; see {run_dir}"]
    assert out[-2].startswith("stopped: fedavg | 3 rounds (3 without a completed client)")
    assert out[0].startswith(f"round 1/8 | no client completed ({reason}) | 1 empty round |")
    summary = _summary(run_dir)
    assert summary["stopped_at_round"] == 3 and summary["empty_rounds"] == 3
    assert summary["stopped"].startswith("no client completed in 3 rounds in a row")
    rows = pq.read_table(os.path.join(run_dir, "metrics.parquet")).to_pylist()
    assert [(r["completed"], r["empty_rounds"], r["empty_reason"]) for r in rows] == [
        (0, 1, reason), (0, 2, reason), (0, 3, reason)]


def test_a_short_run_of_nothing_but_empty_rounds_is_not_done(cli):
    code, out, err = cli(AVAILABILITY + "NobodyOnline", "rounds=4")  # max_empty_rounds: 10
    assert code == 4 and err[0].startswith("rayfl: run stopped in round 4: no client completed "
                                           "in any of the 4 rounds; last: no client online")
    assert out[-2].startswith("stopped:")


@pytest.mark.parametrize("mode", ["fedbuff", "fedasync"])
def test_an_event_driven_server_with_nobody_online_stops_with_the_reason(mode, cli):
    code, out, err = cli(AVAILABILITY + "NobodyOnline", "rounds=4", f"aggregation.mode={mode}")
    assert code == 4, err
    assert err == [f"rayfl: run stopped in round 1: no client was online for 6.00006e+06 "
                   f"virtual seconds; check the availability model; see {out[-1]}"]
    assert out[-2].startswith("stopped:")
    summary = _summary(out[-1])
    assert summary["stopped_at_round"] == 1 and summary["stopped"].startswith("no client was")


def test_empty_rounds_are_counted_in_a_run_that_goes_on(cli):
    code, out, err = cli(AVAILABILITY + "OfflineInRoundsOneAndThree", "rounds=4")
    assert code == 0, err
    rows = pq.read_table(os.path.join(out[-1], "metrics.parquet")).to_pylist()
    assert [r["completed"] for r in rows] == [0, 5, 0, 5]
    assert [r["empty_rounds"] for r in rows] == [1, 1, 2, 2]
    assert _summary(out[-1])["empty_rounds"] == 2 and "stopped" not in _summary(out[-1])
    assert out[-2].startswith("done: fedavg | 4 rounds (2 without a completed client)")


def test_the_count_of_empty_rounds_goes_on_after_a_resume():
    from rayfl.availability.empty import EmptyRounds

    rows = [{"completed": c} for c in (0, 3, 0, 0)]  # rows already written: 3 empty, 2 in a row
    empty = EmptyRounds(3, 10, rows)
    assert empty.after({"completed": 2}) is None and (empty.total, empty.streak) == (3, 0)
    resumed = EmptyRounds(3, 10, rows)
    row = {"completed": 0, "empty_reason": "no client online"}
    assert resumed.after(row).startswith("no client completed in 3 rounds in a row")
    assert row["empty_rounds"] == 4


def test_max_empty_rounds_may_change_on_resume():
    from rayfl import config, rundir

    plain = config.to_dict(config.load(TINY, ["availability.max_empty_rounds=50"]))
    assert "availability.max_empty_rounds" not in rundir.result_keys(plain)


# ----- resume never silently starts over ------------------------------------------------------
@pytest.fixture
def paused(cli, tmp_path):
    """A run paused after round 3 of 6 that kept the checkpoint of round 2."""
    code, out, _ = cli("rounds=6", "checkpoint.keep=[2]", f"--run-dir={tmp_path / 'run'}",
                       "--max-rounds=3", "--quiet")
    assert code == 0
    return tmp_path / "run"


def test_resume_refuses_a_lost_newest_checkpoint_and_names_the_kept_ones(paused, cli):
    metrics = (paused / "metrics.parquet").read_bytes()
    (paused / "checkpoints" / "checkpoint.pt").unlink()
    code, _, err = cli(command=["resume", str(paused)])
    assert code == 2
    _one_error(err, f"checkpoint {paused / 'checkpoints' / 'checkpoint.pt'}: expected",
               "it is missing, though kept checkpoints are there",
               f"kept checkpoints: rounds 2; rayfl fork {paused} --at 2")
    assert (paused / "metrics.parquet").read_bytes() == metrics  # nothing rewritten
    (paused / "checkpoints" / "round-00002.pt").unlink()
    code, _, err = cli(command=["resume", str(paused)])
    assert code == 2
    _one_error(err, "metrics.parquet records the checkpoint after round 2",
               "no kept checkpoint (checkpoint.keep) is there to continue from")


def test_resume_refuses_a_damaged_newest_checkpoint(paused, cli):
    path = paused / "checkpoints" / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:100])
    code, _, err = cli(command=["resume", str(paused)])
    assert code == 2
    _one_error(err, f"checkpoint {path}: expected a complete rayfl checkpoint",
               "kept checkpoints: rounds 2")


def test_a_run_that_never_checkpointed_resumes_from_scratch(paused, cli, tmp_path):
    for name in ("checkpoints", "metrics.parquet"):  # killed before round 1 ended
        target = paused / name
        if target.is_dir():
            for f in target.iterdir():
                f.unlink()
            target.rmdir()
        else:
            target.unlink()
    code, out, err = cli(command=["resume", str(paused)])
    assert code == 0, err
    assert out[0] == "no round of this run was checkpointed: it starts over from round 1"
    _, whole, _ = cli("rounds=6", "checkpoint.keep=[2]", "--quiet")
    assert _summary(str(paused))["model_sha256"] == _summary(whole[-1])["model_sha256"]


# ----- failures inside Ray ----------------------------------------------------------------------
def _processes_with(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the run's Ray workers inherit it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _processes_left(tag: str, grace_s: float = 60.0) -> list[int]:
    """The processes carrying ``tag`` that are still there ``grace_s`` after the run exited
    (a local Ray's workers are stopped by its raylet as the driver exits, which on a loaded
    machine takes a moment after the driver is gone); none as soon as none is."""
    deadline = time.monotonic() + grace_s
    while (left := _processes_with(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


#: the one line Ray itself prints when a local Ray starts (every run, not a failure's dump)
RAY_START_NOTICE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+WARNING authentication_token_setup")
#: a line Ray's own native code (abseil) rarely prints from a worker on a loaded machine, which
#: Ray forwards as it forwards a user's prints: neither rayfl's nor the failure's
RAY_NATIVE_NOTICE = re.compile(r"^\S*\((?:[\w.]+ )?pid=\d+\)\S* \[[\w.]+ : \d+\] RAW: ")


def test_a_user_error_inside_ray_is_one_line_with_no_dump_and_no_process_left(tmp_path):
    tag = f"RAYFL_TEST_TAG={uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": ROOT, tag.split("=")[0]: tag.split("=")[1]}
    run = subprocess.run(
        [sys.executable, "-m", "rayfl", "run", TINY, f"data.cache_dir={tmp_path / 'cache'}",
         f"output_dir={tmp_path / 'runs'}", "rounds=4", "runtime.num_actors=1",
         SELECTOR + "RaisesInRoundThree", "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    err = [line for line in run.stderr.splitlines()
           if not (RAY_START_NOTICE.match(line) or RAY_NATIVE_NOTICE.match(line))]
    _one_error(err, f"{BAD}:RaisesInRoundThree.select (round 3): raised RuntimeError: the "
                    "selector's own bug")
    assert f'File "{ROOT}/tests/components_bad.py"' in err[1], err  # its path, not Ray's copy
    assert not any(w in line for line in err for w in ("ray::", "(raylet)", "pid=", "resume")), \
        err
    assert _processes_left(tag) == []


def test_a_client_actors_component_error_reaches_the_server_as_itself(ray_local, free_cpus):
    import ray
    import torch

    from rayfl.runtime.executors import RayExecutor

    @ray.remote
    class Broken:
        def train_arrays(self, *args):
            raise ComponentError("pkg.mod:Algo.client_train", "returned a str", 0, 3)

    actors = [Broken.remote() for _ in range(2)]
    try:  # both actors fail: the error of one is raised, the other's read (not left to Ray)
        executor = RayExecutor(actors, np.ones(4, dtype=np.int64))
        with pytest.raises(ComponentError) as info:
            executor.run(0, {"x": torch.zeros(2)}, 0.1, [(0, [(3, 1.0, -1, None)]),
                                                         (1, [(2, 1.0, -1, None)])], None,
                         np.array([2, 3]))
        assert type(info.value) is ComponentError  # itself, not Ray's wrapper of it
        assert str(info.value) == "pkg.mod:Algo.client_train (round 1, client 3): returned a str"
    finally:
        for actor in actors:
            ray.kill(actor)


def test_resume_is_advised_only_with_a_checkpoint_to_continue_from(paused, tmp_path):
    from ray.exceptions import ActorDiedError, RayTaskError

    from rayfl import failures

    died = str(failures.server_died(ActorDiedError(), str(paused), 3))
    assert died.startswith("the server actor died in round 4") and died.endswith(
        f"the last checkpoint is intact; continue with: rayfl resume {paused}")
    (paused / "checkpoints" / "checkpoint.pt").unlink()
    died = str(failures.server_died(ActorDiedError(), str(paused), 3))
    assert "continue with" not in died and "no round was checkpointed yet" in died
    try:
        {}["x"]
    except KeyError as e:
        wrapped = RayTaskError("Server.run", "Traceback ...\nKeyError: 'x'", e)
    stopped = failures.server_failed(wrapped, str(paused), 0)
    assert str(stopped) == f"KeyError in round 1: 'x'; see {paused}"


def test_a_server_that_could_not_start_says_why_in_one_line():
    from ray.exceptions import RayTaskError

    from rayfl import failures
    from rayfl.contract import ComponentError

    text = (f'Traceback (most recent call last):\n  File "{ROOT}/tests/components_bad.py", line 9, '
            'in load_state\n    return {}["x"]\nrayfl.contract.ComponentError: '
            f"{BAD}:X.load_state: raised KeyError: 'x'\n")
    cause = ComponentError(f"{BAD}:X.load_state", "raised KeyError: 'x'")
    stopped = failures.server_not_started(RayTaskError("ServerHost.start", text, cause))
    assert str(stopped) == (f"the server actor could not start: {BAD}:X.load_state: raised "
                            "KeyError: 'x'")
    assert stopped.frames.splitlines() == [f'  File "{ROOT}/tests/components_bad.py", line 9, in '
                                           'load_state', '    return {}["x"]']
