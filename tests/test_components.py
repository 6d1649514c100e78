"""Bring your own code: module:Name references and registered components for every kind, their
typed Params, the cache key, worker shipping, and the data layer's round rows and evaluators."""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from dataclasses import dataclass

import cloudpickle
import numpy as np
import pytest
import torch

from rayfl import cli, config, registry, schema
from rayfl.availability import AvailabilityModel, make_sampler
from rayfl.data import prepare, store
from rayfl.data import evaluators
from rayfl.data.evaluators import ranking
from rayfl.data.regime import regime_rows
from rayfl.models import build_for, rec_metrics
from rayfl.runtime.cluster import runtime_env
from rayfl.schema import ConfigError
from tests.conftest import ROOT, TINY
from tests.test_availability import SPEC, FakeHandle

ALGO = "examples.my_algo:MyAlgo"
MODEL = "examples.my_model:TinyMLP"
DATA = "examples.my_data:Rings"


def load(*overrides):
    return config.load(TINY, list(overrides))


def test_references_name_every_kind_with_typed_params(tmp_path):
    cfg = load(f"algorithm.name={ALGO}", "algorithm.pull=0.05", f"model.name={MODEL}",
               "model.width=8", f"data.dataset={DATA}", "data.noise=0.3")
    assert cfg.algorithm.params.pull == 0.05 and cfg.algorithm.params.server_lr == 1.0
    assert cfg.model.params.width == 8 and cfg.data.params.noise == 0.3
    again = config.from_dict(config.to_dict(cfg))  # params sit beside the name in the dict
    assert again == cfg and config.to_dict(cfg)["model"]["width"] == 8
    # the model gets its own Params as keyword arguments
    net = build_for(cfg.model, prepare(cfg.data, cfg.seed, root=str(tmp_path)))
    assert net.net[1].out_features == 8 and net.net[1].in_features == 2  # 2-D rings in


@pytest.mark.parametrize("override, key, says", [
    ("algorithm.pul=0.1", "algorithm.pul", "valid keys here: name, pull, server_lr"),
    ("algorithm.pull=-1", "algorithm.pull", "[0.0, inf)"),
    (f"algorithm.name={ALGO[:-1]}x", "algorithm.name", "has no 'MyAlgx'"),
    ("algorithm.name=no_such_pkg.mod:X", "algorithm.name", "no module 'no_such_pkg'"),
    ("data.dataset=imagenet", "data.dataset", "or a package.module:Name reference"),
    ("availability.model=sometimes", "availability.model", "always, bernoulli, diurnal, trace"),
    (f"model.name={MODEL}", "model.widht", "valid keys here: channels_last, embedding_dim, "
                                           "groups, hidden, name, projection, width"),
])
def test_a_wrong_component_key_names_key_value_and_expectation(override, key, says):
    extra = [f"algorithm.name={ALGO}"] if override.startswith("algorithm.pul") else []
    extra += ["model.widht=3"] if key == "model.widht" else []
    with pytest.raises(ConfigError) as e:
        load(override, *extra)
    assert e.value.key == key and says in str(e.value)


def test_custom_algorithm_typo_exits_2_and_creates_nothing(tmp_path, capsys):
    out = tmp_path / "runs"
    code = cli.main(["run", TINY, f"output_dir={out}", f"data.cache_dir={tmp_path / 'c'}",
                     f"algorithm.name={ALGO}", "algorithm.pul=0.1"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and not (tmp_path / "c").exists()
    assert err.strip().splitlines() == ["rayfl: error: config key 'algorithm.pul' = 0.1: "
                                        "expected no such key (did you mean 'algorithm.pull'?); "
                                        "valid keys here: name, pull, "
                                        "server_lr"]


def test_keys_lists_a_custom_components_params(capsys):
    assert cli.main(["keys", "--algorithm", ALGO, "--model", MODEL, "--dataset", DATA]) == 0
    out = capsys.readouterr().out
    assert "| `algorithm.pull` | a number | `0.1` | strength μ of the pull" in out
    assert "| `model.width` | an integer | `32` | hidden units |" in out
    assert "| `data.noise` | a number | `0.1` |" in out


def test_tuner_searches_a_custom_algorithms_param():
    from tune import space

    base = config.to_dict(load(f"algorithm.name={ALGO}"))
    params = space.resolve([ALGO], {}, base)  # the class's own search_space() as a preset
    assert list(params) == ["algorithm.pull"] and params["algorithm.pull"].log
    explicit = space.resolve([], {"algorithm.pull": {"low": 0.0, "high": 0.5}}, base)
    assert explicit["algorithm.pull"].high == 0.5
    with pytest.raises(ConfigError, match="space.algorithm.pull"):  # checked by the schema
        space.resolve([], {"algorithm.pull": {"low": -1.0, "high": 0.5}}, base)
    cfg = config.from_dict(space.apply(base, {"algorithm.pull": 0.25}))
    assert cfg.algorithm.params.pull == 0.25


def test_builtin_presets_and_compare_rule_are_unchanged_on_the_classes():
    from rayfl import compare
    from tune import space

    assert space.PRESETS["fedmim"] == ("fedmim", {
        "algorithm.alpha": {"type": "weights", "low": 0.0, "high": 0.95},
        "algorithm.beta": {"type": "weights", "low": 0.0, "high": 1.0}})
    assert space.PRESETS["adabest"][1]["algorithm.mu"] == {"low": 1e-3, "high": 0.3, "log": True}
    assert {k for k, (a, _) in space.PRESETS.items() if a} == {
        "adabest", "fedavgm", "fedprox", "feddyn", "fedmsi", "fedmim", "fedsam", "fedspeed", "moon",
        "fedexp", "qfedavg", "ditto", "fedrep", "perfedavg", "pfedme", "apfl", "fedproto"}
    base = {"name": "b", "local": {"momentum": 0.9, "lr": 0.01}}
    mim = compare.variant(base, "fedmim")
    assert mim["local"] == {"momentum": 0.0, "lr": pytest.approx(0.1)}
    assert compare.variant(base, "fedavg")["local"] == base["local"]


def test_register_api_decorator_and_refusals():
    @dataclass(frozen=True)
    class P:
        depth: int = schema.field(2, lo=1)

    def net(input_shape, num_classes, depth=2):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(
            int(np.prod(input_shape)), num_classes))

    net.Params = P
    try:
        import rayfl

        assert rayfl.register_model(net, name="deep_net") is net
        cfg = load("model.name=deep_net", "model.depth=3")
        assert cfg.model.params.depth == 3 and "deep_net" in registry.names("model")
        with pytest.raises(ValueError, match="built-in"):
            rayfl.register_model(net, name="logreg")
        with pytest.raises(ValueError, match="without ':'"):
            rayfl.register_algorithm(net, name="a:b")
    finally:
        registry.unregister("model", "deep_net")
    with pytest.raises(ConfigError, match="model.name"):
        load("model.name=deep_net")


def test_a_registered_component_travels_with_the_pickled_config():
    """What a Ray worker receives: cloudpickle ships a class defined here by value, and
    unpickling the config registers it in the receiving process."""
    cls = type("LocalAlgo", (registry.resolve("algorithm", "fedavg"),), {"__doc__": "local"})
    registry.register("algorithm", cls, name="local_algo")
    cfg = load("algorithm.name=local_algo")
    blob = cloudpickle.dumps(cfg)
    registry.unregister("algorithm", "local_algo")
    with pytest.raises(ConfigError):
        registry.resolve("algorithm", "local_algo")
    back = pickle.loads(blob)
    try:
        assert back == cfg and registry.resolve("algorithm", "local_algo").__doc__ == "local"
    finally:
        registry.unregister("algorithm", "local_algo")
    # built-ins are not carried: the pickle names them only
    assert b"FedAvg" not in cloudpickle.dumps(load())


def test_runtime_env_ships_user_modules_only(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert runtime_env(load()) == {}
    env = runtime_env(load(f"algorithm.name={ALGO}", f"data.dataset={DATA}"))
    assert env == {"py_modules": [os.path.realpath(os.path.join(ROOT, "examples"))]}
    assert registry.user_modules([type("Main", (), {"__module__": "__main__"})]) == []


def test_runtime_env_gives_every_worker_the_drivers_cpu_kernel_set(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    env = runtime_env(load(f"algorithm.name={ALGO}"))
    assert env["env_vars"] == {"ATEN_CPU_CAPABILITY": "avx2"} and env["py_modules"]


def test_cache_key_names_the_loader_and_its_params(monkeypatch):
    synthetic = load().data
    rings = load(f"data.dataset={DATA}").data
    key = store.partition_key(synthetic, 0)
    assert key.startswith("synthetic-") and store.partition_key(rings, 0).startswith(
        "examples_my_data_Rings-")
    assert store.partition_key(rings, 0) != store.partition_key(
        load(f"data.dataset={DATA}", "data.noise=0.2").data, 0)
    # a loader swapped in under the built-in name gets its own store
    monkeypatch.setitem(registry.BUILTINS["dataset"], "synthetic", DATA)
    assert store.partition_key(synthetic, 0) != key


class Shifted:
    """The synthetic set with every input moved by +5 (a loader swapped in place)."""

    @staticmethod
    def load(cfg, seed):
        from rayfl.data.datasets import synthetic

        arrays = synthetic.load(cfg, seed)
        return dataclasses.replace(arrays, x_train=arrays.x_train + 5, x_test=arrays.x_test + 5)


def test_a_swapped_loader_never_reads_anothers_store(tmp_path, monkeypatch):
    cfg = load(f"data.cache_dir={tmp_path}").data
    plain = prepare(cfg, 0).open().test()[0].copy()
    monkeypatch.setitem(registry.BUILTINS["dataset"], "synthetic", "tests.test_components:Shifted")
    np.testing.assert_allclose(prepare(cfg, 0).open().test()[0], plain + 5)
    monkeypatch.undo()  # a later plain run reads the plain store, not the swapped loader's
    np.testing.assert_array_equal(prepare(cfg, 0).open().test()[0], plain)


class FirstHalf(AvailabilityModel):
    """Only clients below ``share`` × N are ever online."""

    @dataclass(frozen=True)
    class Params:
        share: float = schema.field(0.5, lo=0.0, hi=1.0, lo_open=True)

    def online(self, t, now):
        return np.arange(self.ctx.num_clients) < self.params.share * self.ctx.num_clients


def test_a_custom_availability_model_decides_who_is_sampled():
    registry.register("availability", FirstHalf, name="first_half")
    try:
        cfg = config.load({"availability": {"model": "first_half", "share": 0.25}}).availability
        s = make_sampler(cfg, FakeHandle(40), 5, 0, SPEC)
        seen = np.concatenate([s.plan(t).clients for t in range(20)])
        assert seen.max() < 10 and len(np.unique(seen)) == 10  # all of, and only, 0..9
        assert s.plan(20).metrics["online"] == 10
    finally:
        registry.unregister("availability", "first_half")


@pytest.mark.parametrize("regime", [None, "iid", "period_only", "client_only"])
def test_round_data_gives_each_client_its_rows_of_the_round(tmp_path, regime):
    over = [f"data.cache_dir={tmp_path}"] + ([f"data.regime={regime}"] if regime else [])
    cfg = load(*over)
    reader = prepare(cfg.data, cfg.seed).open()
    ids = [3, 7, 11]
    rnd = reader.round(2, np.array(ids))
    rows = regime_rows(reader, regime, ids, 2, cfg.seed)
    for c in ids:
        x, y = rnd.client(c)
        if regime in ("period_only", "client_only"):
            np.testing.assert_array_equal(y, reader.y[rows[c]])
            np.testing.assert_array_equal(x, reader.x[rows[c]])
        else:
            np.testing.assert_array_equal(y, reader.client(c)[1])
        assert len(y) == len(reader.client(c)[1])  # sizes kept


class _Scores:
    """A model look-alike whose logits score row i as ``s[i]``."""

    def __init__(self, s):
        self.s = torch.as_tensor(s, dtype=torch.float32)

    def predict(self, point, x, batch_size):
        return torch.stack([torch.zeros_like(self.s), self.s], 1)


def test_the_dataset_chooses_its_test_evaluator(tmp_path):
    scores = np.array([0.9, 0.1, 0.5, 0.2, 0.3, 0.8])
    labels = torch.tensor([1, 0, 0, 0, 1, 0])
    got = ranking(_Scores(scores), None, None, labels, batch_size=10, group=3)
    assert got == {**rec_metrics(scores, labels.numpy(), 3, k=5),
                   **rec_metrics(scores, labels.numpy(), 3, k=10)}
    assert got["hr@5"] == 1.0 and got["ndcg@5"] == pytest.approx((1 + 1 / np.log2(3)) / 2)
    assert registry.resolve("dataset", "movielens").evaluator is ranking
    synthetic = prepare(load(f"data.cache_dir={tmp_path}").data, 0)
    assert evaluators.test_metrics(synthetic, _Scores(scores), None, None, labels, 10) == {}
    handle = dataclasses.replace(synthetic, eval_group=3)
    registry.register("dataset", type("Ranked", (), {"load": None, "evaluator": staticmethod(
        ranking)}), name="ranked")
    try:
        handle = dataclasses.replace(handle, cfg=dataclasses.replace(handle.cfg,
                                                                    dataset="ranked"))
        assert evaluators.test_metrics(handle, _Scores(scores), None, None, labels, 10) == got
    finally:
        registry.unregister("dataset", "ranked")


def test_a_user_module_in_the_working_directory_resolves(tmp_path, monkeypatch):
    (tmp_path / "cwd_algo.py").write_text(
        "from rayfl.algorithms.fedavg import FedAvg\n\nclass Mine(FedAvg):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert load("algorithm.name=cwd_algo:Mine").algorithm.component().__name__ == "Mine"
    finally:
        sys.modules.pop("cwd_algo", None)


def test_every_builtin_resolves_and_is_documented():
    from rayfl.docs import config_reference

    text = config_reference()
    for kind in registry.KEYS:
        for name in registry.names(kind):
            shown = f"`{name}`" if kind != "algorithm" else f"`algorithm.name: {name}`"
            assert registry.resolve(kind, name) is not None and shown in text


def test_a_builtin_availability_model_is_one_module_and_one_registry_line(monkeypatch):
    from rayfl.docs import config_reference

    monkeypatch.setitem(registry.BUILTINS["availability"], "first_half",
                        "tests.test_components:FirstHalf")  # the one line
    cfg = config.load({"availability": {"model": "first_half", "share": 0.5}}).availability
    assert make_sampler(cfg, FakeHandle(20), 4, 0, SPEC).plan(0).clients.max() < 10
    text = config_reference()
    assert "| `first_half` |" in text and "| `availability.share` | a number | `0.5` |" in text
    assert "first_half" in registry.expected("availability")
    with pytest.raises(ConfigError, match="availability.share"):
        config.load({"availability": {"model": "first_half", "share": 0}})
