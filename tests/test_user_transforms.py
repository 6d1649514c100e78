"""An aggregation transform of your own, named like every component (examples/centered_clip.py:
centered clipping): its two limits against independent facts, the same bytes on Ray actors and
after a resume, registered by name, refused where a built-in of its kind is, and one that breaks
its contract named with what it broke."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl import registry
from rayfl.analysis.rundir import RunDir
from rayfl.contract import ComponentError
from rayfl.schema import ConfigError
from rayfl.transforms import Transform
from tests.conftest import ROOT, TINY, three_ways

CCLIP = "examples.centered_clip:CenteredClip"
IN_PROCESS = ["runtime.executor=inprocess", "rounds=3"]
BUILT_IN = ("clip",)


def _entry(name: str = CCLIP, **keys) -> str:
    inner = ", ".join([f"name: '{name}'"] + [f"{k}: {v}" for k, v in keys.items()])
    return f"aggregation.transforms=[{{{inner}}}]"


def _run(tiny, *overrides, **kw):
    return rayfl.run(TINY, tiny + IN_PROCESS + list(overrides), quiet=True, **kw)


def test_with_a_radius_no_update_reaches_it_is_the_plain_mean(tiny):
    """τ → ∞, L = 1: v_1 = v_0 + mean(Δ_i − v_0) = mean(Δ_i), the built-in trimmed mean at
    β = 0 — byte for byte in the first round (v_0 = 0), to rounding after it."""
    mean = _run(tiny, _entry("trimmed_mean", beta=0.0), "name=mean")
    cclip = _run(tiny, _entry(tau=1e9), "name=cclip")
    first = [_run(tiny, e, "rounds=1", f"name=r{i}").summary["model_sha256"]
             for i, e in enumerate((_entry("trimmed_mean", beta=0.0), _entry(tau=1e9)))]
    assert first[0] == first[1]
    np.testing.assert_allclose(cclip.params, mean.params, rtol=0, atol=1e-5)
    assert cclip.metrics.column("cclip_clipped").to_pylist() == [0.0, 0.0, 0.0]


def test_with_a_vanishing_radius_the_model_stays_where_it_started(tiny):
    """τ → 0: every step of v is at most τ, so the model moves by at most rounds · L · τ."""
    stuck = _run(tiny, _entry(tau=1e-9, iterations=2), "keep.last=3", "name=stuck")
    start = RunDir(stuck.run_dir).load("start", 1)  # x_0, as round 1's clients received it
    assert np.abs(stuck.params - start).max() <= 3 * 2 * 1e-9 * 1.01
    assert stuck.metrics.column("cclip_clipped").to_pylist() == [1.0, 1.0, 1.0]


def test_the_same_bytes_on_two_actors_and_after_a_resume(tiny, ray_local, tmp_path):
    """Its estimate is a server slot: checkpointed, resumed, and the same on Ray actors."""
    runs = three_ways(tiny, str(tmp_path / "paused"), _entry(tau=0.3, iterations=2))
    assert len({r.summary["model_sha256"] for r in runs}) == 1
    assert 0 < max(runs[0].metrics.column("cclip_clipped").to_pylist())


def test_a_registered_transform_is_named_by_its_name(tiny):
    from examples.centered_clip import CenteredClip

    rayfl.register_transform(CenteredClip, name="cclip")
    try:
        by_name = _run(tiny, _entry("cclip", tau=0.3), "name=a")
        by_reference = _run(tiny, _entry(tau=0.3), "name=b")
        assert by_name.summary["model_sha256"] == by_reference.summary["model_sha256"]
        assert "cclip" in registry.names("transform")
        cfg = config_mod.load(TINY, [_entry("cclip"), "aggregation.transforms.cclip.tau=2"])
        assert cfg.aggregation.transforms == [{"name": "cclip", "tau": 2}]
    finally:
        registry.unregister("transform", "cclip")
    with pytest.raises(ValueError, match="built-in transform"):
        rayfl.register_transform(CenteredClip, name="clip")
    from examples.my_wrapper import ServerEMA
    for wrong in (ServerEMA, lambda params, facts: None, CenteredClip(None, None)):
        with pytest.raises(ValueError, match="a subclass of rayfl.transforms.base.Transform"):
            rayfl.register_transform(wrong, name="wrong")


@pytest.mark.parametrize("entry, key, says", [
    (_entry("examples.my_wrapper:ServerEMA"), "aggregation.transforms[0].name",
     "a subclass of rayfl.transforms.base.Transform"),
    (_entry("examples.centered_clip:Nope"), "aggregation.transforms[0].name",
     "it has no 'Nope'"),
    (_entry("no_such_pkg.mod:T"), "aggregation.transforms[0].name", "no module 'no_such_pkg'"),
    (_entry("bogus"), "aggregation.transforms[0].name", "a package.module:Name reference"),
    (_entry(taux=1), "aggregation.transforms[0].taux", "tau"),
    (_entry(tau=-1), "aggregation.transforms[0].tau", "(0.0, inf)"),
])
def test_a_bad_entry_is_one_line_on_its_key(entry, key, says):
    with pytest.raises(ConfigError) as err:
        config_mod.load(TINY, [entry])
    assert err.value.key == key and says in str(err.value)


def test_it_is_refused_where_a_rule_reading_single_updates_is(tiny):
    """Its traits say it reads every update: privacy and secure aggregation refuse it, the
    message naming it as the config does."""
    for extra, key in ((["privacy.noise_multiplier=1.0"], "privacy"),
                       (["aggregation.weighting=uniform"], "aggregation.transforms[1]")):
        entries = _entry(tau=0.5) if key == "privacy" else \
            f"aggregation.transforms=[{{name: '{CCLIP}'}}, {{name: secagg}}]"
        with pytest.raises(ConfigError) as err:
            config_mod.load(TINY, [entries, *extra])
        assert err.value.key == key and CCLIP in str(err.value)


class Broken(Transform):
    """Fails while being built: the user's own error, named by its frames."""

    def __init__(self, params, facts):
        raise RuntimeError("no radius")


def test_a_transform_failing_to_build_is_named(tiny):
    with pytest.raises(ComponentError) as err:
        _run(tiny, _entry("tests.test_user_transforms:Broken"))
    assert "Broken" in str(err.value) and "no radius" in str(err.value)


def test_the_cli_says_a_bad_transform_in_one_line_and_creates_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rayfl", "run", TINY, f"output_dir={tmp_path}",
                          _entry("examples.my_wrapper:ServerEMA")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "aggregation.transforms[0].name" in out.stderr and not list(tmp_path.iterdir())


def test_its_halves_see_what_a_built_in_sees():
    """Built as the stack builds it: its Params validated, its facts the run's."""
    cfg = config_mod.load(TINY, [_entry(tau=0.25, iterations=3)])
    from rayfl import assemble
    stack = assemble.stack(cfg, 20)
    (layer,) = stack.transforms
    assert dataclasses.asdict(layer.params) == {"tau": 0.25, "iterations": 3}
    assert layer.facts.clients_per_round == cfg.clients_per_round
    assert torch.equal(layer.init(torch.ones(4)), torch.zeros(4))


# ----- a transform breaking its contract: one line naming it -----------------------------------
class NotADataclassParams(Transform):
    class Params:
        k = 1


@dataclass(frozen=True)
class ComplexParams:
    k: complex = 1j


class UnvalidatedParams(Transform):
    Params = ComplexParams


@dataclass(frozen=True)
class WithAName:
    name: str = "mine"


class NamedParams(Transform):
    Params = WithAName


@pytest.mark.parametrize("cls, says", [
    ("NotADataclassParams", "Params is a dataclass"),
    ("UnvalidatedParams", "unsupported schema type <class 'complex'>"),
    ("NamedParams", "Params has no field called name"),  # it kept its default, silently
])
def test_params_the_schema_cannot_validate_are_refused_on_the_entry(cls, says):
    with pytest.raises(ConfigError) as err:
        config_mod.load(TINY, [_entry(f"tests.test_user_transforms:{cls}")])
    assert err.value.key == "aggregation.transforms[0].name" and says in str(err.value)


class FunctionSlot(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return agg, (lambda: 1), {}


class SlotChangesKind(Transform):
    def init(self, x0):
        return torch.zeros(1)

    def aggregate(self, slot, agg, sums, srv):
        return agg, {"a": 1}, {}


class ShortMean(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return dataclasses.replace(agg, delta_mean=agg.delta_mean[:2]), slot, {}


class RuntimeColumn(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return agg, slot, {"train_loss": 123.0}


class OwnMetric(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return agg, slot, {"mine": 1.0}


class NaNUpload(Transform):
    def client_apply(self, delta, t, client, ctx):
        return delta * float("nan")


class NaNUploadInPlace(Transform):
    def client_apply(self, delta, t, client, ctx):
        return delta.mul_(float("nan"))  # its input turned NaN too


class NaNMeanInPlace(Transform):
    def aggregate(self, slot, agg, sums, srv):
        agg.delta_mean.mul_(float("nan"))
        return agg, slot, {}


class InfMean(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return dataclasses.replace(agg, delta_mean=agg.delta_mean / 0.0), slot, {}


class NaNModel(Transform):
    def after(self, slot, x, srv):
        return x * float("nan"), slot, {}


class StringClientState(Transform):
    def client_apply(self, delta, t, client, ctx):
        ctx.state["f"] = "hello"
        return delta


@pytest.mark.parametrize("entries, method, says", [
    ("FunctionSlot", "aggregate", "a slot holding function"),
    ("SlotChangesKind", "aggregate", "a slot of another structure than the one it was given"),
    ("ShortMean", "aggregate", "its aggregate's delta_mean is a float32 tensor of shape (2,)"),
    ("RuntimeColumn", "aggregate", "metric 'train_loss', a column the runtime writes itself"),
    ("StringClientState", "client_apply", "ctx.state whose 'f' is a str"),
    ("NaNUpload, clip", "client_apply", "an upload holding NaN or ±inf, made from a finite one"),
    ("InfMean", "aggregate", "an aggregate holding NaN or ±inf, made from a finite one"),
    ("NaNUploadInPlace", "client_apply", "an upload holding NaN or ±inf, made from a finite "
                                         "one"),
    ("NaNMeanInPlace, clip", "aggregate", "an aggregate holding NaN or ±inf, made from a "
                                          "finite one"),
    ("NaNModel", "after", "an x holding NaN or ±inf, made from a finite one"),
], ids=["unencodable-slot", "slot-changes-structure", "short-mean", "runtime-column",
        "client-state-str", "nan-upload", "inf-mean", "nan-upload-in-place",
        "nan-mean-in-place", "nan-model"])
def test_a_transform_breaking_its_contract_is_named_with_what_it_broke(tiny, entries, method,
                                                                       says):
    """Each was silently accepted (a resume then refused the checkpoint, a column overwritten)
    or a traceback elsewhere (another component named, or none)."""
    listed = ", ".join(f"{{name: '{c if c in BUILT_IN else f'tests.test_user_transforms:{c}'}'}}"
                       for c in entries.split(", "))
    with pytest.raises(ComponentError) as err:
        _run(tiny, f"aggregation.transforms=[{listed}]")
    first = [c for c in entries.split(", ") if c not in BUILT_IN][-1]
    assert f"tests.test_user_transforms:{first}.{method}" in str(err.value)
    assert says in str(err.value) and "(round 1" in str(err.value)


@dataclass(frozen=True)
class BreakParams:
    breaks: bool = False


class BreaksWhenAsked(Transform):
    Params = BreakParams

    def broadcast(self, slot, t):
        if self.params.breaks:
            raise RuntimeError("asked to break")
        return {}


def test_of_two_layers_of_one_class_the_one_that_broke_is_named_by_its_key(tiny):
    """Both were `BreaksWhenAsked.broadcast`: which entry broke was for the user to guess."""
    name = "tests.test_user_transforms:BreaksWhenAsked"
    with pytest.raises(ComponentError) as err:
        _run(tiny, f"aggregation.transforms=[{{name: '{name}'}}, "
                   f"{{name: '{name}', breaks: true}}]")
    assert str(err.value).startswith(f"{name}.broadcast at aggregation.transforms[1] (round 1)")
    with pytest.raises(ComponentError) as err:  # one of its class: no key needed
        _run(tiny, f"aggregation.transforms=[{{name: '{name}', breaks: true}}, {{name: clip}}]")
    assert str(err.value).startswith(f"{name}.broadcast (round 1)")


def test_two_layers_of_one_class_reporting_one_metric_are_told_apart(tiny):
    name = "tests.test_user_transforms:OwnMetric"
    with pytest.raises(ComponentError) as err:
        _run(tiny, f"aggregation.transforms=[{{name: '{name}'}}, {{name: '{name}'}}]")
    assert str(err.value).startswith(f"{name}.aggregate at aggregation.transforms[0] (round 1)")
    assert f"which {name}.aggregate at aggregation.transforms[1] returned" in str(err.value)


def test_training_that_diverges_under_a_layer_is_a_diverged_run_not_the_layers_fault(tiny):
    """A non-finite upload from the algorithm's own training names no layer it passes."""
    res = _run(tiny, "local.lr=1e30", "aggregation.transforms=[{name: clip}]")
    assert res.summary["diverged"] and res.summary["diverged_at_round"] == 1


def test_a_rule_reading_every_update_is_refused_under_fedasync():
    """fedasync steps on one client's update: there is no round of updates (a built-in rule
    failed inside the run)."""
    for entry in (_entry("trimmed_mean"), _entry(tau=0.5)):
        with pytest.raises(ConfigError) as err:
            config_mod.load(TINY, [entry, "aggregation.mode=fedasync"])
        assert err.value.key == "aggregation.mode" and "no updates to read at once" in \
            str(err.value)
    config_mod.load(TINY, [_entry(tau=0.5), "aggregation.mode=fedbuff"])  # a buffer of updates


class HoldsALock(Transform):
    def __init__(self, params, facts):
        super().__init__(params, facts)
        self.lock = threading.Lock()


def test_a_transform_that_cannot_reach_the_actors_is_refused_before_ray_starts(tiny, tmp_path):
    entries = ("aggregation.transforms=[{name: clip}, "
               "{name: 'tests.test_user_transforms:HoldsALock'}]")
    with pytest.raises(ConfigError) as err:
        rayfl.run(TINY, tiny + ["rounds=1", entries], quiet=True)
    assert err.value.key == "aggregation.transforms[1].name" and "_thread.lock" in str(err.value)
    assert not (tmp_path / "runs").exists()
