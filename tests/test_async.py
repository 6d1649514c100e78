"""FedBuff and FedAsync on the virtual clock: hand-computed updates on quadratics, equality with
synchronous FedAvg, determinism across actor counts and pause/resume, and the config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rayfl
from rayfl import config, schema
from rayfl.algorithms import registry
from rayfl.availability.always import AlwaysOn
from rayfl.availability.config import AvailabilityConfig
from rayfl.availability.sampler import Sampler
from rayfl.runtime.async_config import Settings, staleness_weight
from rayfl.runtime.async_loop import AsyncLoop, Dispatcher
from rayfl.runtime.harness import FunctionExecutor, quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.runtime.loop import RoundLoop
from rayfl.layers import Stack
from rayfl.schema import ConfigError
from tests.conftest import TINY

F64 = torch.float64
D, K, ETA = 4, 5, 0.1


def problem(n: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    return 0.2 + 1.8 * torch.rand(n, D, generator=g, dtype=F64), torch.randn(n, D, generator=g,
                                                                             dtype=F64)


def make(name: str, n: int, weighting: str = "samples", **params):
    cls = registry.get(name)
    return cls(cls.Params(**params), weighting=weighting, num_clients=n)


class NoLabels:
    """Label statistics of a problem without labels (the sync sampler reports label_tv)."""

    def tv(self, clients) -> float:
        return float("nan")


def sampler(sizes, per_round: int, seconds=None, seed: int = 0) -> Sampler:
    """Every client online, equal devices (or ``seconds`` per full local run per client)."""
    cfg = schema.build(AvailabilityConfig, {"speed_sigma": 0.0, "bandwidth_sigma": 0.0})
    s = Sampler(cfg, AlwaysOn(), NoLabels(), np.asarray(sizes), per_round, seed,
                LocalSpec(steps=K, batch_size=1))
    if seconds is not None:  # one sample per step (batch 1), no transfers (model_bytes 0)
        s.devices.speed = np.asarray(seconds, dtype=np.float64) / K
    return s


def async_loop(algo, clients, smp, mode: str, concurrency: int, buffer: int, transforms=(),
               **kw) -> AsyncLoop:
    spec = LocalSpec(steps=K, batch_size=1)
    settings = Settings(mode, concurrency, buffer, **kw)
    stack = Stack(algo, algo.default_server_opt(), transforms=list(transforms))
    rounds = RoundLoop(stack, FunctionExecutor(stack, clients, spec), [c.n for c in clients], 1)
    return AsyncLoop(rounds, settings, Dispatcher(smp, 0, 0.0), ETA, 1.0)


def start(loop: AsyncLoop, x0):
    """The server state an event loop starts from."""
    return loop.rounds.stack.init(x0)


def local_gd(a, b, x):
    """K steps of full-batch GD on ½ xᵀdiag(a)x − bᵀx from x, in closed form."""
    x_star = b / a
    return x_star + (1 - ETA * a) ** K * (x - x_star)


def test_staleness_weights_match_hand_values():
    assert staleness_weight("constant", 7) == 1.0
    assert staleness_weight("polynomial", 0, a=0.5) == 1.0
    assert staleness_weight("polynomial", 3, a=0.5) == 0.5  # 1/√4
    assert staleness_weight("polynomial", 4, a=1.0) == pytest.approx(0.2)
    assert staleness_weight("hinge", 4, a=0.5, b=4) == 1.0
    assert staleness_weight("hinge", 6, a=0.5, b=4) == 0.5  # 1/(0.5·2 + 1)
    assert staleness_weight("hinge", 10, a=1.0, b=2) == pytest.approx(1 / 9)


@pytest.mark.parametrize("name", ["fedavg", "fedavgm"])
def test_fedbuff_with_equal_speeds_is_synchronous_fedavg_bytes(name):
    """concurrency = buffer = clients per round, equal devices: every buffer is the sync round's
    client set, so the server states are bitwise equal (samples weighting, unequal sizes)."""
    n, per_round, rounds = 12, 5, 6
    a, b = problem(n)
    clients = [quadratic_client(a[i], b[i], n=i + 1) for i in range(n)]
    x0 = torch.zeros(D, dtype=F64)
    plan = sampler([c.n for c in clients], per_round)
    sync_state, _, _ = simulate(make(name, n), x0, clients, LocalSpec(steps=K, batch_size=1),
                                rounds, ETA, sample=lambda t: plan.plan(t).clients)
    algo = make(name, n)
    loop = async_loop(algo, clients, sampler([c.n for c in clients], per_round), "fedbuff",
                      per_round, per_round, staleness="polynomial")
    state = start(loop, x0)
    for t in range(rounds):
        out = loop.step(state, t)
        state, metrics = out.state, out.metrics
        assert metrics["staleness_max"] == 0 and out.agg.count == per_round
    assert torch.equal(state.x, sync_state.x)
    if name == "fedavgm":
        assert torch.equal(state.server_opt["m"], sync_state.server_opt["m"])
    # unequal devices make stale updates, and the bytes part ways
    algo = make(name, n)
    loop = async_loop(algo, clients, sampler([c.n for c in clients], per_round,
                                             seconds=np.linspace(1.0, 3.0, n)),
                      "fedbuff", per_round, per_round)
    state = start(loop, x0)
    for t in range(rounds):
        state = loop.step(state, t).state
    assert not torch.allclose(state.x, sync_state.x)


def test_fedbuff_staleness_discounts_by_hand():
    """3 clients in flight, buffer 2, run times 1, 1.2, 2.5: the second update holds client 0's
    second run (sent at version 0, τ = 1) and client 1's run from x_1 (τ = 0)."""
    a, b = problem(3)
    sizes = [1, 2, 3]
    clients = [quadratic_client(a[i], b[i], n=sizes[i]) for i in range(3)]
    algo = make("fedavg", 3)
    loop = async_loop(algo, clients, sampler(sizes, 3, seconds=[1.0, 1.2, 2.5]), "fedbuff", 3, 2,
                      staleness="polynomial", a=0.5)
    x0 = torch.zeros(D, dtype=F64)
    state = start(loop, x0)
    out = loop.step(state, 0)
    state, m1 = out.state, out.metrics
    d0, d1 = x0 - local_gd(a[0], b[0], x0), x0 - local_gd(a[1], b[1], x0)
    x1 = x0 - (1 * d0 + 2 * d1) / 3
    assert torch.allclose(state.x, x1, rtol=1e-12, atol=1e-12)
    assert m1["virtual_time_s"] == pytest.approx(1.2) and m1["staleness_hist"] == [2]
    out = loop.step(state, 1)
    state, m2 = out.state, out.metrics
    d0_stale = x0 - local_gd(a[0], b[0], x0)  # its second run also started from x_0
    d1_fresh = x1 - local_gd(a[1], b[1], x1)
    x2 = x1 - (1 * d0_stale / math.sqrt(2) + 2 * d1_fresh) / 3  # s(1) = 2^−1/2, Σp unscaled
    assert torch.allclose(state.x, x2, rtol=1e-12, atol=1e-12)
    assert m2["staleness_hist"] == [1, 1] and m2["staleness_max"] == 1
    assert m2["virtual_time_s"] == pytest.approx(2.4) and m2["in_flight"] == 2


def three_updates(algo, loop, x0) -> list:
    """The global model after each of the event loop's first three server updates from x0."""
    state, xs = start(loop, x0), []
    for t in range(3):
        state = loop.step(state, t).state
        xs.append(state.x)
    return xs


def test_fedasync_mixes_each_arrival_by_hand():
    """Xie et al.: x ← (1 − α s(τ)) x + α s(τ) y, y trained from the model the client got."""
    a, b = problem(2)
    clients = [quadratic_client(a[i], b[i]) for i in range(2)]
    algo = make("fedavg", 2)
    alpha = 0.6
    loop = async_loop(algo, clients, sampler([1, 1], 2, seconds=[1.0, 1.5]), "fedasync", 2, 1,
                      staleness="polynomial", a=0.5, mixing=alpha)
    x0 = torch.zeros(D, dtype=F64)
    xs = three_updates(algo, loop, x0)
    a1 = alpha / math.sqrt(2)
    x1 = (1 - alpha) * x0 + alpha * local_gd(a[0], b[0], x0)  # client 0 at 1.0, τ = 0
    x2 = (1 - a1) * x1 + a1 * local_gd(a[1], b[1], x0)  # client 1 at 1.5, sent x_0: τ = 1
    x3 = (1 - a1) * x2 + a1 * local_gd(a[0], b[0], x1)  # client 0 again at 2.0, sent x_1
    for got, want in zip(xs, (x1, x2, x3)):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_max_staleness_discards(tmp_path):
    a, b = problem(3)
    clients = [quadratic_client(a[i], b[i]) for i in range(3)]
    algo = make("fedavg", 3)
    loop = async_loop(algo, clients, sampler([1, 1, 1], 3, seconds=[1.0, 1.1, 5.0]), "fedbuff",
                      3, 1, max_staleness=2)
    state = start(loop, torch.zeros(D, dtype=F64))
    rows = []
    for t in range(12):  # client 0 runs 1 s, client 1 1.1 s: 8 updates before client 2 at 5 s
        out = loop.step(state, t)
        state = out.state
        rows.append(out.metrics)
    assert sum(r["discarded"] for r in rows) == 1  # client 2, sent at version 0, is far behind
    assert max(r["staleness_max"] for r in rows) <= 2


def top2(v):
    """v with all but its two largest |v_i| zeroed (written out, not the library's top-k)."""
    keep = sorted(range(len(v)), key=lambda i: -abs(float(v[i])))[:2]
    out = torch.zeros_like(v)
    out[keep] = v[keep]
    return out


@pytest.mark.parametrize("feedback", [True, False])
def test_fedbuff_error_feedback_carries_each_clients_residual(feedback):
    """Top-2 of 4 coordinates, run times 1 and 1.5, buffer 1: client 0's second run (sent x_1,
    trained in the second wave) uploads C(Δ + e_0) with e_0 what its first upload dropped, read
    back from the state version its first wave wrote."""
    from rayfl.transforms.compress import SparseParams, TopK

    a, b = problem(2)
    clients = [quadratic_client(a[i], b[i]) for i in range(2)]
    algo = make("fedavg", 2)
    chain = [TopK(SparseParams(fraction=0.5, error_feedback=feedback))]
    loop = async_loop(algo, clients, sampler([1, 1], 2, seconds=[1.0, 1.5]), "fedbuff", 2, 1,
                      transforms=chain, staleness="constant")
    x0 = torch.zeros(D, dtype=F64)
    xs = three_updates(algo, loop, x0)
    d0 = x0 - local_gd(a[0], b[0], x0)  # client 0 at 1.0 from x_0
    x1 = x0 - top2(d0)
    x2 = x1 - top2(x0 - local_gd(a[1], b[1], x0))  # client 1 at 1.5 from x_0
    d0_again = x1 - local_gd(a[0], b[0], x1)  # client 0 at 2.0 from x_1
    x3 = x2 - top2(d0_again + (d0 - top2(d0) if feedback else 0))
    for got, want in zip(xs, (x1, x2, x3)):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    if feedback:  # versions are waves: client 0 wrote in waves 0 and 1, client 1 (sent again
        # at 1.5, trained before x_3 is applied) in waves 0 and 2
        assert loop.rounds.versions.tolist() == [1, 2]
        assert loop.rounds.superseded == [(0, 0), (1, 0)]
    else:
        assert loop.rounds.versions.tolist() == [-1, -1]


# ----- the whole run: synthetic tiny config ----------------------------------------------------
EQUAL = ["local.steps=3", "local.batch_size=5", "availability.speed_sigma=0",
         "availability.bandwidth_sigma=0"]


def test_fedbuff_run_equals_sync_run_bytes(tiny):
    common = tiny + EQUAL + ["runtime.executor=inprocess", "rounds=3"]
    sync = rayfl.run(TINY, common, quiet=True)
    buff = rayfl.run(TINY, common + ["aggregation.mode=fedbuff"], quiet=True)
    assert buff.summary["model_sha256"] == sync.summary["model_sha256"]
    assert buff.metrics.column("virtual_time_s").to_pylist() == pytest.approx(
        sync.metrics.column("virtual_time_s").to_pylist())
    other = rayfl.run(TINY, common + ["aggregation.mode=fedbuff", "aggregation.buffer_size=3"],
                      quiet=True)
    assert other.summary["model_sha256"] != sync.summary["model_sha256"]


EF = ["compression.method=topk", "compression.fraction=0.25", "compression.error_feedback=true"]


HETERO = ["aggregation.mode=fedbuff", "aggregation.concurrency=8", "aggregation.buffer_size=3",
          "availability.dropout=0.2", "rounds=5"]


def test_fedbuff_same_bytes_for_1_and_3_actors(ray_local, tiny):
    """With error feedback: a residual one actor wrote is read by whichever trains next. Every
    wave in one worker (this process), and an uneven split over 3 actors."""
    res = rayfl.run(TINY, tiny + HETERO + EF + ["runtime.num_actors=3",
                                                "runtime.cpus_per_actor=0.5"], quiet=True)
    stale = sum(res.metrics.column("staleness_max").to_pylist())
    here = rayfl.run(TINY, tiny + HETERO + EF + ["runtime.executor=inprocess"], quiet=True)
    assert res.summary["model_sha256"] == here.summary["model_sha256"]
    assert stale > 0  # stale updates were in the buffers


def test_fedbuff_error_feedback_keeps_one_residual_per_client(tiny):
    """Each client's residual is read back by its next run (so error feedback changes the
    result), and after a checkpoint a client holds one residual version on disk."""
    import os
    from collections import Counter

    common = tiny + HETERO + ["runtime.executor=inprocess", "checkpoint.every=2"]
    on = rayfl.run(TINY, common + EF, quiet=True)
    off = rayfl.run(TINY, common + EF[:-1] + ["compression.error_feedback=false"], quiet=True)
    assert on.summary["model_sha256"] != off.summary["model_sha256"]
    files = [name for _, _, names in os.walk(os.path.join(on.run_dir, "state"))
             for name in names]
    held = Counter(name.split(".")[0] for name in files)
    assert held and set(held.values()) == {1}
    assert sum(on.metrics.column("clients_trained").to_pylist()) > len(held)  # some ran twice


def test_a_fork_of_fedbuff_with_error_feedback_ends_with_the_source_bytes(tiny, tmp_path):
    """The kept checkpoint pins the residual versions it refers to, which the source superseded
    (and deleted elsewhere) since; the in-flight clients travel with it."""
    from rayfl.fork import fork

    src = rayfl.run(TINY, tiny + HETERO + EF + ["runtime.executor=inprocess",
                                                "checkpoint.keep=[2]"], quiet=True)
    out = fork(src.run_dir, 2, run_dir=str(tmp_path / "fork"), quiet=True)
    assert out.summary["model_sha256"] == src.summary["model_sha256"]


@pytest.mark.parametrize("mode,more", [("fedbuff", []), ("fedasync", []), ("fedbuff", EF)])
def test_pause_and_resume_give_the_same_bytes(tiny, mode, more):
    extra = tiny + HETERO + more + ["runtime.executor=inprocess", f"aggregation.mode={mode}"]
    if mode == "fedasync":
        extra += ["aggregation.buffer_size=null"]
    full = rayfl.run(TINY, extra, quiet=True)
    paused = rayfl.run(TINY, extra, quiet=True, max_rounds=2)
    assert paused.summary["status"] == "paused"
    assert paused.metrics.column("in_flight").to_pylist()[-1] > 0  # checkpointed mid-flight
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == full.summary["model_sha256"]
    assert resumed.metrics.column("virtual_time_s").to_pylist() == \
        full.metrics.column("virtual_time_s").to_pylist()


@pytest.mark.parametrize("overrides,key", [
    (["algorithm.name=scaffold"], "aggregation.mode"),
    (["algorithm.name=fednova"], "aggregation.mode"),
    (["algorithm.name=feddyn"], "aggregation.mode"),
    (["algorithm.name=fedeve"], "aggregation.mode"),
    (["wrappers.ima.window=3"], "wrappers[0].name"),
    (["privacy.noise_multiplier=1.0", "aggregation.weighting=uniform"], "privacy"),
    (["availability.deadline_s=5"], "availability.deadline_s"),
    (["availability.stragglers=0.5"], "availability.stragglers"),
    (["availability.overcommit=1.3"], "availability.overcommit"),
    (["aggregation.concurrency=21"], "aggregation.concurrency"),
    (["keep.last=1"], "keep.last"),
    (["aggregation.transforms=[{name: secagg}]", "aggregation.weighting=uniform"],
     "aggregation.staleness"),
])
def test_async_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        config.load(TINY, ["aggregation.mode=fedbuff", *overrides])
    assert err.value.key == key
    assert "fedbuff" in str(err.value) or key == "aggregation.concurrency"


def test_fedasync_buffer_size_and_accepted_algorithms():
    with pytest.raises(ConfigError) as err:
        config.load(TINY, ["aggregation.mode=fedasync", "aggregation.buffer_size=4"])
    assert err.value.key == "aggregation.buffer_size"
    secagg = ["aggregation.transforms=[{name: secagg}]", "aggregation.weighting=uniform"]
    with pytest.raises(ConfigError) as err:  # a sum of one update reveals it
        config.load(TINY, ["aggregation.mode=fedasync", *secagg])
    assert err.value.key == "aggregation.transforms[0].name"
    config.load(TINY, ["aggregation.mode=fedbuff", "aggregation.staleness=constant", *secagg])
    for name in ("fedavg", "fedavgm", "fedadam", "fedprox"):
        config.load(TINY, ["aggregation.mode=fedbuff", f"algorithm.name={name}"])
    config.load(TINY, ["aggregation.mode=fedbuff", "server_opt.name=momentum"])


def test_timeline_reads_time_to_target_and_staleness():
    from rayfl.metrics.timeline import staleness_histogram, table, time_to

    rows = [{"virtual_time_s": 10.0, "test_accuracy": 0.5, "staleness_hist": [2, 1]},
            {"virtual_time_s": 20.0, "test_accuracy": None, "staleness_hist": [1, 0, 2]},
            {"virtual_time_s": 30.0, "test_accuracy": 0.75, "staleness_hist": [3]}]
    assert time_to(rows, 0.7) == 30.0 and time_to(rows, 0.8) is None
    assert staleness_histogram(rows).tolist() == [6, 1, 2]
    assert "| a | 3 | 0.008 | 75.00 | 0.008 | — | 0.56 |" in table({"a": rows}, [0.7, 0.8])


def test_timeline_plot_draws_the_staleness_panel_only_when_a_run_was_stale(tmp_path):
    import matplotlib.image

    from rayfl.metrics.timeline import plot

    sync = [{"virtual_time_s": 10.0 * t, "test_accuracy": 0.1 * t} for t in range(1, 4)]
    stale = [{**r, "staleness_hist": [1, 2]} for r in sync]
    plot({"sync": sync}, str(tmp_path / "one.png"))
    plot({"sync": sync, "fedbuff": stale}, str(tmp_path / "two.png"))
    one = matplotlib.image.imread(str(tmp_path / "one.png"))
    two = matplotlib.image.imread(str(tmp_path / "two.png"))
    assert one.shape[1] == 7 * 120 and two.shape[1] == 11 * 120
