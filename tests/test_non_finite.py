"""NaN or ±inf made of finite values is named where it is made: a layer's client or server
half, a server optimiser's step, a broadcast, a deployed or extra model. Training that diverges
by itself — values too large for any correct computation — stays a diverged run, whatever it
then passes."""

from __future__ import annotations

import dataclasses
import os

import pyarrow.parquet as pq
import pytest
import torch

import rayfl
from rayfl.algorithms.base import Algorithm, Traits
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.contract import ComponentError, Trail
from rayfl.layers import LayerTraits
from rayfl.schema import ConfigError
from rayfl.transforms import Transform
from tests.conftest import TINY

HERE = "tests.test_non_finite"
IN_PROCESS = ["runtime.executor=inprocess", "rounds=3"]
NAN = float("nan")
EMPTY_ROUND = 6  # the round (of six) in which every client the seed draws drops out


class RowsToNaN(Transform):
    """Reads every update and hands them on as NaN, its mean left finite."""

    traits = LayerTraits(needs_updates=True)

    def aggregate(self, slot, agg, sums, srv):
        return dataclasses.replace(agg, updates=agg.updates * NAN), slot, {}


class NoWeight(Transform):
    def aggregate(self, slot, agg, sums, srv):
        return dataclasses.replace(agg, weight_sum=0.0), slot, {}


class Rescaled(Transform):
    """(d / ‖d‖) · ‖d‖: exact on every upload a training that converges makes."""

    def client_apply(self, delta, t, client, ctx):
        norm = delta.norm()
        return delta / norm * norm


class SecondDeployedRaises(ServerWrapper):
    """Its ``deployed`` raises on its second call (the extra models' pass of an evaluation)."""

    calls = 0

    def deployed(self, slot, x):
        type(self).calls += 1
        if type(self).calls == 2:
            raise RuntimeError("deployed broke")
        return x


class DeploysNaN(Algorithm):
    def deployed(self, x, state):
        return x * NAN


class BroadcastsNaN(Algorithm):
    """NaN from round 2 on: the pre-flight broadcasts round 1, in this process."""

    def broadcast(self, x, state, t):
        return {"x": x * NAN if t else x}


class ExtraNaN(Algorithm):
    traits = dataclasses.replace(Traits(), capabilities=frozenset({"extra_models"}))

    def extra_models(self, x, state):
        return {"bad": x * NAN}


def nan_step(section, lr):
    """A server optimiser whose step is NaN."""
    return ServerOpt(lambda x: {}, lambda d, s: (d * NAN, s, {}))


def _run(tiny, *overrides, **kw):
    return rayfl.run(TINY, tiny + IN_PROCESS + list(overrides), quiet=True, **kw)


def _named(tiny, *overrides) -> str:
    with pytest.raises(ComponentError) as err:
        _run(tiny, *overrides)
    return str(err.value)


@pytest.mark.parametrize("overrides, says", [
    ([f"aggregation.transforms=[{{name: median}}, {{name: '{HERE}:RowsToNaN'}}]"],
     f"{HERE}:RowsToNaN.aggregate (round 1): returned an aggregate holding NaN or ±inf"),
    ([f"aggregation.transforms=[{{name: '{HERE}:NoWeight'}}]", "algorithm.name=fednova"],
     f"{HERE}:NoWeight.aggregate (round 1): returned an aggregate of 5 updates whose "
     "weight_sum is 0; expected > 0"),
    ([f"server_opt.name={HERE}:nan_step"],
     f"{HERE}:nan_step.<locals>.<lambda> (round 1): returned a step holding NaN or ±inf"),
    ([f"algorithm.name={HERE}:DeploysNaN"],
     f"{HERE}:DeploysNaN.deployed (round 1): returned a deployed model holding NaN or ±inf"),
    ([f"algorithm.name={HERE}:BroadcastsNaN"],
     f"{HERE}:BroadcastsNaN.broadcast (round 2): returned an 'x' holding NaN or ±inf"),
    ([f"algorithm.name={HERE}:ExtraNaN"],
     f"{HERE}:ExtraNaN.extra_models (round 1): returned its model 'bad' holding NaN or ±inf"),
], ids=["rows-of-a-robust-rule", "no-weight", "server-optimiser", "deployed", "broadcast",
        "extra-model"])
def test_the_component_that_made_it_is_named_with_the_round(tiny, overrides, says):
    assert says in _named(tiny, *overrides)


def test_a_deployed_model_failing_in_the_extra_models_pass_is_one_line_with_its_round(tiny,
                                                                                    tmp_path):
    """It was a traceback (the extra models' pass called ``deployed`` unchecked), and left the
    run directory behind."""
    SecondDeployedRaises.calls = 0
    says = _named(tiny, f"wrappers=[{{name: '{HERE}:SecondDeployedRaises'}}]")
    assert f"{HERE}:SecondDeployedRaises.deployed (round 1): raised RuntimeError" in says
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize("where", [
    f"aggregation.transforms=[{{name: '{HERE}:Rescaled'}}]",
    "aggregation.transforms=[{name: clip, max_norm: 1.0}]",
], ids=["a-user-layer-that-overflows-on-it", "built-in-clip"])
def test_training_that_diverges_is_a_diverged_run_whatever_layer_it_passes(tiny, where):
    """An upload of norm 1e20 has a square no float32 holds: a correct layer may overflow on
    it; nobody is named."""
    res = _run(tiny, "local.lr=1e20", where)
    assert res.summary["diverged"] and res.summary["diverged_at_round"] == 1


def test_the_same_layer_on_a_tame_upload_is_exact(tiny):
    plain = _run(tiny, "name=plain")
    rescaled = _run(tiny, f"aggregation.transforms=[{{name: '{HERE}:Rescaled'}}]", "name=r")
    assert torch.allclose(torch.from_numpy(plain.params),
                          torch.from_numpy(rescaled.params), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("squares, named", [([1 / 6] * 3, True), ([1 / 2] + [0] * 999, True),
                                            ([4 / 3] * 3, False)],
                         ids=["three-summing-to-half", "one-of-a-thousand", "over"])
def test_a_maker_is_named_when_the_value_it_got_had_a_squared_norm_its_dtype_holds(
        dtype, squares, named):
    """Tame is a squared norm below the dtype's largest number (float32: 3.4e38), whatever
    the number of elements: each element here squares to its share of that number (half
    precision too: it is read without the dot product)."""
    value = (torch.tensor(squares, dtype=torch.float64) * torch.finfo(dtype).max).sqrt()
    line = Trail("an upload", value.to(dtype))
    line.add("a-layer", value.to(dtype) * NAN)
    if named:
        with pytest.raises(ComponentError, match="a-layer"):
            line.check(1)
    else:
        line.check(1)


@pytest.mark.parametrize("key, value", [("clip_norm", "1e38"), ("noise_multiplier", "1e7")])
def test_dp_noise_a_float32_sum_cannot_hold_is_refused_before_the_run(key, value):
    """The built-in mechanism was accused of a contract breach it was configured into."""
    with pytest.raises(ConfigError) as err:
        rayfl.config.load(TINY, [f"privacy.{key}={value}"])
    assert err.value.key == f"privacy.{key}"


def test_with_mlflow_a_run_stopped_before_its_first_row_leaves_no_mlflow_run(tiny, tmp_path):
    """The MLflow run is made with the first row: one stopped before leaves no mlruns store
    (and no output_dir) behind."""
    _named(tiny, "loggers.mlflow=true", f"algorithm.name={HERE}:DeploysNaN")
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize("layer", [
    ["aggregation.transforms=[{name: secagg}]", "aggregation.weighting=uniform"],
    ["aggregation.transforms=[{name: median}]"], ["aggregation.transforms=[{name: krum}]"],
    ["aggregation.transforms=[{name: trimmed_mean}]"], ["compression={method: topk}"],
    ["privacy={clip_norm: 1.0, noise_multiplier: 0.5}"], ["wrappers=[{name: ima}]"],
], ids=["secagg", "median", "krum", "trimmed_mean", "topk", "dp", "ima"])
def test_a_round_nobody_completed_passes_every_built_in_layer(tiny, layer):
    """SecAgg divided the empty round's zero sum by its zero weight, and was named for it."""
    res = _run(tiny, "rounds=6", "clients_per_round=5", "availability.dropout=0.75", *layer)
    rows = pq.read_table(os.path.join(res.run_dir, "metrics.parquet")).to_pylist()
    assert [r["round"] for r in rows if r["completed"] == 0] == [EMPTY_ROUND]
    assert len(rows) == 6 and not res.summary["diverged"]


def test_a_float64_value_too_large_to_square_is_divergence_not_a_traceback():
    """Python's float ** 2 raised OverflowError on it."""
    from rayfl.contract import no_new_non_finite

    big = torch.tensor([1e200, 1.0], dtype=torch.float64)
    no_new_non_finite([big, big * big], ["m:Squares"], "an x")  # nobody named
    with pytest.raises(ComponentError, match="m:Breaks: returned an x holding NaN"):
        no_new_non_finite([big / 1e200, big * NAN], ["m:Breaks"], "an x")


def test_a_diverged_run_is_not_resumed_into_another_diverged_round(tiny):
    """Resumed, it ran one more round from the diverged model and added its row."""
    res = _run(tiny, "loss_ceiling=1e-9")
    with pytest.raises(ConfigError) as err:
        rayfl.resume(res.run_dir, quiet=True)
    assert err.value.key == "run_dir" and "diverged in round 1" in str(err.value)
    rows = pq.read_table(os.path.join(res.run_dir, "metrics.parquet")).num_rows
    assert rows == 1
