"""An aggregation transform of your own, named like every component (examples/centered_clip.py:
centered clipping): its two limits against independent facts, the same bytes on Ray actors and
after a resume, registered by name, and refused where a built-in of its kind is."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

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
from tests.conftest import ROOT, TINY

CCLIP = "examples.centered_clip:CenteredClip"
IN_PROCESS = ["runtime.executor=inprocess", "rounds=3"]


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
    entry = _entry(tau=0.3, iterations=2)
    inproc = _run(tiny, entry, "name=a")
    two = rayfl.run(TINY, tiny + ["rounds=3", "runtime.num_actors=2", entry, "name=b"],
                    quiet=True)
    paused = _run(tiny, entry, run_dir=str(tmp_path / "paused"), max_rounds=2)
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert inproc.summary["model_sha256"] == two.summary["model_sha256"] == \
        resumed.summary["model_sha256"]
    assert 0 < max(inproc.metrics.column("cclip_clipped").to_pylist())


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


@pytest.mark.parametrize("entry, key, says", [
    (_entry("examples.my_wrapper:ServerEMA"), "aggregation.transforms[0].name",
     "a subclass of rayfl.transforms.base.Transform"),
    (_entry("examples.centered_clip:Nope"), "aggregation.transforms[0].name",
     "it has no 'Nope'"),
    (_entry("no_such_pkg.mod:T"), "aggregation.transforms[0].name", "no module 'no_such_pkg'"),
    (_entry("bogus"), "aggregation.transforms[0].name", "a package.module:Name reference"),
    (_entry(taux=1), "aggregation.transforms[0].taux", "tau"),
    (_entry(tau=-1), "aggregation.transforms[0].tau", "(0.0, inf]"),
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
