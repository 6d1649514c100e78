"""The run as a stack of layers: each owns one typed slot, acts on both sides, and a client has
one entry point — against independent facts (torch's ReduceLROnPlateau, hand-computed uploads),
each reducing to FedAvg byte for byte at its limit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rayfl import cli
import rayfl
from rayfl.algorithms.base import Algorithm, ClientResult
from rayfl.algorithms.fedavg import FedAvg
from rayfl.algorithms.server_opt import sgd
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.layers import ClientState, Layer, Stack, mismatch
from rayfl.runtime.client_state import decode, encode
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.transforms import ClipParams, ClipUpdate
from tests.conftest import TINY

IN_PROCESS = ["runtime.executor=inprocess", "rounds=4"]
PLATEAU = "examples.plateau:ReduceOnPlateau"


def _run(tiny, *overrides):
    return rayfl.run(TINY, tiny + IN_PROCESS + list(overrides), quiet=True)


# ----- a wrapper that reads its clients' losses and sets their learning rate --------------------
def test_a_plateau_schedule_at_factor_one_is_the_wrapped_runs_bytes(tiny):
    plain = _run(tiny, "name=plain")
    wrapped = _run(tiny, f"wrappers=[{{name: '{PLATEAU}', factor: 1.0, patience: 0}}]",
                   "name=plateau")
    assert wrapped.summary["model_sha256"] == plain.summary["model_sha256"]


def test_the_plateau_schedule_is_torchs_reduce_lr_on_plateau_on_the_clients_losses(tiny):
    """The wrapper's lr scale follows torch's scheduler fed the round losses it read; the loss
    it read is the clients' mean training loss weighted like their updates."""
    run = _run(tiny, "rounds=8", "local.lr=0.5",
               f"wrappers=[{{name: '{PLATEAU}', factor: 0.5, patience: 0, threshold: 0.05}}]")
    rows = run.metrics.to_pylist()
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5,
                                                       patience=0, threshold=0.05)
    scales = []
    for r in rows:
        sched.step(r["plateau_loss"])
        scales.append(opt.param_groups[0]["lr"])
    assert [r["plateau_lr_scale"] for r in rows] == pytest.approx(scales)
    assert min(scales) < 1.0  # it did cut the rate: the next rounds train slower
    for before, after in zip(rows, rows[1:]):  # the scale of round t sets round t + 1's lr
        assert after["lr"] == pytest.approx(0.5 * before["plateau_lr_scale"])


# ----- a method that changes its upload -----------------------------------------------------
class DoubledUpload(Algorithm):
    """FedAvg whose clients upload 2 (x − y): every layer sees the upload, not x − y."""

    def client_train(self, task, ctx):
        y = ctx.train()
        return ClientResult(y, upload=2 * (task.bc["x"] - y))


def test_the_upload_is_what_every_layer_and_the_aggregate_see():
    a, b = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, -1.0],
                                                                       dtype=torch.float64)
    clients = [quadratic_client(a, b), quadratic_client(2 * a, b)]
    spec, x0 = LocalSpec(steps=5, batch_size=1), torch.zeros(2, dtype=torch.float64)
    plain, _, _ = simulate(FedAvg(weighting="uniform"), x0, clients, spec, 1, 0.1)
    doubled, hist, _ = simulate(DoubledUpload(weighting="uniform"), x0, clients, spec, 1, 0.1)
    assert torch.allclose(x0 - doubled.x, 2 * (x0 - plain.x), atol=1e-15)
    clip = [ClipUpdate(ClipParams(max_norm=0.1))]  # a layer clips the upload itself
    clipped, _, _ = simulate(DoubledUpload(weighting="uniform"), x0, clients, spec, 1, 0.1,
                             transforms=clip)
    assert float((x0 - clipped.x).norm()) <= 0.1 + 1e-9
    assert hist[0]["update_norm"] == pytest.approx(float((x0 - doubled.x).norm()))


# ----- one slot per layer -------------------------------------------------------------------
class Recorder(Layer):
    """A layer that records the slot it is handed and keeps its own counter."""

    seen: list = []

    def init(self, x0):
        return {"count": 0, "tag": self.params.name}

    def aggregate(self, slot, agg, sums, srv):
        Recorder.seen.append(slot["tag"])
        return agg, {**slot, "count": slot["count"] + 1}, {}


@dataclasses.dataclass(frozen=True)
class Tag:
    name: str = "a"


Recorder.Params = Tag


def test_each_layer_gets_its_own_slot_and_the_tree_has_one_per_layer():
    a, b = Recorder(Tag("a")), Recorder(Tag("b"))
    stack = Stack(FedAvg(), sgd(1.0), wrappers=[a], transforms=[b])
    clients = [quadratic_client(torch.ones(2), torch.ones(2))]
    Recorder.seen = []
    state, _, _ = simulate(FedAvg(), torch.zeros(2), clients, LocalSpec(steps=1), 2, 0.1,
                           wrappers=[a], transforms=[b])
    assert Recorder.seen == ["b", "a", "b", "a"]  # server halves last layer first, each its own
    assert state.wrappers == ({"count": 2, "tag": "a"},)
    assert state.transforms == ({"count": 2, "tag": "b"},)
    fresh = stack.init(torch.zeros(2))
    assert mismatch(fresh, state) is None
    other = Stack(registry_algorithm("scaffold"), sgd(1.0), wrappers=[a], transforms=[b])
    assert "ScaffoldState" in mismatch(other.init(torch.zeros(2)), state)


def registry_algorithm(name):
    from rayfl.algorithms import registry

    return registry.get(name)()


def test_a_client_state_tree_is_stored_as_named_arrays_and_read_back():
    stack = Stack(FedAvg(), sgd(1.0), transforms=[ClipUpdate(), ClipUpdate()])
    tree = ClientState({"c": torch.ones(3)}, (None, {"residual": torch.zeros(3)}),
                       torch.arange(2.0))
    named = encode(tree)
    assert set(named) == {"algorithm.c", "layers.1.residual", "buffers"}
    back = decode(named, stack)
    assert torch.equal(back.algorithm["c"], tree.algorithm["c"])
    assert back.layers[0] is None and torch.equal(back.layers[1]["residual"], torch.zeros(3))
    assert torch.equal(back.buffers, tree.buffers)
    # rayfl 0.1's flat names land in the same tree
    legacy = decode({"c": torch.ones(3), "_transform1_residual": torch.zeros(3),
                     "_model_buffers": torch.arange(2.0)}, stack)
    assert set(legacy.algorithm) == {"c"} and set(legacy.layers[1]) == {"residual"}
    assert torch.equal(legacy.buffers, tree.buffers)


def test_a_checkpoint_of_another_algorithm_is_refused_by_its_structure(tiny, tmp_path):
    from rayfl import config as config_mod
    from rayfl.assemble import stack as build
    from rayfl.runtime import checkpoint

    paused = rayfl.run(TINY, tiny + IN_PROCESS + ["algorithm.name=scaffold"],
                       run_dir=str(tmp_path / "src"), quiet=True, max_rounds=2)
    ck = checkpoint.load(paused.run_dir)
    scaffold = build(config_mod.load(TINY, ["algorithm.name=scaffold"]), 20)
    assert checkpoint.server_state(scaffold, ck, "ck").algorithm.c.shape == (68,)
    fedavg = build(config_mod.load(TINY), 20)
    with pytest.raises(rayfl.CheckpointError) as e:
        checkpoint.server_state(fedavg, ck, "ck")
    assert e.value.path == "ck" and "ScaffoldState" in e.value.expected


# ----- components of rayfl 0.1's interface say what to change --------------------------------
class OldRule(Algorithm):
    client_state = {"c": "model"}

    def client_begin(self, task):
        return None


class OldServer(Algorithm):
    def server_update(self, state, agg, t):
        return state, {}


class OldWrapper(ServerWrapper):
    own_keys = ("ema",)


@pytest.mark.parametrize("entry, key, says", [
    ("algorithm.name=tests.test_layers:OldRule", "algorithm.name", "client_begin"),
    ("algorithm.name=tests.test_layers:OldServer", "algorithm.name", "server_update(x, state"),
    ("wrappers=[{name: 'tests.test_layers:OldWrapper'}]", "wrappers[0].name", "own_keys"),
])
def test_a_component_of_the_previous_interface_is_one_line_naming_what_to_change(
        entry, key, says, tmp_path, capsys):
    code = cli.main(["run", TINY, entry, f"output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and key in err[0] and says in err[0]
    assert "rayfl 0.1" in err[0] and not (tmp_path / "runs").exists()


# ----- the client's result is checked where the core calls it -------------------------------
class BreaksFromRoundTwo(Algorithm):
    """Trains plainly in round 1 (the pre-flight trains one client of it, in this process), and
    from round 2 on does what ``broken`` does: the run's own round meets it."""

    def client_train(self, task, ctx):
        return ClientResult(ctx.train()) if task.t == 0 else self.broken(task, ctx)


class ReturnsTuple(BreaksFromRoundTwo):
    def broken(self, task, ctx):
        y = ctx.train()
        return y, ClientResult(y)


class ReturnsIntModel(BreaksFromRoundTwo):
    def broken(self, task, ctx):
        return ClientResult(ctx.train().long())


class ReturnsShortModel(BreaksFromRoundTwo):
    def broken(self, task, ctx):
        return ClientResult(ctx.train()[:3])


class GrowingPayload(BreaksFromRoundTwo):
    def broken(self, task, ctx):
        y = ctx.train()
        return ClientResult(y, {"v": torch.zeros(1 + task.client_id % 3)})


class StringPayload(BreaksFromRoundTwo):
    def broken(self, task, ctx):
        return ClientResult(ctx.train(), {"note": "hello"})


class Raises(BreaksFromRoundTwo):
    def broken(self, task, ctx):
        raise KeyError("missing")


@pytest.mark.parametrize("name, says", [
    ("ReturnsTuple", "returned (y, ClientResult(payload, state))"),
    ("ReturnsIntModel", "not a floating-point vector"),
    ("ReturnsShortModel", "a model that is a float32 tensor of shape (3,)"),
    ("GrowingPayload", "payload entry 'v' of shape"),
    ("StringPayload", "payload entry 'note' that is a str"),
    ("Raises", "raised KeyError: 'missing'"),
])
def test_a_client_breaking_its_contract_is_one_line_naming_it_the_round_and_the_client(
        name, says, tmp_path, capsys):
    code = cli.main(["run", TINY, f"algorithm.name=tests.test_layers:{name}", "rounds=2",
                     "runtime.executor=inprocess", f"output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    # a shape that differs between clients is found where their sums meet: no one client
    where = "(round 2)" if name == "GrowingPayload" else "(round 2, client "
    assert f"tests.test_layers:{name}.client_train {where}" in err[0], err
    assert says in err[0], err
    assert not any("Traceback" in line for line in err)
