"""One ``layers`` list: server wrappers and aggregation transforms in the order written.

Its older spelling (``wrappers`` then ``aggregation.transforms``) gives the same bytes, in
process, on 2 Ray actors and after a resume; the order written is the order run (a wrapper
written inside a transform sees the aggregate the transform returns, one written outside sees
what the transform is given); a bad entry, or both spellings at once, is one line on its key."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl import registry
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.assemble import stack
from rayfl.compare import variant
from rayfl.schema import ConfigError
from rayfl.transforms import Transform
from tests.conftest import ROOT, TINY, three_ways
from tune.space import PRESETS

IN_PROCESS = ["runtime.executor=inprocess", "rounds=3"]
SEER, HALVE = "tests.test_layer_list:Seer", "tests.test_layer_list:Halve"
IMA = "{name: ima, window: 2, start: 1}"
EMA = "{name: 'examples.my_wrapper:ServerEMA', decay: 0.5}"
CLIP = "{name: clip, max_norm: 0.05}"
IMA_ENTRY = {"name": "ima", "window": 2, "start": 1}


class Seer(ServerWrapper):
    """Reports the norm of the mean update it is handed, and changes nothing."""

    def aggregate(self, slot, agg, sums, srv):
        return agg, slot, {"seen_norm": float(agg.delta_mean.norm())}


class Halve(Transform):
    """Halves the round's mean update at the server."""

    def aggregate(self, slot, agg, sums, srv):
        return dataclasses.replace(agg, delta_mean=agg.delta_mean * 0.5), slot, {}


class Both(ServerWrapper, Transform):
    """A class of both kinds: which slot it would own is undefined."""


def _run(tiny, *overrides):
    return rayfl.run(TINY, tiny + IN_PROCESS + list(overrides), quiet=True)


def test_one_list_gives_the_older_spelling_s_bytes_in_process_on_actors_and_resumed(
        tiny, ray_local, tmp_path):
    """IMA and a user's wrapper (a module shipped to the actors) inside clipping, spelled both
    ways: one model, one label."""
    older = _run(tiny, f"wrappers=[{IMA}, {EMA}]", f"aggregation.transforms=[{CLIP}]",
                 "name=older")
    runs = three_ways(tiny, str(tmp_path / "paused"), f"layers=[{IMA}, {EMA}, {CLIP}]")
    assert {r.summary["model_sha256"] for r in runs} == {older.summary["model_sha256"]}
    assert runs[0].summary["algorithm"] == older.summary["algorithm"] == \
        "fedavg+ima+examples.my_wrapper:ServerEMA"
    plain = _run(tiny, "name=plain")  # the layers do something
    assert plain.summary["model_sha256"] != older.summary["model_sha256"]


def test_the_order_written_is_the_order_the_server_halves_run_in_reverse(tiny):
    """[Seer, Halve]: Halve's server half runs first, Seer sees the halved mean; [Halve, Seer]:
    Seer sees it whole. Both models halve the same mean once."""
    inside = _run(tiny, "rounds=1", f"layers=['{SEER}', '{HALVE}']", "name=inside")
    outside = _run(tiny, "rounds=1", f"layers=['{HALVE}', '{SEER}']", "name=outside")
    seen_inside = inside.metrics.column("seen_norm").to_pylist()[0]
    seen_outside = outside.metrics.column("seen_norm").to_pylist()[0]
    assert seen_outside > 0
    assert seen_inside == 0.5 * seen_outside  # halving is exact in binary floating point
    assert inside.summary["model_sha256"] == outside.summary["model_sha256"]


def test_the_stack_keeps_each_kind_s_slots_where_older_checkpoints_hold_them():
    """Wrappers and transforms interleave in client order; the state tree keeps the wrappers'
    slots and the transforms' apart, as rayfl 0.1 and 0.2 checkpoints do."""
    cfg = rayfl.load_config({"layers": [{"name": "clip"}, IMA_ENTRY, {"name": "qsgd"}],
                             "data": {"num_clients": 20}})
    built = stack(cfg, 20)
    assert built.where == ["layers[0]", "layers[1]", "layers[2]"]
    assert built.kinds == ["transform", "wrapper", "transform"]
    state = built.init(torch.zeros(4))
    assert len(state.wrappers) == 1 and len(state.transforms) == 2
    assert built._split(built._slots(state)) == (state.wrappers, state.transforms)


@pytest.mark.parametrize("raw, key, says", [
    ({"layers": ["nosuch"]}, "layers[0].name", "a server wrapper or an aggregation transform: "
                                               "one of ima, attack, clip"),
    ({"layers": ["ima", {"name": "rayfl.layers:Layer"}]}, "layers[1].name",
     "a subclass of rayfl.algorithms.wrapper.ServerWrapper or of rayfl.transforms.base."
     "Transform"),
    ({"layers": [{"name": "clip", "max_nrm": 1.0}]}, "layers[0].max_nrm", "did you mean"),
    ({"layers": [{"name": "tests.test_layer_list:Both"}]}, "layers[0].name", "a subclass of both"),
    ({"layers": [{"name": ["clip"]}]}, "layers[0].name", "the name of a server wrapper"),
    ({"layers": [{"max_norm": 1.0}]}, "layers[0].name", "the name of a server wrapper"),
    ({"layers": ["ima"], "wrappers": ["ima"]}, "layers", "one list: wrappers given too"),
    ({"layers": ["clip"], "aggregation": {"transforms": [{"name": "qsgd"}]}}, "layers",
     "one list: aggregation.transforms given too"),
    ({"aggregation": {"transforms": [{"name": ["clip"]}]}}, "aggregation.transforms[0].name",
     "one of"),
    # the privacy layer: named where it is written
    ({"layers": [{"name": "privacy", "noise_multiplier": -1.0}]}, "layers[0].noise_multiplier",
     "a value in"),
    ({"layers": ["clip", {"name": "privacy", "clip_norm": 1.0, "delta": 2.0}]}, "layers[1].delta",
     "a value in"),
    ({"layers": [{"name": "privacy", "noise_multiplr": 1.0}]}, "layers[0].noise_multiplr",
     "did you mean 'layers[0].noise_multiplier'"),
    ({"layers": [{"name": "privacy"}, "clip"]}, "layers[0].name", "the last entry"),
    ({"layers": ["privacy"], "privacy": {"noise_multiplier": 1.0}}, "layers[0].name",
     "one privacy mechanism"),
])
def test_a_bad_entry_is_one_line_on_its_key(raw, key, says):
    with pytest.raises(ConfigError) as e:
        config_mod.from_dict(raw)
    assert e.value.key == key and says in str(e.value)


def test_a_name_registered_as_a_wrapper_and_as_a_transform_is_refused_as_ambiguous():
    registry.register_wrapper(Seer, name="seen")
    registry.register_transform(Halve, name="seen")
    try:
        with pytest.raises(ConfigError, match="a name registered as one kind"):
            config_mod.from_dict({"layers": ["seen"]})
        cfg = config_mod.from_dict({"wrappers": ["seen"]})  # the older lists say the kind
        assert [e.cls for e in cfg.layer_entries()] == [Seer]
    finally:
        registry.unregister("wrapper", "seen")
        registry.unregister("transform", "seen")


def test_the_cli_refuses_both_spellings_in_one_line_and_creates_nothing(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "rayfl", "run", TINY, "layers=[ima]",
                           "aggregation.transforms=[{name: clip}]", f"output_dir={out}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'layers'" in lines[0] and "is layers: [A, B]" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("raw, override, after", [
    ({"layers": ["ima"]}, "layers.ima.window=3", {"layers": [{"name": "ima", "window": 3}]}),
    # a tuner preset's key in the older spelling names the layers entry
    ({"layers": ["ima"]}, "wrappers.ima.window=3", {"layers": [{"name": "ima", "window": 3}]}),
    ({"layers": ["ima"]}, "aggregation.transforms.clip.max_norm=2",
     {"layers": ["ima", {"name": "clip", "max_norm": 2}]}),
    # and a layers key names the older list holding the entry
    ({"wrappers": ["ima"]}, "layers.ima.window=3", {"wrappers": [{"name": "ima", "window": 3}]}),
    ({"aggregation": {"transforms": [{"name": "clip"}]}}, "layers.clip.max_norm=2",
     {"aggregation": {"transforms": [{"name": "clip", "max_norm": 2}]}}),
    # a new entry joins the older list of its kind, and is kept inside a trailing privacy layer
    ({"wrappers": ["ima"]}, "layers.clip.max_norm=2",
     {"wrappers": ["ima"], "aggregation": {"transforms": [{"name": "clip", "max_norm": 2}]}}),
    ({"aggregation": {"transforms": ["clip"]}}, "layers.ima.window=3",
     {"aggregation": {"transforms": ["clip"]}, "wrappers": [{"name": "ima", "window": 3}]}),
    ({"layers": [{"name": "privacy", "clip_norm": 1.0}]}, "layers.clip.max_norm=2",
     {"layers": [{"name": "clip", "max_norm": 2}, {"name": "privacy", "clip_norm": 1.0}]}),
    # an entry by its index, in either form; on the older spelling, wrappers count first
    ({"layers": ["clip", "clip"]}, "layers.1.max_norm=2",
     {"layers": ["clip", {"name": "clip", "max_norm": 2}]}),
    ({"layers": ["clip", "clip"]}, "layers[1].max_norm=2",
     {"layers": ["clip", {"name": "clip", "max_norm": 2}]}),
    ({"wrappers": ["ima"], "aggregation": {"transforms": ["clip"]}}, "layers.1.max_norm=2",
     {"wrappers": ["ima"], "aggregation": {"transforms": [{"name": "clip", "max_norm": 2}]}}),
])
def test_an_entry_s_key_is_set_in_the_spelling_the_config_uses(raw, override, after):
    assert config_mod.apply_overrides(raw, [override]) == after
    config_mod.from_dict(after)  # and it is a valid config


@pytest.mark.parametrize("raw, override, says", [
    ({"layers": ["clip", "clip"]}, "layers.clip.max_norm=2",
     "one entry named 'clip' in layers (it has 2, at 0, 1: name one by its index"),
    ({"layers": ["clip"]}, "layers.3.max_norm=2", "an index below 1"),
    ({"layers": ["clip"]}, "layers.clip=2", "a key inside the entry (e.g. layers.clip.KEY"),
])
def test_an_override_naming_no_single_entry_is_refused_on_its_key(raw, override, says):
    with pytest.raises(ConfigError) as e:
        config_mod.apply_overrides(raw, [override])
    assert e.value.key == override.split("=")[0] and says in str(e.value)


def test_writing_both_spellings_outright_is_refused_not_merged():
    raw = config_mod.apply_overrides({"wrappers": ["ima"]}, ["layers=[clip]"])
    with pytest.raises(ConfigError, match="one list: wrappers given too"):
        config_mod.from_dict(raw)


@pytest.mark.parametrize("entry, layers", [
    ("fedavg+ima", [{"name": "ima", "window": 2, "start": 1}, {"name": "clip"}]),
    ("fedavg", [{"name": "clip"}]),
])
def test_compare_swaps_the_wrappers_and_keeps_the_transforms_of_a_layers_base(entry, layers):
    base = {"algorithm": {"name": "fedprox"}, "local": {},
            "layers": [{"name": "clip"}, IMA_ENTRY]}
    raw = variant(base, entry)
    assert raw["layers"] == layers and "wrappers" not in raw
    config_mod.from_dict(raw)


def test_the_tuner_s_ima_preset_applies_to_a_layers_config():
    _, space = PRESETS["ima"]
    raw = {"layers": [{"name": "clip"}]}
    for key, spec in space.items():
        raw = config_mod.apply_overrides(raw, [f"{key}={spec['low']}"])
    cfg = config_mod.from_dict(raw)
    assert [e.name for e in cfg.layer_entries()] == ["clip", "ima"]


def test_the_compression_section_is_its_layer_written_last(tiny):
    """``compression: {method: M, ...}`` is the layer ``{name: M, ...}`` after the list."""
    given = ("method: topk, fraction: 0.25, error_feedback: true",
             "name: topk, fraction: 0.25, error_feedback: true")
    section = _run(tiny, f"compression={{{given[0]}}}", f"layers=[{IMA}]", "name=section")
    layer = _run(tiny, f"layers=[{IMA}, {{{given[1]}}}]", "name=layer")
    assert section.summary["model_sha256"] == layer.summary["model_sha256"]
    dense = _run(tiny, f"layers=[{IMA}]", "name=dense")
    uploads = [r.metrics.column("upload_bytes").to_pylist() for r in (section, layer, dense)]
    assert uploads[0] == uploads[1] and uploads[0][0] < uploads[2][0]


DP = "noise_multiplier: 0.5, clip_norm: 0.1"


def test_the_privacy_layer_written_last_is_the_privacy_section(tiny):
    """Same model, same ε per round, the same config recorded."""
    section = _run(tiny, f"privacy={{{DP}}}", f"layers=[{CLIP}]", "name=section")
    layer = _run(tiny, f"layers=[{CLIP}, {{name: privacy, {DP}}}]", "name=layer")
    assert section.summary["model_sha256"] == layer.summary["model_sha256"]
    eps = [r.metrics.column("dp_epsilon").to_pylist() for r in (section, layer)]
    assert eps[0] == eps[1] and eps[0][-1] > 0
    recorded = [rayfl.load_config(os.path.join(r.run_dir, "config.yaml")) for r in (section,
                                                                                   layer)]
    assert config_mod.to_dict(recorded[0]) | {"name": "x"} == \
        config_mod.to_dict(recorded[1]) | {"name": "x"}


def test_a_privacy_key_sets_the_privacy_layer_of_a_config_writing_one():
    raw = {"layers": ["clip", {"name": "privacy", "noise_multiplier": 1.0}]}
    after = config_mod.apply_overrides(raw, ["privacy.noise_multiplier=2", "privacy.delta=1e-6"])
    assert after == {"layers": ["clip", {"name": "privacy", "noise_multiplier": 2,
                                         "delta": 1e-6}]}
    assert config_mod.from_dict(after).privacy.noise_multiplier == 2
