"""User components whose declarations, or what they hand back, break their contract.

Each misbehaving algorithm, wrapper, server optimiser, model or dataset
(tests/components_bad2.py) goes through the command line: exit status 2 and one line naming the
component or its config key and what was expected, followed only by the user's own frames —
never a traceback. What a component declares of itself (its traits, its Params, how it is built)
is refused where the run is configured; what it returns, at the pre-flight; either way nothing
is written and Ray never starts. What only the server's rounds call is refused there, in the
round it happens. Then the partition cache: a damaged entry is said and built again, a write
that fails is refused on ``data.cache_dir`` with nothing left behind.
"""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from rayfl import registry
from rayfl.cli import main
from tests.components_bad2 import VectorState
from tests.conftest import TINY

BAD = "tests.components_bad2"
MODEL, ALGORITHM, DATASET = (f"{key}={BAD}:" for key in ("model.name", "algorithm.name",
                                                          "data.dataset"))


def _wrapper(name: str) -> str:
    return f"wrappers=[{{name: {BAD}:{name}}}]"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def cli(tmp_path, capsys, cache):
    """``cli(*overrides, cache_dir=None, executor="inprocess")`` -> (exit status, stdout
    lines, stderr lines) of a run of the tiny config in this process, under tmp_path."""
    def call(*overrides, cache_dir=None, executor="inprocess"):
        code = main(["run", TINY, f"output_dir={tmp_path / 'runs'}",
                     f"data.cache_dir={cache_dir or cache}", f"runtime.executor={executor}",
                     *overrides])
        out = capsys.readouterr()
        return code, out.out.splitlines(), out.err.splitlines()

    return call


def _one_error(err: list[str], *phrases: str) -> str:
    """One line naming what was wrong, then only frames of tests/components_bad2.py."""
    assert err and err[0].startswith("rayfl: error: "), err
    for phrase in phrases:
        assert phrase in err[0], err[0]
    for line in err[1:]:
        assert (line.startswith('  File "') and "components_bad2.py" in line) or \
            line.startswith("    "), line
    assert not any("Traceback" in line for line in err), err
    return err[0]


# ----- refused before anything is written or started --------------------------------------------
KEY = f"config key 'algorithm.name' = '{BAD}:"
BEFORE = [
    # what an algorithm declares of itself, refused on its key
    ([ALGORITHM + "VectorState"], KEY + "VectorState'", "traits.client_state kinds are one of "
                                                        "model, scalar, buffers, any (entry 'h' "
                                                        "is 'vector')"),
    ([ALGORITHM + "UnknownCapability"], KEY + "UnknownCapability'",
     "traits.capabilities are among extra_models, personal_model, setup, settle (it declares "
     "'teleport')"),
    ([ALGORITHM + "DictTraits"], KEY + "DictTraits'", "whose traits is a Traits record",
     "its traits is a dict"),
    ([ALGORITHM + "SettleWithoutMessage"], KEY + "SettleWithoutMessage'",
     "defines round_message and client_settle, as its capability 'settle' means (it has no "
     "round_message)"),
    ([ALGORITHM + "ShadowsServerLr"], KEY + "ShadowsServerLr'",
     "Params keep the type and bounds of the fields they redefine (AscentParams.server_lr is "
     "float, where the ServerParams.server_lr it redefines is float > 0.0)"),
    ([ALGORITHM + "NeedsArgument"], KEY + "NeedsArgument'",
     "built as cls(params, *, weighting, num_clients, local_momentum)",
     "missing a required argument: 'scale'"),
    ([ALGORITHM + "CheckConfigRaises"], f"{BAD}:CheckConfigRaises.check_config: raised "
                                        "ValueError: clients_per_round must be even"),
    # what it returns on the pre-flight's client
    ([ALGORITHM + "ThawedState"], f"{BAD}:ThawedState.server_init: returned a Thawed, a "
                                  "dataclass that is not frozen; expected a frozen dataclass"),
    *[([ALGORITHM + name], f"{BAD}:{name}.client_train (round 1, client ",
       f"client state entry 'h' is declared 'any' but is {what}, not a tensor")
      for name, what in (("AnyList", "a list of 2"), ("AnyString", "a str"),
                         ("AnyLambda", "a function"),
                         ("AnyArray", "a float64 array of shape (3,)"))],
    ([ALGORITHM + "NumpyExtra"], f"{BAD}:NumpyExtra.broadcast (round 1): returned its "
                                 "broadcast whose 'c' is a float64 array of shape (3,); "
                                 "expected a torch.Tensor"),
    # wrappers, held to the algorithm's contract
    ([_wrapper("DictLayerTraits")], f"config key 'wrappers[0].name' = '{BAD}:DictLayerTraits'",
     "a layer whose traits is a LayerTraits record", "its traits is a dict"),
    ([_wrapper("NeedsFacts")], f"config key 'wrappers[0].name' = '{BAD}:NeedsFacts'",
     "a layer built as cls(params, facts)", "missing a required argument: 'window'"),
    ([_wrapper("TensorBroadcast")], f"{BAD}:TensorBroadcast.broadcast (round 1): returned its "
                                    "broadcast as a float32 tensor of shape (3,); expected a "
                                    "dict of name -> torch.Tensor"),
    ([_wrapper("StringPayload")], f"{BAD}:StringPayload.client_apply (round 1): put payload "
                                  "entry 'note' that is a str: payload values are tensors or "
                                  "numbers"),
    # server optimisers
    ([f"server_opt.name={BAD}:lambda_state"], f"{BAD}:lambda_state.<locals>.<lambda>: "
                                              "returned a server optimiser state holding "
                                              "function at ['schedule'], which a checkpoint "
                                              "cannot hold"),
    (["server_opt.name=builtins:int"], "config key 'server_opt.name' = 'builtins:int': "
                                       "expected a callable optimizer(section, lr) returning a "
                                       "ServerOpt (calling builtins:int(section, lr) raised "
                                       "TypeError"),
    # models: what their parameters are, and whether a gradient reaches them
    ([MODEL + "OnMeta"], f"{BAD}:OnMeta: returned a OnMeta whose layer.weight is on the meta "
                         "device"),
    ([MODEL + "ComplexWeights"], f"{BAD}:ComplexWeights: returned a ComplexWeights whose w is "
                                 "a complex64 tensor of shape (4, 16); expected real "
                                 "floating-point parameters"),
    ([MODEL + "Detached"], f"{BAD}:Detached.forward: returned scores for a real batch",
     "that no trainable parameter reaches"),
    # datasets: the labels' shape, named on the loader
    ([DATASET + "ColumnLabels"], f"{BAD}:ColumnLabels.load: y_train has shape (600, 1) for "
                                 "kind 'dense'; expected one class label per row"),
]


@pytest.mark.parametrize("overrides, phrases", [
    pytest.param(c[0], c[1:], id=" ".join(c[0]).replace(f"{BAD}:", "")) for c in BEFORE])
def test_a_broken_declaration_or_return_is_one_line_before_anything_is_written(
        overrides, phrases, cli, tmp_path, no_ray):
    code, _, err = cli(*overrides)
    assert code == 2, err
    _one_error(err, *phrases)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("overrides", [
    [ALGORITHM + "AddsAKey", "algorithm.pull=0.5"], [DATASET + "NumpyClasses"],
    ["algorithm.name=fedadagrad"]], ids=["Params adding a key", "numpy num_classes",
                                         "a built-in redefining server_lr's default"])
def test_what_keeps_the_contract_in_an_unusual_way_runs(overrides, cli):
    code, _, err = cli(*overrides, "rounds=1")
    assert code == 0, err


# ----- refused in the round that calls it --------------------------------------------------------
@pytest.mark.parametrize("overrides, phrases", [
    ([ALGORITHM + "RaggedRows"], (f"{BAD}:RaggedRows.client_train (round 1, client ",
                                  "returned Rows payload entry 'r' of shape", "where an earlier "
                                  "client's was", "every client's row has the same shape")),
    ([ALGORITHM + "FloatMessage"], (f"{BAD}:FloatMessage.round_message (round 1): returned its "
                                    "message as a float; expected a dict of name -> "
                                    "torch.Tensor",)),
    ([ALGORITHM + "ListExtraModels"], (f"{BAD}:ListExtraModels.extra_models (round 1): returned "
                                       "a list of 1; expected a dict of name -> model vector",)),
], ids=["ragged Rows", "a float round message", "a list of extra models"])
def test_a_server_side_return_that_breaks_its_contract_stops_the_round_in_one_line(
        overrides, phrases, cli, tmp_path):
    code, _, err = cli(*overrides, "rounds=2")
    assert code == 2, err
    _one_error(err, *phrases)
    assert not (tmp_path / "runs").exists()  # stopped before it recorded a round: nothing left


# ----- declarations checked where they are registered -------------------------------------------
def test_an_algorithm_declaring_an_unknown_kind_is_refused_when_registered():
    with pytest.raises(ValueError, match=r"VectorState cannot be registered as .algorithm.: "
                                         r"expected an algorithm whose traits.client_state"):
        registry.register_algorithm(VectorState, name="vector_state")
    assert "vector_state" not in registry.names("algorithm")


# ----- Ray sends the user's components to its workers: they must pickle -------------------------
def test_a_component_ray_cannot_send_is_refused_before_the_run_directory(cli, tmp_path, no_ray):
    from rayfl.algorithms.fedavg import FedAvg

    class HoldsALock(FedAvg):  # defined here: pickled by value, with its lock
        lock = threading.Lock()

    registry.register_algorithm(HoldsALock, name="holds_a_lock")
    try:
        code, _, err = cli("algorithm.name=holds_a_lock", executor="ray")
    finally:
        registry.unregister("algorithm", "holds_a_lock")
    assert code == 2, err
    assert err == ["rayfl: error: config key 'algorithm.name' = 'holds_a_lock': expected a "
                   "component the executor can copy to its workers (pickling it failed: "
                   "TypeError: cannot pickle '_thread.lock' object)"]
    assert not (tmp_path / "runs").exists()


def test_the_users_components_that_pickle_pass_the_check_for_ray(cache):
    from rayfl import assemble, config, preflight

    cfg = config.load(TINY, [ALGORITHM + "AddsAKey", _wrapper("StringPayload"),
                             f"data.cache_dir={cache}"])
    preflight._sendable(cfg, assemble.stack(cfg, 20))  # raises nothing


# ----- rounds the privacy mechanism's participation bound leaves empty --------------------------
def test_a_round_the_participation_bound_leaves_empty_says_so(cli):
    code, out, err = cli("privacy.mechanism=dp_ftrl", "privacy.noise_multiplier=0.5",
                         "privacy.clip_norm=1.0", "aggregation.weighting=uniform",
                         "clients_per_round=20", "privacy.max_participations=1", "rounds=3",
                         "availability.max_empty_rounds=2")
    assert code == 4, err
    assert "last: the participation bound left none of the 20 online clients eligible " \
           "(privacy.min_separation rounds between a client's rounds, at most " \
           "privacy.max_participations of them)" in err[0], err
    assert "Poisson" not in err[0]


# ----- the partition cache ----------------------------------------------------------------------
def test_a_damaged_cache_entry_is_said_and_built_again_to_the_same_bytes(cli, tmp_path):
    cache = str(tmp_path / "cache")
    code, out, err = cli("rounds=1", cache_dir=cache)
    assert code == 0, err
    first = np.load(os.path.join(out[-1], "final_model.npy"))
    (entry,) = [e for e in os.listdir(cache) if not e.startswith(".")]
    train = os.path.join(cache, entry, "train.arrow")
    with open(train, "r+b") as f:
        f.truncate(os.path.getsize(train) // 2)
    code, out, err = cli("rounds=1", cache_dir=cache)
    assert code == 0, err
    assert err == [f"rayfl: the partition store {os.path.join(cache, entry)} is damaged "
                   f"({err[0].split('is damaged (', 1)[1]}"]
    assert "Arrow" in err[0] and err[0].endswith("; building it again")
    assert np.array_equal(np.load(os.path.join(out[-1], "final_model.npy")), first)
    from rayfl.data.store import damaged

    assert damaged(os.path.join(cache, entry)) is None


@pytest.mark.parametrize("code_", [errno.ENOSPC, errno.EROFS], ids=["full disk", "read-only"])
def test_a_cache_write_that_fails_is_one_line_with_nothing_left(code_, cli, tmp_path,
                                                                monkeypatch, no_ray):
    from rayfl.data import store

    def fail(path, table):
        raise OSError(code_, os.strerror(code_), path)

    monkeypatch.setattr(store, "_write_arrow", fail)
    cache = tmp_path / "cache"
    code, _, err = cli(cache_dir=str(cache))
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"rayfl: error: config key 'data.cache_dir' = "
                                               f"'{cache}': expected a folder the partition "
                                               "store can be written to (writing "), err
    assert err[0].endswith(f"failed: {os.strerror(code_)})")
    assert not cache.exists() and not (tmp_path / "runs").exists()
