"""Server wrappers compose around any algorithm (examples/my_wrapper.py: ServerEMA, with IMA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl import registry
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.analysis.rundir import RunDir
from rayfl.compare import variant
from rayfl.contract import ComponentError
from rayfl.schema import ConfigError
from rayfl.transforms import Transform
from tests.conftest import TINY, three_ways

EMA = "examples.my_wrapper:ServerEMA"
IN_PROCESS = ["runtime.executor=inprocess", "rounds=3", "keep.last=3"]


def _run(tiny, *overrides, **kw):
    return rayfl.run(TINY, tiny + IN_PROCESS + list(overrides), quiet=True, **kw)


def _globals(result) -> list[np.ndarray]:
    run = RunDir(result.run_dir)
    return [run.load("start", 1)] + [run.load("global", t) for t in run.rounds]


def _ema(models: list[np.ndarray], beta: float) -> torch.Tensor:
    """e_{−1} = x_0, e_t = β e_{t−1} + (1 − β) x_t, with the wrapper's float32 arithmetic."""
    e = torch.from_numpy(models[0])
    for x in models[1:]:
        e = beta * e + (1 - beta) * torch.from_numpy(x)
    return e


def test_ema_deploys_the_moving_average_of_the_unchanged_inner_run(tiny):
    plain = _run(tiny, "name=plain")
    wrapped = _run(tiny, f"wrappers=[{{name: '{EMA}', decay: 0.5}}]", "name=ema")
    final = np.load(f"{wrapped.run_dir}/final_model.npy")
    assert torch.allclose(torch.from_numpy(final), _ema(_globals(plain), 0.5), atol=1e-7)
    # the inner run is FedAvg's, byte for byte: kept beside the average and scored the same
    inner = RunDir(wrapped.run_dir).load("ema_inner", 3)
    assert np.array_equal(inner, _globals(plain)[-1])
    rows, ref = wrapped.metrics.to_pylist(), plain.metrics.to_pylist()
    assert [r["ema_inner_test_accuracy"] for r in rows] == [r["test_accuracy"] for r in ref]
    assert wrapped.summary["algorithm"] == f"fedavg+{EMA}"
    assert wrapped.summary["model_sha256"] != plain.summary["model_sha256"]


def test_wrappers_compose_innermost_first(tiny):
    """[ima, ema] is EMA over IMA's deployed models; IMA's run underneath is unchanged."""
    ima = "{name: ima, start: 1, window: 2}"
    alone = _run(tiny, f"wrappers=[{ima}]", "name=ima")
    both = _run(tiny, f"wrappers=[{ima}, {{name: '{EMA}', decay: 0.6}}]", "name=both")
    final = np.load(f"{both.run_dir}/final_model.npy")
    assert torch.allclose(torch.from_numpy(final), _ema(_globals(alone), 0.6), atol=1e-7)
    kept = RunDir(both.run_dir)
    assert np.array_equal(kept.load("ema_inner", 3), _globals(alone)[-1])
    assert {"ima_inner", "ema_inner"} <= kept.names(3)
    assert both.summary["algorithm"] == f"fedavg+ima+{EMA}"


def test_a_user_wrapper_on_ray_actors_async_and_after_a_resume(tiny, ray_local, tmp_path):
    entry = f"wrappers=[{{name: '{EMA}', decay: 0.8}}]"
    runs = three_ways(tiny, str(tmp_path / "paused"), entry, "keep.last=3")
    assert len({r.summary["model_sha256"] for r in runs}) == 1
    fedbuff = ["aggregation.mode=fedbuff", "aggregation.buffer_size=3"]
    plain_async = _run(tiny, *fedbuff, "keep.last=0", "name=c")
    ema_async = _run(tiny, *fedbuff, "keep.last=0", entry, "name=d")
    assert ema_async.summary["model_sha256"] != plain_async.summary["model_sha256"]
    rows = ema_async.metrics.to_pylist()
    assert [r["ema_inner_test_accuracy"] for r in rows] == \
        [r["test_accuracy"] for r in plain_async.metrics.to_pylist()]


def test_a_registered_wrapper_is_named_in_configs_and_compare(tiny):
    from examples.my_wrapper import ServerEMA

    rayfl.register_wrapper(ServerEMA, name="ema")
    try:
        base = config_mod.to_dict(config_mod.load(TINY, tiny + ["wrappers=[{name: ema, "
                                                                "decay: 0.3}]"]))
        cfg = config_mod.from_dict(variant(base, "scaffold+ema"))
        assert [(w.name, w.params.decay) for w in cfg.wrappers] == [("ema", 0.3)]
        assert config_mod.from_dict(variant(base, "scaffold")).wrappers == []
        with pytest.raises(ConfigError) as err:
            variant(base, "scaffold+nope")
        assert err.value.key == "--algorithms" and "ema, ima" in err.value.expected
    finally:
        registry.unregister("wrapper", "ema")


def test_one_entrys_key_is_addressed_by_its_name():
    cfg = config_mod.load(TINY, ["wrappers=[ima]", "wrappers.ima.window=2",
                                 "aggregation.transforms=[{name: clip, max_norm: 1.0}]",
                                 "aggregation.transforms.clip.max_norm=3"])
    assert cfg.wrappers[0].params.window == 2
    assert cfg.aggregation.transforms == [{"name": "clip", "max_norm": 3}]
    added = config_mod.load(TINY, ["wrappers.ima.start=2"])  # the entry is added when absent
    assert [(w.name, w.params.start) for w in added.wrappers] == [("ima", 2.0)]


def test_ima_averages_the_noised_models_under_privacy(tiny):
    """IMA only post-processes DP-FedAvg's noised mean: the run is accounted as the plain one
    (same ε) and its deployed model is the window mean of the plain run's models."""
    dp = ["privacy.noise_multiplier=0.5", "aggregation.weighting=uniform"]
    plain = _run(tiny, *dp, "name=dp")
    ima = _run(tiny, *dp, "wrappers=[{name: ima, start: 1, window: 2}]", "name=dp-ima")
    assert ima.summary["epsilon"] == plain.summary["epsilon"]
    models = _globals(plain)
    inner = RunDir(ima.run_dir)
    assert np.array_equal(inner.load("ima_inner", 2), models[2])  # round 2's plain output
    assert np.allclose(np.load(f"{ima.run_dir}/final_model.npy"),
                       (inner.load("ima_inner", 3) + inner.load("ima_inner", 2)) / 2, atol=1e-7)


def test_imas_average_key_picks_what_its_window_holds(tiny):
    """Around FedAdam ``auto`` is ``target`` (the client averages fed to Adam); ``output``
    averages Adam's own iterates instead, a different run."""
    runs = {mode: _run(tiny, "algorithm.name=fedadam", "keep.last=0", f"name={mode}",
                       f"wrappers=[{{name: ima, start: 1, window: 2, average: {mode}}}]")
            for mode in ("auto", "target", "output")}
    sha = {mode: r.summary["model_sha256"] for mode, r in runs.items()}
    assert sha["auto"] == sha["target"] != sha["output"]


class HalvesUpload(ServerWrapper):
    """A wrapper whose client half is the ``client`` shortcut: each upload halved."""

    def client(self, delta, t, client):
        return delta * 0.5


class HalvesUploadTransform(Transform):
    def client(self, delta, t, client):
        return delta * 0.5


class ShortcutReturnsText(ServerWrapper):
    def client(self, delta, t, client):
        return "halved"


def test_a_wrappers_client_shortcut_is_its_client_half_as_a_transforms_is(tiny):
    plain = _run(tiny, "name=plain")
    wrapper = _run(tiny, f"layers=[{{name: '{__name__}:HalvesUpload'}}]", "name=w")
    transform = _run(tiny, f"layers=[{{name: '{__name__}:HalvesUploadTransform'}}]", "name=t")
    assert wrapper.summary["model_sha256"] == transform.summary["model_sha256"] != \
        plain.summary["model_sha256"]
    with pytest.raises(ComponentError, match=rf"{__name__}:ShortcutReturnsText\.client "):
        _run(tiny, f"layers=[{{name: '{__name__}:ShortcutReturnsText'}}]", "name=bad")
