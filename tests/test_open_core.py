"""The open core: one round loop on several executors, server optimizers as transforms,
aggregation transforms, algorithm capabilities."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rayfl import config as config_mod
import rayfl
from rayfl.algorithms import registry, server_opt
from rayfl.algorithms.base import ClientTask
from rayfl.algorithms.fedavg import FedAvg
from rayfl.rng import client_stream
from rayfl.runtime.context import ClientData
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.schema import ConfigError
from rayfl.transforms import ClipParams, ClipUpdate, Identity
from tests.conftest import TINY
from tests.core_helpers import local_update

DT = torch.float64
D, N = 4, 6
SPEC = LocalSpec(steps=5, batch_size=1)


def clients(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [quadratic_client(torch.rand(D, generator=g, dtype=DT) + 0.5,
                             4 * torch.randn(D, generator=g, dtype=DT), n=1 + i)
            for i in range(n)]


def x0():
    return torch.zeros(D, dtype=DT)


def sample(t):
    return np.random.default_rng(t).choice(N, 3, replace=False)


@pytest.mark.parametrize("preset, opt", [
    ("fedavgm", server_opt.momentum(1.0, 0.9)),
    ("fedadam", server_opt.adam(0.01, 0.9, 0.99, 1e-3, 1e-6)),
    ("fedyogi", server_opt.yogi(0.01, 0.9, 0.99, 1e-3, 1e-6)),
    ("fedadagrad", server_opt.adagrad(0.01, 0.9, 1e-3, 1e-6)),
])
def test_presets_are_fedavg_plus_a_server_optimizer_bitwise(preset, opt):
    kw = dict(rounds=6, lr0=0.05, sample=sample)
    s_preset, _, _ = simulate(registry.get(preset)(), x0(), clients(), SPEC, **kw)
    s_fedavg, _, _ = simulate(FedAvg(), x0(), clients(), SPEC, server_opt=opt, **kw)
    assert torch.equal(s_preset.x, s_fedavg.x)
    assert torch.equal(s_preset.server_opt["m"], s_fedavg.server_opt["m"])


def test_momentum_server_optimizer_matches_torch_sgd():
    """Server momentum on a fixed pseudo-gradient sequence is torch's SGD(momentum, nesterov)."""
    for nesterov in (False, True):
        opt = server_opt.momentum(0.5, 0.9, nesterov)
        x = torch.ones(D, dtype=DT)
        ref = torch.nn.Parameter(x.clone())
        torch_opt = torch.optim.SGD([ref], lr=0.5, momentum=0.9, nesterov=nesterov)
        state = opt.init(x)
        for k in range(5):
            d = torch.linspace(-1, 1, D, dtype=DT) * (k + 1)
            step, state, _ = opt.update(d, state)
            x = x - step
            ref.grad = d.clone()
            torch_opt.step()
        assert torch.allclose(x, ref.detach(), rtol=1e-14, atol=1e-14)


def test_server_opt_config_reaches_any_algorithm_that_takes_one(tmp_path):
    cfg = config_mod.load(TINY, ["algorithm.name=scaffold", "server_opt.name=adam",
                                 "server_opt.lr=0.02"])
    from rayfl.assemble import stack as build

    stack = build(cfg, 10)
    assert stack.optimizer.adaptive and "v" in stack.init(torch.zeros(3)).server_opt
    for bad in (["algorithm.name=adabest", "server_opt.name=adam"],
                ["algorithm.name=fedadam", "server_opt.name=momentum"],
                ["server_opt.name=rmsprop"]):
        with pytest.raises(ConfigError) as e:
            config_mod.load(TINY, bad)
        assert e.value.key.startswith("server_opt")


def test_clip_transform_clips_each_client_update_before_the_sum():
    spec, lr, s = LocalSpec(steps=20, batch_size=1), 0.05, 0.3
    cs = clients()
    chain = [Identity(), ClipUpdate(ClipParams(max_norm=s))]
    state, _, _ = simulate(FedAvg(), x0(), cs, spec, rounds=1, lr0=lr, transforms=chain)
    # by hand: every client's Δ_i, clipped to norm S, weighted by n_i
    deltas = [local_update(FedAvg(), ClientTask(i, 0, lr, c.n, {"x": x0()}, None),
                           ClientData(c.n, c.grad_fn), spec, client_stream(0, 0, i))
              for i, c in enumerate(cs)]
    assert all(float(d.norm()) > s for d in deltas)  # the clip binds for every client
    clipped = [d * min(1.0, s / (float(d.norm()) + 1e-6)) for d in deltas]
    weights = [c.n for c in cs]
    mean = sum(w * d for w, d in zip(weights, clipped)) / sum(weights)
    assert torch.allclose(state.x, x0() - mean, rtol=1e-12, atol=1e-14)
    plain, _, _ = simulate(FedAvg(), x0(), cs, spec, rounds=1, lr0=lr,
                           transforms=[Identity()])
    unclipped, _, _ = simulate(FedAvg(), x0(), cs, spec, rounds=1, lr0=lr)
    assert torch.equal(plain.x, unclipped.x)


@pytest.mark.parametrize("entry, key", [
    ("[{name: nope}]", "aggregation.transforms[0].name"),
    ("[{name: clip, max_norm: -1}]", "aggregation.transforms[0].max_norm"),
    ("[{name: clip, norm: 1}]", "aggregation.transforms[0].norm"),
])
def test_bad_transform_entries_name_the_key(entry, key):
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, [f"aggregation.transforms={entry}"])
    assert e.value.key == key


def test_inprocess_executor_gives_the_ray_executors_bytes(ray_local, tiny, monkeypatch):
    common = tiny + ["rounds=3", "algorithm.name=scaffold",
                     "aggregation.transforms=[{name: clip, max_norm: 5.0}]"]
    on_ray = rayfl.run(TINY, common + ["runtime.num_actors=2", "runtime.cpus_per_actor=1"],
                       quiet=True)
    import ray

    def no_ray(*a, **k):
        raise AssertionError("the in-process executor must not start Ray")

    monkeypatch.setattr(ray, "init", no_ray)
    in_process = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True)
    assert in_process.summary["model_sha256"] == on_ray.summary["model_sha256"]
    assert in_process.metrics.num_rows == 3


# ----- faults -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_client_actor_that_dies_or_hangs_mid_round_is_replaced_with_the_same_bytes(
        ray_local, tiny, tmp_path, monkeypatch, fault):
    """SIGKILL (death) or SIGSTOP (a hang, caught by the deadline) of a client actor at the
    start of round 1: Ray restarts it, its groups run again, and the run ends with the bytes of
    an unfaulted run."""
    common = tiny + ["rounds=3", "algorithm.name=scaffold", "runtime.num_actors=2"]
    clean = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True)
    marker = tmp_path / f"{fault}.marker"
    monkeypatch.setenv("RAYFL_FAULT", f"{fault}:1:{marker}")
    # a death is seen by Ray at once; a hang only by the deadline (a tiny round takes well under
    # a second; the restarted actor gets its measured start-up time on top)
    deadline = [] if fault == "kill" else ["runtime.actor_timeout_s=8"]
    faulted = rayfl.run(TINY, common + deadline, quiet=True)
    assert marker.exists()  # the fault happened
    assert faulted.summary["model_sha256"] == clean.summary["model_sha256"]
    assert faulted.metrics.num_rows == 3


@pytest.mark.fresh_actors  # the server is found by its run's name
def test_a_dead_server_actor_ends_the_run_with_the_resume_command(ray_local, tiny, tmp_path):
    import ray

    from rayfl.simulation import RunStopped

    def kill_server(info):
        if info["round"] == 1:
            ray.kill(ray.get_actor(f"rayfl/{os.path.basename(run_dir)}/server"))

    run_dir = str(tmp_path / "run")
    with pytest.raises(RunStopped, match=f"rayfl resume {run_dir}"):
        rayfl.run(TINY, tiny + ["rounds=50"], run_dir=run_dir, quiet=True, on_round=kill_server)
    resumed = rayfl.resume(run_dir, quiet=True, max_rounds=1)
    assert resumed.summary["status"] == "paused"


@pytest.mark.parametrize("executor", ["ray", "inprocess"])
def test_a_full_disk_stops_the_run_in_one_line_and_resume_gives_the_same_bytes(
        ray_local, tiny, tmp_path, monkeypatch, capsys, executor):
    """A client's state write fails as on a full disk at the start of round 1 (in a client actor
    or in-process): exit 1, one line naming the file and the resume command, the checkpoint of
    round 0 intact; resumed once there is room, the run ends with the unfaulted bytes."""
    from rayfl import cli

    common = tiny + ["rounds=3", "algorithm.name=scaffold", "runtime.num_actors=2"]
    clean = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True)
    common.append(f"runtime.executor={executor}")
    marker = tmp_path / "full.marker"
    monkeypatch.setenv("RAYFL_FAULT", f"full:1:{marker}")
    run_dir = str(tmp_path / "run")
    capsys.readouterr()
    assert cli.main(["run", TINY, *common, f"--run-dir={run_dir}", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"rayfl: run stopped: the run's files could not be written: No space left on device "
        f"({marker}); the last checkpoint is intact; once there is room (or write access), "
        f"continue with: rayfl resume {run_dir}") and "Traceback" not in err
    monkeypatch.delenv("RAYFL_FAULT")
    resumed = rayfl.resume(run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == clean.summary["model_sha256"]
    assert resumed.metrics.column("round").to_pylist() == [1, 2, 3]


def test_a_runs_stack_is_built_once_and_handed_down(tmp_path, monkeypatch):
    """The pre-flight builds the run's stack; the server (and, by value, every client actor)
    runs on that one — not one built again from the whole config — to the same bytes."""
    from rayfl import assemble

    common = [f"output_dir={tmp_path}/runs", f"data.cache_dir={tmp_path}/cache",
              "runtime.executor=inprocess", "wrappers=[{name: ima, window: 2}]",
              "aggregation.transforms=[{name: clip, max_norm: 1.0}]"]
    before = rayfl.run(TINY, common, quiet=True).summary["model_sha256"]
    built = []
    original = assemble.stack
    monkeypatch.setattr(assemble, "stack", lambda *a, **k: built.append(a) or original(*a, **k))
    after = rayfl.run(TINY, common, quiet=True).summary["model_sha256"]
    assert len(built) == 1 and after == before


def _page_lookahead():
    """The Lookahead of docs/howto/components.md, as written there."""
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "howto",
                           "components.md")) as f:
        (block,) = [b for b in re.findall(r"```py\n(.*?)```", f.read(), flags=re.S)
                    if "def lookahead" in b]
    scope = {"ServerOpt": server_opt.ServerOpt}
    exec(block, scope)
    return scope["lookahead"]


def test_a_server_optimiser_may_read_the_model_it_steps():
    """``update(D, state, x)`` gets the model the step is taken from: the page's Lookahead,
    stepped through the server's rounds, against the rule computed by hand; a two-argument
    update is called as before; x is lent (edited in place: named)."""
    from rayfl.algorithms.base import ServerRound
    from rayfl.contract import ComponentError

    opt = _page_lookahead()(None, 0.5, k=2, alpha=0.5)
    assert opt.sees_x and not server_opt.sgd(0.5).sees_x
    x, d = torch.tensor([1.0, -2.0]), torch.tensor([0.2, 0.4])
    state, slow, expected = opt.init(x), x.clone(), x.clone()
    for t in range(4):
        srv = ServerRound(t, x, 10, opt, state)
        x, state = srv.step(d), srv.opt_state
        expected = expected - 0.5 * d
        if (t + 1) % 2 == 0:  # every k = 2 rounds: φ ← φ + α (x' − φ), x ← φ
            slow = slow + 0.5 * (expected - slow)
            expected = slow.clone()
        assert torch.allclose(x, expected, atol=1e-6), t
    plain = ServerRound(0, x, 10, server_opt.sgd(0.5), {})
    assert torch.equal(plain.step(d), x - 0.5 * d)

    def edits(d, state, x):
        x.zero_()
        return d, state, {}

    with pytest.raises(ComponentError, match=r"edited x in place"):
        ServerRound(0, torch.ones(2), 10, server_opt.ServerOpt(lambda x: {}, edits), {}).step(d)


@pytest.mark.parametrize("executor", ["ray", "inprocess"])
def test_on_round_returning_true_pauses_after_that_very_round(ray_local, tiny, executor):
    """It paused a round later in process, and on Ray after whichever round was running when
    the driver's answer came."""
    seen = []

    def stop_at_two(row):
        seen.append(row["round"])
        return row["round"] == 2

    paused = rayfl.run(TINY, tiny + ["rounds=5", f"runtime.executor={executor}"], quiet=True,
                       on_round=stop_at_two)
    assert paused.summary["status"] == "paused" and paused.summary["paused_after_round"] == 1
    assert paused.metrics.num_rows == 2 and seen == [1, 2]
