"""What rayfl lends the user's code is read-only, and a model's buffers keep their shape.

The broadcast (``task.bc``, ``ctx.x``), a client's stored state (``task.state``), the
minibatches ``ctx.batches()`` yields (on a GPU their rows come from one upload), a layer's
broadcast and state (``ctx.broadcast``, ``ctx.state``), and on the server the model, state and
aggregate ``server_update`` is handed, are shared with other clients, later rounds and the
checkpoint: an in-place edit of one is refused as one line naming the method and
the tensor, exit 2, the same in process and on Ray actors (the edit would otherwise give other
bytes on each, and after a resume). A buffer that changes shape or dtype, or is replaced, during
training is refused likewise. The check reads version counters only: accepted runs keep their
bytes, across executors and resumes.
"""

from __future__ import annotations

import pytest
import torch

from rayfl import run
from rayfl.cli import main
from rayfl.contract import ComponentError, Lent
from tests.conftest import TINY

BAD = "tests.components_bad"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def cli(tmp_path, capsys, cache):
    """``cli(executor, *overrides)`` -> (exit status, stderr lines) of a run of the tiny config
    on that executor, its runs under tmp_path."""
    def call(executor, *overrides):
        code = main(["run", TINY, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={cache}",
                     f"runtime.executor={executor}", "--quiet", *overrides])
        return code, capsys.readouterr().err.splitlines()

    return call


def _one_line(err: list[str], *phrases: str) -> None:
    assert err and err[0].startswith("rayfl: error: "), err
    for phrase in phrases:
        assert phrase in err[0], err[0]
    assert not any("Traceback" in line or "resume" in line for line in err), err


EDITS = {
    "state": ([f"algorithm.name={BAD}:EditsState"],
              f'{BAD}:EditsState.client_train (round 2, client ', 'edited task.state["c"] in '
              "place; what rayfl lends is read-only"),
    "broadcast": ([f"algorithm.name={BAD}:EditsBroadcastFromRoundTwo"],
                  f"{BAD}:EditsBroadcastFromRoundTwo.client_train (round 2, client ",
                  'edited task.bc["x"] (ctx.x) in place'),
    "ctx.x after training": ([f"algorithm.name={BAD}:ZeroesXAfterTraining"],
                             f"{BAD}:ZeroesXAfterTraining.client_train (round 2, client ",
                             'edited task.bc["x"] (ctx.x) in place'),
    "a view of the state": ([f"algorithm.name={BAD}:EditsViewOfState"],
                            'edited task.state["c"] in place'),
    "a layer's state": ([f"wrappers=[{{name: {BAD}:ResidualInPlace}}]"],
                        f"{BAD}:ResidualInPlace.client_apply (round 2, client ",
                        'edited ctx.state["seen"] in place'),
    "the server's aggregate": ([f"algorithm.name={BAD}:EditsAggregate"],
                               f"{BAD}:EditsAggregate.server_update (round 1): edited "
                               "agg.delta_mean in place"),
    "the server's x": ([f"algorithm.name={BAD}:StepsXInPlace"],
                       f"{BAD}:StepsXInPlace.server_update (round 1): edited x in place"),
    "a minibatch's indices": ([f"algorithm.name={BAD}:SortsItsMinibatches"],
                              f"{BAD}:SortsItsMinibatches.client_train (round 2, client ",
                              "edited a minibatch of ctx.batches() in place; the index arrays "
                              "rayfl lends are read-only"),
    "a minibatch, put back": ([f"algorithm.name={BAD}:EditsAMinibatchAndPutsItBack"],
                              f"{BAD}:EditsAMinibatchAndPutsItBack.client_train (round 2, client ",
                              "edited a minibatch of ctx.batches() in place"),
    "a buffer's dtype": ([f"model.name={BAD}:DoubleAfterFiveForwards"],
                         f"{BAD}:DoubleAfterFiveForwards.forward (round 1, client ",
                         "buffer 'forwards' went from float32 (1,) to float64 (1,) during "
                         "training"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_an_in_place_edit_of_what_is_lent_is_one_line_in_process(case, cli):
    overrides, *phrases = EDITS[case]
    code, err = cli("inprocess", *overrides)
    assert code == 2, err
    _one_line(err, *phrases)


@pytest.mark.parametrize("case", ["state", "broadcast", "a minibatch's indices",
                                  "a buffer's dtype", "the server's aggregate"])
def test_an_in_place_edit_is_the_same_line_on_ray_actors(case, cli, ray_local):
    overrides, *phrases = EDITS[case]
    code, here = cli("inprocess", *overrides)
    assert code == 2
    code, there = cli("ray", *overrides)
    assert code == 2, there
    _one_line(there, *phrases)
    assert there[0] == here[0]  # the same client, the same round, the same words


@pytest.mark.parametrize("model, says", [
    ("GrowingBuffer", "GrowingBuffer.forward (round 1, client 10): buffer 'seen' went from "
                      "float32 (1,) to float32 (2,) during training"),
    ("ReassignedBuffer", "ReassignedBuffer.forward (round 1, client 10): buffer 'mean' was "
                         "replaced by another tensor (assigned, not updated in place)"),
])
def test_a_buffer_that_changes_in_every_forward_is_refused_before_the_run(model, says, cli,
                                                                          tmp_path, no_ray):
    code, err = cli("inprocess", f"model.name={BAD}:{model}")
    assert code == 2, err
    _one_line(err, f"{BAD}:{says}")
    assert not (tmp_path / "runs").exists()


def test_lent_names_each_tensor_as_the_user_reads_it():
    x, c = torch.zeros(4), torch.ones(4)
    lent = Lent().add("task.bc", {"x": x, 3: [c]}).add("task.state", None)
    assert [name for name, *_ in lent.items] == ['task.bc["x"]', "task.bc[3][0]"]
    lent.check("m:A.f")  # read, copied, cloned: nothing moved
    _ = (x + 1, c.clone().add_(1), x.view(2, 2).sum())
    lent.check("m:A.f")
    c[1:].mul_(2)  # a view's edit moves the tensor's counter
    with pytest.raises(ComponentError) as info:
        lent.check("m:A.f", 1, 7)
    assert str(info.value).startswith("m:A.f (round 2, client 7): edited task.bc[3][0] in place")


def test_an_inference_tensor_is_lent_without_a_counter():
    with torch.inference_mode():
        frozen = torch.zeros(2)
    assert Lent().add("s", {"v": frozen}).items == []


# ----- accepted runs keep their bytes ----------------------------------------------------------
ACCEPTED = ["algorithm.name=scaffold", "model.name=examples.bn_model:BNNet", "data.partition=iid",
            "rounds=3"]


def test_an_accepted_run_gives_the_same_bytes_resumed_and_on_either_executor(ray_local, tiny,
                                                                              tmp_path):
    from rayfl.simulation import resume

    whole = run(TINY, [*tiny, *ACCEPTED, "runtime.executor=inprocess"], quiet=True)
    paused = run(TINY, [*tiny, *ACCEPTED, "runtime.executor=inprocess"], quiet=True,
                 run_dir=str(tmp_path / "paused"), max_rounds=1)
    resumed = resume(paused.run_dir, quiet=True)
    on_ray = run(TINY, [*tiny, *ACCEPTED, "runtime.num_actors=2"], quiet=True)
    assert whole.summary["model_sha256"] == resumed.summary["model_sha256"] \
        == on_ray.summary["model_sha256"]
